"""causal_conv1d_tree: chains equal transformers' causal conv update run token by token; branching
trees equal a per-node window walk; padding nodes, state slots, dtypes, widths; named errors and
the limits (at and one past each)."""
import pytest
import torch
import torch.nn.functional as F

import jetspec_kernels as jk
from jetspec_kernels.limits import MAX_BUDGET
from jetspec_kernels.ops.causal_conv1d_tree import MAX_CONV_WIDTH

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def random_parents(gen, b, n, num_nodes):
    """Random trees: node i's parent uniform in [0, i) (root -1); padding -1."""
    par = torch.full((b, n), -1, dtype=torch.int32)
    for bi in range(b):
        for i in range(1, int(num_nodes[bi])):
            par[bi, i] = int(torch.randint(0, i, (1,), generator=gen))
    return par


def walk(x, parents, conv_state, weight, slots, num_nodes, activation="silu"):
    """Each node's window gathered by walking up its parents, in float64."""
    b, n, c = x.shape
    w = weight.shape[1]
    y = torch.zeros(b, n, c, dtype=torch.float64)
    for bi in range(b):
        s = int(slots[bi])
        for i in range(int(num_nodes[bi])):
            win, node = [], i
            while node >= 0 and len(win) < w:
                win.append(x[bi, node].double())
                node = int(parents[bi, node])
            col = w - 2
            while len(win) < w:
                win.append(conv_state[s, :, col].double())
                col -= 1
            out = sum(weight[:, j].double() * win[w - 1 - j] for j in range(w))
            y[bi, i] = F.silu(out) if activation == "silu" else out
    return y


