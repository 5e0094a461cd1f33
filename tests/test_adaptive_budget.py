"""Adaptive tree budget (jetspec_kernels.adaptive and generate(budget="auto" | [sizes])): the
expected-accepted-length curve against brute force, the calibrator against synthetic acceptance,
the chooser and cost model by hand, and adaptive decoding: lossless, the tree of the chosen size
exactly the fixed-budget tree, sampling reproducible and distributed like the target."""
import math
from types import SimpleNamespace

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels import adaptive as A
from jetspec_kernels.adaptive import round_costs
from jetspec_kernels.adaptive.kept import kept_for
from jetspec_kernels.decode import loop
from jetspec_kernels.decode.speculative import SpeculativeDecode
from jetspec_kernels.decode import generate, generate_ar, measure_round_costs
from jetspec_kernels.models import tiny_models
from jetspec_kernels.tree import Tree

pytestmark = pytest.mark.usefixtures("reference_backend")


def _tree(lp: torch.Tensor, budget: int) -> Tree:
    """The reference topn tree of per-depth log-probs ``lp`` [B, D, K] (tokens = ranks)."""
    b, d, k = lp.shape
    tk = torch.arange(k, dtype=torch.int32).expand(b, d, k).contiguous()
    t = ref.build_tree(tk, lp, torch.zeros(b, dtype=torch.int32), budget, "topn")
    return Tree(t["tokens"], t["parents"], t["depths"], t["scores"], t["num_nodes"], t["mask"],
                max_depth=min(d, budget - 1))


def _random_lp(gen, b, d, k, ties: bool) -> torch.Tensor:
    if ties:   # a few distinct values, 0 included: exact ties across depths and siblings
        lp = -(torch.randint(0, 4, (b, d, k), generator=gen).float() * 0.5)
    else:
        lp = torch.log_softmax(torch.randn(b, d, 40, generator=gen) * 2, -1)[..., :k]
    return lp.sort(-1, descending=True).values.contiguous()


def _calibrator(gen, max_depth=6, bins="depth") -> A.AcceptanceCalibrator:
    cal = A.AcceptanceCalibrator(bins, max_depth=max_depth)
    cal.predicted += torch.rand(cal.num_bins, generator=gen, dtype=torch.float64) * 6
    cal.accepted += torch.rand(cal.num_bins, generator=gen, dtype=torch.float64) * 3
    return cal


