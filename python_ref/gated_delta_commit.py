"""Reference Gated DeltaNet commit: advance each sequence's recurrent state along its accepted
path, one decoding step per accepted node (:func:`gated_delta_tree.gated_delta_step`)."""

import torch

from ._common import compute_dtype
from .gated_delta_tree import gated_delta_step, l2norm

__all__ = ["gated_delta_commit"]


def gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots=None,
                       use_qk_l2norm=True):
    """Advance ``state[slot]`` in place through the nodes ``path[b, 0..accept_len[b]]``.

    Parameters
    ----------
    k : ``[B, N, H, Dk]``; v : ``[B, N, Hv, Dv]``; g, beta : ``[B, N, Hv]`` (the tree's nodes)
    path : int ``[B, P]`` node indices, root first; entries after ``accept_len[b]`` are ignored
    accept_len : int ``[B]`` in ``[0, P - 1]`` (``accept_len + 1`` nodes are applied)
    state : ``[S, Hv, Dk, Dv]`` pool, updated in place; state_slots : int ``[B]`` or None (slot b)
    use_qk_l2norm : L2-normalise k first (as the tree op does)

    Returns None. The steps run in the compute dtype (float64 if any input is float64, else
    float32) and the result is cast to ``state``'s dtype once, at the end. No host reads: a step
    past ``accept_len[b]`` is computed and discarded (a CUDA graph can hold this function).
    """
    cd = compute_dtype(k, v, g, beta, state)
    B, P = path.shape
    H, Hv = k.shape[2], v.shape[2]
    slots = (torch.arange(B, device=state.device) if state_slots is None else state_slots.long())
    k = k.repeat_interleave(Hv // H, dim=2).to(cd)
    if use_qk_l2norm:
        k = l2norm(k)
    v, g, beta = v.to(cd), g.to(cd), beta.to(cd)
    S = state.index_select(0, slots).to(cd)
    rows = torch.arange(B, device=path.device)
    for t in range(P):
        node = path[:, t].long().clamp(0, k.shape[1] - 1)   # entries past accept_len: any value
        stepped, _ = gated_delta_step(S, k[rows, node], k[rows, node], v[rows, node],
                                      g[rows, node], beta[rows, node])
        S = torch.where((t <= accept_len)[:, None, None, None], stepped, S)
    state.index_copy_(0, slots, S.to(state.dtype))
