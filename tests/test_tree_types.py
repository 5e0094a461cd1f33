"""Tree converters (dense, FlashInfer, SGLang), pretty-printing and Tree.positions."""
import numpy as np
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref


def _trees(seed=0, b=3, d=4, v=40, budget=23, k=3, algorithm="topn"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, d, v, generator=g) * 3
    roots = torch.randint(0, v, (b,), generator=g, dtype=torch.int32)
    return jk.draft_tree(logits, roots, budget=budget, topk=k, algorithm=algorithm, backend="reference")


def _ancestor_sets(tree):
    """Brute force: {j : j is i or an ancestor of i} per (b, i), from parents."""
    out = []
    for b in range(tree.batch_size):
        par = tree.parents[b].tolist()
        n = int(tree.num_nodes[b])
        rows = []
        for i in range(tree.capacity):
            s = {i}
            j = i
            while i < n and par[j] >= 0:
                j = par[j]
                s.add(j)
            rows.append(s)
        out.append(rows)
    return out


@pytest.mark.parametrize("budget", [1, 23, 40])
def test_dense_mask_is_the_ancestor_relation(budget):
    tree = _trees(budget=budget)
    dense = tree.dense_mask()
    sets = _ancestor_sets(tree)
    for b in range(tree.batch_size):
        for i in range(tree.capacity):
            assert set(torch.nonzero(dense[b, i]).flatten().tolist()) == sets[b][i]
    assert torch.equal(dense, ref.dense_mask(tree.parents, tree.num_nodes))


def test_flashinfer_mask_matches_numpy_packbits():
    tree = _trees(budget=13)
    prefix = torch.tensor([0, 5, 11], dtype=torch.int32)
    packed, indptr = tree.to_flashinfer_mask(prefix)
    dense = tree.dense_mask().numpy()
    n = tree.capacity
    start = 0
    assert indptr[0] == 0
    for b, plen in enumerate(prefix.tolist()):
        full = np.concatenate([np.ones((n, plen), bool), dense[b]], axis=1)
        want = np.packbits(full.reshape(-1), bitorder="little")
        seg = packed[indptr[b]:indptr[b + 1]].numpy()
        assert seg.dtype == np.uint8 and np.array_equal(seg, want), b
        start += len(want)
    assert int(indptr[-1]) == start == packed.numel()


@pytest.mark.parametrize("kw", [dict(budget=17, algorithm="accum_logp"), dict(d=1, k=2, budget=9)],
                         ids=["full", "smaller_than_capacity"])
def test_sglang_arrays_match_brute_force(kw):
    """A full tree, and one of 3 nodes in a capacity of 9: the row at exactly num_nodes is padding."""
    tree = _trees(**kw)
    index, nxt, sib = tree.to_sglang()
    assert index.dtype == nxt.dtype == sib.dtype == torch.int64
    n = tree.capacity
    for b in range(tree.batch_size):
        par = tree.parents[b].tolist()
        m = int(tree.num_nodes[b])
        for i in range(n):
            if i >= m:
                assert index[b, i] == nxt[b, i] == sib[b, i] == -1
                continue
            kids = [c for c in range(m) if par[c] == i]
            later = [c for c in range(i + 1, m) if par[c] == par[i] and par[i] >= 0]
            assert index[b, i] == b * n + i
            assert nxt[b, i] == (kids[0] if kids else -1)
            assert sib[b, i] == (later[0] if later else -1)


@pytest.mark.parametrize("budget,dtype", [(7, torch.uint8), (16, torch.int16), (29, torch.int32)])
def test_sglang_bitpacked_rows(budget, dtype):
    tree = _trees(budget=budget, d=5, k=4)
    rows = tree.to_sglang_bitpacked()
    assert rows.dtype == dtype and rows.shape == (tree.batch_size * budget,)
    dense = tree.dense_mask().reshape(-1, budget)
    for r in range(rows.shape[0]):
        word = int(rows[r]) & ((1 << 32) - 1)
        assert [(word >> j) & 1 == 1 for j in range(budget)] == dense[r].tolist()


def test_sglang_bitpacked_refuses_large_trees():
    with pytest.raises(ValueError, match="capacity <= 32"):
        _trees(budget=40).to_sglang_bitpacked()


def test_pretty_shows_every_node_once():
    tree = _trees(budget=23)
    text = tree.pretty(1, decode=lambda t: f"<{t}>")
    n = int(tree.num_nodes[1])
    for i in range(n):
        assert text.count(f"[{i}] tok {int(tree.tokens[1, i])} '<") == 1
    assert text.splitlines()[0].startswith(f"tree 1: {n} nodes")
    assert len(tree.pretty().splitlines()) == sum(int(x) + 1 for x in tree.num_nodes)


def test_positions():
    tree = _trees(budget=9)
    prefix = torch.tensor([3, 0, 100], dtype=torch.int32)
    pos = tree.positions(prefix)
    assert pos.dtype == torch.int32
    want = prefix[:, None] + tree.depths.clamp_min(0)
    assert torch.equal(pos, want)
    # Padding rows (depth -1) sit at the prefix, as the root does, never before it (a prefix of 0
    # would give position -1): d 1, k 2 has 3 nodes in a capacity of 9.
    small = _trees(d=1, k=2, budget=9)
    assert small.num_nodes.tolist() == [3, 3, 3]
    pos = small.positions(prefix)
    assert torch.equal(pos[:, 3:], prefix[:, None].expand(3, 6))
    assert pos[:, :3].tolist() == [[p, p + 1, p + 1] for p in prefix.tolist()]
    # The largest prefix whose positions fit in int32 (the deepest of 9 rows sits at most 8 past
    # it) is taken; one more is refused.
    top = 2**31 - 1 - (small.capacity - 1)
    pos = small.positions(torch.full((3,), top, dtype=torch.int64))
    assert int(pos.max()) == top + 1 and pos.dtype == torch.int32
    with pytest.raises(ValueError, match="prefix_lens"):
        small.positions(torch.full((3,), top + 1, dtype=torch.int64))
