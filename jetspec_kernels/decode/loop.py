"""The decoding loops: :func:`generate` (JetSpec speculative decoding) and :func:`generate_ar`
(plain autoregressive decoding, the baseline).

Host syncs: one per round, reading whether every sequence is done (``done.all()``; adaptive: read
together with the chosen size, after the draft step), and one at the end to read the tokens and
statistics. With ``sync_every=k`` the read runs every k rounds instead (finished sequences are
frozen, so extra rounds change nothing but time; adaptive rounds keep the last size read). The
reference backend, used for CPU tensors, syncs inside its ops anyway, and the ops' argument
checks read values only for CPU tensors.

On CUDA the first round runs eagerly on a side stream (warm-up: kernel compilation, library
handles), then the steps are captured and replayed every later round (:class:`StepRunner`): one
draft graph, one verify graph per tree size (each captured after its first, eager, round); NVTX
ranges mark the stages.
"""
from __future__ import annotations

import time

import torch

from .. import backend as _backend
from .. import tp
from ..adaptive import AcceptanceCalibrator, CostModel
from ..adaptive.kept import kept_for
from ..ops.exact import exact_enabled, exact_scope, sample_at_positions
from .arguments import check_group, check_shared_args, checked_generate_args
from .graphs import StepRunner
from .measure import measure_round_costs
from .output import DecodeStats, GenerateOutput, TokenBuffer, finish
from .prefill import next_token, pad_prompts, prefill
from .speculative import SpeculativeDecode, start_speculative
from .stages import StageTimers

__all__ = ["generate", "generate_ar"]

# Device types whose tensors the host reads without waiting for a device: there adaptive rounds
# also check the done flags before drafting, so the last draft is not wasted.
_FREE_READS = ("cpu",)


