"""The hybrid targets' exact-mode kernels (triton/exact_gated_delta.py): the Gated DeltaNet walk
(a tree node stepped from its parent's state, one kernel for trees, prompts and commits), the
per-token prep (conv, q/k normalisation, gates) and the row ops (zero-centred RMSNorm, the
gated output norm, sigmoid gates). Their values against the float64 spec and torch's formulas;
their bits: a node's output the same whatever tree, batch, padding or slot surrounds it, a tree
node the same as its path walked as a chain, a token's prep and a row's norm the same alone as
in any launch. Under the interpreter in float32; on a GPU (``backend`` is a parameter, so the
device check's triton step runs them) in bf16 too."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import root_path
from jetspec_kernels import python_ref as ref
from jetspec_kernels.models.walk_plan import chain_plan, tree_plan
from jetspec_kernels.python_ref.gated_delta_tree import l2norm

triton = pytest.importorskip("triton")
from jetspec_kernels.triton import exact_gated_delta as eg  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])
TRITON = pytest.mark.parametrize("backend", ["triton"])

H, HV, DK, DV = 2, 4, 8, 24          # Dv not a multiple of the walk's value tile's power of two
# q/k heads and v-heads: the v-head hv reads q/k head hv // (Hv / H); H != Hv / H somewhere, so
# a head map by H instead of the ratio is seen
HEADS = [(2, 4), (4, 8), (1, 4)]


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _operands(b, n, dtype, seed=0, dk=DK, dv=DV, h=H, hv=HV):
    """Random step operands in the walk's layouts (q, k unit, q scaled; gates in range)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(b, n, h, dk, generator=gen)) * dk ** -0.5
    k = l2norm(torch.randn(b, n, h, dk, generator=gen))
    v = torch.randn(b, n, hv, dv, generator=gen).to(dtype)
    g = -torch.rand(b, n, hv, generator=gen) * 2
    beta = torch.rand(b, n, hv, generator=gen)
    return [t.to(DEV) for t in (q, k, v, g, beta)]


def _pool(slots, dk=DK, dv=DV, seed=1, hv=HV):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(slots, hv, dk, dv, generator=gen).to(DEV) * 0.3


def _walk_tree(ops, parents, counts, pool, slots, max_depth=None):
    return eg.walk(*ops, tree_plan(parents, counts, max_depth), counts, pool, slots, out=True,
                   store_last=False)


def _chain(n, b=1):
    return chain_plan(b, n, DEV)


PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8, 0, 11]


