"""The minimal JetSpec speculative decoding loop and the autoregressive baseline.

One round, all on the device, with static buffers (so it can be captured in CUDA graphs):

    draft step   head.draft_hidden -> draft_tree_from_hidden (or draft_tree on the logits)
    verify step  target.verify (tree K/V appended at slots prefix..prefix+N-1, tree attention,
                 taps) -> verify_tree -> commit_kv (all layers at once, taps gathered along the
                 path) -> head.append_context (accepted rows only) -> emit tokens, advance

Conventions: the anchor (node 0) is the last emitted token; its K/V are not yet in the target
cache and ``prefix`` counts the tokens before it. The draft context has exactly ``prefix`` rows.
Prefill runs the whole prompt and samples the first new token, which is the first anchor.

Adaptive budget (``budget="auto"`` or a list of sizes, see :mod:`jetspec_kernels.adaptive`): the
draft step stops at the per-depth top-K and chooses the size on the device from it
(:func:`~jetspec_kernels.adaptive.choose_budget_from_topk`); the verify step builds the topn tree of
the chosen size from the same top-K (exactly ``draft_tree(budget=n)``) and updates the calibrator.

Host syncs: one per round, reading whether every sequence is done (``done.all()``; adaptive: read
together with the chosen size, after the draft step), and one at the end to read the tokens and
statistics. With ``sync_every=k`` the read runs every k rounds instead (finished sequences are
frozen, so extra rounds change nothing but time; adaptive rounds keep the last size read). The
reference backend, used for CPU tensors, syncs inside its ops anyway, and the ops' argument
checks read values only for CPU tensors.

On CUDA the first round runs eagerly on a side stream (warm-up: kernel compilation, library
handles), then the steps are captured and replayed every later round: one draft graph, one
verify graph per tree size (each captured after its first, eager, round); NVTX ranges mark the
stages. The CUDA path has not been run on a GPU yet (tests/test_decode.py has a gpu test).
"""
from __future__ import annotations

import time
import weakref
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import backend as _backend
from .adaptive import AcceptanceCalibrator, CostModel, choose_budget_from_topk, parse_budget
from .ops import _checks as C
from .ops.commit_kv import commit_kv
from .ops.draft_tree import (ALGORITHMS, MAX_TOPK, _build, checked_topk, draft_tree,
                             draft_tree_from_hidden)
from .ops.verify_tree import check_sampling, verify_tree
from .tree import Tree

__all__ = ["generate", "generate_ar", "check_generate_args", "measure_round_costs", "GenerateOutput",
           "DecodeStats"]


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
    cuda_graphs: bool = False
    budget_sizes: list = field(default_factory=list)
    budget_costs: dict = field(default_factory=dict)


@dataclass
class GenerateOutput:
    """``tokens``: one list of generated ids per prompt (prompt excluded, up to and including EOS);
    ``stats``: :class:`DecodeStats`."""

    tokens: list
    stats: DecodeStats


class _Stages:
    """Per-stage timers (CUDA events on CUDA, resolved once at the end) and NVTX ranges."""

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
        if self.cuda:
            torch.cuda.synchronize()
            for name, start, end in self.events:
                self.totals[name] += start.elapsed_time(end) / 1e3
            self.events = []
        return dict(self.totals)


def _check_prompts(prompt_ids, vocab: int) -> None:
    """``prompt_ids``: a non-empty list of non-empty lists of int token ids in ``[0, vocab)``."""
    if not isinstance(prompt_ids, (list, tuple)):
        raise TypeError(f"prompt_ids must be a list of token-id lists, got {type(prompt_ids).__name__}")
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one prompt, got an empty list")
    for i, p in enumerate(prompt_ids):
        if not isinstance(p, (list, tuple)):
            raise TypeError(f"prompt_ids[{i}] must be a list of int token ids, got {type(p).__name__}")
        if not p:
            raise ValueError(f"prompt_ids[{i}] is empty (a prompt needs at least one token)")
        for j, tok in enumerate(p):
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise TypeError(f"prompt_ids[{i}][{j}] must be an int token id, got "
                                f"{type(tok).__name__} {tok!r}")
            if not 0 <= tok < vocab:
                raise ValueError(f"prompt_ids[{i}][{j}] = {tok} is outside the target's vocabulary "
                                 f"[0, {vocab})")


