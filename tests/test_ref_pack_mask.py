"""python_ref pack_mask, dense_mask, unpack_mask and ancestors against hand-checked words and
brute-force ancestor walks."""

import torch

from jetspec_kernels import python_ref as R
from helpers import ancestor_set, mask_bit


def random_parents(n, N, gen):
    p = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return p + [-1] * (N - n)


def test_pack_mask_bit31_and_multiword():
    N = 70
    chain = [-1] + list(range(N - 1))                 # node i's parent is i-1
    parents = torch.tensor([chain, [-1] * N], dtype=torch.int32)
    num_nodes = torch.tensor([N, 1], dtype=torch.int32)
    m = R.pack_mask(parents, num_nodes)
    assert m.shape == (2, N, 3) and m.dtype == torch.int32
    assert m[0, 31].tolist() == [-1, 0, 0]            # bits 0..31 set -> int32 -1
    assert m[0, 30].tolist() == [0x7FFFFFFF, 0, 0]
    assert m[0, 40].tolist() == [-1, 511, 0]
    assert m[0, 69].tolist() == [-1, -1, 63]
    # padding rows of sequence 1: only their own bit (row 31's own bit is the sign bit)
    assert m[1, 31].tolist() == [-(2 ** 31), 0, 0]
    assert m[1, 33].tolist() == [0, 2, 0]
    assert m[1, 0].tolist() == [1, 0, 0]


def test_pack_mask_random_trees():
    gen = torch.Generator().manual_seed(11)
    N = 45
    nums = [45, 30, 1]
    parents = torch.tensor([random_parents(n, N, gen) for n in nums], dtype=torch.int32)
    num_nodes = torch.tensor(nums, dtype=torch.int32)
    m = R.pack_mask(parents, num_nodes)
    dense = R.dense_mask(parents, num_nodes)
    assert torch.equal(R.unpack_mask(m), dense)
    for b, n in enumerate(nums):
        par = parents[b].tolist()
        for i in range(N):
            anc = ancestor_set(par, i) if i < n else {i}
            assert {j for j in range(N) if mask_bit(m, b, i, j)} == anc
            assert set(R.ancestors(parents[b], i)) == (anc if i < n else ancestor_set(par, i))
