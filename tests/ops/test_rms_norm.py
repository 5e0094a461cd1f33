"""rms_norm (the residual add and the models' RMSNorm) against its contract, on every backend.

The check (helpers.assert_rms_norm) is exact up to the one thing the contract leaves open, the
float32 summation order of the sum of squares: each output must lie between the values the
contract's roundings give with the row's rsqrt taken a hair below and above its float64 value. A
wrong rounding (one instead of two), a wrong eps, weight or residual lands outside that window;
the total (x + residual) must be bit-exact.
"""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from helpers import (api_backend, assert_rms_norm, backend_module, backends, fenced_empty,
                     poisoned_empty, skip_on_interpreter, sync, widened)
from kernel_constants import cuda_constant

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _inputs(rows, hidden, dtype, gen, scale=1.0, lead=None):
    shape = (rows, hidden) if lead is None else (*lead, hidden)
    x = (torch.randn(shape, generator=gen) * scale).to(dtype)
    res = (torch.randn(shape, generator=gen) * scale).to(dtype)
    w = (torch.randn(hidden, generator=gen) * 0.5 + 1).to(dtype)
    w[::7] = 0                                               # zero and negative weights
    w[1::5] *= -1
    return x, res, w


def _skip_bf16_interpreter(backend, dtype):
    if dtype == torch.bfloat16:
        skip_on_interpreter(backend, "the interpreter truncates float32 -> bfloat16 casts "
                                     "instead of rounding them")


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add_norm"])
@pytest.mark.parametrize("rows,hidden", [(0, 8), (1, 1), (5, 3), (37, 33), (4, 100), (3, 4096)])
def test_rms_norm_meets_the_contract(backend, dev, dtype, with_residual, rows, hidden):
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(rows * 131 + hidden)
    x, res, w = _inputs(rows, hidden, dtype, gen)
    res = res if with_residual else None
    with poisoned_empty():
        got = jk.rms_norm(x.to(dev), w.to(dev), eps=1e-6,
                          residual=None if res is None else res.to(dev), backend=api_backend(backend))
    sync(dev)
    out, total = got if with_residual else (got, None)
    assert_rms_norm(out, total, x, res, w, 1e-6)


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale,eps", [(1e-3, 1e-6), (1e-3, 1e-2), (300.0, 1e-6)],
                         ids=["small-eps-matters", "large-eps", "large"])
def test_rms_norm_magnitudes_and_eps(backend, dev, dtype, scale, eps):
    """Values far from 1, where eps decides the scale (mean(x^2) near eps) or rounding of the
    sum matters; one row of zeros (rsqrt(eps))."""
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(3)
    x, res, w = _inputs(6, 257, dtype, gen, scale=scale)
    x[2] = 0
    res[2] = 0
    out, total = jk.rms_norm(x.to(dev), w.to(dev), eps=eps, residual=res.to(dev),
                             backend=api_backend(backend))
    sync(dev)
    assert_rms_norm(out, total, x, res, w, eps)
    assert torch.equal(out[2].cpu(), torch.zeros_like(out[2].cpu()))


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
def test_rms_norm_sum_of_squares_overflow(backend, dev, dtype):
    """Values whose squares overflow float32 (bf16 reaches 3e38): the contract's float32 sum is
    inf, so the rsqrt is 0 and the row's outputs are zeros of the weight's sign, as the torch form
    gives; the other rows are unaffected."""
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(8)
    x, res, w = _inputs(4, 300, dtype, gen)
    x[1] *= 1e20
    out, total = jk.rms_norm(x.to(dev), w.to(dev), eps=1e-6, residual=res.to(dev),
                             backend=api_backend(backend))
    sync(dev)
    assert_rms_norm(out, total, x, res, w, 1e-6)
    assert not out[1].cpu().abs().any() and out[0].cpu().abs().any()


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_rms_norm_strided_rows_and_leading_dims(backend, dev, dtype):
    """Rows of wider buffers whose padding is NaN (a read past a row shows), and a 3-D slice whose
    leading dims do not flatten to one row stride (the draft head's ``x[:, 1:]``)."""
    _skip_bf16_interpreter(backend, dtype)
    gen = torch.Generator().manual_seed(4)
    x, res, w = _inputs(9, 40, dtype, gen)
    xd, rd = widened(x.to(dev), 24), widened(res.to(dev), 8)
    assert xd.stride(0) == 64 and rd.stride(0) == 48
    out, total = jk.rms_norm(xd, w.to(dev), eps=1e-6, residual=rd, backend=api_backend(backend))
    sync(dev)
    assert_rms_norm(out, total, x, res, w, 1e-6)

    block, _, _ = _inputs(3 * 5, 40, dtype, gen)
    block = block.view(3, 5, 40).to(dev)
    part = block[:, 1:]                                   # [3, 4, 40], strides (200, 40, 1)
    out = jk.rms_norm(part, w.to(dev), eps=1e-6, backend=api_backend(backend))
    sync(dev)
    assert out.shape == (3, 4, 40)
    assert_rms_norm(out, None, part.cpu(), None, w, 1e-6)


