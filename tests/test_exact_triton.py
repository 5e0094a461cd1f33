"""The exact mode's Triton GEMM (triton/exact_matmul.py): fixed tiles, no split-K, M not
specialised. Under the interpreter (float32; bf16 tl.dot does not run there) a row is the same
bits in an M-row launch as alone and whatever the other rows hold; on a GPU the same tests run in
bf16 too."""
import pytest
import torch
import torch.nn.functional as F

from helpers import rel_l2

triton = pytest.importorskip("triton")
from jetspec_kernels.triton.exact_matmul import BLOCK_M, exact_linear  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEV == "cuda" else [])


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k,n", [(64, 64), (80, 96), (200, 130)])
def test_rows_are_launch_invariant(dtype, k, n):
    gen = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=gen).to(dtype).to(DEV)
    x = torch.randn(2 * BLOCK_M + 3, k, generator=gen).to(dtype).to(DEV)
    full = exact_linear(x, w)
    other = torch.randn(x.shape, generator=gen).to(dtype).to(DEV)
    for i in (0, 1, BLOCK_M - 1, BLOCK_M, 2 * BLOCK_M + 2):
        alone = exact_linear(x[i:i + 1].clone(), w)
        mixed = other.clone()
        mixed[i] = x[i]
        assert torch.equal(_bits(full[i]), _bits(alone[0])), i
        assert torch.equal(_bits(full[i]), _bits(exact_linear(mixed, w)[i])), i
        mixed5 = exact_linear(mixed[i - min(i, 4):i + 1].clone(), w)      # a 1..5-row launch
        assert torch.equal(_bits(full[i]), _bits(mixed5[-1])), i
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_l2(full.double(), F.linear(x.double(), w.double())) < tol


def test_shapes_and_bad_arguments():
    w = torch.randn(24, 40, device=DEV)
    assert exact_linear(torch.randn(2, 3, 40, device=DEV), w).shape == (2, 3, 24)
    assert exact_linear(torch.randn(0, 40, device=DEV), w).shape == (0, 24)
    with pytest.raises(ValueError, match="weight must be"):
        exact_linear(torch.randn(2, 41, device=DEV), w)
    with pytest.raises(ValueError, match="x must be"):
        exact_linear(torch.randn(2, 40, device=DEV).to(torch.int32), w)
    with pytest.raises(ValueError, match="contiguous"):
        exact_linear(torch.randn(40, 2, device=DEV).T, w)
