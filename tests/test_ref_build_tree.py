"""python_ref build_tree against brute force: exhaustive top-N, an independent heap simulation
for accum_logp, and hypothesis properties."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from jetspec_kernels import python_ref as R
from helpers import ancestor_set, mask_bit

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- brute force
def all_nodes(lp, D, K):
    """Every node of the implicit tree: (rank_seq, score) with float64 left-to-right sums."""
    out = []
    for d in range(D + 1):
        for seq in itertools.product(range(K), repeat=d):
            s = 0.0
            for depth, r in enumerate(seq):
                s = s + lp[depth][r]
            out.append((seq, s))
    return out


def brute_topn(lp, tok, root, D, K, budget):
    nodes = all_nodes(lp, D, K)
    # total order: higher score, lower depth, lexicographically smaller rank sequence
    nodes.sort(key=lambda t: (-t[1], len(t[0]), t[0]))
    best = nodes[:budget]
    chosen = {seq for seq, _ in best}
    # ancestor-closed (optimal tree is a real tree)
    for seq in chosen:
        assert seq[:-1] in chosen or seq == ()
    # output order = (depth, parent index, rank) == (depth, lexicographic rank sequence)
    best.sort(key=lambda t: (len(t[0]), t[0]))
    index = {seq: i for i, (seq, _) in enumerate(best)}
    tokens = [root if not seq else tok[len(seq) - 1][seq[-1]] for seq, _ in best]
    parents = [-1 if not seq else index[seq[:-1]] for seq, _ in best]
    depths = [len(seq) for seq, _ in best]
    scores = [s for _, s in best]
    return tokens, parents, depths, scores


def sim_accum_logp(lp, tok, root, D, K, budget):
    """JetSpec's rule with a linear-scan frontier instead of a heap."""
    nodes = [((), 0.0, -1)]
    frontier = [0]
    while frontier and len(nodes) < budget:
        best = max(frontier, key=lambda i: (nodes[i][1], -i))  # best score, earliest inserted
        frontier.remove(best)
        seq, score, _ = nodes[best]
        if len(seq) == D:
            continue
        for r in range(min(K, budget - len(nodes))):
            nodes.append((seq + (r,), score + lp[len(seq)][r], best))
            frontier.append(len(nodes) - 1)
    tokens = [root if not seq else tok[len(seq) - 1][seq[-1]] for seq, _, _ in nodes]
    return tokens, [p for _, _, p in nodes], [len(s) for s, _, _ in nodes], [s for _, s, _ in nodes]


def check_padding(tree, b, n, N):
    assert tree["tokens"][b, n:].eq(0).all()
    assert tree["parents"][b, n:].eq(-1).all()
    assert tree["depths"][b, n:].eq(-1).all()
    assert torch.isneginf(tree["scores"][b, n:]).all()
    for i in range(n, N):
        for j in range(N):
            assert mask_bit(tree["mask"], b, i, j) == (1 if i == j else 0)


def make_topk(lp_rows, B_tokens_seed=0):
    """lp_rows: nested list [B][D][K] -> (topk_tokens int32 with distinct tokens per row, lp f64)."""
    lp = torch.tensor(lp_rows, dtype=torch.float64)
    B, D, K = lp.shape
    g = torch.Generator().manual_seed(B_tokens_seed)
    tok = torch.stack([torch.stack([torch.randperm(100, generator=g)[:K] for _ in range(D)])
                       for _ in range(B)]).to(torch.int32)
    return tok, lp


