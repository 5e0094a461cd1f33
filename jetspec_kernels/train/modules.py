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

from ..models.config import DraftConfig, Qwen3Config
from ..models.init import init_weights, layer_shapes
from ..python_ref.layers import decoder_layer, layer_weights, qk_norm_rope
from ..python_ref.rms_norm import rms_norm

__all__ = ["init_target_weights", "init_head_weights", "target_forward", "head_forward"]

_STD = 0.02


def _init_layers(cfg: Qwen3Config, gen: torch.Generator, prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for i in range(cfg.num_hidden_layers):
        out.update(init_weights(layer_shapes(cfg), gen, prefix=f"{prefix}layers.{i}.", std=_STD,
                                num_layers=cfg.num_hidden_layers))
    return out


def init_target_weights(cfg: Qwen3Config, seed: int) -> dict[str, torch.Tensor]:
    """Freshly initialised Hugging Face-keyed Qwen3 weights (float32; tied embeddings honoured)."""
    gen = torch.Generator().manual_seed(seed)
    w = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * _STD,
         "model.norm.weight": torch.ones(cfg.hidden_size)}
    w.update(_init_layers(cfg, gen, "model."))
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * _STD
    return w


def init_head_weights(cfg: DraftConfig, seed: int) -> dict[str, torch.Tensor]:
    """Freshly initialised draft-head weights in the JetSpec checkpoint keys (float32)."""
    gen = torch.Generator().manual_seed(seed)
    width = len(cfg.target_layer_ids) * cfg.target_hidden_size
    w = {"fc.weight": torch.randn(cfg.hidden_size, width, generator=gen) / math.sqrt(width),
         "hidden_norm.weight": torch.ones(cfg.hidden_size), "norm.weight": torch.ones(cfg.hidden_size)}
    w.update(_init_layers(cfg, gen, ""))
    return w


def _sdpa(q, k, v, **mask):
    """Attention on [B, T, H, Dh] tensors (GQA): torch's fused SDPA, which wants heads first."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       enable_gqa=True, **mask)
    return o.transpose(1, 2)


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

    def attend(q, k, v, lw):
        q, k = qk_norm_rope(q, k, lw, eps, pos, pos, cfg.rope_theta)
        return _sdpa(q, k, v, is_causal=True)

    x = F.embedding(tokens, w["model.embed_tokens.weight"])
    kept = {}
    for li in range(cfg.num_hidden_layers):
        x = decoder_layer(x, layer_weights(w, f"model.layers.{li}."), attend, eps)
        kept[li] = x
    tapped = torch.cat([kept[i] for i in taps], dim=-1) if taps else None
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return F.linear(rms_norm(x, w["model.norm.weight"], eps), head), tapped


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
    ctx = rms_norm(F.linear(tapped, w["fc.weight"]), w["hidden_norm.weight"], eps)
    blk_pos = (anchors[:, :, None] + torch.arange(s)).view(b, nb * s)
    all_pos = torch.cat([torch.arange(t).expand(b, t), blk_pos], dim=1)
    # visibility [B, NB*S, T + NB*S]: context keys before the anchor, own block (causal or full)
    see_ctx = torch.arange(t)[None, None, :] < anchors.repeat_interleave(s, dim=1)[:, :, None]
    same = torch.arange(nb).repeat_interleave(s)
    row = torch.arange(s).repeat(nb)
    see_blk = same[:, None] == same[None, :]
    if cfg.causal_head:
        see_blk = see_blk & (row[None, :] <= row[:, None])
    mask = torch.cat([see_ctx, see_blk.expand(b, -1, -1)], dim=2)[:, None]

    def attend(q, k, v, lw):
        q, k = qk_norm_rope(q, k, lw, eps, blk_pos, all_pos, cfg.rope_theta)
        return _sdpa(q, k, v, attn_mask=mask)

    for li in range(cfg.num_hidden_layers):
        x = decoder_layer(x, layer_weights(w, f"layers.{li}."), attend, eps, context=ctx)
    h = rms_norm(x.view(b, nb, s, -1)[:, :, 1:], w["norm.weight"], eps)
    return F.linear(h, lm_head_weight)
