"""The JetSpec / DFlash draft head with a persistent draft KV cache (DESIGN.md section 3).

Context rows are ``ctx = RMSNorm_hidden(fc(taps))``; every layer's context K/V come from that same
``ctx`` (no input layernorm), so :meth:`DraftHead.append_context` computes them once per new row and
appends them to the cache at positions ``ctx_len ..``. Each round, :meth:`DraftHead.draft_hidden`
writes the block ``[anchor, mask, ..., mask]`` K/V at positions ``ctx_len .. ctx_len + S - 1``
(overwritten every round) and attends with ``tree_attention`` (tail ``"causal"``, or ``"full"`` when
``causal_head`` is false). The head owns no embedding and no lm_head: it takes the target's.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import tp
from ..ops.qk_norm_rope_append import qk_norm_rope_append
from ..ops.rms_norm import rms_norm
from ..ops.silu_mul import silu_mul
from ..ops.tree_attention import tree_attention
from ..python_ref.layers import swiglu
from .layer import decoder_layer
from .checkpoint import check_layer_keys, load_safetensors, take
from .config import DraftConfig, read_config
from .init import LAYER_KEYS, layer_shapes
from .kv_cache import KVCache
from .norm import layer_norm
from .projections import QKV_KEY, fused_layers
from .sharding import check_tp, local_heads, shard_layer

__all__ = ["DraftHead", "DraftState"]


@dataclass
class DraftState:
    """Per-batch draft context: the cache and how many context rows each sequence has.

    cache : KVCache over the head's layers; ctx_len : int32 [B]
    """

    cache: KVCache
    ctx_len: torch.Tensor


class DraftHead:
    """A JetSpec (``causal_head`` true) or DFlash (false) draft head.

    Attributes
    ----------
    config : DraftConfig
    fc_weight : [H, n_taps * Ht]; hidden_norm_weight, norm_weight : [H]
    layers : list of dicts key (``LAYER_KEYS``) -> tensor
    shard : tp.Shard; split over several ranks, the layers hold this rank's heads and MLP
        features (as the target's, ``models.sharding``); fc and the norms are replicated
    fused_ops_backend : str or None
        The backend of the model's fused layer ops, its ``rms_norm`` and ``silu_mul`` calls
        (None: the process default; ``auto`` runs each as torch ops on a GPU until a GPU backend
        of it passes on hardware). Benches set it to time the fused kernels before that.
    """

    fused_ops_backend: str | None = None

    def __init__(self, config: DraftConfig, weights: dict[str, torch.Tensor], *, where: str = "DraftHead",
                 group=None):
        """Take checkpoint tensors (keys as in DESIGN.md; a ``model.`` prefix is accepted).
        ``group``: the tensor-parallel process group, as for :class:`~.qwen3.Qwen3`."""
        self.config = cfg = config
        self.shard = shard = tp.shard_of(group)
        check_tp(cfg, shard, where, {"intermediate_size": cfg.intermediate_size})
        weights = {k.removeprefix("model."): t for k, t in weights.items()}
        h = cfg.hidden_size
        taps_width = len(cfg.target_layer_ids) * cfg.target_hidden_size
        self.fc_weight = take(weights, "fc.weight", (h, taps_width), where)
        self.hidden_norm_weight = take(weights, "hidden_norm.weight", (h,), where)
        self.norm_weight = take(weights, "norm.weight", (h,), where)
        shapes = layer_shapes(cfg)
        layers = [shard_layer({key: take(weights, f"layers.{i}.{key}", shapes[key], where)
                               for key in LAYER_KEYS}, shard)
                  for i in range(cfg.num_hidden_layers)]
        self.layers, self._run_layers = fused_layers(layers)
        check_layer_keys(weights, "layers.", cfg.num_hidden_layers, LAYER_KEYS, where)
        self._reduce = (lambda x: tp.all_reduce(x, shard)) if shard.parallel else None

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", group=None) -> "DraftHead":
        """Load a draft-head checkpoint directory (``config.json`` + safetensors, single or sharded);
        ``group`` as for :meth:`Qwen3.from_pretrained <.qwen3.Qwen3.from_pretrained>`."""
        cfg = DraftConfig.from_dict(read_config(path),
                                    f"draft head config {os.path.join(path, 'config.json')}")
        shard = tp.shard_of(group)
        head = cls(cfg, load_safetensors(path, dtype=dtype, device="cpu" if shard.parallel else device),
                   where=f"draft head checkpoint {path}", group=shard)
        if shard.parallel:
            head._move(device)
        return head

    def _move(self, device) -> None:
        """Move every weight to ``device``."""
        self.fc_weight = self.fc_weight.to(device)
        self.hidden_norm_weight = self.hidden_norm_weight.to(device)
        self.norm_weight = self.norm_weight.to(device)
        moved = [{k: t.to(device) for k, t in layer.items()} for layer in self.layers]
        self.layers, self._run_layers = fused_layers(moved)   # views again, on the device

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.config.target_layer_ids)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc_weight.device

    def new_state(self, batch: int, capacity: int, *, page_size: int | None = None) -> DraftState:
        """Empty draft context for ``batch`` sequences; ``capacity`` must cover the longest context
        plus ``max(block_size, rows appended at once)``."""
        c = self.config
        cache = KVCache.allocate(c.num_hidden_layers, batch, capacity, local_heads(c, self.shard)[1], c.head_dim,
                                 dtype=self.dtype, device=self.device, page_size=page_size)
        return DraftState(cache, torch.zeros(batch, dtype=torch.int32, device=self.device))

    def append_context(self, state: DraftState, taps: torch.Tensor, counts: torch.Tensor) -> None:
        """Append context rows: K/V of ``ctx = RMSNorm(fc(taps))`` at positions ``ctx_len ..``.

        Parameters
        ----------
        state : DraftState (``ctx_len += counts`` in place)
        taps : [B, M, n_taps * Ht] target hidden states of the new rows (rows >= counts[b] are
            ignored: their K/V land beyond the new context length and are overwritten later)
        counts : int32 [B] in [0, M]
        """
        cfg = self.config
        b, m, _ = taps.shape
        nkv, dh, eps = local_heads(cfg, self.shard)[1], cfg.head_dim, cfg.rms_norm_eps
        ctx = rms_norm(F.linear(taps.to(self.dtype), self.fc_weight), self.hidden_norm_weight, eps=eps,
                       backend=self.fused_ops_backend)
        pos = (state.ctx_len[:, None] + torch.arange(m, device=taps.device, dtype=torch.int32)).contiguous()
        for li, w in enumerate(self._run_layers):
            nq = w["self_attn.q_proj.weight"].shape[0]
            # k and v rows sit together in the q/k/v concatenation: one GEMM for both.
            k, v = (t.view(b, m, nkv, dh) for t in
                    F.linear(ctx, w[QKV_KEY][nq:]).split(nkv * dh, dim=-1))
            kc, vc = state.cache.layer(li)
            # Context rows have no query: the K/V-only form (q=None) only fills the cache.
            qk_norm_rope_append(None, k, v, None, w["self_attn.k_norm.weight"], pos, kc, vc,
                                rope_theta=cfg.rope_theta, eps=eps,
                                block_table=state.cache.block_table)
        state.ctx_len.add_(counts.to(torch.int32))   # in place: a static buffer for CUDA graphs

    def draft_hidden(self, state: DraftState, anchor_tokens: torch.Tensor,
                     embed_weight: torch.Tensor) -> torch.Tensor:
        """Run the block ``[anchor, mask, ...]`` over the cached context.

        Parameters
        ----------
        state : DraftState (its cache's block slots are overwritten; ctx_len is unchanged)
        anchor_tokens : int [B]
        embed_weight : [V, H] the target's embedding

        Returns
        -------
        hidden : [B, S - 1, H] final-normed hidden states of block rows 1..S-1 (depths 1..S-1);
            a view (batch stride S * H) of the normed block.
        """
        cfg = self.config
        b = anchor_tokens.shape[0]
        s, eps = cfg.block_size, cfg.rms_norm_eps
        norm = layer_norm(eps, self.fused_ops_backend)
        mlp = functools.partial(swiglu, act=functools.partial(silu_mul, backend=self.fused_ops_backend))
        dev = anchor_tokens.device
        if embed_weight.dim() != 2 or embed_weight.shape[1] != cfg.hidden_size:
            raise ValueError(f"embed_weight must have shape [V, {cfg.hidden_size}] (the draft head's "
                             f"hidden size), got {list(embed_weight.shape)}")
        block = torch.full((b, s), cfg.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = anchor_tokens.long()
        x, res = F.embedding(block, embed_weight).to(self.dtype), None
        pos = (state.ctx_len[:, None] + torch.arange(s, device=dev, dtype=torch.int32)).contiguous()
        tail = "causal" if cfg.causal_head else "full"
        table = state.cache.block_table
        for li, w in enumerate(self._run_layers):
            kc, vc = state.cache.layer(li)

            def attend(q, k, v, lw):
                q = qk_norm_rope_append(q, k, v, lw["self_attn.q_norm.weight"], lw["self_attn.k_norm.weight"],
                                        pos, kc, vc, rope_theta=cfg.rope_theta, eps=eps, block_table=table)
                return tree_attention(q, kc, vc, state.ctx_len, tail=tail, block_table=table)

            # The MLP's residual add is left to the next norm: one launch fewer a layer.
            x, res = decoder_layer(x, w, attend, eps, mlp=mlp, dtype=self.dtype, reduce=self._reduce,
                                   norm=norm, residual=res, defer_add=True)
        # Every row normed, then the anchor's dropped: one launch, where norming the strided
        # x[:, 1:] would copy it first (its rows do not flatten to one stride when B > 1).
        return norm(x, self.norm_weight, res)[0][:, 1:]

    def cached_logits(self, state: DraftState, anchor_tokens: torch.Tensor, *,
                      embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Per-depth draft logits over the cached context (:meth:`draft_hidden` then the lm_head).

        Parameters
        ----------
        state : DraftState; anchor_tokens : int [B]
        embed_weight, lm_head_weight : [V, H] the target's

        Returns
        -------
        logits : [B, S - 1, V] in the head's dtype; row s predicts depth s + 1.
        """
        hidden = self.draft_hidden(state, anchor_tokens, embed_weight)
        return F.linear(hidden, lm_head_weight.to(self.dtype))

    def draft_logits(self, target_hidden: torch.Tensor, anchor_tokens: torch.Tensor, *,
                     embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Per-depth draft logits for a fresh context (the decoding loop's cached path, from scratch).

        Parameters
        ----------
        target_hidden : [B, T, n_taps * Ht] tapped target hidden states of the T context rows
        anchor_tokens : int [B]
        embed_weight, lm_head_weight : [V, H] the target's

        Returns
        -------
        logits : [B, S - 1, V] in the head's dtype; row s predicts depth s + 1.
        """
        b, t, _ = target_hidden.shape
        state = self.new_state(b, t + self.block_size)
        counts = torch.full((b,), t, dtype=torch.int32, device=target_hidden.device)
        self.append_context(state, target_hidden, counts)
        return self.cached_logits(state, anchor_tokens, embed_weight=embed_weight,
                                  lm_head_weight=lm_head_weight)
