"""qk_norm_rope_append (and its K/V-only form) against python_ref (float64), on the cuda kernel
(simulator, and a GPU: gpu) and Triton (the interpreter, bf16 included; Qwen3-8B shapes on a
GPU)."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from helpers import (DEV, TOL, api_backend, backend_module, backends, cache_layout, cu, fused_qkv,
                     paged, rel_l2, shuffled_table, sync, widened)
from kernel_constants import cuda_constant

rope = backend_module("triton", "qk_norm_rope_append")


def sentinel_caches(shape, cache_dtype, is_paged, gen):
    """K and V caches [B, L, H, D] of the sentinel -7 (paged in pages of 8 with a shuffled table
    when ``is_paged``) -> (k cache, v cache, block table or None)."""
    kc = torch.full(shape, -7.0).to(cache_dtype)
    table = None
    if is_paged:
        kc, table = paged(kc, 8, gen)
    return kc, kc.clone(), table


def assert_sentinel_writes(kd, vd, kc, vc, kc_ref, vc_ref, tol):
    """The slots python_ref wrote (``kc_ref`` off the sentinel) match within ``tol``; the others
    still hold ``kc`` / ``vc`` exactly."""
    written = kc_ref != -7.0
    assert rel_l2(kd.cpu()[written], kc_ref[written]) < tol
    assert rel_l2(vd.cpu()[written], vc_ref[written]) < tol
    assert torch.equal(kd.cpu()[~written], kc[~written]) and torch.equal(vd.cpu()[~written], vc[~written])


@backends("sim", "cuda")
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
    kc, vc, table = sentinel_caches((b, lmax, hkv, dh), cache_dtype, is_paged, gen)
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
    assert_sentinel_writes(kd, vd, kc, vc, kc_ref, vc_ref, TOL[cache_dtype])


@backends("sim", "cuda")
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
    kc, vc, table = sentinel_caches((b, lmax, hkv, dh), cache_dtype, is_paged, gen)
    kc_ref, vc_ref = kc.double(), vc.double()
    assert ref.qk_norm_rope_append(None, k.double(), v.double(), None, kw.double(), positions,
                                   kc_ref, vc_ref, 1e6, 1e-6, table, start) is None
    kd, vd = kc.to(dev), vc.to(dev)
    to = lambda t: None if t is None else t.to(dev)
    got = cu().qk_norm_rope_append(None, k.to(dev), v.to(dev), None, kw.to(dev),
                                   positions.to(dev), kd, vd, 1e6, 1e-6, to(table), to(start))
    sync(dev)
    assert got is None
    assert int((kc_ref != -7.0).sum()) == b * n * hkv * dh
    assert_sentinel_writes(kd, vd, kc, vc, kc_ref, vc_ref, TOL[cache_dtype])
    from torch.library import opcheck
    opcheck(torch.ops.jetspec.kv_norm_rope_append.default,
            (k.to(dev), v.to(dev), kw.to(dev), positions.to(dev), kd, vd, 1e6, 1e-6, to(table),
             to(start)))


# ---------------------------------------------------------------- the triton kernel


def make_inputs(B, N, HQ, HKV, DH, dtype, layout, gen):
    """q, k, v as non-contiguous views when asked: heads of one fused qkv tensor, or a
    sequence-major tensor transposed to batch-major."""
    if layout == "fused":
        qkv = torch.randn(B, N, HQ + 2 * HKV, DH, generator=gen).to(dtype)
        return qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
    if layout == "transposed":
        t = lambda h: torch.randn(N, B, h, DH, generator=gen).to(dtype).transpose(0, 1)
        return t(HQ), t(HKV), t(HKV)
    return (torch.randn(B, N, HQ, DH, generator=gen).to(dtype),
            torch.randn(B, N, HKV, DH, generator=gen).to(dtype),
            torch.randn(B, N, HKV, DH, generator=gen).to(dtype))


def make_cache(B, cap, HKV, DH, dtype, page, gen):
    """NaN-poisoned k/v caches of capacity ``cap`` per sequence and a shuffled block table."""
    if page is None:
        shape, table = (B, cap, HKV, DH), None
    else:
        pages = -(-cap // page)
        table = shuffled_table(B, pages, gen, spare=3)
        shape = (B * pages + 3, page, HKV, DH)
    kc = torch.full(shape, float("nan"), dtype=dtype)
    return kc, kc.clone(), table


def run_case(B, N, HQ, HKV, DH, dtype, cache_dtype, layout, page, with_start, base_pos, seed,
             w_dtype=None, theta=1e6, with_q=True):
    """``with_q=False``: the K/V-only form (q, q_norm_w and q_out None), same caches expected."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_inputs(B, N, HQ, HKV, DH, dtype, layout, gen)
    qw = (torch.rand(DH, generator=gen) + 0.5).to(w_dtype or dtype)
    kw = (torch.rand(DH, generator=gen) + 0.5).to(w_dtype or dtype)
    pre = torch.randint(0, 9, (B,), generator=gen, dtype=torch.int32)
    if with_start:
        # tree verification: RoPE at prefix + depth (repeats), slots prefix + n
        depth = torch.randint(0, 4, (B, N), generator=gen, dtype=torch.int32)
        positions = (base_pos + pre[:, None] + depth).to(torch.int32)
        start, cap = pre, 9 + N
    else:
        positions = (base_pos + pre[:, None] + torch.arange(N, dtype=torch.int32)).to(torch.int32)
        start, cap = None, base_pos + 9 + N
    kc, vc, table = make_cache(B, cap, HKV, DH, cache_dtype, page, gen)
    if not with_q:
        q = qw = None
    kr, vr = kc.double(), vc.double()
    dbl = lambda t: None if t is None else t.double()
    want_q = ref.qk_norm_rope_append(dbl(q), k.double(), v.double(), dbl(qw), kw.double(),
                                     positions, kr, vr, theta, block_table=table, cache_start=start)

    to = lambda t: None if t is None else t.to(DEV)
    q_out = None if q is None else torch.full(q.shape, float("nan"), dtype=dtype, device=DEV)
    kc, vc = kc.to(DEV), vc.to(DEV)
    rope.launch(to(q), to(k), to(v), to(qw), to(kw), to(positions), kc, vc, theta, 1e-6,
                to(table), to(start), q_out)
    tol = max(TOL[dtype], TOL[cache_dtype])
    if with_q:
        assert rel_l2(q_out.cpu(), want_q) < TOL[dtype]
    else:
        assert want_q is None
    kc, vc = kc.cpu(), vc.cpu()
    written = ~torch.isnan(kr)
    assert torch.equal(torch.isnan(kc), ~written), "wrote outside the target slots or missed one"
    assert torch.equal(torch.isnan(vc), ~written)
    assert rel_l2(kc[written], kr[written]) < tol
    assert rel_l2(vc[written], vr[written]) < tol
    if cache_dtype == dtype:
        assert torch.equal(vc[written], vr[written].to(cache_dtype)), "v must be stored as is"


