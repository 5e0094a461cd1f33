"""The exact walk's plan (models/walk_plan.py): a depth-first order in which every step starts
from its parent's state (the committed one, the previous step's, or a kept slot still holding
the parent's), only branch points kept, slots bounded by the tree's branching depth; named errors
for a wrong depth bound; no host read. Checked by walking the plan symbolically (a state is the
node it belongs to) over trees the draft builder makes and random forests."""
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import root_path
from jetspec_kernels import checks
from jetspec_kernels.models.walk_plan import chain_plan, tree_plan


def _forest(r, n, shape):
    return [-1] + [{"chain": i - 1, "star": 0, "random": r.randrange(-1, i),
                    "deep": max(i - 1 - r.randrange(2), -1), "binary": (i - 1) // 2}[shape]
                   for i in range(1, n)]


def _simulate(plan, parents, count, b=0):
    """Walk sequence ``b``'s plan symbolically and check every step's source; returns (stores,
    kept loads, the highest slot used)."""
    order, src, dst = (t[b].tolist() for t in (plan.order, plan.src, plan.dst))
    n = len(order)
    assert sorted(order[:count]) == list(range(count))
    assert order[count:] == list(range(count, n))             # padding after, in place
    walked, regs, slots = set(), None, {}
    stores = loads = 0
    top = -1
    for i in range(count):
        node = order[i]
        p = parents[node]
        assert p < 0 or p in walked, (i, node, p)
        if src[i] == -1:
            assert p < 0
        elif src[i] == -2:
            assert p >= 0 and regs == p, (i, node, p, regs)
        else:
            assert 0 <= src[i] < plan.num_slots and slots.get(src[i]) == p, (i, node, src[i], slots)
            loads += 1
        walked.add(node)
        regs = node
        if dst[i] >= 0:
            assert dst[i] < plan.num_slots
            slots[dst[i]] = node
            stores += 1
            top = max(top, dst[i])
    return stores, loads, top


def _check_tree(parents, count, plan, b=0):
    stores, loads, top = _simulate(plan, parents, count, b)
    kids = [sum(1 for j in range(count) if parents[j] == i) for i in range(count)]
    internal = sum(1 for c in kids if c)
    roots = sum(1 for j in range(count) if parents[j] < 0)
    assert stores == sum(1 for c in kids if c >= 2)           # only branch points kept
    assert loads == count - roots - internal                  # every child but a first one
    # slots: as many as the most branch points on one root path (tight), <= the depth
    on_path = [sum(1 for a in root_path(parents, i)[:-1] if kids[a] >= 2) for i in range(count)]
    assert top + 1 == max(on_path, default=0)
    assert top + 1 <= max((len(root_path(parents, i)) - 1 for i in range(count)), default=0)


@pytest.mark.parametrize("shape", ["chain", "star", "random", "deep", "binary"])
def test_a_random_forest_is_walked_from_its_parents_states(shape):
    r = random.Random(shape)
    for _ in range(30):
        b, n = r.randint(1, 4), r.randint(1, 40)
        rows = [_forest(r, n, shape) for _ in range(b)]
        counts = [r.randint(0, n) for _ in range(b)]
        for s in range(b):                        # padding that does not look like a forest
            rows[s][counts[s]:] = [r.choice((-1, 0, n + 5, -7)) for _ in range(n - counts[s])]
        parents = torch.tensor(rows, dtype=torch.int32)
        plan = tree_plan(parents, torch.tensor(counts, dtype=torch.int32))
        assert plan.num_slots == (n - 1) // 2
        for s in range(b):
            _check_tree(rows[s], counts[s], plan, s)
            # a sequence's plan is its own: the same alone (N its count) as in the batch
            alone = tree_plan(parents[s:s + 1, :counts[s]], torch.tensor([counts[s]]))
            for got, want in zip(alone[:3], plan[:3]):
                assert torch.equal(got[0], want[s, :counts[s]])


def test_draft_trees_keep_few_states():
    """Trees as the round builds them (breadth-first, children by rank): depth first, with
    ``max_depth`` as the bound, the scratch is the depth's, not N's."""
    from jetspec_kernels.python_ref import build_tree
    gen = torch.Generator().manual_seed(0)
    b, depth, k, budget = 3, 6, 4, 48
    logp = torch.log_softmax(torch.randn(b, depth, k, generator=gen) * 3, dim=-1)
    tokens = torch.randint(0, 100, (b, depth, k), generator=gen, dtype=torch.int32)
    tree = build_tree(tokens, logp.sort(dim=-1, descending=True).values,
                      torch.zeros(b, dtype=torch.int32), budget)
    assert int(tree["depths"].max()) == depth
    plan = tree_plan(tree["parents"], tree["num_nodes"], depth)
    assert plan.num_slots == depth
    # a bound past (N - 1) // 2 (JetSpec's depth 15 at budget 16) gives N's
    assert tree_plan(tree["parents"][:, :16], tree["num_nodes"].clamp(max=16), 15).num_slots == 7
    for s in range(b):
        _check_tree(tree["parents"][s].tolist(), int(tree["num_nodes"][s]), plan, s)


def test_chain_plan_walks_in_index_order():
    plan = chain_plan(2, 5, "cpu")
    for s in range(2):
        assert _simulate(plan, [-1, 0, 1, 2, 3], 5, s) == (0, 0, -1)
    assert plan.num_slots == 0
    # a decode step's one-node trees: the chain's plan, whatever the padding parent says
    one = tree_plan(torch.tensor([[-1], [5]], dtype=torch.int32), torch.tensor([1, 0]), 0)
    for got, want in zip(one, chain_plan(2, 1, "cpu")):
        assert got == want if isinstance(got, int) else torch.equal(got, want)


def test_a_wrong_depth_bound_is_named():
    # branch points at depths 0, 1, 2
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3, 3]], dtype=torch.int32)
    counts = torch.tensor([7], dtype=torch.int32)
    assert tree_plan(parents, counts, max_depth=3).num_slots == 3
    with pytest.raises(ValueError, match="max_depth 2"):
        tree_plan(parents, counts, max_depth=2)
    with pytest.raises(ValueError, match="max_depth"):
        tree_plan(parents, counts, max_depth=-1)
    with pytest.raises(TypeError, match="max_depth"):
        tree_plan(parents, counts, max_depth=2.0)
    # padding nodes past the count do not count (their parents are not read); no counts: all N
    assert tree_plan(parents, torch.tensor([3], dtype=torch.int32), max_depth=1).num_slots == 1
    for got, want in zip(tree_plan(parents, None, 3), tree_plan(parents, counts, 3)):
        assert got == want if isinstance(got, int) else torch.equal(got, want)


class _HostReads(TorchDispatchMode):
    """Records the ops that would copy a device value to the host."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("_local_scalar_dense", "nonzero", "is_nonzero", "item"):
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_plan_reads_nothing_on_the_host():
    """Without value checks (a GPU's default) building a plan reads no tensor value (so it
    runs inside a captured graph); the CPU's value check is the one read."""
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 5]], dtype=torch.int32)
    counts = torch.tensor([7], dtype=torch.int32)
    checks.set_value_checks("never")
    try:
        with _HostReads() as mode:
            tree_plan(parents, counts, max_depth=4)
            chain_plan(1, 7, "cpu")
    finally:
        checks.set_value_checks("cpu")
    assert mode.seen == []
    with _HostReads() as mode:
        tree_plan(parents, counts, max_depth=4)
    assert mode.seen                              # the power: the value check is seen
    # tensors with no values at all: any read (.tolist(), .cpu(), int()) raises
    checks.set_value_checks("never")
    try:
        plan = tree_plan(parents.to("meta"), counts.to("meta"), max_depth=4)
        chain_plan(1, 7, "meta")
    finally:
        checks.set_value_checks("cpu")
    assert plan.order.device.type == "meta" and plan.num_slots == 3
