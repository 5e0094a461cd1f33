"""The hybrid targets' exact-mode kernels (triton/exact_gated_delta.py): the Gated DeltaNet walk
(a tree node stepped from its parent's state, one kernel for trees, prompts and commits), the
per-token prep (conv, q/k normalisation, gates) and the row ops (zero-centred RMSNorm, the
gated output norm, sigmoid gates). Their values against the float64 spec and torch's formulas;
their bits: a node's output the same whatever tree, batch, padding or slot surrounds it, a tree
node the same as its path walked as a chain, a token's prep and a row's norm the same alone as
in any launch. Under the interpreter in float32; on a GPU (``backend`` is a parameter, so the
device check's triton step runs them) in bf16 too."""
import pytest
import torch
import torch.nn.functional as F

from jetspec_kernels import python_ref as ref
from jetspec_kernels.python_ref.gated_delta_tree import l2norm

triton = pytest.importorskip("triton")
from jetspec_kernels.triton import exact_gated_delta as eg  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])
TRITON = pytest.mark.parametrize("backend", ["triton"])

H, HV, DK, DV = 2, 4, 8, 24          # Dv not a multiple of the walk's value tile's power of two


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _operands(b, n, dtype, seed=0, dk=DK, dv=DV):
    """Random step operands in the walk's layouts (q, k unit, q scaled; gates in range)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(b, n, H, dk, generator=gen)) * dk ** -0.5
    k = l2norm(torch.randn(b, n, H, dk, generator=gen))
    v = torch.randn(b, n, HV, dv, generator=gen).to(dtype)
    g = -torch.rand(b, n, HV, generator=gen) * 2
    beta = torch.rand(b, n, HV, generator=gen)
    return [t.to(DEV) for t in (q, k, v, g, beta)]


def _pool(slots, dk=DK, dv=DV, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(slots, HV, dk, dv, generator=gen).to(DEV) * 0.3


def _walk_tree(ops, parents, counts, pool, slots):
    return eg.walk(*ops, parents, counts, pool, slots, out=True, keep=True, store_last=False)


def _path(parents, node):
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8, 0, 11]


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_walk_matches_the_float64_walk(dtype, backend):
    """Every node's output is the recurrence along its ancestor path (python_ref's float64 walk),
    padding nodes 0, the pool untouched."""
    n = len(PARENTS)
    parents = torch.tensor([PARENTS, [-1, 0, 1, 2] + [-1] * (n - 4)], dtype=torch.int32, device=DEV)
    counts = torch.tensor([n, 4], dtype=torch.int32, device=DEV)
    q, k, v, g, beta = _operands(2, n, dtype)
    pool = _pool(5)
    before = pool.clone()
    slots = torch.tensor([3, 1], dtype=torch.int32, device=DEV)
    got = _walk_tree((q, k, v, g, beta), parents, counts, pool, slots)
    want = ref.gated_delta_tree(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                parents, pool.double(), state_slots=slots, num_nodes=counts,
                                scale=1.0, use_qk_l2norm=False)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.double(), want, atol=tol, rtol=tol)
    assert torch.equal(got[1, 4:], torch.zeros_like(got[1, 4:]))
    assert torch.equal(pool, before)


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_tree_node_is_its_path_walked_as_a_chain(dtype, backend):
    """Node i's output in the tree == the last output of its path's operands walked as a chain
    alone (B 1, N = depth + 1): the bits a one-token-at-a-time decode gives. And the state a
    chain stores (a prompt, a commit) is the state the tree walk computed for its last node: the
    chain's next step from the stored state gives the tree child's bits."""
    n = len(PARENTS)
    parents = torch.tensor([PARENTS], dtype=torch.int32, device=DEV)
    ops = _operands(1, n, dtype, seed=2)
    pool = _pool(2)
    slot = torch.tensor([1], dtype=torch.int32, device=DEV)
    tree = _walk_tree(ops, parents, torch.tensor([n], dtype=torch.int32, device=DEV), pool, slot)
    for node in range(n):
        path = _path(PARENTS, node)
        chain_ops = [t[:, path] for t in ops]
        chain = torch.tensor([[i - 1 for i in range(len(path))]], dtype=torch.int32, device=DEV)
        count = torch.tensor([len(path)], dtype=torch.int32, device=DEV)
        alone = eg.walk(*chain_ops, chain, count, pool.clone(), slot, out=True, keep=False,
                        store_last=False)
        assert torch.equal(_bits(alone[0, -1]), _bits(tree[0, node])), node
    # commit the path to node 6 (0 1 3 6), then step node 9 (6's child) from the stored state
    stored = pool.clone()
    path = _path(PARENTS, 6)
    eg.walk(*[t[:, path] for t in ops], torch.tensor([[-1, 0, 1, 2]], dtype=torch.int32, device=DEV),
            torch.tensor([4], dtype=torch.int32, device=DEV), stored, slot, out=False, keep=False,
            store_last=True)
    assert torch.equal(stored[0], pool[0])               # only the slot is written
    nxt = eg.walk(*[t[:, [9]] for t in ops], torch.tensor([[-1]], dtype=torch.int32, device=DEV),
                  torch.tensor([1], dtype=torch.int32, device=DEV), stored, slot, out=True,
                  keep=False, store_last=False)
    assert torch.equal(_bits(nxt[0, 0]), _bits(tree[0, 9]))


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_walk_rows_do_not_depend_on_the_batch_padding_or_slot(dtype, backend):
    """A sequence's outputs are the same bits alone (N = its own size, slot 0) as inside a batch
    of three (N padded to the largest, another slot, neighbours of other sizes), and NaN in the
    padding nodes' operands stays out."""
    n = len(PARENTS)
    ops = _operands(3, n + 3, dtype, seed=3)
    for t in ops:
        t[0, n:] = float("nan")              # padding of sequence 0
    parents = torch.tensor([PARENTS + [-1] * 3, [-1] + list(range(n + 2)),
                            [-1, 0, 0] + [-1] * n], dtype=torch.int32, device=DEV)
    counts = torch.tensor([n, n + 3, 3], dtype=torch.int32, device=DEV)
    pool = _pool(6, seed=4)
    slots = torch.tensor([5, 0, 2], dtype=torch.int32, device=DEV)
    batch = _walk_tree(ops, parents, counts, pool, slots)
    alone_pool = pool[5:6].clone()
    alone = _walk_tree([t[:1, :n] for t in ops], parents[:1, :n], counts[:1], alone_pool,
                       torch.zeros(1, dtype=torch.int32, device=DEV))
    assert torch.equal(_bits(alone[0]), _bits(batch[0, :n]))
    assert not batch[0].isnan().any()


