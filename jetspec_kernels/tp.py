"""Tensor parallelism over ``torch.distributed`` (the gpt-fast way: shard the weights, all-reduce
the row-parallel outputs; NCCL on GPUs, gloo on CPUs).

A :class:`Shard` says where this process sits: the process group, its rank in it and the group's
size. Column-parallel weights keep this rank's slice of their output features (``[out, in]``:
rows), row-parallel weights this rank's slice of their input features (columns); the partial
outputs of a row-parallel matmul are summed with :func:`all_reduce`. Which checkpoint tensor is
split which way is the models' business (:mod:`jetspec_kernels.models.sharding`).

Every rank runs the same deterministic ops on identical inputs, and an all-reduce gives every
rank the same bits, so ranks agree by construction; :func:`check_same` verifies it when asked.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Shard", "ALONE", "CHECK_ENV", "default_group", "shard_of", "colwise", "rowwise",
           "all_reduce", "all_reduce_pairwise", "broadcast_first", "check_same", "fingerprint",
           "checks_requested"]

# JETSPEC_TP_CHECK=1: generate / generate_ar compare their emitted tokens across ranks once per run.
CHECK_ENV = "JETSPEC_TP_CHECK"


@dataclass(frozen=True)
class Shard:
    """This process's place in a tensor-parallel group.

    group : a ``torch.distributed`` ProcessGroup, or None when running alone
    rank : this process's rank in ``group`` (0 alone); size : ranks in ``group`` (1 alone)
    """

    group: object
    rank: int
    size: int

    @property
    def parallel(self) -> bool:
        """More than one rank: the models are sharded and their forwards all-reduce."""
        return self.size > 1


ALONE = Shard(None, 0, 1)     # no tensor parallelism, even inside an initialised process group


def default_group():
    """The default process group when one is initialised with more than one rank, else None."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def shard_of(group=None) -> Shard:
    """The :class:`Shard` of ``group``: None = :func:`default_group` (alone without one); a
    ProcessGroup; or a Shard (returned as it is, e.g. :data:`ALONE`, once its rank and size are
    this process's in its group: two processes claiming one rank would hold the same slices)."""
    if isinstance(group, Shard):
        return _checked(group)
    if group is None:
        group = default_group()
        if group is None:
            return ALONE
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: a process group was given but torch.distributed is not initialised")
    return Shard(group, dist.get_rank(group), dist.get_world_size(group))


def _checked(shard: Shard) -> Shard:
    """``shard`` itself if its rank and size are this process's (rank 0 of 1 without a group)."""
    if shard.group is None:
        real = (0, 1)
    elif not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: a Shard of a process group was given but torch.distributed is not "
                         "initialised")
    else:
        real = (dist.get_rank(shard.group), dist.get_world_size(shard.group))
    if (shard.rank, shard.size) != real:
        where = "without a process group" if shard.group is None else "in its process group"
        raise ValueError(f"group: the Shard says rank {shard.rank} of {shard.size}, but this process "
                         f"is rank {real[0]} of {real[1]} {where}")
    return shard


def _part(n: int, shard: Shard, what: str) -> tuple[int, int]:
    if n % shard.size:
        raise ValueError(f"{what}: {n} rows cannot be split evenly over tp={shard.size} ranks")
    step = n // shard.size
    return shard.rank * step, (shard.rank + 1) * step


def colwise(weight: torch.Tensor, shard: Shard, *, blocks: int = 1, what: str = "weight") -> torch.Tensor:
    """This rank's output features of a column-parallel weight.

    Parameters
    ----------
    weight : [..., out, in] (a linear layer's weight, or a stack of them, e.g. experts [E, out, in])
    blocks : ``out`` is ``blocks`` equal blocks side by side (a fused gate|up is 2); each block is
        split, and this rank's parts are concatenated in block order

    Returns
    -------
    [..., out / size, in], contiguous (a copy, so the full tensor can be freed); ``weight``
    itself when alone.
    """
    if not shard.parallel:
        return weight
    parts = weight.chunk(blocks, dim=-2)
    mine = []
    for part in parts:
        lo, hi = _part(part.shape[-2], shard, what)
        mine.append(part[..., lo:hi, :])
    return torch.cat(mine, dim=-2).contiguous()


def rowwise(weight: torch.Tensor, shard: Shard, *, what: str = "weight") -> torch.Tensor:
    """This rank's input features of a row-parallel weight [..., out, in] -> [..., out, in / size]
    (contiguous copy; ``weight`` itself when alone). Its outputs are partial sums: :func:`all_reduce`."""
    if not shard.parallel:
        return weight
    lo, hi = _part(weight.shape[-1], shard, what)
    return weight[..., lo:hi].contiguous()


def all_reduce(x: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place (returns ``x``; untouched alone). Capturable in a CUDA
    graph on NCCL; every rank receives the same bits."""
    if shard.parallel:
        dist.all_reduce(x, group=shard.group)
    return x


def all_reduce_pairwise(x: torch.Tensor, shard: Shard, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum ``x`` over the ranks element by element along a fixed pairwise tree in rank order
    (``ops.exact.sum_pairwise``: rank 0 + rank 1, rank 2 + rank 3, then those sums in pairs), in
    float32, rounded once to ``dtype`` (None: x.dtype), after gathering every rank's ``x``: a new
    tensor, the same bits on every rank (alone: ``x`` rounded to ``dtype``). Each element's bits
    depend only on the ranks' values at that element, never on the tensor's size, as
    ``all_reduce``'s may (its algorithm and order are the backend's choice per message): the
    exact mode's reduction. With float32 partials over whole K parts (``ops.exact.linear``'s
    ``parts``), the tree over the ranks continues each rank's tree over its parts."""
    out = x.dtype if dtype is None else dtype
    if not shard.parallel:
        return x.to(out)
    from .ops.exact import sum_pairwise
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(shard.size)]
    dist.all_gather(parts, x.contiguous(), group=shard.group)
    return sum_pairwise(parts, out)


def broadcast_first(x: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Overwrite ``x`` in place with the group's first rank's ``x`` (returns ``x``)."""
    if shard.parallel:
        dist.broadcast(x, src=dist.get_global_rank(shard.group, 0), group=shard.group)
    return x


def check_same(x: torch.Tensor, shard: Shard, what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` unless integer tensor ``x`` (same shape on every
    rank) holds the same values on every rank. Two all-reduces (min and max); collective: every
    rank of the group must call it."""
    if not shard.parallel:
        return
    lo, hi = x.to(torch.int64).clone(), x.to(torch.int64).clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=shard.group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=shard.group)
    if not torch.equal(lo, hi):
        raise RuntimeError(f"tensor parallelism: {what} differ across the {shard.size} ranks "
                           f"(rank {shard.rank})")


def fingerprint(value, device) -> torch.Tensor:
    """int64 [1] on ``device``: a hash of ``repr(value)`` (tensors as lists), for
    :func:`check_same` on arguments every rank must share."""
    def plain(v):
        if torch.is_tensor(v):
            return ("tensor", str(v.dtype), v.tolist())
        if isinstance(v, (list, tuple)):
            return [plain(e) for e in v]
        if isinstance(v, dict):
            return {k: plain(e) for k, e in v.items()}
        return v
    digest = hashlib.sha256(repr(plain(value)).encode()).digest()
    return torch.tensor([int.from_bytes(digest[:8], "little", signed=True)], device=device)


def checks_requested() -> bool:
    """``JETSPEC_TP_CHECK`` is set to something other than empty or 0."""
    return os.environ.get(CHECK_ENV, "") not in ("", "0")
