"""The exact mode: ops whose every output row is the same bits whatever else the launch holds.

A row's bits may depend on the launch around it: GEMM libraries pick kernels (and split-K) by M,
vectorised loops give the last elements of a launch a scalar tail, attention reduces a tree
node's keys in another order than a one-token decode step. The exact variants here remove that
dependence by construction, on two paths:

* **reference** (CPU only): every row is computed by a one-row call on a fresh contiguous copy
  of the row (the same launch shape, alignment and arguments for every row, so the same bits),
  and attention gathers a row's visible keys into logical order first
  (``python_ref.tree_attention.tree_attention_logical``). The price is one call per row.
* **triton**: kernels whose programs each own whole rows with sizes fixed by the row length,
  never by M (rms_norm, silu_mul, qk_norm_rope_append as they are; the fixed-tile GEMM of
  ``triton/exact_matmul.py``; the logical-order attention of ``triton/exact_attention.py``), so
  one launch over all rows is exact. On the CPU it runs under the Triton interpreter; on a GPU
  only on a device model the hardware record lists under ``exact`` (its invariance tests passed
  there), or with ``JETSPEC_EXACT_UNVERIFIED=1`` (the device check, which shows it).

Anything else (the cuda backend, torch's GPU kernels, a GPU not yet shown) raises
:class:`ExactModeError` naming the op and the path, never silently computing a non-exact result.
Costs: docs/perf/exact_mode.md.

:func:`exact_mode` is the switch the models read (``Qwen3.forward`` runs its exact form inside
it); ops take ``exact=`` or are called here explicitly, and never read the switch themselves, so
a draft head inside the same ``with`` keeps its fast path.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import threading

import torch
import torch.nn.functional as F

from .. import backend as _backend
from ..limits import EXACT_GEMM_TILES, EXACT_MAX_K_PARTS
from .qk_norm_rope_append import qk_norm_rope_append as _qk_norm_rope_append
from .rms_norm import rms_norm as _rms_norm
from .silu_mul import silu_mul as _silu_mul

__all__ = ["ExactModeError", "exact_mode", "exact_enabled", "exact_backend", "exact_scope",
           "exact_verified_devices", "GEMM_TILES", "UNVERIFIED_ENV", "forward_scope", "per_row",
           "sum_in_order", "sum_pairwise", "k_parts_ok", "lanes", "linear", "rms_norm", "silu_mul",
           "qk_norm_rope_append", "argmax", "sample_at_positions"]


class ExactModeError(NotImplementedError):
    """Exact mode was asked of a path that is not (yet) shown row-invariant."""


_STATE = threading.local()


@contextlib.contextmanager
def exact_mode(enabled: bool = True):
    """Inside ``with exact_mode():`` the package's models (``Qwen3``) run their exact forward
    (every row bit-identical to the one-row, one-token computation at the same logical position);
    ``enabled=False`` turns it off inside an enclosing one. Thread-local; nests."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    before = getattr(_STATE, "on", False)
    _STATE.on = enabled
    try:
        yield
    finally:
        _STATE.on = before


def exact_enabled() -> bool:
    """Whether the calling thread is inside :func:`exact_mode`."""
    return getattr(_STATE, "on", False)


UNVERIFIED_ENV = "JETSPEC_EXACT_UNVERIFIED"     # "1": run the triton path on an unshown GPU
GEMM_TILES = EXACT_GEMM_TILES      # the exact GEMM's tile shapes (limits.py)


