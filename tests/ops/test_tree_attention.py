"""tree_attention against python_ref.tree_attention (float64), on every backend.

The cuda checks run each of the mma / wgmma / hopper kernels in the simulator (and on a GPU, gpu);
the triton checks launch the Triton kernel (under the interpreter on a CPU, fp32 / fp16 and small
shapes; bf16 and the Qwen3-8B shapes are gpu-marked). Outputs are NaN-poisoned before every
launch, and cache slots no query may read are NaN too, so a stray read or a missed write fails.
"""
import contextlib
import math

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import checks, launch_plan
from jetspec_kernels import python_ref as ref
from jetspec_kernels.ops.tree_attention import check_tree_attention
from helpers import (TOL, api_backend, backend_module, backends, cache_layout, cu, fused_qkv, paged,
                     random_tree, rel_l2, shuffled_table, sync, use_sim, widened)

TA = backend_module("triton", "tree_attention")


@contextlib.contextmanager
def checks_of_values(mode):
    """Value checks set to ``mode`` ("always", "never") inside the block, "cpu" after."""
    checks.set_value_checks(mode)
    try:
        yield
    finally:
        checks.set_value_checks("cpu")


ATTN_CASES = [
    # (dtype, dh, B, N, Hq, Hkv, tail, paged, splits)
    (torch.float16, 128, 2, 37, 8, 2, "mask", False, 1),
    (torch.bfloat16, 128, 2, 37, 8, 2, "mask", True, 3),
    (torch.float16, 64, 1, 16, 4, 4, "causal", False, 2),
    (torch.bfloat16, 64, 3, 70, 4, 1, "full", True, 1),
    (torch.float16, 256, 2, 20, 4, 2, "causal", True, 4),
    (torch.bfloat16, 256, 1, 64, 2, 1, "mask", False, 1),
]


