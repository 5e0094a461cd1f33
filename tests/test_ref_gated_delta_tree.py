"""python_ref.gated_delta_tree against transformers' Qwen3.5 recurrent gated delta rule: a chain
tree is the sequence (the same bits in float32), a branching tree is one sequence per
root-to-node path; the chunked (WY) form against the path walk in float64."""

import pytest
import torch

from jetspec_kernels import python_ref as R
from helpers import random_tree

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def hf_recurrent(q, k, v, g, beta, state):
    """transformers' decode-path function (torch fallback), as Qwen3.5's layer calls it."""
    return qwen3_5.torch_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True)


def inputs(B, N, H, Hv, Dk, Dv, gen, dtype=torch.float32, S=None):
    q = torch.randn(B, N, H, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, N, H, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, N, Hv, Dv, generator=gen, dtype=dtype)
    g = -torch.rand(B, N, Hv, generator=gen, dtype=dtype) * 2
    beta = torch.rand(B, N, Hv, generator=gen, dtype=dtype)
    state = torch.randn(B if S is None else S, Hv, Dk, Dv, generator=gen, dtype=dtype)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("H,Hv", [(1, 1), (2, 4)])
def test_chain_is_transformers_sequence_bit_for_bit(H, Hv):
    gen = torch.Generator().manual_seed(H * 10 + Hv)
    B, N, Dk, Dv = 2, 7, 8, 6
    q, k, v, g, beta, state = inputs(B, N, H, Hv, Dk, Dv, gen)
    parents = (torch.arange(N, dtype=torch.int32) - 1).expand(B, N).contiguous()
    want, final = hf_recurrent(q, k, v, g, beta, state)
    got = R.gated_delta_tree(q, k, v, g, beta, parents, state)
    assert torch.equal(got, want)
    pool = state.clone()
    path = torch.arange(N, dtype=torch.int32).expand(B, N).contiguous()
    R.gated_delta_commit(k, v, g, beta, path, torch.full((B,), N - 1, dtype=torch.int32), pool)
    assert torch.equal(pool, final)


def test_branching_tree_is_one_sequence_per_path():
    gen = torch.Generator().manual_seed(3)
    B, N, H, Hv, Dk, Dv = 3, 9, 2, 4, 8, 5
    q, k, v, g, beta, state = inputs(B, N, H, Hv, Dk, Dv, gen, S=5)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    parents, num_nodes = random_tree(B, N, gen, min_nodes=1)
    got = R.gated_delta_tree(q, k, v, g, beta, parents, state, state_slots=slots,
                             num_nodes=num_nodes)
    for b in range(B):
        for i in range(N):
            if i >= num_nodes[b]:
                assert (got[b, i] == 0).all()
                continue
            path = list(reversed(R.ancestors(parents[b], i)))
            sel = [x[b:b + 1, path] for x in (q, k, v, g, beta)]
            want, _ = hf_recurrent(*sel, state[slots[b]][None])
            assert torch.equal(got[b, i], want[0, -1])


@pytest.mark.parametrize("seed", range(4))
def test_chunked_form_is_the_path_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    B, N, H, Hv, Dk, Dv = 3, 12, 1, 2, 6, 4
    q, k, v, g, beta, state = inputs(B, N, H, Hv, Dk, Dv, gen, dtype=torch.float64, S=4)
    if seed == 1:
        g = g * 30                  # decay to ~0 within a few nodes
    if seed == 2:
        beta = torch.where(beta > 0.5, 1.0, 1e-3).to(beta)
    parents, num_nodes = random_tree(B, N, gen, min_nodes=0)
    slots = torch.randperm(4, generator=gen)[:B].to(torch.int32)
    # padding nodes' inputs are poison: they must not reach a valid row
    pad = torch.arange(N)[None, :] >= num_nodes[:, None]
    q, k, v = (x.masked_fill(pad[:, :, None, None], float("nan")) for x in (q, k, v))
    g, beta = (x.masked_fill(pad[:, :, None], float("nan")) for x in (g, beta))
    args = (q, k, v, g, beta, parents, state)
    kw = dict(state_slots=slots, num_nodes=num_nodes, scale=0.3)
    want = R.gated_delta_tree(*args, **kw)
    got = R.gated_delta_tree_chunked(*args, **kw)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_ancestor_mask_is_dense_mask_on_valid_rows():
    gen = torch.Generator().manual_seed(5)
    parents, num_nodes = random_tree(4, 40, gen, min_nodes=0)
    got = R.ancestor_mask(parents, num_nodes)
    dense = R.dense_mask(parents, num_nodes)
    valid = torch.arange(40)[None, :] < num_nodes[:, None]
    want = dense & valid[:, :, None] & valid[:, None, :]
    assert torch.equal(got, want)


def test_commit_moves_only_its_slots_and_stops_at_accept_len():
    gen = torch.Generator().manual_seed(7)
    B, N, H, Hv, Dk, Dv = 2, 6, 1, 2, 4, 3
    q, k, v, g, beta, state = inputs(B, N, H, Hv, Dk, Dv, gen, dtype=torch.float64, S=4)
    state[3] = float("nan")                         # an unused slot
    path = torch.tensor([[0, 2, 5, 1], [0, 3, 5, -1]], dtype=torch.int32)
    accept = torch.tensor([2, 1], dtype=torch.int32)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    v[1, 5] = float("nan")                          # on row 1's path only past accept_len
    pool = state.clone()
    R.gated_delta_commit(k, v, g, beta, path, accept, pool, state_slots=slots)
    for b in range(B):
        nodes = path[b, :accept[b] + 1].tolist()
        _, want = hf_recurrent(q[b:b + 1, nodes], k[b:b + 1, nodes], v[b:b + 1, nodes],
                               g[b:b + 1, nodes], beta[b:b + 1, nodes], state[slots[b]][None])
        torch.testing.assert_close(pool[slots[b]], want[0].double(), rtol=1e-5, atol=1e-5)
    assert torch.equal(pool[1], state[1]) and pool[3].isnan().all()
