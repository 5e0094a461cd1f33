"""causal_conv1d_tree: a Gated DeltaNet layer's depthwise causal conv over a draft tree."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks
from ..limits import MAX_BUDGET

MAX_CONV_WIDTH = 8     # conv taps W (Qwen3.5 uses 4); the window walk unrolls W - 1 parent steps
ACTIVATIONS = ("silu", None)

_STATIC: dict = {}


def check_conv_state(conv_state, state_slots, *, batch: int, channels: int, dtypes, device):
    """The conv state pool [S, C, W - 1] and its slots int32 [B] (values in [0, S), distinct);
    returns W."""
    checks.tensor("conv_state", conv_state, dtypes=dtypes, ndim=3, device=device)
    if conv_state.shape[1] != channels:
        raise ValueError(f"conv_state must have shape [S, {channels}, W - 1] (C = x's channels), "
                         f"got {list(conv_state.shape)}")
    if not conv_state.is_contiguous():
        raise ValueError("conv_state must be contiguous (it is written in place)")
    width = conv_state.shape[2] + 1
    if not 2 <= width <= MAX_CONV_WIDTH:
        raise ValueError(f"conv_state's last dim W - 1 must give a conv width W in [2, "
                         f"{MAX_CONV_WIDTH}], got W = {width}")
    if state_slots is None:
        if conv_state.shape[0] != batch:
            raise ValueError(f"conv_state must hold one state per sequence ({batch}) when "
                             f"state_slots is None, got {conv_state.shape[0]}")
        return width
    checks.tensor("state_slots", state_slots, dtypes=checks.INDEX_DTYPES, shape=[batch], device=device)
    checks.value_range("state_slots", state_slots, 0, conv_state.shape[0] - 1)
    if checks.values_checked(state_slots) and batch and \
            torch.unique(state_slots).numel() != batch:
        raise ValueError(f"state_slots must be distinct, got {state_slots.tolist()}")
    return width


def check_causal_conv1d_tree(x, parents, conv_state, weight, bias, state_slots, num_nodes,
                             activation) -> None:
    key = checks.signature(x, parents, conv_state, weight, bias, state_slots, num_nodes, activation)
    if key is None or key not in _STATIC:
        checks.tensor("x", x, dtypes=checks.FLOAT_DTYPES, ndim=3)
        b, n, c = x.shape
        dev = x.device
        if not 1 <= n <= MAX_BUDGET:
            raise ValueError(f"x must hold 1 to {MAX_BUDGET} tree nodes in dim 1, got {n}")
        checks.tensor("parents", parents, dtypes=checks.INDEX_DTYPES, shape=[b, n], device=dev)
        width = check_conv_state(conv_state, state_slots, batch=b, channels=c, dtypes=(x.dtype,),
                                 device=dev)
        checks.tensor("weight", weight, dtypes=(x.dtype, torch.float32), shape=[c, width], device=dev)
        checks.optional("bias", bias, dtypes=(weight.dtype,), shape=[c], device=dev)
        checks.optional("num_nodes", num_nodes, dtypes=checks.INDEX_DTYPES, shape=[b], device=dev)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
        checks.remember(_STATIC, key, True)
    n = x.shape[1]
    checks.value_range("parents", parents, -1, n - 1)
    if num_nodes is not None:
        checks.value_range("num_nodes", num_nodes, 0, n)
    checks.parents_precede(parents, num_nodes)


def causal_conv1d_tree(x, parents, conv_state, weight, bias=None, *, state_slots=None,
                       num_nodes=None, activation: str | None = "silu",
                       backend: str | None = None) -> torch.Tensor:
    """Depthwise causal conv of every tree node as if decoded along its own ancestor path.

    Node i's window is its input ``x[b, i]`` preceded by the inputs of its W - 1 nearest
    ancestors, continued into ``conv_state[slot]`` (the committed prefix's last W - 1 inputs,
    oldest first, as transformers keeps a Gated DeltaNet layer's conv state) where the path runs
    out: ``y[b, i] = act(bias + sum_j weight[:, j] * window_i[j])``, window_i[W - 1] being the node
    itself. Padding nodes (``i >= num_nodes[b]``) give 0. Computed in float32, returned in x's
    dtype. Reads conv_state only (:func:`causal_conv1d_commit` writes it). No host sync.

    Parameters
    ----------
    x : float32/float16/bfloat16 [B, N, C] (1 <= N <= MAX_BUDGET), the nodes' conv inputs
    parents : int32 [B, N] in [-1, N), -1 for the root, else an earlier node (padding nodes'
        entries are not read)
    conv_state : x.dtype [S, C, W - 1], contiguous (2 <= W <= MAX_CONV_WIDTH)
    weight : [C, W] (x's dtype or float32); bias : [C] or None
    state_slots : int32 [B], distinct, in [0, S); None: S == B and sequence b uses slot b
    num_nodes : int32 [B] in [0, N] or None (every node valid)
    activation : "silu" or None
    backend : "auto", "cuda", "triton" or "reference" (default: :func:`get_backend`)

    Returns
    -------
    y : x.dtype [B, N, C]
    """
    check_causal_conv1d_tree(x, parents, conv_state, weight, bias, state_slots, num_nodes,
                             activation)
    call = dict(x=x, parents=parents, conv_state=conv_state, weight=weight, bias=bias,
                state_slots=state_slots, num_nodes=num_nodes, activation=activation)
    return _backend.select(x.device, "causal_conv1d_tree", backend, call)(**call)
