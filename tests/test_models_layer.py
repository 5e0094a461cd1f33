"""The models' decoder layer (models/layer.py) against python_ref's plain layer: the same bits
wherever their arithmetic is the same, so the production knobs cannot drift from the spec."""
import pytest
import torch

import jetspec_kernels.python_ref as ref
from jetspec_kernels.models.layer import decoder_layer
from jetspec_kernels.models.projections import fuse_projections
from jetspec_kernels.models.tiny import random_qwen3_weights, tiny_qwen3_config
from helpers import rel_l2


def _setup(dtype, seed=3, n=6):
    cfg = tiny_qwen3_config(num_hidden_layers=1)
    w = {k.removeprefix("model.layers.0."): v.to(dtype)
         for k, v in random_qwen3_weights(cfg, seed=seed).items() if k.startswith("model.layers.0.")}
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(2, n, cfg.hidden_size, generator=g) * 3).to(dtype)
    pos = torch.arange(n)

    def attend(q, k, v, lw):
        q, k = ref.qk_norm_rope(q, k, lw, cfg.rms_norm_eps, pos, pos, cfg.rope_theta)
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.to(q.dtype).repeat_interleave(rep, 2)
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) / q.shape[-1] ** 0.5
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        p = s.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("bhnm,bmhd->bnhd", p, v).to(dtype)
    return cfg, w, x, attend


DTYPES = [(torch.float32, None), (torch.bfloat16, torch.bfloat16)]


@pytest.mark.parametrize("dtype,form", DTYPES, ids=["fp32-ref-norm", "bf16-hf-norm"])
def test_plain_call_is_the_spec_bit_for_bit(dtype, form):
    cfg, w, x, attend = _setup(dtype)
    want = ref.decoder_layer(x, w, attend, cfg.rms_norm_eps, dtype=form)
    got = decoder_layer(x, w, attend, cfg.rms_norm_eps, dtype=form)
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype,form", DTYPES, ids=["fp32-ref-norm", "bf16-hf-norm"])
def test_residual_and_deferred_add_are_the_spec_bit_for_bit(dtype, form):
    """The stream arriving as two addends (``residual``) and leaving as two (``defer_add``):
    their sums are the spec's layer on the summed input, bit for bit."""
    cfg, w, x, attend = _setup(dtype)
    part = (torch.randn(x.shape, generator=torch.Generator().manual_seed(9)) * 5).to(dtype)
    want = ref.decoder_layer(x + part, w, attend, cfg.rms_norm_eps, dtype=form)
    out, h = decoder_layer(x, w, attend, cfg.rms_norm_eps, dtype=form, residual=part, defer_add=True)
    assert torch.equal(h + out, want)
    assert not torch.equal(h, want)                 # the add really was deferred


def test_reduce_applies_to_both_partial_sums():
    """``reduce`` runs on the o_proj output and on the MLP output: doubling there equals the
    spec's layer with o_proj and down_proj doubled (exact in binary floating point)."""
    cfg, w, x, attend = _setup(torch.float32)
    calls = []

    def reduce(t):
        calls.append(t.shape)
        return t * 2
    doubled = dict(w, **{k: w[k] * 2 for k in ("self_attn.o_proj.weight", "mlp.down_proj.weight")})
    want = ref.decoder_layer(x, doubled, attend, cfg.rms_norm_eps)
    got = decoder_layer(x, w, attend, cfg.rms_norm_eps, reduce=reduce)
    assert len(calls) == 2 and torch.equal(got, want)


def test_norm_is_the_callers():
    """A ``norm`` passed in replaces both of the layer's norms (the models' fused kernel)."""
    cfg, w, x, attend = _setup(torch.float32)
    seen = []

    def norm(t, weight, residual):
        seen.append(residual is None)
        total = t if residual is None else t + residual
        return ref.rms_norm(total, weight, cfg.rms_norm_eps), total
    want = ref.decoder_layer(x, w, attend, cfg.rms_norm_eps)
    got = decoder_layer(x, w, attend, 123.0, norm=norm)   # eps comes from the caller's norm
    assert seen == [True, False] and torch.equal(got, want)


def test_stacked_projections_match_the_separate_ones():
    """The one q/k/v GEMM (and the gate/up GEMM) of the models against the spec's separate
    projections: the same values up to the GEMMs' summation order."""
    cfg, w, x, attend = _setup(torch.float32)
    _, run = fuse_projections(w)
    assert "self_attn.qkv_proj.weight" in run
    want = ref.decoder_layer(x, w, attend, cfg.rms_norm_eps)
    assert rel_l2(decoder_layer(x, run, attend, cfg.rms_norm_eps), want) < 1e-6
