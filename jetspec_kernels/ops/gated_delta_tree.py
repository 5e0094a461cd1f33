"""gated_delta_tree: a tree's Gated DeltaNet outputs, each node decoded along its ancestor path."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks
from ..limits import MAX_BUDGET

_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)


def check_state(state, slots, *, batch: int, hv: int, dk: int, dv: int, device) -> None:
    """The recurrent-state pool ``float32 [S, Hv, Dk, Dv]`` (last two dims contiguous) and its
    slots ``int32 [B]`` (None: S == B); static checks only (the slots' values: :func:`slot_values`)."""
    checks.tensor("state", state, dtypes=(torch.float32,), shape=[None, hv, dk, dv], device=device)
    if state.numel() and state.stride(-2) != dv:
        raise ValueError(f"state must be contiguous in its last two dimensions, got strides "
                         f"{state.stride()}")
    checks.optional("state_slots", slots, dtypes=checks.INDEX_DTYPES, shape=[batch], device=device)
    if slots is None and state.shape[0] != batch:
        raise ValueError(f"state must have one slot per sequence ({batch}) when state_slots is "
                         f"None, got shape {list(state.shape)}")


def slot_values(state, slots) -> None:
    """Slots lie in ``[0, S - 1]`` (only when value checks run)."""
    if slots is not None:
        checks.value_range("state_slots", slots, 0, state.shape[0] - 1)


def check_node_inputs(k, v, g, beta, q=None) -> tuple[int, int, int, int]:
    """``k [B, N, H, Dk]`` (and ``q``, the same shape and dtype), ``v [B, N, Hv, Dv]`` of k's
    dtype with Hv a multiple of H, ``g float32 [B, N, Hv]``, ``beta [B, N, Hv]`` float32 or of
    k's dtype; 1 <= N <= MAX_BUDGET. Returns (B, N, Hv, Dk)."""
    checks.tensor("k", k, dtypes=checks.FLOAT_DTYPES, ndim=4)
    b, n, h, dk = k.shape
    dev = k.device
    if q is not None:
        checks.tensor("q", q, dtypes=(k.dtype,), shape=list(k.shape), device=dev)
    if not 1 <= n <= MAX_BUDGET:
        raise ValueError(f"k must have between 1 and {MAX_BUDGET} tree nodes in dim 1, got shape "
                         f"{list(k.shape)}")
    if h < 1 or dk < 1:
        raise ValueError(f"k must have at least one head and a head dim >= 1, got shape {list(k.shape)}")
    checks.tensor("v", v, dtypes=(k.dtype,), ndim=4, device=dev)
    if list(v.shape[:2]) != [b, n] or v.shape[2] < 1 or v.shape[2] % h or v.shape[3] < 1:
        raise ValueError(f"v must have shape [{b}, {n}, Hv, Dv] with Hv a multiple of {h} (k's "
                         f"heads) and Dv >= 1, got {list(v.shape)}")
    hv = v.shape[2]
    checks.tensor("g", g, dtypes=(torch.float32,), shape=[b, n, hv], device=dev)
    checks.tensor("beta", beta, dtypes=tuple(dict.fromkeys((torch.float32, k.dtype))),
                  shape=[b, n, hv], device=dev)
    return b, n, hv, dk


def no_grad(op: str, *tensors) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError(f"{op} has no backward: its inputs must not require grad (call it under "
                         f"torch.no_grad() or torch.inference_mode())")


def check_gated_delta_tree(q, k, v, g, beta, parents, state, state_slots, num_nodes, scale,
                           use_qk_l2norm) -> None:
    key = checks.signature(q, k, v, g, beta, parents, state, state_slots, num_nodes, scale,
                           use_qk_l2norm)
    if key is None or key not in _STATIC:
        b, n, hv, dk = check_node_inputs(k, v, g, beta, q=q)
        dev = k.device
        checks.tensor("parents", parents, dtypes=checks.INDEX_DTYPES, shape=[b, n], device=dev)
        checks.optional("num_nodes", num_nodes, dtypes=checks.INDEX_DTYPES, shape=[b], device=dev)
        check_state(state, state_slots, batch=b, hv=hv, dk=dk, dv=v.shape[3], device=dev)
        if scale is not None:
            checks.number("scale", scale, positive=True)
        checks.flag("use_qk_l2norm", use_qk_l2norm)
        checks.remember(_STATIC, key, True)
    n = parents.shape[1]
    slot_values(state, state_slots)
    if num_nodes is not None:
        checks.value_range("num_nodes", num_nodes, 0, n)
    checks.parents_precede(parents, num_nodes)


def gated_delta_tree(q, k, v, g, beta, parents, state, *, state_slots=None, num_nodes=None,
                     scale=None, use_qk_l2norm=True, backend: str | None = None) -> torch.Tensor:
    """Every tree node's Gated DeltaNet (gated delta rule) output, as if the node had been decoded
    one token at a time along its ancestor path from the committed prefix's recurrent state
    (transformers' ``torch_recurrent_gated_delta_rule`` step; ``python_ref.gated_delta_tree``).

    Parameters
    ----------
    q, k : [B, N, H, Dk] float32/float16/bfloat16 (one dtype; last dim contiguous), 1 <= N <= 4096
    v : [B, N, Hv, Dv], q's dtype; Hv a multiple of H (q/k head h serves v-heads h*Hv/H ..)
    g : float32 [B, N, Hv]   log-decay (-exp(A_log) * softplus(a + dt_bias), <= 0)
    beta : [B, N, Hv]        float32 or q's dtype (already sigmoid'ed)
    parents : int32 [B, N]   a valid node's parent precedes it; -1: a child of the committed
                             prefix (the root, node 0; more than one such node is a forest)
    state : float32 [S, Hv, Dk, Dv]   the pool of recurrent states after each committed prefix
                             (read only; last two dims contiguous, any slot / head strides)
    state_slots : int32 [B], optional   sequence b's slot in ``state`` (None: S == B, slot b)
    num_nodes : int32 [B], optional     valid nodes per sequence (None: all N); the rows past it
                             are padding: their inputs are never read into a valid row
    scale : float > 0, optional         q's scale (None: divided by sqrt(Dk), as transformers)
    use_qk_l2norm : bool      q and k L2-normalised over Dk first (x * rsqrt(sum(x^2) + 1e-6))
    backend : "auto", "triton" or "reference" (the cuda backend has no kernel for it); ``auto``
        runs the reference (the chunked form in torch ops) on CUDA tensors until a GPU backend
        has passed on hardware (``backend.REFERENCE_UNTIL_VERIFIED``)

    Returns
    -------
    o : [B, N, Hv, Dv] in v's dtype, contiguous; padding rows 0. No host sync on CUDA tensors
    (value checks only where ``set_value_checks`` asks): graph-capturable. No autograd.
    """
    check_gated_delta_tree(q, k, v, g, beta, parents, state, state_slots, num_nodes, scale,
                           use_qk_l2norm)
    no_grad("gated_delta_tree", q, k, v, g, beta, state)
    call = dict(q=q, k=k, v=v, g=g, beta=beta, parents=parents, state=state,
                state_slots=state_slots, num_nodes=num_nodes, scale=scale,
                use_qk_l2norm=use_qk_l2norm)
    return _backend.select(k.device, "gated_delta_tree", backend, call)(**call)