@backends("sim", "cuda")
@pytest.mark.parametrize("kernel", ["mma", "wgmma", "hopper"])
@pytest.mark.parametrize("dtype,dh,b,n,hq,hkv,tail,is_paged,splits", ATTN_CASES)
def test_tree_attention(dev, kernel, dtype, dh, b, n, hq, hkv, tail, is_paged, splits):
    if kernel == "wgmma" and dh not in cu().extension.limit("wgmma_head_dims"):
        pytest.skip("the wgmma kernel takes head dims 64 and 128 (hopper runs mma.sync there)")
    gen = torch.Generator().manual_seed(dh + n + splits)
    lmax = 320
    prefix = torch.tensor([0, 250, 97][:b], dtype=torch.int32)
    q = torch.randn(b, n, hq, dh, generator=gen).to(dtype)
    k = torch.randn(b, lmax, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(b, lmax, hkv, dh, generator=gen).to(dtype)
    mask = None
    if tail == "mask":
        parents, num_nodes = random_tree(b, n, gen)
        mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    table = None
    if is_paged:
        k, table = paged(k, 16, gen)
        v, _ = paged(v, 16, gen, table)
    args = [x.to(dev) if x is not None else None for x in (q, k, v, prefix, mask, table)]
    out = torch.full_like(args[0], float("nan"))
    lse = torch.full((b, hq, n), float("nan"), device=dev)
    scale = 1.0 / math.sqrt(dh)
    cu().tree_attention(args[0], args[1], args[2], args[3], args[4], tail, args[5], scale, out, lse,
                        num_splits=splits, kernel=kernel)
    sync(dev)
    o_ref, l_ref = ref.tree_attention(q.double(), k.double(), v.double(), prefix, mask, tail,
                                      table, scale)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_l2(out, o_ref) < TOL[dtype]
    assert rel_l2(lse, l_ref) < TOL[dtype]


@backends("sim", "cuda")
@pytest.mark.parametrize("kernel", ["mma", "wgmma", "hopper"])
@pytest.mark.parametrize("dh", [64, 128])
def test_tree_attention_one_hot_probe(dev, kernel, dh):
    """Row i attends to exactly one key, perm[i] (one-hot Q and K), so out[i] must be V[perm[i]].
    On failure the message lists, for the first wrong rows, which key's V each row got: a
    layout bug in one operand shows up as a recognisable permutation."""
    gen = torch.Generator().manual_seed(dh)
    n = 64
    perm = torch.randperm(n, generator=gen)
    q = torch.zeros(1, n, 1, dh)
    q[0, torch.arange(n), 0, perm] = 8.0
    k = torch.zeros(1, n, 1, dh)
    k[0, torch.arange(n), 0, torch.arange(n)] = 8.0
    v = torch.randn(1, n, 1, dh, generator=gen)
    q, k, v = q.half(), k.half(), v.half()
    prefix = torch.zeros(1, dtype=torch.int32)
    out = torch.full((1, n, 1, dh), float("nan"), dtype=torch.float16, device=dev)
    cu().tree_attention(q.to(dev), k.to(dev), v.to(dev), prefix.to(dev), None, "full", None, 1.0,
                        out, None, kernel=kernel)
    sync(dev)
    got = out.cpu().float()[0, :, 0]
    want = v.float()[0, perm, 0]
    err = (got - want).abs().max(dim=1).values
    bad = (err > 1e-2).nonzero().flatten().tolist()
    if bad:
        dist = torch.cdist(got.nan_to_num(1e4), v.float()[0, :, 0])
        seen = {i: (int(perm[i]), int(dist[i].argmin()), float(dist[i].min())) for i in bad[:12]}
        pytest.fail(f"{len(bad)}/{n} rows wrong; row: (wanted key, nearest V row, distance) "
                    f"{seen}")


@backends("sim", "cuda")
@pytest.mark.parametrize("kernel", ["mma", "wgmma", "hopper"])
@pytest.mark.parametrize("page_size", [None, 16, 24, 128])
def test_tree_attention_nan_past_end(dev, kernel, page_size):
    """Cache rows past each sequence's end (and pages no sequence owns) hold NaN, as a cache from
    torch.empty may: keys there are masked, and their V rows must not reach the output through
    0 * NaN. Lengths end mid-block; page 24 makes the hopper kernel copy 8-row chunks and 128 copies
    blocks from inside a page."""
    gen = torch.Generator().manual_seed(11)
    b, n, hq, hkv, dh, lmax = 3, 21, 8, 2, 128, 384
    prefix = torch.tensor([0, 130, 301], dtype=torch.int32)
    q = torch.randn(b, n, hq, dh, generator=gen).half()
    k = torch.randn(b, lmax, hkv, dh, generator=gen).half()
    v = torch.randn(b, lmax, hkv, dh, generator=gen).half()
    parents, num_nodes = random_tree(b, n, gen)
    mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    o_ref, l_ref = ref.tree_attention(q.double(), k.double(), v.double(), prefix, mask, "mask",
                                      None, 0.1)
    for bb in range(b):
        k[bb, prefix[bb] + n:] = float("nan")
        v[bb, prefix[bb] + n:] = float("nan")
    table = None
    if page_size is not None:
        k, table = paged(k, page_size, gen)
        v, _ = paged(v, page_size, gen, table)
        spare = torch.full((2,) + tuple(k.shape[1:]), float("nan"), dtype=k.dtype)
        k, v = torch.cat([k, spare]), torch.cat([v, spare])  # pages no sequence owns
    args = [x.to(dev) if x is not None else None for x in (q, k, v, prefix, mask, table)]
    out = torch.full_like(args[0], float("nan"))
    lse = torch.full((b, hq, n), float("nan"), device=dev)
    cu().tree_attention(args[0], args[1], args[2], args[3], args[4], "mask", args[5], 0.1, out,
                        lse, num_splits=2, kernel=kernel)
    sync(dev)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_l2(out, o_ref) < TOL[torch.float16] and rel_l2(lse, l_ref) < TOL[torch.float16]


@backends("sim")
def test_tree_attention_kernel_choice(monkeypatch):
    """Where the runtime picked no sm_90a code (the simulator told binaryVersion 80), auto falls
    back to mma.sync and an explicit wgmma is an error; bad kernel names are ValueErrors (the
    simulator's binaryVersion is what this test changes: sim only)."""
    gen = torch.Generator().manual_seed(4)
    b, n, hq, hkv, dh = 1, 9, 2, 1, 64
    q = torch.randn(b, n, hq, dh, generator=gen).half()
    k = torch.randn(b, 40, hkv, dh, generator=gen).half()
    v = torch.randn(b, 40, hkv, dh, generator=gen).half()
    prefix = torch.tensor([31], dtype=torch.int32)
    o_ref, _ = ref.tree_attention(q.double(), k.double(), v.double(), prefix, None, "causal", None,
                                  0.125)
    monkeypatch.setenv("JETSPEC_SIM_BINARY_VERSION", "80")
    out = torch.full_like(q, float("nan"))
    cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None)
    assert rel_l2(out, o_ref) < TOL[torch.float16]
    with pytest.raises(RuntimeError, match="tree_attention"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None, kernel="wgmma")
    with pytest.raises(RuntimeError, match="hopper"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None,
                            kernel="hopper")
    for name in ("fast", "tma"):  # tma: a retired kernel's name
        with pytest.raises(ValueError, match="kernel"):
            cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None,
                                kernel=name)
    monkeypatch.setenv("JETSPEC_ATTN_KERNEL", "wgmma")  # the default when kernel is None
    with pytest.raises(RuntimeError, match="tree_attention"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None)
    q256 = torch.zeros(b, n, hq, 256, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dims"):
        cu().tree_attention(q256, q256, q256, prefix, None, "causal", None, 0.125, q256.clone(),
                            None, kernel="wgmma")


@backends("sim", "cuda")
def test_tree_attention_strided_outputs_and_empty(dev):
    """out and lse as views into larger buffers (written through their strides), and N = 0."""
    gen = torch.Generator().manual_seed(5)
    b, n, hq, hkv, dh, lmax = 2, 19, 4, 2, 64, 96
    q = torch.randn(b, n, hq, dh, generator=gen).half()
    k = torch.randn(b, lmax, hkv, dh, generator=gen).half()
    v = torch.randn(b, lmax, hkv, dh, generator=gen).half()
    prefix = torch.tensor([40, 77], dtype=torch.int32)
    o_ref, l_ref = ref.tree_attention(q.double(), k.double(), v.double(), prefix, None, "causal",
                                      None, 0.125)
    out_buf = torch.full((b, n, hq + 1, dh), float("nan"), device=dev, dtype=torch.float16)
    lse_buf = torch.full((b, hq, n + 5), float("nan"), device=dev)
    out, lse = out_buf[:, :, 1:], lse_buf[:, :, 2:n + 2]
    q, k, v, prefix = q.to(dev), k.to(dev), v.to(dev), prefix.to(dev)
    cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, lse)
    sync(dev)
    assert rel_l2(out, o_ref) < TOL[torch.float16] and rel_l2(lse, l_ref) < TOL[torch.float16]
    assert out_buf[:, :, 0].isnan().all() and lse_buf[:, :, :2].isnan().all()
    assert lse_buf[:, :, n + 2:].isnan().all()
    empty = torch.empty(b, 0, hq, dh, device=dev, dtype=torch.float16)
    cu().tree_attention(q[:, :0], k, v, prefix, None, "causal", None, 0.125, empty, None)


