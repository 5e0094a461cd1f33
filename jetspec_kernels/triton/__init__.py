"""The ``triton`` backend: Triton kernels for every op (CONTRIBUTING.md, backend interface).

Runs on CUDA GPUs, and on the CPU under ``TRITON_INTERPRET=1`` (how CI checks the kernels'
logic; the interpreter cannot do ``tl.dot`` in bf16, so CPU tests use fp32 and fp16). One module
per interface function, named after it; the package re-exports each function under that name (so
``jetspec_kernels.triton.verify_tree`` is the function: import a module's other names with
``from jetspec_kernels.triton.verify_tree import ...``). The backend machinery imports this package
only once triton is known to be importable.
"""
from .build_tree import build_tree  # noqa: F401
from .causal_conv1d_commit import causal_conv1d_commit  # noqa: F401
from .causal_conv1d_tree import causal_conv1d_tree  # noqa: F401
from .commit_kv import commit_kv  # noqa: F401
from .draft_tree import draft_tree  # noqa: F401
from .gated_delta_commit import gated_delta_commit  # noqa: F401
from .gated_delta_tree import MAX_HEAD_DIM as GATED_DELTA_MAX_DK
from .gated_delta_tree import gated_delta_tree  # noqa: F401
from .hidden_topk import hidden_topk  # noqa: F401
from .log_softmax_topk import log_softmax_topk  # noqa: F401
from .pack_mask import pack_mask  # noqa: F401
from .qk_norm_rope_append import qk_norm_rope_append  # noqa: F401
from .rms_norm import rms_norm  # noqa: F401
from .silu_mul import silu_mul  # noqa: F401
from .tree_attention import tree_attention  # noqa: F401
from .verify_tree import verify_tree  # noqa: F401

ATTENTION_HEAD_DIMS = (16, 32, 64, 128, 256)


def supports(op: str, **call) -> str | None:
    """None when the triton backend's ``op`` takes these arguments (by name, as in the backend
    interface; absent ones are not checked), else why not."""
    q = call.get("q")
    if op == "tree_attention" and q is not None and q.shape[-1] not in ATTENTION_HEAD_DIMS:
        return (f"tree_attention does not support q head dim {q.shape[-1]} "
                f"(supported: {ATTENTION_HEAD_DIMS})")
    k = call.get("k")
    if op in ("gated_delta_tree", "gated_delta_commit") and k is not None and \
            k.shape[-1] > GATED_DELTA_MAX_DK:
        return f"{op} supports head dims Dk <= {GATED_DELTA_MAX_DK}, got {k.shape[-1]}"
    return None