def _brute_curve(tree: Tree, weight) -> torch.Tensor:
    """float64 [B, N]: nodes ranked by (score desc, depth asc, index asc) -- topn's order, since
    node order within a depth is lexicographic -- and the running sum of weight * exp(score)."""
    out = torch.zeros(tree.batch_size, tree.capacity, dtype=torch.float64)
    for b in range(tree.batch_size):
        nodes = [(-float(tree.scores[b, i]), int(tree.depths[b, i]), i)
                 for i in range(1, int(tree.num_nodes[b]))]
        total = 0.0
        for n, (neg, depth, i) in enumerate(sorted(nodes), start=2):
            total += weight(depth, -neg) * math.exp(-neg)
            out[b, n - 1] = total
        out[b, len(nodes) + 1:] = total
    return out


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("bins", [None, "depth", "score"])
def test_curve_equals_brute_force(ties, bins):
    gen = torch.Generator().manual_seed(1 + ties)
    for _ in range(12):
        d, k, n = (int(torch.randint(1, hi, (1,), generator=gen)) for hi in (6, 5, 70))
        lp = _random_lp(gen, 2, d, k, ties)
        tree = _tree(lp, n)
        cal = None if bins is None else _calibrator(gen, bins=bins)
        if cal is None:
            weight = lambda depth, score: 1.0  # noqa: E731
        else:
            ratios = cal.ratios().double()
            weight = lambda depth, score: float(  # noqa: E731
                ratios[cal.bin_index(torch.tensor(depth), torch.tensor(score, dtype=torch.float32))])
        curve = A.expected_accept_curve(tree, cal)
        assert curve.shape == (2, n) and curve.dtype == torch.float32
        want = _brute_curve(tree, weight)
        assert float((curve.double() - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
        # The same curve without building the tree, bit for bit.
        assert torch.equal(A.expected_accept_curve_from_topk(lp, n, cal), curve)


def test_curve_of_the_big_tree_is_the_small_trees_expected_length():
    """E(n) read off the budget-N tree is the expected length of the budget-n topn tree itself
    (the n - 1 best nodes are exactly that tree's), ties and calibration included."""
    gen = torch.Generator().manual_seed(3)
    for ties in (False, True):
        lp = _random_lp(gen, 3, 5, 3, ties)
        cal = _calibrator(gen)
        big = A.expected_accept_curve_from_topk(lp, 60, cal)
        for n in range(1, 61):
            small = A.expected_accept_curve(_tree(lp, n), cal)
            assert torch.equal(big[:, n - 1], small[:, n - 1]), n


def test_curve_through_the_public_draft_tree():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 6, 50, generator=gen) * 3
    tree = jk.draft_tree(logits, torch.tensor([1, 2]), budget=40, topk=4)
    got = A.expected_accept_curve(tree)
    want = _brute_curve(tree, lambda depth, score: 1.0)
    assert float((got.double() - want).abs().max()) <= 1e-5
    tk, lp = ref.log_softmax_topk(logits, 4)
    assert torch.equal(A.expected_accept_curve_from_topk(lp, 40), got)
    assert float(got[:, -1].max()) > 0.5          # a non-trivial curve


def _walk_round(gen, lp, r, budget):
    """One synthetic round: the topn tree of ``lp`` and a verdict whose target, at a depth-d node,
    picks child rank j with probability r[d] * exp(lp[d, j]) and otherwise a token no child has.
    So P(a depth-d node is accepted) = prod(r[:d]) * exp(score)."""
    tree = _tree(lp, budget)
    b, n = tree.tokens.shape
    d, k = lp.shape[1], lp.shape[2]
    depth = tree.depths.clamp(0, d - 1).long()
    probs = r[depth][..., None] * lp.exp().gather(1, depth[..., None].expand(b, n, k))
    probs = torch.cat([probs, (1 - probs.sum(-1, keepdim=True)).clamp_min(0)], -1)
    target = torch.multinomial(probs.view(-1, k + 1), 1, generator=gen).view(b, n).to(torch.int32)
    return tree, jk.verify_tree(tree, target_tokens=target)


def test_calibrator_converges_to_the_true_acceptance_ratio():
    gen = torch.Generator().manual_seed(5)
    r = torch.tensor([0.9, 0.7, 0.5, 0.5])
    cal = A.AcceptanceCalibrator("depth", max_depth=4, prior=1e-3)  # a negligible prior
    for _ in range(50):
        lp = torch.log_softmax(torch.randn(64, 4, 30, generator=gen) * 3, -1)
        lp = lp.sort(-1, descending=True).values[..., :3].contiguous()
        cal.update(*_walk_round(gen, lp, r, 12))
    true = torch.cumprod(r, 0)
    got = cal.ratios()
    assert float(cal.predicted[2]) > 400          # enough predicted acceptances at depth 3
    assert torch.allclose(got[:3], true[:3], rtol=0.1), (got, true)


def test_calibrator_bookkeeping_by_hand():
    """A chain tree (K = 1) with node probabilities 1/2, 1/4, 1/8; two sequences, one inactive."""
    lp = torch.full((2, 3, 1), math.log(0.5))
    tree = _tree(lp, 4)
    verdict = SimpleNamespace(accept_len=torch.tensor([2, 3], dtype=torch.int32),
                              path=torch.tensor([[0, 1, 2, -1], [0, 1, 2, 3]], dtype=torch.int32))
    cal = A.AcceptanceCalibrator("depth", max_depth=3, prior=1.0)
    cal.update(tree, verdict, active=torch.tensor([True, False]))
    assert cal.predicted.tolist() == [0.5, 0.25, 0.125]
    assert cal.accepted.tolist() == [1.0, 1.0, 0.0]
    assert torch.allclose(cal.ratios(), torch.tensor([2 / 1.5, 2 / 1.25, 1 / 1.125]))
    # Depths past max_depth share the last bin.
    two = A.AcceptanceCalibrator("depth", max_depth=2, prior=1.0)
    two.update(tree, verdict)
    assert two.predicted.tolist() == [1.0, 0.75] and two.accepted.tolist() == [2.0, 3.0]
    # Score bins: edges log(0.3), log(0.2): 1/2 -> bin 0, 1/4 -> bin 1, 1/8 -> bin 2.
    sc = A.AcceptanceCalibrator("score", score_edges=[math.log(0.3), math.log(0.2)])
    sc.update(tree, verdict)
    assert sc.predicted.tolist() == [1.0, 0.5, 0.25] and sc.accepted.tolist() == [2.0, 2.0, 1.0]
    # Forgetting: 60 rounds at depth-1 ratio 2, then 20 where nothing is accepted. Without decay the
    # ratio is (120 + 2) / (80 + 2); with decay 0.9 the recent rounds dominate (about 0.37).
    none = SimpleNamespace(accept_len=torch.zeros(2, dtype=torch.int32),
                           path=torch.tensor([[0, -1, -1, -1]] * 2, dtype=torch.int32))
    fast = A.AcceptanceCalibrator("depth", max_depth=3, decay=0.9)
    slow = A.AcceptanceCalibrator("depth", max_depth=3)
    for cal in (fast, slow):
        for _ in range(60):
            cal.update(tree, verdict)
        for _ in range(20):
            cal.update(tree, none)
    assert float(slow.ratios()[0]) == pytest.approx(122 / 82)
    assert 0.3 < float(fast.ratios()[0]) < 0.45
    slow.reset()
    assert slow.ratios().tolist() == [1.0, 1.0, 1.0]


def test_choose_budget_picks_the_argmax():
    # Two sequences; E(n) at n = 2, 4, 8 is (0.5, 1.0, 2.0) and (0.5, 3.0, 4.0): tokens per round
    # summed over the batch (3, 6, 8). Values are exact in binary, so the ties below are exact.
    curve = torch.zeros(2, 8)
    curve[0, [1, 3, 7]] = torch.tensor([0.5, 1.0, 2.0])
    curve[1, [1, 3, 7]] = torch.tensor([0.5, 3.0, 4.0])
    sizes = [2, 4, 8]
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 2.5, 2.0]))) == 2    # 3, 2.4, 4
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 1.5, 4.0]))) == 1    # 3, 4, 2
    assert int(A.choose_budget(curve, sizes, A.CostModel({2: 1.0, 4: 3.0, 8: 4.0}))) == 0  # 3, 2, 2
    # Ties go to the smaller size: 3, 4, 4 and 3, 3, 2.
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 1.5, 2.0]))) == 1
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 2.0, 4.0]))) == 0
    # Only sequence 0 counts: tokens (1.5, 2, 3) / (1, 1.5, 2.5) = 1.5, 1.33, 1.2.
    active = torch.tensor([True, False])
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 1.5, 2.5]), active)) == 0
    assert int(A.choose_budget(curve, sizes, torch.tensor([1.0, 1.5, 2.5]))) == 1    # 3, 4, 3.2
    assert int(A.choose_budget(curve, torch.tensor([4, 8]), torch.tensor([1.0, 1.0]))) == 1


