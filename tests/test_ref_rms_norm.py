"""python_ref rms_norm against numpy float64 brute force, and its Hugging Face form against
transformers' Qwen3RMSNorm bit for bit."""

import math

import numpy as np
import pytest
import torch

import jetspec_kernels as jk

from jetspec_kernels import python_ref as R
from helpers import np_rms_norm


def test_rms_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64)
    w = torch.randn(16, generator=g, dtype=torch.float64)
    y = R.rms_norm(x, w, 1e-5)
    assert y.dtype == torch.float64
    assert np.allclose(y.numpy(), np_rms_norm(x.numpy(), w.numpy(), 1e-5), rtol=1e-13, atol=1e-13)
    y32 = R.rms_norm(x.to(torch.bfloat16), w.to(torch.bfloat16), 1e-5)
    assert y32.dtype == torch.float32
    # eps matters for tiny inputs
    z = torch.full((1, 4), 1e-4, dtype=torch.float64)
    assert abs(R.rms_norm(z, torch.ones(4, dtype=torch.float64), 1e-6)[0, 0].item()
               - 1e-4 / math.sqrt(1e-8 + 1e-6)) < 1e-12


@pytest.mark.parametrize("scale", [1e-4, 1e-3, 1.0, 1e3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden,strided", [(64, False), (4096, True)])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_rms_norm_hugging_face_form(scale, dtype, hidden, strided, device):
    """rms_norm(dtype=...) is transformers' Qwen3RMSNorm bit for bit (normalised in fp32, cast to
    the model dtype, then times the weight), at activation scales where eps matters too, on rows
    of a wider buffer too; so is the reference backend's rms_norm (what the models run as torch
    ops), whose product and cast are one launch, a multiply into an output of the model dtype:
    on a GPU the same bits only if the kernel rounds as it stores (the GPU case), with the
    residual add in front too."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 7, hidden + 24 if strided else hidden, generator=g) * scale).to(dtype)
    x = x.to(device)[..., :hidden]                      # strided: rows of a wider buffer
    norm = Qwen3RMSNorm(hidden, eps=1e-6).to(dtype).to(device)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=g) + 0.5)
        want = norm(x)
    w = norm.weight.detach()
    got = R.rms_norm(x, w, 1e-6, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    got = jk.rms_norm(x, w, eps=1e-6, backend="reference")
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    half = (x * 0.5).to(dtype)
    out, total = jk.rms_norm(half, w, eps=1e-6, residual=x - half, backend="reference")
    assert torch.equal(total, half + (x - half))
    with torch.no_grad():
        assert torch.equal(out, norm(total))
