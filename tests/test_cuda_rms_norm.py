"""The cuda backend's rms_norm (csrc/include/jetspec/rms_norm.cuh) on the CUDA simulator, against
the numerics of the backend interface computed here in plain torch (float64 where it can be):

    h = rnd(float(x) + float(residual)) (or x); total = h
    ss = sum(h^2) in float32; r = 1 / sqrt(ss / H + eps)
    out = rnd(float(weight) * float(rnd(h * r)))

float32: out within rel 1e-5 per element (abs 1e-6); float16 / bfloat16: total exact, and out
equal to rnd(weight * m) for an m within one ulp of the float64 rnd(h * r) (the kernel's float32
r may move the first rounding by one ulp, never more). Outputs are poisoned (NaN), inputs are
views of NaN-filled wider buffers where a read past a row or before it would show.
"""
import shutil

import pytest
import torch

from helpers import poisoned_empty, sim_module, use_sim

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
F32_MAX = torch.finfo(torch.float32).max


def reference(x, residual, weight, eps):
    """(out, total) of the interface's numerics: total exact in x's dtype; out as float64 along
    with the float64 normalised values n (before the weight) for the one-ulp rule."""
    if residual is None:
        h = x
    else:
        h = (x.float() + residual.float()).to(x.dtype)  # float32 add, then one rounding
    hd = h.double()
    ss = (hd * hd).sum(-1, keepdim=True)
    # float32's sum of squares overflows where float64's passes float32's largest value: r = 0
    r = torch.where(ss > F32_MAX, torch.zeros_like(ss), 1.0 / torch.sqrt(ss / x.shape[-1] + eps))
    n = hd * r
    if x.dtype != torch.float32:
        n = n.to(x.dtype).double()
    return weight.double() * n, h, n


def neighbours(n, dtype):
    """n's dtype neighbours one ulp below and above (as float64)."""
    t = n.to(dtype)
    inf = torch.full_like(t, float("inf"))
    return torch.nextafter(t, -inf).double(), torch.nextafter(t, inf).double()


def check(out, total, x, residual, weight, eps):
    want, want_total, n = reference(x, residual, weight, eps)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    if residual is None:
        assert total is None
    else:
        assert total.dtype == x.dtype and total.shape == x.shape and total.is_contiguous()
        assert torch.equal(total, want_total) or (
            torch.equal(total.isnan(), want_total.isnan())
            and torch.equal(total[~total.isnan()], want_total[~want_total.isnan()]))
    assert not out.isnan().any() or want.isnan().any()
    if x.dtype == torch.float32:
        err = (out.double() - want).abs()
        bad = err > 1e-5 * want.abs() + 1e-6
        assert not bad.any(), (err[bad][:8], out[bad][:8], want[bad][:8])
        return
    w = weight.double().expand_as(n)
    lo, hi = neighbours(n, x.dtype)
    ok = torch.zeros_like(out, dtype=torch.bool)
    for m in (n, lo, hi):
        cand = (w * m).to(x.dtype)  # the product of two dtype values is exact in float64
        ok |= (out == cand) | (out.isnan() & cand.isnan())
    assert ok.all(), (out[~ok][:8], want[~ok][:8])


def wide(t, extra=5, offset=0):
    """t [R, H] as a view of a NaN-filled [R, H + extra] buffer, starting `offset` elements in."""
    rows, hidden = t.shape
    buf = torch.full((rows + 1, hidden + extra), float("nan"), dtype=t.dtype)
    flat = buf.view(-1)[offset:offset + rows * (hidden + extra)].view(rows, hidden + extra)
    view = flat[:, :hidden]
    view.copy_(t)
    return view


def inputs(rows, hidden, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed * 1000 + rows * 17 + hidden)
    x = (torch.randn(rows, hidden, generator=gen) * scale).to(dtype)
    residual = (torch.randn(rows, hidden, generator=gen) * scale).to(dtype)
    weight = torch.randn(hidden, generator=gen)
    weight[::3] = 0.0
    weight[1::5] *= -1
    return x, residual, weight.to(dtype)


