"""python_ref log_softmax_topk against a log-softmax and sort written out by hand."""

import math

import numpy as np
import torch

from jetspec_kernels import python_ref as R


def test_log_softmax_topk_against_manual():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 17, generator=g, dtype=torch.float64) * 4
    x[0, 1, 3] = x[0, 1, 9] = x[0, 1, 12] = 50.0   # exact tie at the top -> token order 3, 9, 12
    x[1, 2, :] = 0.0                                 # all tied -> tokens 0..k-1
    k = 5
    tt, tl = R.log_softmax_topk(x, k)
    assert tt.dtype == torch.int32 and tl.dtype == torch.float64
    for b in range(2):
        for d in range(3):
            row = x[b, d].tolist()
            m = max(row)
            lse = m + math.log(sum(math.exp(v - m) for v in row))
            lp = [v - lse for v in row]
            order = sorted(range(17), key=lambda v: (-lp[v], v))[:k]
            assert tt[b, d].tolist() == order
            assert np.allclose(tl[b, d].tolist(), [lp[v] for v in order], rtol=0, atol=1e-12)
    assert tt[0, 1, :3].tolist() == [3, 9, 12]
    assert tt[1, 2].tolist() == [0, 1, 2, 3, 4]


def test_log_softmax_topk_dtypes():
    x = torch.randn(1, 2, 9)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        tt, tl = R.log_softmax_topk(x.to(dt), 3)
        assert tl.dtype == torch.float32
        ref = torch.log_softmax(x.to(dt).double(), -1).sort(-1, descending=True)
        assert torch.allclose(tl.double(), ref.values[..., :3], atol=1e-6)
