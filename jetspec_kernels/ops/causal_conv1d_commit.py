"""causal_conv1d_commit: advance each sequence's conv state along its accepted tree path."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks
from ..limits import MAX_BUDGET
from .causal_conv1d_tree import check_conv_state

_STATIC: dict = {}


def check_causal_conv1d_commit(x, path, accept_len, conv_state, state_slots) -> None:
    key = checks.signature(x, path, accept_len, conv_state, state_slots)
    if key is None or key not in _STATIC:
        checks.tensor("x", x, dtypes=checks.FLOAT_DTYPES, ndim=3)
        b, n, c = x.shape
        dev = x.device
        if not 1 <= n <= MAX_BUDGET:
            raise ValueError(f"x must hold 1 to {MAX_BUDGET} tree nodes in dim 1, got {n}")
        checks.tensor("path", path, dtypes=checks.INDEX_DTYPES, shape=[b, None], device=dev)
        if path.shape[1] < 1:
            raise ValueError("path must have at least one column (the root)")
        checks.tensor("accept_len", accept_len, dtypes=checks.INDEX_DTYPES, shape=[b], device=dev)
        check_conv_state(conv_state, state_slots, batch=b, channels=c, dtypes=(x.dtype,), device=dev)
        checks.remember(_STATIC, key, True)
    checks.value_range("accept_len", accept_len, 0, path.shape[1] - 1)
    if checks.values_checked(path) and path.numel():
        live = torch.arange(path.shape[1], device=path.device)[None, :] <= accept_len[:, None]
        bad = live & ((path < 0) | (path >= x.shape[1]))
        if bool(bad.any()):
            raise ValueError(f"path entries up to accept_len must be node indices in [0, "
                             f"{x.shape[1] - 1}], got {path[bad].tolist()}")


def causal_conv1d_commit(x, path, accept_len, conv_state, *, state_slots=None,
                         backend: str | None = None) -> None:
    """``conv_state[slot]`` becomes the last W - 1 inputs of the committed prefix followed by the
    accepted nodes ``x[b, path[b, 0]], ..., x[b, path[b, accept_len[b]]]`` (in place). Entries of
    ``path`` past ``accept_len`` are not read. Graph-capturable, no host sync (value checks aside,
    which run for CPU tensors).

    Parameters
    ----------
    x : float32/float16/bfloat16 [B, N, C], the tree nodes' conv inputs (as given to
        :func:`causal_conv1d_tree`)
    path : int32 [B, P], accepted node indices, root first (``Verdict.path``)
    accept_len : int32 [B] in [0, P - 1]
    conv_state : x.dtype [S, C, W - 1], contiguous, written in place
    state_slots : int32 [B], distinct, in [0, S); None: S == B, slot b
    backend : "auto", "cuda", "triton" or "reference" (default: :func:`get_backend`)
    """
    check_causal_conv1d_commit(x, path, accept_len, conv_state, state_slots)
    call = dict(x=x, path=path, accept_len=accept_len, conv_state=conv_state,
                state_slots=state_slots)
    _backend.select(x.device, "causal_conv1d_commit", backend, call)(**call)