@functools.lru_cache(maxsize=None)
def exact_verified_devices() -> tuple[str, ...]:
    """The GPU models (``torch.cuda.get_device_name``) on which the triton exact path passed its
    invariance tests: the hardware record's ``exact.triton`` list (empty until a run shows it)."""
    record = json.loads(_backend.HARDWARE_RECORD.read_text())
    devices = record.get("exact", {}).get("triton", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise ValueError(f"hardware record {_backend.HARDWARE_RECORD}: 'exact.triton' must be a list "
                         f"of device names, got {devices!r}")
    return tuple(devices)


def exact_backend(op: str, device: torch.device, backend: str | None) -> str:
    """The backend an exact call of ``op`` on ``device`` runs on, or :class:`ExactModeError`.

    ``backend`` (None: the process default) may be ``auto``, ``reference`` or ``triton``. On the
    CPU ``auto`` resolves to the reference; on a GPU to triton, which runs there only on a device
    model the hardware record lists (:func:`exact_verified_devices`) or with
    ``JETSPEC_EXACT_UNVERIFIED=1``; the reference on a GPU (torch's kernels) is refused."""
    name = _backend.get_backend() if backend is None else backend
    if name not in ("auto", "reference", "triton"):
        raise ExactModeError(f"exact mode: {op} on the {name!r} backend is not row-invariant yet "
                             "(exact paths: reference on the CPU, triton); pass backend='triton', "
                             "'reference' or 'auto'")
    if device.type == "cpu":
        return "reference" if name == "auto" else _runnable(op, name, device)
    if device.type != "cuda":
        raise ExactModeError(f"exact mode: {op} on {device.type} is not shown row-invariant "
                             "(exact paths: the CPU reference, triton on the CPU or a CUDA GPU)")
    if name == "reference":
        raise ExactModeError(f"exact mode: {op} on cuda with the reference backend: torch's GPU "
                             "kernels (cuBLAS GEMMs, reductions) are not row-invariant; pass "
                             "backend='triton' or 'auto'")
    shown = exact_verified_devices()
    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "no CUDA device"
    if gpu not in shown and os.environ.get(UNVERIFIED_ENV) != "1":
        raise ExactModeError(f"exact mode: {op} on cuda ({gpu}) is not shown row-invariant yet: "
                             "the hardware record lists the triton exact path as passed on "
                             f"{list(shown) or 'no GPU'}; {UNVERIFIED_ENV}=1 runs it unverified")
    return _runnable(op, "triton", device)


def _runnable(op: str, name: str, device: torch.device) -> str:
    """``name``, or BackendUnavailableError saying why it cannot run on ``device`` (triton
    without its interpreter on CPU tensors, triton not importable), as ``backend.select`` says
    for the ops that go through it."""
    reason = _backend.unavailable_reason(name, device)
    if reason is not None:
        raise _backend.BackendUnavailableError(f"exact mode: {op} on the {name!r} backend is not "
                                               f"available: {reason}")
    return name


def per_row(fn, x: torch.Tensor, *others: torch.Tensor):
    """``fn`` applied to every row of ``x [..., D]`` as its own one-row call ``fn(row [1, D],
    *other_rows)`` on fresh contiguous copies (``others``: tensors of x's leading shape, split
    the same way). ``fn`` returns one ``[1, E]`` tensor or a tuple of them; the rows are stacked
    back to ``[..., E]`` (each element of a tuple likewise)."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    split = [o.reshape(rows.shape[0], -1) for o in others]
    outs = [fn(rows[r:r + 1].clone(), *(o[r:r + 1].clone() for o in split))
            for r in range(rows.shape[0])]
    if not outs:                                       # no rows: one empty call for the shapes
        out = fn(rows, *split)
        if isinstance(out, tuple):
            return tuple(o.reshape(*lead, o.shape[-1]) for o in out)
        return out.reshape(*lead, out.shape[-1])
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(col, dim=0).reshape(*lead, -1) for col in zip(*outs))
    return torch.cat(outs, dim=0).reshape(*lead, -1)


def forward_scope(backend: str):
    """The context one exact forward runs its layers in: on triton, the attention's per-tree
    tables (``triton.exact_attention.tail_order``) computed once for all the layers that share a
    tree mask, not once a layer; a no-op on the reference."""
    if backend != "triton":
        return contextlib.nullcontext()
    from ..triton.exact_attention import tail_order_scope
    return tail_order_scope()


def sum_in_order(parts) -> torch.Tensor:
    """The exact mode's sum of same-shape tensors: element by element in the given order, in
    float32, rounded once to the parts' dtype (each element's bits depend only on the parts'
    values at that element, never on the tensors' size, as a reduction kernel's order may)."""
    total = parts[0].float()
    for part in parts[1:]:
        total = total + part.float()
    return total.to(parts[0].dtype)


def sum_pairwise(parts, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Same-shape tensors summed element by element along a fixed pairwise tree, in float32,
    rounded once to ``dtype`` (None: float32): parts 0 + 1, 2 + 3, ..., then those sums in pairs
    likewise, an odd last one carried to the next level. For 2^a parts the tree over any aligned
    run of 2^b of them is that run's own tree, so a sum of per-rank sums (each rank holding a
    run) is the sum of the whole: the exact mode's tensor-parallel reduction."""
    level = [p.float() for p in parts]
    if not level:
        raise ValueError("parts must hold at least one tensor")
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0] if dtype is None else level[0].to(dtype)


