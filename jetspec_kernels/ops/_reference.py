"""The ``reference`` backend: the backend interface (CONTRIBUTING.md) over python_ref/.

python_ref computes in float32 (float64 for float64 inputs); this adapter casts results to the
dtypes the public API promises and writes in-place outputs.
"""
from __future__ import annotations

import torch

from .. import python_ref as ref

_I32 = torch.int32


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse):
    o, l = ref.tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale)
    out.copy_(o)
    if lse is not None:
        lse.copy_(l)


def log_softmax_topk(logits, k):
    tokens, logprobs = ref.log_softmax_topk(logits, k)
    return tokens.to(_I32), logprobs.to(torch.float32)


def hidden_topk(hidden, lm_head_weight, k):
    logits = hidden.to(torch.float32) @ lm_head_weight.to(torch.float32).T
    return log_softmax_topk(logits, k)


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    t = ref.build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm)
    return (t["tokens"].to(_I32), t["parents"].to(_I32), t["depths"].to(_I32),
            t["scores"].to(torch.float32), t["num_nodes"].to(_I32), t["mask"].to(_I32))


def draft_tree(logits, k, root_tokens, budget, algorithm):
    return build_tree(*log_softmax_topk(logits, k), root_tokens, budget, algorithm)


def pack_mask(parents, num_nodes):
    return ref.pack_mask(parents, num_nodes).to(_I32)


def rms_norm(x, residual, weight, eps):
    # python_ref.add_rms_norm's Hugging Face form (what the models run on a GPU until an rms_norm
    # kernel is hardware-verified) with its product and cast back as one multiply rounded to x's
    # dtype as it is stored: the same bits, one launch fewer a norm on a GPU (bench/NOTES.md). No
    # autograd here (out=), which ops.rms_norm refuses anyway.
    total = x if residual is None else x + residual
    xf = total.float()
    n = torch.mul(xf, ref.rms_scale(xf, eps), out=torch.empty(total.shape, dtype=x.dtype,
                                                               device=x.device))
    return weight * n, None if residual is None else total.contiguous()


def silu_mul(x):
    return ref.silu_mul(x, x.dtype).contiguous()


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
                        block_table, cache_start):
    q_out = ref.qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                    rope_theta, eps=eps, block_table=block_table,
                                    cache_start=cache_start)
    return None if q_out is None else q_out.to(q.dtype)


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
                seed, offset, top_k=None, top_p=None):
    r = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=target_logits,
                        target_tokens=target_tokens, temperature=temperature, seed=seed,
                        offset=offset, top_k=top_k, top_p=top_p)
    return tuple(r[key].to(_I32) for key in ("accept_len", "path", "bonus", "emitted"))


def commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    new_lens, rows = ref.commit_kv(k_cache, v_cache, prefix_lens, path, accept_len,
                                   block_table=block_table, hidden=hidden)
    return new_lens.to(_I32), (None if rows is None else rows.to(hidden.dtype))


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
