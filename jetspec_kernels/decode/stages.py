"""Per-stage timers of a decode (``DecodeStats.stage_seconds``) and their NVTX ranges."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

__all__ = ["StageTimers", "NoStages"]


class StageTimers:
    """``with stages(name):`` adds the block's time to stage ``name``: CUDA events on CUDA (read
    once, by :meth:`result`), wall clock on the CPU; on CUDA also an NVTX range."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = defaultdict(float)
        self.events: list = []

    @contextmanager
    def __call__(self, name: str):
        if not self.cuda:
            t0 = time.perf_counter()
            yield
            self.totals[name] += time.perf_counter() - t0
            return
        torch.cuda.nvtx.range_push(name)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        torch.cuda.nvtx.range_pop()
        self.events.append((name, start, end))

    def result(self) -> dict[str, float]:
        """Seconds per stage (synchronises the device on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            for name, start, end in self.events:
                self.totals[name] += start.elapsed_time(end) / 1e3
            self.events = []
        return dict(self.totals)


class NoStages:
    """Timers that time nothing (graph capture, cost measurement)."""

    @contextmanager
    def __call__(self, name):
        yield