def k_parts_ok(parts, k: int | None = None) -> bool:
    """Whether ``parts`` is a split of K the exact mode takes: an int (not a bool), a power of
    two, at most ``limits.EXACT_MAX_K_PARTS``, dividing ``k`` when given."""
    return (isinstance(parts, int) and not isinstance(parts, bool) and 1 <= parts <= EXACT_MAX_K_PARTS
            and parts & (parts - 1) == 0 and (k is None or k % parts == 0))


def linear(x: torch.Tensor, weight: torch.Tensor, *, backend: str | None = None,
           tile: str = "narrow", parts: int = 1, partial: bool = False) -> torch.Tensor:
    """``F.linear(x, weight)`` with every row's bits independent of the other rows and of M.

    Parameters
    ----------
    x : float [..., K]; weight : x.dtype [N, K]; backend : see :func:`exact_backend`
    tile : the triton GEMM's tile shape, ``"narrow"`` or ``"wide"`` (``triton.exact_matmul.tiles``:
        an engine's choice, fixed for all its calls; a row's bits depend on it). The reference
        computes every row alone whatever the tile, so its rows are the same bits under both.
    parts : K reduced in this many equal slices (a power of two dividing K, at most
        ``limits.EXACT_MAX_K_PARTS``), each alone, their float32 products added by
        :func:`sum_pairwise`'s tree: a fixed split of K chosen by the engine (the target's
        ``exact_k_parts``), never by M. With ``parts`` > 1 or ``partial`` the reference
        computes every part in float32 (exact products of 16-bit inputs).
    partial : return the float32 sum unrounded (a tensor-parallel rank's share, added across the
        ranks by ``tp.all_reduce_pairwise`` before one rounding), else rounded to x.dtype

    Returns
    -------
    [..., N], x.dtype (float32 with ``partial``): on the reference one M = 1 GEMM per row and
    part (row r of the one-part form is ``F.linear(x_r [1, K], weight)`` bit for bit); on triton
    the fixed-tile GEMM (``triton.exact_matmul``).
    """
    if tile not in GEMM_TILES:
        raise ValueError(f"tile must be one of {GEMM_TILES}, got {tile!r}")
    k = weight.shape[-1]
    if not k_parts_ok(parts, k):
        raise ValueError(f"parts must be a power of two <= {EXACT_MAX_K_PARTS} dividing K = {k}, "
                         f"got {parts!r}")
    out_dtype = torch.float32 if partial else x.dtype
    if exact_backend("linear", x.device, backend) == "triton":
        from ..triton.exact_matmul import exact_linear, exact_linear_parts, sum_parts_pairwise
        unit = (lambda t: t if t.stride(-1) == 1 else t.contiguous())   # a copy: the same values
        if parts == 1:
            return exact_linear(unit(x), unit(weight), tile, out_dtype=out_dtype)
        return sum_parts_pairwise(exact_linear_parts(unit(x), unit(weight), parts, tile), out_dtype)
    n = weight.shape[0]
    if parts == 1 and not partial:
        w = _rows_padded(weight)
        return per_row(lambda r: F.linear(r, w)[:, :n], x)
    # Each part's slice as a fresh float32 tensor (aligned as any new tensor): a rank holding
    # that slice of K alone (tp.rowwise's copy) makes the same GEMV on the same values.
    step = k // parts
    w_parts = [_rows_padded(_fresh(weight[:, p * step:(p + 1) * step], torch.float32))
               for p in range(parts)]
    return per_row(lambda r: sum_pairwise(
        [F.linear(_fresh(r[:, p * step:(p + 1) * step], torch.float32), w_parts[p])[:, :n]
         for p in range(parts)], out_dtype), x)


