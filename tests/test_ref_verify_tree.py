"""python_ref sampling and verify_tree: Python-int hash, hand-built trees, an independent
acceptance characterisation, and the Gumbel sampler's empirical distribution."""

import math

import numpy as np
import pytest
import torch

from jetspec_kernels import python_ref as R

M = 0xFFFFFFFF


def py_mix32(x):
    x &= M
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    x ^= x >> 16
    return x


def py_uniform(seed, offset, b, i, v):
    h = py_mix32(seed & M)
    h = py_mix32(h ^ (offset & M))
    h = py_mix32(h ^ b)
    h = py_mix32(h ^ i)
    h = py_mix32(h ^ v)
    u = np.float32(((h >> 8) + 0.5) / 2 ** 24)
    return min(u, np.float32(1.0 - 2.0 ** -24))


def test_mix32_matches_python_ints():
    g = torch.Generator().manual_seed(0)
    xs = [0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, M] + \
        torch.randint(0, 2 ** 32, (200,), generator=g, dtype=torch.int64).tolist()
    got = R.mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [py_mix32(x) for x in xs]
    assert py_mix32(1) != 1 and py_mix32(0) == 0   # sanity of the transcription


def test_gumbel_uniform_matches_python_ints():
    seed = torch.tensor([0, 12345, -1, 2 ** 40 + 7], dtype=torch.int64)   # masked to low 32 bits
    offset = torch.tensor([3, 0, 2 ** 33 + 1, -5], dtype=torch.int64)
    B, N, V = 4, 3, 11
    u = R.gumbel_uniform(seed, offset, N, V)
    assert u.dtype == torch.float32 and u.shape == (B, N, V)
    assert (u > 0).all() and (u < 1).all()
    for b in range(B):
        for i in range(N):
            for v in range(V):
                assert u[b, i, v].item() == float(py_uniform(int(seed[b]), int(offset[b]), b, i, v))
    # the seed really is reduced mod 2**32
    u2 = R.gumbel_uniform(seed & M, offset & M, N, V)
    assert torch.equal(u, u2)


def test_greedy_ties_to_lower_index():
    logits = torch.tensor([[[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, 0.0, 0.0]]])
    assert R.sample_tokens(logits, 0.0).tolist() == [[1, 0, 2]]
    assert R.sample_tokens(logits, 0.0).dtype == torch.int32


def test_sampling_formula():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 9, generator=g)
    seed = torch.tensor([5, 6], dtype=torch.int64)
    off = torch.tensor([0, 100], dtype=torch.int64)
    T = 0.7
    got = R.sample_tokens(logits, T, seed, off)
    for b in range(2):
        for i in range(3):
            sc = [logits[b, i, v].item() / T - math.log(-math.log(float(py_uniform(int(seed[b]), int(off[b]), b, i, v))))
                  for v in range(9)]
            assert int(got[b, i]) == max(range(9), key=lambda v: (sc[v], -v))
    # deterministic; a different offset gives different draws
    assert torch.equal(got, R.sample_tokens(logits, T, seed, off))
    big = torch.zeros(4, 64, 50)
    s4 = torch.arange(4, dtype=torch.int64)
    a = R.sample_tokens(big, 1.0, s4, torch.zeros(4, dtype=torch.int64))
    c = R.sample_tokens(big, 1.0, s4, torch.ones(4, dtype=torch.int64))
    assert not torch.equal(a, c)
    with pytest.raises(ValueError):
        R.sample_tokens(logits, 1.0)


def test_uniform_clamp_below_one():
    """Seed 39114, offset 0, b 0, node 0, v 7 hashes to h >> 8 == 2**24 - 1: the exact uniform
    1 - 2**-25 rounds to 1.0 in float32, so only the clamp keeps u = 1 - 2**-24 and the noise
    finite; with an infinite Gumbel, v 7 would beat token 3's lead of 30."""
    h = py_mix32(py_mix32(py_mix32(py_mix32(py_mix32(39114) ^ 0) ^ 0) ^ 0) ^ 7)
    assert h >> 8 == 2 ** 24 - 1 and np.float32(1.0 - 2.0 ** -25) == 1.0
    seed, off = torch.tensor([39114], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)
    u = R.gumbel_uniform(seed, off, 1, 8)
    assert u[0, 0, 7].item() == 1.0 - 2.0 ** -24
    assert torch.isfinite(-torch.log(-torch.log(u))).all()
    logits = torch.zeros(1, 1, 8)
    logits[0, 0, 3] = 30.0
    for x in (logits, logits.double()):
        assert R.sample_tokens(x, 1.0, seed, off).tolist() == [[3]]


