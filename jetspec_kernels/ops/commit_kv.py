"""commit_kv: move the accepted path's K/V into contiguous cache slots."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks
from ..tree import Commit, Verdict


def check_commit_kv(k_cache, v_cache, prefix_lens, verdict, block_table, hidden):
    if not isinstance(verdict, Verdict):
        raise TypeError(f"verdict must be a jetspec_kernels.Verdict, got {type(verdict).__name__}")
    # The verdict fixes the batch (it comes from verify_tree of the round's tree).
    checks.tensor("verdict.accept_len", verdict.accept_len, dtypes=checks.INDEX_DTYPES, ndim=1)
    b = verdict.accept_len.shape[0]
    dev = verdict.accept_len.device
    checks.tensor("verdict.path", verdict.path, dtypes=checks.INDEX_DTYPES, ndim=2, device=dev)
    if verdict.path.shape[0] != b:
        raise ValueError(f"verdict.accept_len must have one entry per row of verdict.path: shape "
                         f"[{verdict.path.shape[0]}], got {[b]}")
    checks.tensor("prefix_lens", prefix_lens, dtypes=checks.LENGTH_DTYPES, ndim=1, device=dev)
    if prefix_lens.shape[0] != b:
        raise ValueError(f"prefix_lens must have one entry per sequence of the verdict: shape [{b}] "
                         f"(verdict.accept_len's), got {list(prefix_lens.shape)}")
    m = verdict.path.shape[1]
    if m < 1:
        raise ValueError("verdict.path must have at least one column (the root)")
    cap, _ = checks.cache_and_table(k_cache, v_cache, block_table, batch=b, hkv=None, head_dim=None,
                               dtypes=checks.FLOAT_DTYPES, device=dev)
    checks.table_values(block_table, k_cache)
    checks.value_range("verdict.accept_len", verdict.accept_len, 0, m - 1)
    checks.value_range("verdict.path", verdict.path, -1, None)
    if hidden is not None:
        checks.tensor("hidden", hidden, dtypes=checks.FLOAT_DTYPES, ndim=3, device=dev)
        if hidden.shape[0] != b:
            raise ValueError(f"hidden must have batch {b} in dim 0, got shape {list(hidden.shape)}")
        if checks.values_checked(verdict.path) and verdict.path.numel():
            reach = int(verdict.path.max())
            if reach >= hidden.shape[1]:
                raise ValueError(f"hidden must hold a row per tree node, at least {reach + 1} in "
                                 f"dim 1 (verdict.path reaches node {reach}), got shape "
                                 f"{list(hidden.shape)}")
    if checks.values_checked(verdict.path) and b:
        checks.fits_in_cache(prefix_lens, int(verdict.path.max()) + 1, cap)
        # Overlap safety of the in-place move relies on a root-first, strictly increasing path.
        idx = torch.arange(m, device=dev)
        live = idx[None, :] <= verdict.accept_len[:, None]
        steps = verdict.path[:, 1:] > verdict.path[:, :-1]
        if bool((verdict.path[:, 0] != 0).any()) or bool((live[:, 1:] & ~steps).any()):
            raise ValueError("verdict.path must start at the root (0) and increase strictly "
                             "up to accept_len")


def commit_kv(k_cache, v_cache, prefix_lens, verdict: Verdict, *, block_table=None, hidden=None,
              backend: str | None = None) -> Commit:
    """Move the K/V of the accepted path into contiguous slots and gather its hidden rows.

    Slot ``prefix_lens[b] + path[b, i]`` moves to ``prefix_lens[b] + i`` for
    ``i <= accept_len[b]`` (in place; correct although sources and destinations overlap).

    Parameters
    ----------
    k_cache, v_cache : contiguous [B, L, Hkv, Dh] or paged [P, page_size, Hkv, Dh]
    prefix_lens : int32/int64 [B] committed length before the tree (root at prefix_lens)
    verdict : Verdict             from :func:`verify_tree`
    block_table : int32 [B, max_pages], optional
    hidden : float [B, N, Hh], optional   per-node hidden rows (e.g. the target's taps)

    Returns
    -------
    Commit(prefix_lens int32 [B] = prefix_lens + accept_len + 1,
           hidden [B, M, Hh] (rows along the path, zero after) or None)
    """
    check_commit_kv(k_cache, v_cache, prefix_lens, verdict, block_table, hidden)
    if prefix_lens.dtype != torch.int32:  # int64 (checks.LENGTH_DTYPES): the backends take int32
        prefix_lens = prefix_lens.to(torch.int32)
    new_lens, rows = _backend.select(prefix_lens.device, "commit_kv", backend)(
        k_cache, v_cache, prefix_lens, verdict.path, verdict.accept_len, block_table, hidden)
    return Commit(new_lens, rows)