def run(x, residual, weight, eps=1e-6):
    from jetspec_kernels import cuda
    with poisoned_empty():
        return cuda.rms_norm(x, residual, weight, eps)


@pytest.fixture
def sim(monkeypatch):
    use_sim(monkeypatch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [1, 3, 8, 33, 100, 1024, 4096])
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "no_residual"])
def test_contiguous(sim, dtype, hidden, with_residual):
    rows = 5 if hidden >= 1024 else 37
    x, residual, weight = inputs(rows, hidden, dtype)
    residual = residual if with_residual else None
    out, total = run(x, residual, weight)
    check(out, total, x, residual, weight, 1e-6)


@pytest.mark.parametrize("rows", [0, 1, 5, 37])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows(sim, rows, dtype):
    x, residual, weight = inputs(rows, 100, dtype, seed=1)
    for res in (residual, None):
        out, total = run(x, res, weight, 1e-5)
        check(out, total, x, res, weight, 1e-5)


# (x's extra columns, x's first element, residual's extra columns): 16-byte rows everywhere
# (where H allows), residual rows 3 elements off 16 bytes, every x row one element off.
LAYOUTS = {"aligned": (8, 0, 16), "residual_stride": (8, 0, 3), "x_offset1": (8, 1, 16)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [3, 8, 33, 1024, 4096])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strided_rows(sim, dtype, hidden, layout):
    """Rows of wider NaN-filled buffers (row strides > H, x and residual each its own). The
    simulator reads a misaligned 16-byte unit as x86 does, so only a GPU run shows a wrong choice
    of the 16-byte path; here the layouts check the results of both paths."""
    x_extra, x_offset, r_extra = LAYOUTS[layout]
    x, residual, weight = inputs(5, hidden, dtype, seed=2)
    xs, rs = wide(x, x_extra, x_offset), wide(residual, r_extra)
    assert xs.stride(0) > hidden and rs.stride(0) > hidden
    for res in (rs, None):
        out, total = run(xs, res, weight)
        check(out, total, x, None if res is None else residual, weight, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_weight_and_residual(sim, dtype):
    """Each pointer alone starting one element past a 16-byte boundary takes the scalar path."""
    x, residual, weight = inputs(4, 64, dtype, seed=3)
    w_buf = torch.full((65,), float("nan"), dtype=dtype)
    w_buf[1:].copy_(weight)
    r_buf = torch.full((4 * 64 + 1,), float("nan"), dtype=dtype)
    r_buf[1:].copy_(residual.view(-1))
    for xx, rr, ww in ((x, residual, w_buf[1:]), (x, r_buf[1:].view(4, 64), weight)):
        out, total = run(xx, rr, ww)
        check(out, total, x, residual, weight, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1e-3, 1e3])
@pytest.mark.parametrize("hidden", [33, 4096])
def test_magnitudes(sim, dtype, scale, hidden):
    x, residual, weight = inputs(3, hidden, dtype, scale=scale, seed=4)
    for eps in (1e-6, 1e-2):
        out, total = run(x, residual, weight, eps)
        check(out, total, x, residual, weight, eps)


def test_float16_near_its_max(sim):
    """Squares of float16 values near 65504 overflow float16 but not the float32 sum."""
    x, residual, weight = inputs(3, 1024, torch.float16, seed=5)
    x = (torch.rand(3, 1024) * 2e4 + 4e4).to(torch.float16) * torch.sign(x)
    residual = (residual.float() * 100).to(torch.float16)
    out, total = run(x, residual, weight)
    check(out, total, x, residual, weight, 1e-6)
    assert out.isfinite().all() and out.abs().max() > 1


