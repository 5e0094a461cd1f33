"""jetspec_kernels: fused kernels for JetSpec-style tree speculative decoding.

Public API (see DESIGN.md section 4 and each function's docstring):
    draft_tree, draft_tree_from_topk, draft_tree_from_hidden, pack_mask,
    tree_attention, qk_norm_rope_append, rms_norm, silu_mul, verify_tree, commit_kv,
    gated_delta_tree, gated_delta_commit (hybrid targets' Gated DeltaNet layers),
    causal_conv1d_tree, causal_conv1d_commit (hybrid targets' Gated DeltaNet conv),
    Tree, Verdict, Commit,
    AcceptanceCalibrator, CostModel, choose_budget, choose_budget_from_topk,
    expected_accept_curve, expected_accept_curve_from_topk (adaptive tree budget, jetspec_kernels/adaptive/),
    set_backend, get_backend, available_backends, set_value_checks.
"""
from .adaptive import (AcceptanceCalibrator, CostModel, choose_budget, choose_budget_from_topk,
                       expected_accept_curve, expected_accept_curve_from_topk)
from .backend import BackendUnavailableError, available_backends, get_backend, set_backend
from .checks import set_value_checks
from .ops.causal_conv1d_commit import causal_conv1d_commit
from .ops.causal_conv1d_tree import causal_conv1d_tree
from .ops.commit_kv import commit_kv
from .ops.draft_tree import draft_tree, draft_tree_from_hidden, draft_tree_from_topk
from .ops.gated_delta_commit import gated_delta_commit
from .ops.gated_delta_tree import gated_delta_tree
from .ops.pack_mask import pack_mask
from .ops.qk_norm_rope_append import qk_norm_rope_append
from .ops.rms_norm import rms_norm
from .ops.silu_mul import silu_mul
from .ops.tree_attention import tree_attention
from .ops.verify_tree import verify_tree
from .tree import Commit, Tree, Verdict

__version__ = "0.1.0"

__all__ = [
    "AcceptanceCalibrator", "BackendUnavailableError", "Commit", "CostModel", "Tree", "Verdict",
    "available_backends", "causal_conv1d_commit", "causal_conv1d_tree", "choose_budget",
    "choose_budget_from_topk", "commit_kv", "draft_tree", "draft_tree_from_hidden",
    "draft_tree_from_topk", "expected_accept_curve", "gated_delta_commit", "gated_delta_tree", "expected_accept_curve_from_topk", "get_backend",
    "pack_mask", "qk_norm_rope_append", "rms_norm", "set_backend", "silu_mul", "set_value_checks", "tree_attention",
    "verify_tree",
]
