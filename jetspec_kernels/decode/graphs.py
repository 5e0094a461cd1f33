"""Runs a :class:`~jetspec_kernels.decode.speculative.SpeculativeDecode`'s two steps eagerly or
replayed from CUDA graphs."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .speculative import SpeculativeDecode
from .stages import NoStages

__all__ = ["StepRunner"]


class StepRunner:
    """One draft graph, one verify graph per tree size, each captured after its step's first
    (eager, side-stream) run; ``cuda_graphs`` False: every step eager.

    Capture records without executing, so no state moves; replays then read and update the
    decode's static buffers in place. The graphs share one memory pool: the draft graph's outputs
    stay referenced (the decode holds them), each verify graph's accept buffer is kept and copied
    right after its replay, and graphs never run concurrently. Not exercised by the CPU suite.
    """

    def __init__(self, decode: SpeculativeDecode, cuda_graphs: bool):
        self.decode, self.cuda_graphs = decode, cuda_graphs
        self.side = torch.cuda.Stream() if cuda_graphs else None
        self.draft_graph = None
        self.verify_graphs: dict[int, tuple] = {}    # size -> (graph, its accept buffer)

    @contextmanager
    def _side(self):
        if self.side is None:
            yield
            return
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            yield
        torch.cuda.current_stream().wait_stream(self.side)

    def draft(self, choose: bool) -> None:
        """Run the draft step (``choose``: adaptive, pick the size too; always, once graphed)."""
        if self.draft_graph is not None:
            with self.decode.stages("draft_step"):
                self.draft_graph.replay()
            return
        with self._side():
            self.decode.draft_step(choose)

    def verify(self, size: int) -> torch.Tensor:
        """Run the verify step for a tree of ``size`` nodes; returns this round's accept lengths."""
        graph = self.verify_graphs.get(size)
        if graph is not None:
            with self.decode.stages("verify_step"):
                graph[0].replay()
            return graph[1].clone()
        with self._side():
            accept = self.decode.verify_step(size)
        if self.cuda_graphs:
            self._capture(size)
        return accept

    def _capture(self, size: int) -> None:
        decode = self.decode
        real_stages, decode.stages = decode.stages, NoStages()
        with self._side():
            if self.draft_graph is None:
                self.draft_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.draft_graph, stream=self.side):
                    decode.draft_step(True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.draft_graph.pool(), stream=self.side):
                decode.verify_step(size)
        decode.stages = real_stages
        self.verify_graphs[size] = (graph, decode.accept)
