"""The cuda backend against python_ref (float64): parity for every op and dtype, opcheck, and
CUDA-graph replay.

Every op also runs on the CPU in CI, opcheck included. It uses the ``sim`` device: the same
csrc kernels, built with g++ against tests/cuda_sim/cuda_sim.h, run as simulated threads behind
the same bindings and Python wrappers. Tests with the ``cuda`` device and graph replay are
gpu-marked.
"""
import contextlib
import math
import shutil

import pytest
import torch

import jetspec_kernels
from jetspec_kernels import python_ref as ref
from jetspec_kernels.cuda import _util as U
from helpers import filter_case, kept_by_thresholds, poisoned_empty, rel_l2, sim_module

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DEV = "cuda"  # the gpu-only tests


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu), "sim"])
def dev(request, monkeypatch):
    """Device of the test tensors: "cuda", or "cpu" with the simulated kernels installed as _C."""
    if request.param == "cuda":
        return "cuda"
    use_sim(monkeypatch)
    return "cpu"


def use_sim(monkeypatch):
    """Install the simulated kernels as _C for CPU tensors (skips the test without g++)."""
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    guard = DeviceGuardCheck()
    monkeypatch.setattr(jetspec_kernels, "_C", guard.wrap(sim_module()), raising=False)
    monkeypatch.setattr(U, "on_device", guard.on_device)
    monkeypatch.setattr(U, "stream", guard.stream)
    monkeypatch.setattr(U, "sm_count", lambda index: 132)  # an H200's split-KV choices


class DeviceGuardCheck:
    """Fails a simulated test whose op calls _C, or takes the stream, outside ``U.on_device``: on a
    GPU that call would launch on (and plan for) whatever device is current, not the tensors'."""

    def __init__(self):
        self.depth = 0

    @contextlib.contextmanager
    def on_device(self, t):
        assert isinstance(t, torch.Tensor)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def stream(self):
        assert self.depth > 0, "U.stream() outside U.on_device"
        return 0

    def wrap(self, module):
        check = self

        class Guarded:
            def __getattr__(self, name):
                fn = getattr(module, name)
                if not callable(fn):
                    return fn

                def call(*args, **kwargs):
                    assert check.depth > 0, f"_C.{name} called outside U.on_device"
                    return fn(*args, **kwargs)
                return call
        return Guarded()


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def cu():
    import jetspec_kernels.cuda as c
    return c


