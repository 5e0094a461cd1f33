"""gated_delta_commit: advance each sequence's Gated DeltaNet state along its accepted path."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks
from .gated_delta_tree import check_node_inputs, check_state, no_grad, slot_values

_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)


def check_gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots,
                             use_qk_l2norm) -> None:
    key = checks.signature(k, v, g, beta, path, accept_len, state, state_slots, use_qk_l2norm)
    if key is None or key not in _STATIC:
        b, n, hv, dk = check_node_inputs(k, v, g, beta)
        dev = k.device
        checks.tensor("path", path, dtypes=checks.INDEX_DTYPES, shape=[b, None], device=dev)
        if path.shape[1] < 1:
            raise ValueError(f"path must have at least one column (the root), got shape "
                             f"{list(path.shape)}")
        checks.tensor("accept_len", accept_len, dtypes=checks.INDEX_DTYPES, shape=[b], device=dev)
        check_state(state, state_slots, batch=b, hv=hv, dk=dk, dv=v.shape[3], device=dev)
        checks.flag("use_qk_l2norm", use_qk_l2norm)
        checks.remember(_STATIC, key, True)
    n, p = k.shape[1], path.shape[1]
    checks.value_range("accept_len", accept_len, 0, p - 1)
    slot_values(state, state_slots)
    if checks.values_checked(path) and path.numel():
        live = torch.arange(p, device=path.device)[None, :] <= accept_len[:, None]
        if bool((live & ((path < 0) | (path >= n))).any()):
            raise ValueError(f"path values must be in [0, {n - 1}] (node indices) up to accept_len")
        if state_slots is not None and state_slots.unique().numel() != state_slots.numel():
            raise ValueError("state_slots must be distinct (each sequence advances its own state "
                             "in place)")


def gated_delta_commit(k, v, g, beta, path, accept_len, state, *, state_slots=None,
                       use_qk_l2norm=True, backend: str | None = None) -> None:
    """Advance each sequence's recurrent state in place through its accepted nodes
    ``path[b, 0..accept_len[b]]``: one gated-delta-rule decoding step per node, in path order
    (transformers' ``torch_recurrent_gated_delta_rule`` step; ``python_ref.gated_delta_commit``),
    without recomputing the prefix. After it, ``state[slot]`` is the state
    :func:`gated_delta_tree` started from, advanced to the last accepted node.

    Parameters
    ----------
    k : [B, N, H, Dk] float32/float16/bfloat16 (last dim contiguous), 1 <= N <= 4096
    v : [B, N, Hv, Dv], k's dtype; Hv a multiple of H
    g : float32 [B, N, Hv]; beta : [B, N, Hv] float32 or k's dtype  (the tree's per-node inputs)
    path : int32 [B, P]    node indices, root first (verify_tree's ``Verdict.path``); entries
                           after accept_len[b] are never read
    accept_len : int32 [B] in [0, P - 1]   ``accept_len + 1`` nodes are applied
    state : float32 [S, Hv, Dk, Dv]   the state pool, updated in place (only the slots named)
    state_slots : int32 [B], optional  distinct slots (None: S == B, slot b)
    use_qk_l2norm : bool   k L2-normalised first (as in :func:`gated_delta_tree`)
    backend : "auto", "triton" or "reference" (as for :func:`gated_delta_tree`)

    Returns None. No host sync on CUDA tensors: graph-capturable. No autograd.
    """
    check_gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots, use_qk_l2norm)
    no_grad("gated_delta_commit", k, v, g, beta, state)
    call = dict(k=k, v=v, g=g, beta=beta, path=path, accept_len=accept_len, state=state,
                state_slots=state_slots, use_qk_l2norm=use_qk_l2norm)
    _backend.select(k.device, "gated_delta_commit", backend, call)(**call)
