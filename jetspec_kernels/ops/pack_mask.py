"""pack_mask: the packed ancestor-or-self mask of trees given by parent indices."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks


def pack_mask(parents, num_nodes, *, backend: str | None = None) -> torch.Tensor:
    """Pack the ancestor-or-self mask of trees given by parent indices.

    Parameters
    ----------
    parents : int32 [B, N], N >= 1   parent index (< own index), -1 for the root and padding
    num_nodes : int32 [B]      valid nodes, >= 1 (the root; verify_tree needs it too); rows
        >= num_nodes get only their own bit

    Returns
    -------
    mask : int32 [B, N, ceil(N / 32)]
    """
    checks.tensor("parents", parents, dtypes=checks.INDEX_DTYPES, ndim=2)
    b, n = parents.shape
    if n < 1:
        raise ValueError(f"parents must have at least one column (the root), got shape {list(parents.shape)}")
    checks.tensor("num_nodes", num_nodes, dtypes=checks.INDEX_DTYPES, shape=[b], device=parents.device)
    checks.value_range("num_nodes", num_nodes, 1, n)   # as verify_tree: every tree has its root
    if checks.values_checked(parents) and parents.numel():
        idx = torch.arange(n, device=parents.device)
        valid = idx[None, :] < num_nodes[:, None]
        bad = valid & (idx[None, :] > 0) & ((parents < 0) | (parents >= idx[None, :]))
        if bool(bad.any()):
            raise ValueError("parents must satisfy 0 <= parents[b, i] < i for valid non-root nodes")
        if bool((valid[:, 0] & (parents[:, 0] != -1)).any()):
            raise ValueError("parents[b, 0] must be -1 (the root has no parent) where num_nodes[b] > 0")
    return _backend.select(parents.device, "pack_mask", backend)(parents, num_nodes)
