"""Differentiable training forwards of the Qwen3 target and the draft head, on checkpoint-keyed
weight dicts (the same keys and numerics as :mod:`jetspec_kernels.models`, so trained weights load
there unchanged).

The target forward is causal over whole windows. The draft-head forward runs many blocks of one
window at once: block ``i`` anchored at position ``p_i`` is ``[x[p_i], MASK, ...]`` at RoPE positions
``p_i .. p_i + S - 1``, sees the context rows ``0 .. p_i - 1`` (the taps of the tokens before its
anchor, at positions ``0 .. p_i - 1``) and its own block (causally, or fully for DFlash), never
another block: exactly what :meth:`DraftHead.draft_hidden` computes with ``ctx_len = p_i``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..python_ref.rope import rope_cos_sin

from ..models.config import DraftConfig, Qwen3Config
from ..models.qwen3 import LAYER_KEYS, layer_shapes

__all__ = ["init_target_weights", "init_head_weights", "target_forward", "head_forward"]


def _init_layer(cfg: Qwen3Config, gen: torch.Generator, prefix: str, n_layers: int) -> dict:
    out = {}
    for key, shape in layer_shapes(cfg).items():
        if len(shape) == 1:
            out[prefix + key] = torch.ones(shape)
        else:
            std = 0.02
            if key in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                std /= math.sqrt(2 * n_layers)        # GPT-2 style residual scaling
            out[prefix + key] = torch.randn(shape, generator=gen) * std
    return out


def init_target_weights(cfg: Qwen3Config, seed: int) -> dict[str, torch.Tensor]:
    """Freshly initialised Hugging Face-keyed Qwen3 weights (float32; tied embeddings honoured)."""
    gen = torch.Generator().manual_seed(seed)
    w = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.02,
         "model.norm.weight": torch.ones(cfg.hidden_size)}
    for i in range(cfg.num_hidden_layers):
        w.update(_init_layer(cfg, gen, f"model.layers.{i}.", cfg.num_hidden_layers))
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.02
    return w


def init_head_weights(cfg: DraftConfig, seed: int) -> dict[str, torch.Tensor]:
    """Freshly initialised draft-head weights in the JetSpec checkpoint keys (float32)."""
    gen = torch.Generator().manual_seed(seed)
    width = len(cfg.target_layer_ids) * cfg.target_hidden_size
    w = {"fc.weight": torch.randn(cfg.hidden_size, width, generator=gen) / math.sqrt(width),
         "hidden_norm.weight": torch.ones(cfg.hidden_size), "norm.weight": torch.ones(cfg.hidden_size)}
    for i in range(cfg.num_hidden_layers):
        w.update(_init_layer(cfg, gen, f"layers.{i}.", cfg.num_hidden_layers))
    return w


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, cos, sin):
    """x [B, T, Hh, Dh]; cos/sin [B, T, Dh/2] (rotate-half form)."""
    h = x.shape[-1] // 2
    c, s = cos[:, :, None], sin[:, :, None]
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _qkv(w, p, cfg, x_q, x_kv, cs_q, cs_kv):
    """Normed, roped q [B, Hq, Tq, Dh] from x_q and k, v [B, Hkv, Tk, Dh] from x_kv."""
    b, tq, _ = x_q.shape
    tk = x_kv.shape[1]
    nq, nkv, dh, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    q = F.linear(x_q, w[p + "self_attn.q_proj.weight"]).view(b, tq, nq, dh)
    k = F.linear(x_kv, w[p + "self_attn.k_proj.weight"]).view(b, tk, nkv, dh)
    v = F.linear(x_kv, w[p + "self_attn.v_proj.weight"]).view(b, tk, nkv, dh)
    q = _rope(_rms(q, w[p + "self_attn.q_norm.weight"], eps), *cs_q)
    k = _rope(_rms(k, w[p + "self_attn.k_norm.weight"], eps), *cs_kv)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _mlp(w, p, x, eps):
    a = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
    return F.linear(F.silu(F.linear(a, w[p + "mlp.gate_proj.weight"])) * F.linear(a, w[p + "mlp.up_proj.weight"]),
                    w[p + "mlp.down_proj.weight"])


def target_forward(w: dict, cfg: Qwen3Config, tokens: torch.Tensor, taps=()):
    """Causal forward of the target over whole windows.

    Parameters
    ----------
    w : Hugging Face-keyed weights (float32)
    tokens : int64 [B, T]
    taps : layer ids whose outputs are returned (concatenated, as ``Qwen3.forward`` does)

    Returns
    -------
    logits : float32 [B, T, V]
    tapped : [B, T, len(taps) * H] or None
    """
    b, t = tokens.shape
    eps = cfg.rms_norm_eps
    pos = torch.arange(t).expand(b, t)
    cs = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
    x = F.embedding(tokens, w["model.embed_tokens.weight"])
    kept = {}
    for li in range(cfg.num_hidden_layers):
        p = f"model.layers.{li}."
        a = _rms(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = _qkv(w, p, cfg, a, a, cs, cs)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + F.linear(o.transpose(1, 2).reshape(b, t, -1), w[p + "self_attn.o_proj.weight"])
        x = x + _mlp(w, p, x, eps)
        kept[li] = x
    tapped = torch.cat([kept[i] for i in taps], dim=-1) if taps else None
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return F.linear(_rms(x, w["model.norm.weight"], eps), head), tapped


def head_forward(w: dict, cfg: DraftConfig, tapped: torch.Tensor, tokens: torch.Tensor,
                 anchors: torch.Tensor, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor):
    """Draft logits of many blocks per window in one pass.

    Parameters
    ----------
    w : draft-head weights (checkpoint keys, float32)
    tapped : [B, T, n_taps * Ht] the frozen target's taps of the window
    tokens : int64 [B, T] the window
    anchors : int64 [B, NB] anchor positions, each in ``[1, T - 1]``
    embed_weight, lm_head_weight : [V, H] the target's (frozen)

    Returns
    -------
    logits : float32 [B, NB, S - 1, V]; ``[b, i, d - 1]`` is the draft for the token at
    ``anchors[b, i] + d`` (depth d).
    """
    b, t, _ = tapped.shape
    nb = anchors.shape[1]
    s, eps = cfg.block_size, cfg.rms_norm_eps
    block = torch.full((b, nb, s), cfg.mask_token_id, dtype=torch.long)
    block[:, :, 0] = tokens.gather(1, anchors)
    x = F.embedding(block.view(b, nb * s), embed_weight)
    ctx = _rms(F.linear(tapped, w["fc.weight"]), w["hidden_norm.weight"], eps)
    blk_pos = (anchors[:, :, None] + torch.arange(s)).view(b, nb * s)
    cs_blk = rope_cos_sin(blk_pos, cfg.head_dim, cfg.rope_theta)
    cs_ctx = rope_cos_sin(torch.arange(t).expand(b, t), cfg.head_dim, cfg.rope_theta)
    cs_all = tuple(torch.cat([c, d], dim=1) for c, d in zip(cs_ctx, cs_blk))
    # visibility [B, NB*S, T + NB*S]: context keys before the anchor, own block (causal or full)
    see_ctx = torch.arange(t)[None, None, :] < anchors.repeat_interleave(s, dim=1)[:, :, None]
    same = torch.arange(nb).repeat_interleave(s)
    row = torch.arange(s).repeat(nb)
    see_blk = same[:, None] == same[None, :]
    if cfg.causal_head:
        see_blk = see_blk & (row[None, :] <= row[:, None])
    mask = torch.cat([see_ctx, see_blk.expand(b, -1, -1)], dim=2)[:, None]
    for li in range(cfg.num_hidden_layers):
        p = f"layers.{li}."
        a = _rms(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = _qkv(w, p, cfg, a, torch.cat([ctx, a], dim=1), cs_blk, cs_all)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + F.linear(o.transpose(1, 2).reshape(b, nb * s, -1), w[p + "self_attn.o_proj.weight"])
        x = x + _mlp(w, p, x, eps)
    h = _rms(x.view(b, nb, s, -1)[:, :, 1:], w["norm.weight"], eps)
    return F.linear(h, lm_head_weight)
