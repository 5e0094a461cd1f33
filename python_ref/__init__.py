"""python_ref: pure-PyTorch reference implementations, the specification of jetspec_kernels in code.

Written for clarity (loops allowed); computes in float64 when given float64 tensors, float32
otherwise, and returns results in that compute dtype. Never imports ``jetspec_kernels``.
See docs/DESIGN.md (what each op computes) and CONTRIBUTING.md (signatures, conventions).
"""

from .log_softmax_topk import log_softmax_topk
from .build_tree import build_tree, implicit_tree_size
from .draft_tree import draft_tree
from .pack_mask import pack_mask, unpack_mask, dense_mask, ancestors
from .tree_attention import tree_attention
from .rms_norm import rms_norm, rms_scale, add_rms_norm
from .qk_norm_rope_append import rope_inv_freq, rope_cos_sin, apply_rope, qk_norm_rope_append
from .silu_mul import silu_mul
from .verify_tree import mix32, gumbel_uniform, sample_tokens, verify_tree
from .sampling import token_masses, filter_keep
from .commit_kv import commit_kv
from .layers import layer_weights, swiglu, qk_norm_rope, decoder_layer
from .draft_head import draft_head_forward, target_layer_ids
from .gated_delta_tree import gated_delta_tree, gated_delta_tree_chunked, gated_delta_step, l2norm, ancestor_mask
from .gated_delta_commit import gated_delta_commit
from .causal_conv1d_tree import causal_conv1d_tree, conv_window_sources
from .causal_conv1d_commit import causal_conv1d_commit

__all__ = [
    "log_softmax_topk",
    "build_tree",
    "draft_tree",
    "pack_mask",
    "unpack_mask",
    "dense_mask",
    "ancestors",
    "implicit_tree_size",
    "tree_attention",
    "rms_norm",
    "rms_scale",
    "add_rms_norm",
    "rope_inv_freq",
    "rope_cos_sin",
    "apply_rope",
    "qk_norm_rope_append",
    "mix32",
    "gumbel_uniform",
    "sample_tokens",
    "verify_tree",
    "token_masses",
    "filter_keep",
    "commit_kv",
    "layer_weights",
    "silu_mul",
    "swiglu",
    "qk_norm_rope",
    "decoder_layer",
    "draft_head_forward",
    "target_layer_ids",
    "gated_delta_tree",
    "gated_delta_tree_chunked",
    "gated_delta_step",
    "l2norm",
    "ancestor_mask",
    "gated_delta_commit",
    "causal_conv1d_tree",
    "conv_window_sources",
    "causal_conv1d_commit",
]
