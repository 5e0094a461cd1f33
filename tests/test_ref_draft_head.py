"""python_ref.draft_head_forward against a row-by-row numpy float64 implementation, plus the
default target-layer rule."""

import copy
import math

import numpy as np
import pytest
import torch

from jetspec_kernels import python_ref as R


def make_cfg(causal=True, head_dim=8, block_size=4):
    cfg = dict(hidden_size=12, num_attention_heads=3, num_key_value_heads=1, head_dim=head_dim,
               rms_norm_eps=1e-6, rope_theta=10000.0, num_hidden_layers=2, intermediate_size=10,
               block_size=block_size, num_target_layers=8,
               dflash_config=dict(causal_head=causal, mask_token_id=19, target_layer_ids=[1, 5]))
    if head_dim is None:
        del cfg["head_dim"]
    return cfg


def make_weights(cfg, n_taps=2, Ht=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    H = cfg["hidden_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    Dh = cfg.get("head_dim") or H // nq
    I = cfg["intermediate_size"]

    def r(*s, scale=0.3):
        return torch.randn(*s, generator=g, dtype=torch.float64) * scale

    def n(d):
        return 1.0 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)

    W = {"fc.weight": r(H, n_taps * Ht), "hidden_norm.weight": n(H), "norm.weight": n(H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        W[p + "input_layernorm.weight"] = n(H)
        W[p + "post_attention_layernorm.weight"] = n(H)
        W[p + "self_attn.q_proj.weight"] = r(nq * Dh, H)
        W[p + "self_attn.k_proj.weight"] = r(nkv * Dh, H)
        W[p + "self_attn.v_proj.weight"] = r(nkv * Dh, H)
        W[p + "self_attn.o_proj.weight"] = r(H, nq * Dh)
        W[p + "self_attn.q_norm.weight"] = n(Dh)
        W[p + "self_attn.k_norm.weight"] = n(Dh)
        W[p + "mlp.gate_proj.weight"] = r(I, H)
        W[p + "mlp.up_proj.weight"] = r(I, H)
        W[p + "mlp.down_proj.weight"] = r(H, I)
    return W


# ----------------------------------------------------------------------------- numpy brute force
def rms(x, w, eps):
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def rope(x, pos, theta):
    Dh = x.shape[0]
    h = Dh // 2
    inv = np.array([theta ** (-2.0 * i / Dh) for i in range(h)]).astype(np.float32)
    ang = (np.float32(pos) * inv).astype(np.float64)
    z = (x[:h] + 1j * x[h:]) * np.exp(1j * ang)
    return np.concatenate([z.real, z.imag])


def silu(x):
    return x / (1.0 + np.exp(-x))


def np_forward(W, cfg, th, anchors, E, LM):
    W = {k: v.numpy() for k, v in W.items()}
    th, E, LM = th.numpy(), E.numpy(), LM.numpy()
    H = cfg["hidden_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    Dh = cfg.get("head_dim") or H // nq
    eps, theta, S = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["block_size"]
    causal = cfg["dflash_config"]["causal_head"]
    mask_id = cfg["dflash_config"]["mask_token_id"]
    B, T, _ = th.shape
    out = np.zeros((B, S - 1, LM.shape[0]))
    for b in range(B):
        ctx = [rms(W["fc.weight"] @ th[b, t], W["hidden_norm.weight"], eps) for t in range(T)]
        toks = [int(anchors[b])] + [mask_id] * (S - 1)
        h = [E[t].copy() for t in toks]
        for li in range(cfg["num_hidden_layers"]):
            p = f"layers.{li}.self_attn."
            x = [rms(h[s], W[f"layers.{li}.input_layernorm.weight"], eps) for s in range(S)]
            kin = ctx + x
            K = [[rope(rms((W[p + "k_proj.weight"] @ kin[j])[hk * Dh:(hk + 1) * Dh], W[p + "k_norm.weight"], eps), j, theta)
                  for hk in range(nkv)] for j in range(T + S)]
            V = [[(W[p + "v_proj.weight"] @ kin[j])[hk * Dh:(hk + 1) * Dh] for hk in range(nkv)] for j in range(T + S)]
            new_h = []
            for s in range(S):
                heads = []
                for hq in range(nq):
                    hk = hq // (nq // nkv)
                    qv = rope(rms((W[p + "q_proj.weight"] @ x[s])[hq * Dh:(hq + 1) * Dh], W[p + "q_norm.weight"], eps), T + s, theta)
                    vis = [j for j in range(T + S) if j < T or not causal or j - T <= s]
                    sc = [float(qv @ K[j][hk]) / math.sqrt(Dh) for j in vis]
                    m = max(sc)
                    w = [math.exp(c - m) for c in sc]
                    z = sum(w)
                    heads.append(sum(wi / z * V[j][hk] for wi, j in zip(w, vis)))
                a = h[s] + W[p + "o_proj.weight"] @ np.concatenate(heads)
                x2 = rms(a, W[f"layers.{li}.post_attention_layernorm.weight"], eps)
                mlp = W[f"layers.{li}.mlp.down_proj.weight"] @ (
                    silu(W[f"layers.{li}.mlp.gate_proj.weight"] @ x2) * (W[f"layers.{li}.mlp.up_proj.weight"] @ x2))
                new_h.append(a + mlp)
            h = new_h
        for s in range(1, S):
            out[b, s - 1] = LM @ rms(h[s], W["norm.weight"], eps)
    return out


def inputs(cfg, seed=1, T=3, B=2, V=20):
    g = torch.Generator().manual_seed(seed)
    H = cfg["hidden_size"]
    th = torch.randn(B, T, 24, generator=g, dtype=torch.float64)
    anchors = torch.tensor([3, 11][:B], dtype=torch.int32)
    E = torch.randn(V, H, generator=g, dtype=torch.float64)
    LM = torch.randn(V, H, generator=g, dtype=torch.float64)
    return th, anchors, E, LM


@pytest.mark.parametrize("causal", [True, False])
def test_draft_head_vs_numpy(causal):
    cfg = make_cfg(causal)
    W = make_weights(cfg)
    th, anchors, E, LM = inputs(cfg)
    got = R.draft_head_forward(W, cfg, th, anchors, E, LM)
    assert got.shape == (2, 3, 20) and got.dtype == torch.float64
    ref = np_forward(W, cfg, th, anchors, E, LM)
    assert np.abs(got.numpy() - ref).max() < 1e-9 * max(1.0, np.abs(ref).max())


def test_draft_head_default_head_dim_and_float32():
    cfg = make_cfg(True, head_dim=None)          # head_dim = 12 // 3 = 4
    W = make_weights(cfg, seed=2)
    th, anchors, E, LM = inputs(cfg, seed=3)
    ref = np_forward(W, cfg, th, anchors, E, LM)
    got64 = R.draft_head_forward(W, cfg, th, anchors, E, LM)
    assert np.abs(got64.numpy() - ref).max() < 1e-9 * max(1.0, np.abs(ref).max())
    got32 = R.draft_head_forward({k: v.float() for k, v in W.items()}, cfg, th.float(), anchors,
                                 E.float(), LM.float())
    assert got32.dtype == torch.float32
    assert np.linalg.norm(got32.double().numpy() - ref) / np.linalg.norm(ref) < 1e-5


def test_causal_head_is_prefix_consistent():
    # Block-causal: block row s sees only rows <= s, so a longer block leaves earlier logits
    # unchanged. The full (DFlash) block does not have this property.
    for causal, same in ((True, True), (False, False)):
        c4 = make_cfg(causal, block_size=4)
        c6 = make_cfg(causal, block_size=6)
        W = make_weights(c4, seed=5)
        th, anchors, E, LM = inputs(c4, seed=6)
        a = R.draft_head_forward(W, c4, th, anchors, E, LM)
        b = R.draft_head_forward(W, c6, th, anchors, E, LM)
        assert b.shape == (2, 5, 20)
        assert torch.allclose(a, b[:, :3], rtol=1e-12, atol=1e-12) == same


def test_draft_head_depends_on_anchor_and_context():
    cfg = make_cfg(True)
    W = make_weights(cfg, seed=7)
    th, anchors, E, LM = inputs(cfg, seed=8)
    base = R.draft_head_forward(W, cfg, th, anchors, E, LM)
    th2 = th.clone()
    th2[0, 0] += 1.0
    other = R.draft_head_forward(W, cfg, th2, anchors, E, LM)
    assert not torch.allclose(base[0], other[0]) and torch.equal(base[1], other[1])
    other = R.draft_head_forward(W, cfg, th, torch.tensor([4, 11], dtype=torch.int32), E, LM)
    assert not torch.allclose(base[0], other[0]) and torch.equal(base[1], other[1])


def test_target_layer_ids_default_rule():
    assert R.target_layer_ids(36, 1) == [18]
    assert R.target_layer_ids(28, 1) == [14]
    assert R.target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert R.target_layer_ids(36, 4) == [1, 12, 22, 33]      # 1 + 32/3 * i, rounded
    assert R.target_layer_ids(28, 3) == [1, 13, 25]
    assert R.target_layer_ids(40, 2) == [1, 37]
    # L=9 -> range [1, 6], span 5; 4 layers -> 1, 2.667, 4.333, 6
    assert R.target_layer_ids(9, 4) == [1, 3, 4, 6]
    # a half case: L=8 -> [1, 5], span 4, 9 layers -> steps of 0.5; Python round() is half-to-even: 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, 4.5 -> 4
    assert R.target_layer_ids(8, 9) == [1, 2, 2, 2, 3, 4, 4, 4, 5]
    with pytest.raises(ValueError):
        R.target_layer_ids(36, 0)


def test_omitted_fields_take_the_documented_defaults():
    """A config without rms_norm_eps, rope_theta or causal_head runs with 1e-6, 1e6 and True."""
    full = dict(make_cfg(True), rms_norm_eps=1e-6, rope_theta=1e6)
    bare = copy.deepcopy(full)
    del bare["rms_norm_eps"], bare["rope_theta"], bare["dflash_config"]["causal_head"]
    W = make_weights(full, seed=7)
    th, anchors, E, LM = inputs(full, seed=8)
    want = R.draft_head_forward(W, full, th, anchors, E, LM)
    assert torch.equal(R.draft_head_forward(W, bare, th, anchors, E, LM), want)
    other = R.draft_head_forward(W, dict(full, rope_theta=1e4), th, anchors, E, LM)
    assert not torch.allclose(other, want)                  # the default theta is seen