_GEMV_ROWS = 64     # the reference's weights padded to a multiple of this many rows (see below)


def _fresh(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous copy of ``t`` in ``dtype`` (never a view: a view's address is its
    parent's plus an offset, and the CPU GEMV's bits follow the alignment)."""
    return t.to(dtype, memory_format=torch.contiguous_format, copy=True)


def _rows_padded(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` with zero rows appended up to a multiple of 64 (itself when it is one).
    The CPU's one-row GEMV gives a column other bits when N is not a multiple of its column
    group (float32, N % 4 != 0 here), so a column's bits would follow N, which a tensor-parallel
    rank's slice of the columns changes; padded, every column is in a whole group."""
    extra = -weight.shape[0] % _GEMV_ROWS
    if extra == 0:
        return weight
    return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])])


def rms_norm(x, weight, *, eps: float = 1e-6, residual=None, backend: str | None = None):
    """:func:`jetspec_kernels.rms_norm`, exact (same arguments and results): row by row on the
    reference; on triton one launch (a program per row, its block from H alone)."""
    be = exact_backend("rms_norm", x.device, backend)
    if be == "triton":
        return _rms_norm(x, weight, eps=eps, residual=residual, backend=be)
    if residual is None:
        return per_row(lambda r: _rms_norm(r, weight, eps=eps, backend=be), x)
    return per_row(lambda r, s: _rms_norm(r, weight, eps=eps, residual=s, backend=be), x, residual)


_LANE_PAD = 128      # the reference's elementwise rows padded to a multiple of this (see lanes)


