"""causal_conv1d_commit: advance a sequence's conv state along its accepted tree path."""
from __future__ import annotations

import torch

__all__ = ["causal_conv1d_commit"]


def causal_conv1d_commit(x: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor,
                         conv_state: torch.Tensor, *, state_slots: torch.Tensor | None = None) -> None:
    """``conv_state[slot]`` becomes the last W - 1 inputs of the prefix followed by the accepted
    path's inputs ``x[b, path[b, 0]], ..., x[b, path[b, accept_len[b]]]`` (in place, in
    conv_state's dtype; no host reads).

    Parameters
    ----------
    x : [B, N, C]                the tree nodes' conv inputs
    path : int [B, P]            accepted node indices, root first (entries past accept_len unread)
    accept_len : int [B]         accepted draft nodes: path[b, :accept_len[b] + 1] is taken
    conv_state : [S, C, W - 1]   updated in place
    state_slots : int [B] or None (None: S == B, slot b); distinct slots
    """
    b, n, c = x.shape
    keep = conv_state.shape[2]
    slots = torch.arange(b, device=x.device) if state_slots is None else state_slots.long()
    # Entries past accept_len may hold anything: clamped into range, gathered, never selected.
    rows = x.gather(1, path.long().clamp(0, n - 1)[..., None].expand(-1, -1, c))  # [B, P, C]
    seq = torch.cat([conv_state[slots].transpose(1, 2), rows.to(conv_state.dtype)], dim=1)
    # The last W - 1 of the first W - 1 + (accept_len + 1) entries.
    idx = accept_len.long()[:, None] + 1 + torch.arange(keep, device=x.device)[None, :]
    new = seq.gather(1, idx[..., None].expand(-1, -1, c)).transpose(1, 2)
    conv_state.index_copy_(0, slots, new.contiguous())