def random_tree(b, n, gen):
    parents = torch.full((b, n), -1, dtype=torch.int32)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (b,), generator=gen, dtype=torch.int32)
    num_nodes = torch.randint(max(1, n // 2), n + 1, (b,), generator=gen, dtype=torch.int32)
    for bb in range(b):
        parents[bb, num_nodes[bb]:] = -1
    return parents, num_nodes


def paged(cache, page_size, gen, table=None):
    """[B, L, H, D] -> (paged cache, block table); a shuffled table unless one is given."""
    b, l, h, d = cache.shape
    pages = l // page_size
    if table is None:
        table = torch.randperm(b * pages, generator=gen).view(b, pages).to(torch.int32)
    out = torch.empty(b * pages, page_size, h, d, dtype=cache.dtype)
    for bb in range(b):
        for p in range(pages):
            out[table[bb, p]] = cache[bb, p * page_size:(p + 1) * page_size]
    return out, table


ATTN_CASES = [
    # (dtype, dh, B, N, Hq, Hkv, tail, paged, splits)
    (torch.float16, 128, 2, 37, 8, 2, "mask", False, 1),
    (torch.bfloat16, 128, 2, 37, 8, 2, "mask", True, 3),
    (torch.float16, 64, 1, 16, 4, 4, "causal", False, 2),
    (torch.bfloat16, 64, 3, 70, 4, 1, "full", True, 1),
    (torch.float16, 256, 2, 20, 4, 2, "causal", True, 4),
    (torch.bfloat16, 256, 1, 64, 2, 1, "mask", False, 1),
]


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "tma"])
@pytest.mark.parametrize("dtype,dh,b,n,hq,hkv,tail,is_paged,splits", ATTN_CASES)
def test_tree_attention(dev, kernel, dtype, dh, b, n, hq, hkv, tail, is_paged, splits):
    if kernel != "mma" and dh not in cu().attention.WGMMA_HEAD_DIMS:
        pytest.skip("the sm_90a kernels take head dims 64 and 128")
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


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "tma"])
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


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "tma"])
@pytest.mark.parametrize("page_size", [None, 16, 24, 128])
def test_tree_attention_nan_past_end(dev, kernel, page_size):
    """Cache rows past each sequence's end (and pages no sequence owns) hold NaN, as a cache from
    torch.empty may: keys there are masked, and their V rows must not reach the output through
    0 * NaN. Lengths end mid-block; page 24 makes the TMA kernel copy 8-row chunks and 128 copies
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


def test_tree_attention_tma_page_size(dev):
    """The TMA kernel copies whole 8-row swizzle atoms, so it refuses other page sizes by name."""
    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16, device=dev)
    k = torch.zeros(4, 12, 1, 64, dtype=torch.float16, device=dev)
    table = torch.arange(4, dtype=torch.int32, device=dev).view(1, 4)
    prefix = torch.tensor([20], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="page size"):
        cu().tree_attention(q, k, k, prefix, None, "causal", table, 0.125, q.clone(), None,
                            kernel="tma")


def test_tree_attention_kernel_choice(dev, monkeypatch):
    """Where the runtime picked no sm_90a code (the simulator told binaryVersion 80), auto falls
    back to mma.sync and an explicit wgmma is an error; bad kernel names are ValueErrors."""
    if dev == "cuda":
        pytest.skip("the simulator's binaryVersion is what this test changes")
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
    with pytest.raises(RuntimeError, match="tree_attention"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None, kernel="tma")
    with pytest.raises(ValueError, match="kernel"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None, kernel="fast")
    monkeypatch.setenv("JETSPEC_ATTN_KERNEL", "wgmma")  # the default when kernel is None
    with pytest.raises(RuntimeError, match="tree_attention"):
        cu().tree_attention(q, k, v, prefix, None, "causal", None, 0.125, out, None)
    q256 = torch.zeros(b, n, hq, 256, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dims"):
        cu().tree_attention(q256, q256, q256, prefix, None, "causal", None, 0.125, q256.clone(),
                            None, kernel="wgmma")


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


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32),
                                               (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.bfloat16),
                                               (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("is_paged", [False, True])
def test_qk_norm_rope_append(dev, dtype, cache_dtype, is_paged):
    gen = torch.Generator().manual_seed(3)
    # 15 heads: warp head-groups of 8 q heads, then 4 q + 3 k heads (a group mixing both).
    b, n, hq, hkv, dh, lmax = 2, 5, 12, 3, 128, 64
    q = torch.randn(b, n, hq, dh, generator=gen).to(dtype)
    k = torch.randn(b, n, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(b, n, hkv, dh, generator=gen).to(dtype)
    qw = torch.rand(dh, generator=gen) + 0.5
    kw = torch.rand(dh, generator=gen) + 0.5
    positions = torch.tensor([[3, 4, 5, 6, 7], [40000, 40001, 40001, 40002, 40003]], dtype=torch.int32)
    start = torch.tensor([10, 30], dtype=torch.int32)
    kc = torch.full((b, lmax, hkv, dh), -7.0).to(cache_dtype)
    table = None
    if is_paged:
        kc, table = paged(kc, 8, gen)
    vc = kc.clone()
    # Compare written slots with the tolerance, untouched ones (sentinel -7) exactly.
    kc_ref, vc_ref = kc.double(), vc.double()
    q_ref = ref.qk_norm_rope_append(q.double(), k.double(), v.double(), qw.double(), kw.double(),
                                    positions, kc_ref, vc_ref, 1e6, 1e-6, table, start)
    kd, vd = kc.to(dev), vc.to(dev)
    q_out = cu().qk_norm_rope_append(q.to(dev), k.to(dev), v.to(dev), qw.to(dev), kw.to(dev),
                                     positions.to(dev), kd, vd, 1e6, 1e-6,
                                     None if table is None else table.to(dev), start.to(dev))
    sync(dev)
    assert q_out.dtype == dtype
    assert rel_l2(q_out, q_ref) < TOL[dtype]
    written = kc_ref != -7.0
    assert rel_l2(kd.cpu()[written], kc_ref[written]) < TOL[cache_dtype]
    assert rel_l2(vd.cpu()[written], vc_ref[written]) < TOL[cache_dtype]
    assert torch.equal(kd.cpu()[~written], kc[~written]) and torch.equal(vd.cpu()[~written], vc[~written])


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32),
                                               (torch.bfloat16, torch.bfloat16),
                                               (torch.float16, torch.float32)])
@pytest.mark.parametrize("is_paged", [False, True])
@pytest.mark.parametrize("with_start", [False, True])
def test_kv_only_norm_rope_append(dev, dtype, cache_dtype, is_paged, with_start):
    """q=None: no q output, caches identical in content to python_ref's K/V-only append."""
    gen = torch.Generator().manual_seed(5)
    b, n, hkv, dh, lmax = 3, 6, 2, 128, 64
    k = torch.randn(b, n, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(b, n, hkv, dh, generator=gen).to(dtype)
    kw = torch.rand(dh, generator=gen) + 0.5
    positions = torch.tensor([[3, 4, 5, 6, 7, 8], [40000, 40001, 40002, 40003, 40004, 40005],
                              [0, 1, 2, 3, 4, 5]], dtype=torch.int32)
    if with_start:
        positions[1] = torch.tensor([40000, 40001, 40001, 40002, 40002, 40003])
        start = torch.tensor([10, 30, 0], dtype=torch.int32)
    else:
        positions[1] -= 40000 - 50
        start = None
    kc = torch.full((b, lmax, hkv, dh), -7.0).to(cache_dtype)
    table = None
    if is_paged:
        kc, table = paged(kc, 8, gen)
    vc = kc.clone()
    kc_ref, vc_ref = kc.double(), vc.double()
    assert ref.qk_norm_rope_append(None, k.double(), v.double(), None, kw.double(), positions,
                                   kc_ref, vc_ref, 1e6, 1e-6, table, start) is None
    kd, vd = kc.to(dev), vc.to(dev)
    to = lambda t: None if t is None else t.to(dev)
    got = cu().qk_norm_rope_append(None, k.to(dev), v.to(dev), None, kw.to(dev),
                                   positions.to(dev), kd, vd, 1e6, 1e-6, to(table), to(start))
    sync(dev)
    assert got is None
    written = kc_ref != -7.0
    assert int(written.sum()) == b * n * hkv * dh
    assert rel_l2(kd.cpu()[written], kc_ref[written]) < TOL[cache_dtype]
    assert rel_l2(vd.cpu()[written], vc_ref[written]) < TOL[cache_dtype]
    assert torch.equal(kd.cpu()[~written], kc[~written]) and torch.equal(vd.cpu()[~written], vc[~written])
    from torch.library import opcheck
    opcheck(torch.ops.jetspec.kv_norm_rope_append.default,
            (k.to(dev), v.to(dev), kw.to(dev), positions.to(dev), kd, vd, 1e6, 1e-6, to(table),
             to(start)))


VERIFY_KEYS = ("accept_len", "path", "bonus", "emitted")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
# (B, N, V, misaligned): one vocab split; a B = 1 verify in 3 splits (with a tie across splits
# and a NaN logit); 2 splits over logits whose rows are not 16-byte aligned (scalar loads).
@pytest.mark.parametrize("b,n,v,misaligned", [(3, 40, 1000, False), (1, 9, 9000, False),
                                              (2, 7, 9001, True)])
def test_verify_tree(dev, dtype, temperature, b, n, v, misaligned):
    gen = torch.Generator().manual_seed(5)
    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)  # frequent matches
    logits = torch.randn(b, n, v + misaligned, generator=gen).to(dtype)[..., misaligned:]
    logits[..., :4] += 4.0
    logits[0, 0, [3, v - 2]] = 40.0  # node 0: equal maxima in the first and last split
    logits[0, 1, v // 2] = float("nan")  # NaN is the maximum (torch.argmax)
    seed = torch.tensor([1, 2, 3], dtype=torch.int64)[:b]
    offset = torch.tensor([7, 7, 2 ** 40], dtype=torch.int64)[:b]
    max_depth = 8
    want = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=logits.float(),
                           temperature=temperature, seed=seed, offset=offset)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), max_depth,
                               logits.to(dev), None, temperature, seed.to(dev), offset.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