CASES = [
    # B, N, HQ, HKV, DH, dtype, cache dtype, layout, page, cache_start, base position
    (3, 5, 4, 4, 64, torch.float32, torch.float32, "contiguous", None, False, 0),
    (3, 7, 8, 2, 128, torch.float32, torch.float32, "fused", 16, True, 0),
    (1, 6, 8, 2, 16, torch.float32, torch.float32, "transposed", 1, True, 40000),
    (3, 3, 4, 1, 64, torch.float32, torch.float32, "fused", None, False, 40000),
    (2, 5, 4, 4, 128, torch.float16, torch.float16, "transposed", 16, False, 100),
    (3, 5, 8, 2, 64, torch.float16, torch.float32, "fused", 1, True, 32000),
    (2, 3, 4, 1, 16, torch.float32, torch.float16, "contiguous", 16, True, 0),
    (2, 3, 12, 4, 128, torch.float32, torch.float32, "contiguous", None, True, 7),  # 2 q tiles
]


@backends("triton")
@pytest.mark.parametrize("i", range(len(CASES)),
                         ids=["-".join(map(str, c)).replace("torch.", "") for c in CASES])
def test_parity_with_reference(i):
    run_case(*CASES[i], seed=i)


# The K/V-only form: contiguous and paged caches, with and without cache_start, long positions.
KV_ONLY_CASES = [CASES[i] for i in (0, 1, 2, 4, 5, 6)]


