"""The ``reference`` backend: the backend interface (CONTRIBUTING.md) over python_ref/.

python_ref computes in float32 (float64 for float64 inputs); this adapter casts results to the
dtypes the public API promises and writes in-place outputs.

python_ref's tree building, attention, verification, mask packing and KV commit read tensor
values on the host (loops over ``.tolist()``), which torch.compile cannot trace: here they are
``torch.library.custom_op``s (namespace ``jetspec_ref``) with fake implementations, opaque to
the compiler as the cuda backend's ops are. The rest (top-K, the norms, RoPE and the append) is
plain torch and compiles (and fuses) as it is.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.library import custom_op

from .. import python_ref as ref
from ..tree import mask_words

_I32 = torch.int32


@custom_op("jetspec_ref::tree_attention", mutates_args=("out", "lse"))
def _tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    prefix_lens: torch.Tensor, tree_mask: Optional[torch.Tensor], tail: str,
                    block_table: Optional[torch.Tensor], scale: float, out: torch.Tensor,
                    lse: Optional[torch.Tensor]) -> None:
    o, l = ref.tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale)
    out.copy_(o)
    if lse is not None:
        lse.copy_(l)


@_tree_attention.register_fake
def _(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse):
    return None


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse):
    _tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, float(scale),
                    out, lse)


def log_softmax_topk(logits, k):
    tokens, logprobs = ref.log_softmax_topk(logits, k)
    return tokens.to(_I32), logprobs.to(torch.float32)


def hidden_topk(hidden, lm_head_weight, k):
    logits = hidden.to(torch.float32) @ lm_head_weight.to(torch.float32).T
    return log_softmax_topk(logits, k)


@custom_op("jetspec_ref::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor, torch.Tensor]:
    t = ref.build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm)
    return (t["tokens"].to(_I32), t["parents"].to(_I32), t["depths"].to(_I32),
            t["scores"].to(torch.float32), t["num_nodes"].to(_I32), t["mask"].to(_I32))


@_build_tree.register_fake
def _(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    b = topk_tokens.shape[0]
    rows = [topk_tokens.new_empty(b, budget, dtype=t) for t in (_I32, _I32, _I32, torch.float32)]
    return (*rows, topk_tokens.new_empty(b, dtype=_I32),
            topk_tokens.new_empty(b, budget, mask_words(budget), dtype=_I32))


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    return _build_tree(topk_tokens, topk_logprobs, root_tokens, int(budget), algorithm)


def draft_tree(logits, k, root_tokens, budget, algorithm):
    return build_tree(*log_softmax_topk(logits, k), root_tokens, budget, algorithm)


@custom_op("jetspec_ref::pack_mask", mutates_args=())
def _pack_mask(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    return ref.pack_mask(parents, num_nodes).to(_I32)


@_pack_mask.register_fake
def _(parents, num_nodes):
    b, n = parents.shape
    return parents.new_empty(b, n, mask_words(n), dtype=_I32)


def pack_mask(parents, num_nodes):
    return _pack_mask(parents, num_nodes)


def rms_norm(x, residual, weight, eps):
    # python_ref.add_rms_norm's Hugging Face form (what the models run on a GPU until an rms_norm
    # kernel is hardware-verified) with its product and cast back as one multiply rounded to x's
    # dtype as it is stored: the same bits, one launch fewer a norm on a GPU (docs/perf/decode_round.md). No
    # autograd here (out=), which ops.rms_norm refuses anyway.
    total = x if residual is None else x + residual
    xf = total.float()
    n = torch.mul(xf, ref.rms_scale(xf, eps), out=torch.empty(total.shape, dtype=x.dtype,
                                                               device=x.device))
    return weight * n, None if residual is None else total.contiguous()


def silu_mul(x):
    return ref.silu_mul(x, x.dtype).contiguous()


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
                        block_table, cache_start, rotary_dim=None):
    q_out = ref.qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                    rope_theta, eps=eps, block_table=block_table,
                                    cache_start=cache_start, rotary_dim=rotary_dim)
    return None if q_out is None else q_out.to(q.dtype)


@custom_op("jetspec_ref::verify_tree", mutates_args=())
def _verify_tree(tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
                 max_depth: int, target_logits: Optional[torch.Tensor],
                 target_tokens: Optional[torch.Tensor], temperature: float,
                 temperatures: Optional[torch.Tensor], seed: Optional[torch.Tensor],
                 offset: Optional[torch.Tensor], top_k: Optional[torch.Tensor],
                 top_p: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                         torch.Tensor]:
    # (the sampling too: inductor's lowering of the hash's integer chain took minutes)
    r = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=target_logits,
                        target_tokens=target_tokens,
                        temperature=temperature if temperatures is None else temperatures,
                        seed=seed, offset=offset, top_k=top_k, top_p=top_p)
    return tuple(r[key].to(_I32) for key in ("accept_len", "path", "bonus", "emitted"))


@_verify_tree.register_fake
def _(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
      temperatures, seed, offset, top_k, top_p):
    b = tokens.shape[0]
    per_seq, rows = tokens.new_empty(b, dtype=_I32), tokens.new_empty(b, max_depth + 1, dtype=_I32)
    return per_seq, rows, per_seq.clone(), rows.clone()


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
                seed, offset, top_k=None, top_p=None):
    tensor = isinstance(temperature, torch.Tensor)   # (a custom op takes a float or a tensor)
    return _verify_tree(tokens, parents, num_nodes, int(max_depth), target_logits, target_tokens,
                        0.0 if tensor else float(temperature), temperature if tensor else None,
                        seed, offset, top_k, top_p)


@custom_op("jetspec_ref::commit_kv", mutates_args=("k_cache", "v_cache"))
def _commit_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
               path: torch.Tensor, accept_len: torch.Tensor, block_table: Optional[torch.Tensor],
               hidden: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    new_lens, rows = ref.commit_kv(k_cache, v_cache, prefix_lens, path, accept_len,
                                   block_table=block_table, hidden=hidden)
    if rows is None:  # (a custom op returns tensors: an empty one stands for None)
        rows = path.new_empty(0)
    return new_lens.to(_I32), rows.to(hidden.dtype) if hidden is not None else rows


@_commit_kv.register_fake
def _(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    rows = path.new_empty(0) if hidden is None else hidden.new_empty(
        hidden.shape[0], path.shape[1], hidden.shape[2])
    return prefix_lens.new_empty(prefix_lens.shape[0], dtype=_I32), rows


def commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    new_lens, rows = _commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table,
                                hidden)
    return new_lens, None if hidden is None else rows



def gated_delta_tree(q, k, v, g, beta, parents, state, state_slots, num_nodes, scale,
                     use_qk_l2norm):
    # The chunked (WY) form: batched matmuls and a triangular solve, no host reads (a CUDA graph
    # holds it), where python_ref.gated_delta_tree walks each path on the host.
    o = ref.gated_delta_tree_chunked(q, k, v, g, beta, parents, state, state_slots=state_slots,
                                     num_nodes=num_nodes, scale=scale,
                                     use_qk_l2norm=use_qk_l2norm)
    return o.to(v.dtype)


def gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots, use_qk_l2norm):
    ref.gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots=state_slots,
                           use_qk_l2norm=use_qk_l2norm)


# The Gated DeltaNet conv ops: python_ref's gather form has no host reads (capturable as it is).
from ..python_ref.causal_conv1d_commit import causal_conv1d_commit as _conv_commit  # noqa: E402
from ..python_ref.causal_conv1d_tree import causal_conv1d_tree as _conv_tree  # noqa: E402


def causal_conv1d_tree(x, parents, conv_state, weight, bias, state_slots, num_nodes, activation):
    return _conv_tree(x, parents, conv_state, weight, bias, state_slots=state_slots,
                      num_nodes=num_nodes, activation=activation).to(x.dtype)


def causal_conv1d_commit(x, path, accept_len, conv_state, state_slots):
    _conv_commit(x, path, accept_len, conv_state, state_slots=state_slots)
