"""jetspec_kernels: fused kernels for JetSpec-style tree speculative decoding.

Public API (see DESIGN.md section 4 and each function's docstring):
    draft_tree, draft_tree_from_topk, draft_tree_from_hidden, pack_mask,
    tree_attention, qk_norm_rope_append, rms_norm, silu_mul, verify_tree, commit_kv,
    gated_delta_tree, gated_delta_commit (hybrid targets' Gated DeltaNet layers),
    causal_conv1d_tree, causal_conv1d_commit (hybrid targets' Gated DeltaNet conv),
    Tree, Verdict, Commit,
    AcceptanceCalibrator, CostModel, choose_budget, choose_budget_from_topk,
    expected_accept_curve, expected_accept_curve_from_topk (adaptive tree budget, jetspec_kernels/adaptive/),
    set_backend, get_backend, available_backends, set_value_checks,
    exact_mode, ExactModeError (the exact mode: DESIGN.md, "Exact mode"; jetspec_kernels.ops.exact).
"""
import importlib
import sys

# Where each public name lives. The package imports them (and torch) at the first attribute
# access, all at once, so `jetspec --help` and other torch-free entry points stay fast.
_PUBLIC = {
    ".adaptive": ("AcceptanceCalibrator", "CostModel", "choose_budget", "choose_budget_from_topk",
                  "expected_accept_curve", "expected_accept_curve_from_topk"),
    ".backend": ("BackendUnavailableError", "available_backends", "get_backend", "set_backend"),
    ".checks": ("set_value_checks",),
    ".ops.causal_conv1d_commit": ("causal_conv1d_commit",),
    ".ops.causal_conv1d_tree": ("causal_conv1d_tree",),
    ".ops.commit_kv": ("commit_kv",),
    ".ops.draft_tree": ("draft_tree", "draft_tree_from_hidden", "draft_tree_from_topk"),
    ".ops.exact": ("ExactModeError", "exact_mode"),
    ".ops.gated_delta_commit": ("gated_delta_commit",),
    ".ops.gated_delta_tree": ("gated_delta_tree",),
    ".ops.pack_mask": ("pack_mask",),
    ".ops.qk_norm_rope_append": ("qk_norm_rope_append",),
    ".ops.rms_norm": ("rms_norm",),
    ".ops.silu_mul": ("silu_mul",),
    ".ops.tree_attention": ("tree_attention",),
    ".ops.verify_tree": ("verify_tree",),
    ".tree": ("Commit", "Tree", "Verdict"),
}


def _load_public() -> None:
    for module, names in _PUBLIC.items():
        loaded = importlib.import_module(module, __name__)
        for name in names:
            globals()[name] = getattr(loaded, name)


_NAMES = frozenset(name for names in _PUBLIC.values() for name in names)


def _initializing() -> bool:
    """Whether a module of the package is being imported right now (its code running: the flag
    the import system sets, which its "partially initialized module" error reads)."""
    prefix = __name__ + "."
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for key, module in list(sys.modules.items()) if key.startswith(prefix))


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _NAMES:      # a submodule (``from jetspec_kernels import backend``)
        try:
            module = importlib.import_module("." + name, __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        # A submodule's own ``from .. import backend`` asks here too: loading every public
        # module then would re-enter the half-imported one (a sibling importing from it fails).
        if not _initializing():
            _load_public()
        return module
    _load_public()
    if name in globals():
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    _load_public()
    return sorted(globals())


__version__ = "0.1.0"

__all__ = [
    "AcceptanceCalibrator", "BackendUnavailableError", "Commit", "CostModel", "Tree", "Verdict",
    "available_backends", "causal_conv1d_commit", "causal_conv1d_tree", "choose_budget",
    "choose_budget_from_topk", "commit_kv", "draft_tree", "draft_tree_from_hidden",
    "draft_tree_from_topk", "expected_accept_curve", "gated_delta_commit", "gated_delta_tree", "expected_accept_curve_from_topk", "get_backend",
    "pack_mask", "qk_norm_rope_append", "rms_norm", "set_backend", "silu_mul", "set_value_checks", "tree_attention",
    "verify_tree",
]