@pytest.mark.parametrize("target", ["tokens", "greedy", "sampled"])
def test_verify_tree_empty_rows(dev, target):
    """num_nodes 0 (value checks off): the root is still verified, so the row is a one-node
    tree: accept_len 0 and the bonus is the target's token at node 0 (given, or from logits)."""
    gen = torch.Generator().manual_seed(6)
    b, n, v = 4, 33, 300
    parents, num_nodes = random_tree(b, n, gen)
    num_nodes[1] = 0
    num_nodes[2] = 1
    tokens = torch.randint(0, 3, (b, n), generator=gen, dtype=torch.int32)
    seed = torch.tensor([1, 2, 3, 4], dtype=torch.int64)
    offset = torch.zeros(b, dtype=torch.int64)
    temperature = 0.8 if target == "sampled" else 0.0
    if target == "tokens":
        tgt = torch.randint(0, 3, (b, n), generator=gen, dtype=torch.int32)
        logits = None
    else:
        logits = torch.randn(b, n, v, generator=gen)
        logits[..., :3] += 3.0
        tgt = ref.sample_tokens(logits, temperature, seed, offset)
    want = ref.verify_tree(tokens, parents, num_nodes, 6, target_tokens=tgt)
    to = lambda t: None if t is None else t.to(dev)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), 6, to(logits),
                               tgt.to(dev) if logits is None else None, temperature,
                               to(seed), to(offset))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key
    assert got[0][1] == 0 and got[2][1] == tgt[1, 0] and got[1][1, 0] == 0


def test_verify_tree_uniform_clamp(dev):
    """Seed 39114, offset 0, sequence 0, node 0, v 7 hashes to h >> 8 == 2**24 - 1, whose uniform
    rounds to 1.0 in float32 unless clamped to 1 - 2**-24: an infinite Gumbel would make v 7 win
    over token 3's clear lead. One-node trees, so the bonus is the sample at node 0."""
    tokens = torch.zeros(2, 1, dtype=torch.int32)
    parents = torch.full((2, 1), -1, dtype=torch.int32)
    num_nodes = torch.ones(2, dtype=torch.int32)
    logits = torch.zeros(2, 1, 8)
    logits[:, 0, 3] = 30.0
    seed = torch.tensor([39114, 39114], dtype=torch.int64)
    offset = torch.zeros(2, dtype=torch.int64)
    want = ref.verify_tree(tokens, parents, num_nodes, 0, target_logits=logits, temperature=1.0,
                           seed=seed, offset=offset)
    assert want["bonus"].tolist() == [3, 3]
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), 0,
                               logits.to(dev), None, 1.0, seed.to(dev), offset.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
