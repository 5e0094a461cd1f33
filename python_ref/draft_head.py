"""Reference JetSpec / DFlash draft-head forward (DESIGN.md section 3), written plainly."""

import math

import torch

from ._common import compute_dtype
from .layers import decoder_layer, layer_weights, qk_norm_rope
from .rms_norm import rms_norm

__all__ = ["target_layer_ids", "draft_head_forward"]


def target_layer_ids(num_target_layers, num_draft_layers):
    """Default target layers to tap when ``dflash_config.target_layer_ids`` is missing.

    One draft layer -> ``[L // 2]``; otherwise ``num_draft_layers`` ids evenly spaced over
    ``[1, L - 3]``, rounded with Python's ``round`` (as DFlash does).
    """
    L, n = int(num_target_layers), int(num_draft_layers)
    if n < 1:
        raise ValueError(f"num_draft_layers must be >= 1, got {n}")
    if n == 1:
        return [L // 2]
    start, end = 1, L - 3
    span = end - start
    return [int(round(start + i * span / (n - 1))) for i in range(n)]


def _linear(x, w):
    return x @ w.t()


def draft_head_forward(weights, cfg, target_hidden, anchor_tokens, embed_weight, lm_head_weight):
    """One draft-head forward from scratch (no KV cache).

    Parameters
    ----------
    weights : dict ``name -> tensor`` keyed like the checkpoint: ``fc.weight [H, n_taps*Ht]``,
        ``hidden_norm.weight [H]``, ``norm.weight [H]``, ``layers.{i}.input_layernorm.weight``,
        ``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
        ``layers.{i}.self_attn.{q,k}_norm.weight [Dh]``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``
    cfg : dict, the parsed config.json (hidden_size, num_attention_heads, num_key_value_heads,
        head_dim (default hidden_size // heads), rms_norm_eps (1e-6), rope_theta (1e6),
        num_hidden_layers, block_size, dflash_config.{causal_head (True), mask_token_id})
    target_hidden : ``[B, T, n_taps * Ht]`` tapped target hidden states of the T context rows
    anchor_tokens : int ``[B]`` (the block's first token; the rest are ``mask_token_id``)
    embed_weight : ``[V, H]`` target embedding; lm_head_weight : ``[V, H]`` target lm_head

    Returns
    -------
    logits ``[B, S - 1, V]`` (S = block_size) in the compute dtype (float64 if target_hidden is
    float64, else float32); row s is the draft's prediction for depth s + 1.
    """
    cd = compute_dtype(target_hidden)
    W = {k: v.to(cd) for k, v in weights.items()}
    H = cfg["hidden_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nq)
    Dh = cfg.get("head_dim") or H // nq
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 1000000.0)
    S = cfg["block_size"]
    dcfg = cfg.get("dflash_config", {}) or {}
    causal = dcfg.get("causal_head", True)
    mask_id = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
    if mask_id is None:
        raise ValueError("cfg has no dflash_config.mask_token_id")
    n_layers = cfg.get("num_hidden_layers")
    if n_layers is None:
        n_layers = len({k.split(".")[1] for k in weights if k.startswith("layers.")})

    B, T, _ = target_hidden.shape
    dev = target_hidden.device
    group = nq // nkv

    # Block [anchor, mask, ..., mask], embedded with the target's embedding.
    block = torch.full((B, S), int(mask_id), dtype=torch.long, device=dev)
    block[:, 0] = anchor_tokens.to(torch.long)
    h = embed_weight.to(cd)[block]                                          # [B, S, H]

    # Context rows, shared by every layer.
    ctx = rms_norm(_linear(target_hidden.to(cd), W["fc.weight"]), W["hidden_norm.weight"], eps)

    pos_all = torch.arange(T + S, device=dev)                               # ctx 0..T-1, block T..
    pos_blk = pos_all[T:]
    # Visibility of key j (over [ctx; block]) for block query s.
    vis = torch.zeros(S, T + S, dtype=torch.bool, device=dev)
    vis[:, :T] = True
    vis[:, T:] = torch.ones(S, S, dtype=torch.bool, device=dev).tril() if causal else True

    def attend(q, k, v, w):
        q, k = qk_norm_rope(q, k, w, eps, pos_blk, pos_all, theta)
        attn = torch.zeros(B, S, nq, Dh, dtype=cd, device=dev)
        for hq in range(nq):
            hk = hq // group
            s = torch.einsum("bsd,btd->bst", q[:, :, hq], k[:, :, hk]) / math.sqrt(Dh)
            s = s.masked_fill(~vis, -math.inf)
            attn[:, :, hq] = torch.softmax(s, dim=-1) @ v[:, :, hk]
        return attn

    for li in range(n_layers):
        h = decoder_layer(h, layer_weights(W, f"layers.{li}."), attend, eps, context=ctx)

    h = rms_norm(h, W["norm.weight"], eps)
    return _linear(h[:, 1:], lm_head_weight.to(cd))