def _rank_seqs(tree: Tree, b: int) -> list[tuple]:
    """Row ``b``'s nodes as rank sequences (the tree's tokens are ranks, see :func:`_tree`)."""
    seqs = []
    for i in range(int(tree.num_nodes[b])):
        p = int(tree.parents[b, i])
        seqs.append(() if p < 0 else seqs[p] + (int(tree.tokens[b, i]),))
    return seqs


@pytest.mark.parametrize("ties", [False, True])
def test_small_topn_tree_is_the_big_trees_best_nodes(ties):
    """What the curve (and the chooser) rely on: the budget-n topn tree holds exactly the n - 1
    best non-root nodes of the budget-N tree in the spec's order (score, then lower depth, then
    smaller rank sequence), laid out by (depth, rank sequence), scores bit for bit."""
    gen = torch.Generator().manual_seed(6 + ties)
    for _ in range(6):
        d, k = (int(torch.randint(1, hi, (1,), generator=gen)) for hi in (6, 5))
        lp = _random_lp(gen, 2, d, k, ties)
        big = _tree(lp, 70)
        for b in range(2):
            seqs = _rank_seqs(big, b)
            score = {s: float(big.scores[b, i]) for i, s in enumerate(seqs)}
            best = sorted(seqs[1:], key=lambda s: (-score[s], len(s), s))
            for n in range(1, len(seqs) + 1):
                small = _tree(lp, n)
                got = _rank_seqs(small, b)
                assert got == [()] + sorted(best[:n - 1], key=lambda s: (len(s), s)), (n, got)
                assert [float(small.scores[b, i]) for i in range(n)] == [score[s] for s in got]


