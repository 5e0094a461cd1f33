"""Reference build_tree: the draft tree from per-depth top-K candidates, by either algorithm.

Everything here follows DESIGN.md section 3/4 and CONTRIBUTING.md:

* row ``d`` of the per-depth top-K (``d = 0..D-1``) gives the K candidate children of every
  node at depth ``d``; their depth is ``d + 1``;
* a node is identified by its *rank sequence* ``(r_1, ..., r_d)``; its token is
  ``topk_tokens[d - 1][r_d]`` and its score is the left-to-right running sum
  ``((0 + lp[0][r_1]) + lp[1][r_2]) + ...`` in the compute dtype;
* padding rows: ``tokens = 0``, ``parents = -1``, ``depths = -1``, ``scores = -inf``,
  mask row = own bit only.
"""

import heapq
import math

import numpy as np
import torch

from ._common import compute_dtype
from .pack_mask import pack_mask

__all__ = ["build_tree", "implicit_tree_size"]

ALGORITHMS = ("topn", "accum_logp")


def implicit_tree_size(D, K):
    """Number of nodes (root included) of the implicit tree with depth D and branching K."""
    return sum(K ** d for d in range(D + 1))


def _adder(dtype):
    """Scalar addition that rounds like ``dtype`` (Python floats are float64)."""
    if dtype == torch.float64:
        return lambda a, b: a + b
    # float64 sum of two float32 values, rounded once to float32 == float32 addition.
    return lambda a, b: float(np.float32(a + b))


def _topn_one(lp, K, D, budget, add):
    """Select the ``budget`` best nodes of one sequence's implicit tree.

    ``lp`` is a nested list ``[D][K]`` of log-probs. Returns a list of (rank_seq, score)
    in output order: (depth, parent output index, child rank), which equals
    (depth, lexicographic rank sequence).
    """
    total = implicit_tree_size(D, K)
    n_target = min(budget, total)
    # Best-first search. Key: (-score, depth, rank sequence). Because every log-prob is <= 0
    # (so a child never outranks its parent), the popped sequence is exactly the total order
    # restricted to the ancestor-closed prefix, i.e. the top n_target nodes.
    heap = [(-0.0, 0, (), 0.0)]
    chosen = []
    while heap and len(chosen) < n_target:
        neg, depth, seq, score = heapq.heappop(heap)
        chosen.append((seq, score))
        if depth < D:
            for r in range(K):
                cs = add(score, lp[depth][r])
                heapq.heappush(heap, (-cs, depth + 1, seq + (r,), cs))
    chosen.sort(key=lambda t: (len(t[0]), t[0]))
    return chosen


def _accum_logp_one(lp, K, D, budget, add):
    """JetSpec's heap rule for one sequence.

    Returns lists (rank_seq, score, parent index) in insertion order.
    """
    nodes = [((), 0.0, -1)]
    counter = 0
    heap = [(-0.0, counter, 0)]  # (-score, insertion counter, node index); ties -> earlier inserted
    while heap and len(nodes) < budget:
        _, _, idx = heapq.heappop(heap)
        seq, score, _ = nodes[idx]
        depth = len(seq)
        if depth == D:
            continue
        m = min(K, budget - len(nodes))
        for r in range(m):
            cs = add(score, lp[depth][r])
            nodes.append((seq + (r,), cs, idx))
            counter += 1
            heapq.heappush(heap, (-cs, counter, len(nodes) - 1))
    return nodes


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm="topn"):
    """Build the draft tree from per-depth top-K candidates.

    Parameters
    ----------
    topk_tokens : int ``[B, D, K]``; row d = candidate tokens of the children of depth-d nodes
    topk_logprobs : float ``[B, D, K]``, all ``<= 0`` (log-probs)
    root_tokens : int ``[B]``
    budget : int >= 1, tree capacity ``N``
    algorithm : ``"topn"`` or ``"accum_logp"``

    Returns
    -------
    dict with
        tokens int32 ``[B, N]``, parents int32 ``[B, N]``, depths int32 ``[B, N]``,
        scores ``[B, N]`` (compute dtype; root 0, padding -inf), num_nodes int32 ``[B]``,
        mask int32 ``[B, N, ceil(N/32)]``.

    ``topn``: the ``budget`` best nodes (root included) by score; ties to higher score, then
    lower depth, then lexicographically smaller rank sequence; ordered by (depth, parent index,
    child rank). ``num_nodes = min(budget, 1 + K + ... + K**D)``.

    ``accum_logp``: max-heap on score seeded with the root (node 0), ties to the earlier
    inserted; pop the best, skip it if its depth is D, else append its ``min(K, budget - n)``
    children in rank order; stop at ``budget`` nodes or an empty heap. Insertion order.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    B, D, K = topk_tokens.shape
    cd = compute_dtype(topk_logprobs)
    add = _adder(cd)
    device = topk_tokens.device
    N = budget

    tok_l = topk_tokens.detach().cpu().to(torch.int64).tolist()
    lp_l = topk_logprobs.detach().cpu().to(cd).tolist()
    root_l = root_tokens.detach().cpu().to(torch.int64).tolist()

    # padding rows: token 0, parent -1, depth -1, score -inf
    tokens = [[0] * N for _ in range(B)]
    parents = [[-1] * N for _ in range(B)]
    depths = [[-1] * N for _ in range(B)]
    scores = [[-math.inf] * N for _ in range(B)]
    num_nodes = [0] * B

    for b in range(B):
        if algorithm == "topn":
            chosen = _topn_one(lp_l[b], K, D, budget, add)
            index_of = {seq: i for i, (seq, _) in enumerate(chosen)}
            rows = [(seq, score, index_of[seq[:-1]] if seq else -1) for seq, score in chosen]
        else:
            rows = _accum_logp_one(lp_l[b], K, D, budget, add)
        for i, (seq, score, par) in enumerate(rows):
            d = len(seq)
            tokens[b][i] = root_l[b] if d == 0 else tok_l[b][d - 1][seq[-1]]
            parents[b][i] = par
            depths[b][i] = d
            scores[b][i] = score
        num_nodes[b] = len(rows)

    # reshape: with B = 0 the nested lists are empty and lose the N dim
    tokens, parents, depths = (torch.tensor(x, dtype=torch.int32).reshape(B, N)
                               for x in (tokens, parents, depths))
    num_nodes = torch.tensor(num_nodes, dtype=torch.int32)
    scores = torch.tensor(scores, dtype=cd).reshape(B, N)
    mask = pack_mask(parents, num_nodes)
    out = dict(tokens=tokens, parents=parents, depths=depths, scores=scores,
               num_nodes=num_nodes, mask=mask)
    return {k: v.to(device) for k, v in out.items()}