def _check_eos(eos_token_id, vocab: int) -> None:
    """None, an int, or a non-empty list of ints, each in ``[0, vocab)``."""
    if eos_token_id is None:
        return
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    if not ids:
        raise ValueError("eos_token_id must be None, an int or a non-empty list of ints, got []")
    for tok in ids:
        C.integer("eos_token_id", tok, lo=0, hi=vocab - 1)


class Sampling(NamedTuple):
    """Checked sampling controls (ops.verify_tree.check_sampling): temperature a float or float32
    [B]; top_k int32 [B] or None (off); top_p float32 [B] or None (off)."""

    temperature: float | torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None

    @property
    def greedy(self) -> bool:
        """Every sequence greedy (the number 0): the target's fused argmax serves."""
        return not torch.is_tensor(self.temperature) and self.temperature == 0.0

    def kwargs(self) -> dict:
        """The controls as verify_tree's keyword arguments."""
        return dict(temperature=self.temperature, top_k=0 if self.top_k is None else self.top_k,
                    top_p=1.0 if self.top_p is None else self.top_p)


def _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed, page_size,
                top_k=0, top_p=1.0) -> Sampling:
    """The arguments :func:`generate` and :func:`generate_ar` share; returns the sampling controls."""
    vocab = target.config.vocab_size
    _check_prompts(prompt_ids, vocab)
    C.integer("max_new_tokens", max_new_tokens, lo=1)
    sampling = Sampling(*check_sampling(temperature, top_k, top_p, len(prompt_ids), target.device))
    _check_eos(eos_token_id, vocab)
    C.integer("seed", seed, lo=-2 ** 63, hi=2 ** 63 - 1)
    if page_size is not None:
        C.integer("page_size", page_size, lo=1)
    return sampling


def _check_pair(target, head) -> list[int]:
    """The draft head fits the target (taps, sizes, vocabulary, device); returns the tapped layers."""
    hc, tc = head.config, target.config
    if hc.target_hidden_size != tc.hidden_size:
        raise ValueError(f"head: the draft head taps a target of hidden size {hc.target_hidden_size} "
                         f"(dflash_config.target_hidden_size), the target has {tc.hidden_size}")
    if hc.hidden_size != tc.hidden_size:
        raise ValueError(f"head: the draft head's hidden_size {hc.hidden_size} differs from the "
                         f"target's {tc.hidden_size} (the head uses the target's embedding and lm_head)")
    if hc.vocab_size != tc.vocab_size:
        raise ValueError(f"head: the draft head's vocab_size {hc.vocab_size} differs from the "
                         f"target's {tc.vocab_size}")
    if not 0 <= hc.mask_token_id < tc.vocab_size:
        raise ValueError(f"head: mask_token_id {hc.mask_token_id} is outside the target's vocabulary "
                         f"[0, {tc.vocab_size})")
    if hc.num_target_layers and hc.num_target_layers != tc.num_hidden_layers:
        raise ValueError(f"head: the draft head was made for a {hc.num_target_layers}-layer target "
                         f"(num_target_layers), the target has {tc.num_hidden_layers} layers")
    if head.device != target.device:
        raise ValueError(f"head: the draft head is on {head.device}, the target on {target.device}")
    try:
        return target.check_taps(head.target_layer_ids)
    except ValueError as e:
        raise ValueError(f"head: {e}") from None


def _pad_prompts(prompt_ids, device):
    """int64 [B, T] right-padded with 0, and int32 [B] lengths (``prompt_ids`` already checked)."""
    lens = [len(p) for p in prompt_ids]
    tokens = torch.zeros(len(prompt_ids), max(lens), dtype=torch.int64)
    for b, p in enumerate(prompt_ids):
        tokens[b, :len(p)] = torch.as_tensor(p, dtype=torch.int64)
    return tokens.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def _eos_tensor(eos_token_id, device):
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.int32, device=device)