def _old_bin_index(cal, scores):
    return (scores[..., None] < cal.score_edges).sum(-1)


def test_score_bins_count_the_edges_above():
    cal = A.AcceptanceCalibrator("score", score_edges=[math.log(0.3), math.log(0.2), -3.0])
    edges = cal.score_edges.tolist()
    scores = torch.tensor([0.0, -0.1, *edges, -3.0000002, -50.0, -math.inf,
                           *(torch.rand(40) * -6).tolist()], dtype=torch.float32)
    assert torch.equal(cal.bin_index(None, scores), _old_bin_index(cal, scores))
    assert cal.bin_index(None, scores)[:6].tolist() == [0, 0, 0, 1, 2, 3]     # [edge j, edge j-1)


@pytest.mark.parametrize("bins", [None, "depth", "score"])
def test_choose_from_topk_equals_choose_on_the_curve(bins):
    """The per-round chooser straight from the top-K gives the index ``choose_budget`` gives on
    the built tree's curve: random sizes (1 and sizes past the implicit tree included), costs with
    exact ties, ties in the log-probs, inactive sequences, batch 1-4."""
    gen = torch.Generator().manual_seed(7)
    checked = 0
    for trial in range(60):
        b, d, k = (int(torch.randint(1, hi, (1,), generator=gen)) for hi in (5, 6, 5))
        lp = _random_lp(gen, b, d, k, ties=trial % 2 == 1)
        sizes = sorted({int(x) for x in torch.randint(1, 70, (4,), generator=gen)}
                       | ({1} if trial % 5 == 0 else set()))
        costs = torch.randint(1, 5, (len(sizes),), generator=gen).float() / 2
        active = None if trial % 3 == 0 else torch.rand(b, generator=gen) < 0.7
        cal = None if bins is None else _calibrator(gen, bins=bins)
        tree = _tree(lp, max(sizes))
        want = A.choose_budget(A.expected_accept_curve(tree, cal), sizes, costs, active)
        got = A.choose_budget_from_topk(lp, sizes, costs, cal, active)
        assert got.dtype == torch.int64 and got.dim() == 0
        assert int(got) == int(want), (trial, sizes, costs)
        assert int(A.choose_budget_from_topk(lp, torch.tensor(sizes), A.CostModel(
            dict(zip(sizes, costs.tolist()))), cal, active)) == int(want)
        checked += 1
    assert checked == 60
    with pytest.raises(ValueError, match="sizes"):
        A.choose_budget_from_topk(lp, [], costs)
    with pytest.raises(ValueError, match="sizes"):
        A.choose_budget_from_topk(lp, [0, 4], costs[:2])


