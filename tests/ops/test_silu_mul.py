"""silu_mul (SwiGLU's activation) against its contract, on every backend, and its refusals.

The check (helpers.assert_silu_mul) is exact up to what the contract leaves open, the float32
exp and division of the silu (within relative 2e-6 before the rounding to x's dtype): a missing
rounding, a wrong column for up, a tail left unwritten land outside it. Outputs are fenced
(helpers.fenced_empty): a write past an output's end fails.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from helpers import (api_backend, assert_silu_mul, backends, fenced_empty, same,
                     skip_on_interpreter, sync, widened)
from kernel_constants import cuda_constant

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _skip_bf16_interpreter(backend, dtype):
    if dtype == torch.bfloat16:
        skip_on_interpreter(backend, "the interpreter truncates float32 -> bfloat16 casts "
                                     "instead of rounding them")


def _call(x, backend, dev):
    """The public op on ``x`` on ``dev``, its output NaN-poisoned and fenced."""
    with fenced_empty():
        out = jk.silu_mul(x.to(dev) if x.device.type != dev else x, backend=api_backend(backend))
    sync(dev)
    return out


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,inner", [(0, 8), (1, 1), (5, 3), (37, 33), (4, 100), (3, 1500)])
def test_silu_mul_meets_the_contract(backend, dev, dtype, rows, inner):
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(rows * 131 + inner)
    x = (torch.randn(rows, 2 * inner, generator=gen) * 3).to(dtype)
    out = _call(x, backend, dev)
    assert_silu_mul(out.cpu(), x)


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1e-4, 1.0, 30.0, 1e3])
def test_silu_mul_magnitudes_and_specials(backend, dev, dtype, scale):
    """Values far from 1 (fp16 products past its max become inf, as torch's), and the specials:
    +-inf, NaN, +-0 and gates whose float32 exp(-g) overflows, in both halves."""
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(int(scale * 10))
    x = torch.randn(6, 2 * 40, generator=gen) * scale
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, -100.0, 90.0,
                             -88.5, 1e-30])
    x[0, :9] = specials
    x[1, 40:49] = specials
    x = x.to(dtype)
    out = _call(x, backend, dev)
    assert_silu_mul(out.cpu(), x)


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_silu_mul_strided_and_leading_dims(backend, dev, dtype):
    """Rows with a stride wider than 2I (NaN between them: a read past a row shows), leading dims
    that do not flatten to one row stride, and a row slice starting one element in."""
    gen = torch.Generator().manual_seed(5)
    base = (torch.randn(3, 4, 2 * 21, generator=gen) * 2).to(dtype)
    wide = widened(base, 9)[..., :2 * 21]
    assert wide.stride(-2) == 2 * 21 + 9
    out = _call(wide, backend, dev)
    assert out.shape == (3, 4, 21) and out.is_contiguous()
    assert_silu_mul(out.cpu().reshape(-1, 21), base.reshape(-1, 2 * 21))
    holey = base.transpose(0, 1)                            # [4, 3, 42]: no single row stride
    out = _call(holey, backend, dev)
    assert_silu_mul(out.cpu().reshape(-1, 21), holey.reshape(-1, 2 * 21))
    shifted = torch.randn(5, 2 * 8 + 1, generator=gen).to(dtype)[:, 1:]
    assert_silu_mul(_call(shifted, backend, dev).cpu(), shifted)


def test_reference_is_the_models_torch_form():
    """The reference backend is bit for bit ``F.silu(gate) * up`` in x's dtype (what the models
    ran), and python_ref's float64 form is the exact silu times up."""
    gen = torch.Generator().manual_seed(9)
    for dtype in DTYPES:
        x = (torch.randn(7, 2 * 45, generator=gen) * 4).to(dtype)
        want = F.silu(x[:, :45]) * x[:, 45:]
        assert same(jk.silu_mul(x, backend="reference"), want).all()
    x = torch.randn(3, 10, dtype=torch.float64, generator=gen)
    g, u = x[:, :5], x[:, 5:]
    assert torch.allclose(ref.silu_mul(x), g * torch.sigmoid(g) * u, rtol=1e-14, atol=0)


