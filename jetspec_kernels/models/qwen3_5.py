"""Qwen3.5 / Qwen3.6 hybrid targets: Gated DeltaNet (linear attention) and gated full-attention
layers, dense or MoE (``model_type`` ``qwen3_5`` / ``qwen3_5_moe``, text part only).

The same interface as :class:`~jetspec_kernels.models.Qwen3`, so the decoding loops run either:
``new_cache``, ``prefill``, ``decode``, ``verify``, ``logits``, ``argmax``, plus
:meth:`Qwen3_5.commit_states`, which the loop calls after ``commit_kv`` to advance the linear
layers' states along the accepted path. Per sequence the target keeps a :class:`HybridCache`:
the attention layers' KV cache and, per linear layer, a conv state and a recurrent state in pools
indexed by state slots.

Full-attention layer (transformers' ``Qwen3_5Attention``): ``q_proj`` gives q and an output gate
per head (``[..., H, 2 Dh]`` split in halves), zero-centred RMSNorm on q and k per head (torch:
the op's norm is Qwen3's form), RoPE on the first ``rotary_dim`` features and the K/V append
(:func:`~jetspec_kernels.qk_norm_rope_append` with its norm off and ``rotary_dim``), attention
over the cache (:func:`~jetspec_kernels.tree_attention`, tree mask when verifying),
``o * sigmoid(gate)``, ``o_proj``. Linear layers: :mod:`.gated_delta`. The MLP is SwiGLU, or routed experts
(:mod:`.moe`) plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from .. import checks, tp
from ..ops import exact as exact_ops
from ..ops.qk_norm_rope_append import qk_norm_rope_append
from ..ops.tree_attention import tree_attention
from ..python_ref.causal_conv1d_tree import conv_window_sources
from ..python_ref.layers import swiglu
from ..tree import Tree, Verdict
from .checkpoint import check_layer_keys, load_safetensors, take
from .config import Qwen3_5Config, read_config
from .gated_delta import linear_commit, linear_layer_shapes, linear_prefill, linear_tree
from .hybrid_exact import (ExactTreeInputs, exact_linear_commit, exact_linear_prompt,
                           exact_linear_tree, sigmoid_gate, zc_norm)
from .kv_cache import KVCache
from .moe import exact_moe, fuse_expert_weights, grouped_experts, moe_shapes, route
from .qwen3 import Qwen3
from .walk_plan import tree_plan

__all__ = ["Qwen3_5", "HybridCache", "hybrid_layer_shapes"]

_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
_SHARED = ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
           "mlp.shared_expert.down_proj.weight")


def hybrid_layer_shapes(cfg: Qwen3_5Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint shapes of layer ``layer``'s tensors (keys after ``layers.{i}.``; MoE experts in
    the fused layout)."""
    h = cfg.hidden_size
    shapes = {key: (h,) for key in _NORMS}
    if cfg.is_linear(layer):
        shapes.update(linear_layer_shapes(cfg))
    else:
        dh, q, kv = cfg.head_dim, cfg.num_attention_heads * cfg.head_dim, \
            cfg.num_key_value_heads * cfg.head_dim
        shapes.update({"self_attn.q_proj.weight": (2 * q, h), "self_attn.k_proj.weight": (kv, h),
                       "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
                       "self_attn.q_norm.weight": (dh,), "self_attn.k_norm.weight": (dh,)})
    if cfg.moe:
        shapes.update(moe_shapes(cfg.num_experts, h, cfg.moe_intermediate_size))
        si = cfg.shared_expert_intermediate_size
        if si:
            shapes.update({_SHARED[0]: (si, h), _SHARED[1]: (si, h), _SHARED[2]: (h, si),
                           "mlp.shared_expert_gate.weight": (1, h)})
    else:
        i = cfg.intermediate_size
        shapes.update({"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
                       "mlp.down_proj.weight": (h, i)})
    return shapes