def _windows(t, width, c, dtype, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(t, width, c, generator=gen) * 2).to(dtype).to(DEV)


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prep_is_the_layer_formulas_and_row_invariant(dtype, backend):
    """The prep's q, k, v, g, beta against transformers' formulas (conv, silu, rounded to the
    model dtype, l2norm, q scaled; softplus gate; sigmoid beta rounded), and a token's bits the
    same alone as among 7."""
    width, c, t = 4, 2 * H * DK + HV * DV, 7
    gen = torch.Generator().manual_seed(6)
    win = _windows(t, width, c, dtype)
    weight = (torch.randn(c, width, generator=gen) * 0.5).to(dtype).to(DEV)
    a = (torch.randn(t, HV, generator=gen) * 8).to(dtype).to(DEV)      # past softplus' threshold too
    b = torch.randn(t, HV, generator=gen).to(dtype).to(DEV)
    a_log = torch.log(1 + 7 * torch.rand(HV, generator=gen)).to(dtype).to(DEV)
    dt_bias = torch.randn(HV, generator=gen).to(dtype).to(DEV)
    scale = DK ** -0.5
    q, k, v, g, beta = eg.prep(win, weight, a, b, a_log, dt_bias, H, DK, DV, scale)
    conv = F.silu((win.float() * weight.float().t()).sum(1)).to(dtype).float()
    qs, ks, vs = conv.split([H * DK, H * DK, HV * DV], dim=-1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert torch.allclose(q, l2norm(qs.view(t, H, DK)) * scale, **tol)
    assert torch.allclose(k, l2norm(ks.view(t, H, DK)), **tol)
    assert torch.allclose(v.float(), vs.view(t, HV, DV), **tol)
    assert torch.allclose(g, -a_log.float().exp() * F.softplus(a.float() + dt_bias.float()), **tol)
    assert torch.allclose(beta, torch.sigmoid(b.float()).to(dtype).float(), **tol)
    for i in (0, 3, 6):
        one = eg.prep(win[i:i + 1], weight, a[i:i + 1], b[i:i + 1], a_log, dt_bias, H, DK, DV, scale)
        for x, y in zip(one, (q, k, v, g, beta)):
            assert torch.equal(_bits(x[0]), _bits(y[i])), i


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_ops_are_the_formulas_and_row_invariant(dtype, backend):
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(9, 40, generator=gen) * 30).to(dtype).to(DEV)      # magnitudes far from 1
    w = (torch.randn(40, generator=gen) * 0.1).to(dtype).to(DEV)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w.float())).to(dtype)
    got = eg.zc_norm_rows(x, w, 1e-6)
    assert torch.allclose(got.float(), want.float(), **tol)
    o = torch.randn(9, 40, generator=gen).to(DEV) * 5
    z = torch.randn(9, 40, generator=gen).to(dtype).to(DEV)
    of = o.to(dtype).float()
    normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    want_gated = ((w * normed) * F.silu(z.float())).to(dtype)
    gated = eg.gated_norm_rows(o, z, w, 1e-6)
    assert torch.allclose(gated.float(), want_gated.float(), **tol)
    gate_each, gate_row = (torch.randn(9, 40, generator=gen).to(dtype).to(DEV),
                           torch.randn(9, 1, generator=gen).to(dtype).to(DEV))
    base = torch.randn(9, 40, generator=gen).to(dtype).to(DEV)
    each = eg.sigmoid_gate(x, gate_each)
    per_row = eg.sigmoid_gate(x, gate_row, base)
    assert torch.allclose(each.float(), (x * torch.sigmoid(gate_each)).float(), **tol)
    assert torch.allclose(per_row.float(), (base + x * torch.sigmoid(gate_row)).float(), **tol)
    for i in (0, 4, 8):
        r = slice(i, i + 1)
        assert torch.equal(_bits(eg.zc_norm_rows(x[r], w, 1e-6)), _bits(got[r]))
        assert torch.equal(_bits(eg.gated_norm_rows(o[r], z[r], w, 1e-6)), _bits(gated[r]))
        assert torch.equal(_bits(eg.sigmoid_gate(x[r], gate_each[r])), _bits(each[r]))
        assert torch.equal(_bits(eg.sigmoid_gate(x[r], gate_row[r], base[r])), _bits(per_row[r]))


@TRITON
def test_empty_launches(backend):
    ops = _operands(0, 3, torch.float32)
    none = torch.zeros(0, 3, dtype=torch.int32, device=DEV)
    out = eg.walk(*ops, none, torch.zeros(0, dtype=torch.int32, device=DEV), _pool(1),
                  torch.zeros(0, dtype=torch.int32, device=DEV), out=True, keep=True, store_last=False)
    assert out.shape == (0, 3, HV, DV)
    assert eg.zc_norm_rows(torch.zeros(0, 8, device=DEV), torch.zeros(8, device=DEV), 1e-6).shape == (0, 8)
    assert eg.sigmoid_gate(torch.zeros(0, 8, device=DEV), torch.zeros(0, 1, device=DEV)).shape == (0, 8)
