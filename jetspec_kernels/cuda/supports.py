"""What the cuda backend can run: the one place that answers it (backend.select asks here).

``supports(op, **call)`` takes the interface function's arguments by name (CONTRIBUTING.md,
backend interface; extra ones are ignored, absent ones are not checked) and returns None when the
cuda kernels take the call, else the reason. The limits are _C's (csrc/include/jetspec/limits.h).
"""
from __future__ import annotations

import os

from .. import checks
from ..checks import misaligned_rows
from . import extension as ext


def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _half(op: str, t) -> str | None:
    if _dtype(t) not in ("float16", "bfloat16"):
        return f"{op} needs float16/bfloat16 inputs, got {_dtype(t)}"
    return None


def _aligned(op: str, **tensors) -> str | None:
    align = ext.limit("row_align_bytes")
    for name, t in tensors.items():
        if t is not None and misaligned_rows(t, align):
            return (f"{op} needs {name} rows on {align}-byte boundaries, got strides "
                    f"{tuple(t.stride())} and storage offset {t.storage_offset()}")
    return None


def attention_kernel(kernel: str | None) -> str:
    """The attention kernel a call asks for: ``kernel``, else ``JETSPEC_ATTN_KERNEL``, else auto."""
    return os.environ.get("JETSPEC_ATTN_KERNEL", "auto") if kernel is None else kernel


def attention_kernel_reason(kernel: str, q, k_cache, block_table) -> str | None:
    """Why the attention kernel named ``kernel`` cannot take these shapes (None if it can).
    ``hopper`` runs head dims other than 64 / 128 on the mma.sync kernel."""
    dh = q.shape[-1]
    wgmma_dims = ext.limit("wgmma_head_dims")
    if kernel == "wgmma" and dh not in wgmma_dims:
        return f"kernel={kernel!r} takes head dims {wgmma_dims}, got {dh}"
    multiple, paged = ext.limit("attn_tma_page_multiple"), block_table is not None
    if kernel == "hopper" and dh in wgmma_dims and paged and k_cache.shape[1] % multiple:
        return (f"kernel={kernel!r} needs a page size (k_cache.shape[1]) that is a multiple of "
                f"{multiple}, got {k_cache.shape[1]}")
    return None


def _tree_attention(q, k_cache=None, v_cache=None, block_table=None, kernel=None, **_):
    dh = q.shape[-1]
    dims = ext.limit("attn_head_dims")
    if dh not in dims:
        return f"tree_attention does not support q head dim {dh} (supported: {dims})"
    reason = _half("tree_attention", q) or _aligned("tree_attention", k_cache=k_cache,
                                                     v_cache=v_cache)
    if reason:
        return reason
    return attention_kernel_reason(attention_kernel(kernel), q, k_cache, block_table)


def _qk_norm_rope_append(k, **_):
    limit = ext.limit("rope_max_head_dim")
    if k.shape[-1] > limit:
        return f"qk_norm_rope_append supports head dims up to {limit}, got {k.shape[-1]}"
    return None


def _verify_tree(tokens, **_):
    limit = ext.limit("walk_max_nodes")
    if tokens.shape[1] > limit:
        return f"verify_tree takes trees of at most {limit} nodes, got N={tokens.shape[1]}"
    return None


_CHECKS = {"tree_attention": _tree_attention, "qk_norm_rope_append": _qk_norm_rope_append,
           "verify_tree": _verify_tree}


_ANSWERS: dict = {}  # (op, attention kernel, id(_C), call signature) -> (answer, _C)
_CACHED = ("tree_attention",)  # the answers that cost more than a signature


def supports(op: str, signature=None, **call) -> str | None:
    """None when the cuda backend's ``op`` takes these arguments (by name), else why not. The
    answers depend on dtypes, shapes and layouts alone: the costly ones are worked out once per
    signature (``signature``: the op's own ``checks.signature`` of a call holding these
    arguments, when it has one; else made here)."""
    check = _CHECKS.get(op)
    if check is None:
        return None
    if op not in _CACHED:
        return check(**call)
    kernel = attention_kernel(call.get("kernel"))
    if signature is None:
        signature = checks.signature(*call, *call.values())
    module = ext.module()
    if signature is None:  # (while torch.compile traces: a read of the cache would be guarded on)
        return check(**call)
    key = (op, kernel, id(module), signature)
    answer = _ANSWERS.get(key)
    if answer is None:  # the entry keeps its _C alive, so no other module can reuse its id
        answer = checks.remember(_ANSWERS, key, (check(**call), module))
    return answer[0]