def _check_tp(cfg: Qwen3_5Config, n: int, where: str) -> None:
    """tp ``n`` must divide every head count and every MLP size (each rank holds whole heads)."""
    fields = ["num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
              "linear_num_value_heads"]
    fields += (["moe_intermediate_size", "shared_expert_intermediate_size"] if cfg.moe
               else ["intermediate_size"])
    for name in fields:
        if getattr(cfg, name) % n:
            raise ValueError(f"{where}: tp={n} must divide {name} ({getattr(cfg, name)}): each rank "
                             "holds whole heads and an equal part of each MLP")


def _rows(t: torch.Tensor, shard: tp.Shard, blocks: list[int]) -> torch.Tensor:
    """This rank's part of each of the consecutive blocks (sizes ``blocks``) of dim 0 (the sizes
    are multiples of tp: :func:`_check_tp`)."""
    parts = []
    for part in t.split(blocks, dim=0):
        step = part.shape[0] // shard.size
        parts.append(part[shard.rank * step:(shard.rank + 1) * step])
    return torch.cat(parts).contiguous()


_COLWISE = {"self_attn.q_proj.weight": 1, "self_attn.k_proj.weight": 1, "self_attn.v_proj.weight": 1,
            "linear_attn.in_proj_z.weight": 1, "linear_attn.in_proj_b.weight": 1,
            "linear_attn.in_proj_a.weight": 1, "mlp.gate_proj.weight": 1, "mlp.up_proj.weight": 1,
            "mlp.experts.gate_up_proj": 2, _SHARED[0]: 1, _SHARED[1]: 1}
_ROWWISE = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight", "mlp.down_proj.weight",
            "mlp.experts.down_proj", _SHARED[2])


def _shard_layer(w: dict, cfg: Qwen3_5Config, shard: tp.Shard) -> dict:
    """One layer's tensors with this rank's part of each split one (the dict itself alone). A q
    head's rows in q_proj are its q then its gate, so whole heads keep their gates."""
    if not shard.parallel:
        return w
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    qkv = [kd, kd, cfg.linear_num_value_heads * cfg.linear_value_head_dim]
    out = {}
    for key, t in w.items():
        if key in _COLWISE:
            out[key] = tp.colwise(t, shard, blocks=_COLWISE[key], what=key)
        elif key in _ROWWISE:
            out[key] = tp.rowwise(t, shard, what=key)
        elif key in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            out[key] = _rows(t, shard, qkv)
        elif key in ("linear_attn.A_log", "linear_attn.dt_bias"):
            out[key] = _rows(t, shard, [t.shape[0]])
        else:
            out[key] = t
    return out


@dataclass
class HybridCache:
    """A hybrid target's per-sequence state.

    Attributes
    ----------
    kv : KVCache of the full-attention layers (``kv.layer(j)``: the j-th attention layer)
    conv : per linear layer, [S, C, W - 1] in the model dtype (the last W - 1 conv inputs)
    recurrent : per linear layer, float32 [S, Hv, Dk, Dv]
    slots : int32 [B], each sequence's slot in the pools
    pending : per linear layer, the last verified tree's inputs (:class:`.gated_delta.TreeInputs`,
        or in the exact mode :class:`.hybrid_exact.ExactTreeInputs`), which
        :meth:`Qwen3_5.commit_states` reads (with the commit of the mode that verified)
    """

    kv: KVCache
    conv: list
    recurrent: list
    slots: torch.Tensor
    pending: list = field(default_factory=list)

    # commit_kv and the loops read the KV cache through these.
    @property
    def k(self) -> torch.Tensor:
        return self.kv.k

    @property
    def v(self) -> torch.Tensor:
        return self.kv.v

    @property
    def block_table(self):
        return self.kv.block_table

    @property
    def capacity(self) -> int:
        return self.kv.capacity


def _zc_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' zero-centred ``Qwen3_5RMSNorm``: ``normed(x in float32) * (1 + weight)``,
    cast back to x's dtype."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return out.to(x.dtype)