# ---------------------------------------------------------------- the triton kernel


def tree_masks(B, N, depth, topk, gen, device="cpu"):
    """Ancestor masks of real draft trees (python_ref.draft_tree on random logits): int32 [B, N, W]."""
    logits = torch.randn(B, depth, 64, generator=gen) * 3.0
    roots = torch.zeros(B, dtype=torch.int32)
    t = ref.draft_tree(logits, roots, N, topk)
    return t["mask"].to(torch.int32).to(device)


def make_case(B, N, Hq, Hkv, Dh, prefix_lens, dtype, *, mode="tree", page_size=None,
              q_layout="contiguous", seed=0, device="cpu", tree_depth=6, tree_topk=3):
    """Random q, NaN-padded contiguous or paged caches (shuffled block table) and a tail spec."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if q_layout == "transposed":          # [B, Hq, N, Dh] storage viewed as [B, N, Hq, Dh]
        q = rnd(B, Hq, N, Dh).transpose(1, 2)
    elif q_layout == "sliced":            # a head slice of a wider projection
        q = rnd(B, N, Hq + 3, Dh)[:, :, 2:Hq + 2]
    else:
        q = rnd(B, N, Hq, Dh)
    lengths = [p + N for p in prefix_lens]
    capacity = max(lengths) + 3
    if page_size is None:
        k = torch.full((B, capacity, Hkv, Dh), float("nan"), dtype=dtype)
        v = k.clone()
        for b, n in enumerate(lengths):
            k[b, :n] = rnd(n, Hkv, Dh)
            v[b, :n] = rnd(n, Hkv, Dh)
        block_table = None
    else:
        max_pages = -(-capacity // page_size)
        num_pages = B * max_pages + 2
        block_table = shuffled_table(B, max_pages, gen, spare=2)
        k = torch.full((num_pages, page_size, Hkv, Dh), float("nan"), dtype=dtype)
        v = k.clone()
        for b, n in enumerate(lengths):
            pos = torch.arange(n)
            pages = block_table[b].long()[pos // page_size]
            k[pages, pos % page_size] = rnd(n, Hkv, Dh)
            v[pages, pos % page_size] = rnd(n, Hkv, Dh)
    mask = tree_masks(B, N, tree_depth, tree_topk, gen) if mode == "tree" else None
    tail = "causal" if mode == "tree" else mode
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    to = (lambda t: None if t is None else t.to(device))
    return dict(q=to(q), k_cache=to(k), v_cache=to(v), prefix_lens=to(prefix), tree_mask=to(mask),
                tail=tail, block_table=to(block_table))


def reference(case, scale):
    return ref.tree_attention(case["q"].double(), case["k_cache"].double(),
                              case["v_cache"].double(), case["prefix_lens"], case["tree_mask"],
                              case["tail"], case["block_table"], scale)


def run_backend(case, scale=None, num_splits=None, with_lse=True, out_layout="contiguous",
                value_checks=True):
    """Validate like the ops layer (its value checks too unless ``value_checks`` is False: what
    a GPU call does by default), then launch into NaN-poisoned out / lse."""
    q = case["q"]
    B, N, Hq, Dh = q.shape
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    with checks_of_values("always" if value_checks else "never"):
        check_tree_attention(q, case["k_cache"], case["v_cache"], case["prefix_lens"],
                             case["tree_mask"], case["tail"], case["block_table"], scale, None)
    if out_layout == "transposed":
        out = torch.full((B, Hq, N, Dh), float("nan"), dtype=q.dtype, device=q.device).transpose(1, 2)
    else:
        out = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    lse = (torch.full((B, Hq, N), float("nan"), dtype=torch.float32, device=q.device)
           if with_lse else None)
    TA.launch_tree_attention(q, case["k_cache"], case["v_cache"], case["prefix_lens"],
                             case["tree_mask"], case["tail"], case["block_table"], scale, out, lse,
                             num_splits=num_splits)
    return out, lse, scale


def assert_close(case, out, lse, scale):
    ref_out, ref_lse = reference(case, scale)
    tol = TOL[case["q"].dtype]
    assert out.dtype == case["q"].dtype
    assert not torch.isnan(out).any()
    err = rel_l2(out, ref_out)
    assert err < tol, f"out rel-L2 {err:.3g} >= {tol}"
    if lse is not None:
        assert lse.dtype == torch.float32 and not torch.isnan(lse).any()
        err = rel_l2(lse, ref_lse)
        assert err < tol, f"lse rel-L2 {err:.3g} >= {tol}"


# (B, N, Hq, Hkv, Dh, prefix_lens, mode, page_size, q_layout)
CASES = [
    (3, 5, 4, 2, 16, [0, 7, 45], "causal", None, "contiguous"),
    (3, 13, 4, 1, 32, [33, 0, 5], "tree", 16, "contiguous"),
    (2, 37, 2, 2, 16, [50, 3], "tree", 1, "transposed"),
    (1, 8, 8, 2, 64, [21], "full", 16, "sliced"),
    (2, 6, 2, 1, 128, [9, 40], "tree", None, "contiguous"),
    (3, 9, 4, 4, 16, [17, 64, 0], "full", None, "transposed"),
    (2, 16, 4, 1, 32, [31, 70], "causal", 1, "sliced"),
    (1, 70, 2, 1, 16, [12], "tree", None, "contiguous"),   # three mask words, the last partial
]


@backends("triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("B,N,Hq,Hkv,Dh,prefix,mode,page_size,q_layout", CASES)
def test_matches_reference(B, N, Hq, Hkv, Dh, prefix, mode, page_size, q_layout, dtype):
    case = make_case(B, N, Hq, Hkv, Dh, prefix, dtype, mode=mode, page_size=page_size,
                     q_layout=q_layout, seed=B * 100 + N)
    out, lse, scale = run_backend(case)
    assert_close(case, out, lse, scale)


def _widen_rows(cache, extra):
    """``cache`` copied into rows ``extra`` elements wider (NaN padding), viewed back to its width."""
    wide = torch.full((*cache.shape[:-1], cache.shape[-1] + extra), float("nan"), dtype=cache.dtype)
    wide[..., :cache.shape[-1]] = cache
    return wide[..., :cache.shape[-1]]


@backends("triton")
@pytest.mark.parametrize("padded", ["v_cache", "k_cache"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_k_and_v_with_different_strides(padded, page_size):
    # Engines pad one cache's rows, or keep K and V in differently shaped pools: each cache must
    # be read with its own strides (V read with K's strides gave rel-L2 1.35).
    case = make_case(3, 7, 4, 2, 16, [5, 30, 0], torch.float32, mode="tree", page_size=page_size,
                     seed=12)
    case[padded] = _widen_rows(case[padded], 16)
    assert case["k_cache"].stride() != case["v_cache"].stride()
    out, lse, scale = run_backend(case, num_splits=2)
    assert_close(case, out, lse, scale)


@backends("triton")
def test_causal_with_several_query_tiles():
    # N * G = 320 packed rows: three 128-row tiles, so each tile's causal tail ends at its own
    # last row (tiles that stopped at the first tile's last row lost keys: rel-L2 0.4).
    case = make_case(1, 40, 8, 1, 16, [9], torch.float32, mode="causal", seed=13)
    out, lse, scale = run_backend(case)
    assert_close(case, out, lse, scale)


@backends("triton")
def test_tree_smaller_than_budget_has_padding_rows():
    # depth 2, top-2: 7 real nodes in a capacity of 13; rows 7.. are padding (own bit only).
    case = make_case(2, 13, 4, 2, 16, [12, 30], torch.float32, mode="tree", page_size=16,
                     tree_depth=2, tree_topk=2, seed=5)
    mask = case["tree_mask"]
    assert (mask[:, 7:, 0] == (1 << torch.arange(7, 13, dtype=torch.int32))).all()
    out, lse, scale = run_backend(case)
    assert_close(case, out, lse, scale)


@backends("triton")
@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_split_counts_agree(num_splits):
    # 16 splits of a <= 90-key prefix leave most splits empty: the merge must ignore them.
    case = make_case(2, 11, 4, 2, 32, [90, 37], torch.float32, mode="tree", page_size=16, seed=7)
    out, lse, scale = run_backend(case, num_splits=num_splits)
    assert_close(case, out, lse, scale)


@backends("triton")
@pytest.mark.parametrize("sms", [1, 64])
def test_triton_splits_follow_launch_plan(monkeypatch, sms):
    """The triton wrapper plans with launch_plan: its sm_count, its triton_attention_splits."""
    seen = []
    rule = launch_plan.triton_attention_splits

    def spy(*args):
        seen.append((args, rule(*args)))
        return seen[-1][1]

    monkeypatch.setattr(launch_plan, "sm_count", lambda device: sms)
    monkeypatch.setattr(launch_plan, "triton_attention_splits", spy)
    case = make_case(1, 5, 2, 1, 16, [300], torch.float16, mode="causal", seed=8)
    out, lse, scale = run_backend(case)
    assert_close(case, out, lse, scale)
    (base, _, got_sms, _), splits = seen[0]
    assert got_sms == sms and splits == (2 if sms == 1 else -(-(case["k_cache"].shape[1] - 5) // 32))


@backends("triton")
def test_long_prefix_uses_several_splits():
    B, N, Hq, Hkv = 1, 5, 2, 1
    case = make_case(B, N, Hq, Hkv, 16, [300], torch.float16, mode="causal", seed=8)
    splits = launch_plan.triton_attention_splits(B * Hkv, case["k_cache"].shape[1] - N,
                                                 launch_plan.sm_count("cpu"),
                                                 launch_plan.TRITON_MIN_KEYS_PER_SPLIT["cpu"])
    assert splits > 1
    out, lse, scale = run_backend(case)
    assert_close(case, out, lse, scale)


@backends("triton")
@pytest.mark.parametrize("num_splits", [1, 4])
def test_without_lse_and_custom_scale(num_splits):
    case = make_case(2, 7, 4, 2, 16, [10, 3], torch.float32, mode="tree", seed=9)
    out, lse, scale = run_backend(case, scale=0.37, num_splits=num_splits, with_lse=False,
                                  out_layout="transposed")
    assert lse is None
    assert_close(case, out, None, scale)


@backends("triton")
@pytest.mark.parametrize("num_splits", [1, 2])
def test_row_without_visible_key_is_zero_not_nan(num_splits):
    # Row 0 of sequence 0 has an empty mask and no prefix: out = 0, lse = -inf (as python_ref;
    # the public op refuses such a mask where value checks run).
    case = make_case(2, 4, 2, 1, 16, [0, 6], torch.float32, mode="tree", seed=10)
    case["tree_mask"][0, 0, 0] = 0
    out, lse, scale = run_backend(case, num_splits=num_splits, value_checks=False)
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0]))
    assert torch.isneginf(lse[0, :, 0]).all()
    ref_out, ref_lse = reference(case, scale)
    assert rel_l2(out, ref_out) < 1e-5
    assert rel_l2(lse[:, :, 1:], ref_lse[:, :, 1:]) < 1e-5 and rel_l2(lse[1], ref_lse[1]) < 1e-5


@backends("triton")
def test_public_api_dispatch():
    case = make_case(2, 6, 4, 2, 32, [14, 2], torch.float16, mode="tree", page_size=16, seed=11)
    out = torch.full_like(case["q"], float("nan"))
    got, lse = jk.tree_attention(case["q"], case["k_cache"], case["v_cache"], case["prefix_lens"],
                                 case["tree_mask"], block_table=case["block_table"],
                                 return_lse=True, out=out, backend="triton")
    assert got is out
    assert_close(case, out, lse, 1.0 / math.sqrt(32))


@backends("triton")
@pytest.mark.gpu
@pytest.mark.parametrize("B,N,prefix,page_size,mode", [
    (1, 16, [32768], 16, "tree"),
    (2, 64, [4096, 1000], None, "tree"),
    (4, 128, [2048, 17, 0, 999], 16, "causal"),
    (1, 256, [1024], None, "tree"),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_qwen3_8b_shapes_on_gpu(B, N, prefix, page_size, mode, dtype):
    case = make_case(B, N, 32, 8, 128, prefix, dtype, mode=mode, page_size=page_size,
                     device="cuda", tree_depth=15, tree_topk=7, seed=N)
    out, lse, scale = run_backend(case)
    torch.cuda.synchronize()
    assert_close(case, out, lse, scale)


# ---------------------------------------------------------------- engine layouts
# tests/test_engine_layouts.py checks each layout against a contiguous copy on the same backend;
# this checks them against python_ref, in this op's own file.
ENGINE_LAYOUTS = ["kv_halves", "kv_heads_major", "v_padded", "qkv", "outputs", "tables"]


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("is_paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", ENGINE_LAYOUTS)
def test_tree_attention_engine_layouts(backend, layout, is_paged):
    """K and V as halves of one buffer or heads-major, V rows padded, q sliced from a fused qkv
    projection, out / lse inside padded buffers, mask and block table sliced from wider ones:
    python_ref's answer (float64), NaN past every sequence's end never read."""
    dtype = torch.float32 if backend.name == "triton" else torch.float16
    dev = backend.device
    gen = torch.Generator().manual_seed(len(layout) * 2 + is_paged)
    B, N, Hq, Hkv, Dh, L, page = 3, 7, 4, 2, 64, 24, 6
    prefix = torch.tensor([0, 11, 5], dtype=torch.int32)
    q = torch.randn(B, N, Hq, Dh, generator=gen).to(dtype)
    k = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    v = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    for b in range(B):
        k[b, int(prefix[b]) + N:] = float("nan")
        v[b, int(prefix[b]) + N:] = float("nan")
    table = None
    if is_paged:
        k, table = paged(k, page, gen)
        v, _ = paged(v, page, gen, table)
    parents, num_nodes = random_tree(B, N, gen, pad=False)      # padding with junk parents
    mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    o_ref, l_ref = ref.tree_attention(q.double(), k.double(), v.double(), prefix, mask, "causal",
                                      table, None)
    q_d, k_d, v_d, mask_d = q.to(dev), *cache_layout(layout, k.to(dev), v.to(dev)), mask.to(dev)
    table_d = None if table is None else table.to(dev)
    out = torch.full((B, N, Hq, Dh), float("nan"), dtype=dtype, device=dev)
    lse = torch.full((B, Hq, N), float("nan"), device=dev)
    if layout == "qkv":
        q_d = fused_qkv(q_d, torch.randn(B, N, Hkv, Dh).to(dtype).to(dev),
                        torch.randn(B, N, Hkv, Dh).to(dtype).to(dev))[0]
    elif layout == "outputs":
        out = widened(out.flatten(2), 24).view(B, N, Hq, Dh)
        lse = widened(lse, 5)
    elif layout == "tables":
        mask_d = widened(mask_d, 3, dim=1, fill=-1)
        table_d = None if table_d is None else widened(table_d, 2, fill=-1)
    got, got_lse = jk.tree_attention(q_d, k_d, v_d, prefix.to(dev), mask_d, block_table=table_d,
                                     out=out, lse=lse, backend=api_backend(backend))
    sync(dev)
    assert got is out and got_lse is lse
    assert not got.isnan().any() and not got_lse.isnan().any()
    assert rel_l2(got, o_ref) < TOL[dtype] and rel_l2(got_lse, l_ref) < TOL[dtype]


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("qk_scale,v_scale", [(1e-3, 1e3), (30.0, 1e-2), (1.0, 1e3)])
def test_tree_attention_magnitudes(backend, qk_scale, v_scale):
    """Queries and keys of 1e-3 (uniform weights) or 30 (one-hot softmax: scores of 1e4 need the
    running max), values of 1e-2 .. 1e3: python_ref's output and lse (float64) within tolerance."""
    dtype = torch.float32 if backend.name == "triton" else torch.float16
    dev = backend.device
    gen = torch.Generator().manual_seed(int(qk_scale * 7 + v_scale))
    B, N, Hq, Hkv, Dh, L = 2, 9, 4, 2, 64, 40
    prefix = torch.tensor([20, 31], dtype=torch.int32)
    q = (torch.randn(B, N, Hq, Dh, generator=gen) * qk_scale).to(dtype)
    k = (torch.randn(B, L, Hkv, Dh, generator=gen) * qk_scale).to(dtype)
    v = (torch.randn(B, L, Hkv, Dh, generator=gen) * v_scale).to(dtype)
    parents, num_nodes = random_tree(B, N, gen)
    mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    o_ref, l_ref = ref.tree_attention(q.double(), k.double(), v.double(), prefix, mask)
    out, lse = jk.tree_attention(q.to(dev), k.to(dev), v.to(dev), prefix.to(dev), mask.to(dev),
                                 return_lse=True, backend=api_backend(backend))
    sync(dev)
    assert rel_l2(out, o_ref) < TOL[dtype] and rel_l2(lse, l_ref) < TOL[dtype]