def _root_tree(tokens: torch.Tensor) -> Tree:
    """A batch of one-node trees (just the root); verifying it samples one token per sequence."""
    b, dev = tokens.shape[0], tokens.device
    i32 = torch.int32
    return Tree(tokens=tokens.to(i32)[:, None].contiguous(),
                parents=torch.full((b, 1), -1, dtype=i32, device=dev),
                depths=torch.zeros(b, 1, dtype=i32, device=dev),
                scores=torch.zeros(b, 1, dtype=torch.float32, device=dev),
                num_nodes=torch.ones(b, dtype=i32, device=dev),
                mask=torch.ones(b, 1, 1, dtype=i32, device=dev), max_depth=0)


def _next_token(logits, sampling: Sampling, seed, offset):
    """int32 [B]: argmax of logits [B, V] (ties to the lower id), or a (filtered) sample drawn with
    the same keyed Gumbel noise as :func:`verify_tree` (node 0 of a one-node tree)."""
    if sampling.greedy:
        return torch.argmax(logits, dim=-1).to(torch.int32)
    tree = _root_tree(torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device))
    return verify_tree(tree, logits[:, None, :], seed=seed, offset=offset, **sampling.kwargs()).bonus


class _Output:
    """Device-side output buffer: tokens, count and done flag per sequence."""

    def __init__(self, batch: int, max_new: int, width: int, eos, device):
        self.max_new = max_new
        self.trash = max_new + width             # scatter target for rows that emit nothing
        self.tokens = torch.full((batch, self.trash + 1), -1, dtype=torch.int32, device=device)
        self.count = torch.zeros(batch, dtype=torch.int32, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = eos

    def emit(self, emitted: torch.Tensor, num: torch.Tensor, active: torch.Tensor) -> None:
        """Append ``emitted[b, :num[b]]`` (int32 [B, M]) for active sequences; update ``done``."""
        m = emitted.shape[1]
        col = torch.arange(m, device=emitted.device, dtype=torch.int32)
        valid = (col[None, :] < num[:, None]) & active[:, None]
        trash = torch.full_like(col, self.trash)[None, :]
        idx = torch.where(valid, self.count[:, None] + col[None, :], trash)
        self.tokens.scatter_(1, idx.long(), emitted)
        self.count.add_(torch.where(active, num, torch.zeros_like(num)))
        hit = self.count >= self.max_new
        if self.eos is not None:
            in_budget = valid & (self.count[:, None] - num[:, None] + col[None, :] < self.max_new)
            hit = hit | (in_budget & torch.isin(emitted, self.eos)).any(dim=1)
        self.done.logical_or_(hit)

    def to_lists(self) -> list[list[int]]:
        rows = self.tokens.cpu().tolist()
        counts = self.count.cpu().tolist()
        eos = set() if self.eos is None else set(self.eos.cpu().tolist())
        out = []
        for row, n in zip(rows, counts):
            row = row[:min(n, self.max_new)]
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            out.append(row if cut is None else row[:cut + 1])
        return out


def _finish(stats: DecodeStats, out: _Output, stages: _Stages, t0: float, accepts, max_depth: int):
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


class _Round:
    """Static state of one speculative decode and its two steps (device work only).

    ``sizes``: the candidate tree sizes (ascending; one for a fixed budget). Adaptive rounds
    (``calibrator`` and ``costs``, float32 [S], given) choose among them in the draft step."""

    def __init__(self, target, head, cache, dstate, prefix, anchor, out, *, sizes, topk,
                 algorithm, sampling, seed, fused_draft, stages, calibrator=None, costs=None):
        self.target, self.head, self.cache, self.dstate = target, head, cache, dstate
        self.prefix, self.anchor, self.out = prefix, anchor, out
        self.sizes, self.topk, self.algorithm = tuple(sizes), topk, algorithm
        self.sampling, self.fused_draft, self.stages = sampling, fused_draft, stages
        self.adaptive = calibrator is not None
        b = prefix.shape[0]
        dev = prefix.device
        self.seed = torch.full((b,), int(seed), dtype=torch.int64, device=dev)
        self.offset = torch.ones(b, dtype=torch.int64, device=dev)   # 0 was the prefill's sample
        self.taps = head.target_layer_ids
        self.tree: Tree | None = None
        self.accept: torch.Tensor | None = None
        if self.adaptive:
            self.calibrator, self.costs = calibrator, costs
            self.choice = torch.zeros((), dtype=torch.int64, device=dev)
            self.topk_tokens = self.topk_logprobs = None

    def draft_step(self, choose: bool = True) -> None:
        """Draft; fixed budget: build the tree; adaptive: keep the top-K and (``choose``) pick
        the size into ``self.choice``."""
        t, st = self.target, self.stages
        with st("draft"):
            if self.fused_draft:
                draft = self.head.draft_hidden(self.dstate, self.anchor, t.embed_weight)
                draft = draft.to(t.lm_head_weight.dtype)
            else:
                draft = self.head.cached_logits(self.dstate, self.anchor, embed_weight=t.embed_weight,
                                                lm_head_weight=t.lm_head_weight)
        if not self.adaptive:
            with st("tree"):
                kw = dict(budget=self.sizes[0], topk=self.topk, algorithm=self.algorithm)
                if self.fused_draft:
                    self.tree = draft_tree_from_hidden(draft, t.lm_head_weight, self.anchor, **kw)
                else:
                    self.tree = draft_tree(draft, self.anchor, **kw)
            return
        with st("tree"):
            self.topk_tokens, self.topk_logprobs = checked_topk(
                draft, t.lm_head_weight if self.fused_draft else None, self.anchor,
                budget=self.sizes[-1], topk=self.topk, algorithm=self.algorithm)
        if choose:
            with st("choose"):
                self.choice = choose_budget_from_topk(self.topk_logprobs, self.sizes, self.costs,
                                                      self.calibrator, ~self.out.done)

    def poll(self) -> tuple[bool, int]:
        """The round's one host sync: (every sequence done, index of the chosen size)."""
        if not self.adaptive:
            return bool(self.out.done.all()), 0
        flag = int(self.choice * 2 + self.out.done.all())
        return bool(flag & 1), flag >> 1

    def verify_step(self, size: int) -> torch.Tensor:
        t, st, cache = self.target, self.stages, self.cache
        if self.adaptive:
            with st("tree"):
                self.tree = _build(None, self.topk_tokens, self.topk_logprobs, self.anchor, size,
                                   self.algorithm)
        tree = self.tree
        greedy = self.sampling.greedy
        with st("verify"):
            scores, tapped = t.verify(tree, self.prefix, cache, taps=self.taps, fused_argmax=greedy)
        with st("accept"):
            if greedy:
                verdict = verify_tree(tree, target_tokens=scores)
            else:
                verdict = verify_tree(tree, scores, seed=self.seed, offset=self.offset,
                                      **self.sampling.kwargs())
        active = ~self.out.done
        num = verdict.accept_len + 1
        with st("commit"):
            commit = commit_kv(cache.k, cache.v, self.prefix, verdict, block_table=cache.block_table,
                               hidden=tapped)
        with st("append"):
            counts = torch.where(active, num, torch.zeros_like(num))
            self.head.append_context(self.dstate, commit.hidden, counts)
        if self.adaptive:
            with st("calibrate"):
                self.calibrator.update(tree, verdict, active)
        with st("emit"):
            self.prefix.copy_(torch.where(active, commit.prefix_lens, self.prefix))
            self.anchor.copy_(torch.where(active, verdict.bonus, self.anchor))
            self.offset.add_(1)
            self.out.emit(verdict.emitted, num, active)
            accept = torch.where(active, verdict.accept_len, torch.full_like(verdict.accept_len, -1))
        self.accept = accept
        return accept


class _Steps:
    """Runs a :class:`_Round`'s steps eagerly or from CUDA graphs: one draft graph, one verify graph
    per tree size, each captured after its step's first (eager, side-stream) run.

    Capture records without executing, so no state moves; replays then read and update the
    round's static buffers in place. The graphs share one memory pool: the draft graph's outputs
    stay referenced (the round holds them), each verify graph's accept buffer is kept and copied
    right after its replay, and graphs never run concurrently. Not exercised by the CPU suite.
    """

    def __init__(self, rnd: _Round, cuda_graphs: bool):
        self.rnd, self.cuda_graphs = rnd, cuda_graphs
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
        if self.draft_graph is not None:
            with self.rnd.stages("draft_step"):
                self.draft_graph.replay()
            return
        with self._side():
            self.rnd.draft_step(choose)

    def verify(self, size: int) -> torch.Tensor:
        """Run the verify step for a tree of ``size`` nodes; returns this round's accept lengths."""
        graph = self.verify_graphs.get(size)
        if graph is not None:
            with self.rnd.stages("verify_step"):
                graph[0].replay()
            return graph[1].clone()
        with self._side():
            accept = self.rnd.verify_step(size)
        if self.cuda_graphs:
            self._capture(size)
        return accept

    def _capture(self, size: int) -> None:
        rnd = self.rnd
        real_stages, rnd.stages = rnd.stages, _NoStages()
        with self._side():
            if self.draft_graph is None:
                self.draft_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.draft_graph, stream=self.side):
                    rnd.draft_step(True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.draft_graph.pool(), stream=self.side):
                rnd.verify_step(size)
        rnd.stages = real_stages
        self.verify_graphs[size] = (graph, rnd.accept)