def generate(target, head, prompt_ids, *, max_new_tokens: int, budget=64, topk: int = 8,
             algorithm: str = "topn", temperature=0.0, eos_token_id=None, seed: int = 0,
             page_size: int | None = None, fused_draft: bool = True,
             cuda_graphs: bool | None = None, sync_every: int = 1, top_k=0, top_p=1.0,
             cost_model=None, calibrator: AcceptanceCalibrator | None = None,
             group=None, exact: bool = False) -> GenerateOutput:
    """JetSpec speculative decoding for a batch of prompts of different lengths.

    Parameters
    ----------
    target : jetspec_kernels.models.Qwen3
    head : jetspec_kernels.models.DraftHead made for this target (its target_layer_ids index the
        target's layers; hidden size, vocabulary and device match the target's)
    prompt_ids : list of B non-empty lists of int token ids in [0, V)
    max_new_tokens : int >= 1, new tokens per prompt at most
    budget : int in [1, MAX_BUDGET] (jetspec_kernels.limits), tree capacity N (root included); or
        adaptive: ``"auto"`` (sizes 4, 8, 16, 32, 64, capped by what the head can draft) or a list
        of candidate sizes, one chosen per round for the batch (see :mod:`jetspec_kernels.adaptive`;
        needs "topn")
    topk : int in [1, min(MAX_TOPK, V)] (jetspec_kernels.limits), children per node
    algorithm : "topn" | "accum_logp"
    temperature : finite float >= 0, or float32/float64 tensor [B] on the target's device, one
        value per sequence (0 = greedy; > 0 samples losslessly from softmax(logits / T), filtered)
    eos_token_id : int, non-empty list of ints (each in [0, V)), or None; generation of a
        sequence stops after it
    seed : int (int64), the sampling seed (tokens depend on it only when temperature > 0)
    page_size : int, optional; use paged KV caches with this page size
    top_k : int >= 0 or int32/int64 tensor [B]: sample among the k most likely tokens (0 = off)
    top_p : float in (0, 1] or float32/float64 tensor [B]: then among the smallest set whose
        renormalised probability reaches top_p (1 = off); filters apply after the temperature,
        as in transformers, and only to sampled sequences; the output follows the filtered
        target distribution exactly (see jetspec_kernels.verify_tree)
    fused_draft : build the tree from the draft hidden states with ``draft_tree_from_hidden``
        (``head.draft_hidden``; the draft logits are never materialised); False: from
        ``head.cached_logits`` with ``draft_tree``
    cuda_graphs : capture the steps in CUDA graphs; default: on CUDA unless the backend is
        ``reference``
    sync_every : int >= 1, rounds between host-side done checks (stats.rounds counts every
        round run, including those after the last sequence finished)
    cost_model : adaptive only: a :class:`~jetspec_kernels.adaptive.CostModel`, dict {n: seconds}
        or callable; default: measured by :func:`measure_round_costs` on these prompts the first
        time (outside ``stats.seconds``) and kept for this model pair and configuration
    calibrator : adaptive only: an :class:`~jetspec_kernels.adaptive.AcceptanceCalibrator` on the
        models' device (updated in place); default: one kept for this model pair (greedy and
        sampling apart). Sampled tokens depend on the tree sizes chosen, so a fixed seed
        reproduces them only with a fixed cost model and calibrator state
    group : tensor parallelism: the ``torch.distributed`` process group the models are split
        over (their ``shard``); None: the default group when one is initialised with several
        ranks, else none. Every rank of the group calls generate with the same arguments (checked
        once, by a hash, at the start) and drafts, verifies and emits the same tokens; the
        forwards all-reduce inside (capturable on NCCL), the host still syncs once per round.
        With ``JETSPEC_TP_CHECK=1`` the emitted tokens are compared across ranks at the end.
        Adaptive budgets use the first rank's cost model on every rank
    exact : bool; run the target in the exact mode (``jetspec_kernels.exact_mode``): every
        verified row is the same bits as the autoregressive step's at its logical position, so
        greedy output equals ``generate_ar(..., exact=True)``'s bit for bit (DESIGN.md, "Exact
        mode"). The reference backend on the CPU or the target's ``fused_ops_backend="triton"``
        (a GPU only where the hardware record lists it), any tp (the same tp for both);
        elsewhere ``ExactModeError``

    Returns
    -------
    GenerateOutput(tokens: list of B lists of new token ids, stats: DecodeStats)

    Bad arguments raise ``TypeError`` (wrong type) or ``ValueError`` naming the argument, before
    any model work.
    """
    if exact is not False:      # the same call again, inside the exact mode (its arguments: locals())
        with exact_scope(exact, target.device, target.fused_ops_backend):
            return generate(**{**locals(), "exact": False})
    args = checked_generate_args(
        target, head, prompt_ids, max_new_tokens=max_new_tokens, budget=budget, topk=topk,
        algorithm=algorithm, temperature=temperature, eos_token_id=eos_token_id, seed=seed,
        page_size=page_size, fused_draft=fused_draft, cuda_graphs=cuda_graphs, sync_every=sync_every,
        top_k=top_k, top_p=top_p, cost_model=cost_model, calibrator=calibrator, group=group)
    dev = target.device
    shard = args.shard
    _check_ranks_share(shard, dev, "generate", prompt_ids, max_new_tokens, budget, topk, algorithm,
                       temperature, eos_token_id, seed, page_size, fused_draft, cuda_graphs,
                       sync_every, top_k, top_p)
    cuda_graphs = args.cuda_graphs
    costs = None
    if args.adaptive:
        calibrator, cost_model = _adaptive_defaults(
            target, head, prompt_ids, args, calibrator, cost_model, topk=topk,
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, page_size=page_size,
            fused_draft=fused_draft, cuda_graphs=cuda_graphs)
        costs = tp.broadcast_first(cost_model.tensor(args.sizes, dev), shard)

    t0 = time.perf_counter()
    stages = StageTimers(dev)
    stats = DecodeStats(cuda_graphs=bool(cuda_graphs), host_syncs_per_round=1.0 / sync_every,
                        budget_costs=cost_model.table(args.sizes) if args.adaptive else {},
                        tp=shard.size)
    decode = start_speculative(
        target, head, prompt_ids, args.taps, max_new_tokens=max_new_tokens, sizes=args.sizes,
        topk=topk, algorithm=algorithm, sampling=args.sampling, eos_token_id=eos_token_id,
        seed=seed, page_size=page_size, fused_draft=fused_draft, stages=stages,
        calibrator=calibrator, costs=costs)
    accepts = _run_rounds(decode, StepRunner(decode, cuda_graphs), sync_every, stats)
    _check_ranks_agree(decode.out, shard)
    return finish(stats, decode.out, stages, t0, accepts, decode.verdict_cols - 1)


def _check_ranks_share(shard: tp.Shard, device, fn: str, *arguments) -> None:
    """Tensor parallelism: every rank called ``fn`` with the same arguments (one collective)."""
    if shard.parallel:
        tp.check_same(tp.fingerprint(arguments, device), shard,
                      f"{fn}'s arguments (prompts, sampling, seed, sizes)")


def _check_ranks_agree(out: TokenBuffer, shard: tp.Shard) -> None:
    """Tensor parallelism with JETSPEC_TP_CHECK=1: every rank emitted the same tokens."""
    if shard.parallel and tp.checks_requested():
        tp.check_same(torch.cat([out.tokens, out.count[:, None]], dim=1), shard, "the emitted tokens")