def test_cuda_out_with_odd_strides_is_not_written_in_place(monkeypatch):
    """The cuda epilogue stores pairs of elements (4 bytes): an out whose head stride is odd
    (heads 65 elements apart) is computed into an aligned buffer and copied, never handed to _C
    (on a GPU: a misaligned-address fault); the values are python_ref's."""
    import jetspec_kernels

    use_sim(monkeypatch)
    inner, seen = jetspec_kernels._C, []

    class Spy:
        def __getattr__(self, name):
            fn = getattr(inner, name)
            if name != "tree_attention":
                return fn
            return lambda **kw: seen.append((kw["out"], kw["out_strides"])) or fn(**kw)

    monkeypatch.setattr(jetspec_kernels, "_C", Spy())
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 16, 4, 64, generator=gen).half()
    kc = torch.randn(1, 64, 2, 64, generator=gen).half()
    vc = torch.randn(1, 64, 2, 64, generator=gen).half()
    prefix = torch.tensor([20], dtype=torch.int32)
    out = torch.full((1, 16, 4, 65), float("nan"), dtype=torch.half)[..., :64]
    cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, out, None, 1, "mma")
    (ptr, strides), = seen
    assert ptr % 4 == 0 and all(s % 2 == 0 for s in strides), (ptr, strides)
    want, _ = ref.tree_attention(q.double(), kc.double(), vc.double(), prefix, None, "causal",
                                 None, 0.125)
    assert rel_l2(out, want) < TOL[torch.float16]