class _NoStages:
    @contextmanager
    def __call__(self, name):
        yield


def _capacity(max_prompt: int, max_new: int, budget: int, block: int, width: int) -> int:
    """Cache positions per sequence: the longest context plus the widest write past it."""
    return max_prompt + max_new + width + max(budget, block, width) + 1


def check_generate_args(target, head, prompt_ids, *, max_new_tokens, budget=64, topk=8,
                        algorithm="topn", temperature=0.0, eos_token_id=None, seed=0, page_size=None,
                        fused_draft=True, cuda_graphs=None, sync_every=1, top_k=0, top_p=1.0,
                        cost_model=None, calibrator=None) -> tuple[Sampling, list[int]]:
    """The checks :func:`generate` runs before any model work (same arguments); a caller such as
    the CLI runs them first to tell bad input apart from a failure inside decoding.

    Returns ``(the checked sampling controls, the tapped target layers)``; raises ``TypeError``
    (wrong type) or ``ValueError`` naming the argument (``head: ...`` when the head does not fit).
    """
    sampling = _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed,
                           page_size, top_k, top_p)
    C.integer("topk", topk, lo=1, hi=min(MAX_TOPK, target.config.vocab_size))
    C.choice("algorithm", algorithm, ALGORITHMS)
    taps = _check_pair(target, head)
    sizes, adaptive = parse_budget(budget, topk=topk, depth=head.block_size - 1)
    if adaptive and algorithm != "topn":
        raise ValueError(f"budget={budget!r} (adaptive) needs algorithm='topn', got {algorithm!r}")
    if not isinstance(fused_draft, bool):
        raise TypeError(f"fused_draft must be a bool, got {type(fused_draft).__name__}")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs must be a bool or None, got {type(cuda_graphs).__name__}")
    C.integer("sync_every", sync_every, lo=1)
    if cuda_graphs and target.device.type != "cuda":
        raise ValueError("cuda_graphs=True needs models on a CUDA device")
    if cost_model is not None:
        model = CostModel(cost_model)
        if adaptive:
            model.table(sizes)
    if calibrator is not None:
        if not isinstance(calibrator, AcceptanceCalibrator):
            raise TypeError(f"calibrator must be an AcceptanceCalibrator or None, got "
                            f"{type(calibrator).__name__}")
        if calibrator.device != target.device:
            raise ValueError(f"calibrator lives on {calibrator.device}, the models on {target.device}")
    return sampling, taps


