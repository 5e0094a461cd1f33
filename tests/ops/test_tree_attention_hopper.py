"""The Hopper attention family (kernel="hopper", csrc/include/jetspec/attention_hopper.cuh) against
python_ref, in the simulator (sim) and on a GPU (cuda, gpu-marked): both variants (two consumer
warpgroups with ping-pong for more than 64 packed rows a kv head, one warpgroup otherwise), every
cache layout engines pass, ragged prefixes (0, not a multiple of the 128-key block, one block
exactly), trees of awkward sizes, mask / causal / full tails, with and without lse, fp16 and bf16,
GQA groups 1, 4 and 8, and the split count it picks. Outputs are NaN before every launch and cache
rows no query may read are NaN, so a stray read or a missed write fails.
"""
import math

import pytest
import torch

from jetspec_kernels import python_ref as ref
from helpers import TOL, backends, cu, paged, random_tree, rel_l2, sync
from test_engine_layouts import cache_layout

NAN = float("nan")

# (dtype, dh, B, N, Hq, Hkv, tail, layout, page, prefixes, splits, with_lse)
CASES = [
    # G 8: 296 rows, three 128-row tiles; prefix 0, 131 (mid-block), 300; the split rule's count.
    (torch.bfloat16, 128, 3, 37, 16, 2, "mask", "contiguous", None, [0, 131, 300], None, True),
    # G 4: 84 rows (wide, second warpgroup partly idle); causal; page 16 with a shuffled table.
    (torch.float16, 64, 2, 21, 4, 1, "causal", "contiguous", 16, [5, 200], 2, True),
    # G 1: 13 rows (small variant); full; page 64; prefix exactly one block and prefix 0.
    (torch.bfloat16, 128, 2, 13, 4, 4, "full", "contiguous", 64, [128, 0], None, True),
    # G 4, 280 rows, three mask words; K and V as halves of one buffer; 3 splits.
    (torch.float16, 128, 1, 70, 8, 2, "mask", "kv_halves", None, [257], 3, True),
    # G 8, 72 rows; V rows padded wider than K; no lse.
    (torch.bfloat16, 64, 2, 9, 8, 1, "mask", "v_padded", None, [127, 1], None, False),
    # G 4, 64 rows (small variant); paged 16, heads-major (HND) pool; 2 splits.
    (torch.float16, 128, 2, 16, 4, 1, "mask", "kv_heads_major", 16, [300, 45], 2, True),
    # G 1, 5 rows, V padded, paged 64, causal, fp16, a split count past the blocks (empty splits).
    (torch.float16, 64, 3, 5, 2, 2, "causal", "v_padded", 64, [70, 0, 129], 8, True),
    # One split over long prefixes: each CTA walks 9 (wide) / 12 (small) blocks, so both K and
    # V rings wrap several times (stages are released and refilled inside the loops).
    (torch.bfloat16, 128, 1, 40, 4, 1, "mask", "contiguous", None, [1100], 1, True),
    (torch.float16, 128, 1, 12, 4, 1, "causal", "contiguous", 16, [717], 1, True),
]