BACKENDS = ["reference", "triton"]     # triton under TRITON_INTERPRET=1 on the CPU (conftest)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [2, 4, MAX_CONV_WIDTH])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_branching_trees_match_the_walk(width, dtype, backend):
    gen = torch.Generator().manual_seed(width)
    b, n, c, s = 3, 11, 5, 5
    num_nodes = torch.tensor([11, 4, 1], dtype=torch.int32)
    parents = random_parents(gen, b, n, num_nodes)
    x = torch.randn(b, n, c, generator=gen).to(dtype)
    x[1, 4:] = float("nan")                          # padding nodes that do not look like data
    state = torch.randn(s, c, width - 1, generator=gen).to(dtype)
    weight = torch.randn(c, width, generator=gen).to(dtype)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    y = jk.causal_conv1d_tree(x, parents, state, weight, state_slots=slots, num_nodes=num_nodes,
                              backend=backend)
    assert y.dtype == dtype and y.shape == (b, n, c)
    want = walk(x, parents, state, weight, slots, num_nodes)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(y.double(), want, atol=tol, rtol=tol)
    assert bool((y[1, 4:] == 0).all()) and bool(torch.isfinite(y).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_matches_transformers_update_step_by_step(backend):
    """A chain tree from a slot's state gives what transformers' causal_conv1d_update gives
    decoding the chain one token at a time (fp32 and float64 spec)."""
    gen = torch.Generator().manual_seed(1)
    b, n, c, w = 2, 7, 6, 4
    x = torch.randn(b, n, c, generator=gen)
    state = torch.randn(b, c, w - 1, generator=gen)
    weight = torch.randn(c, w, generator=gen)
    bias = torch.randn(c, generator=gen)
    chain = (torch.arange(n, dtype=torch.int32) - 1).expand(b, n).contiguous()
    y = jk.causal_conv1d_tree(x, chain, state, weight, bias, backend=backend)
    hf_state = state.clone()
    for i in range(n):
        step = hf.causal_conv1d_update(x[:, i, :, None], hf_state, weight, bias, activation="silu")
        assert torch.allclose(y[:, i], step[..., 0], atol=1e-6, rtol=1e-6), i
    from jetspec_kernels.python_ref.causal_conv1d_tree import causal_conv1d_tree as spec
    y64 = spec(x.double(), chain, state.double(), weight.double(), bias.double())
    assert y64.dtype == torch.float64 and torch.allclose(y64, y.double(), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS + [None])
def test_no_activation_and_every_backend(backend):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 4, generator=gen)
    state = torch.randn(1, 4, 3, generator=gen)
    weight = torch.randn(4, 4, generator=gen)
    par = torch.tensor([[-1, 0, 0]], dtype=torch.int32)
    y = jk.causal_conv1d_tree(x, par, state, weight, activation=None, backend=backend)
    want = walk(x, par, state, weight, [0], [3], activation=None)
    assert torch.allclose(y.double(), want, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_parents_are_not_read(backend):
    """Padding nodes' parents may hold any node index, forward ones too (as gated_delta_tree,
    which takes the same tree, allows): they are not read and the valid rows do not change."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 3, generator=gen)
    state = torch.randn(2, 3, 3, generator=gen)
    weight = torch.randn(3, 4, generator=gen)
    clean = torch.tensor([[-1, 0, -1, -1], [-1, 0, 1, -1]], dtype=torch.int32)
    looks_real = torch.tensor([[-1, 0, 3, 2], [-1, 0, 1, 3]], dtype=torch.int32)
    num_nodes = torch.tensor([2, 3], dtype=torch.int32)
    want = jk.causal_conv1d_tree(x, clean, state, weight, num_nodes=num_nodes, backend=backend)
    got = jk.causal_conv1d_tree(x, looks_real, state, weight, num_nodes=num_nodes, backend=backend)
    assert torch.equal(got, want)


def _args(**over):
    gen = torch.Generator().manual_seed(3)
    a = dict(x=torch.randn(2, 3, 4, generator=gen),
             parents=torch.tensor([[-1, 0, 1], [-1, 0, 0]], dtype=torch.int32),
             conv_state=torch.zeros(2, 4, 3), weight=torch.randn(4, 4, generator=gen))
    a.update(over)
    return a


@pytest.mark.parametrize("over, err, match", [
    (dict(x=torch.zeros(2, 3)), ValueError, "x must have 3 dimensions"),
    (dict(x=torch.zeros(2, 3, 4, dtype=torch.int32)), TypeError, "x must have dtype"),
    (dict(parents=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "parents must have dtype"),
    (dict(parents=torch.tensor([[-1, 0, 2], [-1, 0, 0]], dtype=torch.int32)), ValueError,
     "earlier node"),
    (dict(parents=torch.tensor([[-1, 0, 3], [-1, 0, 0]], dtype=torch.int32)), ValueError,
     "parents values"),
    (dict(conv_state=torch.zeros(2, 5, 3)), ValueError, "conv_state must have shape"),
    (dict(conv_state=torch.zeros(2, 4, 3, dtype=torch.bfloat16)), TypeError, "conv_state must have dtype"),
    (dict(conv_state=torch.zeros(3, 4, 3)), ValueError, "one state per sequence"),
    (dict(conv_state=torch.zeros(2, 4, MAX_CONV_WIDTH), weight=torch.zeros(4, MAX_CONV_WIDTH + 1)),
     ValueError, "conv width"),
    (dict(conv_state=torch.zeros(2, 4, 0), weight=torch.zeros(4, 1)), ValueError, "conv width"),
    (dict(weight=torch.zeros(4, 3)), ValueError, "weight must have shape"),
    (dict(bias=torch.zeros(5)), ValueError, "bias must have shape"),
    (dict(num_nodes=torch.tensor([4, 1], dtype=torch.int32)), ValueError, "num_nodes values"),
    (dict(conv_state=torch.zeros(3, 4, 3), state_slots=torch.tensor([0, 3], dtype=torch.int32)),
     ValueError, "state_slots values"),
    (dict(conv_state=torch.zeros(3, 4, 3), state_slots=torch.tensor([1, 1], dtype=torch.int32)),
     ValueError, "distinct"),
    (dict(activation="relu"), ValueError, "activation"),
])
def test_named_errors(over, err, match):
    with pytest.raises(err, match=match):
        jk.causal_conv1d_tree(**_args(**over), backend="reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_limits_at_and_past(backend):
    par = torch.full((1, MAX_BUDGET), -1, dtype=torch.int32)
    y = jk.causal_conv1d_tree(torch.ones(1, MAX_BUDGET, 1), par, torch.zeros(1, 1, 3),
                              torch.ones(1, 4), activation=None, backend=backend)
    assert bool((y == 1).all())
    with pytest.raises(ValueError, match="1 to 4096 tree nodes"):
        jk.causal_conv1d_tree(torch.ones(1, MAX_BUDGET + 1, 1),
                              torch.full((1, MAX_BUDGET + 1), -1, dtype=torch.int32),
                              torch.zeros(1, 1, 3), torch.ones(1, 4), backend="reference")
    w = MAX_CONV_WIDTH
    y = jk.causal_conv1d_tree(torch.ones(1, 1, 2), torch.full((1, 1), -1, dtype=torch.int32),
                              torch.ones(1, 2, w - 1), torch.ones(2, w), activation=None,
                              backend=backend)
    assert bool((y == w).all())


def test_cuda_has_no_kernel_and_says_so():
    """No cuda kernel (backend.OPTIONAL_FUNCTIONS): asking for it names the function."""
    from jetspec_kernels import backend as bk
    with pytest.raises(jk.BackendUnavailableError, match="has no causal_conv1d_tree"):
        bk.kernel("cuda", "causal_conv1d_tree")


@pytest.mark.parametrize("module", ["causal_conv1d_tree", "causal_conv1d_commit"])
def test_the_op_module_imports_first(module):
    """A fresh interpreter imports the op's module before the package's public names (a module
    importing its sibling must not make the package load them all halfway through)."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", f"import jetspec_kernels.ops.{module}"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