@backends("triton")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add_norm"])
@pytest.mark.parametrize("scale,eps", [(1.0, 1e-6), (1e-3, 1e-6), (1e-3, 1e-2)],
                         ids=["unit", "small-eps-matters", "large-eps"])
def test_triton_two_pass_rows(backend, dev, dtype, with_residual, scale, eps):
    """The long-row kernel (rows read in pieces, the second pass re-reading the total or x), run on
    short rows by lowering the switch: several pieces, a partial last one, strided rows, and
    magnitudes where eps decides the scale."""
    _skip_bf16_interpreter(backend, dtype)
    launch = backend_module("triton", "rms_norm").launch
    gen = torch.Generator().manual_seed(5)
    x, res, w = _inputs(7, 70, dtype, gen, scale=scale)
    xd = widened(x.to(dev), 10)
    rd = res.to(dev) if with_residual else None
    with poisoned_empty():
        out, total = launch(xd, rd, w.to(dev), eps, one_pass_max=16, chunk=16)
    sync(dev)
    assert_rms_norm(out, total, x, res if with_residual else None, w, eps)
    assert (total is None) == (not with_residual)


@backends("reference", "triton", "sim", "cuda")
def test_rms_norm_rows_longer_than_one_pass(backend, dev):
    """A row past Triton's one-pass limit (16384 elements: pieces of 4096) and past the cuda
    kernel's registers, through the public op."""
    gen = torch.Generator().manual_seed(9)
    x, res, w = _inputs(2, 20000, torch.float16, gen)
    out, total = jk.rms_norm(x.to(dev), w.to(dev), eps=1e-6, residual=res.to(dev),
                             backend=api_backend(backend))
    sync(dev)
    assert_rms_norm(out, total, x, res, w, 1e-6)


@backends("triton", "cuda")
@pytest.mark.gpu
def test_rms_norm_offsets_past_int32(backend, dev):
    """Rows beyond element 2^31 of x and the outputs (64-bit offsets): the last rows of a
    [R, 16384] bf16 batch with R * 16384 > 2^31 (4 GiB a tensor), checked against the contract."""
    h = 16384
    r = (1 << 31) // h + 3
    x = torch.zeros(r, h, dtype=torch.bfloat16, device=dev)
    res = torch.zeros_like(x)
    gen = torch.Generator().manual_seed(10)
    tail_x, tail_res, w = _inputs(3, h, torch.bfloat16, gen)
    x[-3:], res[-3:] = tail_x.to(dev), tail_res.to(dev)
    out, total = jk.rms_norm(x, w.to(dev), eps=1e-6, residual=res, backend=backend.name)
    sync(dev)
    assert_rms_norm(out[-3:], total[-3:], tail_x, tail_res, w, 1e-6)
    del x, res, out, total