def assert_same_non_finite(got, want, tol, what):
    """NaN where python_ref has NaN, the same infinities, the finite rest within ``tol``."""
    got = got.detach().cpu().double()
    want = want.detach().cpu().double()
    for name, kind in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        diff = (kind(got) != kind(want)).nonzero()[:6].tolist()
        assert not diff, f"{what}: {name} at other places than python_ref's, first {diff}"
    finite = torch.isfinite(want)
    err = rel_l2(got[finite], want[finite])
    assert err < tol, f"{what}: relative L2 error {err:.3g} >= {tol} on the finite entries"


def non_finite_case(dtype):
    """Causal tail, prefixes 40 and 9; NaN / +-inf placed so that every rule of DESIGN.md's
    non-finite paragraph for tree_attention is hit once."""
    gen = torch.Generator().manual_seed(42)
    B, N, Hq, Hkv, Dh, L = 2, 6, 4, 2, 64, 56
    prefix = torch.tensor([40, 9], dtype=torch.int32)
    q = torch.randn(B, N, Hq, Dh, generator=gen)
    k = torch.randn(B, L, Hkv, Dh, generator=gen)
    v = torch.randn(B, L, Hkv, Dh, generator=gen)
    q[0, 1, 0, 3] = float("nan")              # one query NaN: its row only
    k[0, 2, 1, 0] = float("nan")              # a prefix key: every row of heads 2, 3
    k[0, 40 + 4, 0, :] = float("nan")         # tail key 4: only rows 4, 5 of heads 0, 1 see it
    q[1, 2, 1] = 0.0                          # every score -inf: a row with no visible key
    q[1, 2, 1, 0] = -float("inf")
    k[1, :, 0, 0] = k[1, :, 0, 0].abs() + 0.5
    q[1, 3, 2, 5] = float("inf")              # +inf and -inf scores: a NaN row
    v[1, 3, 0, 10] = float("nan")             # a prefix V: dim 10 of heads 0, 1 (not the empty row)
    for b in range(B):
        k[b, int(prefix[b]) + N:] = float("nan")
        v[b, int(prefix[b]) + N:] = float("nan")
    return q.to(dtype), k.to(dtype), v.to(dtype), prefix


