"""causal_conv1d_commit: the state after a committed path equals transformers' causal conv update
run over the accepted tokens; slots not named stay as they were; the tree op from the committed
state continues as decoding would; named errors."""
import pytest
import torch

import jetspec_kernels as jk

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _tree(gen, b, n, c, w, s):
    par = torch.full((b, n), -1, dtype=torch.int32)
    for bi in range(b):
        for i in range(1, n):
            par[bi, i] = int(torch.randint(0, i, (1,), generator=gen))
    return (torch.randn(b, n, c, generator=gen), par, torch.randn(s, c, w - 1, generator=gen),
            torch.randn(c, w, generator=gen))


def _path_to(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


BACKENDS = ["reference", "triton"]     # triton under TRITON_INTERPRET=1 on the CPU (conftest)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [2, 4, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_commit_equals_decoding_the_accepted_tokens(width, dtype, backend):
    gen = torch.Generator().manual_seed(width)
    b, n, c, s = 3, 9, 5, 6
    x, par, state, weight = _tree(gen, b, n, c, width, s)
    x, state, weight = x.to(dtype), state.to(dtype), weight.to(dtype)
    slots = torch.tensor([5, 1, 3], dtype=torch.int32)
    ends = [8, 0, 5]                               # each sequence's last accepted node
    paths = [_path_to(par[bi], e) for bi, e in enumerate(ends)]
    cols = max(len(p) for p in paths) + 1
    path = torch.full((b, cols), -1, dtype=torch.int32)
    for bi, p in enumerate(paths):
        path[bi, :len(p)] = torch.tensor(p, dtype=torch.int32)
    accept = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int32)
    before = state.clone()
    jk.causal_conv1d_commit(x, path, accept, state, state_slots=slots, backend=backend)
    for bi, p in enumerate(paths):
        want = before[int(slots[bi])][None].clone()
        for node in p:
            hf.causal_conv1d_update(x[bi, node][None, :, None], want, weight, None, activation="silu")
        assert torch.equal(state[int(slots[bi])], want[0]), bi
    for other in set(range(s)) - set(slots.tolist()):
        assert torch.equal(state[other], before[other])
    # Decoding on: a one-node tree from the committed state is transformers' next update step.
    nxt = torch.randn(b, 1, c, generator=gen).to(dtype)
    root = torch.full((b, 1), -1, dtype=torch.int32)
    y = jk.causal_conv1d_tree(nxt, root, state, weight, state_slots=slots, backend=backend)
    for bi in range(b):
        step = hf.causal_conv1d_update(nxt[bi, 0][None, :, None].float(),
                                       state[int(slots[bi])][None].float().clone(),
                                       weight.float(), None, activation="silu")
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert torch.allclose(y[bi, 0].float(), step[0, :, 0], atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_accept_nothing_but_the_root_and_everything(backend):
    gen = torch.Generator().manual_seed(0)
    x, _, state, _ = _tree(gen, 1, 4, 3, 4, 1)
    chain = torch.arange(4, dtype=torch.int32)[None]
    s0 = state.clone()
    jk.causal_conv1d_commit(x, chain, torch.tensor([0], dtype=torch.int32), s0, backend=backend)
    assert torch.equal(s0[0], torch.cat([state[0, :, 1:], x[0, 0, :, None]], dim=1))
    s3 = state.clone()
    jk.causal_conv1d_commit(x, chain, torch.tensor([3], dtype=torch.int32), s3, backend=backend)
    assert torch.equal(s3[0], x[0, 1:].t())


@pytest.mark.parametrize("backend", BACKENDS)
def test_path_entries_past_accept_len_are_not_read(backend):
    """Junk past accept_len (past N or below -1) changes nothing: those entries are not read."""
    gen = torch.Generator().manual_seed(4)
    x, _, state, _ = _tree(gen, 2, 5, 3, 4, 2)
    clean = torch.tensor([[0, 2, -1, -1], [1, -1, -1, -1]], dtype=torch.int32)
    junk = torch.tensor([[0, 2, 9, -7], [1, 5, 2, 40]], dtype=torch.int32)
    accept = torch.tensor([1, 0], dtype=torch.int32)
    want, got = state.clone(), state.clone()
    jk.causal_conv1d_commit(x, clean, accept, want, backend=backend)
    jk.causal_conv1d_commit(x, junk, accept, got, backend=backend)
    assert torch.equal(got, want)


def _args(**over):
    a = dict(x=torch.zeros(2, 3, 4), path=torch.tensor([[0, 1], [0, -1]], dtype=torch.int32),
             accept_len=torch.tensor([1, 0], dtype=torch.int32), conv_state=torch.zeros(2, 4, 3))
    a.update(over)
    return a


@pytest.mark.parametrize("over, err, match", [
    (dict(path=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "path must have dtype"),
    (dict(path=torch.zeros(2, 0, dtype=torch.int32)), ValueError, "at least one column"),
    (dict(accept_len=torch.tensor([2, 0], dtype=torch.int32)), ValueError, "accept_len values"),
    (dict(path=torch.tensor([[0, 3], [0, -1]], dtype=torch.int32)), ValueError, "path entries"),
    (dict(path=torch.tensor([[0, -1], [0, -1]], dtype=torch.int32)), ValueError, "path entries"),
    (dict(conv_state=torch.zeros(2, 4, 3).transpose(1, 2).contiguous().transpose(1, 2)),
     ValueError, "contiguous"),
    (dict(conv_state=torch.zeros(3, 4, 3), state_slots=torch.tensor([2, 2], dtype=torch.int32)),
     ValueError, "distinct"),
    (dict(conv_state=torch.zeros(2, 4, 3, dtype=torch.float64)), TypeError, "conv_state must have dtype"),
])
def test_named_errors(over, err, match):
    with pytest.raises(err, match=match):
        jk.causal_conv1d_commit(**_args(**over), backend="reference")