def test_the_checker_rejects_a_single_rounding():
    """The contract's window is narrow enough to see one rounding in place of two (and a wrong
    eps): the check this file relies on can fail."""
    gen = torch.Generator().manual_seed(6)
    x, _, w = _inputs(8, 512, torch.bfloat16, gen)
    hf = x.float()
    one = (w.float() * hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="outside the contract"):
        assert_rms_norm(one, None, x, None, w, 1e-6)
    small = x * 1e-3
    wrong_eps = ref.rms_norm(small, w, 1e-5, torch.bfloat16)
    with pytest.raises(AssertionError, match="outside the contract"):
        assert_rms_norm(wrong_eps, None, small, None, w, 1e-6)
    assert_rms_norm(ref.rms_norm(small, w, 1e-6, torch.bfloat16), None, small, None, w, 1e-6)


def test_rms_norm_matches_the_layer_it_replaces():
    """On CPU tensors the reference backend is the decoder layer's own norm, bit for bit."""
    gen = torch.Generator().manual_seed(7)
    x, res, w = _inputs(5, 96, torch.bfloat16, gen, lead=(1, 5))
    out, total = jk.rms_norm(x, w, eps=1e-6, residual=res, backend="reference")
    assert torch.equal(total, x + res)
    assert torch.equal(out, ref.rms_norm(x + res, w, 1e-6, torch.bfloat16))
    assert torch.equal(jk.rms_norm(x, w, eps=1e-6, backend="reference"),
                       ref.rms_norm(x, w, 1e-6, torch.bfloat16))


def test_rms_norm_static_checks_are_keyed_on_every_argument():
    """A valid call remembered by its signature does not let the same shapes through with a bad
    eps (eps is part of the key)."""
    x, w = torch.randn(3, 8), torch.ones(8)
    jk.rms_norm(x, w, eps=1e-6)
    with pytest.raises(ValueError, match="eps must be > 0"):
        jk.rms_norm(x, w, eps=0.0)
    with pytest.raises(ValueError, match="eps must be a positive float32"):
        jk.rms_norm(x, w, eps=1e-50)
    import numpy as np
    assert torch.equal(jk.rms_norm(x, w, eps=np.float32(1e-2)), jk.rms_norm(x, w, eps=1e-2))


def test_rms_norm_refuses_inputs_needing_grad():
    x, w = torch.randn(3, 8, requires_grad=True), torch.ones(8)
    with pytest.raises(ValueError, match="rms_norm has no backward"):
        jk.rms_norm(x, w)
    with torch.no_grad():
        jk.rms_norm(x, w)


@pytest.mark.parametrize("call,err,match", [
    (lambda x, w, r: jk.rms_norm(x.int(), w), TypeError, "x must have dtype"),
    (lambda x, w, r: jk.rms_norm(x.double(), w.double()), TypeError, "x must have dtype"),
    (lambda x, w, r: jk.rms_norm(x[0, 0, 0], w), ValueError, "x must have at least one dimension"),
    (lambda x, w, r: jk.rms_norm(x[..., :0], w[:0]), ValueError, "x must have a non-empty last"),
    (lambda x, w, r: jk.rms_norm(x.transpose(0, 2), w), ValueError, "x must be contiguous in its last"),
    (lambda x, w, r: jk.rms_norm(x, w[:-1]), ValueError, r"weight must have shape \[12\]"),
    (lambda x, w, r: jk.rms_norm(x, w[None]), ValueError, r"weight must have shape \[12\]"),
    (lambda x, w, r: jk.rms_norm(x, w.half()), TypeError, "weight must have dtype float32"),
    (lambda x, w, r: jk.rms_norm(x, [1.0] * 12), TypeError, "weight must be a torch.Tensor"),
    (lambda x, w, r: jk.rms_norm(x, w, eps=0.0), ValueError, "eps must be > 0"),
    (lambda x, w, r: jk.rms_norm(x, w, eps=float("nan")), ValueError, "eps must be finite"),
    (lambda x, w, r: jk.rms_norm(x, w, eps=True), TypeError, "eps must be a number"),
    (lambda x, w, r: jk.rms_norm(x, w, eps="1e-6"), TypeError, "eps must be a number"),
    (lambda x, w, r: jk.rms_norm(x, w, eps=10 ** 400), ValueError, "eps must be finite"),
    (lambda x, w, r: jk.rms_norm(x, w, eps=1e39), ValueError, "eps must be a positive float32"),
    (lambda x, w, r: jk.rms_norm(x, w.to("meta")), ValueError, "weight must be on cpu"),
    (lambda x, w, r: jk.rms_norm(x, w, residual=r.to("meta")), ValueError, "residual must be on cpu"),
    (lambda x, w, r: jk.rms_norm(x, w, residual=r[:, :-1]), ValueError, r"residual must have shape \[2, 3, 12\]"),
    (lambda x, w, r: jk.rms_norm(x, w, residual=r.half()), TypeError, "residual must have dtype float32"),
    (lambda x, w, r: jk.rms_norm(x, w, residual=r.transpose(1, 2).contiguous().transpose(1, 2)),
     ValueError, "residual must be contiguous in its last"),
    (lambda x, w, r: jk.rms_norm(x, w, backend="fast"), ValueError, "backend must be one of"),
])
def test_rms_norm_rejects_bad_input(call, err, match):
    x, r = torch.randn(2, 3, 12), torch.randn(2, 3, 12)
    w = torch.ones(12)
    with pytest.raises(err, match=match):
        call(x, w, r)