def test_the_fence_fails_a_write_past_an_output_s_end():
    """fenced_empty (the outputs above): a write at an output's last element passes, one just
    past it fails; what is left unwritten stays NaN."""
    with fenced_empty():
        out = torch.empty(3, 5, dtype=torch.bfloat16)
        out[-1, -1] = 1.0
    assert out.isnan().sum() == 14
    with pytest.raises(AssertionError, match="past an output's end"):
        with fenced_empty():
            out = torch.empty(3, 5)
            out.as_strided((1,), (1,), out.numel()).fill_(1.0)


def test_the_checker_rejects_tl_exp_on_very_negative_gates():
    """Triton's ``tl.exp(-g)`` is exp2 of the float32 product ``-g * log2(e)``, whose rounding
    (half an ulp of a number up to 128) puts exp(-g) up to about 4e-6 off relatively for gates in
    [-88, -44], past the window's 2e-6 (hence triton/silu_mul.py's range-reduced exp): the check
    fails on that form and passes the same gates with the exact exp, and torch's form."""
    gen = torch.Generator().manual_seed(6)
    g = -30 - 58 * torch.rand(4, 64, generator=gen)       # float32 exp(-g) still finite
    u = torch.randn(4, 64, generator=gen)
    x = torch.cat([g, u], -1)
    t = -g * torch.tensor(math.log2(math.e))              # rounded to float32, as tl.exp does
    with pytest.raises(AssertionError):
        assert_silu_mul((g.double() / (1 + torch.exp2(t.double()))).float() * u, x)
    assert_silu_mul((g.double() / (1 + torch.exp(-g.double()))).float() * u, x)
    assert_silu_mul(F.silu(g) * u, x)


def test_the_checker_rejects_a_missing_rounding_a_shifted_up_and_a_zero_sign():
    """The window is narrow enough to see one rounding in place of two (silu times up rounded
    once), the up columns read one place off, and a +0.0 where the torch form gives -0.0: the
    check the backends' tests rely on can fail on each; the contract's form written out passes."""
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(8, 1024, generator=gen) * 3).to(torch.bfloat16)
    g, u = x[:, :512].float(), x[:, 512:].float()
    with pytest.raises(AssertionError):
        assert_silu_mul((g / (1 + torch.exp(-g)) * u).to(torch.bfloat16), x)
    shifted = torch.cat([x[:, :512], x[:, 513:], x[:, 512:513]], -1)
    with pytest.raises(AssertionError):
        assert_silu_mul(ref.silu_mul(shifted, torch.bfloat16), x)
    zeros = torch.tensor([[1.0, -3.0, 0.0, 0.0]], dtype=torch.float16)  # silu(-3) * +0 = -0.0
    assert ref.silu_mul(zeros, torch.float16)[0, 1].signbit()
    with pytest.raises(AssertionError):
        assert_silu_mul(ref.silu_mul(zeros, torch.float16).abs(), zeros)
    s_ = (g / (1 + torch.exp(-g))).to(torch.bfloat16)                   # the contract's form
    assert_silu_mul((s_.float() * u).to(torch.bfloat16), x)


@pytest.mark.parametrize("make,error,match", [
    (lambda: torch.randn(4, 7), ValueError, "x must have an even last dimension"),
    (lambda: torch.randn(4, 0), ValueError, "x must have an even last dimension"),
    (lambda: torch.randn(()), ValueError, "x must have an even last dimension"),
    (lambda: torch.randn(8, 4).t(), ValueError, "x must be contiguous in its last dimension"),
    (lambda: torch.randint(0, 5, (4, 8)), TypeError, "x must have dtype"),
    (lambda: "not a tensor", TypeError, "x must be a torch.Tensor"),
])
def test_silu_mul_refuses_bad_x(make, error, match):
    with pytest.raises(error, match=match):
        jk.silu_mul(make())


def test_silu_mul_refuses_grad():
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(ValueError, match="no backward"):
        jk.silu_mul(x)
    with torch.no_grad():
        assert jk.silu_mul(x).shape == (2, 4)


# ---- the cuda kernel's flat split at its boundaries ---------------------------------------------
# silu_mul.cuh deals the R * I outputs in units (16 bytes where every row allows, else one
# element) to kSiluMulThreads threads a block, consecutive threads on consecutive units; from
# kSiluMulSmallBytes of output on, each thread takes kSiluMulVecItems (16-byte) or
# kSiluMulScalarItems (scalar) units, each kSiluMulThreads units after the last: dr rows and dc
# units on, carried into the next row when the column reaches the row's n units.
SILU_THREADS = cuda_constant("silu_mul.cuh", "kSiluMulThreads")
SILU_ITEMS = {True: cuda_constant("silu_mul.cuh", "kSiluMulVecItems"),
              False: cuda_constant("silu_mul.cuh", "kSiluMulScalarItems")}
