"""Argument-checking helpers shared by the per-op checking functions (ops/), the result types
(tree.py), the backends' ``supports`` and the decoding loop's argument checks.

Errors name the argument: ``TypeError`` for a non-tensor or a wrong dtype, ``ValueError`` for
a wrong rank, shape, device, layout or value.

Checks on tensor *values* (ranges, parents < i, prefix + N <= cache length) need the values on the
host. They always run for CPU tensors; for CUDA tensors they would be a host sync inside the
decoding round, so they run only when enabled with :func:`set_value_checks` ("always") or
``JETSPEC_VALUE_CHECKS=always``, and never during CUDA-graph capture or ``torch.compile`` tracing.
"""
from __future__ import annotations

import numbers
import os
from typing import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32,)
# Lengths, positions, cache slots and tokens an engine passes in (vLLM and SGLang keep both int32
# and int64 ones): int64 is taken too, its values checked to fit int32 where value checks run,
# and narrowed to int32 by the op before any backend sees it.
LENGTH_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1  # int64 token / position inputs are narrowed to int32 by the backends

_VALUE_CHECK_MODES = ("cpu", "always", "never")
_value_checks = os.environ.get("JETSPEC_VALUE_CHECKS", "cpu")
if _value_checks not in _VALUE_CHECK_MODES:
    raise ValueError(f"JETSPEC_VALUE_CHECKS must be one of {_VALUE_CHECK_MODES}, got {_value_checks!r}")


def set_value_checks(mode: str) -> None:
    """``"cpu"`` (default): check values of CPU tensors only; ``"always"``; ``"never"``."""
    global _value_checks
    if mode not in _VALUE_CHECK_MODES:
        raise ValueError(f"mode must be one of {_VALUE_CHECK_MODES}, got {mode!r}")
    _value_checks = mode


def values_checked(t: torch.Tensor) -> bool:
    """Whether value checks run for a tensor on ``t``'s device right now."""
    if _value_checks == "never":
        return False
    if t.is_cuda:
        if _value_checks != "always":
            return False
        return not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing()
    return not torch.compiler.is_compiling()


# Static checks (dtypes, shapes, devices, layouts) depend on nothing else, so each op runs them
# once per signature and remembers what they derived; value checks run on every call.
_SCALARS = (type(None), bool, int, float, str)
CACHE_SIZE = 1024


def signature(*args) -> tuple | None:
    """Hashable key of everything static checks can read: per tensor its dtype, shape, strides,
    storage offset and device; per scalar (None, bool, int, float, str) its type and value. None
    when some argument is neither, and while torch.compile traces (the checks then run in full
    once per compilation and become its guards; a cache keyed on symbolic shapes cannot hold)."""
    if torch.compiler.is_compiling():
        return None
    key = []
    for a in args:
        kind = type(a)
        if kind in _SCALARS:   # before isinstance: slow on torch.Tensor for other types
            key.append((kind, a))
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, a.shape, a.stride(), a.storage_offset(), a.device))
        else:
            return None
    return tuple(key)


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call when ``t`` has that dtype already (a hot path's few µs)."""
    return t if t.dtype == dtype else t.to(dtype)


def remember(cache: dict, key, value):
    """Store ``value`` (what a call's static checks derived; never None) under ``key`` (unless
    None) and return it. A full cache is emptied first (a bounded cache, in case shapes vary)."""
    if key is not None:
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[key] = value
    return value


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return "/".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(name: str, t, *, dtypes=None, ndim: int | None = None, shape=None,
           device: torch.device | None = None, last_contiguous: bool = True) -> torch.Tensor:
    """Check one tensor argument; ``shape`` entries of None match any size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_dtype_names(dtypes)}, got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (like the other inputs), got {t.device}")
    if last_contiguous and t.dim() > 0 and t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")
    return t


def optional(name: str, t, **kw):
    return None if t is None else tensor(name, t, **kw)


def integer(name: str, v, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {rng}, got {v}")
    return v


def number(name: str, v, *, lo: float | None = None, positive: bool = False) -> float:
    """A real number (int, float, NumPy scalar; not bool) as a finite float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    try:
        v = float(v)
    except OverflowError:  # an int past float64
        raise ValueError(f"{name} must be finite, got an integer of {int(v).bit_length()} bits") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {v}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


def flag(name: str, v) -> bool:
    """A bool argument: a truthy string or number is a mistake, not a yes."""
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")
    return v


def choice(name: str, v, options) -> str:
    if v not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {v!r}")
    return v


def value_range(name: str, t: torch.Tensor, lo: int | None = None, hi: int | None = None) -> None:
    """Values of an integer tensor lie in [lo, hi] (only when value checks run)."""
    if t.numel() == 0 or not values_checked(t):
        return
    mn, mx = int(t.min()), int(t.max())
    if (lo is not None and mn < lo) or (hi is not None and mx > hi):
        want = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} values must be {want}, got min {mn}, max {mx}")


