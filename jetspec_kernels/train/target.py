"""Train the tiny byte-level Qwen3 target by next-token cross-entropy on the stdlib corpus."""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from ..models.config import Qwen3Config
from .modules import init_target_weights, target_forward
from ..models.byte_tokenizer import EOS_ID, VOCAB_SIZE

__all__ = ["target_config", "train_target", "lr_at"]


def target_config(hidden: int = 192, layers: int = 4, intermediate: int = 512, heads: int = 4,
                  kv_heads: int = 2, head_dim: int = 64) -> Qwen3Config:
    """The tiny target's config: byte vocabulary, tied embeddings, RoPE theta 1e4."""
    return Qwen3Config(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=10000.0,
                       tie_word_embeddings=True, eos_token_id=EOS_ID)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def _eval_loss(w, cfg, stream, batch, length, seed):
    gen = torch.Generator().manual_seed(seed)
    from .data import sample_windows
    x = sample_windows(stream, batch, length + 1, gen)
    with torch.no_grad():
        logits, _ = target_forward(w, cfg, x[:, :-1])
        return float(F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1)))


def train_target(cfg: Qwen3Config, train: torch.Tensor, heldout: torch.Tensor, *, steps: int,
                 batch: int, length: int, lr: float, seed: int, log=print) -> tuple[dict, dict]:
    """Train from scratch with AdamW.

    Parameters
    ----------
    cfg : the target config; train, heldout : int64 token streams (:func:`data.load_corpus`)
    steps, batch, length : optimisation steps, windows per step, tokens per window
    lr : peak learning rate; seed : initialisation and window sampling

    Returns
    -------
    weights : Hugging Face-keyed float32 tensors (detached)
    summary : dict with ``train_loss`` (mean of the last 20 steps), ``heldout_loss`` (nats/byte
        on 16 fixed held-out windows), ``seconds`` and the hyper-parameters.
    """
    from .data import sample_windows

    w = init_target_weights(cfg, seed)
    for t in w.values():
        t.requires_grad_(True)
    decay = [t for t in w.values() if t.dim() == 2]
    no_decay = [t for t in w.values() if t.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1000)
    warmup = max(1, steps // 20)
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x = sample_windows(train, batch, length + 1, gen)
        logits, _ = target_forward(w, cfg, x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            log(f"target step {step:4d}/{steps} loss {losses[-1]:.3f} ({time.perf_counter() - t0:.0f}s)")
    w = {k: t.detach() for k, t in w.items()}
    tail = losses[-20:]
    summary = {"steps": steps, "batch": batch, "length": length, "lr": lr, "seed": seed,
               "train_loss": sum(tail) / len(tail),
               "heldout_loss": _eval_loss(w, cfg, heldout, 16, length, seed + 2000),
               "seconds": round(time.perf_counter() - t0, 1)}
    return w, summary