SILU_SMALL_BYTES = cuda_constant("silu_mul.cuh", "kSiluMulSmallBytes")


def _silu_units(dtype, inner):
    """(16-byte path?, elements a unit) of a contiguous x [R, 2I]: 16-byte units iff I fills them."""
    per16 = 128 // torch.finfo(dtype).bits
    return (True, per16) if inner % per16 == 0 else (False, 1)


def _silu_large_rows(dtype, inner, rows=None):
    """``rows``, or the fewest rows of output past kSiluMulSmallBytes whose units leave the last
    block's pass with some threads holding a later unit and some not (the `< total` masks), where
    some number of rows does (not where a row's units are a multiple of a block's)."""
    if rows is not None:
        return rows
    vec, elems = _silu_units(dtype, inner)
    n, span = inner // elems, SILU_THREADS * SILU_ITEMS[vec]
    least = -(-SILU_SMALL_BYTES // (inner * torch.finfo(dtype).bits // 8))
    return next((r for r in range(least, least + span) if SILU_THREADS < (r * n) % span), least)


def _silu_carry_ends_on_a_row(n, total):
    """Whether some thread's next unit is exactly one past a row's last column (col + dc == n, the
    carry's equality case) with both units inside out."""
    dc = SILU_THREADS % n
    return dc > 0 and total - SILU_THREADS > n - dc


# (dtype, I, rows or None for the fewest past the switch): units per row n and how a thread's next
# unit lands: n 1 (256 rows on, no carry), n 3 (dc 1: a carry exactly at each row's end), n 255
# (one row and one unit on), n 257 (a row longer than a block's pass: dc 256), n 256 (exactly one
# row on); rows not a multiple of the 16-byte unit (scalar: I 13 in float32, 100 in float16); one
# row of 262147 units.
SILU_BOUNDARY = [(torch.bfloat16, 8, None), (torch.bfloat16, 24, None),
                 (torch.bfloat16, 255 * 8, None), (torch.bfloat16, 257 * 8, None),
                 (torch.float32, 256 * 4, None), (torch.float32, 13, None),
                 (torch.float16, 100, None),
                 (torch.bfloat16, SILU_SMALL_BYTES // 2 + 3 * 8, 1)]


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype,inner,rows", SILU_BOUNDARY,
                         ids=[f"{str(d)[6:]}-I{i}-R{r or 'min'}" for d, i, r in SILU_BOUNDARY])
def test_silu_mul_units_carried_across_row_ends(backend, dev, dtype, inner, rows):
    """Calls past the small-call switch (several units a thread): every output against the
    contract, where a thread's later unit is a row or more on, ends exactly on a row's last column,
    or lies past out's end."""
    vec, elems = _silu_units(dtype, inner)
    rows = _silu_large_rows(dtype, inner, rows)
    n = inner // elems
    assert rows * inner * torch.finfo(dtype).bits // 8 >= SILU_SMALL_BYTES
    if SILU_THREADS % n and rows > 1:  # (one row has no next row to carry into)
        assert _silu_carry_ends_on_a_row(n, rows * n)
    gen = torch.Generator().manual_seed(inner)
    x = (torch.randn(rows, 2 * inner, generator=gen) * 3).to(dtype)
    assert_silu_mul(_call(x, backend, dev).cpu(), x)


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("inner", [1, 7, 8, 9, 255, 256, 257, 1023, 1024, 1025, 2049])
def test_silu_mul_small_calls_at_unit_and_block_edges(backend, dev, inner):
    """Below the switch: one unit a thread, I at and one either side of the 16-byte unit (8
    fp16 elements), a block's threads' units (256), and the Triton kernel's column block (1024);
    one row, a few, and one more than a block's threads (Triton's interpreter: a few only)."""
    gen = torch.Generator().manual_seed(inner)
    for rows in (1, 3) if backend.name == "triton" else (1, 3, SILU_THREADS + 1):  # interpreter
        x = (torch.randn(rows, 2 * inner, generator=gen) * 3).to(torch.float16)
        assert_silu_mul(_call(x, backend, dev).cpu(), x)
