"""The CUDA simulator's k-group association (tests/cuda_sim/mma_sim.h, ``kgroup_sum``).

Tensor cores need not sum the 16 products of a k16 step in k order, so a product's slot in its
group may change the bits even when only exact zeros move around it. The simulator's default
("pairwise") association makes that visible: a tree node whose own key sits one slot later in
the PV product's k-group than in the decode step (a masked sibling in between, an exact zero)
gets other bits than the decode step, on every attention kernel, while a node whose keys sit at
the decode step's slots gets the same bits. The former model ("sequential", in double) is shown
blind to the same shift, which is why it is no longer the default.
"""
import math

import pytest
import torch

from jetspec_kernels import python_ref as ref
from helpers import cu, use_sim

PREFIX = 4
PARENTS = [-1, 0, 0, 2]        # node 3's path: root (slot 4), node 2 (slot 6), itself (slot 7)
# The V rows of the tree's keys: node 3's decode step sums 2**15 - 2**15 + 2**-10 = 2**-10 in
# slots 4, 5, 6 (pairs (4, 5) and (6, 7)), the tree row 2**15 + (-2**15 + 2**-10) in slots 4, 6,
# 7, where the inner sum rounds to -2**15 in float32.
TREE_V = [2.0 ** 15, 1.0, -2.0 ** 15, 2.0 ** -10]
DH = 64
CAP = 64


def _path(i):
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out[::-1]


def _attend(q, v, prefix, mask, kernel):
    """The simulated kernel's output rows [N, DH] for q [1, N, 1, DH] over the cache v (the keys
    are all zero: every visible key scores 0, so softmax weights are exactly 1 and the row sum
    exactly the count, in any order)."""
    k = torch.zeros_like(v)
    n = q.shape[1]
    out = torch.full((1, n, 1, DH), float("nan"), dtype=q.dtype)
    cu().tree_attention(q, k, v, torch.tensor([prefix], dtype=torch.int32), mask, "mask" if mask is
                        not None else "causal", None, 1.0 / math.sqrt(DH), out, None,
                        num_splits=1, kernel=kernel)
    return out[0, :, 0]


def tree_and_decode_rows(kernel):
    """(tree rows, decode rows), float16 [N, DH] each: the tree launch, and per node the one-token
    decode step with its ancestors committed right after the prefix."""
    n = len(PARENTS)
    q = torch.zeros(1, n, 1, DH, dtype=torch.float16)
    v = torch.zeros(1, CAP, 1, DH, dtype=torch.float16)
    for i, val in enumerate(TREE_V):
        v[0, PREFIX + i] = val
    parents = torch.tensor([PARENTS], dtype=torch.int32)
    mask = ref.pack_mask(parents, torch.tensor([n], dtype=torch.int32)).to(torch.int32)
    tree = _attend(q, v, PREFIX, mask, kernel)
    decode = []
    for i in range(n):
        path = _path(i)
        vd = torch.zeros_like(v)
        for d, j in enumerate(path):
            vd[0, PREFIX + d] = v[0, PREFIX + j]
        decode.append(_attend(q[:, i:i + 1].clone(), vd, PREFIX + len(path) - 1, None, kernel)[0])
    return tree, torch.stack(decode)


def _same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "hopper"])
def test_a_key_moved_inside_its_k_group_is_caught(monkeypatch, kernel):
    use_sim(monkeypatch)
    monkeypatch.delenv("JETSPEC_SIM_KGROUP_SUM", raising=False)       # the default: pairwise
    tree, decode = tree_and_decode_rows(kernel)
    for i in (0, 1):              # keys at the decode step's slots: the same bits
        assert _same(tree[i], decode[i]), (kernel, i)
    assert not _same(tree[3], decode[3]), kernel
    want = torch.tensor(2.0 ** -10 / (PREFIX + 3)).half()
    assert torch.all(decode[3] == want) and torch.all(tree[3] == 0), (decode[3][0], tree[3][0])


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "hopper"])
def test_the_sequential_model_misses_the_move(monkeypatch, kernel):
    """The power of the default: summed in k order in double, the same move changes no bit."""
    use_sim(monkeypatch)
    monkeypatch.setenv("JETSPEC_SIM_KGROUP_SUM", "sequential")
    tree, decode = tree_and_decode_rows(kernel)
    assert _same(tree, decode), kernel

