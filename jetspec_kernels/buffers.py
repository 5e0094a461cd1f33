"""One allocation for an op's outputs and workspaces (bench/NOTES.md, "Host time per eager call").

An eager call on CUDA tensors pays the caching allocator once per ``torch.empty``; an op that makes
several small outputs and workspaces makes them as parts of one ``uint8`` buffer instead. Each part
is C-contiguous and starts on a multiple of ``align`` bytes (and of its element size): 16 (the
default) for workspaces, which the kernels may read with vector loads; the element size for
outputs a custom op returns (the kernels store them one element at a time), so that such a
buffer holds no padding: every byte of it is some output's, defined by the kernel (what
``torch.library.opcheck`` compares). A workspace needs only its address (the buffer's plus the
part's offset: no tensor made); an output is a view of the buffer. Outputs carved from one buffer
share its storage but not a byte: an in-place write to one cannot reach another.

A :class:`Layout` depends on shapes and dtypes alone and is computed once per distinct list of
parts (sizes that are not Python ints, as under ``torch.compile`` with dynamic shapes, are laid
out on every call). The ops' own layout functions are ``lru_cache``d too (a hit makes no Python
call); their fake implementations call the uncached ``__wrapped__`` (symbolic sizes do not hash),
and ``torch.compile`` traces the wrapped function.

A ``torch.library`` custom op may not return outputs that share storage (its dispatcher checks),
so a cuda op returns the buffer and its Python wrapper carves the outputs (:func:`carve`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch

ALIGN = 16      # workspaces
PACKED = 4      # outputs a custom op returns (4-byte elements: no padding between them)


class Part(NamedTuple):
    dtype: torch.dtype
    shape: tuple
    strides: tuple     # C-contiguous, in elements
    offset: int        # bytes from the buffer's start


class Layout(NamedTuple):
    nbytes: int        # the buffer's size: a multiple of align
    parts: tuple       # Part per (shape, dtype) asked for, in order
    offsets: tuple     # each part's offset (bytes)


def _round_up(x, m):
    return -(-x // m) * m


def _lay_out(specs, align) -> Layout:
    parts, at = [], 0
    for shape, dtype in specs:
        strides, numel = [], 1
        for d in reversed(shape):
            strides.append(numel)
            numel = numel * d
        at = _round_up(at, max(align, dtype.itemsize))
        parts.append(Part(dtype, tuple(shape), tuple(reversed(strides)), at))
        at = at + numel * dtype.itemsize
    return Layout(_round_up(at, align), tuple(parts), tuple(p.offset for p in parts))


_lay_out_cached = lru_cache(maxsize=4096)(_lay_out)


def layout(*specs, align: int = ALIGN) -> Layout:
    """The layout of parts ``(shape tuple, dtype), ...`` in one buffer, in the order given, each
    on a multiple of ``align`` bytes and of its element size."""
    try:
        return _lay_out_cached(specs, align)
    except TypeError:  # symbolic sizes (torch.compile): unhashable
        return _lay_out(specs, align)


def empty(lay: Layout, device) -> torch.Tensor:
    """An uninitialised ``uint8`` buffer of ``lay.nbytes`` on ``device`` (the one allocation)."""
    return torch.empty(lay.nbytes, dtype=torch.uint8, device=device)


def addresses(buf: torch.Tensor, lay: Layout) -> list[int]:
    """Device address of each part (for launches that need no tensor)."""
    return list(map(buf.data_ptr().__add__, lay.offsets))


def carve(buf: torch.Tensor, lay: Layout, count: int | None = None) -> list[torch.Tensor]:
    """Views of the first ``count`` parts (all by default) of ``buf`` (laid out by ``lay``):
    C-contiguous, disjoint, each of its part's shape and dtype."""
    typed = {}
    views = []
    for p in lay.parts[:count]:
        t = typed.get(p.dtype)
        if t is None:
            t = typed[p.dtype] = buf.view(p.dtype)   # (nbytes: a multiple of its itemsize)
        views.append(t.as_strided(p.shape, p.strides, p.offset // p.dtype.itemsize))
    return views