@pytest.mark.parametrize("T", [0.6, 1.0, 2.5])
def test_gumbel_sampler_distribution(T):
    """Empirical frequencies over 12000 (b, i) draws match softmax(logits / T)."""
    logits = torch.tensor([1.0, 0.0, -0.7, 2.0, 0.3])
    V = logits.numel()
    B, N = 60, 200
    x = logits.expand(B, N, V).contiguous()
    seed = torch.arange(1000, 1000 + B, dtype=torch.int64)
    off = torch.full((B,), 17, dtype=torch.int64)
    s = R.sample_tokens(x, T, seed, off)
    counts = torch.bincount(s.flatten().long(), minlength=V).double()
    n = B * N
    p = torch.softmax(logits.double() / T, 0)
    chi2 = (((counts - n * p) ** 2) / (n * p)).sum().item()
    # df = 4: P(chi2 > 30) ~ 5e-6; the draws are deterministic
    assert chi2 < 30, (chi2, counts.tolist(), (n * p).tolist())


# ----------------------------------------------------------------------------- verify_tree
def verify(tokens, parents, num_nodes, max_depth, target, temperature=0.0):
    """python_ref.verify_tree on given target tokens (temperature > 0: the tokens are samples,
    the sampled rows' first-sibling rule)."""
    return R.verify_tree(torch.tensor(tokens, dtype=torch.int32), torch.tensor(parents, dtype=torch.int32),
                         torch.tensor(num_nodes, dtype=torch.int32), max_depth,
                         target_tokens=torch.tensor(target, dtype=torch.int32),
                         temperature=temperature)


def test_verify_hand_built():
    #        0(10)
    #   1(5)   2(7)   3(5)        node 3 duplicates node 1's token: the lower index (1) wins
    #   4(8)   6(3)   5(9)
    tokens = [[10, 5, 7, 5, 8, 9, 3, 0], [10, 5, 7, 5, 8, 9, 3, 0]]
    parents = [[-1, 0, 0, 0, 1, 3, 2, -1], [-1, 0, 0, 0, 1, 3, 2, -1]]
    #          targets per node: t[0]=5 -> node 1; t[1]=8 -> node 4; t[4]=11 -> stop
    target0 = [5, 8, 0, 9, 11, 0, 0, 0]     # t[3]=9 would accept node 5 if node 3 were chosen
    target1 = [6, 8, 0, 9, 11, 0, 0, 0]     # root mismatch
    v = verify(tokens, parents, [7, 7], 3, [target0, target1])
    assert v["accept_len"].tolist() == [2, 0]
    assert v["path"].tolist() == [[0, 1, 4, -1], [0, -1, -1, -1]]
    assert v["bonus"].tolist() == [11, 6]
    assert v["emitted"].tolist() == [[5, 8, 11, -1], [6, -1, -1, -1]]
    for k in v:
        assert v[k].dtype == torch.int32


def test_verify_ignores_rows_past_num_nodes():
    tokens = [[10, 4, 5, 7]]
    parents = [[-1, 0, 0, 0]]        # row 3 is garbage beyond num_nodes = 3
    v = verify(tokens, parents, [3], 2, [[7, 1, 1, 1]])
    assert v["accept_len"].tolist() == [0] and v["bonus"].tolist() == [7]
    v = verify(tokens, parents, [4], 2, [[7, 1, 1, 1]])
    assert v["accept_len"].tolist() == [1] and v["path"].tolist() == [[0, 3, -1]]


@pytest.mark.parametrize("target", ["tokens", "greedy", "sampled"])
def test_verify_empty_row_verifies_root(target):
    """num_nodes 0 (only reachable with value checks off): the root is still verified, so the
    row acts as a one-node tree: accept_len 0, path [0, -1, ...], bonus = target at node 0."""
    tokens = torch.tensor([[4, 1, 2], [4, 1, 2]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0], [-1, 0, 0]], dtype=torch.int32)
    num_nodes = torch.tensor([0, 3], dtype=torch.int32)
    logits = torch.full((2, 3, 6), -1.0)
    logits[:, 0, 1] = 40.0      # the root's target is 1 (greedy, and sampled at T = 0.5)
    seed, off = torch.tensor([5, 6]), torch.tensor([0, 0])
    if target == "tokens":
        kw = dict(target_tokens=torch.tensor([[1, 0, 0], [1, 0, 0]], dtype=torch.int32))
    else:
        kw = dict(target_logits=logits, temperature=0.5 if target == "sampled" else 0.0,
                  seed=seed, offset=off)
    v = R.verify_tree(tokens, parents, num_nodes, 2, **kw)
    assert v["accept_len"].tolist() == [0, 1]
    assert v["path"].tolist() == [[0, -1, -1], [0, 1, -1]]
    assert v["bonus"][0].item() == 1
    assert v["emitted"][0].tolist() == [1, -1, -1]


def test_verify_full_chain_accepted():
    tokens = [[1, 2, 3, 4]]
    parents = [[-1, 0, 1, 2]]
    v = verify(tokens, parents, [4], 3, [[2, 3, 4, 99]])
    assert v["accept_len"].tolist() == [3]
    assert v["path"].tolist() == [[0, 1, 2, 3]]
    assert v["emitted"].tolist() == [[2, 3, 4, 99]]
    assert v["bonus"].tolist() == [99]


