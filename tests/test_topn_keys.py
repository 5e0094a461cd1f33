"""The Triton tree builder's integer keys (docs/DESIGN.md 4a): each encode/decode pair round-trips
its fields at their limits, and a key orders candidates as the spec's tie rule does."""
import pytest
import torch
import triton
import triton.language as tl

import importlib

T = importlib.import_module("jetspec_kernels.triton.build_tree")


@triton.jit
def _keys_kernel(score_ptr, depth_ptr, pos_ptr, rank_ptr, key_ptr, qd_ptr, qd_of_key_ptr,
                 hs_ptr, hslot_ptr, hdepth_ptr, nd_ptr, nr_ptr, nc_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < n
    score = tl.load(score_ptr + i, mask=ok, other=0.0)
    depth = tl.load(depth_ptr + i, mask=ok, other=0)
    pos = tl.load(pos_ptr + i, mask=ok, other=0)
    rank = tl.load(rank_ptr + i, mask=ok, other=0)
    key = T._topn_key(score, depth, pos, rank)
    tl.store(key_ptr + i, key, mask=ok)
    tl.store(qd_ptr + i, T._q_depth_key(score, depth), mask=ok)
    tl.store(qd_of_key_ptr + i, T._topn_key_q_depth(key), mask=ok)
    hs, hslot, hdepth = T._heap_key_unpack(T._heap_key(score, pos, depth))
    tl.store(hs_ptr + i, hs, mask=ok)
    tl.store(hslot_ptr + i, hslot, mask=ok)
    tl.store(hdepth_ptr + i, hdepth, mask=ok)
    nd, nr, nc = T._node_unpack(T._node_pack(depth, rank, pos))
    tl.store(nd_ptr + i, nd, mask=ok)
    tl.store(nr_ptr + i, nr, mask=ok)
    tl.store(nc_ptr + i, nc, mask=ok)


def _run(score, depth, pos, rank):
    n = score.numel()
    i64 = [torch.empty(n, dtype=torch.int64) for _ in range(3)]
    hs = torch.empty(n)
    i32 = [torch.empty(n, dtype=torch.int32) for _ in range(5)]
    _keys_kernel[(1,)](score, depth, pos, rank, *i64, hs, *i32, n,
                       BLOCK=triton.next_power_of_2(n))
    key, qd, qd_of_key = i64
    return key, qd, qd_of_key, hs, *i32


@pytest.fixture
def fields():
    g = torch.Generator().manual_seed(3)
    n = 300
    # scores <= 0 with deliberate ties; -0.0 never occurs (the root is +0.0)
    score = -torch.randint(0, 6, (n,), generator=g).float() * 0.25
    score[:3] = torch.tensor([0.0, -3.0e38, -1.0e-38])
    # few distinct depths and positions, so that every lower field decides some comparisons
    depth = torch.randint(0, 3, (n,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, 3, (n,), generator=g, dtype=torch.int32)
    rank = torch.randint(0, 64, (n,), generator=g, dtype=torch.int32)
    depth[:4], pos[:4], rank[:4] = 4095, 4095, 63
    depth[4:6], pos[4:6], rank[4:6] = 0, 0, 0
    return score, depth, pos, rank


def test_topn_key_orders_as_the_spec(fields):
    """Smaller key <=> higher score, then shallower, then lower parent position, then lower rank."""
    score, depth, pos, rank = fields
    key = _run(score, depth, pos, rank)[0]
    spec = sorted(range(len(key)), key=lambda i: (-score[i].item(), depth[i].item(), pos[i].item(),
                                                 rank[i].item()))
    got = sorted(range(len(key)), key=lambda i: (key[i].item(), i))
    spec_keys = [(-score[i].item(), depth[i].item(), pos[i].item(), rank[i].item()) for i in spec]
    got_keys = [(-score[i].item(), depth[i].item(), pos[i].item(), rank[i].item()) for i in got]
    assert got_keys == spec_keys
    assert (key >= 0).all()  # never collides with the "empty" key 2**63 - 1 or goes negative


def test_q_depth_part_matches_the_bound_key(fields):
    score, depth, pos, rank = fields
    _, qd, qd_of_key, *_ = _run(score, depth, pos, rank)
    assert torch.equal(qd, qd_of_key)


def test_heap_key_and_node_word_round_trip(fields):
    score, depth, pos, rank = fields
    _, _, _, hs, hslot, hdepth, nd, nr, nc = _run(score, depth, pos, rank)
    assert torch.equal(hs, score) and torch.equal(hslot, pos) and torch.equal(hdepth, depth)
    assert torch.equal(nd, depth) and torch.equal(nr, rank) and torch.equal(nc, pos)