# (N, V, misaligned): vector loads; a vocabulary in several phase-1 splits (and a two-pass id
# select among ties); rows off 16 bytes (scalar loads).
@pytest.mark.parametrize("n,v,misaligned", [(5, 300, False), (4, 9000, False), (3, 1001, True)])
def test_verify_tree_filters(dev, dtype, n, v, misaligned):
    """Per-sequence temperature (one sequence greedy), top-k and top-p with exact ties at both
    boundaries (helpers.filter_case): the thresholds keep exactly python_ref.filter_keep's
    tokens, and every node's sample (one-node trees) and whole-tree verdicts are python_ref's."""
    gen = torch.Generator().manual_seed(n * 7 + v)
    logits, temp, top_k, top_p = filter_case(gen, n, v + misaligned, dtype)
    logits = logits[..., misaligned:]
    to = lambda t: None if t is None else t.to(dev)
    sampled = temp > 0
    x = logits.float() / temp[:, None, None]
    for k_, p_ in ((top_k, None), (None, top_p), (top_k, top_p)):
        with poisoned_empty():
            thr = cu().verify.filter_thresholds(logits.to(dev), temp.to(dev), to(k_), to(p_))
        sync(dev)
        kept = kept_by_thresholds(logits, temp, *thr)
        assert torch.equal(kept[sampled], ref.filter_keep(x, k_, p_)[sampled]), (k_, p_)

    b = logits.shape[0]
    rep = lambda t: t.repeat_interleave(n)           # every node its own one-node tree
    rows = logits.reshape(b * n, 1, v)
    zeros = torch.zeros(b * n, 1, dtype=torch.int32)
    seed = torch.arange(b * n, dtype=torch.int64) * 7919 + 3
    offset = torch.arange(b * n, dtype=torch.int64) % 5
    kw = dict(temperature=rep(temp), seed=seed, offset=offset, top_k=rep(top_k), top_p=rep(top_p))
    want = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows, **kw)
    with poisoned_empty():
        got = cu().verify_tree(zeros.to(dev), (zeros - 1).to(dev), (zeros[:, 0] + 1).to(dev), 0,
                               rows.to(dev), None, *(to(kw[k]) for k in ("temperature", "seed",
                                                                         "offset", "top_k", "top_p")))
    sync(dev)
    assert torch.equal(got[2].cpu(), want["bonus"].cpu())
    unfiltered = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows,
                                 temperature=rep(temp), seed=seed, offset=offset)
    assert not torch.equal(want["bonus"], unfiltered["bonus"]), "the filters should change samples"

    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)
    seed, offset = seed[:b], offset[:b]
    want = ref.verify_tree(tokens, parents, num_nodes, n - 1, target_logits=logits,
                           temperature=temp, seed=seed, offset=offset, top_k=top_k, top_p=top_p)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), n - 1,
                               logits.to(dev), None, temp.to(dev), seed.to(dev), offset.to(dev),
                               top_k.to(dev), top_p.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