def _adaptive_defaults(target, head, prompt_ids, args, calibrator, cost_model, *, topk,
                       temperature, top_k, top_p, seed, page_size, fused_draft, cuda_graphs):
    """The calibrator and :class:`CostModel` of an adaptive decode: the ones given, else the ones
    kept for this model pair (the cost model measured by :func:`measure_round_costs` the first
    time a configuration is seen)."""
    kept = kept_for(target, head)
    greedy = args.sampling.greedy
    if calibrator is None:
        calibrator = kept.setdefault(("calibrator", greedy), AcceptanceCalibrator(
            max_depth=head.block_size - 1, device=target.device))
    if cost_model is None:
        # The fused layer ops' backends too: auto's picks for them may differ from the other ops'.
        key = ("costs", len(prompt_ids), args.sizes, topk, greedy, page_size, fused_draft,
               cuda_graphs, _backend.resolve(target.device),
               *(_backend.resolve(target.device, fn=fn) for fn in _backend.REFERENCE_UNTIL_VERIFIED),
               target.fused_ops_backend, head.fused_ops_backend,
               exact_enabled() and (getattr(target, "exact_gemm_tile", "narrow"),
                                    getattr(target, "exact_k_parts", None)))
        if key not in kept:
            kept[key] = measure_round_costs(target, head, prompt_ids, args.sizes, topk=topk,
                                            temperature=temperature, top_k=top_k, top_p=top_p,
                                            seed=seed, page_size=page_size,
                                            fused_draft=fused_draft, cuda_graphs=cuda_graphs,
                                            group=args.shard)
        cost_model = kept[key]
    return calibrator, CostModel(cost_model)


def _run_rounds(decode: SpeculativeDecode, steps: StepRunner, sync_every: int,
                stats: DecodeStats) -> list:
    """Rounds until every sequence is done (read every ``sync_every`` rounds); returns each
    round's accept lengths and records the rounds and sizes in ``stats``."""
    sizes = decode.sizes
    accepts = []
    size = sizes[-1]
    early = not decode.adaptive or decode.prefix.device.type in _FREE_READS
    while True:
        poll = stats.rounds % sync_every == 0
        if poll and early and bool(decode.out.done.all()):  # the one host sync (per sync_every rounds)
            break
        steps.draft(choose=poll)
        if poll and decode.adaptive:
            done, choice = decode.poll()                  # adaptive: done flags and size together
            if done:
                break
            size = sizes[choice]
        accepts.append(steps.verify(size))
        stats.budget_sizes.append(size)
        stats.rounds += 1
    return accepts


def generate_ar(target, prompt_ids, *, max_new_tokens: int, temperature=0.0,
                eos_token_id=None, seed: int = 0, page_size: int | None = None, head=None,
                top_k=0, top_p=1.0, group=None, exact: bool = False, **unused) -> GenerateOutput:
    """Plain autoregressive decoding of ``target`` (the baseline; same output as :func:`generate`
    for greedy decoding, the same distribution when sampling).

    Parameters
    ----------
    target : Qwen3; prompt_ids, max_new_tokens, temperature, eos_token_id, seed, page_size,
        top_k, top_p, group, exact: as in :func:`generate`
    head, unused : accepted and ignored, so that one argument set serves both functions

    Returns
    -------
    GenerateOutput; stats.rounds counts decode steps (accept lengths are all 0).
    """
    if exact is not False:
        with exact_scope(exact, target.device, target.fused_ops_backend):
            kw = dict(locals(), exact=False)
            kw.update(kw.pop("unused"))
            return generate_ar(**kw)
    shard = check_group(group, target=target)
    sampling = check_shared_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id,
                                 seed, page_size, top_k, top_p)
    dev = target.device
    _check_ranks_share(shard, dev, "generate_ar", prompt_ids, max_new_tokens, temperature,
                       eos_token_id, seed, page_size, top_k, top_p)
    t0 = time.perf_counter()
    stages = StageTimers(dev)
    stats = DecodeStats(tp=shard.size)
    tokens, lens = pad_prompts(prompt_ids, dev)
    b, t_max = tokens.shape
    cache = target.new_cache(b, t_max + max_new_tokens + 1, page_size=page_size)
    out = TokenBuffer(b, max_new_tokens, 1, eos_token_id, dev)
    seed_t = torch.full((b,), int(seed), dtype=torch.int64, device=dev)
    with stages("prefill"):
        token, _ = prefill(target, tokens, lens, cache, sampling, seed_t, out)
    offset = torch.zeros_like(seed_t)
    prefix = lens.clone()
    while not bool(out.done.all()):          # the one host sync per step
        active = (~out.done).to(torch.int32)     # one token per active sequence
        offset.add_(1)
        with stages("decode"):
            logits = target.decode(token, prefix, cache)
            if exact_enabled() and not sampling.greedy:     # pathwise, as generate's exact mode
                token = sample_at_positions(logits[:, None], prefix[:, None], seed_t,
                                            sampling.temperature, sampling.top_k, sampling.top_p)[:, 0]
            else:
                token = next_token(logits, sampling, seed_t, offset)
        with stages("emit"):
            prefix.add_(active)
            out.emit(token[:, None], active)
        stats.rounds += 1
    _check_ranks_agree(out, shard)
    return finish(stats, out, stages, t0, [], 0)