def test_ref_tree_attention_non_finite():
    """python_ref's rules: a NaN or +inf score makes the row NaN (out and lse), only -inf scores
    give the empty row (out 0, lse -inf) whatever V holds, a NaN V reaches its dim."""
    q, k, v, prefix = non_finite_case(torch.float64)
    out, lse = ref.tree_attention(q, k, v, prefix, None, "causal", None, 0.125)
    assert out[0, 1, 0].isnan().all() and lse[0, 0, 1].isnan()
    assert out[0, :, 2:].isnan().all() and lse[0, 2:].isnan().all()
    assert out[0, 4:, :2].isnan().all() and not out[0, :4, :2].isnan()[[0, 2, 3]].any()
    assert torch.equal(out[1, 2, 1], torch.zeros(64, dtype=torch.float64))
    assert lse[1, 1, 2] == -math.inf
    assert out[1, 3, 2].isnan().all() and lse[1, 2, 3].isnan()
    assert out[1, :, :2, 10].isnan().sum() == 2 * 6 - 1
    assert torch.isfinite(out[1, :, 3]).all() and torch.isfinite(lse[1, 3]).all()


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("kernel", ["mma", "hopper"])
@pytest.mark.parametrize("splits", [1, 3])
def test_tree_attention_non_finite(backend, kernel, splits):
    """NaN and +-inf in q, K and V give python_ref's NaN, infinities and zeros, with one split
    and with the split partials merged."""
    if backend.name == "triton" and kernel != "mma":
        pytest.skip("one Triton kernel")
    dtype = torch.float32 if backend.name == "triton" else torch.float16
    dev = backend.device
    q, k, v, prefix = non_finite_case(dtype)
    want_out, want_lse = ref.tree_attention(q.double(), k.double(), v.double(), prefix, None,
                                            "causal", None, 0.125)
    args = [x.to(dev) for x in (q, k, v, prefix)]
    out = torch.full_like(args[0], float("nan"))
    lse = torch.full(tuple(want_lse.shape), float("nan"), device=dev)
    if backend.name == "triton":
        TA.launch_tree_attention(*args, None, "causal", None, 0.125, out, lse, num_splits=splits)
    else:
        cu().tree_attention(*args, None, "causal", None, 0.125, out, lse, num_splits=splits,
                            kernel=kernel)
    sync(dev)
    assert_same_non_finite(out, want_out, TOL[dtype], "out")
    assert_same_non_finite(lse, want_lse, TOL[dtype], "lse")


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("bad", ["full_tail_with_mask", "row_without_own_bit"])
def test_tree_attention_refuses_what_it_would_ignore(backend, bad):
    """tail="full" next to a tree mask (the mask decides; "full" would be ignored) and a mask
    row without its own bit: the same ValueError naming the argument on every backend."""
    dtype = torch.float32 if backend.name in ("reference", "triton") else torch.float16
    dev = backend.device
    gen = torch.Generator().manual_seed(3)
    B, N, Hq, Hkv, Dh, L = 2, 5, 4, 2, 64, 16
    q = torch.randn(B, N, Hq, Dh, generator=gen).to(dtype).to(dev)
    k = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype).to(dev)
    v = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype).to(dev)
    parents, num_nodes = random_tree(B, N, gen)
    mask = ref.pack_mask(parents, num_nodes).to(torch.int32)
    prefix = torch.tensor([3, 7], dtype=torch.int32).to(dev)
    tail, name = "causal", "tail"
    if bad == "full_tail_with_mask":
        tail = "full"
    else:
        mask[1, 3] = 0
        name = "tree_mask row 3 of sequence 1"
    jk.tree_attention(q, k, v, prefix, ref.pack_mask(parents, num_nodes).to(torch.int32).to(dev),
                      backend=api_backend(backend))
    with pytest.raises(ValueError, match=f"^{name} "):
        jk.tree_attention(q, k, v, prefix, mask.to(dev), tail=tail, backend=api_backend(backend))