def test_cost_model_accepts_dicts_and_callables_and_validates():
    cm = A.CostModel({4: 0.01, 8: 0.02})
    assert cm(8) == 0.02 and cm.table([4]) == {4: 0.01}
    assert cm.tensor([8, 4]).tolist() == pytest.approx([0.02, 0.01])
    assert A.CostModel(cm).costs == cm.costs
    lin = A.CostModel(lambda n: 1e-3 * (10 + n))
    assert lin.table([4, 16]) == pytest.approx({4: 0.014, 16: 0.026})
    with pytest.raises(ValueError, match="cost_model has no cost for tree size 16"):
        cm(16)
    bad = [{}, {0: 1.0}, {True: 1.0}, {"8": 1.0}, {8: 0.0}, {8: -1.0}, {8: float("nan")},
           {8: float("inf")}, {8: "1"}, {8: True}]
    for costs in bad:
        with pytest.raises(ValueError, match="cost_model"):
            A.CostModel(costs)
    with pytest.raises(TypeError, match="cost_model"):
        A.CostModel(0.5)
    with pytest.raises(ValueError, match=r"cost_model\[4\]"):
        A.CostModel(lambda n: -1.0)(4)


def test_parse_budget():
    assert A.parse_budget(64, topk=8, depth=15) == ((64,), False)
    assert A.parse_budget("auto", topk=8, depth=15) == ((4, 8, 16, 32, 64), True)
    assert A.parse_budget("auto", topk=1, depth=15) == ((4, 8, 16), True)       # a 16-node chain
    assert A.parse_budget("auto", topk=2, depth=3) == ((4, 8, 15), True)
    assert A.parse_budget("auto", topk=1, depth=2) == ((3,), True)
    assert A.parse_budget([32, 4, 4], topk=8, depth=15) == ((4, 32), True)
    assert A.parse_budget((16,), topk=8, depth=15) == ((16,), True)


BAD_BUDGETS = ["8", "AUTO", "", 0, -4, 5000, 2.5, None, True, False, [], (), [4, "8"], [4, 2.0],
               [4, True], [0, 4], [4, 5000], {4: 1}]


@pytest.mark.parametrize("budget", BAD_BUDGETS, ids=repr)
def test_bad_budget_is_a_value_error_naming_budget(budget):
    with pytest.raises(ValueError, match="budget"):
        A.parse_budget(budget, topk=8, depth=15)
    target, head = tiny_models(seed=0)
    with pytest.raises(ValueError, match="budget"):
        generate(target, head, [[1, 2]], max_new_tokens=2, budget=budget)


def test_bad_adaptive_arguments():
    target, head = tiny_models(seed=0)
    kw = dict(max_new_tokens=2, budget=[2, 4])
    with pytest.raises(ValueError, match="budget.*topn"):
        generate(target, head, [[1, 2]], algorithm="accum_logp", **kw)
    with pytest.raises(ValueError, match="cost_model has no cost for tree size 4"):
        generate(target, head, [[1, 2]], cost_model={2: 1.0}, **kw)
    with pytest.raises(ValueError, match="cost_model"):
        generate(target, head, [[1, 2]], cost_model={2: 1.0, 4: 0.0}, **kw)
    with pytest.raises(TypeError, match="calibrator"):
        generate(target, head, [[1, 2]], calibrator="depth", **kw)
    with pytest.raises(ValueError, match="calibrator"):
        generate(target, head, [[1, 2]], calibrator=A.AcceptanceCalibrator(device="meta"), **kw)
    with pytest.raises(ValueError, match="rounds"):
        measure_round_costs(target, head, [[1, 2]], [2, 4], rounds=0)
    for bad, name in ((dict(bins="width"), "bins"), (dict(max_depth=0), "max_depth"),
                      (dict(prior=0.0), "prior"), (dict(decay=0.0), "decay"), (dict(decay=1.5), "decay"),
                      (dict(bins="score", score_edges=[-1.0, -0.5]), "score_edges"),
                      (dict(bins="score", score_edges=[0.0]), "score_edges")):
        with pytest.raises(ValueError, match=name):
            A.AcceptanceCalibrator(**bad)