def test_verify_tree_filters_survive_nan_logits(dev):
    """NaN logits are outside the contract (the result is unspecified), but the filter's search
    must still finish without a trap: its integer divisions are guarded."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 500, generator=gen)
    logits[0, 0, ::7] = float("nan")
    logits[1, 1] = float("nan")
    temp = torch.tensor([1.0, 0.5])
    for k_, p_ in ((torch.tensor([5, 0], dtype=torch.int32), None), (None, torch.tensor([0.5, 0.3])),
                   (torch.tensor([5, 0], dtype=torch.int32), torch.tensor([0.5, 0.3]))):
        cu().verify.filter_thresholds(logits.to(dev), temp.to(dev), None if k_ is None else k_.to(dev),
                                      None if p_ is None else p_.to(dev))
    sync(dev)


def test_verify_tree_walk_limit(dev):
    # The walk stages at most MAX_NODES["cuda"] nodes; a larger tree is an error from the launcher
    # (and `auto` never sends one there).
    from jetspec_kernels.ops.verify_tree import MAX_NODES
    n = MAX_NODES["cuda"]
    tokens = torch.zeros(1, n + 1, dtype=torch.int32, device=dev)
    parents = torch.full((1, n + 1), -1, dtype=torch.int32, device=dev)
    num_nodes = torch.tensor([n + 1], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=rf"verify_walk: n {n + 1} exceeds {n}$"):
        cu().verify_tree(tokens, parents, num_nodes, 1, None, tokens, 0.0, None, None)
    with poisoned_empty():
        got = cu().verify_tree(tokens[:, :n], parents[:, :n], num_nodes - 1, 1, None,
                               tokens[:, :n], 0.0, None, None)
    sync(dev)
    assert got[0].cpu().tolist() == [0] and got[2].cpu().tolist() == [0]


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("is_paged", [False, True])
# Rows of whole 16-byte units (16-byte copies) or not (element copies).
@pytest.mark.parametrize("dh,hdim", [(16, 24), (6, 20)])
def test_commit_kv(dev, cache_dtype, is_paged, dh, hdim):
    gen = torch.Generator().manual_seed(9)
    b, lmax, hkv, cols = 2, 64, 2, 5
    kc = torch.randn(b, lmax, hkv, dh, generator=gen).to(cache_dtype)
    table = None
    if is_paged:
        kc, table = paged(kc, 8, gen)
    vc = torch.randn(kc.shape, generator=gen).to(cache_dtype)
    prefix = torch.tensor([3, 20], dtype=torch.int32)
    path = torch.tensor([[0, 2, 3, 7, -1], [0, 1, 5, 6, 9]], dtype=torch.int32)
    accept = torch.tensor([3, 4], dtype=torch.int32)
    hidden = torch.randn(b, 12, hdim, generator=gen).to(torch.bfloat16)
    kr, vr = kc.clone(), vc.clone()
    want_lens, want_rows = ref.commit_kv(kr, vr, prefix, path, accept, table, hidden)
    kd, vd = kc.to(dev), vc.to(dev)
    with poisoned_empty():
        lens, rows = cu().commit_kv(kd, vd, prefix.to(dev), path.to(dev), accept.to(dev),
                                    None if table is None else table.to(dev), hidden.to(dev))
    sync(dev)
    assert torch.equal(lens.cpu(), want_lens) and torch.equal(rows.cpu(), want_rows)
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_log_softmax_topk(dev, dtype):
    gen = torch.Generator().manual_seed(11)
    # 5 vocabulary chunks of 4096 (the last partial) in the simulator, 38 on a GPU.
    b, d, v, k = 2, 3, 151936 if dev == "cuda" else 18000, 8
    logits = (torch.randn(b, d, v, generator=gen) * 3).to(dtype)
    logits[0, 0, 100:110] = logits[0, 0].max()  # ties within a chunk: lower token first
    logits[1, 2, 4090:4100] = logits[1, 2].max()  # ties across two chunks
    tt, tl = cu().log_softmax_topk(logits.to(dev), k)
    want_t, want_l = ref.log_softmax_topk(logits.double(), k)
    assert torch.equal(tt.cpu(), want_t)
    # 16-bit inputs are exact in fp32 and the log-softmax is fp32 for every input dtype.
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]


@pytest.mark.parametrize("staged", [True, False])
def test_log_softmax_topk_many_chunks(dev, monkeypatch, staged):
    """34 vocabulary chunks: the merge's sum of exp then has partials from two warps, which a
    missing barrier before the cross-warp sum gets wrong. The merge stages its 340 candidates in
    shared memory, or (a simulated 1 KB per block) reads them from global memory."""
    if not staged:
        if dev == "cuda":
            pytest.skip("the simulator's shared memory per block is what this case changes")
        monkeypatch.setenv("JETSPEC_SIM_SMEM_PER_BLOCK", "1024")
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(1, 2, 33 * 4096 + 5, generator=gen) * 3
    tt, tl = cu().log_softmax_topk(logits.to(dev), 10)
    want_t, want_l = ref.log_softmax_topk(logits.double(), 10)
    assert torch.equal(tt.cpu(), want_t)
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]


# (dtype, B, D, H, V, k, simulated SMs): one m16 tile with a hidden-size tail (72 = 64 + 8) and
# a partial vocab tile; 21 rows (one 64-row tile); 65 rows (two) and a 4-entry last tile; k = 33
# (two list slots per lane); a 1-SM plan, so that each CTA folds several vocab tiles; and H = 200
# (4 pipeline steps a tile, with no barrier between them) so that stages are refilled mid-tile.
F16, BF16 = torch.float16, torch.bfloat16
HIDDEN_CASES = [(F16, 1, 5, 72, 1000, 8, 132), (BF16, 1, 5, 72, 1000, 8, 132),
                (BF16, 3, 7, 64, 2000, 5, 132), (F16, 5, 13, 128, 260, 4, 132),
                (BF16, 1, 3, 64, 700, 33, 132),
                (F16, 2, 3, 64, 1500, 6, 1), (BF16, 2, 3, 64, 1500, 6, 1),
                (F16, 1, 4, 200, 700, 5, 1)]


@pytest.mark.parametrize("dtype,b,d,h,v,k,sms", HIDDEN_CASES)
def test_hidden_topk(dev, monkeypatch, dtype, b, d, h, v, k, sms):
    monkeypatch.setenv("JETSPEC_SIM_SM_COUNT", str(sms))
    gen = torch.Generator().manual_seed(h + v + k)
    hidden = torch.randn(b, d, h, generator=gen).to(dtype)
    weight = (torch.randn(v, h, generator=gen) / 4).to(dtype)
    # Nine equal logits, seven in the first tile (inserted there out of id order: lane 4 holds
    # token 100), the others in later tiles / CTAs; for k < 9 the cut falls inside the tie, and
    # the lower token ids must win.
    weight[[2, 3, 5, 40, 77, 100, 129, v - 1]] = weight[v // 2].clone()
    hidden[0, 0] = weight[2] * 4  # make the tied logits the largest of row (0, 0)
    with poisoned_empty():
        tt, tl = cu().hidden_topk(hidden.to(dev), weight.to(dev), k)
    sync(dev)
    want_t, want_l = ref.log_softmax_topk(hidden.double() @ weight.double().T, k)
    assert torch.equal(tt.cpu(), want_t)
    # 16-bit inputs are exact in fp32; only the accumulation order differs from float64.
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 6])  # 15 rows (one 16-row tile) and 90 rows (two 64-row tiles)
def test_hidden_topk_qwen3_shape(b):
    """Qwen3-8B's lm_head (V=151936, H=4096, bf16) with the device's real launch plan."""
    gen = torch.Generator(device=DEV).manual_seed(b)
    hidden = torch.randn(b, 15, 4096, device=DEV, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(151936, 4096, device=DEV, generator=gen) / 64).to(torch.bfloat16)
    tt, tl = cu().hidden_topk(hidden, weight, 8)
    want_t, want_l = ref.log_softmax_topk((hidden.float() @ weight.float().T).double(), 8)
    assert torch.equal(tt.cpu(), want_t.cpu())
    assert rel_l2(tl, want_l) < TOL[torch.float32]


def test_hidden_topk_strided_and_unsupported(dev):
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 6, 64, generator=gen).half()[1::2, ::3]  # strided B and D
    weight = torch.randn(300, 64, generator=gen).half()
    tt, tl = cu().hidden_topk(hidden.to(dev), weight.to(dev), 4)
    want_t, want_l = ref.log_softmax_topk(hidden.double() @ weight.double().T, 4)
    assert torch.equal(tt.cpu(), want_t) and rel_l2(tl.cpu(), want_l) < TOL[torch.float32]
    with pytest.raises(jetspec_kernels.BackendUnavailableError, match="float16/bfloat16"):
        cu().hidden_topk(hidden.float().to(dev), weight.float().to(dev), 4)
    with pytest.raises(jetspec_kernels.BackendUnavailableError, match="H % 8"):
        cu().hidden_topk(hidden[..., :60].to(dev), weight[:, :60].to(dev), 4)
    with pytest.raises(ValueError, match="lm_head_weight rows must start on 16-byte"):
        # sliced on the device: .to() of a non-dense view makes a fresh (aligned) copy
        cu().hidden_topk(hidden.to(dev)[..., :56], weight.to(dev)[:, 1:57], 4)


@pytest.mark.parametrize("algorithm", ["topn", "accum_logp"])
# (8, 2, 1) and (40, 3, 2): budget above the implicit tree size (3 and 13 nodes), where a lane
# caching another lane's node once made accum_logp pop a max-depth leaf forever.
@pytest.mark.parametrize("budget,k,d", [(64, 4, 15), (256, 8, 15), (7, 3, 2), (100, 64, 3),
                                        (8, 2, 1), (40, 3, 2), (600, 5, 6)])
def test_build_tree(dev, algorithm, budget, k, d):
    gen = torch.Generator().manual_seed(budget + k)
    b = 3
    lp = torch.log_softmax(torch.randn(b, d, 200, generator=gen), -1)
    lp, idx = lp.sort(-1, descending=True)
    lp, idx = lp[..., :k].contiguous(), idx[..., :k].to(torch.int32).contiguous()
    lp[1] = lp[1].round(decimals=1)  # exact score ties exercise the tie rules
    lp[1] = lp[1].sort(-1, descending=True).values
    root = torch.tensor([5, 6, 7], dtype=torch.int32)
    want = ref.build_tree(idx, lp, root, budget, algorithm)
    with poisoned_empty():
        got = cu().build_tree(idx.to(dev), lp.to(dev), root.to(dev), budget, algorithm)
    sync(dev)
    for key, g in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), got):
        assert torch.equal(g.cpu(), want[key].cpu().to(g.dtype)), key


@pytest.mark.parametrize("b,n", [(1, 1), (3, 31), (2, 32), (3, 33), (2, 100)])
def test_pack_mask(dev, b, n):
    """Random trees, ragged node counts (padding rows keep only their own bit), a full chain
    (bit 31 and every word of a row set), several mask words."""
    gen = torch.Generator().manual_seed(b * 1000 + n)
    parents, num_nodes = random_tree(b, n, gen)
    parents[0, 1:] = torch.arange(n - 1, dtype=torch.int32)  # a chain: every bit of a row set
    num_nodes[0] = n
    want = ref.pack_mask(parents, num_nodes).to(torch.int32)
    with poisoned_empty():
        got = cu().pack_mask(parents.to(dev), num_nodes.to(dev))
    sync(dev)
    assert torch.equal(got.cpu(), want)


def test_build_tree_random_configs(dev):
    """Many small trees with heavy score ties (log-probs on a 0.25 grid) and -inf log-probs."""
    gen = torch.Generator().manual_seed(123)
    for trial in range(30):
        d = int(torch.randint(1, 7, (1,), generator=gen))
        k = int(torch.randint(1, 10, (1,), generator=gen))
        budget = int(torch.randint(1, 160, (1,), generator=gen))
        lp = -(torch.rand(2, d, k, generator=gen) * 3 / 0.25).round() * 0.25
        if trial % 5 == 0:
            lp[0, :, k // 2 + 1:] = float("-inf")
        lp = lp.sort(-1, descending=True).values.contiguous()
        idx = torch.randint(0, 1000, (2, d, k), generator=gen, dtype=torch.int32)
        root = torch.tensor([3, 4], dtype=torch.int32)
        for algorithm in ("topn", "accum_logp"):
            want = ref.build_tree(idx, lp, root, budget, algorithm)
            with poisoned_empty():
                got = cu().build_tree(idx.to(dev), lp.to(dev), root.to(dev), budget, algorithm)
            sync(dev)
            for key, g in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), got):
                assert torch.equal(g.cpu(), want[key].cpu().to(g.dtype)), (trial, algorithm, key)


def _round_inputs(dev, gen):
    """Small inputs of every op of a round: q [1, 16, 4, 64] and a 64-row K/V cache (fp16),
    prefix, out, lse, logits [2, 3, 5000], hidden [2, 3, 64], root tokens [2]."""
    b, n, hq, hkv, dh = 1, 16, 4, 2, 64
    q = torch.randn(b, n, hq, dh, generator=gen).half().to(dev)
    kc = torch.randn(b, 64, hkv, dh, generator=gen).half().to(dev)
    vc = torch.randn(b, 64, hkv, dh, generator=gen).half().to(dev)
    prefix = torch.tensor([20], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, n, device=dev)
    logits = torch.randn(2, 3, 5000, generator=gen).to(dev)
    hid = torch.randn(2, 3, 64, generator=gen).half().to(dev)
    root = torch.tensor([1, 2], dtype=torch.int32, device=dev)
    return q, kc, vc, prefix, out, lse, logits, hid, root


def test_opcheck(dev):
    """torch.library.opcheck of every op: schema (declared mutations), fake implementations
    against the real outputs, autograd registration and AOT dispatch."""
    from torch.library import opcheck

    gen = torch.Generator().manual_seed(1)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs(dev, gen)
    b, n, _, dh = q.shape
    hkv = kc.shape[2]
    for name, kernel in cu().attention.KERNELS.items():
        if name != "tma":  # test_opcheck_tma: a TMA fault must not take the other ops with it
            opcheck(torch.ops.jetspec.tree_attention.default,
                    (q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, 2, kernel))
    opcheck(torch.ops.jetspec.log_softmax_topk.default, (logits, 4))
    opcheck(torch.ops.jetspec.hidden_topk.default, (hid, torch.randn(700, 64).half().to(dev), 4))
    tt, tl = cu().log_softmax_topk(logits, 4)
    opcheck(torch.ops.jetspec.build_tree.default, (tt, tl, root, 20, "topn"))
    tree = cu().build_tree(tt, tl, root, 20, "topn")
    tlog = torch.randn(2, 20, 300, generator=gen).to(dev)
    opcheck(torch.ops.jetspec.verify_tree.default,
            (tree[0], tree[1], tree[4], 3, tlog, None, None, None, None, None, None))
    i64 = dict(dtype=torch.int64, device=dev)
    opcheck(torch.ops.jetspec.verify_tree.default,  # per-sequence temperature, top-k and top-p
            (tree[0], tree[1], tree[4], 3, tlog, None, torch.tensor([0.0, 0.8], device=dev),
             torch.tensor([1, 2], **i64), torch.tensor([0, 3], **i64),
             torch.tensor([0, 5], dtype=torch.int32, device=dev),
             torch.tensor([0.9, 0.5], device=dev)))
    kn = torch.randn(b, n, hkv, dh, generator=gen).half().to(dev)
    kv_ = torch.randn(b, n, hkv, dh, generator=gen).half().to(dev)
    w = torch.ones(dh, device=dev)
    pos = torch.arange(n, dtype=torch.int32, device=dev)[None]
    opcheck(torch.ops.jetspec.qk_norm_rope_append.default,
            (q, kn, kv_, w, w, pos, kc, vc, 1e6, 1e-6, None, None))
    path = torch.tensor([[0, 2, 3]], dtype=torch.int32, device=dev)
    acc = torch.tensor([2], dtype=torch.int32, device=dev)
    opcheck(torch.ops.jetspec.commit_kv.default, (kc, vc, prefix, path, acc, None, None))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_ops_on_a_device_that_is_not_current():
    """Tensors on cuda:1 while cuda:0 is current: every op launches on its tensors' device (the
    CPU tests check that every _C call sits inside U.on_device; this checks it on hardware)."""
    gen = torch.Generator().manual_seed(3)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs("cuda:1", gen)
    lm_head = torch.randn(700, 64, generator=gen).half().to("cuda:1")
    tlog = torch.randn(2, 20, 300, generator=gen).to("cuda:1")

    def round_outputs():
        o = torch.empty_like(out)
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, o, None, 2, None)
        tt, tl = cu().log_softmax_topk(logits, 4)
        ht, hl = cu().hidden_topk(hid, lm_head, 4)
        tree = cu().build_tree(tt, tl, root, 20, "topn")
        acc = cu().verify_tree(tree[0], tree[1], tree[4], 3, tlog, None, 0.0, None, None)
        mask = cu().pack_mask(tree[1], tree[4])
        return [o, tt, tl, ht, hl, *tree, *acc, mask]

    with torch.cuda.device(1):
        want = round_outputs()
    with torch.cuda.device(0):
        got = round_outputs()
    torch.cuda.synchronize(1)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device == torch.device("cuda:1") and torch.equal(g, w), i


def _tma_inputs(dev, gen, n):
    """_round_inputs' attention tensors with n tree rows: 2n packed rows per kv head, so n = 40
    runs the TMA kernel with two consumer warpgroups and n = 16 with one."""
    _, kc, vc, prefix, _, _ = _round_inputs(dev, gen)[:6]
    q = torch.randn(1, n, 4, 64, generator=gen).half().to(dev)
    return q, kc, vc, prefix, torch.empty_like(q), torch.empty(1, 4, n, device=dev)


@pytest.mark.parametrize("n", [16, 40])
def test_opcheck_tma(dev, n):
    """opcheck of tree_attention with the TMA kernel (its own test, so that on a GPU a fault in
    it cannot break the CUDA context of the other ops' checks; device_check.sh runs it apart)."""
    from torch.library import opcheck

    q, kc, vc, prefix, out, lse = _tma_inputs(dev, torch.Generator().manual_seed(1), n)
    opcheck(torch.ops.jetspec.tree_attention.default,
            (q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, 2,
             cu().attention.KERNELS["tma"]))


def _capture(fn):
    """Runs fn once on a side stream (warm-up, as CUDA-graph capture needs), then captures it:
    returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    return g, result


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16, 40])
def test_graph_replay_tma(n):
    """The TMA kernel under CUDA-graph capture: its tensor maps are kernel parameters, captured
    by value; replay on new q and cache contents (same buffers)."""
    gen = torch.Generator().manual_seed(2)
    q, kc, vc, prefix, out, lse = _tma_inputs(DEV, gen, n)

    def run():
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, out, lse,
                            num_splits=2, kernel="tma")

    g, _ = _capture(run)
    for t in (q, kc, vc):
        t.copy_(torch.randn(t.shape, generator=gen).half())
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    o_ref, l_ref = ref.tree_attention(q.double().cpu(), kc.double().cpu(), vc.double().cpu(),
                                      prefix.cpu(), None, "causal", None, 0.125)
    assert rel_l2(out, o_ref) < TOL[torch.float16] and rel_l2(lse, l_ref) < TOL[torch.float16]


@pytest.mark.gpu
def test_graph_replay():
    gen = torch.Generator().manual_seed(1)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs(DEV, gen)

    # CUDA graph: capture draft tree (from logits and from hidden states), verification
    # attention and verify_tree; replay on new inputs.
    w_head = torch.randn(700, 64, generator=gen).half().to(DEV)
    tlog1 = torch.randn(2, 20, 9000, generator=gen).to(DEV)  # B*N = 40 rows: vocab splits

    def round_():
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, num_splits=2)
        t = cu().build_tree(*cu().log_softmax_topk(logits, 4), root, 20, "topn")
        th = cu().build_tree(*cu().hidden_topk(hid, w_head, 4), root, 20, "topn")
        return t, th, cu().verify_tree(t[0], t[1], t[4], 3, tlog1, None, 0.0, None, None)

    g, (t_graph, th_graph, verdict) = _capture(round_)
    q.copy_(torch.randn(q.shape, generator=gen).half())
    logits.copy_(torch.randn(logits.shape, generator=gen))
    hid.copy_(torch.randn(hid.shape, generator=gen).half())
    tlog1.copy_(torch.randn(tlog1.shape, generator=gen))
    g.replay()
    torch.cuda.synchronize()
    want_h = ref.draft_tree((hid.double() @ w_head.double().T).cpu(), root.cpu(), 20, 4, "topn")
    assert torch.equal(th_graph[0].cpu(), want_h["tokens"].cpu())
    want_v = ref.verify_tree(t_graph[0].cpu(), t_graph[1].cpu(), t_graph[4].cpu(), 3,
                             target_logits=tlog1.cpu())
    for key, got_v in zip(("accept_len", "path", "bonus", "emitted"), verdict):
        assert torch.equal(got_v.cpu(), want_v[key].cpu()), key
    o_ref, _ = ref.tree_attention(q.double().cpu(), kc.double().cpu(), vc.double().cpu(),
                                  prefix.cpu(), None, "causal", None, 0.125)
    assert rel_l2(out, o_ref) < TOL[torch.float16]
    want = ref.draft_tree(logits.cpu(), root.cpu(), 20, 4, "topn")
    assert torch.equal(t_graph[0].cpu(), want["tokens"].cpu())
    assert torch.equal(t_graph[1].cpu(), want["parents"].cpu())
