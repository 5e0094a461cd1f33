"""cuda backend: verify_tree (target token per node, then the acceptance walk)."""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from .. import launch_plan
from . import extension as ext
from .custom_op import custom_op


# Each phase-1 CTA scans at least this many logits (two 16-byte loads per thread).
MIN_SPLIT_LEN = 4096


@lru_cache(maxsize=1024)
def target_splits(rows: int, vocab: int, sm_count: int) -> tuple[int, int]:
    """(splits, split_len) for phase 1: about 4 CTAs per SM in total, split_len a multiple of 8
    (16-byte vectors) and about MIN_SPLIT_LEN or more; one split once rows alone fill the GPU."""
    def cdiv(a, b):
        return -(-a // b)

    want = max(1, min(cdiv(4 * sm_count, max(rows, 1)), cdiv(vocab, MIN_SPLIT_LEN), 65535))
    split_len = cdiv(cdiv(vocab, want), 8) * 8
    return cdiv(vocab, split_len), split_len


@custom_op("jetspec::verify_tree", mutates_args=())
def _verify_tree(tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
                 max_depth: int, target_logits: Optional[torch.Tensor],
                 target_tokens: Optional[torch.Tensor], temperature: Optional[torch.Tensor],
                 seed: Optional[torch.Tensor], offset: Optional[torch.Tensor],
                 top_k: Optional[torch.Tensor], top_p: Optional[torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(tokens.device):
        b, n = tokens.shape
        dev = tokens.device
        cols = max_depth + 1
        tokens = tokens.contiguous()
        parents = parents.contiguous()
        num_nodes = num_nodes.contiguous()
        partial_value = partial_token = 0
        target = None
        splits = 1
        if target_tokens is None:
            v = target_logits.shape[2]
            splits, split_len = target_splits(b * n, v, launch_plan.sm_count(dev))
            sample = temperature is not None
            filtered = sample and (top_k is not None or top_p is not None)
            # Workspaces, one allocation: phase 1's partial_value float32 / partial_token int32
            # [B * N, splits], then (filtered) phase 0's thr_x float32 / thr_id int32 [B * N].
            sizes = (b * n * splits * 4,) * 2 + ((b * n * 4,) * 2 if filtered else ())
            work, (partial_value, partial_token, *thr) = ext.workspaces(dev, *sizes)
            thr_x, thr_id = thr or (0, 0)
            seed_t = seed.to(torch.int64).contiguous() if sample else None
            offset_t = offset.to(torch.int64).contiguous() if sample else None
            temp_t = temperature.contiguous() if sample else None
            # Layout decisions read data_ptr(), so they live inside the op (opaque to torch.compile).
            vec = ext.aligned16(target_logits)
            if filtered:
                _thresholds(target_logits, temp_t, num_nodes, top_k, top_p, vec, thr_x, thr_id)
            _C.verify_target_tokens(
                logits=target_logits.data_ptr(), logits_batch_stride=target_logits.stride(0),
                logits_row_stride=target_logits.stride(1), num_nodes=num_nodes.data_ptr(),
                seed=ext.ptr(seed_t), offset=ext.ptr(offset_t), partial_value=partial_value,
                partial_token=partial_token, batch=b, n=n,
                vocab=v, splits=splits, split_len=split_len, vec=vec, temperature=ext.ptr(temp_t),
                thr_x=thr_x, thr_id=thr_id, dtype=ext.dtype_code(target_logits),
                stream=ext.stream())
        else:
            target = target_tokens.contiguous()
        # The walk's rule per row: first agreeing sibling where T > 0, else the longest chain.
        walk_temp = None if temperature is None else temperature.contiguous()
        accept_len = torch.empty(b, device=dev, dtype=torch.int32)
        path = torch.empty(b, cols, device=dev, dtype=torch.int32)
        bonus = torch.empty(b, device=dev, dtype=torch.int32)
        emitted = torch.empty(b, cols, device=dev, dtype=torch.int32)
        _C.verify_walk(tokens=tokens.data_ptr(), parents=parents.data_ptr(),
                       num_nodes=num_nodes.data_ptr(),
                       target=ext.ptr(target),
                       target_batch_stride=0 if target is None else target.stride(0),
                       partial_value=partial_value, partial_token=partial_token, splits=splits,
                       accept_len=accept_len.data_ptr(), path=path.data_ptr(),
                       bonus=bonus.data_ptr(),
                       emitted=emitted.data_ptr(), batch=b, n=n, cols=cols, stream=ext.stream(),
                       temperature=0 if walk_temp is None else walk_temp.data_ptr())
        return accept_len, path, bonus, emitted


@_verify_tree.register_fake
def _(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature, seed, offset,
      top_k, top_p):
    b = tokens.shape[0]
    return (tokens.new_empty(b), tokens.new_empty(b, max_depth + 1), tokens.new_empty(b),
            tokens.new_empty(b, max_depth + 1))


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
                seed, offset, top_k=None, top_p=None):
    """-> (accept_len int32 [B], path int32 [B, M], bonus int32 [B], emitted int32 [B, M]),
    M = max_depth + 1; greedy when temperature is the number 0, else seeded Gumbel-max
    (CONTRIBUTING.md) per sequence (temperature float or float32 [B]; 0 = greedy) over the
    tokens top_k / top_p (int32 / float32 [B] or None) keep (python_ref.filter_keep)."""
    if not torch.is_tensor(temperature):
        temperature = None if temperature == 0 else torch.full(
            (tokens.shape[0],), float(temperature), dtype=torch.float32, device=tokens.device)
    return _verify_tree(tokens, parents, num_nodes, int(max_depth), target_logits, target_tokens,
                        temperature, seed, offset, top_k, top_p)


def _thresholds(logits, temperature, num_nodes, top_k, top_p, vec, thr_x, thr_id):
    """Phase 0 into thr_x float32 / thr_id int32 [B * N] (device addresses); call inside
    ext.on_device."""
    _C = ext.module()
    b, n, v = logits.shape
    top_k = None if top_k is None else top_k.contiguous()   # kept alive across the call
    top_p = None if top_p is None else top_p.contiguous()
    _C.verify_sample_filter(logits=logits.data_ptr(), logits_batch_stride=logits.stride(0),
                            logits_row_stride=logits.stride(1),
                            num_nodes=num_nodes.data_ptr(), temperature=temperature.data_ptr(),
                            top_k=ext.ptr(top_k), top_p=ext.ptr(top_p), thr_x=thr_x,
                            thr_id=thr_id, batch=b, n=n, vocab=v, vec=vec,
                            dtype=ext.dtype_code(logits), stream=ext.stream())


def filter_thresholds(logits, temperature, top_k=None, top_p=None, num_nodes=None):
    """Phase 0 on its own (for tests): the last token each node's filters keep.

    Parameters
    ----------
    logits : float ``[B, N, V]``; temperature : float32 ``[B]``
    top_k : int32 ``[B]`` or None; top_p : float32 ``[B]`` or None
    num_nodes : int32 ``[B]`` or None (all N nodes)

    Returns
    -------
    ``(thr_x float32 [B, N], thr_id int32 [B, N])``, as the triton backend's
    ``filter_thresholds``: node (b, n) keeps v iff ``x > thr_x or (x == thr_x and v <= thr_id)``.
    """
    with ext.on_device(logits.device):
        b, n, _ = logits.shape
        if num_nodes is None:
            num_nodes = torch.full((b,), n, dtype=torch.int32, device=logits.device)
        num_nodes = num_nodes.contiguous()
        temperature = temperature.contiguous()
        thr_x = torch.empty(b, n, device=logits.device, dtype=torch.float32)
        thr_id = torch.empty(b, n, device=logits.device, dtype=torch.int32)
        _thresholds(logits, temperature, num_nodes, top_k, top_p, ext.aligned16(logits),
                    thr_x.data_ptr(), thr_id.data_ptr())
        return thr_x, thr_id
