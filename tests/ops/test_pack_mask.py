"""pack_mask against python_ref.pack_mask on every backend: random trees with ragged node counts,
full chains (bit 31 and every word of a row set), several mask words."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from helpers import backends, cu, on, poisoned_empty, random_tree, sync


def triton_backend():
    import jetspec_kernels.triton as t
    return t


def pack_mask_on(backend, parents, num_nodes):
    """``backend``'s pack_mask of int32 parents [B, N] and num_nodes [B] -> mask on the CPU
    (triton through the public op; the cuda kernels through their wrapper)."""
    p, n = on(parents, backend.device), num_nodes.to(backend.device)   # on(): strides kept
    with poisoned_empty():
        if backend.name == "triton":    # the backend function: num_nodes 0 is the ops' refusal
            got = triton_backend().pack_mask(p, n)
        else:
            got = cu().pack_mask(p, n)
    sync(backend.device)
    return got.cpu()


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("b,n", [(1, 1), (3, 31), (2, 32), (3, 33), (2, 100), (3, 37), (2, 64),
                                 (1, 70)])
def test_pack_mask(backend, b, n):
    """Random trees, ragged node counts (padding rows keep only their own bit), a full chain
    (bit 31 and every word of a row set), several mask words."""
    gen = torch.Generator().manual_seed(b * 1000 + n)
    parents, num_nodes = random_tree(b, n, gen)
    parents[0, 1:] = torch.arange(n - 1, dtype=torch.int32)  # a chain: every bit of a row set
    num_nodes[0] = n
    want = ref.pack_mask(parents, num_nodes).to(torch.int32)
    got = pack_mask_on(backend, parents, num_nodes)
    assert got.dtype == torch.int32
    assert torch.equal(got, want)


@backends("triton", "sim", "cuda")
def test_pack_mask_deep_chain_sets_bit_31(backend):
    parents = (torch.arange(64, dtype=torch.int32) - 1).reshape(1, 64)
    num = torch.tensor([64], dtype=torch.int32)
    got = pack_mask_on(backend, parents, num)
    assert torch.equal(got, ref.pack_mask(parents, num))
    assert got[0, 63, 0] == -1 and got[0, 63, 1] == -1  # all 32 bits set: two's complement


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("b,n", [(3, 9), (2, 33), (2, 70)])
def test_padding_rows_that_look_like_real_nodes(backend, b, n):
    """Padding rows (i >= num_nodes) whose parents are real-looking indices, not -1 (the contract
    leaves them unspecified): their mask row is still their own bit only, and the row at exactly
    num_nodes is padding too. Trees of every size, a tree with no node (num_nodes 0), and parents
    sliced from a wider buffer (the engine layout)."""
    gen = torch.Generator().manual_seed(b * 100 + n)
    parents, num_nodes = random_tree(b, n, gen, min_nodes=1, pad=False)   # junk past num_nodes
    num_nodes[0] = 1
    num_nodes[-1] = 0
    parents[-1, 1:] = torch.arange(n - 1, dtype=torch.int32)             # a chain, all padding
    parents[0, 1:] = 0                                                    # a fan past the root
    want = ref.pack_mask(parents, num_nodes).to(torch.int32)
    for bb in range(b):                                   # padding rows: own bit only
        for i in range(int(num_nodes[bb]), n):
            assert want[bb, i].tolist() == ref.pack_mask(torch.full((1, n), -1, dtype=torch.int32),
                                                         torch.zeros(1, dtype=torch.int32))[0, i].tolist()
    assert torch.equal(pack_mask_on(backend, parents, num_nodes), want)
    wide = torch.full((b, n + 5), 3, dtype=torch.int32)
    wide[:, :n] = parents
    assert torch.equal(pack_mask_on(backend, wide[:, :n], num_nodes), want)


@backends("reference", "triton", "sim", "cuda")
def test_pack_mask_refuses_a_tree_without_its_root(backend):
    """num_nodes 0 is refused naming num_nodes, as verify_tree refuses it: one rule for trees."""
    parents = torch.tensor([[-1, 0, 1], [-1, 0, 0]], dtype=torch.int32).to(backend.device)
    name = "cuda" if backend.name == "sim" else backend.name
    jk.pack_mask(parents, torch.tensor([3, 1], dtype=torch.int32).to(backend.device), backend=name)
    with pytest.raises(ValueError, match=r"^num_nodes values must be in \[1, 3\]"):
        jk.pack_mask(parents, torch.tensor([3, 0], dtype=torch.int32).to(backend.device),
                     backend=name)