def test_verify_greedy_from_logits():
    tokens = [[0, 2, 1, 3]]
    parents = [[-1, 0, 0, 1]]
    logits = torch.full((1, 4, 5), -1.0)
    logits[0, 0, 1] = logits[0, 0, 2] = 4.0     # tie -> token 1 -> node 2 (not node 1)
    logits[0, 2, 4] = 3.0
    v = R.verify_tree(torch.tensor(tokens, dtype=torch.int32), torch.tensor(parents, dtype=torch.int32),
                      torch.tensor([4], dtype=torch.int32), 2, target_logits=logits)
    assert v["path"].tolist() == [[0, 2, -1]]
    assert v["emitted"].tolist() == [[1, 4, -1]]


def independent_accept(tokens, parents, n, target, first_sibling=True):
    """The accepted leaf is the deepest node whose every path edge is 'good' (ties to the lower
    index): the child's token equals the target token of its parent and (the sampled rows'
    first-sibling rule) no lower-index sibling has that token."""
    def good(c):
        p = parents[c]
        if tokens[c] != target[p]:
            return False
        return not first_sibling or not any(parents[s] == p and tokens[s] == tokens[c]
                                            for s in range(c))

    best = [0]
    for c in range(1, n):
        path = [c]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path = path[::-1]
        if all(good(x) for x in path[1:]) and len(path) > len(best):
            best = path
    return best


@pytest.mark.parametrize("rule", ["greedy", "sampled"])
def test_verify_random_trees_vs_independent(rule):
    """Trees over 3 tokens (same-token siblings everywhere): greedy rows accept the longest
    agreeing path, sampled rows follow the first agreeing sibling, each against brute force."""
    gen = torch.Generator().manual_seed(3)
    B, N = 40, 12
    for trial in range(3):
        tree_rows, parent_rows, nums, targets = [], [], [], []
        for b in range(B):
            n = int(torch.randint(1, N + 1, (1,), generator=gen))
            par = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)] + [-1] * (N - n)
            tok = torch.randint(0, 3, (N,), generator=gen).tolist()
            tree_rows.append(tok)
            parent_rows.append(par)
            nums.append(n)
            targets.append(torch.randint(0, 3, (N,), generator=gen).tolist())
        max_depth = N - 1
        temperature = torch.full((B,), 0.0 if rule == "greedy" else 0.7)
        v = verify(tree_rows, parent_rows, nums, max_depth, targets, temperature)
        for b in range(B):
            path = independent_accept(tree_rows[b], parent_rows[b], nums[b], targets[b],
                                      first_sibling=rule == "sampled")
            a = len(path) - 1
            assert int(v["accept_len"][b]) == a
            assert v["path"][b].tolist() == path + [-1] * (max_depth - a)
            bonus = targets[b][path[-1]]
            assert int(v["bonus"][b]) == bonus
            assert v["emitted"][b].tolist() == [tree_rows[b][c] for c in path[1:]] + [bonus] + [-1] * (max_depth - a)


def test_verify_sampling_uses_sample_tokens():
    g = torch.Generator().manual_seed(4)
    t = R.draft_tree(torch.randn(3, 3, 6, generator=g), torch.tensor([0, 1, 2], dtype=torch.int32), 10, 2)
    logits = torch.randn(3, 10, 6, generator=g)
    seed = torch.tensor([1, 2, 3], dtype=torch.int64)
    off = torch.tensor([9, 9, 9], dtype=torch.int64)
    v1 = R.verify_tree(t["tokens"], t["parents"], t["num_nodes"], 3, target_logits=logits,
                       temperature=0.9, seed=seed, offset=off)
    sampled = R.sample_tokens(logits, 0.9, seed, off)
    v2 = R.verify_tree(t["tokens"], t["parents"], t["num_nodes"], 3, target_tokens=sampled,
                       temperature=0.9)
    for k in v1:
        assert torch.equal(v1[k], v2[k])


def test_verify_greedy_takes_the_longest_of_same_token_siblings():
    """Node 1 and node 2 both carry token 5 (merged drafts): greedy follows node 2, whose
    subtree agrees two levels deeper; the sampled rule keeps the first sibling (node 1)."""
    #        0
    #   1(5)      2(5)
    #   3(6)      4(6)
    #             5(7)
    tokens = [[1, 5, 5, 6, 6, 7]]
    parents = [[-1, 0, 0, 1, 2, 4]]
    target = [[5, 6, 6, 0, 7, 8]]
    v = verify(tokens, parents, [6], 4, target)
    assert v["path"].tolist() == [[0, 2, 4, 5, -1]] and v["accept_len"].tolist() == [3]
    assert v["emitted"].tolist() == [[5, 6, 7, 8, -1]] and v["bonus"].tolist() == [8]
    v = verify(tokens, parents, [6], 4, target, temperature=1.0)
    assert v["path"].tolist() == [[0, 1, 3, -1, -1]] and v["bonus"].tolist() == [0]
    v = verify(tokens, parents, [6], 1, target)      # max_depth 1: equal lengths, lower index
    assert v["path"].tolist() == [[0, 1]]