def compare_with(expected_fn, algorithm, lp_rows, budget, roots=None):
    tok, lp = make_topk(lp_rows)
    B, D, K = lp.shape
    roots = torch.arange(7, 7 + B, dtype=torch.int32) if roots is None else roots
    tree = R.build_tree(tok, lp, roots, budget, algorithm)
    N = budget
    assert tree["tokens"].shape == (B, N) and tree["mask"].shape == (B, N, (N + 31) // 32)
    for name in ("tokens", "parents", "depths", "num_nodes", "mask"):
        assert tree[name].dtype == torch.int32, name
    assert tree["scores"].dtype == torch.float64
    for b in range(B):
        t, p, d, s = expected_fn(lp[b].tolist(), tok[b].tolist(), int(roots[b]), D, K, budget)
        n = len(t)
        assert int(tree["num_nodes"][b]) == n
        assert tree["tokens"][b, :n].tolist() == t
        assert tree["parents"][b, :n].tolist() == p
        assert tree["depths"][b, :n].tolist() == d
        assert tree["scores"][b, :n].tolist() == s
        check_padding(tree, b, n, N)
    return tree


# ----------------------------------------------------------------------------- topn
@pytest.mark.parametrize("D,K", [(1, 1), (1, 4), (2, 3), (3, 2), (3, 3), (4, 2)])
def test_topn_matches_exhaustive_enumeration(D, K):
    g = torch.Generator().manual_seed(D * 10 + K)
    total = R.implicit_tree_size(D, K)
    for budget in sorted({1, 2, 3, K + 1, total // 2 + 1, total - 1, total, total + 5} - {0}):
        lp = -torch.rand(2, D, K, generator=g, dtype=torch.float64) * 3
        lp = lp.sort(dim=-1, descending=True).values
        tree = compare_with(brute_topn, "topn", lp.tolist(), budget)
        assert tree["num_nodes"].tolist() == [min(budget, total)] * 2


def test_topn_tie_rules():
    # Exact ties everywhere: log-probs 0 and -1 (exact in binary floating point).
    # depth-1 rank 0 has lp 0, so root ties with it -> root first (lower depth);
    # among equal scores at equal depth the lexicographically smaller rank sequence wins.
    lp = [[[0.0, -1.0, -1.0], [0.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]]
    for budget in range(1, 20):
        compare_with(brute_topn, "topn", lp, budget)
    # all-equal log-probs: best-first must prefer shallow nodes, then lexicographic order
    lp = [[[-0.5, -0.5], [-0.5, -0.5], [-0.5, -0.5]]]
    tree = compare_with(brute_topn, "topn", lp, 6)
    assert tree["depths"][0].tolist() == [0, 1, 1, 2, 2, 2]
    assert tree["parents"][0].tolist() == [-1, 0, 0, 1, 1, 2]


def test_topn_unsorted_rows_and_neg_inf():
    # build_tree does not assume sorted rows; -inf log-probs rank last (by depth, then lex).
    lp = [[[-2.0, -0.5, -math.inf], [-1.0, -math.inf, -0.25]]]
    for budget in range(1, 15):
        compare_with(brute_topn, "topn", lp, budget)


def test_topn_hand_example():
    # D=2, K=2, lp depth1 = [-0.1, -2.0], depth2 = [-0.2, -0.3]
    # nodes: () 0, (0,) -0.1, (0,0) -0.3, (0,1) -0.4, (1,) -2.0, (1,0) -2.2, (1,1) -2.3
    tok = torch.tensor([[[11, 12], [21, 22]]], dtype=torch.int32)
    lp = torch.tensor([[[-0.1, -2.0], [-0.2, -0.3]]], dtype=torch.float64)
    tree = R.build_tree(tok, lp, torch.tensor([5], dtype=torch.int32), 5, "topn")
    # chosen: (), (0,), (0,0), (0,1), (1,) ; order by depth then lex
    assert tree["tokens"][0].tolist() == [5, 11, 12, 21, 22]
    assert tree["parents"][0].tolist() == [-1, 0, 0, 1, 1]
    assert tree["depths"][0].tolist() == [0, 1, 1, 2, 2]
    assert torch.allclose(tree["scores"][0], torch.tensor([0, -0.1, -2.0, -0.3, -0.4], dtype=torch.float64))


# ----------------------------------------------------------------------------- accum_logp
@pytest.mark.parametrize("D,K", [(1, 3), (2, 2), (3, 3), (4, 2), (5, 4)])
def test_accum_logp_matches_independent_simulation(D, K):
    g = torch.Generator().manual_seed(100 + D * 10 + K)
    for budget in (1, 2, K, K + 1, 2 * K + 1, 13, 40):
        lp = -torch.rand(3, D, K, generator=g, dtype=torch.float64) * 2
        lp = lp.sort(dim=-1, descending=True).values
        compare_with(sim_accum_logp, "accum_logp", lp.tolist(), budget)


def test_accum_logp_ties_and_depth_skip():
    # Integer ties: heap ties go to the earlier inserted node.
    lp = [[[0.0, -1.0, -1.0], [-1.0, -1.0, -2.0]]]
    for budget in range(1, 16):
        compare_with(sim_accum_logp, "accum_logp", lp, budget)
    # D=1: the root's children are the only expansions; leaves at depth D are skipped, so the
    # tree stops at 1 + K nodes even with a bigger budget.
    tree = compare_with(sim_accum_logp, "accum_logp", [[[-0.1, -0.2]]], 10)
    assert int(tree["num_nodes"][0]) == 3


def test_accum_logp_hand_example():
    # K=2, D=2, budget 4: pop root -> append ranks 0,1 (nodes 1,2; scores -0.1, -2.0)
    # pop node 1 (-0.1) -> only 1 slot left -> append its rank-0 child (node 3, -0.3).
    tok = torch.tensor([[[11, 12], [21, 22]]], dtype=torch.int32)
    lp = torch.tensor([[[-0.1, -2.0], [-0.2, -0.3]]], dtype=torch.float64)
    tree = R.build_tree(tok, lp, torch.tensor([5], dtype=torch.int32), 4, "accum_logp")
    assert tree["tokens"][0].tolist() == [5, 11, 12, 21]
    assert tree["parents"][0].tolist() == [-1, 0, 0, 1]
    # differs from topn, which would pick (0,1) -0.4 over (1,) -2.0 with budget 4
    topn = R.build_tree(tok, lp, torch.tensor([5], dtype=torch.int32), 4, "topn")
    assert topn["tokens"][0].tolist() == [5, 11, 21, 22]


def test_bad_algorithm():
    tok, lp = make_topk([[[-0.1]]])
    with pytest.raises(ValueError):
        R.build_tree(tok, lp, torch.tensor([1]), 4, "greedy")


def test_float32_scores_accumulate_in_float32():
    tok, lp = make_topk([[[-0.1, -0.7], [-0.3, -0.9], [-0.2, -0.4]]])
    tree = R.build_tree(tok, lp.float(), torch.tensor([0]), 15, "topn")
    assert tree["scores"].dtype == torch.float32
    par, dep = tree["parents"][0].tolist(), tree["depths"][0].tolist()
    tokens = tree["tokens"][0].tolist()
    for i in range(1, int(tree["num_nodes"][0])):
        d = dep[i]
        r = tok[0, d - 1].tolist().index(tokens[i])
        expect = tree["scores"][0, par[i]] + lp.float()[0, d - 1, r]   # float32 addition
        assert tree["scores"][0, i].item() == expect.item()


# ----------------------------------------------------------------------------- properties
@st.composite
def topk_inputs(draw):
    B = draw(st.integers(1, 2))
    D = draw(st.integers(1, 5))
    K = draw(st.integers(1, 4))
    budget = draw(st.integers(1, 40))
    integer_scores = draw(st.booleans())  # exact ties when True
    if integer_scores:
        vals = st.integers(-4, 0).map(float)
    else:
        vals = st.floats(-6.0, 0.0, allow_nan=False)
    lp = draw(st.lists(st.lists(st.lists(vals, min_size=K, max_size=K), min_size=D, max_size=D),
                       min_size=B, max_size=B))
    lp = torch.tensor(lp, dtype=torch.float64).sort(dim=-1, descending=True).values
    seed = draw(st.integers(0, 2 ** 16))
    return lp, budget, seed


@HYP
@given(topk_inputs(), st.sampled_from(["topn", "accum_logp"]), st.booleans())
def test_tree_invariants(inp, algorithm, as_float32):
    lp, budget, seed = inp
    if as_float32:
        lp = lp.float()
    B, D, K = lp.shape
    g = torch.Generator().manual_seed(seed)
    tok = torch.stack([torch.stack([torch.randperm(50, generator=g)[:K] for _ in range(D)])
                       for _ in range(B)]).to(torch.int32)
    roots = torch.randint(0, 50, (B,), generator=g, dtype=torch.int32)
    tree = R.build_tree(tok, lp, roots, budget, algorithm)
    again = R.build_tree(tok, lp, roots, budget, algorithm)
    for k in tree:
        assert torch.equal(tree[k], again[k]), "non-deterministic " + k
    N = budget
    total = R.implicit_tree_size(D, K)
    for b in range(B):
        n = int(tree["num_nodes"][b])
        assert 1 <= n <= budget and n <= total
        if algorithm == "topn":
            assert n == min(budget, total)
        par = tree["parents"][b].tolist()
        dep = tree["depths"][b].tolist()
        sc = tree["scores"][b].tolist()
        tk = tree["tokens"][b].tolist()
        assert par[0] == -1 and dep[0] == 0 and sc[0] == 0.0 and tk[0] == int(roots[b])
        children = {}
        for i in range(1, n):
            p = par[i]
            assert 0 <= p < i                                  # parents precede children
            assert dep[i] == dep[p] + 1 and dep[i] <= D
            assert sc[i] <= sc[p]                              # non-increasing along paths
            r = tok[b, dep[i] - 1].tolist().index(tk[i])      # token must be a top-K candidate
            expect = torch.tensor(sc[p], dtype=lp.dtype) + lp[b, dep[i] - 1, r]
            assert sc[i] == expect.item()
            children.setdefault(p, []).append(r)
        for p, ranks in children.items():
            assert len(set(ranks)) == len(ranks)                # no duplicate siblings
            if algorithm == "accum_logp":
                assert ranks == list(range(len(ranks)))         # rank-order prefix, contiguous
        if algorithm == "topn":
            key = [(dep[i], par[i], tok[b, dep[i] - 1].tolist().index(tk[i]) if i else 0)
                   for i in range(n)]
            assert key == sorted(key)
        for i in range(N):
            anc = ancestor_set(par, i) if i < n else {i}
            assert {j for j in range(N) if mask_bit(tree["mask"], b, i, j)} == anc
        check_padding(tree, b, n, N)


@HYP
@given(topk_inputs())
def test_topn_optimal_property(inp):
    """topn equals exhaustive enumeration (float64, ties included) whenever the tree is small."""
    lp, budget, seed = inp
    B, D, K = lp.shape
    if R.implicit_tree_size(D, K) > 400:
        return
    compare_with(brute_topn, "topn", lp.tolist(), budget)


@HYP
@given(topk_inputs())
def test_accum_logp_simulation_property(inp):
    lp, budget, seed = inp
    compare_with(sim_accum_logp, "accum_logp", lp.tolist(), budget)
