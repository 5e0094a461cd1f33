"""Train a JetSpec draft head (causal block) or its DFlash twin (bidirectional block) on a frozen
target by distillation: block row ``d`` of the block anchored at ``p`` is pulled (KL) towards the
target's distribution for the token at ``p + d`` given the true prefix (the target's logits at
position ``p + d - 1``), with depth weights ``exp(-(d - 1) / gamma)``.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from ..models.config import DraftConfig, Qwen3Config
from .modules import head_forward, init_head_weights, target_forward
from .target import lr_at
from ..models.byte_tokenizer import MASK_ID

__all__ = ["head_config", "train_head"]


def head_config(target: Qwen3Config, *, causal: bool, layers: int = 2, block_size: int = 16,
                target_layer_ids=None) -> DraftConfig:
    """A draft-head config for ``target``: same widths as the target, ``MASK_ID`` as mask token.

    ``target_layer_ids`` defaults to the first and the last layer below the top (``[1, L - 1]``).
    """
    if target_layer_ids is None:
        target_layer_ids = [1, target.num_hidden_layers - 1]
    return DraftConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                       intermediate_size=target.intermediate_size, num_hidden_layers=layers,
                       num_attention_heads=target.num_attention_heads,
                       num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
                       rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
                       tie_word_embeddings=False, block_size=block_size,
                       num_target_layers=target.num_hidden_layers, causal_head=causal,
                       target_layer_ids=list(target_layer_ids), mask_token_id=MASK_ID,
                       target_hidden_size=target.hidden_size)


def _depth_weights(s: int, gamma: float) -> torch.Tensor:
    w = torch.exp(-torch.arange(s - 1, dtype=torch.float32) / gamma)
    return w / w.sum()


def _distill(hw, cfg, tw, tcfg, x, anchors, dweights):
    """(loss, per-depth top-1 agreement [S-1]) of one batch of windows x [B, T]."""
    s = cfg.block_size
    with torch.no_grad():
        tlogits, tapped = target_forward(tw, tcfg, x, taps=cfg.target_layer_ids)
        idx = anchors[:, :, None] + torch.arange(s - 1)                  # positions p + d - 1
        b, nb, _ = idx.shape
        tsel = tlogits.gather(1, idx.view(b, -1, 1).expand(-1, -1, tcfg.vocab_size))
        tlogp = F.log_softmax(tsel.view(b, nb, s - 1, -1), dim=-1)
    head_w = tw["model.embed_tokens.weight"] if tcfg.tie_word_embeddings else tw["lm_head.weight"]
    dlogits = head_forward(hw, cfg, tapped, x, anchors, tw["model.embed_tokens.weight"], head_w)
    dlogp = F.log_softmax(dlogits, dim=-1)
    kl = (tlogp.exp() * (tlogp - dlogp)).sum(-1)                        # [B, NB, S-1]
    loss = (kl.mean(dim=(0, 1)) * dweights).sum()
    agree = (dlogits.argmax(-1) == tsel.view(b, nb, s - 1, -1).argmax(-1)).float().mean(dim=(0, 1))
    return loss, agree


def train_head(cfg: DraftConfig, target_weights: dict, target_cfg: Qwen3Config, train: torch.Tensor,
               heldout: torch.Tensor, *, steps: int, batch: int, length: int, blocks: int, lr: float,
               gamma: float, seed: int, log=print) -> tuple[dict, dict]:
    """Train a draft head with AdamW on windows of the train stream; the target stays frozen.

    Parameters
    ----------
    cfg : the head config (``causal_head`` picks JetSpec or DFlash)
    target_weights, target_cfg : the frozen target (float32 Hugging Face-keyed weights)
    train, heldout : int64 token streams
    steps, batch, length : optimisation steps, windows per step, tokens per window
    blocks : anchors per window (distinct, uniform over ``[1, length - S + 1]``)
    lr : peak learning rate; gamma : depth-weight decay; seed : init and sampling

    Returns
    -------
    weights : checkpoint-keyed float32 tensors (detached)
    summary : dict with ``train_kl`` (mean of the last 20 steps), ``heldout_kl`` and
        ``heldout_top1_by_depth`` (draft argmax == target argmax, depths 1..S-1, on 16 fixed
        held-out windows), ``seconds`` and the hyper-parameters.
    """
    from .data import sample_windows

    s = cfg.block_size
    hw = init_head_weights(cfg, seed)
    for t in hw.values():
        t.requires_grad_(True)
    decay = [t for t in hw.values() if t.dim() == 2]
    no_decay = [t for t in hw.values() if t.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1000)
    dweights = _depth_weights(s, gamma)
    warmup = max(1, steps // 20)
    n_anchor = length - s + 1

    def anchors_for(b, g):
        return torch.argsort(torch.rand(b, n_anchor, generator=g), dim=1)[:, :blocks] + 1

    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, steps, lr, warmup)
        x = sample_windows(train, batch, length, gen)
        loss, agree = _distill(hw, cfg, target_weights, target_cfg, x, anchors_for(batch, gen), dweights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(hw.values()), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            log(f"head ({'causal' if cfg.causal_head else 'dflash'}) step {step:4d}/{steps} "
                f"kl {losses[-1]:.3f} top1 d1 {agree[0]:.2f} d4 {agree[3]:.2f} "
                f"({time.perf_counter() - t0:.0f}s)")
    hw = {k: t.detach() for k, t in hw.items()}
    g = torch.Generator().manual_seed(seed + 2000)
    with torch.no_grad():
        hx = sample_windows(heldout, 16, length, g)
        hloss, hagree = _distill(hw, cfg, target_weights, target_cfg, hx, anchors_for(16, g), dweights)
    tail = losses[-20:]
    summary = {"steps": steps, "batch": batch, "length": length, "blocks": blocks, "lr": lr,
               "gamma": gamma, "seed": seed, "train_kl": sum(tail) / len(tail),
               "heldout_kl": float(hloss),
               "heldout_top1_by_depth": [round(float(a), 4) for a in hagree],
               "seconds": round(time.perf_counter() - t0, 1)}
    return hw, summary
