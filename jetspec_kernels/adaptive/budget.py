"""The per-round choice of the adaptive tree budget: expected accepted length of every tree size,
its correction by observed acceptance, and the size with the most expected tokens per second.

For ``topn`` trees the best ``n``-node tree holds the ``n - 1`` best non-root nodes of the implicit
tree, and under the draft's model node ``i`` is accepted with probability ``exp(score_i)`` (siblings
carry distinct tokens, so at most one node per depth is accepted). Its expected accepted length is

    E(n) = sum of exp(score) over the n - 1 best non-root nodes,

so one sorted pass over the scores gives E(n) for every n. :class:`AcceptanceCalibrator` corrects
the draft's estimate with the acceptance actually observed (per depth or per score bucket, running
sums kept as device tensors), and :func:`choose_budget` picks
``n* = argmax_n sum_b (1 + E_cal_b(n)) / c(n)`` on the device with the round costs ``c`` of a
:class:`~jetspec_kernels.adaptive.round_costs.CostModel`; :func:`choose_budget_from_topk` does the
same straight from the per-depth top-K in fewer ops (the decoding loop's per-round choice).
The per-round functions run in ``torch.inference_mode`` (less host time: docs/perf/decode_round.md,
adaptive budget); they return inference tensors, and the calibrator's sums are only ever changed inside it.
"""
from __future__ import annotations

import functools
import math
import torch

from ..limits import MAX_BUDGET
from ..tree import Tree
from .round_costs import CostModel

__all__ = ["DEFAULT_SIZES", "AcceptanceCalibrator", "choose_budget",
           "choose_budget_from_topk", "expected_accept_curve", "expected_accept_curve_from_topk",
           "parse_budget"]

DEFAULT_SIZES = (4, 8, 16, 32, 64)


class _BudgetTypeError(TypeError, ValueError):
    """A ``budget`` of the wrong type: a TypeError like every wrong type in this package, and a
    ValueError like every other bad ``budget``."""


