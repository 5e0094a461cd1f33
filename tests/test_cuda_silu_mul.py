"""The cuda backend's silu_mul (csrc/include/jetspec/silu_mul.cuh) on the CUDA simulator, against
the contract's numerics evaluated here in float64 (g = x[:, j], u = x[:, I + j], d = x's dtype):

    s = rnd_d(g / (1 + exp(-g))) computed in float32; out = rnd_d(float32(s) * float32(u))

The float32 silu may differ from the exact one by a couple of ulps (exp, division), so any float32
s within relative 2e-6 of the float64 value (or either float32 neighbour of it) is accepted; where
float32's exp(-g) overflows, s is -0.0 exactly (g / inf), as torch's. fp16 / bf16: out must be
one of the (at most two) values those s give after both roundings, each product in float32 as the
contract says; float32: out between them. Zero signs, infinities and NaN positions are exact.
Outputs are poisoned (NaN) and fenced (a write past their end fails), inputs are views of
NaN-filled wider buffers where a read past a row or before it would show; a vector access off 16
bytes fails the simulator (common.cuh as_units).
"""
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_silu_mul as check, fenced_empty, same, sim_module, use_sim
from test_cuda_rms_norm import wide

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def inputs(rows, inner, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed * 1000 + rows * 17 + inner)
    return (torch.randn(rows, 2 * inner, generator=gen) * scale).to(dtype)


def run(x):
    from jetspec_kernels import cuda
    with fenced_empty():
        return cuda.silu_mul(x)


@pytest.fixture
def sim(monkeypatch):
    use_sim(monkeypatch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [1, 2, 3, 4, 7, 8, 9, 16, 33, 100, 257, 1024, 3001, 4104])
def test_contiguous(sim, dtype, inner):
    x = inputs(5 if inner >= 1000 else 37, inner, dtype)
    check(run(x), x)


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 37])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows(sim, rows, dtype):
    for inner in (8, 13):  # 16-byte units (fp16 / bf16) and elements
        x = inputs(rows, inner, dtype, seed=1)
        out = run(x)
        assert out.shape == (rows, inner)
        check(out, x)