def make_case(dtype, dh, b, n, hq, hkv, tail, layout, page, prefixes, gen, dev):
    """Inputs in ``layout`` (NaN past each sequence's end) and python_ref's answer (float64)."""
    lmax = max(prefixes) + n + 3
    if page is not None:
        lmax = -(-lmax // page) * page
    prefix = torch.tensor(prefixes, dtype=torch.int32)
    q = torch.randn(b, n, hq, dh, generator=gen).to(dtype)
    k = torch.randn(b, lmax, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(b, lmax, hkv, dh, generator=gen).to(dtype)
    mask = None
    if tail == "mask":
        parents, num_nodes = random_tree(b, n, gen)
        mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    want = ref.tree_attention(q.double(), k.double(), v.double(), prefix, mask, tail, None,
                              1.0 / math.sqrt(dh))
    for bb in range(b):
        k[bb, prefixes[bb] + n:] = NAN
        v[bb, prefixes[bb] + n:] = NAN
    table = None
    if page is not None:
        k, table = paged(k, page, gen)
        v, _ = paged(v, page, gen, table)
    k, v = cache_layout(layout, k.to(dev), v.to(dev))
    to = (lambda x: None if x is None else x.to(dev))
    return (q.to(dev), k, v, prefix.to(dev), to(mask), to(table)), want


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype,dh,b,n,hq,hkv,tail,layout,page,prefixes,splits,with_lse", CASES)
def test_hopper_matches_reference(dev, dtype, dh, b, n, hq, hkv, tail, layout, page, prefixes,
                                  splits, with_lse):
    gen = torch.Generator().manual_seed(dh * n + b)
    (q, k, v, prefix, mask, table), (o_ref, l_ref) = make_case(
        dtype, dh, b, n, hq, hkv, tail, layout, page, prefixes, gen, dev)
    out = torch.full_like(q, NAN)
    lse = torch.full((b, hq, n), NAN, device=dev) if with_lse else None
    cu().tree_attention(q, k, v, prefix, mask, tail, table, 1.0 / math.sqrt(dh), out, lse,
                        num_splits=splits, kernel="hopper")
    sync(dev)
    assert not out.isnan().any()
    assert rel_l2(out, o_ref) < TOL[dtype]
    if with_lse:
        assert not lse.isnan().any() and rel_l2(lse, l_ref) < TOL[dtype]


@backends("sim", "cuda")
@pytest.mark.parametrize("hq", [1, 2], ids=["small", "wide"])
def test_hopper_one_hot_probe(dev, hq):
    """Row i attends to exactly one key, perm[i] (one-hot Q and K, 192 keys: two 128-key blocks),
    so out[i] must be V[perm[i]]: a layout bug in one operand shows as a permutation. hq 2 packs
    128 rows (both consumer warpgroups), hq 1 64 rows (the small variant)."""
    gen = torch.Generator().manual_seed(hq)
    n, dh, keys = 64, 128, 192
    perm = torch.randperm(keys, generator=gen)[:n]
    q = torch.zeros(1, n, hq, dh)
    for h in range(hq):
        q[0, torch.arange(n), h, perm % dh] = 8.0
    k = torch.zeros(1, keys, 1, dh)
    k[0, torch.arange(keys), 0, torch.arange(keys) % dh] = 8.0
    k[0, dh:, 0, :] *= -1.0  # keys 128.. point the other way: perm[i] >= 128 needs -q
    sign = torch.where(perm >= dh, -1.0, 1.0)
    q[0] *= sign[:, None, None]
    v = torch.randn(1, keys, 1, dh, generator=gen)
    q, k, v = q.half(), k.half(), v.half()
    prefix = torch.tensor([keys - n], dtype=torch.int32)
    out = torch.full((1, n, hq, dh), NAN, dtype=torch.float16, device=dev)
    cu().tree_attention(q.to(dev), k.to(dev), v.to(dev), prefix.to(dev), None, "full", None, 1.0,
                        out, None, kernel="hopper")
    sync(dev)
    got = out.cpu().float()[0, :, hq - 1]
    want = v.float()[0, perm, 0]
    bad = ((got - want).abs().max(dim=1).values > 1e-2).nonzero().flatten().tolist()
    if bad:
        dist = torch.cdist(got.nan_to_num(1e4), v.float()[0, :, 0])
        seen = {i: (int(perm[i]), int(dist[i].argmin())) for i in bad[:12]}
        pytest.fail(f"{len(bad)}/{n} rows wrong; row: (wanted key, nearest V row) {seen}")


@backends("sim")
def test_hopper_other_head_dims_run_mma():
    """Head dim 256 is not the family's: kernel="hopper" runs mma.sync there (same answer)."""
    gen = torch.Generator().manual_seed(3)
    (q, k, v, prefix, mask, table), (o_ref, _) = make_case(
        torch.float16, 256, 1, 6, 2, 1, "causal", "contiguous", None, [40], gen, "cpu")
    out = torch.full_like(q, NAN)
    cu().tree_attention(q, k, v, prefix, None, "causal", None, 1 / 16, out, None, kernel="hopper")
    assert rel_l2(out, o_ref) < TOL[torch.float16]


@backends("sim")
def test_hopper_refuses_pages_tma_cannot_copy():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    k = torch.zeros(4, 12, 1, 64, dtype=torch.float16)
    table = torch.arange(4, dtype=torch.int32).view(1, 4)
    prefix = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(ValueError, match="page size"):
        cu().tree_attention(q, k, k, prefix, None, "causal", table, 0.125, q.clone(), None,
                            kernel="hopper")


def wave_rule(base, slots, nblocks, max_splits=32):
    """The split rule of attention_hopper.cuh (hopper_split_count), restated."""
    if base * 10 >= slots * 8:
        return 1
    most = max(1, min(max_splits, nblocks // 2))
    eff = {s: (base * s / slots) / math.ceil(base * s / slots) for s in range(1, most + 1)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= 0.85 * best)


@backends("sim")
@pytest.mark.parametrize("b,prefix,n,variant", [
    (1, 32768, 256, "wide"), (4, 16384, 128, "wide"), (1, 8192, 256, "wide"),
    (16, 4096, 16, "small"), (1, 32768, 16, "small"), (4, 8192, 32, "wide"), (2, 300, 9, "small"),
])
def test_hopper_splits_fill_one_wave(b, prefix, n, variant):
    """The split count at the headline shapes (Qwen3-8B heads) from the kernel's occupancy (the
    simulator computes it: 1 CTA per SM for both variants, by shared memory and the launch
    bounds) on 132 SMs; rows of the wide variant's tiles are 128, the small one's 64."""
    from jetspec_kernels.cuda.tree_attention import hopper_splits
    hq, hkv, dh = 32, 8, 128
    q = torch.zeros(b, n, hq, dh, dtype=torch.bfloat16)
    got = hopper_splits(q, hkv, prefix + n)
    rows = 128 if variant == "wide" else 64
    assert (variant == "wide") == (n * hq // hkv > 64)
    base = -(-n * (hq // hkv) // rows) * b * hkv
    assert got == wave_rule(base, 132, -(-(prefix + n) // (128 if variant == "wide" else 64)))
    assert base * got <= 132 or base >= 0.8 * 132  # one wave unless the grid already fills it