def _graphs_default(dev: torch.device, cuda_graphs) -> bool:
    if cuda_graphs is not None:
        return cuda_graphs
    # The reference backend reads values on the host inside its ops: it cannot be captured.
    return dev.type == "cuda" and _backend.resolve(dev) != "reference"


# Device types whose tensors the host reads without waiting for a device: there adaptive rounds
# also check the done flags before drafting, so the last draft is not wasted.
_FREE_READS = ("cpu",)

# Per (target, head) pair, kept across calls while both models live: measured cost models (keyed
# by what changes a round's time) and the acceptance calibrators (greedy / sampling).
_KEPT = weakref.WeakKeyDictionary()


def _kept(target, head) -> dict:
    try:
        return _KEPT.setdefault(target, weakref.WeakKeyDictionary()).setdefault(head, {})
    except TypeError:          # a model that cannot be weakly referenced: nothing is kept
        return {}


def _prepare(target, head, prompt_ids, taps, *, max_new_tokens, sizes, topk, algorithm,
             sampling, eos_token_id, seed, page_size, fused_draft, stages, calibrator=None,
             costs=None):
    """Caches, prefill (the first new token) and the round state of one speculative decode.

    Returns ``(_Round, verdict width M)``."""
    dev = target.device
    tokens, lens = _pad_prompts(prompt_ids, dev)
    b, t_max = tokens.shape
    budget = sizes[-1]
    width = min(head.block_size - 1, budget - 1) + 1          # verdict columns M
    cap = _capacity(t_max, max_new_tokens, budget, head.block_size, width)
    cache = target.new_cache(b, cap, page_size=page_size)
    dstate = head.new_state(b, cap, page_size=page_size)
    out = _Output(b, max_new_tokens, width, _eos_tensor(eos_token_id, dev), dev)
    seed_t = torch.full((b,), int(seed), dtype=torch.int64, device=dev)

    with stages("prefill"):
        logits, tapped = target.prefill(tokens, lens, cache, taps=taps)
        anchor = _next_token(logits, sampling, seed_t, torch.zeros_like(seed_t))
        head.append_context(dstate, tapped, lens)
        out.emit(anchor[:, None], torch.ones_like(lens), torch.ones_like(out.done))
    rnd = _Round(target, head, cache, dstate, lens.clone(), anchor.clone(), out, sizes=sizes,
                 topk=topk, algorithm=algorithm, sampling=sampling, seed=seed,
                 fused_draft=fused_draft, stages=stages, calibrator=calibrator, costs=costs)
    return rnd, width