# (extra columns of x's buffer, x's first element): rows 16 bytes apart with 16-byte aligned
# starts (the vector path where I allows), rows 3 elements off, every row one element in.
LAYOUTS = {"aligned": (8, 0), "stride3": (3, 0), "offset1": (8, 1)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [1, 5, 8, 24, 1000])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strided_rows(sim, dtype, inner, layout):
    """Rows of wider NaN-filled buffers (row stride > 2I): each layout off 16 bytes takes the
    scalar path (a 16-byte access there fails the simulator), the aligned one the vector path."""
    extra, offset = LAYOUTS[layout]
    x = inputs(7, inner, dtype, seed=2)
    xs = wide(x, extra, offset)
    assert xs.stride(0) == 2 * inner + extra
    check(run(xs), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_row_stride_zero(sim, dtype):
    """A row stride of 0 (one row expanded) is read, not refused: rows may overlap in x."""
    x = inputs(1, 64, dtype, seed=3)
    xs = x.expand(6, 128)
    assert xs.stride(0) == 0
    out = run(xs)
    check(out, xs.contiguous())
    assert torch.equal(out, out[:1].expand(6, 64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1e-4, 1e-2, 1.0, 30.0, 1e3])
def test_magnitudes(sim, dtype, scale):
    """Gate and up over magnitudes 1e-4 .. 1e3 (up a tenth of gate's at 1e3 in fp16, whose
    products would overflow: test_float16_overflow has those); at 30 and 1e3 silu(g) is g or
    -0.0 on the negative side (exp(-g) past float32's range from -88.7 on)."""
    x = inputs(9, 520, dtype, scale=scale, seed=4)
    if dtype == torch.float16 and scale == 1e3:
        x[:, 520:] = (x[:, 520:].float() / 10).to(dtype)
    check(run(x), x)


def test_float16_overflow(sim):
    """Products past float16's largest value (65504) are inf, of either sign, as torch's."""
    gen = torch.Generator().manual_seed(5)
    g = torch.rand(4, 256, generator=gen) * 6e4 + 200            # silu(g) = g
    u = (torch.rand(4, 256, generator=gen) * 3 + 0.5) * torch.randn(4, 256, generator=gen).sign()
    x = torch.cat([g, u], 1).to(torch.float16)
    out = run(x)
    check(out, x)
    want = F.silu(x[:, :256]) * x[:, 256:]
    assert out.isinf().sum() > 100 and torch.equal(out.isinf(), want.isinf())
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_specials_as_torch(sim, dtype):
    """NaN, +-inf, +-0, exp overflow (g = -100, -1000: -0.0) and saturated silu (g = 30, 1000),
    each gate against each up: exactly torch's F.silu(g) * u (these silu values are exact, so
    there is one right answer), NaN positions, infinities and zero signs included."""
    nan, inf = float("nan"), float("inf")
    gates = [nan, inf, -inf, 0.0, -0.0, -100.0, -1000.0, 30.0, 1000.0]
    ups = [nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.0, -3.0, 1e3]
    g = torch.tensor(gates).repeat_interleave(len(ups))
    u = torch.tensor(ups).repeat(len(gates))
    inner = g.numel()
    x = torch.cat([g, u]).view(1, 2 * inner).to(dtype).repeat(3, 1)
    out = run(x)
    want = F.silu(x[:, :inner]) * x[:, inner:]
    ok = same(out, want)
    assert ok.all(), (g[~ok[0]].tolist(), u[~ok[0]].tolist(), out[0][~ok[0]], want[0][~ok[0]])
    check(out, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormals_are_not_flushed(sim, dtype):
    """Tiny gates (float32 / bf16 subnormals, fp16 at its smallest) give silu(g) ~ g / 2, not
    0: the build has no flush-to-zero."""
    tiny = torch.finfo(dtype).smallest_normal
    g = torch.tensor([1.0, -1.0, 0.5, 3.0, -0.25, 17.0, 0.75, -6.0]) * tiny * 8
    if dtype != torch.float16:
        g = torch.cat([g, g / 64])
    x = torch.cat([g, torch.ones_like(g)]).view(1, -1).to(dtype)
    out = run(x)
    check(out, x)
    assert (out != 0).sum() >= g.numel() // 2


def large_rows(inner, dtype, unit_elems, span):
    """The fewest rows past 4 MiB of output whose units (unit_elems elements each) leave the last
    CTA (span units a pass) past its first 256 threads' units: a thread's later unit there is the
    one just past out's end."""
    per_row = inner // unit_elems
    rows = -(-(4 << 20) // (inner * torch.finfo(dtype).bits // 8))
    while (rows * per_row) % span < 256:
        rows += 1
    return rows


# (I, x's layout): rows of one 16-byte unit (a thread's next unit 256 rows on), of three, rows of
# 257 units (ending mid-warp), and the scalar path's short (I = 1, 100) and long rows.
LARGE = [(8, "aligned"), (24, "aligned"), (2056, "aligned"), (1, "aligned"), (100, "stride3"),
         (2056, "offset1")]


def large_input(dtype, inner, layout, seed):
    """x past 4 MiB of output for LARGE's (I, layout), and the rows as the kernel reads them."""
    extra, offset = LAYOUTS[layout]
    vec = layout == "aligned" and inner * torch.finfo(dtype).bits % 128 == 0
    unit = 128 // torch.finfo(dtype).bits if vec else 1
    x = inputs(large_rows(inner, dtype, unit, 512 if vec else 1024), inner, dtype, 3.0, seed)
    return x, wide(x, extra, offset)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner,layout", LARGE, ids=[f"{i}-{l}" for i, l in LARGE])
def test_large_calls_take_more_units_a_thread(sim, dtype, inner, layout):
    """Calls of 4 MiB of output or more: each thread loads two 16-byte units (four scalar ones)
    before it computes, the later ones a row or more on where rows are short."""
    x, xs = large_input(dtype, inner, layout, seed=6)
    check(run(xs), x)


def test_qwen3_8b_draft_block_shape(sim):
    """R 16 x I 12288 bf16, the Qwen3-8B draft block (96 CTAs of one 16-byte unit a thread)."""
    x = inputs(16, 12288, torch.bfloat16, seed=7)
    check(run(x), x)


# ---- the launcher called directly on the simulated _C -----------------------------------------

@pytest.fixture
def C():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module()


def launcher_args(x, out, **changes):
    a = dict(x=x.data_ptr(), x_row_stride=x.stride(0), out=out.data_ptr(), rows=x.shape[0],
             inner=x.shape[1] // 2, dtype=2, stream=0)
    a.update(changes)
    return a


def guarded_out(rows, inner, dtype, offset):
    """out [rows, inner] inside a NaN-filled buffer, `offset` elements in, 40 elements after."""
    buf = torch.full((rows * inner + offset + 40,), float("nan"), dtype=dtype)
    return buf, buf[offset:offset + rows * inner].view(rows, inner)


CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


# Small calls in every dtype, out aligned and one element in; large ones (two units a thread on
# the 16-byte path, four on the scalar one) with out aligned, in bf16 and float32.
GUARDED = ([(d, i, "aligned", False) for d in DTYPES for i in (1, 8, 13, 4104)] +
           [(d, i, l, True) for d in (torch.bfloat16, torch.float32)
            for i, l in ((8, "aligned"), (2056, "aligned"), (100, "stride3"))])


@pytest.mark.parametrize("dtype,inner,layout,large", GUARDED,
                         ids=[f"{d}-{i}-{l}-{'large' if g else 'small'}" for d, i, l, g in GUARDED])
def test_launcher_writes_only_out(C, dtype, inner, layout, large):
    """out inside a NaN-guarded buffer: the guards stay untouched (no unit past the last row's
    end, none before the first)."""
    if large:
        x, xs = large_input(dtype, inner, layout, seed=8)
    else:
        x = xs = inputs(3, inner, dtype, seed=8)
    for offset in ((8,) if large else (8, 1)):
        buf, out = guarded_out(x.shape[0], inner, dtype, offset)
        C.silu_mul(**launcher_args(xs, out, dtype=CODES[dtype]))
        check(out, x)
        assert buf[:offset].isnan().all() and buf[offset + out.numel():].isnan().all()


def test_launcher_refuses_before_writing(C):
    """A refused call (tests/test_cuda_errors.py has every refusal's message) writes nothing."""
    x = inputs(4, 16, torch.bfloat16)
    out = torch.zeros(4, 16, dtype=torch.bfloat16)
    for changes in (dict(inner=0), dict(x_row_stride=-32), dict(rows=-1), dict(dtype=7)):
        with pytest.raises(ValueError, match=r"^jetspec_kernels\._C\.silu_mul: " +
                           next(iter(changes))):
            C.silu_mul(**launcher_args(x, out, **changes))
    assert not out.any()


def test_launcher_rows_zero_takes_null_pointers(C):
    C.silu_mul(x=0, x_row_stride=0, out=0, rows=0, inner=16, dtype=2, stream=0)
