"""The minimal JetSpec speculative decoding loop and the autoregressive baseline.

One round, all on the device, with static buffers (so it can be captured in CUDA graphs): a draft
step (draft head, tree) and a verify step (target forward over the tree, verify_tree, commit_kv,
draft context append, emit); see :mod:`.speculative`. Prefill runs the whole prompt and samples
the first new token, which is the first anchor.

Adaptive budget (``budget="auto"`` or a list of sizes, see :mod:`jetspec_kernels.adaptive`): the
draft step stops at the per-depth top-K and chooses the size on the device from it
(:func:`~jetspec_kernels.adaptive.choose_budget_from_topk`); the verify step builds the topn tree of
the chosen size from the same top-K (exactly ``draft_tree(budget=n)``) and updates the calibrator.

Modules, one job each:
    loop.py         generate, generate_ar: the loops and their host syncs
    arguments.py    argument checks (check_generate_args) and the sampling controls
    prefill.py      prompts to tensors, the prompt forward and the first new token
    speculative.py  SpeculativeDecode: caches, the draft step and the verify step
    graphs.py       StepRunner: the steps eagerly or replayed from CUDA graphs
    output.py       the device-side token buffer, DecodeStats, GenerateOutput
    stages.py       per-stage timers and NVTX ranges
    measure.py      measure_round_costs: the cost model of adaptive rounds
"""
from .arguments import check_generate_args
from .loop import generate, generate_ar
from .measure import measure_round_costs
from .output import DecodeStats, GenerateOutput

__all__ = ["generate", "generate_ar", "check_generate_args", "measure_round_costs", "GenerateOutput",
           "DecodeStats"]