class Qwen3_5:
    """A Qwen3.5 / Qwen3.6 hybrid decoder with its caches, prefill, decode and tree verification.

    Attributes
    ----------
    config : Qwen3_5Config
    embed_weight, lm_head_weight : [V, H] (the same tensor when embeddings are tied)
    layers : list of dicts key -> tensor (:func:`hybrid_layer_shapes`)
    norm_weight : [H] (zero-centred: the norm multiplies by ``1 + norm_weight``)
    shard : tp.Shard, the tensor-parallel group the layers are split over (``tp.ALONE``: not
        split). Split, each rank holds whole heads: the attention layers' q (with its gate), k, v
        heads and o_proj's columns, as :class:`Qwen3`; the linear layers' q/k heads and v heads
        (in_proj_qkv and the conv's channels in their three blocks, z, b, a, A_log, dt_bias) and
        out_proj's columns; the MLP as :class:`Qwen3`'s (experts split inside each expert, the
        shared expert too, router and shared-expert gate replicated). One all-reduce after each
        mixer and one after each MLP; the state pools hold the rank's heads
    experts_grouped_mm : as :attr:`Qwen3.experts_grouped_mm`
    exact_gemm_tile, exact_k_parts : the exact mode's GEMM tile and split of K, as
        :class:`Qwen3`'s (the row-parallel GEMMs here: out_proj, o_proj, the MLP's, the shared
        expert's and the experts' down projections)
    """

    experts_grouped_mm: bool | None = None
    fused_ops_backend: str | None = None      # read by the loops; the hybrid's norms are torch
    exact_gemm_tile: str = "narrow"           # the exact mode's GEMM tile, as Qwen3's
    exact_k_parts: int | None = None          # the exact mode's parts of K, as Qwen3's

    def __init__(self, config: Qwen3_5Config, weights: dict[str, torch.Tensor], *,
                 where: str = "Qwen3_5", group=None):
        """Take the tensors of a checkpoint: keys under ``model.language_model.`` (multimodal
        checkpoints; their vision tower and MTP tensors are ignored), ``model.`` or none. MoE
        experts per expert or fused, as for :class:`Qwen3`. ``group``: the tensor-parallel process
        group, as for :class:`Qwen3` (a tp that does not divide every head count and MLP size is a
        ``ValueError`` naming the field)."""
        self.config = cfg = config
        self.shard = shard = tp.shard_of(group)
        if shard.parallel:
            _check_tp(cfg, shard.size, where)
        prefix = next((p for p in ("model.language_model.", "model.", "")
                       if p + "embed_tokens.weight" in weights), "model.")
        weights = dict(weights)
        if cfg.moe:
            for i in range(cfg.num_hidden_layers):
                fuse_expert_weights(weights, f"{prefix}layers.{i}.", cfg.num_experts,
                                    cfg.hidden_size, cfg.moe_intermediate_size, where)
        v, h = cfg.vocab_size, cfg.hidden_size
        self.embed_weight = take(weights, prefix + "embed_tokens.weight", (v, h), where)
        self.norm_weight = take(weights, prefix + "norm.weight", (h,), where)
        self.lm_head_weight = self.embed_weight if cfg.tie_word_embeddings else \
            take(weights, "lm_head.weight", (v, h), where)
        shapes = [hybrid_layer_shapes(cfg, i) for i in range(cfg.num_hidden_layers)]
        self.layers = [_shard_layer({key: take(weights, f"{prefix}layers.{i}.{key}", shape, where)
                                     for key, shape in shapes[i].items()}, cfg, shard)
                       for i in range(cfg.num_hidden_layers)]
        check_layer_keys(weights, prefix + "layers.", cfg.num_hidden_layers, lambda i: shapes[i], where)
        n = shard.size       # the layers' shapes on this rank
        self._local = replace(cfg, num_attention_heads=cfg.num_attention_heads // n,
                              num_key_value_heads=cfg.num_key_value_heads // n,
                              linear_num_key_heads=cfg.linear_num_key_heads // n,
                              linear_num_value_heads=cfg.linear_num_value_heads // n)
        self.linear_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_linear(i)]
        self.attention_layers = [i for i in range(cfg.num_hidden_layers) if not cfg.is_linear(i)]

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", group=None) -> "Qwen3_5":
        """Load a Hugging Face ``qwen3_5`` / ``qwen3_5_moe`` checkpoint directory (the text model
        of a multimodal one)."""
        cfg = Qwen3_5Config.from_dict(read_config(path), f"target config {os.path.join(path, 'config.json')}")
        shard = tp.shard_of(group)
        weights = load_safetensors(path, dtype=dtype, device="cpu" if shard.parallel else device)
        model = cls(cfg, weights, where=f"target checkpoint {path}", group=shard)
        del weights
        if shard.parallel:     # every rank read the whole checkpoint on the host; keeps its part
            tied = model.lm_head_weight is model.embed_weight
            model.embed_weight = model.embed_weight.to(device)
            model.norm_weight = model.norm_weight.to(device)
            model.lm_head_weight = model.embed_weight if tied else model.lm_head_weight.to(device)
            model.layers = [{k: t.to(device) for k, t in layer.items()} for layer in model.layers]
        return model

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    check_taps = Qwen3.check_taps
    logits = Qwen3.logits
    argmax = Qwen3.argmax

    def new_cache(self, batch: int, capacity: int, *, page_size: int | None = None,
                  pool_size: int | None = None, slots: torch.Tensor | None = None) -> HybridCache:
        """Empty caches for ``batch`` sequences of up to ``capacity`` positions: the attention
        layers' KV cache (paged when ``page_size`` is given) and state pools of ``pool_size``
        slots (default ``batch``), sequence b in slot ``slots[b]`` (default b); split, the rank's
        heads."""
        c = self._local
        pool = batch if pool_size is None else pool_size
        if slots is None:
            if pool < batch:
                raise ValueError(f"pool_size ({pool}) must be >= batch ({batch}) when slots is None")
            slots = torch.arange(batch, dtype=torch.int32, device=self.device)
        elif not (torch.is_tensor(slots) and slots.dtype == torch.int32 and slots.shape == (batch,)):
            raise TypeError(f"slots must be an int32 tensor of shape [{batch}], got {slots!r}")
        kv = KVCache.allocate(max(1, len(self.attention_layers)), batch, capacity,
                              c.num_key_value_heads, c.head_dim, dtype=self.dtype,
                              device=self.device, page_size=page_size)
        width = c.linear_conv_kernel_dim - 1
        conv = [torch.zeros(pool, c.conv_dim, width, dtype=self.dtype, device=self.device)
                for _ in self.linear_layers]
        rec = [torch.zeros(pool, c.linear_num_value_heads, c.linear_key_head_dim,
                           c.linear_value_head_dim, dtype=torch.float32, device=self.device)
               for _ in self.linear_layers]
        return HybridCache(kv, conv, rec, slots.to(self.device), [None] * len(self.linear_layers))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: HybridCache,
                attn_prefix: torch.Tensor, *, write_start: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, parents: torch.Tensor | None = None,
                num_nodes: torch.Tensor | None = None, prompt_lens: torch.Tensor | None = None,
                max_depth: int | None = None, taps=()):
        """Run N new tokens per sequence.

        Two modes. Prompt (``prompt_lens`` given): right-padded prompts from empty states, K/V at
        slots 0..N-1, each linear layer's states written after ``prompt_lens[b]`` tokens. Tree
        (``parents`` given, a chain or a draft tree): the nodes from the committed states, K/V at
        ``write_start + n`` (or ``positions``), attention under ``tree_mask`` (None: causal); the
        linear layers' states are left as they are and the nodes' inputs kept in
        ``cache.pending`` for :meth:`commit_states`. ``max_depth``: a bound on the tree's depth
        (``Tree.max_depth``; None: N's), which sizes the exact triton walk's scratch.

        Returns ``(hidden [B, N, H] final-normed, tapped [B, N, len(taps) * H] or None)``.
        Inside ``exact_mode()``: :meth:`_forward_exact`.
        """
        if (prompt_lens is None) == (parents is None):
            raise ValueError("forward: give exactly one of prompt_lens (a prompt) and parents (a tree)")
        if max_depth is not None:
            checks.integer("max_depth", max_depth, lo=0)
        if exact_ops.exact_enabled():
            return self._forward_exact(tokens, positions, cache, attn_prefix, write_start,
                                       tree_mask, parents, num_nodes, prompt_lens, max_depth, taps)
        cfg = self._local
        eps = cfg.rms_norm_eps
        reduce = self._reduce
        taps = list(taps)
        kept: dict[int, torch.Tensor] = {}
        x = F.embedding(tokens.long(), self.embed_weight)
        lin = {layer: j for j, layer in enumerate(self.linear_layers)}
        att = {layer: j for j, layer in enumerate(self.attention_layers)}
        for li, w in enumerate(self.layers):
            a = _zc_norm(x, w["input_layernorm.weight"], eps)
            if li in lin:
                j = lin[li]
                if prompt_lens is not None:
                    out = linear_prefill(a, w, cfg, prompt_lens, cache.conv[j], cache.recurrent[j],
                                         cache.slots, eps)
                else:
                    out, cache.pending[j] = linear_tree(a, w, cfg, parents, num_nodes, cache.conv[j],
                                                        cache.recurrent[j], cache.slots, eps)
            else:
                out = self._attention(a, w, positions, cache, att[li], attn_prefix, write_start,
                                      tree_mask)
            x = x + reduce(out)
            x = x + reduce(self._mlp(_zc_norm(x, w["post_attention_layernorm.weight"], eps), w))
            if li in taps:
                kept[li] = x
        tapped = torch.cat([kept[t] for t in taps], dim=-1) if taps else None
        return _zc_norm(x, self.norm_weight, eps), tapped

    def _forward_exact(self, tokens, positions, cache, attn_prefix, write_start, tree_mask,
                       parents, num_nodes, prompt_lens, max_depth, taps):
        """:meth:`forward` in the exact mode (``ops.exact.exact_mode``): a token's bits depend
        only on its own token, position and logical past, never on B, N, the tree or the other
        rows. The linear layers step every token as a one-token decode would
        (:mod:`.hybrid_exact`: a prompt as a chain, a tree node from its parent's state);
        the GEMMs are ``ops.exact.linear`` (the row-parallel ones in ``exact_k_parts`` parts,
        summed across the ranks by ``tp.all_reduce_pairwise``), attention
        ``tree_attention(exact=True)``, the MoE block ``exact_moe``, and every norm, gate and
        activation a one-row call (``ops.exact.per_row``) on the reference or a program per row on
        triton (:mod:`.hybrid_exact`)."""
        be = exact_ops.exact_backend("Qwen3_5.forward", self.device, self.fused_ops_backend)
        if self.exact_gemm_tile not in exact_ops.GEMM_TILES:
            raise ValueError(f"exact_gemm_tile must be one of {exact_ops.GEMM_TILES}, got "
                             f"{self.exact_gemm_tile!r}")
        cfg = self._local
        eps = cfg.rms_norm_eps
        local = self.resolved_exact_k_parts() // self.shard.size

        def linear(x, weight):
            return exact_ops.linear(x, weight, backend=be, tile=self.exact_gemm_tile)

        def row_linear(x, weight):      # out_proj, o_proj, down: K in whole parts, ranks summed
            if not self.shard.parallel:
                return exact_ops.linear(x, weight, backend=be, parts=local)
            share = exact_ops.linear(x, weight, backend=be, parts=local, partial=True)
            return tp.all_reduce_pairwise(share, self.shard, self.dtype)

        def norm(x, weight):
            return zc_norm(x, weight, eps, be)

        taps = list(taps)
        kept: dict[int, torch.Tensor] = {}
        x = F.embedding(tokens.long(), self.embed_weight)           # a gather: exact
        # the tree's conv taps (rows of each layer's conv state + inputs): one table a forward,
        # built when the first layer has checked the parents
        src = functools.cache(lambda: conv_window_sources(parents, cfg.linear_conv_kernel_dim))
        plan = functools.cache(lambda: tree_plan(parents, num_nodes, max_depth))
        lin = {layer: j for j, layer in enumerate(self.linear_layers)}
        att = {layer: j for j, layer in enumerate(self.attention_layers)}
        for li, w in enumerate(self.layers):
            a = norm(x, w["input_layernorm.weight"])
            if li in lin:
                j = lin[li]
                if prompt_lens is not None:
                    out = exact_linear_prompt(a, w, cfg, prompt_lens, cache.conv[j],
                                              cache.recurrent[j], cache.slots, eps, linear,
                                              row_linear, be)
                else:
                    out, cache.pending[j] = exact_linear_tree(
                        a, w, cfg, parents, src, plan, num_nodes, cache.conv[j],
                        cache.recurrent[j], cache.slots, eps, linear, row_linear, be)
            else:
                out = self._attention_exact(a, w, positions, cache, att[li], attn_prefix,
                                            write_start, tree_mask, be, linear, row_linear)
            # A sum is correctly rounded element by element (IEEE), whatever the vector width:
            # its bits follow its operands alone, so no row loop is needed for the residual adds.
            x = x + out
            x = x + self._mlp_exact(norm(x, w["post_attention_layernorm.weight"]), w, be, linear,
                                    row_linear, local)
            if li in taps:
                kept[li] = x
        tapped = torch.cat([kept[t] for t in taps], dim=-1) if taps else None
        return norm(x, self.norm_weight), tapped

    def _attention_exact(self, a, w, positions, cache, j, attn_prefix, write_start, tree_mask,
                         be, linear, row_linear):
        """:meth:`_attention` in the exact mode (see :meth:`_forward_exact`)."""
        cfg = self.config
        b, n, _ = a.shape
        dh, eps = cfg.head_dim, cfg.rms_norm_eps
        q, gate = linear(a, w["self_attn.q_proj.weight"]).view(b, n, -1, 2 * dh).chunk(2, dim=-1)
        q = zc_norm(q, w["self_attn.q_norm.weight"], eps, be)
        k = zc_norm(linear(a, w["self_attn.k_proj.weight"]).view(b, n, -1, dh),
                    w["self_attn.k_norm.weight"], eps, be)
        v = linear(a, w["self_attn.v_proj.weight"]).view(b, n, -1, dh)
        kc, vc = cache.kv.layer(j)
        q = exact_ops.qk_norm_rope_append(q, k, v, None, None, positions, kc, vc,
                                          rope_theta=cfg.rope_theta, block_table=cache.block_table,
                                          cache_start=write_start, rotary_dim=cfg.rotary_dim,
                                          backend=be)
        o = tree_attention(q, kc, vc, attn_prefix, tree_mask, tail="causal",
                           block_table=cache.block_table, exact=True, backend=be)
        o = sigmoid_gate(o.reshape(b, n, -1), gate.reshape(b, n, -1), be)
        return row_linear(o, w["self_attn.o_proj.weight"])

    def _mlp_exact(self, a, w, be, linear, row_linear, parts):
        """:meth:`_mlp` in the exact mode: SwiGLU, or ``exact_moe`` plus the gated shared expert,
        the shared expert's down projection and the experts' in ``parts`` parts of K each
        (their shares summed across the ranks before each is rounded). At tp > 1 without
        ``exact_k_parts`` the block's [T, H] partial sums are summed across the ranks instead
        (tp's own bits, as Qwen3's: one gather of T rows, not of the T k rows' shares)."""
        def swiglu_exact(x, gate_w, up_w, down_w, down):
            h = exact_ops.silu_mul(torch.cat([linear(x, gate_w), linear(x, up_w)], dim=-1),
                                   backend=be)
            return down(h, down_w)
        if "mlp.gate.weight" not in w:
            return swiglu_exact(a, w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"],
                                w["mlp.down_proj.weight"], row_linear)
        cfg = self.config
        flat = a.reshape(-1, a.shape[-1])
        share_sum = functools.partial(tp.all_reduce_pairwise, shard=self.shard, dtype=self.dtype)
        block_partial = self.shard.parallel and self.exact_k_parts is None
        out = exact_moe(flat, w["mlp.gate.weight"], w["mlp.experts.gate_up_proj"],
                        w["mlp.experts.down_proj"], cfg.num_experts_per_tok, True, be, parts=parts,
                        reduce=share_sum if self.shard.parallel and not block_partial else None)
        if _SHARED[0] in w:
            shared = swiglu_exact(flat, *(w[key] for key in _SHARED),
                                  linear if block_partial else row_linear)
            gate = linear(flat, w["mlp.shared_expert_gate.weight"])
            out = sigmoid_gate(shared, gate, be, base=out)
        return (share_sum(out) if block_partial else out).view_as(a)

    _run_layers = property(lambda self: self.layers)     # read by resolved_exact_k_parts
    _ROW_PARALLEL_KEYS = _ROWWISE
    resolved_exact_k_parts = Qwen3.resolved_exact_k_parts

    def _attention(self, a, w, positions, cache, j, attn_prefix, write_start, tree_mask):
        cfg = self.config
        b, n, _ = a.shape
        dh, rd, eps = cfg.head_dim, cfg.rotary_dim, cfg.rms_norm_eps
        q, gate = F.linear(a, w["self_attn.q_proj.weight"]).view(b, n, -1, 2 * dh).chunk(2, dim=-1)
        q = _zc_norm(q, w["self_attn.q_norm.weight"], eps)
        k = _zc_norm(F.linear(a, w["self_attn.k_proj.weight"]).view(b, n, -1, dh),
                     w["self_attn.k_norm.weight"], eps)
        v = F.linear(a, w["self_attn.v_proj.weight"]).view(b, n, -1, dh)
        kc, vc = cache.kv.layer(j)
        # The norms above (zero-centred, not the op's Qwen3 form); the op rotates and appends.
        q = qk_norm_rope_append(q.contiguous(), k.contiguous(), v, None, None, positions, kc, vc,
                                rope_theta=cfg.rope_theta, block_table=cache.block_table,
                                cache_start=write_start, rotary_dim=rd)
        o = tree_attention(q, kc, vc, attn_prefix, tree_mask, tail="causal",
                           block_table=cache.block_table)
        o = o.reshape(b, n, -1) * torch.sigmoid(gate.reshape(b, n, -1))
        return F.linear(o, w["self_attn.o_proj.weight"])

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum this rank's partial output over the tensor-parallel group (alone: ``x``)."""
        return tp.all_reduce(x, self.shard)

    def _mlp(self, a: torch.Tensor, w: dict) -> torch.Tensor:
        """SwiGLU, or routed experts plus the gated shared expert (transformers'
        ``Qwen3_5MoeSparseMoeBlock``)."""
        if "mlp.gate.weight" not in w:
            return swiglu(a, w)
        cfg = self.config
        flat = a.reshape(-1, a.shape[-1])
        weights, experts = route(flat, w["mlp.gate.weight"], cfg.num_experts_per_tok, True)
        out = grouped_experts(flat, weights, experts, w["mlp.experts.gate_up_proj"],
                              w["mlp.experts.down_proj"], grouped_mm=self.experts_grouped_mm)
        if _SHARED[0] in w:
            shared = swiglu(flat, {"mlp." + key.split(".", 2)[2]: w[key] for key in _SHARED})
            out = out + torch.sigmoid(F.linear(flat, w["mlp.shared_expert_gate.weight"])) * shared
        return out.view_as(a)

    def prefill(self, tokens: torch.Tensor, lens: torch.Tensor, cache: HybridCache, *, taps=()):
        """Right-padded prompts ``tokens [B, T]`` of lengths ``lens`` (int32 [B], >= 1) from
        empty states (as :meth:`Qwen3.prefill`). Returns ``(logits [B, V] at lens - 1, tapped)``."""
        b, t = tokens.shape
        dev = tokens.device
        positions = torch.arange(t, device=dev, dtype=torch.int32).expand(b, t).contiguous()
        zero = torch.zeros(b, device=dev, dtype=torch.int32)
        hidden, tapped = self.forward(tokens, positions, cache, zero, prompt_lens=lens, taps=taps)
        return self.logits(hidden[torch.arange(b, device=dev), lens.long() - 1]), tapped

    def decode(self, tokens: torch.Tensor, prefix_lens: torch.Tensor, cache: HybridCache) -> torch.Tensor:
        """One token per sequence at position ``prefix_lens``: a one-node tree, committed.
        Returns logits [B, V]."""
        b, dev = tokens.shape[0], tokens.device
        pos = prefix_lens.to(torch.int32)[:, None].contiguous()
        root = torch.full((b, 1), -1, dtype=torch.int32, device=dev)
        hidden, _ = self.forward(tokens[:, None], pos, cache, prefix_lens, parents=root)
        zeros = torch.zeros(b, dtype=torch.int32, device=dev)
        self._commit(cache, zeros[:, None].contiguous(), zeros)
        return self.logits(hidden[:, 0])

    def verify(self, tree: Tree, prefix_lens: torch.Tensor, cache: HybridCache, *, taps=(),
               fused_argmax: bool = False):
        """Forward every tree node (as :meth:`Qwen3.verify`); the linear layers keep the tree's
        inputs for :meth:`commit_states`. Returns ``(logits [B, N, V] or greedy int32 [B, N],
        tapped)``."""
        hidden, tapped = self.forward(tree.tokens, tree.positions(prefix_lens), cache, prefix_lens,
                                      write_start=prefix_lens, tree_mask=tree.mask,
                                      parents=tree.parents, num_nodes=tree.num_nodes,
                                      max_depth=tree.max_depth, taps=taps)
        return (self.argmax(hidden) if fused_argmax else self.logits(hidden)), tapped

    def commit_states(self, cache: HybridCache, verdict: Verdict) -> None:
        """After :meth:`verify` (and ``commit_kv`` for the attention layers): advance every linear
        layer's conv and recurrent states along ``verdict.path[b, :accept_len[b] + 1]`` (in
        place, from the tree's kept inputs: no forward recomputed; the exact mode replays the
        accepted nodes' recurrent steps; no host sync but on the exact reference)."""
        if not isinstance(verdict, Verdict):
            raise TypeError(f"verdict must be a jetspec_kernels.Verdict, got {type(verdict).__name__}")
        self._commit(cache, verdict.path, verdict.accept_len)

    def _commit(self, cache: HybridCache, path: torch.Tensor, accept_len: torch.Tensor) -> None:
        if any(p is None for p in cache.pending):
            raise ValueError("commit_states: no verified tree to commit (call verify first)")
        for j in range(len(self.linear_layers)):
            # the commit of the mode that verified the tree (its steps' arithmetic)
            commit = exact_linear_commit if isinstance(cache.pending[j], ExactTreeInputs) \
                else linear_commit
            commit(cache.pending[j], path, accept_len, cache.conv[j], cache.recurrent[j],
                   cache.slots)
            cache.pending[j] = None