# ------------------------------------------------------------------------------------------------
# Decoding with an adaptive budget
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    from jetspec_kernels.models.assets import load_tiny
    target, heads = load_tiny()
    return target, heads["head_causal"]


TEXT = ["def area(self):\n    return self.", "import os\nimport sys\n\n\ndef main(",
        "    for i in range(len(items)):\n        if items[i] "]
# Rising like the CPU's verify cost: the draft's confidence moves the choice round to round.
COSTS = {4: 1.0, 8: 1.25, 16: 1.5, 32: 2.2, 64: 3.5}


@pytest.fixture(scope="module")
def trained_ar(trained):
    from jetspec_kernels.models.byte_tokenizer import encode
    prompts = [encode(p) for p in TEXT]
    prev = jk.get_backend()
    jk.set_backend("reference")
    out = generate_ar(trained[0], prompts, max_new_tokens=30).tokens
    jk.set_backend(prev)
    return prompts, out


@pytest.mark.parametrize("fused_draft", [True, False])
def test_auto_greedy_lossless(trained, trained_ar, fused_draft):
    target, head = trained
    prompts, ar = trained_ar
    out = generate(target, head, prompts, max_new_tokens=30, budget="auto", fused_draft=fused_draft,
                   cost_model=COSTS, calibrator=A.AcceptanceCalibrator(max_depth=15))
    assert out.tokens == ar
    s = out.stats
    assert len(s.budget_sizes) == s.rounds and set(s.budget_sizes) <= set(COSTS)
    assert len(set(s.budget_sizes)) >= 2, f"the choice never moved: {s.budget_sizes}"
    assert s.budget_costs == COSTS
    assert s.mean_accept > 1.5


@pytest.mark.parametrize("free_reads", [True, False])
def test_auto_lossless_paged_sync_every_and_random_heads(trained, trained_ar, monkeypatch, free_reads):
    """``free_reads`` False: the loop as on a GPU, where the done flags are read only with the
    chosen size, after the draft."""
    target, head = trained
    prompts, ar = trained_ar
    if not free_reads:
        monkeypatch.setattr(loop, "_FREE_READS", ())
    polls, drafts = [], []
    real_poll, real_draft = SpeculativeDecode.poll, SpeculativeDecode.draft_step
    monkeypatch.setattr(SpeculativeDecode, "poll", lambda self: polls.append(1) or real_poll(self))
    monkeypatch.setattr(SpeculativeDecode, "draft_step",
                        lambda self, c: drafts.append(c) or real_draft(self, c))
    out = generate(target, head, prompts, max_new_tokens=30, budget=[4, 8, 16], page_size=8,
                   sync_every=3, cost_model={4: 1.0, 8: 1.2, 16: 1.45})
    assert out.tokens == ar
    sizes = out.stats.budget_sizes
    # One read of the chosen size (with the done flags) per 3 rounds; where reads are free, the
    # done flags are also read before drafting, so no draft is wasted at the end.
    rounds = out.stats.rounds
    assert rounds % 3 == 0 and len(polls) == rounds // 3 + (not free_reads)
    assert drafts == [True, False, False] * (rounds // 3) + [True] * (not free_reads)
    assert all(len(set(sizes[i:i + 3])) == 1 for i in range(0, len(sizes), 3)), sizes
    # A random head accepts almost nothing: the smallest size wins, and the output is still exact.
    rt, rh = tiny_models(seed=0)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12]]
    want = generate_ar(rt, prompts, max_new_tokens=10).tokens
    got = generate(rt, rh, prompts, max_new_tokens=10, budget="auto", cost_model=lambda n: 1.0 + n / 8)
    assert got.tokens == want and set(got.stats.budget_sizes) == {4}


