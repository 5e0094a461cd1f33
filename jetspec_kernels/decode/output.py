"""What a decode returns: the device-side token buffer, :class:`DecodeStats` and
:class:`GenerateOutput`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = ["DecodeStats", "GenerateOutput", "TokenBuffer", "finish"]


@dataclass
class DecodeStats:
    """Statistics of one :func:`generate` / :func:`generate_ar` call.

    rounds : int                 decoding rounds (steps for the baseline), prefill excluded
    accept_lengths : list[int]   draft tokens accepted, one entry per (active sequence, round)
    accept_histogram : list[int] count of each accept length 0..max_depth
    mean_accept : float          mean of accept_lengths
    tokens_per_round : float     mean tokens emitted per active sequence and round (accept + 1)
    new_tokens : int             tokens returned, all sequences
    seconds : float              wall time of the call (prefill included)
    tokens_per_s : float         new_tokens / seconds
    stage_seconds : dict         time per stage (prefill, draft, tree, verify, accept, commit,
                                 append, emit; adaptive also choose, calibrate;
                                 "draft_step"/"verify_step" when graphed)
    host_syncs_per_round : float 1 / sync_every (the done check)
    cuda_graphs : bool           whether the steps were replayed from CUDA graphs
    budget_sizes : list[int]     the tree size verified in each round
    budget_costs : dict          adaptive: the cost model's seconds per round at each candidate
                                 size ({} for a fixed budget)
    tp : int                     ranks the models are split over (tensor parallelism; 1 alone)
    """

    rounds: int = 0
    accept_lengths: list = field(default_factory=list)
    accept_histogram: list = field(default_factory=list)
    mean_accept: float = 0.0
    tokens_per_round: float = 0.0
    new_tokens: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    host_syncs_per_round: float = 1.0
    tp: int = 1
    cuda_graphs: bool = False
    budget_sizes: list = field(default_factory=list)
    budget_costs: dict = field(default_factory=dict)


@dataclass
class GenerateOutput:
    """``tokens``: one list of generated ids per prompt (prompt excluded, up to and including EOS);
    ``stats``: :class:`DecodeStats`."""

    tokens: list
    stats: DecodeStats


def _eos_tensor(eos_token_id, device):
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.int32, device=device)


class TokenBuffer:
    """Device-side output: tokens, count and done flag per sequence.

    ``max_emit``: the most tokens one :meth:`emit` writes per sequence (the verdict's columns);
    ``eos_token_id``: None, an int or a list of ints (checked)."""

    def __init__(self, batch: int, max_new: int, max_emit: int, eos_token_id, device):
        self.max_new = max_new
        self.trash = max_new + max_emit          # scatter target for rows that emit nothing
        self.tokens = torch.full((batch, self.trash + 1), -1, dtype=torch.int32, device=device)
        self.count = torch.zeros(batch, dtype=torch.int32, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = _eos_tensor(eos_token_id, device)
        self.cols = torch.arange(max_emit, dtype=torch.int64, device=device)
        # where()'s scalar operand would be a tensor made on the device at every call
        self.trash_col = torch.full((1,), self.trash, dtype=torch.int64, device=device)

    def emit(self, emitted: torch.Tensor, counts: torch.Tensor) -> None:
        """Append ``emitted[b, :counts[b]]`` (int32 [B, M], M <= max_emit; ``counts`` int32 [B],
        0 for a sequence that emits nothing); update ``done``. Seven launches without EOS ids: a
        round's emit runs in its CUDA graph, where each costs a launch gap."""
        m = emitted.shape[1]
        if m > self.cols.numel():   # a shape check: no host sync
            raise ValueError(f"emitted must have at most {self.cols.numel()} columns (max_emit), "
                             f"got shape {list(emitted.shape)}")
        col = self.cols[:m]
        valid = col < counts[:, None]
        pos = self.count[:, None] + col                  # int64: scatter's index dtype
        self.tokens.scatter_(1, torch.where(valid, pos, self.trash_col), emitted)
        self.count.add_(counts)
        hit = self.count >= self.max_new
        if self.eos is not None:   # an EOS past max_new needs no test: the count stops it
            hit = hit | (valid & torch.isin(emitted, self.eos)).any(dim=1)
        self.done.logical_or_(hit)

    def to_lists(self) -> list[list[int]]:
        """The tokens of each sequence, cut after its first EOS and at ``max_new``."""
        rows = self.tokens.cpu().tolist()
        counts = self.count.cpu().tolist()
        eos = set() if self.eos is None else set(self.eos.cpu().tolist())
        out = []
        for row, n in zip(rows, counts):
            row = row[:min(n, self.max_new)]
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            out.append(row if cut is None else row[:cut + 1])
        return out


def finish(stats: DecodeStats, out: TokenBuffer, stages, t0: float, accepts, max_depth: int
           ) -> GenerateOutput:
    """Read the tokens and fill ``stats`` (the call's final host sync); ``accepts``: each round's
    accept lengths (int32 [B], -1 for a finished sequence)."""
    tokens = out.to_lists()
    stats.stage_seconds = stages.result()
    stats.seconds = time.perf_counter() - t0
    stats.new_tokens = sum(len(t) for t in tokens)
    stats.tokens_per_s = stats.new_tokens / stats.seconds if stats.seconds > 0 else 0.0
    if accepts:
        acc = torch.stack(accepts).cpu().flatten()
        acc = acc[acc >= 0]
        stats.accept_lengths = acc.tolist()
        stats.accept_histogram = torch.bincount(acc.long(), minlength=max_depth + 1).tolist()
        if acc.numel():
            stats.mean_accept = float(acc.float().mean())
            stats.tokens_per_round = stats.mean_accept + 1.0
    return GenerateOutput(tokens, stats)
