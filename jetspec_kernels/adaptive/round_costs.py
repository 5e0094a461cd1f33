"""The cost of a decoding round at each tree size: :class:`CostModel`, and how it is measured.

:func:`time_rounds` times a round at each candidate size (sizes interleaved, so that drift in the
machine's load hits them alike); :func:`cycle_costs` turns the timed cycles into one cost per
size. :func:`jetspec_kernels.decode.measure_round_costs` runs it on a throwaway decode.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

__all__ = ["CostModel", "time_rounds", "cycle_costs", "non_decreasing"]


class CostModel:
    """Seconds per decoding round as a function of the tree size n, for one model pair, batch size
    and device (measured by timing rounds, see :func:`jetspec_kernels.decode.measure_round_costs`,
    or given).

    Parameters
    ----------
    costs : dict {n: seconds} (int n >= 1, finite seconds > 0) or a callable n -> seconds
    """

    def __init__(self, costs: dict | Callable[[int], float]):
        if isinstance(costs, CostModel):
            costs = costs.costs
        if isinstance(costs, dict):
            if not costs:
                raise ValueError("cost_model must hold at least one size, got an empty dict")
            checked = {}
            for n, c in costs.items():
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"cost_model keys must be tree sizes (ints >= 1), got {n!r}")
                checked[n] = self._seconds(n, c)
            costs = checked
        elif not callable(costs):
            raise TypeError(f"cost_model must be a dict {{n: seconds}}, a callable or a CostModel, got "
                            f"{type(costs).__name__}")
        self.costs = costs

    @staticmethod
    def _seconds(n: int, c) -> float:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
            raise ValueError(f"cost_model[{n}] must be a finite number of seconds > 0, got {c!r}")
        return float(c)

    def __call__(self, n: int) -> float:
        if isinstance(self.costs, dict):
            if n not in self.costs:
                raise ValueError(f"cost_model has no cost for tree size {n} (it has "
                                 f"{sorted(self.costs)})")
            return self.costs[n]
        return self._seconds(n, self.costs(n))

    def table(self, sizes) -> dict[int, float]:
        """{n: seconds} for each candidate size (validated)."""
        return {int(n): self(int(n)) for n in sizes}

    def tensor(self, sizes, device=None) -> torch.Tensor:
        """float32 [S]: the cost of each candidate size."""
        return torch.tensor([self(int(n)) for n in sizes], dtype=torch.float32, device=device)

    def __repr__(self) -> str:
        if isinstance(self.costs, dict):
            inner = ", ".join(f"{n}: {c * 1e3:.3g} ms" for n, c in sorted(self.costs.items()))
            return f"CostModel({{{inner}}})"
        return f"CostModel({self.costs!r})"


def time_rounds(run_round: Callable[[int], None], sizes, rounds: int,
                sync: Callable[[], None]) -> CostModel:
    """Measure the cost of a round at each size.

    Runs one warm-up cycle over ``sizes`` (on CUDA: the graph captures), then ``rounds`` timed
    cycles. A round is ``run_round(n)``, timed with ``sync()`` (the device synchronised) before
    and after it.

    Parameters
    ----------
    run_round : callable n -> None, one decoding round with a tree of n nodes
    sizes : candidate sizes, ascending
    rounds : int >= 1, timed rounds per size
    sync : callable, waits for the device

    Returns
    -------
    CostModel {n: seconds per round} (see :func:`cycle_costs`)
    """
    cycles = []                                   # per cycle: one time per size
    for rep in range(rounds + 1):
        times = []
        for n in sizes:
            sync()
            t0 = time.perf_counter()
            run_round(n)
            sync()
            times.append(time.perf_counter() - t0)
        if rep:
            cycles.append(torch.tensor(times, dtype=torch.float64))
    return CostModel(dict(zip(sizes, cycle_costs(torch.stack(cycles)))))


def cycle_costs(times: torch.Tensor) -> list[float]:
    """Seconds per size from float64 [cycles, sizes] round times: a cycle's times share its
    machine load, so divide it out (the cycle's geometric mean), take each size's median ratio,
    scale back by the median load, and make the result non-decreasing (a larger topn tree holds
    the smaller one: a cheaper larger tree is noise)."""
    load = times.log().mean(1, keepdim=True).exp()
    return non_decreasing(((times / load).median(0).values * load.median()).tolist())


def non_decreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks = []                                   # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(count)]