@backends("triton")
@pytest.mark.parametrize("i", range(len(KV_ONLY_CASES)),
                         ids=["-".join(map(str, c)).replace("torch.", "") for c in KV_ONLY_CASES])
def test_kv_only_parity_with_reference(i):
    run_case(*KV_ONLY_CASES[i], seed=100 + i, with_q=False)


@backends("triton")
def test_weights_in_another_dtype_and_small_theta():
    run_case(3, 5, 8, 2, 64, torch.float16, torch.float16, "contiguous", None, True, 5000, seed=7,
             w_dtype=torch.float32, theta=10000.0)


@backends("triton")
def test_theta_that_is_not_a_float32():
    """rope_theta 25000003 is no float32 (it rounds to 25000004); the kernel's float32 arguments
    carry it as a hi + lo pair, and dropping lo is 9e-5 off at position 2**17 (fp32 tolerance
    1e-5)."""
    run_case(2, 3, 4, 2, 128, torch.float32, torch.float32, "contiguous", None, True, 2 ** 17,
             seed=11, theta=25000003.0)


@backends("triton")
def test_public_api_dispatches_to_triton():
    gen = torch.Generator().manual_seed(3)
    B, N, HQ, HKV, DH = 3, 5, 4, 2, 64
    q, k, v = make_inputs(B, N, HQ, HKV, DH, torch.float32, "fused", gen)
    w = torch.rand(DH, generator=gen) + 0.5
    pos = torch.randint(0, 60, (B, N), generator=gen, dtype=torch.int32)
    pos = pos + torch.arange(N, dtype=torch.int32) * 64           # distinct slots per sequence
    kc = torch.full((B, 64 * N, HKV, DH), float("nan"))
    vc = kc.clone()
    kr, vr = kc.double(), vc.double()
    got = jk.qk_norm_rope_append(q, k, v, w, w, pos, kc, vc, rope_theta=1e6, backend="triton")
    want = ref.qk_norm_rope_append(q.double(), k.double(), v.double(), w.double(), w.double(),
                                   pos, kr, vr, 1e6)
    assert got.dtype == torch.float32 and got.shape == q.shape
    assert rel_l2(got, want) < 1e-5
    written = ~torch.isnan(kr)
    assert torch.equal(torch.isnan(kc), ~written)
    assert rel_l2(kc[written], kr[written]) < 1e-5


@backends("triton")
def test_public_api_kv_only_returns_none_and_fills_cache():
    gen = torch.Generator().manual_seed(4)
    B, N, HKV, DH, page = 2, 6, 2, 32, 4
    _, k, v = make_inputs(B, N, 2, HKV, DH, torch.float32, "transposed", gen)
    w = torch.rand(DH, generator=gen) + 0.5
    pos = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]], dtype=torch.int32)
    kc, vc, table = make_cache(B, 12, HKV, DH, torch.float32, page, gen)
    kr, vr = kc.double(), vc.double()
    got = jk.qk_norm_rope_append(None, k, v, None, w, pos, kc, vc, rope_theta=1e6,
                                 block_table=table, backend="triton")
    assert got is None
    ref.qk_norm_rope_append(None, k.double(), v.double(), None, w.double(), pos, kr, vr, 1e6,
                            block_table=table)
    written = ~torch.isnan(kr)
    assert torch.equal(torch.isnan(kc), ~written) and torch.equal(torch.isnan(vc), ~written)
    assert rel_l2(kc[written], kr[written]) < 1e-5
    assert torch.equal(vc[written], vr[written].float())


# bf16 runs on the CPU too (the kernel has no tl.dot, the interpreter's one bf16 gap); Qwen3-8B's
# head counts only on a GPU (about 15 s a case under the interpreter).
BF16_SHAPES = [pytest.param((3, 7, 12, 4, 128), id="small"),
               pytest.param((4, 64, 32, 8, 128), id="qwen", marks=pytest.mark.gpu)]


@backends("triton")
@pytest.mark.parametrize("shape", BF16_SHAPES)
@pytest.mark.parametrize("page", [None, 16])
def test_bf16(shape, page):
    run_case(*shape, torch.bfloat16, torch.bfloat16, "fused", page, True, 32768, seed=1)


@backends("triton")
@pytest.mark.parametrize("shape", BF16_SHAPES)
@pytest.mark.parametrize("page", [None, 16])
def test_bf16_kv_only(shape, page):
    run_case(*shape, torch.bfloat16, torch.bfloat16, "fused", page, True, 32768, seed=3,
             with_q=False)