def lanes(fn, *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)``, an elementwise function of same-shape tensors ``[..., D]``, with each
    operand's last dim padded with zeros to a multiple of 128 and the result cut back to D.

    The reference's guard against the CPU's vectorised loops: they give a launch's last elements
    a scalar tail whose exp, sigmoid or silu can differ from the vector body's in the last bit,
    so without padding an element's bits would follow the row's length, which tensor
    parallelism changes (a rank holds a slice of the heads or of I). Padded, every element sits
    in a whole vector chunk, wherever it is."""
    pad = -xs[0].shape[-1] % _LANE_PAD
    if pad == 0:
        return fn(*xs)
    return fn(*(F.pad(x, (0, pad)) for x in xs))[..., :xs[0].shape[-1]]


def silu_mul(x, *, backend: str | None = None):
    """:func:`jetspec_kernels.silu_mul`, exact: row by row on the reference; one launch on triton
    (elementwise: a program per row and column block).

    On the reference each half of a row is padded with zeros to a multiple of 128 elements: the
    CPU's vectorised loop gives a launch's last elements a scalar tail whose exp can differ in
    the last bit, so without it a column's bits would follow I (a tensor-parallel rank's slice
    of I puts a column in another place of its row: float32 I 48 split in two differed)."""
    be = exact_backend("silu_mul", x.device, backend)
    if be == "triton":
        return _silu_mul(x, backend=be)

    def padded(r):       # [rows, 2I] -> [rows, I]: each half on padded lanes
        half = r.shape[-1] // 2
        if r.shape[-1] % 2 or not r.dtype.is_floating_point:
            return _silu_mul(r, backend=be)             # its own error, naming the argument
        return lanes(lambda gate, up: _silu_mul(torch.cat([gate, up], dim=-1), backend=be),
                     r[:, :half], r[:, half:])
    return per_row(padded, x)


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, *,
                        rope_theta: float, eps: float = 1e-6, block_table=None, cache_start=None,
                        rotary_dim: int | None = None, backend: str | None = None):
    """:func:`jetspec_kernels.qk_norm_rope_append`, exact: on the reference one ``[1, 1]`` call
    per (sequence, row), each with its own position and cache slot; on triton one launch (a
    program per token, its head tiles from the head counts alone). Same arguments and results
    (``q`` required here)."""
    be = exact_backend("qk_norm_rope_append", k.device, backend)
    if be == "triton":
        return _qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                    rope_theta=rope_theta, eps=eps, block_table=block_table,
                                    cache_start=cache_start, rotary_dim=rotary_dim, backend=be)
    b, n = k.shape[:2]
    out = torch.empty_like(q)
    starts = positions if cache_start is None else cache_start[:, None] + torch.arange(
        n, dtype=cache_start.dtype, device=k.device)
    for s in range(b):
        kc, vc = (k_cache, v_cache) if block_table is not None else (k_cache[s:s + 1], v_cache[s:s + 1])
        table = None if block_table is None else block_table[s:s + 1]
        for i in range(n):
            row = (slice(s, s + 1), slice(i, i + 1))
            start = torch.empty(1, dtype=torch.int32, device=k.device)
            start.copy_(starts[s, i])
            out[row] = _qk_norm_rope_append(
                q[row].clone(), k[row].clone(), v[row].clone(), q_norm_w, k_norm_w,
                positions[row].clone(), kc, vc, rope_theta=rope_theta, eps=eps,
                block_table=table, cache_start=start, rotary_dim=rotary_dim, backend=be)
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """int32 ``[...]``: argmax over the last dim of ``logits [..., V]`` (ties to the lower id). A
    row's argmax depends only on its values (a max is exact); on the CPU the row loop keeps it so
    whatever reduction scheme torch picks for the launch, on a GPU torch's argmax (first index
    of the max) is exact as it is."""
    if logits.device.type == "cpu":
        return per_row(lambda r: torch.argmax(r, dim=-1, keepdim=True), logits)[..., 0].to(torch.int32)
    return torch.argmax(logits, dim=-1).to(torch.int32)


def exact_scope(exact, device: torch.device, backend: str | None = None):
    """The context a decoding loop runs in for its ``exact`` argument: :func:`exact_mode` when
    True (after refusing, by :class:`ExactModeError`, a device or backend without exact
    variants), else a no-op (an enclosing ``exact_mode()`` stays in force). ``exact`` must be a
    bool (TypeError)."""
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {type(exact).__name__} {exact!r}")
    if not exact:
        return contextlib.nullcontext()
    exact_backend("the target's forward", device, backend)
    return exact_mode()


def sample_at_positions(logits: torch.Tensor, positions: torch.Tensor, seed: torch.Tensor,
                        temperature, top_k=None, top_p=None) -> torch.Tensor:
    """The exact mode's sampler, pathwise: node i of sequence b is drawn by Gumbel-max with the
    noise keyed by ``(seed[b], positions[b, i], b)`` alone (``python_ref.sample_tokens`` with
    ``offset = positions[:, i]`` and N = 1), not by the round and the node's slot. A tree node
    and the autoregressive step at the same logical position then draw the same noise, so with
    the same logits (the exact mode) they sample the same token, and speculative sampling emits
    autoregressive sampling's tokens. Lossless in law: along the emitted path every position's
    noise is used once, independent of what chose the context.

    Parameters
    ----------
    logits : float [B, N, V]; positions : int [B, N] (each node's own position: its logits
    predict the next one); seed : int64 [B]; temperature, top_k, top_p : as
    ``python_ref.sample_tokens`` (float or [B] tensors; None: no filter)

    Returns
    -------
    int32 [B, N]
    """
    from ..python_ref.verify_tree import sample_tokens
    if logits.shape[1] == 0:
        return torch.empty(logits.shape[:2], dtype=torch.int32, device=logits.device)
    cols = [sample_tokens(logits[:, i:i + 1], temperature, seed, positions[:, i].to(torch.int64),
                          top_k, top_p)[:, 0] for i in range(logits.shape[1])]
    return torch.stack(cols, dim=1).to(torch.int32)
