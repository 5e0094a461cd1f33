"""The minimal JetSpec speculative decoding loop and the autoregressive baseline.

One round, all on the device, with static buffers (so it can be captured in CUDA graphs):

    draft step   head.draft_hidden -> draft_tree_from_hidden (or draft_tree on the logits)
    verify step  target.verify (tree K/V appended at slots prefix..prefix+N-1, tree attention,
                 taps) -> verify_tree -> commit_kv (all layers at once, taps gathered along the
                 path) -> head.append_context (accepted rows only) -> emit tokens, advance

Conventions: the anchor (node 0) is the last emitted token; its K/V are not yet in the target
cache and ``prefix`` counts the tokens before it. The draft context has exactly ``prefix`` rows.
Prefill runs the whole prompt and samples the first new token, which is the first anchor.

Host syncs: one per round, reading whether every sequence is done (``done.all()``), and one at
the end to read the tokens and statistics. With ``sync_every=k`` the done check runs every k
rounds instead (finished sequences are frozen, so extra rounds change nothing but time). The
reference backend, used for CPU tensors, syncs inside its ops anyway, and the ops' argument
checks read values only for CPU tensors.

On CUDA the first round runs eagerly on a side stream (warm-up: kernel compilation, library
handles), then both steps are captured once and replayed every later round; NVTX ranges mark
the stages. The CUDA path has not been run on a GPU yet (tests/test_decode.py has a gpu test).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from . import backend as _backend
from .ops import _checks as C
from .ops.commit_kv import commit_kv
from .ops.draft_tree import ALGORITHMS, MAX_BUDGET, MAX_TOPK, draft_tree, draft_tree_from_hidden
from .ops.verify_tree import verify_tree
from .tree import Tree

__all__ = ["generate", "generate_ar", "GenerateOutput", "DecodeStats"]


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
                                 append, emit; "draft_step"/"verify_step" when graphed)
    host_syncs_per_round : float 1 / sync_every (the done check)
    cuda_graphs : bool           whether the steps were replayed from CUDA graphs
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


def _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed, page_size) -> float:
    """The arguments :func:`generate` and :func:`generate_ar` share; returns the temperature."""
    vocab = target.config.vocab_size
    _check_prompts(prompt_ids, vocab)
    C.integer("max_new_tokens", max_new_tokens, lo=1)
    temperature = C.number("temperature", temperature, lo=0.0)
    _check_eos(eos_token_id, vocab)
    C.integer("seed", seed, lo=-2 ** 63, hi=2 ** 63 - 1)
    if page_size is not None:
        C.integer("page_size", page_size, lo=1)
    return temperature


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


def _next_token(logits, temperature, seed, offset):
    """int32 [B]: argmax of logits [B, V] (ties to the lower id), or a sample drawn with the same
    keyed Gumbel noise as :func:`verify_tree` (node 0 of a one-node tree)."""
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1).to(torch.int32)
    tree = _root_tree(torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device))
    return verify_tree(tree, logits[:, None, :], temperature=temperature, seed=seed, offset=offset).bonus


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
    """Static state of one speculative decode and its two steps (device work only)."""

    def __init__(self, target, head, cache, dstate, prefix, anchor, out, *, budget, topk,
                 algorithm, temperature, seed, fused_draft, stages):
        self.target, self.head, self.cache, self.dstate = target, head, cache, dstate
        self.prefix, self.anchor, self.out = prefix, anchor, out
        self.budget, self.topk, self.algorithm = budget, topk, algorithm
        self.temperature, self.fused_draft, self.stages = temperature, fused_draft, stages
        b = prefix.shape[0]
        dev = prefix.device
        self.seed = torch.full((b,), int(seed), dtype=torch.int64, device=dev)
        self.offset = torch.ones(b, dtype=torch.int64, device=dev)   # 0 was the prefill's sample
        self.taps = head.target_layer_ids
        self.tree: Tree | None = None
        self.accept: torch.Tensor | None = None

    def draft_step(self) -> Tree:
        t, st = self.target, self.stages
        if self.fused_draft:
            with st("draft"):
                hidden = self.head.draft_hidden(self.dstate, self.anchor, t.embed_weight)
            with st("tree"):
                tree = draft_tree_from_hidden(hidden.to(t.lm_head_weight.dtype), t.lm_head_weight,
                                              self.anchor, budget=self.budget, topk=self.topk,
                                              algorithm=self.algorithm)
        else:
            with st("draft"):
                logits = self.head.cached_logits(self.dstate, self.anchor, embed_weight=t.embed_weight,
                                                 lm_head_weight=t.lm_head_weight)
            with st("tree"):
                tree = draft_tree(logits, self.anchor, budget=self.budget, topk=self.topk,
                                  algorithm=self.algorithm)
        self.tree = tree
        return tree

    def verify_step(self) -> torch.Tensor:
        t, st, tree, cache = self.target, self.stages, self.tree, self.cache
        greedy = self.temperature == 0.0
        with st("verify"):
            scores, tapped = t.verify(tree, self.prefix, cache, taps=self.taps, fused_argmax=greedy)
        with st("accept"):
            if greedy:
                verdict = verify_tree(tree, target_tokens=scores)
            else:
                verdict = verify_tree(tree, scores, temperature=self.temperature, seed=self.seed,
                                      offset=self.offset)
        active = ~self.out.done
        num = verdict.accept_len + 1
        with st("commit"):
            commit = commit_kv(cache.k, cache.v, self.prefix, verdict, block_table=cache.block_table,
                               hidden=tapped)
        with st("append"):
            counts = torch.where(active, num, torch.zeros_like(num))
            self.head.append_context(self.dstate, commit.hidden, counts)
        with st("emit"):
            self.prefix.copy_(torch.where(active, commit.prefix_lens, self.prefix))
            self.anchor.copy_(torch.where(active, verdict.bonus, self.anchor))
            self.offset.add_(1)
            self.out.emit(verdict.emitted, num, active)
            accept = torch.where(active, verdict.accept_len, torch.full_like(verdict.accept_len, -1))
        self.accept = accept
        return accept


class _Graphed:
    """CUDA graphs of a :class:`_Round`'s two steps, captured once after an eager round.

    Capture records without executing, so no state moves; replays then read and update the
    round's static buffers in place. Not exercised by the CPU test suite.
    """

    def __init__(self, rnd: _Round, stream):
        self.rnd = rnd
        real_stages = rnd.stages
        rnd.stages = _NoStages()
        self.draft_graph = torch.cuda.CUDAGraph()
        self.verify_graph = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(self.draft_graph, stream=stream):
                rnd.draft_step()
            pool = self.draft_graph.pool()
            with torch.cuda.graph(self.verify_graph, pool=pool, stream=stream):
                rnd.verify_step()
        torch.cuda.current_stream().wait_stream(stream)
        rnd.stages = real_stages

    def step(self) -> torch.Tensor:
        st = self.rnd.stages
        with st("draft_step"):
            self.draft_graph.replay()
        with st("verify_step"):
            self.verify_graph.replay()
        return self.rnd.accept.clone()


class _NoStages:
    @contextmanager
    def __call__(self, name):
        yield


def _capacity(max_prompt: int, max_new: int, budget: int, block: int, width: int) -> int:
    """Cache positions per sequence: the longest context plus the widest write past it."""
    return max_prompt + max_new + width + max(budget, block, width) + 1


def generate(target, head, prompt_ids, *, max_new_tokens: int, budget: int = 64, topk: int = 8,
             algorithm: str = "topn", temperature: float = 0.0, eos_token_id=None, seed: int = 0,
             page_size: int | None = None, fused_draft: bool = True,
             cuda_graphs: bool | None = None, sync_every: int = 1) -> GenerateOutput:
    """JetSpec speculative decoding for a batch of prompts of different lengths.

    Parameters
    ----------
    target : jetspec_kernels.models.Qwen3
    head : jetspec_kernels.models.DraftHead made for this target (its target_layer_ids index the
        target's layers; hidden size, vocabulary and device match the target's)
    prompt_ids : list of B non-empty lists of int token ids in [0, V)
    max_new_tokens : int >= 1, new tokens per prompt at most
    budget : int in [1, 4096], tree capacity N (root included)
    topk : int in [1, min(64, V)], children per node
    algorithm : "topn" | "accum_logp"
    temperature : finite float >= 0 (0 = greedy; > 0 samples losslessly from softmax(logits / T))
    eos_token_id : int, non-empty list of ints (each in [0, V)), or None; generation of a
        sequence stops after it
    seed : int (int64), the sampling seed (tokens depend on it only when temperature > 0)
    page_size : int, optional; use paged KV caches with this page size
    fused_draft : build the tree from the draft hidden states with ``draft_tree_from_hidden``
        (``head.draft_hidden``; the draft logits are never materialised); False: from
        ``head.cached_logits`` with ``draft_tree``
    cuda_graphs : capture the steps in CUDA graphs; default: on CUDA unless the backend is
        ``reference``
    sync_every : int >= 1, rounds between host-side done checks (stats.rounds counts every
        round run, including those after the last sequence finished)

    Returns
    -------
    GenerateOutput(tokens: list of B lists of new token ids, stats: DecodeStats)

    Bad arguments raise ``TypeError`` (wrong type) or ``ValueError`` naming the argument, before
    any model work.
    """
    temperature = _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed,
                              page_size)
    C.integer("budget", budget, lo=1, hi=MAX_BUDGET)
    C.integer("topk", topk, lo=1, hi=min(MAX_TOPK, target.config.vocab_size))
    C.choice("algorithm", algorithm, ALGORITHMS)
    taps = _check_pair(target, head)
    if not isinstance(fused_draft, bool):
        raise TypeError(f"fused_draft must be a bool, got {type(fused_draft).__name__}")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs must be a bool or None, got {type(cuda_graphs).__name__}")
    C.integer("sync_every", sync_every, lo=1)
    dev = target.device
    if cuda_graphs is None:
        # The reference backend reads values on the host inside its ops: it cannot be captured.
        cuda_graphs = dev.type == "cuda" and _backend.resolve(dev) != "reference"
    if cuda_graphs and dev.type != "cuda":
        raise ValueError("cuda_graphs=True needs models on a CUDA device")

    t0 = time.perf_counter()
    stages = _Stages(dev)
    stats = DecodeStats(cuda_graphs=bool(cuda_graphs), host_syncs_per_round=1.0 / sync_every)
    tokens, lens = _pad_prompts(prompt_ids, dev)
    b, t_max = tokens.shape
    width = min(head.block_size - 1, budget - 1) + 1          # verdict columns M
    cap = _capacity(t_max, max_new_tokens, budget, head.block_size, width)
    cache = target.new_cache(b, cap, page_size=page_size)
    dstate = head.new_state(b, cap, page_size=page_size)
    out = _Output(b, max_new_tokens, width, _eos_tensor(eos_token_id, dev), dev)
    seed_t = torch.full((b,), int(seed), dtype=torch.int64, device=dev)

    with stages("prefill"):
        logits, tapped = target.prefill(tokens, lens, cache, taps=taps)
        anchor = _next_token(logits, temperature, seed_t, torch.zeros_like(seed_t))
        head.append_context(dstate, tapped, lens)
        out.emit(anchor[:, None], torch.ones_like(lens), torch.ones_like(out.done))
    prefix = lens.clone()
    rnd = _Round(target, head, cache, dstate, prefix, anchor.clone(), out, budget=budget, topk=topk,
                 algorithm=algorithm, temperature=temperature, seed=seed, fused_draft=fused_draft,
                 stages=stages)
    accepts = []
    graphed = None
    while not bool(out.done.all()):          # the one host sync (per sync_every rounds)
        for _ in range(sync_every):
            if graphed is not None:
                accepts.append(graphed.step())
            elif cuda_graphs:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    rnd.draft_step()
                    accepts.append(rnd.verify_step())
                torch.cuda.current_stream().wait_stream(side)
                graphed = _Graphed(rnd, side)
            else:
                rnd.draft_step()
                accepts.append(rnd.verify_step())
            stats.rounds += 1
    return _finish(stats, out, stages, t0, accepts, width - 1)


def generate_ar(target, prompt_ids, *, max_new_tokens: int, temperature: float = 0.0,
                eos_token_id=None, seed: int = 0, page_size: int | None = None, head=None,
                **unused) -> GenerateOutput:
    """Plain autoregressive decoding of ``target`` (the baseline; same output as :func:`generate`
    for greedy decoding, the same distribution when sampling).

    Parameters
    ----------
    target : Qwen3; prompt_ids, max_new_tokens, temperature, eos_token_id, seed, page_size:
        as in :func:`generate`
    head, unused : accepted and ignored, so that one argument set serves both functions

    Returns
    -------
    GenerateOutput; stats.rounds counts decode steps (accept lengths are all 0).
    """
    temperature = _check_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed,
                              page_size)
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
        token = _next_token(logits, temperature, seed_t, offset)
        out.emit(token[:, None], torch.ones_like(lens), torch.ones_like(out.done))
    prefix = lens.clone()
    one = torch.ones_like(lens)
    while not bool(out.done.all()):          # the one host sync per step
        active = ~out.done
        offset.add_(1)
        with stages("decode"):
            logits = target.decode(token, prefix, cache)
            token = _next_token(logits, temperature, seed_t, offset)
        with stages("emit"):
            prefix.add_(active.to(torch.int32))
            out.emit(token[:, None], one, active)
        stats.rounds += 1
    return _finish(stats, out, stages, t0, [], 0)
