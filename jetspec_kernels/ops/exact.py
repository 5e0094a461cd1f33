"""The exact mode: ops whose every output row is the same bits whatever else the launch holds.

A row's bits may depend on the launch around it: GEMM libraries pick kernels (and split-K) by M,
vectorised loops give the last elements of a launch a scalar tail, attention reduces a tree
node's keys in another order than a one-token decode step. The exact variants here remove that
dependence by construction: every row is computed by a one-row call on a fresh contiguous copy
of the row (the same launch shape, alignment and arguments for every row, so the same bits, on
a backend whose calls are deterministic), and attention gathers a row's visible keys into
logical order first (``python_ref.tree_attention.tree_attention_logical``). The price is one
call per row (docs/perf/exact_mode.md).

Only the CPU reference backend is shown invariant (tests/test_exact_*.py); an exact call that
would run elsewhere (a CUDA tensor, the triton or cuda backend) raises :class:`ExactModeError`
naming the op and the path, never silently computing a non-exact result.

:func:`exact_mode` is the switch the models read (``Qwen3.forward`` runs its exact form inside
it); ops take ``exact=`` or are called here explicitly, and never read the switch themselves, so
a draft head inside the same ``with`` keeps its fast path.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

from .. import backend as _backend
from .qk_norm_rope_append import qk_norm_rope_append as _qk_norm_rope_append
from .rms_norm import rms_norm as _rms_norm
from .silu_mul import silu_mul as _silu_mul

__all__ = ["ExactModeError", "exact_mode", "exact_enabled", "exact_backend", "exact_scope", "require_cpu",
           "per_row", "linear", "rms_norm", "silu_mul", "qk_norm_rope_append", "argmax",
           "sample_at_positions"]


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


def require_cpu(what: str, t: torch.Tensor) -> None:
    """Raise :class:`ExactModeError` unless ``t`` is a CPU tensor (``what`` names the op/path)."""
    if t.device.type != "cpu":
        raise ExactModeError(f"exact mode: {what} on {t.device.type} tensors is not shown "
                             "row-invariant yet (only the CPU reference path is); run exact mode on "
                             "the CPU or without exact")


def exact_backend(op: str, device: torch.device, backend: str | None,
                  shown: tuple[str, ...] = ()) -> str:
    """The backend an exact call of ``op`` runs on: the reference (``auto``, or the process
    default ``auto``, resolves to it), or a backend named in ``shown`` (an exact variant of
    ``op`` shown invariant on the CPU: the triton interpreter) when asked for by name. Another
    backend, or a non-CPU device, raises :class:`ExactModeError` naming the op and the backend."""
    name = _backend.get_backend() if backend is None else backend
    if name not in ("auto", "reference") + tuple(shown):
        raise ExactModeError(f"exact mode: {op} on the {name!r} backend is not row-invariant yet "
                             f"(exact variants: {', '.join(('reference',) + tuple(shown))}); pass "
                             "backend='reference' or 'auto'")
    if device.type != "cpu":
        raise ExactModeError(f"exact mode: {op} on {device.type} (backend {name!r}) is not shown "
                             "row-invariant yet (only CPU paths are: the reference backend"
                             + (", the triton interpreter" if shown else "") + ")")
    return "reference" if name == "auto" else name


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


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` with every row computed as an M = 1 GEMM.

    Parameters
    ----------
    x : float [..., K] (CPU); weight : x.dtype [N, K]

    Returns
    -------
    [..., N] in x.dtype; row r is ``F.linear(x_r [1, K], weight)`` bit for bit.
    """
    require_cpu("linear (torch.nn.functional.linear)", x)
    return per_row(lambda r: F.linear(r, weight), x)


def rms_norm(x, weight, *, eps: float = 1e-6, residual=None, backend: str | None = None):
    """:func:`jetspec_kernels.rms_norm` row by row (same arguments and results; the reference
    backend only, see :func:`exact_backend`)."""
    be = exact_backend("rms_norm", x.device, backend)
    if residual is None:
        return per_row(lambda r: _rms_norm(r, weight, eps=eps, backend=be), x)
    return per_row(lambda r, s: _rms_norm(r, weight, eps=eps, residual=s, backend=be), x, residual)


def silu_mul(x, *, backend: str | None = None):
    """:func:`jetspec_kernels.silu_mul` row by row (the reference backend only)."""
    be = exact_backend("silu_mul", x.device, backend)
    return per_row(lambda r: _silu_mul(r, backend=be), x)


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, *,
                        rope_theta: float, eps: float = 1e-6, block_table=None, cache_start=None,
                        rotary_dim: int | None = None, backend: str | None = None):
    """:func:`jetspec_kernels.qk_norm_rope_append` token by token: one ``[1, 1]`` call per
    (sequence, row), each with its own position and cache slot (the reference backend only).
    Same arguments and results (``q`` required here)."""
    be = exact_backend("qk_norm_rope_append", k.device, backend)
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
    """int32 ``[...]``: argmax over the last dim of ``logits [..., V]`` row by row (ties to the
    lower id). A row's argmax depends only on its values; the row loop keeps it so whatever
    reduction scheme torch picks for the launch."""
    require_cpu("argmax", logits)
    return per_row(lambda r: torch.argmax(r, dim=-1, keepdim=True), logits)[..., 0].to(torch.int32)


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