@backends("reference", "triton", "sim", "cuda")
def test_tree_attention_head_dim_48(backend):
    """Dh 48, which no kernel takes: the reference backend computes it (python_ref's answer), a
    kernel backend named explicitly refuses naming the head dim, and auto runs it somewhere."""
    dev = backend.device
    dtype = torch.float16 if backend.name == "sim" else torch.float32
    gen = torch.Generator().manual_seed(48)
    q = torch.randn(2, 3, 2, 48, generator=gen).to(dtype)
    k = torch.randn(2, 8, 1, 48, generator=gen).to(dtype)
    v = torch.randn(2, 8, 1, 48, generator=gen).to(dtype)
    prefix = torch.tensor([2, 5], dtype=torch.int32)
    args = [x.to(dev) for x in (q, k, v, prefix)]
    want, _ = ref.tree_attention(q.double(), k.double(), v.double(), prefix)
    if backend.name == "reference":
        assert rel_l2(jk.tree_attention(*args, backend="reference"), want) < TOL[dtype]
    else:
        with pytest.raises(jk.BackendUnavailableError, match="head dim 48"):
            jk.tree_attention(*args, backend=api_backend(backend))
    assert rel_l2(jk.tree_attention(*args, backend="auto"), want) < TOL[dtype]


# (B, N, Hq, Hkv, Dh, prefix_lens, mode, page_size, q_layout): a branching tree over a paged
# cache, then a causal tail over a contiguous one
EXACT_CASES = [
    (2, 13, 4, 1, 16, [33, 0], "tree", 4, "sliced"),
    (2, 6, 2, 2, 32, [5, 17], "causal", None, "transposed"),
]