def generate(target, head, prompt_ids, *, max_new_tokens: int, budget=64, topk: int = 8,
             algorithm: str = "topn", temperature=0.0, eos_token_id=None, seed: int = 0,
             page_size: int | None = None, fused_draft: bool = True,
             cuda_graphs: bool | None = None, sync_every: int = 1, top_k=0, top_p=1.0,
             cost_model=None, calibrator: AcceptanceCalibrator | None = None) -> GenerateOutput:
    """JetSpec speculative decoding for a batch of prompts of different lengths.

    Parameters
    ----------
    target : jetspec_kernels.models.Qwen3
    head : jetspec_kernels.models.DraftHead made for this target (its target_layer_ids index the
        target's layers; hidden size, vocabulary and device match the target's)
    prompt_ids : list of B non-empty lists of int token ids in [0, V)
    max_new_tokens : int >= 1, new tokens per prompt at most
    budget : int in [1, 4096], tree capacity N (root included); or adaptive: ``"auto"`` (sizes
        4, 8, 16, 32, 64, capped by what the head can draft) or a list of candidate sizes, one
        chosen per round for the batch (see :mod:`jetspec_kernels.adaptive`; needs "topn")
    topk : int in [1, min(64, V)], children per node
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

    Returns
    -------
    GenerateOutput(tokens: list of B lists of new token ids, stats: DecodeStats)

    Bad arguments raise ``TypeError`` (wrong type) or ``ValueError`` naming the argument, before
    any model work.
    """
    sampling, taps = check_generate_args(
        target, head, prompt_ids, max_new_tokens=max_new_tokens, budget=budget, topk=topk,
        algorithm=algorithm, temperature=temperature, eos_token_id=eos_token_id, seed=seed,
        page_size=page_size, fused_draft=fused_draft, cuda_graphs=cuda_graphs, sync_every=sync_every,
        top_k=top_k, top_p=top_p, cost_model=cost_model, calibrator=calibrator)
    dev = target.device
    cuda_graphs = _graphs_default(dev, cuda_graphs)
    sizes, adaptive = parse_budget(budget, topk=topk, depth=head.block_size - 1)
    costs = None
    if adaptive:
        kept = _kept(target, head)
        if calibrator is None:
            calibrator = kept.setdefault(("calibrator", sampling.greedy), AcceptanceCalibrator(
                max_depth=head.block_size - 1, device=dev))
        if cost_model is None:
            key = ("costs", len(prompt_ids), sizes, topk, sampling.greedy, page_size, fused_draft,
                   cuda_graphs, _backend.resolve(dev))
            if key not in kept:
                kept[key] = measure_round_costs(target, head, prompt_ids, sizes, topk=topk,
                                                temperature=temperature, top_k=top_k, top_p=top_p,
                                                seed=seed, page_size=page_size,
                                                fused_draft=fused_draft, cuda_graphs=cuda_graphs)
            cost_model = kept[key]
        cost_model = CostModel(cost_model)
        costs = cost_model.tensor(sizes, dev)

    t0 = time.perf_counter()
    stages = _Stages(dev)
    stats = DecodeStats(cuda_graphs=bool(cuda_graphs), host_syncs_per_round=1.0 / sync_every,
                        budget_costs=cost_model.table(sizes) if adaptive else {})
    rnd, width = _prepare(target, head, prompt_ids, taps, max_new_tokens=max_new_tokens, sizes=sizes,
                          topk=topk, algorithm=algorithm, sampling=sampling,
                          eos_token_id=eos_token_id, seed=seed, page_size=page_size,
                          fused_draft=fused_draft, stages=stages, calibrator=calibrator, costs=costs)
    steps = _Steps(rnd, cuda_graphs)
    accepts = []
    size = sizes[-1]
    early = not adaptive or dev.type in _FREE_READS
    while True:
        poll = stats.rounds % sync_every == 0
        if poll and early and bool(rnd.out.done.all()):  # the one host sync (per sync_every rounds)
            break
        steps.draft(choose=poll)
        if poll and adaptive:
            done, choice = rnd.poll()                    # adaptive: done flags and size together
            if done:
                break
            size = sizes[choice]
        accepts.append(steps.verify(size))
        stats.budget_sizes.append(size)
        stats.rounds += 1
    return _finish(stats, rnd.out, stages, t0, accepts, width - 1)


