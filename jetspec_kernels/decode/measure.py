"""Measure the cost model of adaptive decoding on a throwaway decode (the timing itself is
:func:`jetspec_kernels.adaptive.round_costs.time_rounds`)."""
from __future__ import annotations

import torch

from ..adaptive import AcceptanceCalibrator, CostModel
from ..adaptive.round_costs import time_rounds
from .. import checks
from .arguments import checked_generate_args
from .graphs import StepRunner
from .speculative import start_speculative, verdict_cols
from .stages import NoStages

__all__ = ["measure_round_costs"]


def measure_round_costs(target, head, prompt_ids, sizes="auto", *, rounds: int = 10, topk: int = 8,
                        temperature=0.0, top_k=0, top_p=1.0, seed: int = 0,
                        page_size: int | None = None, fused_draft: bool = True,
                        cuda_graphs: bool | None = None, group=None) -> CostModel:
    """Measure the cost model of adaptive decoding: the time of a round at each candidate size.

    Decodes ``prompt_ids`` (the batch size is ``len(prompt_ids)``) with adaptive rounds forced to
    each size in turn: one warm-up round per size (on CUDA: the graph captures), then ``rounds``
    timed rounds per size, sizes interleaved so that drift in the machine's load hits them alike.
    A round is timed from the draft step to the end of the verify step (the choice and the host
    sync included), with the device synchronised. Each cycle over the sizes is divided by its
    geometric mean (the machine's load then, shared by its rounds); a size's cost is its median
    ratio times the median load, made non-decreasing in n by pooling adjacent violators (a larger
    topn tree holds the smaller one: a cheaper larger tree is noise). The decode is thrown away
    (its calibrator too).

    Parameters
    ----------
    target, head, prompt_ids, topk, temperature, top_k, top_p, seed, page_size, fused_draft,
    cuda_graphs, group : as in :func:`generate` (tensor parallelism: every rank times its own
        rounds, so the models differ per rank; generate uses the first rank's)
    sizes : "auto" or a list of candidate sizes (as ``generate``'s adaptive ``budget``)
    rounds : int >= 1, timed rounds per size

    Returns
    -------
    CostModel {n: seconds per round}
    """
    args = checked_generate_args(
        target, head, prompt_ids, max_new_tokens=1, budget=sizes, topk=topk, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, page_size=page_size, fused_draft=fused_draft,
        cuda_graphs=cuda_graphs, group=group)
    checks.integer("rounds", rounds, lo=1)
    dev = target.device
    cuda_graphs = args.cuda_graphs
    sizes = args.sizes
    decode = start_speculative(
        target, head, prompt_ids, args.taps,
        max_new_tokens=(rounds + 1) * len(sizes) * verdict_cols(head, sizes[-1]), sizes=sizes,
        topk=topk, algorithm="topn", sampling=args.sampling, eos_token_id=None, seed=seed,
        page_size=page_size, fused_draft=fused_draft, stages=NoStages(),
        calibrator=AcceptanceCalibrator(max_depth=head.block_size - 1, device=dev),
        costs=torch.ones(len(sizes), dtype=torch.float32, device=dev))
    steps = StepRunner(decode, cuda_graphs)

    def one_round(n: int) -> None:
        steps.draft(choose=True)
        decode.poll()
        steps.verify(n)

    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    return time_rounds(one_round, sizes, rounds, sync)
