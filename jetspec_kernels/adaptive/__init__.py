"""Adaptive tree budget: each round picks its tree size from the draft's own confidence and the
measured cost of verifying it (docs/DESIGN.md section 4b).

    budget.py       the per-round choice: expected accepted length of every size
                    (expected_accept_curve*), AcceptanceCalibrator, choose_budget*, parse_budget
    round_costs.py  CostModel (seconds per round at each size) and how rounds are timed
    kept.py         what generate keeps per model pair (measured costs, calibrators)

:func:`jetspec_kernels.decode.generate` uses it with ``budget="auto"`` (or a list of sizes);
:func:`jetspec_kernels.decode.measure_round_costs` measures a cost model.
"""
from .budget import (DEFAULT_SIZES, AcceptanceCalibrator, choose_budget, choose_budget_from_topk,
                     expected_accept_curve, expected_accept_curve_from_topk, parse_budget)
from .round_costs import CostModel

__all__ = ["DEFAULT_SIZES", "AcceptanceCalibrator", "CostModel", "choose_budget",
           "choose_budget_from_topk", "expected_accept_curve", "expected_accept_curve_from_topk",
           "parse_budget"]