# ---- the cuda kernel's row split at its boundaries ----------------------------------------------
# rms_norm.cuh: units of 16 bytes where every row allows (else one element); a warp a row (and
# kRmsNormThreads / 32 rows a block) while 32 lanes' registers, rms_norm_items units a lane
# (kRmsNormVecItems, or kRmsNormScalarItems on the scalar path), hold the row, else a block of
# kRmsNormThreads a row, whose units past its registers are read back in a loop.
NORM_THREADS = cuda_constant("rms_norm.cuh", "kRmsNormThreads")
NORM_ITEMS = {True: cuda_constant("rms_norm.cuh", "kRmsNormVecItems"),
              False: cuda_constant("rms_norm.cuh", "kRmsNormScalarItems")}


def _norm_edges(dtype, vec):
    """Hidden sizes at and one unit either side of the warp path's limit, and of a block's
    registers (and one whole pass past them), for ``dtype`` on the 16-byte (``vec``) or scalar
    path; on the scalar path every size is made odd so that the path holds."""
    e = 128 // torch.finfo(dtype).bits if vec else 1
    warp, block = 32 * NORM_ITEMS[vec] * e, NORM_THREADS * NORM_ITEMS[vec] * e
    sizes = [warp - e, warp, warp + e, block - e, block, block + e, block + NORM_THREADS * e + e]
    if not vec:
        sizes = [h | 1 for h in sizes]  # odd: no 16-byte unit fits the rows
    return sorted(set(sizes))


NORM_BOUNDARY = [(d, vec, h) for d, vec in ((torch.bfloat16, True), (torch.float32, True),
                                            (torch.float32, False), (torch.float16, False))
                 for h in _norm_edges(d, vec)]


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype,vec,hidden", NORM_BOUNDARY,
                         ids=[f"{str(d)[6:]}-{'vec' if v else 'scalar'}-H{h}"
                              for d, v, h in NORM_BOUNDARY])
def test_rms_norm_rows_at_the_kernels_edges(backend, dev, dtype, vec, hidden):
    """Each hidden size where the kernel's split changes (a warp's or a block's registers full,
    one unit over), with the residual add (total) and without, in outputs fenced against writes
    past their end; the warp path's rows not a multiple of its rows a block (1, 7, 9)."""
    gen = torch.Generator().manual_seed(hidden)
    rows_per_block = NORM_THREADS // 32
    warp = hidden <= 32 * NORM_ITEMS[vec] * (128 // torch.finfo(dtype).bits if vec else 1)
    for rows in ((1, rows_per_block - 1, rows_per_block + 1) if warp else (1, 3)):
        x, res, w = _inputs(rows, hidden, dtype, gen)
        for r in (None, res):
            with fenced_empty():
                got = jk.rms_norm(x.to(dev), w.to(dev), eps=1e-6,
                                  residual=None if r is None else r.to(dev),
                                  backend=api_backend(backend))
            sync(dev)
            out, total = got if r is not None else (got, None)
            assert_rms_norm(out, total, x, r, w, 1e-6)