def test_bfloat16_large_and_overflowing(sim):
    """bfloat16 spans float32's range: at 1e17 the float32 sum of squares over 4096 elements
    still fits (normal output); near bfloat16's maximum it overflows to inf, so r = 0 and out is
    0 (what float32 Qwen3RMSNorm gives), not NaN."""
    x, residual, weight = inputs(2, 4096, torch.bfloat16, seed=6)
    big = (x.float() * 1e17).to(torch.bfloat16)
    out, total = run(big, residual, weight)
    check(out, total, big, residual, weight, 1e-6)
    assert out.abs().max() > 0.1
    near_max = (torch.rand(2, 4096) * 1e38 + 1e38).to(torch.bfloat16) * torch.sign(x)
    small = (residual.float() * 1e36).to(torch.bfloat16)
    out, total = run(near_max, small, weight)
    check(out, total, near_max, small, weight, 1e-6)
    assert total.isfinite().all() and torch.equal(out.abs(), torch.zeros_like(out))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_longer_than_the_registers(sim, dtype):
    """Rows past what a CTA's registers hold (8192 fp16/bf16 or 4096 fp32 elements with 16-byte
    loads, 2048 with scalar ones) are read back in the second pass: from total with a residual,
    from x without."""
    hidden = 8192 + 40 if dtype != torch.float32 else 4096 + 40
    x, residual, weight = inputs(2, hidden, dtype, seed=7)
    for offset in (0, 1):
        xs = wide(x, 8, offset)
        for res in (residual, None):
            out, total = run(xs, res, weight)
            check(out, total, x, res, weight, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_warp_and_cta_rows_meet(sim, dtype):
    """Hidden sizes each side of the warp-per-row limit (32 lanes x 32 fp16/bf16 or 16 fp32
    elements with 16-byte loads, 32 x 8 with scalar ones), rows not a multiple of 8 (a CTA's
    warps)."""
    limit = 1024 if dtype != torch.float32 else 512
    for hidden in (limit, limit + 8, 256, 264):
        x, residual, weight = inputs(11, hidden, dtype, seed=8)
        out, total = run(x, residual, weight)
        check(out, total, x, residual, weight, 1e-6)


def test_broadcast_row_stride_zero(sim):
    """A row stride of 0 (one row expanded) is read, not refused: rows may overlap in x."""
    x, residual, weight = inputs(1, 64, torch.bfloat16, seed=9)
    xs = x.expand(6, 64)
    assert xs.stride(0) == 0
    out, total = run(xs, residual.expand(6, 64), weight)
    check(out, total, xs.contiguous(), residual.expand(6, 64).contiguous(), weight, 1e-6)
    assert torch.equal(out, out[:1].expand(6, 64))


# ---- the launcher called directly on the simulated _C -----------------------------------------

@pytest.fixture
def C():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module()


def launcher_args(t, **changes):
    """The keywords of a valid call on the tensors t = (x, out, total, residual, weight)."""
    x, out, total, residual, weight = t
    a = dict(x=x.data_ptr(), x_row_stride=x.stride(0), residual=residual.data_ptr(),
             residual_row_stride=residual.stride(0), weight=weight.data_ptr(),
             out=out.data_ptr(), total=total.data_ptr(), rows=x.shape[0], hidden=x.shape[1],
             eps=1e-6, dtype=2, stream=0)
    a.update(changes)
    return a


def test_launcher_refuses_before_writing(C):
    """A refused call (tests/test_cuda_errors.py has every refusal's message) writes nothing."""
    x, residual, weight = inputs(4, 16, torch.bfloat16)
    out, total = torch.zeros_like(x), torch.zeros_like(x)
    for changes in (dict(hidden=0), dict(residual_row_stride=-16), dict(eps=-1.0), dict(dtype=7)):
        with pytest.raises(ValueError, match=r"^jetspec_kernels\._C\.rms_norm: " +
                           next(iter(changes))):
            C.rms_norm(**launcher_args((x, out, total, residual, weight), **changes))
    assert not out.any() and not total.any()


def test_launcher_edges_are_accepted(C):
    """rows 0 with null pointers, and a null residual (h = x; its stride unread) with a null total."""
    x, residual, weight = inputs(4, 16, torch.bfloat16)
    out = torch.zeros_like(x)
    C.rms_norm(x=0, x_row_stride=0, residual=0, residual_row_stride=0, weight=0, out=0, total=0,
               rows=0, hidden=16, eps=1e-6, dtype=2, stream=0)
    C.rms_norm(**launcher_args((x, out, x, residual, weight), residual=0, residual_row_stride=-5,
                               total=0))
    check(out, None, x, None, weight, 1e-6)