def parents_precede(parents: torch.Tensor, num_nodes: torch.Tensor | None) -> None:
    """A tree's valid nodes (index < num_nodes[b]; None: all N) have -1 <= parents[b, i] < i;
    padding nodes' entries are not read (only when value checks run)."""
    if parents.numel() == 0 or not values_checked(parents):
        return
    n = parents.shape[1]
    idx = torch.arange(n, device=parents.device)
    valid = idx[None, :] < (n if num_nodes is None else num_nodes[:, None])
    if bool((valid & ((parents < -1) | (parents >= idx[None, :]))).any()):
        raise ValueError("parents must point to an earlier node for valid nodes: -1 <= "
                         "parents[b, i] < i (-1: a child of the committed prefix)")


def cache_and_table(k_cache, v_cache, block_table, *, batch: int, hkv: int | None, head_dim: int | None,
                    dtypes, device) -> tuple[int, int | None]:
    """Check a contiguous ``[B, L, Hkv, Dh]`` or paged ``[P, page, Hkv, Dh]`` cache pair (static:
    the block table's values are :func:`table_values`).

    Returns ``(capacity per sequence, page_size or None)``.
    """
    tensor("k_cache", k_cache, dtypes=dtypes, ndim=4, device=device)
    if hkv is not None and k_cache.shape[2] != hkv:
        raise ValueError(f"k_cache must have {hkv} kv heads in dim 2, got shape {list(k_cache.shape)}")
    if head_dim is not None and k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head dim (dim 3) must be {head_dim}, got shape {list(k_cache.shape)}")
    if block_table is None and k_cache.shape[0] != batch:
        raise ValueError(f"k_cache (contiguous) must have batch {batch} in dim 0, got shape "
                         f"{list(k_cache.shape)}; pass block_table for a paged cache")
    tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), shape=list(k_cache.shape), device=device)
    if block_table is None:
        return k_cache.shape[1], None
    tensor("block_table", block_table, dtypes=INDEX_DTYPES, ndim=2, device=device)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table must have {batch} rows, got shape {list(block_table.shape)}")
    return block_table.shape[1] * k_cache.shape[1], k_cache.shape[1]


def table_values(block_table, k_cache) -> None:
    """Page indices lie in ``[0, pages - 1]`` (only when value checks run; the values half of
    :func:`cache_and_table`)."""
    if block_table is not None:
        value_range("block_table", block_table, 0, k_cache.shape[0] - 1)


def fits_in_cache(prefix_lens: torch.Tensor, n: int, capacity: int, what: str = "prefix_lens") -> None:
    """``prefix_lens + n <= capacity`` for every sequence (only when value checks run)."""
    if prefix_lens.numel() == 0 or not values_checked(prefix_lens):
        return
    mn, mx = int(prefix_lens.min()), int(prefix_lens.max())
    if mn < 0:
        raise ValueError(f"{what} must be >= 0, got min {mn}")
    if mx + n > capacity:
        raise ValueError(f"{what} must be <= {capacity - n} so that its {n} rows fit the cache length "
                         f"{capacity}, got max {mx}; or the block table is too short or the cache "
                         f"too small")


def misaligned_rows(t: torch.Tensor, align: int) -> bool:
    """Whether some row of ``t``'s last dim may start off an ``align``-byte boundary, judged from
    strides and storage offset (storages start aligned; no data_ptr()). While torch.compile
    traces, from strides alone (dynamo cannot read a storage offset): a backend that needs
    aligned rows re-checks the real pointers when it runs."""
    per = max(align // t.element_size(), 1)
    if any(s % per for s in t.stride()[:-1]):
        return True
    return not torch.compiler.is_compiling() and t.storage_offset() % per != 0
