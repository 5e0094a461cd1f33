"""A minimal Qwen3 target model running on the package's ops.

Matmuls, embeddings and the MLP are plain torch; the per-head q/k RMSNorm + RoPE + cache append
is :func:`jetspec_kernels.qk_norm_rope_append` and attention is
:func:`jetspec_kernels.tree_attention`, so the same code runs on every backend. One forward
serves prefill (causal over the prompt), one-token decode, and tree verification (tree mask);
it can also return the hidden states tapped at given layers (each layer's output, before the
final norm), which the draft head reads. Qwen3-MoE targets (``model_type`` ``qwen3_moe``) load and
run too: their sparse layers' MLP is :mod:`.moe` (router, top-k, experts grouped).
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from ..ops import exact as exact_ops
from ..ops.qk_norm_rope_append import qk_norm_rope_append
from ..ops.silu_mul import silu_mul
from ..ops.tree_attention import tree_attention
from ..python_ref.layers import swiglu
from .layer import decoder_layer
from .. import launch_plan, tp
from ..limits import EXACT_MAX_K_PARTS
from ..tree import Tree
from .checkpoint import check_layer_keys, load_safetensors, take
from .config import Qwen3Config, Qwen3MoeConfig, read_config
from .init import target_layer_shapes
from .kv_cache import KVCache
from .moe import exact_moe, fuse_expert_weights, grouped_experts, route
from .norm import layer_norm
from .projections import fused_layers
from .sharding import check_tp, local_heads, shard_layer

__all__ = ["Qwen3"]


def _fuse_experts(cfg: Qwen3Config, weights: dict, prefix: str, where: str) -> None:
    """Per-expert tensors of every sparse layer -> the fused layout, in ``weights`` (in place)."""
    if not isinstance(cfg, Qwen3MoeConfig):
        return
    for i in range(cfg.num_hidden_layers):
        if cfg.is_sparse(i):
            fuse_expert_weights(weights, f"{prefix}layers.{i}.", cfg.num_experts, cfg.hidden_size,
                                cfg.moe_intermediate_size, where)


class Qwen3:
    """Qwen3 decoder with a KV cache, prefill, one-token decode and tree verification.

    Attributes
    ----------
    config : Qwen3Config
    embed_weight : [V, H]; lm_head_weight : [V, H] (the same tensor when embeddings are tied)
    layers : list of dicts key -> tensor: ``LAYER_KEYS``, or for a sparse (MoE) layer the
        attention and norm keys plus ``mlp.gate.weight [E, H]``, ``mlp.experts.gate_up_proj
        [E, 2I, H]`` (gate rows, then up rows) and ``mlp.experts.down_proj [E, H, I]``
    norm_weight : [H]
    shard : tp.Shard, the tensor-parallel group the layers are split over (``tp.ALONE``: not
        split). Split, the layers hold this rank's heads and features (``models.sharding``) and
        each layer all-reduces twice; embeddings, lm_head and norms are replicated
    experts_grouped_mm : bool or None
        How sparse layers run their experts (:func:`.moe.grouped_experts`): None picks
        ``torch.nn.functional.grouped_mm`` on CUDA in bf16 (no host sync) and a loop over the
        experts that have tokens otherwise (one host sync per sparse layer).
    fused_ops_backend : str or None
        The backend of the model's fused layer ops, its ``rms_norm`` and ``silu_mul`` calls
        (None: the process default; ``auto`` runs each as torch ops on a GPU until a GPU backend
        of it passes on hardware). Benches set it to time the fused kernels before that.
    exact_gemm_tile : str
        The exact mode's GEMM tile on triton (``ops.exact.GEMM_TILES``): ``"narrow"`` (small
        batches) or ``"wide"`` (large ones: a B16 verify). An engine sets it once for its
        configuration; generate and generate_ar on the same target then run the same tile, which
        their bit equality needs. The MoE block's GEMMs keep the narrow tile either way.
    exact_k_parts : int or None
        The exact mode's split of K in the row-parallel GEMMs (o_proj, the MLP's down): K
        reduced in this many equal parts (at most ``limits.EXACT_MAX_K_PARTS``), their float32
        products added along a fixed pairwise tree and rounded once (``ops.exact.linear``'s
        ``parts``, ``tp.all_reduce_pairwise`` across the ranks). A power of two that tp
        divides; every tp dividing it gives the same bits (tp 1 included), since each rank
        reduces whole parts and the tree over the ranks continues the tree over its parts.
        None: tp itself (each rank one part; tp t's bits are then its own). MoE layers split their experts' down projection alike and sum each
        (token, choice) row's shares before weighting the choices.
    """

    experts_grouped_mm: bool | None = None
    fused_ops_backend: str | None = None
    exact_gemm_tile: str = "narrow"
    exact_k_parts: int | None = None
    _ROW_PARALLEL_KEYS = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.down_proj")

    def __init__(self, config: Qwen3Config, weights: dict[str, torch.Tensor], *, where: str = "Qwen3",
                 group=None):
        """Take the tensors of a checkpoint (keys with or without the ``model.`` prefix). MoE
        experts may be per expert (``mlp.experts.{j}.{gate,up,down}_proj.weight``, copied into the
        fused layout) or fused (``mlp.experts.gate_up_proj`` / ``down_proj``, used as they are).

        ``group``: the tensor-parallel process group (:func:`jetspec_kernels.tp.shard_of`: None =
        the default group when torch.distributed is initialised with several ranks, ``tp.ALONE``
        = no split); a tp that does not divide the heads or the MLP sizes is a ``ValueError``.
        The full tensors are checked, then this rank's parts kept."""
        self.config = cfg = config
        self.shard = shard = tp.shard_of(group)
        sparse = [isinstance(cfg, Qwen3MoeConfig) and cfg.is_sparse(i) for i in range(cfg.num_hidden_layers)]
        sizes = {"intermediate_size": cfg.intermediate_size} if not all(sparse) else {}
        if any(sparse):
            sizes["moe_intermediate_size"] = cfg.moe_intermediate_size
        check_tp(cfg, shard, where, sizes)
        prefix = "model." if "model.embed_tokens.weight" in weights else ""
        weights = dict(weights)     # fusing experts edits the dict, never the caller's
        _fuse_experts(cfg, weights, prefix, where)
        v, h = cfg.vocab_size, cfg.hidden_size
        self.embed_weight = take(weights, prefix + "embed_tokens.weight", (v, h), where)
        self.norm_weight = take(weights, prefix + "norm.weight", (h,), where)
        if cfg.tie_word_embeddings:
            self.lm_head_weight = self.embed_weight
        else:
            self.lm_head_weight = take(weights, "lm_head.weight", (v, h), where)
        shapes = [target_layer_shapes(cfg, i) for i in range(cfg.num_hidden_layers)]
        layers = [shard_layer({key: take(weights, f"{prefix}layers.{i}.{key}", shape, where)
                               for key, shape in shapes[i].items()}, shard)
                  for i in range(cfg.num_hidden_layers)]
        self.layers, self._run_layers = fused_layers(layers)
        check_layer_keys(weights, prefix + "layers.", cfg.num_hidden_layers, lambda i: shapes[i], where)
        self._reduce = (lambda x: tp.all_reduce(x, shard)) if shard.parallel else None

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", group=None) -> "Qwen3":
        """Load a Hugging Face Qwen3 or Qwen3-MoE checkpoint directory (by ``model_type``).

        Parameters
        ----------
        path : directory with ``config.json`` and ``model.safetensors`` (or shards + index)
        dtype : floating dtype of the weights and the KV cache
        device : where the weights live
        group : tensor-parallel process group, as for the constructor (None: the default group
            when torch.distributed is initialised with several ranks). Split, every rank reads
            the whole checkpoint into host memory, keeps its part and moves it to ``device``
        """
        cfg = Qwen3Config.from_dict(read_config(path), f"target config {os.path.join(path, 'config.json')}")
        where = f"target checkpoint {path}"
        shard = tp.shard_of(group)
        weights = load_safetensors(path, dtype=dtype, device="cpu" if shard.parallel else device)
        # Fuse here, where this dict is the only reference: each per-expert tensor is freed once
        # copied, so loading peaks at the checkpoint plus one layer's experts.
        _fuse_experts(cfg, weights, "model." if "model.embed_tokens.weight" in weights else "", where)
        model = cls(cfg, weights, where=where, group=shard)
        del weights
        if shard.parallel:
            model._move(device)
        return model

    def _move(self, device) -> None:
        """Move every weight to ``device`` (the tied lm_head stays the embedding)."""
        tied = self.lm_head_weight is self.embed_weight
        self.embed_weight = self.embed_weight.to(device)
        self.norm_weight = self.norm_weight.to(device)
        self.lm_head_weight = self.embed_weight if tied else self.lm_head_weight.to(device)
        moved = [{k: t.to(device) for k, t in layer.items()} for layer in self.layers]
        self.layers, self._run_layers = fused_layers(moved)   # views again, on the device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def new_cache(self, batch: int, capacity: int, *, page_size: int | None = None) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``capacity`` positions (paged when
        ``page_size`` is given), holding this rank's key/value heads."""
        c = self.config
        return KVCache.allocate(c.num_hidden_layers, batch, capacity, local_heads(c, self.shard)[1],
                                c.head_dim, dtype=self.dtype, device=self.device, page_size=page_size)

    def check_taps(self, taps) -> list[int]:
        """Validate tapped layer ids (each in ``[0, num_hidden_layers)``)."""
        taps = [int(t) for t in taps]
        n = self.config.num_hidden_layers
        bad = [t for t in taps if not 0 <= t < n]
        if bad:
            raise ValueError(f"target_layer_ids {bad} out of range for a {n}-layer target")
        return taps

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                attn_prefix: torch.Tensor, *, write_start: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, taps=()):
        """Run N new tokens per sequence against the cache.

        Parameters
        ----------
        tokens : int [B, N]
        positions : int32 [B, N]       RoPE positions
        cache : KVCache                the new K/V are written into it
        attn_prefix : int32 [B]        keys below this position are visible to every new token;
            the new tokens' own K/V must land at ``attn_prefix .. attn_prefix + N - 1``
        write_start : int32 [B], optional
            Row n goes to slot ``write_start + n``; when None to slot ``positions[b, n]``.
        tree_mask : int32 [B, N, ceil(N/32)], optional   tree visibility; None = causal
        taps : layer ids whose outputs are returned

        Returns
        -------
        hidden : [B, N, H] final-normed hidden states (model dtype)
        tapped : [B, N, len(taps) * H] or None
        """
        if exact_ops.exact_enabled():
            return self._forward_exact(tokens, positions, cache, attn_prefix, write_start,
                                       tree_mask, taps)
        cfg = self.config
        eps = cfg.rms_norm_eps
        norm = layer_norm(eps, self.fused_ops_backend)
        taps = list(taps)
        kept: dict[int, torch.Tensor] = {}
        x, res = F.embedding(tokens.long(), self.embed_weight), None
        for li, w in enumerate(self._run_layers):
            kc, vc = cache.layer(li)

            def attend(q, k, v, lw):
                q = qk_norm_rope_append(q, k, v, lw["self_attn.q_norm.weight"], lw["self_attn.k_norm.weight"],
                                        positions, kc, vc, rope_theta=cfg.rope_theta, eps=eps,
                                        block_table=cache.block_table, cache_start=write_start)
                return tree_attention(q, kc, vc, attn_prefix, tree_mask, tail="causal",
                                      block_table=cache.block_table)

            # The MLP's residual add is left to the next norm (one launch fewer a layer), except
            # where the layer's output is tapped.
            out = decoder_layer(x, w, attend, eps, mlp=self._mlp, dtype=self.dtype,
                                reduce=self._reduce, norm=norm, residual=res, defer_add=li not in taps)
            if li in taps:
                x = kept[li] = out
                res = None
            else:
                x, res = out
        tapped = torch.cat([kept[t] for t in taps], dim=-1) if taps else None
        return norm(x, self.norm_weight, res)[0], tapped

    def _forward_exact(self, tokens, positions, cache, attn_prefix, write_start, tree_mask, taps):
        """:meth:`forward` in the exact mode (``ops.exact.exact_mode``): every row's bits depend
        only on its token, its position and the keys it sees in logical order, not on B, N, the
        tree, the page size or the other rows. On the reference norms, projections and the MLP
        (experts included) run as one-row calls; on triton as one launch of the exact kernels
        (routed experts by the grouped fixed-tile GEMM). Attention is ``tree_attention(exact=True)``."""
        cfg = self.config
        eps = cfg.rms_norm_eps
        be = exact_ops.exact_backend("Qwen3.forward", self.device, self.fused_ops_backend)
        if self.exact_gemm_tile not in exact_ops.GEMM_TILES:
            raise ValueError(f"exact_gemm_tile must be one of {exact_ops.GEMM_TILES}, got "
                             f"{self.exact_gemm_tile!r}")
        linear = functools.partial(exact_ops.linear, backend=be, tile=self.exact_gemm_tile)
        # The row-parallel GEMMs' K in fixed parts, each rank reducing its own whole parts, summed
        # across the ranks along the same pairwise tree (all_reduce's order may depend on the
        # message size, so on M).
        local = self.resolved_exact_k_parts() // self.shard.size
        share_sum = ((lambda t: tp.all_reduce_pairwise(t, self.shard, self.dtype))
                     if self.shard.parallel else None)

        def row_linear(x, w):       # o_proj, down: whole parts, then the ranks' shares summed
            if share_sum is None:
                return linear(x, w, parts=local)
            return share_sum(linear(x, w, parts=local, partial=True))
        act = functools.partial(exact_ops.silu_mul, backend=be)

        def norm(x, weight, residual):
            if residual is None:
                return exact_ops.rms_norm(x, weight, eps=eps, backend=be), x
            return exact_ops.rms_norm(x, weight, eps=eps, residual=residual, backend=be)

        def mlp(a, w):
            if "mlp.gate.weight" in w:          # routed experts
                moe = functools.partial(exact_moe, a.reshape(-1, a.shape[-1]), w["mlp.gate.weight"],
                                        w["mlp.experts.gate_up_proj"], w["mlp.experts.down_proj"],
                                        cfg.num_experts_per_tok, cfg.norm_topk_prob, be)
                if share_sum is not None and self.exact_k_parts is None:
                    # tp's own bits: the block's [T, H] partial sums, k times fewer bytes to
                    # gather than its (token, choice) rows' shares, which tp t == tp 1 needs
                    return share_sum(moe()).view_as(a)
                return moe(parts=local, reduce=share_sum).view_as(a)
            # the run layers hold gate and up fused (models/projections.py): one GEMM
            return row_linear(act(linear(a, w["mlp.gate_up_proj.weight"])), w["mlp.down_proj.weight"])

        taps = list(taps)
        kept: dict[int, torch.Tensor] = {}
        x, res = F.embedding(tokens.long(), self.embed_weight), None     # a gather: exact
        with exact_ops.forward_scope(be):       # the tree's attention tables once, not per layer
            for li, w in enumerate(self._run_layers):
                kc, vc = cache.layer(li)

                def attend(q, k, v, lw):
                    q = exact_ops.qk_norm_rope_append(
                        q, k, v, lw["self_attn.q_norm.weight"], lw["self_attn.k_norm.weight"],
                        positions, kc, vc, rope_theta=cfg.rope_theta, eps=eps,
                        block_table=cache.block_table, cache_start=write_start, backend=be)
                    return tree_attention(q, kc, vc, attn_prefix, tree_mask, tail="causal",
                                          block_table=cache.block_table, exact=True, backend=be)

                out = decoder_layer(x, w, attend, eps, mlp=mlp, dtype=self.dtype, norm=norm,
                                    residual=res, defer_add=li not in taps, linear=linear,
                                    row_linear=row_linear)
                if li in taps:
                    x = kept[li] = out
                    res = None
                else:
                    x, res = out
        tapped = torch.cat([kept[t] for t in taps], dim=-1) if taps else None
        return norm(x, self.norm_weight, res)[0], tapped

    def resolved_exact_k_parts(self) -> int:
        """The exact mode's parts of K in the row-parallel GEMMs (``exact_k_parts``, None: tp),
        checked: ``ValueError`` naming it when it is not a power of two that tp divides or a
        rank's K is not whole parts."""
        parts, size = self.exact_k_parts, self.shard.size
        if parts is None:
            return size
        if not exact_ops.k_parts_ok(parts):
            raise ValueError(f"exact_k_parts must be None or a power of two <= {EXACT_MAX_K_PARTS}, "
                             f"got {parts!r}")
        if parts % size:
            raise ValueError(f"exact_k_parts ({parts}) must be a multiple of tp ({size}): every "
                             "rank reduces whole parts of K")
        for key in self._ROW_PARALLEL_KEYS:
            k = next((w[key].shape[-1] for w in self._run_layers if key in w), None)
            if k is not None and k % (parts // size):
                raise ValueError(f"exact_k_parts ({parts}) at tp {size}: this rank's K of "
                                 f"{key} ({k}) is not {parts // size} equal parts")
        return parts

    def _mlp(self, a: torch.Tensor, w: dict, grouped_mm: bool | None = None) -> torch.Tensor:
        """A layer's MLP on normed [B, N, H] input: SwiGLU, or routed experts in a sparse layer
        (``grouped_mm``: as :func:`.moe.grouped_experts`'s; None: ``experts_grouped_mm``)."""
        act = functools.partial(silu_mul, backend=self.fused_ops_backend)
        if "mlp.gate.weight" not in w:
            return swiglu(a, w, act=act)
        cfg = self.config
        flat = a.reshape(-1, a.shape[-1])
        weights, experts = route(flat, w["mlp.gate.weight"], cfg.num_experts_per_tok, cfg.norm_topk_prob)
        out = grouped_experts(flat, weights, experts, w["mlp.experts.gate_up_proj"],
                              w["mlp.experts.down_proj"],
                              grouped_mm=self.experts_grouped_mm if grouped_mm is None else grouped_mm,
                              act=act)
        return out.view_as(a)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] final hidden -> [..., V] logits (model dtype); in the exact mode
        ``ops.exact.linear`` (rows independent of M)."""
        if exact_ops.exact_enabled():
            return exact_ops.linear(hidden, self.lm_head_weight, backend=self.fused_ops_backend,
                                    tile=self.exact_gemm_tile)
        return F.linear(hidden, self.lm_head_weight)

    @torch.no_grad()   # integer tokens: no gradient, and max(out=) has no autograd
    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy tokens int32 [...] from final hidden [..., H] (ties to the lower id, as
        ``torch.argmax`` over the full logits).

        The logits come in vocabulary chunks (``launch_plan.argmax_chunk``: one pass while they
        fit ARGMAX_CHUNK_BYTES) so the full [..., V] logits of a big verify never exist at once.
        """
        if exact_ops.exact_enabled():        # the full logits row by row, as decode's argmax sees them
            return exact_ops.argmax(self.logits(hidden))
        w, v = self.lm_head_weight, self.lm_head_weight.shape[0]
        rows = hidden.numel() // max(1, hidden.shape[-1])
        chunk = launch_plan.argmax_chunk(rows, v, hidden.element_size())
        if chunk >= v:
            return torch.argmax(F.linear(hidden, w), dim=-1).to(torch.int32)
        n = -(-v // chunk)
        vals = hidden.new_empty((n, *hidden.shape[:-1]))
        idxs = torch.empty(vals.shape, dtype=torch.int64, device=hidden.device)
        for c in range(n):
            torch.max(F.linear(hidden, w[c * chunk:(c + 1) * chunk]), dim=-1, out=(vals[c], idxs[c]))
        best = torch.argmax(vals, dim=0, keepdim=True)      # the first chunk holding the maximum
        return torch.add(idxs.gather(0, best), best, alpha=chunk).squeeze(0).to(torch.int32)

    def prefill(self, tokens: torch.Tensor, lens: torch.Tensor, cache: KVCache, *, taps=()):
        """Causal forward over right-padded prompts, writing their K/V at slots 0..T-1.

        Parameters
        ----------
        tokens : int [B, T]   prompts, right-padded (padding rows' outputs are ignored)
        lens : int32 [B]      prompt lengths (>= 1)
        cache : KVCache

        Returns
        -------
        last_logits : [B, V] logits at position lens - 1
        tapped : [B, T, len(taps) * H] or None
        """
        b, t = tokens.shape
        dev = tokens.device
        positions = torch.arange(t, device=dev, dtype=torch.int32).expand(b, t).contiguous()
        zero = torch.zeros(b, device=dev, dtype=torch.int32)
        hidden, tapped = self.forward(tokens, positions, cache, zero, taps=taps)
        last = hidden[torch.arange(b, device=dev), lens.long() - 1]
        return self.logits(last), tapped

    def decode(self, tokens: torch.Tensor, prefix_lens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per sequence at position ``prefix_lens`` (its K/V go to that slot).

        Parameters
        ----------
        tokens : int [B]; prefix_lens : int32 [B]; cache : KVCache

        Returns
        -------
        logits : [B, V]
        """
        pos = prefix_lens.to(torch.int32)[:, None].contiguous()
        hidden, _ = self.forward(tokens[:, None], pos, cache, prefix_lens)
        return self.logits(hidden[:, 0])

    def verify(self, tree: Tree, prefix_lens: torch.Tensor, cache: KVCache, *, taps=(),
               fused_argmax: bool = False):
        """Forward all tree nodes: node i at position ``prefix + depth[i]``, K/V in slot ``prefix + i``.

        Parameters
        ----------
        tree : Tree [B, N]; prefix_lens : int32 [B]; cache : KVCache
        taps : layer ids to return
        fused_argmax : return greedy tokens instead of logits

        Returns
        -------
        out : logits [B, N, V], or int32 [B, N] greedy tokens when ``fused_argmax``
        tapped : [B, N, len(taps) * H] or None
        """
        hidden, tapped = self.forward(tree.tokens, tree.positions(prefix_lens), cache, prefix_lens,
                                      write_start=prefix_lens, tree_mask=tree.mask, taps=taps)
        return (self.argmax(hidden) if fused_argmax else self.logits(hidden)), tapped