def _size_of(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _BudgetTypeError(f"{name} must be an int tree size, got {type(v).__name__} {v!r}")
    if not 1 <= v <= MAX_BUDGET:
        raise ValueError(f"{name} must be in [1, {MAX_BUDGET}], got {v}")
    return v


def parse_budget(budget, *, topk: int, depth: int) -> tuple[tuple[int, ...], bool]:
    """Read :func:`generate`'s ``budget``.

    Parameters
    ----------
    budget : int in [1, MAX_BUDGET] (a fixed size), ``"auto"`` (:data:`DEFAULT_SIZES` capped by
        what the head can draft), or a non-empty list/tuple of such ints (the candidate sizes)
    topk, depth : the draft's children per node and depths per round; the implicit tree has
        ``1 + K + ... + K**D`` nodes, and larger "auto" candidates would build the same tree

    Returns
    -------
    (candidate sizes ascending, adaptive: bool); a fixed int gives ``((budget,), False)``.
    """
    if isinstance(budget, str):
        if budget != "auto":
            raise _BudgetTypeError(f"budget must be an int, 'auto' or a list of ints, got {budget!r}")
        full = sum(topk ** d for d in range(depth + 1))    # the implicit tree's nodes
        top = min(full, DEFAULT_SIZES[-1])
        return tuple(n for n in DEFAULT_SIZES if n < top) + (top,), True
    if isinstance(budget, (list, tuple)):
        if not budget:
            raise ValueError("budget must hold at least one candidate size, got an empty list")
        return tuple(sorted({_size_of(f"budget[{i}]", v) for i, v in enumerate(budget)})), True
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise _BudgetTypeError(f"budget must be an int, 'auto' or a list of ints, got "
                               f"{type(budget).__name__} {budget!r}")
    return (_size_of("budget", budget),), False


class AcceptanceCalibrator:
    """Online correction of the draft's acceptance estimate by the acceptance actually observed.

    Each valid non-root node of a verified tree falls into a bin: its score bucket
    (``bins="score"``, the default: bin j holds scores in ``[score_edges[j], score_edges[j-1])``,
    edges descending) or its depth (``bins="depth"``; depths past ``max_depth`` share the last
    bin). Score buckets chose better in docs/perf/decode_round.md's replays: one ratio per depth also scales
    that depth's unlikely side branches, which the draft does not underrate as much as its top
    choices. Per bin it keeps two running sums on the device: ``predicted`` (the draft's expected
    acceptances, sum of ``exp(score)``) and ``accepted`` (nodes on the accepted path). The
    calibrated acceptance probability of a node is ``ratio[bin] * exp(score)`` with
    ``ratio = (accepted + prior) / (predicted + prior)``, 1 before any data. ``decay < 1``
    multiplies the sums by ``decay`` every update (forgets old rounds). Updates never sync.

    Parameters
    ----------
    bins : "score" | "depth"
    max_depth : int >= 1, depth bins (the draft's depths per round)
    score_edges : descending log-probs (< 0) for score bins (default ``log 2**-1 .. log 2**-12``)
    prior : float > 0, pseudo-count of predicted acceptances at ratio 1
    decay : float in (0, 1]
    device : where the sums live (the models' device)
    """

    def __init__(self, bins: str = "score", *, max_depth: int = 16, score_edges=None,
                 prior: float = 2.0, decay: float = 1.0, device="cpu"):
        if bins not in ("depth", "score"):
            raise ValueError(f"bins must be 'depth' or 'score', got {bins!r}")
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if not (isinstance(prior, (int, float)) and math.isfinite(prior) and prior > 0):
            raise ValueError(f"prior must be a finite number > 0, got {prior!r}")
        if not (isinstance(decay, (int, float)) and 0 < decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if score_edges is None:
            score_edges = [-k * math.log(2.0) for k in range(1, 13)]
        edges = [float(e) for e in score_edges]
        if bins == "score" and (not edges or any(not e < 0 for e in edges)
                                or any(a <= b for a, b in zip(edges, edges[1:]))):
            raise ValueError(f"score_edges must be non-empty, descending and < 0, got {score_edges!r}")
        self.bins, self.prior, self.decay = bins, float(prior), float(decay)
        self.num_bins = max_depth if bins == "depth" else len(edges) + 1
        self.device = torch.device(device)
        self.score_edges = torch.tensor(edges, dtype=torch.float32, device=self.device)
        self._neg_edges = -self.score_edges          # ascending, for bucketize
        self.predicted = torch.zeros(self.num_bins, dtype=torch.float64, device=self.device)
        self.accepted = torch.zeros_like(self.predicted)

    @torch.inference_mode()
    def reset(self) -> None:
        """Forget every observation (ratios back to 1)."""
        self.predicted.zero_()
        self.accepted.zero_()

    def ratios(self) -> torch.Tensor:
        """float32 [num_bins]: observed / predicted acceptances per bin (with the prior)."""
        return ((self.accepted + self.prior) / (self.predicted + self.prior)).float()

    def bin_index(self, depths: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        """int64, the shape of ``scores``: each node's bin (meaningful for depth >= 1);
        ``depths`` (the same shape) is only read with depth bins."""
        if self.bins == "depth":
            return (depths.long() - 1).clamp(0, self.num_bins - 1)
        # The number of edges above the score: edges e with -e < -score.
        return torch.bucketize(-scores, self._neg_edges)

    def weights(self, depths: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        """float32, the shape of ``scores``: ``ratio[bin]`` of each node (``depths`` as in
        :meth:`bin_index`)."""
        return self.ratios()[self.bin_index(depths, scores)]

    @torch.inference_mode()
    def update(self, tree: Tree, verdict, active: torch.Tensor | None = None) -> None:
        """Add one verified round: ``tree`` [B, N] and its ``verdict`` (accept_len [B], path
        [B, M]); ``active`` bool [B] (default all) selects the sequences that count."""
        if active is None:
            active = torch.ones(tree.batch_size, dtype=torch.bool, device=tree.scores.device)
        if self.decay != 1.0:
            self.predicted.mul_(self.decay)
            self.accepted.mul_(self.decay)
        bins = self.bin_index(tree.depths, tree.scores)      # in range for every node
        # Padding rows have score -inf (exp 0); the root (node 0) is always accepted: left out.
        predicted = tree.scores[:, 1:].exp() * active[:, None]
        self.predicted.index_add_(0, bins[:, 1:].flatten(), predicted.flatten().double())
        step = torch.arange(1, verdict.path.shape[1], device=active.device)
        on_path = (step <= verdict.accept_len[:, None]) & active[:, None]
        if self.bins == "depth":         # path node j sits at depth j
            counts = on_path.sum(0).double()
            k = min(counts.shape[0], self.num_bins)
            self.accepted[:k] += counts[:k]
            self.accepted[-1:] += counts[k:].sum()
        else:
            path_bins = bins.gather(1, verdict.path[:, 1:].clamp_min(0).long())
            self.accepted.index_add_(0, path_bins.flatten(), on_path.flatten().double())


def _tie_key(depths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (mult, offset) of the key ``score * mult - offset`` that orders candidates by
    (score, -depth): distinct float32 scores differ by >= 2**-24 of their size, far more than the
    depth term (depth * 2**-36 of it; 2**-1000 when the score is 0)."""
    d = depths.double()
    return 1.0 + d * 2.0 ** -36, d * 2.0 ** -1000


def _curve(scores: torch.Tensor, depths: torch.Tensor, m: int, calibrator, key=None) -> torch.Tensor:
    """[B, m + 1]: 0, then the running sum of (weighted) exp(score) of the m best candidates
    (``scores`` float32, ``depths`` [B, C]) in topn's order: higher score, ties to lower depth
    (ties within a depth share their weight, so their order does not matter). ``key``: the
    :func:`_tie_key` of ``depths``, if already known."""
    if scores.shape[1] < m:    # fewer nodes than m (a small implicit tree): pad, the curve goes flat
        pad = m - scores.shape[1]
        scores = torch.cat([scores, scores.new_full((scores.shape[0], pad), -math.inf)], dim=1)
        depths = torch.cat([depths, depths.new_zeros(depths.shape[0], pad)], dim=1)
        key = None
    mult, offset = _tie_key(depths) if key is None else key
    order = (scores.double() * mult - offset).topk(m, dim=1).indices
    vals = scores.gather(1, order)
    prob = vals.exp()
    if calibrator is not None:
        prob = prob * calibrator.weights(depths.gather(1, order), vals)
    zero = torch.zeros(scores.shape[0], 1, dtype=prob.dtype, device=prob.device)
    return torch.cat([zero, prob.cumsum(1)], dim=1)


@torch.inference_mode()
def expected_accept_curve(tree: Tree, calibrator: AcceptanceCalibrator | None = None) -> torch.Tensor:
    """Expected accepted length of the best n-node subtree of each tree, for every n.

    Parameters
    ----------
    tree : Tree [B, N] (for a ``topn`` tree of budget N, the best n-node subtree is the topn tree
        of budget n)
    calibrator : optional; weights each node's exp(score) by its bin's observed ratio

    Returns
    -------
    float32 [B, N]: column ``n - 1`` = sum of (calibrated) exp(score) over the n - 1 best non-root
    nodes (column 0 is 0; flat past num_nodes, where scores are -inf).
    """
    n = tree.capacity
    if n == 1:
        return torch.zeros(tree.batch_size, 1, dtype=torch.float32, device=tree.scores.device)
    return _curve(tree.scores[:, 1:].float(), tree.depths[:, 1:], n - 1, calibrator)


@torch.inference_mode()
def expected_accept_curve_from_topk(topk_logprobs: torch.Tensor, n_max: int,
                                    calibrator: AcceptanceCalibrator | None = None) -> torch.Tensor:
    """:func:`expected_accept_curve` of the topn tree of budget ``n_max``, without building it.

    The best n_max - 1 non-root nodes come from the best few of each depth (see
    :func:`_level_scores`; depths past n_max - 1 cannot make it).

    Parameters
    ----------
    topk_logprobs : float32 [B, D, K], per-depth top-K log-probs (descending)
    n_max : int >= 1
    calibrator : optional, as in :func:`expected_accept_curve`

    Returns
    -------
    float32 [B, n_max]
    """
    b, d, k = topk_logprobs.shape
    m = n_max - 1
    if m < 1:
        return torch.zeros(b, 1, dtype=torch.float32, device=topk_logprobs.device)
    levels = _level_scores(topk_logprobs.float(), m)
    depths, mult, offset = _levels(tuple(t.shape[1] for t in levels), topk_logprobs.device)
    return _curve(torch.cat(levels, dim=1), depths.expand(b, -1), m, calibrator, (mult, offset))


def _level_scores(lp: torch.Tensor, m: int) -> list[torch.Tensor]:
    """float32 [B, w_j] for depth j + 1 = 1 .. L = min(D, m): scores of depth-(j+1) nodes of the
    implicit tree of ``lp`` [B, D, K] (unordered) that include the m - j best (all of them if
    fewer; the last depth is not cut, the caller's selection over all depths does that).

    Every depth-d node has the same K children, so the best depth-(d+1) scores are among the sums
    of the best depth-d scores and row d's K log-probs, and at most m - d depth-(d+1) nodes fit
    among the best m (each shallower depth holds an ancestor). Scores are accumulated left to
    right in float32, as the tree builders do, so they equal the built tree's bit for bit."""
    rows = lp.unsqueeze(2).unbind(1)                     # D views [B, 1, K]
    cur = lp[:, 0]
    levels = []
    last = min(lp.shape[1], m) - 1
    for j in range(last + 1):
        if j:
            cur = (cur.unsqueeze(2) + rows[j]).flatten(1)
        if cur.shape[1] > m - j and j < last:
            cur = cur.topk(m - j, dim=1, sorted=False).values
        levels.append(cur)
    return levels


@functools.lru_cache(maxsize=64)
def _levels(level_sizes: tuple, device: torch.device):
    """int32 depths [C] (depth j + 1 repeated level_sizes[j] times) and their :func:`_tie_key`.
    Cached: the first (eager) round makes them, so CUDA-graph captures copy nothing from the host."""
    depths = torch.repeat_interleave(torch.arange(1, len(level_sizes) + 1, dtype=torch.int32),
                                     torch.tensor(level_sizes))
    return tuple(t.to(device) for t in (depths, *_tie_key(depths)))


@torch.inference_mode()
def choose_budget(curve: torch.Tensor, sizes, costs, active: torch.Tensor | None = None) -> torch.Tensor:
    """The candidate size with the most expected tokens per second, chosen on the device.

    Parameters
    ----------
    curve : float [B, N] from :func:`expected_accept_curve` (column n - 1 = E(n))
    sizes : candidate sizes (ints in [1, N], or an int64 tensor [S])
    costs : float tensor [S] (seconds per round at each size) or a :class:`CostModel`
    active : bool [B], optional: only these sequences' tokens count

    Returns
    -------
    int64 0-dim tensor: the index into ``sizes`` of ``argmax_s sum_b (1 + E_b(sizes[s])) / c_s``
    (ties to the first, i.e. the smaller size when sizes ascend).
    """
    dev = curve.device
    idx = torch.as_tensor(sizes, device=dev).long() - 1
    if isinstance(costs, CostModel):
        costs = costs.tensor(sizes.tolist() if torch.is_tensor(sizes) else sizes, dev)
    return _best_rate(curve[:, idx], costs, active)


def _best_rate(expected: torch.Tensor, costs: torch.Tensor, active) -> torch.Tensor:
    """``argmax_s sum_b (1 + expected[b, s]) / costs[s]`` over the ``active`` rows (all if None)."""
    tokens = 1.0 + expected
    if active is not None:
        tokens = torch.where(active[:, None], tokens, 0.0)
    return torch.argmax(tokens.sum(0) / costs)


@torch.inference_mode()
def choose_budget_from_topk(topk_logprobs: torch.Tensor, sizes, costs,
                            calibrator: AcceptanceCalibrator | None = None,
                            active: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`choose_budget` on :func:`expected_accept_curve_from_topk`, the same index, in fewer
    torch ops (the per-round choice of ``generate(budget="auto")``).

    The best ``max(sizes) - 1`` non-root scores are sorted once; without a calibrator or with
    score bins a node's calibrated probability depends on its score alone, so tied scores add the
    same amount and one cumulative sum read at every size gives E(n) for all sizes at once, the
    same float32 values as the curve. Depth bins need topn's tie order (lower depth first) and
    take :func:`expected_accept_curve_from_topk`'s path.

    Parameters
    ----------
    topk_logprobs : float32 [B, D, K], per-depth top-K log-probs (descending)
    sizes : candidate sizes (ints >= 1; Python ints, or a CPU tensor, since they shape the work)
    costs : float tensor [S] (seconds per round at each size) or a :class:`CostModel`
    calibrator : optional, as in :func:`expected_accept_curve`
    active : bool [B], optional: only these sequences' tokens count

    Returns
    -------
    int64 0-dim tensor on the device of ``topk_logprobs``: the index into ``sizes`` of
    ``argmax_s sum_b (1 + E_b(sizes[s])) / c_s`` (ties to the first).
    """
    sizes = tuple(int(n) for n in sizes)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be a non-empty list of ints >= 1, got {sizes}")
    if calibrator is not None and calibrator.bins == "depth":
        curve = expected_accept_curve_from_topk(topk_logprobs, max(sizes), calibrator)
        return choose_budget(curve, sizes, costs, active)
    dev = topk_logprobs.device
    if isinstance(costs, CostModel):
        costs = costs.tensor(sizes, dev)
    m = max(sizes) - 1
    if m < 1:
        curve = topk_logprobs.new_zeros(topk_logprobs.shape[0], 0, dtype=torch.float32)
    else:
        scores = torch.cat(_level_scores(topk_logprobs.float(), m), dim=1)
        vals = scores.topk(min(m, scores.shape[1]), dim=1).values    # sorted, descending
        prob = vals.exp()
        if calibrator is not None:
            prob = prob * calibrator.weights(None, vals)
        curve = prob.cumsum(1)
    cols, pad = _size_columns(sizes, curve.shape[1], dev)
    if pad:                      # a size 1 reads E = 0 from a zero column
        curve = torch.nn.functional.pad(curve, (1, 0))
    return _best_rate(curve[:, cols], costs, active)


@functools.lru_cache(maxsize=64)
def _size_columns(sizes: tuple, curve_cols: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """int64 [S]: the column of E(n) for each size in a cumulative sum of ``curve_cols`` nodes (flat
    past it), and whether a zero column must come first (some size is 1). Cached like
    :func:`_levels`."""
    pad = min(sizes) == 1
    cols = [min(n - 1, curve_cols) - (not pad) for n in sizes]
    return torch.tensor(cols, dtype=torch.int64, device=device), pad
