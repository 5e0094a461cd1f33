"""One speculative decode: its caches and static buffers, and its two steps (device work only).

    draft step   head.draft_hidden -> draft_tree_from_hidden (or draft_tree on the logits);
                 adaptive: the per-depth top-K and the choice of size
    verify step  target.verify (tree K/V appended at slots prefix..prefix+N-1, tree attention,
                 taps) -> verify_tree -> commit_kv (all layers at once, taps gathered along the
                 path; a hybrid target's commit_states then advances its linear layers' states
                 along the path) -> head.append_context (accepted rows only) -> emit tokens, advance

The anchor (node 0) is the last emitted token; its K/V are not yet in the target cache and
``prefix`` counts the tokens before it. The draft context has exactly ``prefix`` rows.
"""
from __future__ import annotations

import torch

from ..adaptive import choose_budget_from_topk
from ..ops.commit_kv import commit_kv
from ..ops.exact import exact_enabled, sample_at_positions
from ..ops.draft_tree import (checked_topk, draft_tree, draft_tree_from_hidden,
                              tree_from_checked_topk)
from ..ops.verify_tree import verify_tree
from ..tree import Tree
from .output import TokenBuffer
from .prefill import pad_prompts, prefill

__all__ = ["SpeculativeDecode", "cache_capacity", "start_speculative", "verdict_cols"]


def verdict_cols(head, budget: int) -> int:
    """Columns M of a verdict (path, emitted) for trees of ``budget`` nodes: max_depth + 1."""
    return min(head.block_size - 1, budget - 1) + 1


def cache_capacity(max_prompt: int, max_new: int, budget: int, block: int, cols: int) -> int:
    """Cache positions per sequence: the longest context plus the widest write past it."""
    return max_prompt + max_new + cols + max(budget, block, cols) + 1


class SpeculativeDecode:
    """Static state of one speculative decode and its two steps (device work only).

    ``sizes``: the candidate tree sizes (ascending; one for a fixed budget). Adaptive rounds
    (``calibrator`` and ``costs``, float32 [S], given) choose among them in the draft step.
    ``verdict_cols``: the verdict's columns M (max_depth + 1 of the largest tree)."""

    def __init__(self, target, head, cache, dstate, prefix, anchor, out, *, sizes, topk,
                 algorithm, sampling, seed, fused_draft, stages, calibrator=None, costs=None):
        self.target, self.head, self.cache, self.dstate = target, head, cache, dstate
        self.prefix, self.anchor, self.out = prefix, anchor, out
        self.sizes, self.topk, self.algorithm = tuple(sizes), topk, algorithm
        self.sampling, self.fused_draft, self.stages = sampling, fused_draft, stages
        self.verdict_cols = verdict_cols(head, self.sizes[-1])
        self.adaptive = calibrator is not None
        b = prefix.shape[0]
        dev = prefix.device
        self.seed = torch.full((b,), int(seed), dtype=torch.int64, device=dev)
        self.offset = torch.ones(b, dtype=torch.int64, device=dev)   # 0 was the prefill's sample
        self.taps = head.target_layer_ids
        self.commit_states = getattr(target, "commit_states", None)
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
        """Verify the tree of ``size`` nodes, commit and emit; returns this round's accept lengths
        (int32 [B], -1 for a finished sequence)."""
        t, st, cache = self.target, self.stages, self.cache
        if self.adaptive:
            with st("tree"):
                self.tree = tree_from_checked_topk(self.topk_tokens, self.topk_logprobs,
                                                   self.anchor, budget=size,
                                                   algorithm=self.algorithm)
        tree = self.tree
        greedy = self.sampling.greedy
        with st("verify"):
            scores, tapped = t.verify(tree, self.prefix, cache, taps=self.taps, fused_argmax=greedy)
        with st("accept"):
            if greedy:
                verdict = verify_tree(tree, target_tokens=scores)
            elif exact_enabled():      # pathwise: the noise keyed by logical position (ops.exact)
                s = self.sampling
                verdict = verify_tree(tree, target_tokens=sample_at_positions(
                    scores, tree.positions(self.prefix), self.seed, s.temperature, s.top_k, s.top_p))
            else:
                verdict = verify_tree(tree, scores, seed=self.seed, offset=self.offset,
                                      **self.sampling.kwargs())
        active = ~self.out.done
        num = verdict.accept_len + 1
        with st("commit"):
            commit = commit_kv(cache.k, cache.v, self.prefix, verdict, block_table=cache.block_table,
                               hidden=tapped)
            if self.commit_states is not None:     # a hybrid target's linear-layer states
                self.commit_states(cache, verdict)
        with st("append"):
            counts = num * active                       # tokens each sequence takes this round
            self.head.append_context(self.dstate, commit.hidden, counts)
        if self.adaptive:
            with st("calibrate"):
                self.calibrator.update(tree, verdict, active)
        with st("emit"):   # in place through out=: one launch each, not a where and a copy
            torch.where(active, commit.prefix_lens, self.prefix, out=self.prefix)
            torch.where(active, verdict.bonus, self.anchor, out=self.anchor)
            self.offset.add_(1)
            self.out.emit(verdict.emitted, counts)
            accept = counts - 1                         # accept_len, -1 for a finished sequence
        self.accept = accept
        return accept


def start_speculative(target, head, prompt_ids, taps, *, max_new_tokens, sizes, topk, algorithm,
                      sampling, eos_token_id, seed, page_size, fused_draft, stages, calibrator=None,
                      costs=None) -> SpeculativeDecode:
    """Caches, prefill (the first new token) and the state of one speculative decode (arguments
    checked, as :func:`~jetspec_kernels.decode.generate`'s; ``sizes`` parsed)."""
    dev = target.device
    tokens, lens = pad_prompts(prompt_ids, dev)
    b, t_max = tokens.shape
    budget = sizes[-1]
    cols = verdict_cols(head, budget)
    cap = cache_capacity(t_max, max_new_tokens, budget, head.block_size, cols)
    cache = target.new_cache(b, cap, page_size=page_size)
    dstate = head.new_state(b, cap, page_size=page_size)
    out = TokenBuffer(b, max_new_tokens, cols, eos_token_id, dev)
    seed_t = torch.full((b,), int(seed), dtype=torch.int64, device=dev)

    with stages("prefill"):
        anchor, tapped = prefill(target, tokens, lens, cache, sampling, seed_t, out, taps=taps)
        head.append_context(dstate, tapped, lens)
    return SpeculativeDecode(target, head, cache, dstate, lens.clone(), anchor.clone(), out,
                             sizes=sizes, topk=topk, algorithm=algorithm, sampling=sampling,
                             seed=seed, fused_draft=fused_draft, stages=stages,
                             calibrator=calibrator, costs=costs)
