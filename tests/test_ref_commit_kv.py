"""python_ref.commit_kv: compaction against a copy-from-original brute force, contiguous and paged,
including overlapping moves, accept_len 0 and accept_len = max."""

import pytest
import torch

from jetspec_kernels import python_ref as R
from helpers import shuffled_table

B, N, Hkv, Dh = 4, 6, 2, 3
MAXD = 3                       # path has MAXD + 1 columns
PREFIX = [0, 4, 2, 5]
PATHS = [
    [0, 2, 5, -1],             # gaps
    [0, -1, -1, -1],           # accept_len 0
    [0, 1, 2, 3],              # accept_len = max, identity moves
    [0, 1, 3, 4],              # overlapping: slot 3 is a source (i=2) before it is a destination (i=3)
]
ACCEPT = [2, 0, 3, 3]
PAGE = 4


def logical_view(cache, bt, b, L):
    if bt is None:
        return cache[b, :L].clone()
    return torch.stack([cache[bt[b, p // PAGE], p % PAGE] for p in range(L)])


def setup(paged, gen):
    L = max(PREFIX) + N + 2
    logical_k = torch.randn(B, L, Hkv, Dh, generator=gen, dtype=torch.float64)
    logical_v = torch.randn(B, L, Hkv, Dh, generator=gen, dtype=torch.float64)
    if not paged:
        return logical_k.clone(), logical_v.clone(), None, logical_k, logical_v, L
    max_pages = (L + PAGE - 1) // PAGE
    num_pages = B * max_pages + 2
    bt = shuffled_table(B, max_pages, gen, spare=2)
    kc = torch.full((num_pages, PAGE, Hkv, Dh), -7.0, dtype=torch.float64)
    vc = kc.clone()
    for b in range(B):
        for p in range(L):
            kc[bt[b, p // PAGE], p % PAGE] = logical_k[b, p]
            vc[bt[b, p // PAGE], p % PAGE] = logical_v[b, p]
    return kc, vc, bt, logical_k, logical_v, L


@pytest.mark.parametrize("paged", [False, True])
def test_commit_kv_moves(paged):
    gen = torch.Generator().manual_seed(int(paged))
    kc, vc, bt, lk, lv, L = setup(paged, gen)
    pages_before = kc.clone()
    hidden = torch.randn(B, N, 5, generator=gen)
    new_len, rows = R.commit_kv(kc, vc, torch.tensor(PREFIX, dtype=torch.int32),
                                torch.tensor(PATHS, dtype=torch.int32),
                                torch.tensor(ACCEPT, dtype=torch.int32), bt, hidden)
    assert new_len.dtype == torch.int32
    assert new_len.tolist() == [p + a + 1 for p, a in zip(PREFIX, ACCEPT)]
    for b in range(B):
        exp_k, exp_v = lk[b].clone(), lv[b].clone()
        for i in range(ACCEPT[b] + 1):        # copy from the ORIGINAL contents
            exp_k[PREFIX[b] + i] = lk[b, PREFIX[b] + PATHS[b][i]]
            exp_v[PREFIX[b] + i] = lv[b, PREFIX[b] + PATHS[b][i]]
        assert torch.equal(logical_view(kc, bt, b, L), exp_k), b
        assert torch.equal(logical_view(vc, bt, b, L), exp_v), b
    if paged:   # pages not in any block table are untouched
        used = set(bt.flatten().tolist())
        for pg in range(kc.shape[0]):
            if pg not in used:
                assert torch.equal(kc[pg], pages_before[pg])
    # hidden rows: gathered along the path, zero after accept_len
    assert rows.shape == (B, MAXD + 1, 5) and rows.dtype == hidden.dtype
    for b in range(B):
        for i in range(MAXD + 1):
            if i <= ACCEPT[b]:
                assert torch.equal(rows[b, i], hidden[b, PATHS[b][i]])
            else:
                assert (rows[b, i] == 0).all()


def test_commit_kv_overlap_order_matters():
    # A single sequence where processing in decreasing i would read an already-overwritten slot.
    kc = torch.arange(8, dtype=torch.float64).view(1, 8, 1, 1).clone()
    vc = kc.clone() * 10
    new_len, rows = R.commit_kv(kc, vc, torch.tensor([1], dtype=torch.int32),
                                torch.tensor([[0, 1, 3, 4]], dtype=torch.int32),
                                torch.tensor([3], dtype=torch.int32))
    # positions 1+0..1+3 <- 1+[0,1,3,4] = [1,2,4,5]
    assert kc.flatten().tolist() == [0, 1, 2, 4, 5, 5, 6, 7]
    assert vc.flatten().tolist() == [0, 10, 20, 40, 50, 50, 60, 70]
    assert new_len.tolist() == [5] and rows is None