@pytest.mark.parametrize("exact_backend", [
    "reference", pytest.param("triton", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="exact triton attention is refused on a GPU"))])
@pytest.mark.parametrize("B,N,Hq,Hkv,Dh,prefix,mode,page_size,q_layout", EXACT_CASES)
def test_exact_rows_match_reference(exact_backend, B, N, Hq, Hkv, Dh, prefix, mode, page_size,
                                    q_layout):
    """tree_attention(exact=True): every row computed alone over its visible keys in logical
    order (python_ref's row form, or one triton launch a row when the triton backend is named)
    agrees with python_ref.tree_attention; out= and lse= are written in place and returned."""
    case = make_case(B, N, Hq, Hkv, Dh, prefix, torch.float32, mode=mode, page_size=page_size,
                     q_layout=q_layout, seed=B * 100 + N)
    q = case["q"]
    out = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    lse = torch.full((B, Hq, N), float("nan"))
    got = jk.tree_attention(q, case["k_cache"], case["v_cache"], case["prefix_lens"],
                            case["tree_mask"], tail=case["tail"], block_table=case["block_table"],
                            out=out, lse=lse, exact=True, backend=exact_backend)
    assert isinstance(got, tuple) and got[0] is out and got[1] is lse
    assert_close(case, out, lse, 1.0 / math.sqrt(Dh))