@pytest.mark.parametrize("controls", ["greedy", "sampled", "filtered"])
def test_single_candidate_builds_the_fixed_budget_tree(trained, trained_ar, controls):
    """budget=[16] runs the adaptive path (top-K, curve, choice, tree rebuilt from the top-K) with
    one candidate: the same trees as budget=16, node for node -- sampled tokens depend on node
    indices, so equal samples mean equal trees ("filtered": per-sequence temperature, one greedy
    row, top-k and top-p)."""
    target, head = trained
    prompts, _ = trained_ar
    sampling = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8),
                "filtered": dict(temperature=torch.tensor([0.9, 0.0, 0.6]), top_k=20, top_p=0.9)}
    kw = dict(max_new_tokens=20, seed=7, **sampling[controls])
    fixed = generate(target, head, prompts, budget=16, **kw)
    single = generate(target, head, prompts, budget=[16], cost_model={16: 1.0}, **kw)
    assert single.tokens == fixed.tokens
    assert single.stats.accept_lengths == fixed.stats.accept_lengths
    assert single.stats.budget_sizes == fixed.stats.budget_sizes == [16] * fixed.stats.rounds


class RecordingCalibrator(A.AcceptanceCalibrator):
    """Keeps every verified tree (the calibrator sees each round's tree and verdict)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.trees = []

    def update(self, tree, verdict, active=None):
        self.trees.append(tree)
        super().update(tree, verdict, active)


def test_each_round_verifies_the_chosen_size(trained, trained_ar):
    target, head = trained
    prompts, ar = trained_ar
    cal = RecordingCalibrator(max_depth=15)
    out = generate(target, head, prompts[:2], max_new_tokens=24, budget=[4, 16, 64],
                   cost_model={4: 1.0, 16: 1.5, 64: 3.0}, calibrator=cal)
    assert out.tokens == [t[:24] for t in ar[:2]]
    assert [t.capacity for t in cal.trees] == out.stats.budget_sizes
    assert float(cal.predicted.sum()) > 0 and float(cal.accepted.sum()) > 0


def test_auto_sampling_is_reproducible(trained, trained_ar):
    target, head = trained
    prompts, _ = trained_ar
    runs = [generate(target, head, prompts, max_new_tokens=20, budget="auto", temperature=0.7,
                     seed=3, cost_model=COSTS, calibrator=A.AcceptanceCalibrator(max_depth=15))
            for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.budget_sizes == runs[1].stats.budget_sizes


def test_auto_sampling_matches_target_distribution():
    """The chi-square check of tests/test_decode.py with an adaptive budget whose choice moves."""
    from test_decode import _chi2_pvalue, _next_probs, _sharp_tiny

    target, head = _sharp_tiny()
    v, temp, prompt, n = 7, 0.8, [1, 4, 2], 600
    probs1 = _next_probs(target, [prompt], temp)[0]
    probs2 = _next_probs(target, [prompt + [a] for a in range(v)], temp)
    probs3 = _next_probs(target, [prompt + [a, b] for a in range(v) for b in range(v)],
                         temp).view(v, v, v)
    joint = probs1[:, None, None] * probs2[:, :, None] * probs3
    out = generate(target, head, [prompt] * n, max_new_tokens=3, temperature=temp, seed=11,
                   topk=3, budget=[2, 4, 6], cost_model={2: 1.0, 4: 1.1, 6: 1.2},
                   calibrator=A.AcceptanceCalibrator(max_depth=3))
    assert sum(out.stats.accept_histogram[1:]) >= 10
    counts = torch.zeros(v, v, v, dtype=torch.float64)
    for t in out.tokens:
        counts[t[0], t[1], t[2]] += 1
    for c, p in ((counts.sum(2), joint.sum(2)), (counts.sum(0), joint.sum(0)),
                 (counts.sum((0, 1)), joint.sum((0, 1)))):
        assert _chi2_pvalue(c.flatten(), p.flatten()) > 1e-3


def test_default_cost_model_is_measured_once_and_kept(monkeypatch):
    target, head = tiny_models(seed=0)
    calls = []
    real = loop.measure_round_costs

    def counting(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(loop, "measure_round_costs", counting)
    prompts = [[1, 2, 3], [4, 5]]
    a = generate(target, head, prompts, max_new_tokens=6, budget=[2, 4])
    b = generate(target, head, prompts, max_new_tokens=6, budget=[2, 4])
    assert len(calls) == 1 and a.tokens == b.tokens
    assert a.stats.budget_costs == b.stats.budget_costs
    assert set(a.stats.budget_costs) == {2, 4} and min(a.stats.budget_costs.values()) > 0
    generate(target, head, prompts[:1], max_new_tokens=6, budget=[2, 4])     # another batch size
    assert len(calls) == 2
    # auto's pick for a fused layer op (rms_norm, silu_mul) is part of the configuration
    real_resolve = loop._backend.resolve
    monkeypatch.setattr(loop._backend, "resolve", lambda device, backend=None, fn=None: (
        "cuda" if fn == "silu_mul" else real_resolve(device, backend, fn)))
    generate(target, head, prompts[:1], max_new_tokens=6, budget=[2, 4])
    assert len(calls) == 3
    # the exact mode's rounds cost other times: their own measurement, per GEMM tile
    generate(target, head, prompts[:1], max_new_tokens=6, budget=[2, 4], exact=True)
    assert len(calls) == 4
    target.exact_gemm_tile = "wide"
    try:
        generate(target, head, prompts[:1], max_new_tokens=6, budget=[2, 4], exact=True)
    finally:
        del target.exact_gemm_tile
    assert len(calls) == 5
    kept = kept_for(target, head)[("calibrator", True)]     # (calibrator, greedy)
    assert float(kept.predicted.sum()) > 0          # the kept calibrator learned from the calls


def test_measure_round_costs():
    target, head = tiny_models(seed=0)
    cm = measure_round_costs(target, head, [[1, 2, 3]], [2, 4], rounds=2)
    assert set(cm.costs) == {2, 4} and 0 < cm(2) <= cm(4)
    # Cycles under very different loads (x1, x3, x9 and one burst on size 4 only): the ratios
    # between sizes survive, where a plain per-size median would not.
    base = torch.tensor([1.0, 1.2, 2.0], dtype=torch.float64)
    cycles = torch.stack([base, 3 * base, 9 * base, base * torch.tensor([5.0, 1.0, 1.0])])
    got = round_costs.cycle_costs(cycles)
    assert got == pytest.approx((base * got[1] / 1.2).tolist())
    pooled = [2, 2, 2, 13 / 3, 13 / 3, 13 / 3]
    assert round_costs.non_decreasing([3.0, 1.0, 2.0, 5.0, 4.0, 4.0]) == pytest.approx(pooled)
    assert round_costs.non_decreasing([1.0, 2.0]) == [1.0, 2.0]
    assert set(measure_round_costs(target, head, [[1, 2]], rounds=1).costs) == {4, 8, 16, 32, 64}


@pytest.mark.gpu
def test_cuda_graphs_adaptive_lossless():
    """On a GPU: graphed adaptive rounds (one verify graph per size) give the eager rounds' tokens
    and sizes, and the baseline's tokens (fp32)."""
    from jetspec_kernels.models.assets import load_tiny
    from jetspec_kernels.models.byte_tokenizer import encode
    jk.set_backend("auto")
    target, heads = load_tiny(device="cuda")
    head = heads["head_causal"]
    prompts = [encode(p) for p in TEXT]
    kw = dict(max_new_tokens=30, budget="auto", cost_model=COSTS)
    eager = generate(target, head, prompts, cuda_graphs=False,
                     calibrator=A.AcceptanceCalibrator(max_depth=15, device="cuda"), **kw)
    graphed = generate(target, head, prompts, cuda_graphs=True,
                       calibrator=A.AcceptanceCalibrator(max_depth=15, device="cuda"), **kw)
    assert graphed.stats.cuda_graphs and not eager.stats.cuda_graphs
    assert graphed.tokens == eager.tokens == generate_ar(target, prompts, max_new_tokens=30).tokens
    assert graphed.stats.budget_sizes == eager.stats.budget_sizes
    assert len(set(graphed.stats.budget_sizes)) >= 2