@backends("triton")
@pytest.mark.gpu
def test_fp32_long_positions_on_gpu():
    run_case(2, 33, 16, 4, 128, torch.float32, torch.float32, "contiguous", 16, False, 40000,
             seed=2)


# ---------------------------------------------------------------- engine layouts
# tests/test_engine_layouts.py checks each layout against a contiguous copy on the same backend;
# this checks them against python_ref, in this op's own file.


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "kv_only"])
@pytest.mark.parametrize("is_paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", ["qkv", "v_apart", "kv_halves", "kv_heads_major", "v_padded"])
def test_engine_layouts(backend, layout, is_paged, with_q):
    """q, k, v sliced from one fused qkv projection (positions from a wider buffer), v alone in a
    wider buffer (its row and head strides differ from k's), or caches as K/V halves of one
    buffer, heads-major or with padded V rows: python_ref's q and caches."""
    dtype = torch.float16
    dev = backend.device
    gen = torch.Generator().manual_seed(len(layout) * 4 + 2 * is_paged + with_q)
    B, N, Hq, Hkv, Dh, L, page = 3, 5, 6, 2, 64, 20, 4
    q, k, v = (torch.randn(B, N, h, Dh, generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    qw, kw = torch.rand(Dh, generator=gen) + 0.5, torch.rand(Dh, generator=gen) + 0.5
    prefix = torch.tensor([2, 9, 0], dtype=torch.int32)
    cache = torch.full((B, L, Hkv, Dh), float("nan"), dtype=dtype)
    table = start = None
    if is_paged:                                  # tree rows: RoPE at depth, slot at row
        cache, table = paged(cache, page, gen)
        positions = prefix[:, None] + torch.tensor([0, 1, 1, 2, 3])[None, :]
        start = prefix
    else:
        positions = prefix[:, None] + torch.arange(N)[None, :]
    positions = positions.to(torch.int32)
    kr, vr = cache.double(), cache.double()
    dbl = (lambda t: t.double()) if with_q else (lambda t: None)
    want = ref.qk_norm_rope_append(dbl(q), k.double(), v.double(), dbl(qw), kw.double(), positions,
                                   kr, vr, 1e6, block_table=table, cache_start=start)
    kc, vc = cache.to(dev), cache.clone().to(dev)
    q_d, k_d, v_d, pos_d = q.to(dev), k.to(dev), v.to(dev), positions.to(dev)
    if layout == "qkv":
        q_d, k_d, v_d = fused_qkv(q_d, k_d, v_d)
        pos_d = widened(pos_d, 3, fill=-1)
    elif layout == "v_apart":
        v_d = widened(v_d, 8)
    else:
        kc, vc = cache_layout(layout, kc, vc)
    to = lambda t: None if t is None else t.to(dev)
    got = jk.qk_norm_rope_append(q_d if with_q else None, k_d, v_d, qw.to(dev) if with_q else None,
                                 kw.to(dev), pos_d, kc, vc, rope_theta=1e6, block_table=to(table),
                                 cache_start=to(start), backend=api_backend(backend))
    sync(dev)
    if with_q:
        assert rel_l2(got, want) < TOL[dtype]
    else:
        assert got is None
    written = ~kr.isnan()
    assert torch.equal(~kc.cpu().isnan(), written) and torch.equal(~vc.cpu().isnan(), written)
    assert rel_l2(kc.cpu()[written], kr[written]) < TOL[dtype]
    assert torch.equal(vc.cpu()[written], vr[written].to(dtype))


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("scale", [1e-4, 1e-3, 1e3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_activation_scales(backend, scale, dtype):
    """Activations of 1e-4 .. 1e3 (hidden states of some layers live at 1e-3, where eps = 1e-6
    is as large as mean(x**2)) and a head of identical values: RMSNorm's epsilon sits inside the
    square root (an epsilon outside it is 38 % off at 1e-3 and passes at scale 1)."""
    gen = torch.Generator().manual_seed(int(scale * 1e4) % 1000)
    B, N, Hq, Hkv, Dh = 2, 3, 4, 2, 64
    q = (torch.randn(B, N, Hq, Dh, generator=gen) * scale).to(dtype)
    k = (torch.randn(B, N, Hkv, Dh, generator=gen) * scale).to(dtype)
    v = torch.randn(B, N, Hkv, Dh, generator=gen).to(dtype)
    k[0, 0, 0] = k[0, 0, 0, :1]                           # identical values: normalised to w
    qw, kw = torch.rand(Dh, generator=gen) + 0.5, torch.rand(Dh, generator=gen) + 0.5
    pos = torch.tensor([[0, 1, 2], [7, 8, 9]], dtype=torch.int32)
    kc = torch.full((B, 12, Hkv, Dh), float("nan"), dtype=dtype)
    kr, vr = kc.double(), kc.double()
    want = ref.qk_norm_rope_append(q.double(), k.double(), v.double(), qw.double(), kw.double(),
                                   pos, kr, vr, 1e6)
    dev = backend.device
    kd, vd = kc.to(dev), kc.clone().to(dev)
    got = jk.qk_norm_rope_append(q.to(dev), k.to(dev), v.to(dev), qw.to(dev), kw.to(dev),
                                 pos.to(dev), kd, vd, rope_theta=1e6, backend=api_backend(backend))
    sync(dev)
    written = ~kr.isnan()
    assert rel_l2(got, want) < TOL[dtype]
    assert rel_l2(kd.cpu()[written], kr[written]) < TOL[dtype]


# ---- the cuda kernel's split at its boundaries --------------------------------------------------
# qk_norm_rope_append.cuh: one warp a (token, group of kRopeHeadsPerWarp heads), the q heads first
# and then the k heads, kRopeThreads / 32 warps a block (the last block's spare warps return);
# each lane rotates the pairs i = lane + 32 t (t < kRopeMaxPairsPerLane) below Dh / 2.
ROPE_HEADS_PER_WARP = cuda_constant("qk_norm_rope_append.cuh", "kRopeHeadsPerWarp")
ROPE_WARPS = cuda_constant("qk_norm_rope_append.cuh", "kRopeThreads") // 32

# (Hq, Hkv, Dh, tokens B x N; Hkv divides Hq): heads one short of a warp's group, exactly a
# group (k heads ending it; q heads filling it, k heads alone in the next), one over (a group of
# one k head); Dh / 2 one pair short of a warp's 32 lanes, exactly 32, one over, and the largest Dh
# (every lane's last pair); tokens one warp short of a block's warps and one over.
_G = ROPE_HEADS_PER_WARP
ROPE_BOUNDARY = [(_G - 2, 1, 64, (1, ROPE_WARPS - 1)), (_G, _G, 64, (1, ROPE_WARPS + 1)),
                 (_G - 2, 2, 64, (2, 3)), (2 * _G, 1, 62, (1, 1)), (_G, 1, 66, (3, 1)),
                 (0, _G + 1, 64, (1, 2)), (4, 2, 512, (2, 2))]


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "kv_only"])
@pytest.mark.parametrize("hq,hkv,dh,tokens", ROPE_BOUNDARY,
                         ids=[f"hq{q}-hkv{k}-dh{d}-{b}x{n}" for q, k, d, (b, n) in ROPE_BOUNDARY])
def test_heads_and_pairs_at_the_kernels_edges(backend, hq, hkv, dh, tokens, with_q):
    """Head counts at a warp's head group's end, Dh / 2 at a warp's lanes' end and the largest Dh,
    tokens at a block's warps' end: python_ref's q and caches, every slot it leaves alone still
    NaN (a head or pair past the end written shows)."""
    if hq == 0 and with_q:
        pytest.skip("no q heads")
    dev = backend.device
    B, N = tokens
    dtype = torch.float16
    gen = torch.Generator().manual_seed(hq * 100 + hkv * 10 + dh)
    q, k, v = (torch.randn(B, N, h, dh, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    qw, kw = torch.rand(dh, generator=gen) + 0.5, torch.rand(dh, generator=gen) + 0.5
    positions = (torch.arange(N)[None, :] + 3 * torch.arange(B)[:, None]).to(torch.int32)
    cache = torch.full((B, 3 * B + N + 1, hkv, dh), float("nan"), dtype=dtype)
    kr, vr = cache.double(), cache.double()
    dbl = (lambda t: t.double()) if with_q else (lambda t: None)
    want = ref.qk_norm_rope_append(dbl(q), k.double(), v.double(), dbl(qw), kw.double(), positions,
                                   kr, vr, 1e6)
    kc, vc = cache.to(dev), cache.clone().to(dev)
    got = jk.qk_norm_rope_append(q.to(dev) if with_q else None, k.to(dev), v.to(dev),
                                 qw.to(dev) if with_q else None, kw.to(dev), positions.to(dev),
                                 kc, vc, rope_theta=1e6, backend=api_backend(backend))
    sync(dev)
    if with_q:
        assert rel_l2(got, want) < TOL[dtype]
    written = ~kr.isnan()
    assert torch.equal(~kc.cpu().isnan(), written) and torch.equal(~vc.cpu().isnan(), written)
    assert rel_l2(kc.cpu()[written], kr[written]) < TOL[dtype]
    assert torch.equal(vc.cpu()[written], vr[written].to(dtype))


# ------------------------------------------------ no QK-norm, partial rotary (Llama, Qwen3-Next)
NORM_ROTARY = [(True, None), (False, None), (False, 16), (True, 16), (False, 32), (True, 2)]


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "kv_only"])
@pytest.mark.parametrize("norm,rotary_dim", NORM_ROTARY,
                         ids=[f"{'norm' if n else 'no_norm'}-rot{r or 'all'}" for n, r in NORM_ROTARY])
def test_norm_off_and_partial_rotary(backend, norm, rotary_dim, with_q):
    """q_norm_w = k_norm_w = None (RoPE and the append alone) and rotary_dim < Dh (the first
    rotary_dim dims rotate, the rest pass, normed or not): python_ref's q and caches, unwritten
    slots still NaN, eps 0 taken."""
    dev = backend.device
    dtype = torch.float16
    gen = torch.Generator().manual_seed(len(NORM_ROTARY) * norm + (rotary_dim or 0))
    B, N, hq, hkv, dh = 2, 3, 4, 2, 64
    q, k, v = (torch.randn(B, N, h, dh, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    qw, kw = ((torch.rand(dh, generator=gen) + 0.5) if norm else None for _ in range(2))
    positions = (torch.arange(N)[None, :] + torch.tensor([[5], [900]])).to(torch.int32)
    cache = torch.full((B, 905, hkv, dh), float("nan"), dtype=dtype)
    kr, vr = cache.double(), cache.double()
    dbl = lambda t: None if t is None else t.double()
    qq = q if with_q else None
    want = ref.qk_norm_rope_append(dbl(qq), k.double(), v.double(), dbl(qw if with_q else None),
                                   dbl(kw), positions, kr, vr, 1e4, eps=1e-5 if norm else 0.0,
                                   rotary_dim=rotary_dim)
    kc, vc = cache.to(dev), cache.clone().to(dev)
    to = lambda t: None if t is None else t.to(dev)
    got = jk.qk_norm_rope_append(to(qq), k.to(dev), v.to(dev), to(qw if with_q else None), to(kw),
                                 positions.to(dev), kc, vc, rope_theta=1e4,
                                 eps=1e-5 if norm else 0.0, rotary_dim=rotary_dim,
                                 backend=api_backend(backend))
    sync(dev)
    if with_q:
        assert rel_l2(got, want) < TOL[dtype]
        if not norm and rotary_dim is not None:     # the dims past rotary_dim pass as they are
            assert torch.equal(got.cpu()[..., rotary_dim:], q[..., rotary_dim:])
    else:
        assert got is None
    written = ~kr.isnan()
    assert torch.equal(~kc.cpu().isnan(), written) and torch.equal(~vc.cpu().isnan(), written)
    assert rel_l2(kc.cpu()[written], kr[written]) < TOL[dtype]
    assert torch.equal(vc.cpu()[written], vr[written].to(dtype))


def _transformers_rope(model, factor, theta, dh, x, positions):
    """(cos, sin) [B, N, rotary dims] of transformers' rotary embedding for ``model``."""
    if model == "llama":
        from transformers.models.llama import modeling_llama as m
        from transformers.models.llama.configuration_llama import LlamaConfig as Config
        rotary = m.LlamaRotaryEmbedding
    else:
        from transformers.models.qwen3_next import modeling_qwen3_next as m
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig as Config
        rotary = m.Qwen3NextRotaryEmbedding
    extra = {} if factor == 1.0 else {"partial_rotary_factor": factor}
    cfg = Config(hidden_size=4 * dh, num_attention_heads=4, num_key_value_heads=2, head_dim=dh,
                 rope_theta=theta, **extra)
    return m, rotary(cfg)(x, positions)


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("model,factor", [("llama", 1.0), ("qwen3_next", 0.25)])
def test_rope_without_norm_matches_transformers(backend, model, factor):
    """No QK-norm (Llama) and Qwen3-Next's partial_rotary_factor 0.25: q and the cached k are
    transformers' apply_rotary_pos_emb of q and k (float32, rotary_dim = int(Dh * factor))."""
    pytest.importorskip("transformers")
    dev = backend.device
    gen = torch.Generator().manual_seed(7)
    B, N, hq, hkv, dh, theta = 2, 5, 4, 2, 64, 1e4
    q = torch.randn(B, N, hq, dh, generator=gen)
    k = torch.randn(B, N, hkv, dh, generator=gen)
    v = torch.randn(B, N, hkv, dh, generator=gen)
    positions = torch.arange(N)[None, :] + torch.tensor([[0], [37]])
    m, (cos, sin) = _transformers_rope(model, factor, theta, dh, q, positions)
    q_hf, k_hf = m.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    rotary_dim = int(dh * factor) if factor != 1.0 else None
    kc = torch.zeros(B, 64, hkv, dh, device=dev)
    vc = torch.zeros_like(kc)
    dtype = torch.float16 if backend.name == "sim" else torch.float32
    got = jk.qk_norm_rope_append(q.to(dtype).to(dev), k.to(dtype).to(dev), v.to(dtype).to(dev),
                                 None, None, positions.to(torch.int32).to(dev), kc, vc,
                                 rope_theta=theta, rotary_dim=rotary_dim,
                                 backend=api_backend(backend))
    sync(dev)
    tol = TOL[dtype]
    if dtype == torch.float16:      # transformers' rotation of the inputs as rounded to fp16
        q_hf, k_hf = m.apply_rotary_pos_emb(q.half().float().transpose(1, 2),
                                            k.half().float().transpose(1, 2), cos, sin)
    assert rel_l2(got.float().cpu(), q_hf.transpose(1, 2)) < tol
    slots = positions[:, :, None, None].expand(B, N, hkv, dh)
    assert rel_l2(kc.cpu().gather(1, slots), k_hf.transpose(1, 2)) < tol


@pytest.mark.parametrize("change,err,needle", [
    (dict(q_norm_w=None), ValueError, "q_norm_w must be a tensor"),
    (dict(k_norm_w=None), ValueError, "q_norm_w must be None when k_norm_w is None"),
    (dict(rotary_dim=7), ValueError, "rotary_dim must be even"),
    (dict(rotary_dim=66), ValueError, r"rotary_dim must be in \[2, 64\]"),
    (dict(rotary_dim=0), ValueError, r"rotary_dim must be in \[2, 64\]"),
    (dict(eps=-1e-6), ValueError, "eps must be >= 0"),
])
def test_norm_and_rotary_arguments_are_checked(change, err, needle):
    gen = torch.Generator().manual_seed(0)
    B, N, dh = 1, 2, 64
    args = dict(q=torch.randn(B, N, 2, dh, generator=gen), k=torch.randn(B, N, 1, dh, generator=gen),
                v=torch.randn(B, N, 1, dh, generator=gen), q_norm_w=torch.ones(dh),
                k_norm_w=torch.ones(dh), positions=torch.zeros(B, N, dtype=torch.int32) + torch.arange(N, dtype=torch.int32),
                k_cache=torch.zeros(B, 8, 1, dh), v_cache=torch.zeros(B, 8, 1, dh))
    jk.qk_norm_rope_append(**args, rope_theta=1e4, eps=0.0, backend="reference")   # eps 0: taken
    kw = dict(rope_theta=1e4, eps=change.pop("eps", 1e-6), **{k: change.pop(k) for k in list(change)
                                                              if k == "rotary_dim"})
    with pytest.raises(err, match=needle):
        jk.qk_norm_rope_append(**{**args, **change}, **kw, backend="reference")