@TRITON
@pytest.mark.parametrize("h,hv", HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_walk_matches_the_float64_walk(dtype, h, hv, backend):
    """Every node's output is the recurrence along its ancestor path (python_ref's float64 walk),
    padding nodes 0, the pool untouched; for several q/k to v head ratios."""
    n = len(PARENTS)
    parents = torch.tensor([PARENTS, [-1, 0, 1, 2] + [-1] * (n - 4)], dtype=torch.int32, device=DEV)
    counts = torch.tensor([n, 4], dtype=torch.int32, device=DEV)
    q, k, v, g, beta = _operands(2, n, dtype, h=h, hv=hv)
    pool = _pool(5, hv=hv)
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
        path = root_path(PARENTS, node)
        chain_ops = [t[:, path] for t in ops]
        count = torch.tensor([len(path)], dtype=torch.int32, device=DEV)
        alone = eg.walk(*chain_ops, _chain(len(path)), count, pool.clone(), slot, out=True,
                        store_last=False)
        assert torch.equal(_bits(alone[0, -1]), _bits(tree[0, node])), node
    # commit the path to node 6 (0 1 3 6), then step node 9 (6's child) from the stored state
    stored = pool.clone()
    path = root_path(PARENTS, 6)
    eg.walk(*[t[:, path] for t in ops], _chain(4), torch.tensor([4], dtype=torch.int32, device=DEV),
            stored, slot, out=False, store_last=True)
    assert torch.equal(stored[0], pool[0])               # only the slot is written
    nxt = eg.walk(*[t[:, [9]] for t in ops], _chain(1),
                  torch.tensor([1], dtype=torch.int32, device=DEV), stored, slot, out=True,
                  store_last=False)
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


@TRITON
def test_the_walk_keeps_only_its_plans_slots(backend):
    """With the depth as the bound the walk gives the bits it gives with N's bound (the slots
    it keeps hold every state a later step reads); a bound below the tree's depth (a plan that
    lies) gives NaN exactly for the nodes whose state came through a missing slot and their
    subtrees, the pool untouched, every other node its bits."""
    n = len(PARENTS)
    parents = torch.tensor([PARENTS], dtype=torch.int32, device=DEV)
    counts = torch.tensor([n], dtype=torch.int32, device=DEV)
    ops = _operands(1, n, torch.float32, seed=5)
    pool = _pool(2, seed=6)
    slot = torch.tensor([1], dtype=torch.int32, device=DEV)
    wide = _walk_tree(ops, parents, counts, pool, slot)
    depth = max(len(root_path(PARENTS, i)) for i in range(n)) - 1
    tight = tree_plan(parents, counts, depth)
    assert tight.num_slots == depth < (n - 1) // 2
    assert torch.equal(_bits(_walk_tree(ops, parents, counts, pool, slot, depth)), _bits(wide))
    # branch points 0, 1, 3 keep slots 0, 1, 2: with one slot, 1's and 3's later children (4,
    # 7) start from a missing slot
    short = tight._replace(num_slots=1)
    before = pool.clone()
    got = eg.walk(*ops, short, counts, pool, slot, out=True, store_last=False)
    assert torch.equal(pool, before)
    lost = {i for i in range(n) if set(root_path(PARENTS, i)) & {4, 7}}
    assert lost == {4, 7}
    for i in range(n):
        if i in lost:
            assert got[0, i].isnan().all(), i
        else:
            assert torch.equal(_bits(got[0, i]), _bits(wide[0, i])), i


@TRITON
def test_every_sequence_and_head_keeps_its_own_states(backend):
    """After a walk into a NaN-filled scratch, slot s of sequence b and v-head hv holds the state
    of the last branch point the plan stored there: the bits its path walked as a chain leaves
    in the pool; unused slots stay NaN. (Programs sharing a region would pass every other test
    under the interpreter, which runs them one after another; on a GPU they would race.)"""
    n = len(PARENTS)
    rows = [PARENTS, [-1, 0, 1, 1, 0, 4, 4, 6, 6, 2, 9, 9, 0]]
    parents = torch.tensor(rows, dtype=torch.int32, device=DEV)
    counts = torch.tensor([n, n], dtype=torch.int32, device=DEV)
    ops = _operands(2, n, torch.float32, seed=7)
    pool = _pool(3, seed=8)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    plan = tree_plan(parents, counts)
    scratch = torch.full((2, HV, plan.num_slots, DK, DV), float("nan"), device=DEV)
    eg.walk(*ops, plan, counts, pool, slots, out=True, store_last=False, scratch=scratch)
    for b in range(2):
        last = {}
        for i in range(n):
            if int(plan.dst[b, i]) >= 0:
                last[int(plan.dst[b, i])] = int(plan.order[b, i])
        assert last
        for s in range(plan.num_slots):
            if s not in last:
                assert scratch[b, :, s].isnan().all()
                continue
            path = root_path(rows[b], last[s])
            stored = pool.clone()
            eg.walk(*[t[b:b + 1, path] for t in ops], _chain(len(path)),
                    torch.tensor([len(path)], dtype=torch.int32, device=DEV), stored,
                    slots[b:b + 1], out=False, store_last=True)
            assert torch.equal(_bits(scratch[b, :, s]), _bits(stored[int(slots[b])])), (b, s)
    with pytest.raises(ValueError, match="scratch"):
        eg.walk(*ops, plan, counts, pool, slots, out=True, store_last=False,
                scratch=scratch[:, :, :-1])


@TRITON
@pytest.mark.parametrize("h,hv", HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prep_is_the_layer_formulas_and_row_invariant(dtype, h, hv, backend):
    """The prep's q, k, v, g, beta against transformers' formulas (conv over the taps the
    sources name, silu, rounded to the model dtype, l2norm, q scaled; softplus gate, also past
    its threshold and far below 0; sigmoid beta rounded to the model dtype), and a token's bits
    the same alone as among 2 x 7 (its sequence's rows at other offsets)."""
    width, c, n = 4, 2 * h * DK + hv * DV, 7
    gen = torch.Generator().manual_seed(6)
    seq = (torch.randn(2, n + width - 1, c, generator=gen) * 2).to(dtype).to(DEV)
    src = torch.randint(0, n + width - 1, (2, n, width), generator=gen).to(DEV)   # any rows
    weight = (torch.randn(c, width, generator=gen) * 0.5).to(dtype).to(DEV)
    a = (torch.randn(2, n, hv, generator=gen) * 12).to(dtype).to(DEV)  # past 20 and below -16.6
    b = torch.randn(2, n, hv, generator=gen).to(dtype).to(DEV)
    a_log = torch.log(1 + 7 * torch.rand(hv, generator=gen)).to(dtype).to(DEV)
    dt_bias = torch.randn(hv, generator=gen).to(dtype).to(DEV)
    scale = DK ** -0.5
    q, k, v, g, beta = eg.prep(seq, src, weight, a, b, a_log, dt_bias, h, DK, DV, scale)
    win = seq.gather(1, src.reshape(2, n * width, 1).expand(-1, -1, c)).view(2, n, width, c)
    conv = F.silu((win.float() * weight.float().t()).sum(2)).to(dtype).float()
    qs, ks, vs = conv.split([h * DK, h * DK, hv * DV], dim=-1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert torch.allclose(q, l2norm(qs.view(2, n, h, DK)) * scale, **tol)
    assert torch.allclose(k, l2norm(ks.view(2, n, h, DK)), **tol)
    assert torch.allclose(v.float(), vs.view(2, n, hv, DV), **tol)
    want_g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    assert torch.allclose(g, want_g, rtol=1e-5, atol=0)            # relative, also where tiny
    assert torch.equal(beta, beta.to(dtype).float())                # rounded to the model dtype
    assert torch.allclose(beta, torch.sigmoid(b.float()).to(dtype).float(), **tol)
    for s_, i in ((0, 0), (1, 3), (1, 6)):
        one = eg.prep(seq[s_:s_ + 1], src[s_:s_ + 1, i:i + 1], weight, a[s_:s_ + 1, i:i + 1],
                      b[s_:s_ + 1, i:i + 1], a_log, dt_bias, h, DK, DV, scale)
        for x, y in zip(one, (q, k, v, g, beta)):
            assert torch.equal(_bits(x[0, 0]), _bits(y[s_, i])), (s_, i)


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
    counts = torch.zeros(0, dtype=torch.int32, device=DEV)
    out = eg.walk(*ops, tree_plan(none, counts), counts, _pool(1),
                  torch.zeros(0, dtype=torch.int32, device=DEV), out=True, store_last=False)
    assert out.shape == (0, 3, HV, DV)
    assert eg.zc_norm_rows(torch.zeros(0, 8, device=DEV), torch.zeros(8, device=DEV), 1e-6).shape == (0, 8)
    assert eg.sigmoid_gate(torch.zeros(0, 8, device=DEV), torch.zeros(0, 1, device=DEV)).shape == (0, 8)


# The walk as the model launches it for a tree (B 16, N 64), a decode step (B 1, N 1), a prompt
# (B 2, T 512) and a commit (B 16, a 7-node chain), compiled offline for sm_90a.
_ONE_BINARY = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from bench import triton_resources as tr
compiled = []
tr._install(compiled)
from jetspec_kernels.triton.exact_gated_delta import walk
from jetspec_kernels.models.walk_plan import WalkPlan
e, i32 = torch.empty, dict(dtype=torch.int32)
for b, n, out, slots, last in ((16, 64, 1, 8, 0), (1, 1, 1, 0, 0), (2, 512, 1, 0, 1), (16, 7, 0, 0, 1)):
    plan = WalkPlan(e(b, n, **i32), e(b, n, **i32), e(b, n, **i32), slots)
    walk(e(b, n, 16, 128), e(b, n, 16, 128), e(b, n, 32, 128, dtype=torch.bfloat16), e(b, n, 32),
         e(b, n, 32), plan, e(b, **i32), e(20, 32, 128, 128), e(b, **i32), out=bool(out),
         store_last=bool(last))
print(len(compiled), len({k.hash for _, k in compiled}))
"""


def test_tree_prompt_decode_and_commit_run_one_binary():
    """The walk's three uses (and decode's one-node tree) compile to one binary for sm_90a: the
    mode and the sizes are runtime arguments Triton does not specialise on, so every step of a
    prompt, a tree and a commit is the same instructions (what makes a commit's state the tree
    walk's bits on a GPU, where the interpreter shows nothing of compilation)."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its CUDA backend")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _ONE_BINARY, str(root)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["4", "1"], proc.stdout