def measure_round_costs(target, head, prompt_ids, sizes="auto", *, rounds: int = 10, topk: int = 8,
                        temperature=0.0, top_k=0, top_p=1.0, seed: int = 0,
                        page_size: int | None = None, fused_draft: bool = True,
                        cuda_graphs: bool | None = None) -> CostModel:
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
    cuda_graphs : as in :func:`generate`
    sizes : "auto" or a list of candidate sizes (as ``generate``'s adaptive ``budget``)
    rounds : int >= 1, timed rounds per size

    Returns
    -------
    CostModel {n: seconds per round}
    """
    sampling, taps = check_generate_args(
        target, head, prompt_ids, max_new_tokens=1, budget=sizes, topk=topk, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, page_size=page_size, fused_draft=fused_draft,
        cuda_graphs=cuda_graphs)
    C.integer("rounds", rounds, lo=1)
    dev = target.device
    cuda_graphs = _graphs_default(dev, cuda_graphs)
    sizes, _ = parse_budget(sizes, topk=topk, depth=head.block_size - 1)
    width = min(head.block_size - 1, sizes[-1] - 1) + 1
    rnd, _ = _prepare(target, head, prompt_ids, taps, max_new_tokens=(rounds + 1) * len(sizes) * width,
                      sizes=sizes, topk=topk, algorithm="topn", sampling=sampling,
                      eos_token_id=None, seed=seed, page_size=page_size, fused_draft=fused_draft,
                      stages=_NoStages(),
                      calibrator=AcceptanceCalibrator(max_depth=head.block_size - 1, device=dev),
                      costs=torch.ones(len(sizes), dtype=torch.float32, device=dev))
    steps = _Steps(rnd, cuda_graphs)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    cycles = []                                   # per cycle: one time per size
    for rep in range(rounds + 1):
        times = []
        for n in sizes:
            sync()
            t0 = time.perf_counter()
            steps.draft(choose=True)
            rnd.poll()
            steps.verify(n)
            sync()
            times.append(time.perf_counter() - t0)
        if rep:
            cycles.append(torch.tensor(times, dtype=torch.float64))
    return CostModel(dict(zip(sizes, _cycle_costs(torch.stack(cycles)))))


def _cycle_costs(times: torch.Tensor) -> list[float]:
    """Seconds per size from float64 [cycles, sizes] round times: a cycle's times share its
    machine load, so divide it out (the cycle's geometric mean), take each size's median ratio,
    scale back by the median load, and make the result non-decreasing."""
    load = times.log().mean(1, keepdim=True).exp()
    return _non_decreasing(((times / load).median(0).values * load.median()).tolist())


def _non_decreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks = []                                   # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(count)]


def generate_ar(target, prompt_ids, *, max_new_tokens: int, temperature=0.0,
                eos_token_id=None, seed: int = 0, page_size: int | None = None, head=None,
                top_k=0, top_p=1.0, **unused) -> GenerateOutput:
    """Plain autoregressive decoding of ``target`` (the baseline; same output as :func:`generate`
    for greedy decoding, the same distribution when sampling).

    Parameters
    ----------
    target : Qwen3; prompt_ids, max_new_tokens, temperature, eos_token_id, seed, page_size,
        top_k, top_p: as in :func:`generate`
    head, unused : accepted and ignored, so that one argument set serves both functions

    Returns
    -------
    GenerateOutput; stats.rounds counts decode steps (accept lengths are all 0).
    """
    sampling = _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed,
                           page_size, top_k, top_p)
    dev = target.device
    t0 = time.perf_counter()
    stages = _Stages(dev)
    stats = DecodeStats()
    tokens, lens = _pad_prompts(prompt_ids, dev)
    b, t_max = tokens.shape
    cache = target.new_cache(b, t_max + max_new_tokens + 1, page_size=page_size)
    out = _Output(b, max_new_tokens, 1, _eos_tensor(eos_token_id, dev), dev)
    seed_t = torch.full((b,), int(seed), dtype=torch.int64, device=dev)
    offset = torch.zeros_like(seed_t)
    with stages("prefill"):
        logits, _ = target.prefill(tokens, lens, cache)
        token = _next_token(logits, sampling, seed_t, offset)
        out.emit(token[:, None], torch.ones_like(lens), torch.ones_like(out.done))
    prefix = lens.clone()
    one = torch.ones_like(lens)
    while not bool(out.done.all()):          # the one host sync per step
        active = ~out.done
        offset.add_(1)
        with stages("decode"):
            logits = target.decode(token, prefix, cache)
            token = _next_token(logits, sampling, seed_t, offset)
        with stages("emit"):
            prefix.add_(active.to(torch.int32))
            out.emit(token[:, None], one, active)
        stats.rounds += 1
    return _finish(stats, out, stages, t0, [], 0)
