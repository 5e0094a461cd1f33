"""gated_delta_tree against python_ref (the path walk, float64) on the reference and triton
backends: ragged, deep, wide and multi-block trees, q/k/v as slices of one fused projection,
Hv = 2H, bf16 / fp32, gates and betas at their ends, large and tiny magnitudes, poisoned padding
nodes and state slots; a chain's outputs; no host reads; the argument checks and the limits."""
import sys
from pathlib import Path

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.limits import MAX_BUDGET
from jetspec_kernels.ops.gated_delta_tree import check_gated_delta_tree
from helpers import TOL, backends, poisoned_empty, random_tree, rel_l2

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.decode_round import HostRead, HostReads  # noqa: E402

NAN = float("nan")


def make_case(B, N, H, Hv, Dk, Dv, gen, *, dtype=torch.float32, parents=None, num_nodes=None,
              spare_slots=2, qk_scale=1.0, v_scale=1.0, state_scale=1.0, g_range=(-2.0, 0.0),
              beta_range=(0.0, 1.0)):
    """Inputs with q/k/v as column slices of one fused [B, N, (2H Dk + Hv Dv)] projection,
    padding nodes' inputs NaN, and a state pool of B + spare_slots slots (the unused ones NaN)
    in a random order."""
    if parents is None:
        parents, num_nodes = random_tree(B, N, gen, min_nodes=1)
    fused = torch.randn(B, N, 2 * H * Dk + Hv * Dv, generator=gen)
    fused[..., :2 * H * Dk] *= qk_scale
    fused[..., 2 * H * Dk:] *= v_scale
    fused = fused.to(dtype)
    q = fused[..., :H * Dk].unflatten(-1, (H, Dk))
    k = fused[..., H * Dk:2 * H * Dk].unflatten(-1, (H, Dk))
    v = fused[..., 2 * H * Dk:].unflatten(-1, (Hv, Dv))
    lo, hi = g_range
    g = lo + (hi - lo) * torch.rand(B, N, Hv, generator=gen)
    lo, hi = beta_range
    beta = (lo + (hi - lo) * torch.rand(B, N, Hv, generator=gen)).to(dtype)
    S = B + spare_slots
    state = torch.full((S, Hv, Dk, Dv), NAN)
    slots = torch.randperm(S, generator=gen)[:B].to(torch.int32)
    state[slots.long()] = torch.randn(B, Hv, Dk, Dv, generator=gen) * state_scale
    if num_nodes is not None:
        pad = torch.arange(N)[None, :] >= num_nodes[:, None]
        fused.masked_fill_(pad[..., None], NAN)
        g.masked_fill_(pad[..., None], NAN)
        beta.masked_fill_(pad[..., None], NAN)
    return dict(q=q, k=k, v=v, g=g, beta=beta, parents=parents, state=state, state_slots=slots,
                num_nodes=num_nodes)


def spec(case, **kw):
    """python_ref's path walk in float64."""
    c = {key: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x)
         for key, x in case.items()}
    return ref.gated_delta_tree(c["q"], c["k"], c["v"], c["g"], c["beta"], c["parents"],
                                c["state"], state_slots=c["state_slots"],
                                num_nodes=c["num_nodes"], **kw)


def run(case, dev, backend_name, **kw):
    c = {key: (x.to(dev) if torch.is_tensor(x) else x) for key, x in case.items()}
    state_before = c["state"].clone()
    with poisoned_empty():
        o = jk.gated_delta_tree(c["q"], c["k"], c["v"], c["g"], c["beta"], c["parents"],
                                c["state"], state_slots=c["state_slots"],
                                num_nodes=c["num_nodes"], backend=backend_name, **kw)
    assert torch.equal(c["state"].isnan(), state_before.isnan())   # read only, NaN slots too
    assert torch.equal(c["state"].nan_to_num(), state_before.nan_to_num())
    return o.cpu()


def check(case, o, dtype, **kw):
    want = spec(case, **kw)
    assert o.dtype == dtype and o.shape == want.shape and o.is_contiguous()
    num = case["num_nodes"]
    pad = (torch.arange(o.shape[1])[None, :] >= (o.shape[1] if num is None else num[:, None])
           ).expand(o.shape[0], -1)
    assert (o[pad] == 0).all(), "padding rows must be 0"
    assert not o.isnan().any()
    assert rel_l2(o, want) < TOL[dtype], rel_l2(o, want)


@backends("reference", "triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,N,H,Hv,Dk,Dv", [
    (3, 9, 1, 1, 8, 8),          # ragged, one head
    (2, 12, 2, 4, 16, 12),       # Hv = 2H, Dv not a power of two
    (2, 40, 1, 2, 12, 80),       # two row blocks (triton), two Dv tiles, Dk not a power of two
    (1, 20, 1, 2, 72, 16),       # Dk in three chunks (triton), the last one partial
])
def test_matches_python_ref(backend, dev, dtype, B, N, H, Hv, Dk, Dv):
    gen = torch.Generator().manual_seed(B * 1000 + N)
    case = make_case(B, N, H, Hv, Dk, Dv, gen, dtype=dtype)
    check(case, run(case, dev, backend.name), dtype)


@backends("reference", "triton")
@pytest.mark.parametrize("what", ["g near 0", "g very negative", "beta near 0", "beta near 1",
                                  "large", "tiny", "scale", "no l2norm"])
def test_edges_of_the_inputs(backend, dev, what):
    gen = torch.Generator().manual_seed(7)
    kw, run_kw = {}, {}
    if what == "g near 0":
        kw["g_range"] = (-1e-6, 0.0)
    elif what == "g very negative":
        kw["g_range"] = (-80.0, -20.0)
    elif what == "beta near 0":
        kw["beta_range"] = (0.0, 1e-5)
    elif what == "beta near 1":
        kw["beta_range"] = (1.0 - 1e-6, 1.0)
    elif what == "large":
        kw.update(qk_scale=1e3, v_scale=1e3, state_scale=1e3)
    elif what == "tiny":          # below l2norm's eps: q and k stay short
        kw.update(qk_scale=1e-4, v_scale=1e-4, state_scale=1e-4)
    elif what == "scale":
        run_kw["scale"] = 0.3
    else:
        run_kw["use_qk_l2norm"] = False
        kw["qk_scale"] = 0.2
    case = make_case(2, 14, 1, 2, 16, 16, gen, **kw)
    check(case, run(case, dev, backend.name, **run_kw), torch.float32, **run_kw)


def chain(B, N):
    return (torch.arange(N, dtype=torch.int32) - 1).expand(B, N).contiguous()


@backends("reference", "triton")
@pytest.mark.parametrize("shape", ["deep chain", "wide", "forest", "zero nodes"])
def test_tree_shapes(backend, dev, shape):
    gen = torch.Generator().manual_seed(5)
    B, N = 2, 70
    num = torch.tensor([N, 37], dtype=torch.int32)
    if shape == "deep chain":         # depth 69: every row block sweeps its whole depth
        parents = chain(B, N)
    elif shape == "wide":             # every node a child of the root
        parents = torch.zeros(B, N, dtype=torch.int32)
        parents[:, 0] = -1
    elif shape == "forest":           # several children of the committed prefix
        parents = torch.randint(-1, 1, (B, N), generator=gen, dtype=torch.int32)
        for i in range(2, N, 3):
            parents[:, i] = i - 2
    else:
        parents, num = chain(B, N), torch.tensor([0, 1], dtype=torch.int32)
    parents[:, 0] = -1
    case = make_case(B, N, 1, 2, 16, 16, gen, parents=parents, num_nodes=num, g_range=(-0.1, 0))
    check(case, run(case, dev, backend.name), torch.float32)


def block_crossing_parents(shape, B, N, gen):
    """Parents whose ancestors lie in earlier row blocks of 16 (the triton kernel's block pairs):
    every off-diagonal block pair carries weight, so a missing or misplaced pair shows."""
    i = torch.arange(N, dtype=torch.int32)
    if shape == "parent one block back":          # the diagonal blocks are the identity
        parents = i - 16
    elif shape == "parent two blocks back":
        parents = i - 33
    elif shape == "chain over four blocks":       # depth N - 1: every block sweeps 16 deep
        parents = i - 1
    else:                                         # random, from up to 40 nodes back
        back = torch.randint(1, 41, (N,), generator=gen, dtype=torch.int32)
        parents = i - back
    return parents.clamp(min=-1).expand(B, N).contiguous()


@backends("reference", "triton")
@pytest.mark.parametrize("shape", ["parent one block back", "parent two blocks back",
                                   "chain over four blocks", "random across blocks"])
def test_ancestors_in_earlier_row_blocks(backend, dev, shape):
    """N = 61 (four row blocks, the last partial); one sequence whole, one ending inside a block
    (NaN padding rows after it), one ending on a block boundary; gates near 0 and betas near 1,
    so an ancestor three blocks back still moves a node's output."""
    gen = torch.Generator().manual_seed(11)
    B, N = 3, 61
    num = torch.tensor([N, 45, 32], dtype=torch.int32)
    parents = block_crossing_parents(shape, B, N, gen)
    case = make_case(B, N, 1, 2, 16, 24, gen, parents=parents, num_nodes=num,
                     g_range=(-0.05, 0.0), beta_range=(0.5, 1.0))
    check(case, run(case, dev, backend.name), torch.float32)


@backends("reference", "triton")
def test_many_row_blocks(backend, dev):
    """N = 300: 19 row blocks, 190 block pairs (the triton kernel's pair index decoded past the
    first few), ancestors up to 250 nodes back."""
    gen = torch.Generator().manual_seed(12)
    N = 300
    i = torch.arange(N, dtype=torch.int32)
    parents = torch.where(i % 5 == 0, i - 1, (i * 7) % 250 - 250 + i).clamp(min=-1)
    parents = torch.minimum(parents, i - 1)[None].contiguous()
    case = make_case(1, N, 1, 1, 16, 16, gen, parents=parents,
                     num_nodes=torch.tensor([290], dtype=torch.int32), g_range=(-0.02, 0.0))
    check(case, run(case, dev, backend.name), torch.float32)



@backends("triton")
@pytest.mark.parametrize("N", [12, 40])
def test_a_sequence_does_not_depend_on_its_batch(backend, dev, N):
    """Batch invariance: each sequence's rows are bit for bit those of the sequence run alone
    (the kernel's tiles and launches are chosen from N, Dk, Dv and the dtype, never from B).
    float32 inputs and Dk 48: a Dk chunk chosen from B changes the sums' rounding there (with
    bf16 inputs those sums are often exact, and such a choice would go unseen)."""
    gen = torch.Generator().manual_seed(13)
    case = make_case(3, N, 1, 2, 48, 24, gen)
    o = run(case, dev, backend.name)
    for b in range(3):
        one = {key: (x[b:b + 1] if key not in ("state",) and torch.is_tensor(x) else x)
               for key, x in case.items()}
        assert torch.equal(run(one, dev, backend.name)[0], o[b])

@backends("reference", "triton")
@pytest.mark.parametrize("n", [512, MAX_BUDGET])
def test_a_chain_up_to_the_limit_is_the_sequence(backend, dev, n):
    """A chain of n nodes (depth n - 1) against transformers' recurrent form over the sequence."""
    if dev == "cpu" and (n > 512 or backend.name == "triton"):
        pytest.skip("runs on a GPU (minutes on the CPU or under the interpreter)")
    qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(n)
    case = make_case(1, n, 1, 2, 16, 16, gen, parents=chain(1, n), g_range=(-0.05, 0.0),
                     spare_slots=0)
    o = run(case, dev, backend.name)
    want, _ = qwen3_5.torch_recurrent_gated_delta_rule(
        case["q"], case["k"], case["v"], g=case["g"], beta=case["beta"],
        initial_state=case["state"][case["state_slots"].long()], use_qk_l2norm_in_kernel=True)
    assert rel_l2(o, want) < TOL[torch.float32]


@backends("reference", "triton")
def test_all_nodes_valid_without_num_nodes_and_slots(backend, dev):
    gen = torch.Generator().manual_seed(6)
    B, N = 2, 10
    parents, _ = random_tree(B, N, gen, min_nodes=N)
    case = make_case(B, N, 2, 2, 8, 8, gen, parents=parents, spare_slots=0)
    case["state"] = case["state"][case["state_slots"].long()].contiguous()
    case["state_slots"] = None
    check(case, run(case, dev, backend.name), torch.float32)


@backends("reference", "triton")
def test_accepted_nodes_equal_their_chain(backend, dev):
    """The tree's outputs on an accepted path equal the op run on that path alone (a chain), and
    the state gated_delta_commit leaves then gives the next token what the longer chain gives."""
    gen = torch.Generator().manual_seed(8)
    B, N = 2, 12
    parents, _ = random_tree(B, N, gen, min_nodes=N)
    case = make_case(B, N, 1, 2, 16, 16, gen, parents=parents,
                     num_nodes=torch.full((B,), N, dtype=torch.int32))
    o = run(case, dev, backend.name)
    path = [ref.ancestors(case["parents"][b], int(case["num_nodes"][b]) - 1)[::-1] for b in range(B)]
    P = max(map(len, path))
    idx = torch.tensor([p + [p[-1]] * (P - len(p)) for p in path])       # [B, P] node indices
    rows = torch.arange(B)[:, None]
    ch = {key: case[key][rows, idx].contiguous() for key in ("q", "k", "v", "g", "beta")}
    ch.update(parents=chain(B, P), state=case["state"], state_slots=case["state_slots"],
              num_nodes=torch.tensor([len(p) for p in path], dtype=torch.int32))
    oc = run(ch, dev, backend.name)
    for b in range(B):
        assert rel_l2(oc[b, :len(path[b])], o[b, path[b]]) < 1e-6

    # commit all but the last node of each path, then decode the last node from that state
    pool = case["state"].to(dev).clone()
    jk.gated_delta_commit(ch["k"].to(dev), ch["v"].to(dev), ch["g"].to(dev), ch["beta"].to(dev),
                          torch.arange(P, dtype=torch.int32).expand(B, P).contiguous().to(dev),
                          (ch["num_nodes"] - 2).to(dev), pool,
                          state_slots=case["state_slots"].to(dev), backend=backend.name)
    last = torch.tensor([len(p) - 1 for p in path])[:, None]
    one = {key: ch[key][rows, last].contiguous() for key in ("q", "k", "v", "g", "beta")}
    one.update(parents=torch.full((B, 1), -1, dtype=torch.int32), state=pool.cpu(),
               state_slots=case["state_slots"], num_nodes=None)
    o1 = run(one, dev, backend.name)
    for b in range(B):
        assert rel_l2(o1[b, 0], oc[b, len(path[b]) - 1]) < 1e-5


def test_reference_form_reads_no_values_on_the_host():
    """What the reference backend runs (also on CUDA tensors, in a CUDA graph) reads no tensor
    value on the host; the op's wrapper neither, with value checks off."""
    gen = torch.Generator().manual_seed(9)
    case = make_case(2, 10, 1, 2, 8, 8, gen)
    args = [case[key] for key in ("q", "k", "v", "g", "beta", "parents", "state")]
    kw = dict(state_slots=case["state_slots"], num_nodes=case["num_nodes"])
    jk.set_value_checks("never")
    try:
        with HostReads(refuse=True):
            ref.gated_delta_tree_chunked(*args, **kw)
            jk.gated_delta_tree(*args, **kw, backend="reference")
    finally:
        jk.set_value_checks("cpu")
    with pytest.raises(HostRead):          # the guard does see the path walk's reads
        with HostReads(refuse=True):
            ref.gated_delta_tree(*args, **kw)


# ---------------------------------------------------------------- argument checks


def small(**over):
    gen = torch.Generator().manual_seed(10)
    parents, _ = random_tree(2, 6, gen, min_nodes=6)
    case = make_case(2, 6, 1, 2, 4, 4, gen, parents=parents,
                     num_nodes=torch.tensor([6, 4], dtype=torch.int32))
    case.update(over)
    return case


def call(case, **kw):
    return jk.gated_delta_tree(case["q"], case["k"], case["v"], case["g"], case["beta"],
                               case["parents"], case["state"], state_slots=case["state_slots"],
                               num_nodes=case["num_nodes"], backend="reference", **kw)


BAD = {
    "q dtype": (lambda c: dict(q=c["q"].double()), TypeError, "q"),
    "k dtype": (lambda c: dict(k=c["k"].to(torch.bfloat16)), TypeError, "q"),
    "v dtype": (lambda c: dict(v=c["v"].half()), TypeError, "v"),
    "k not a tensor": (lambda c: dict(k=c["k"].tolist()), TypeError, "k"),
    "q shape": (lambda c: dict(q=c["q"][:, :, :, :3]), ValueError, "q"),
    "Hv not a multiple of H": (lambda c: dict(q=c["q"].expand(-1, -1, 2, -1).contiguous(),
                                              k=c["k"].expand(-1, -1, 2, -1).contiguous(),
                                              v=torch.randn(2, 6, 3, 4)), ValueError, "v"),
    "g dtype": (lambda c: dict(g=c["g"].to(torch.bfloat16)), TypeError, "g"),
    "g shape": (lambda c: dict(g=c["g"][..., :1]), ValueError, "g"),
    "beta dtype": (lambda c: dict(beta=c["beta"].double()), TypeError, "beta"),
    "parents dtype": (lambda c: dict(parents=c["parents"].long()), TypeError, "parents"),
    "parents not before": (lambda c: dict(parents=c["parents"].clone().index_fill_(
        1, torch.tensor([1]), 1)), ValueError, "parents"),
    "parents below -1": (lambda c: dict(parents=c["parents"].clone().index_fill_(
        1, torch.tensor([0]), -2)), ValueError, "parents"),
    "num_nodes past N": (lambda c: dict(num_nodes=torch.tensor([7, 1], dtype=torch.int32)),
                         ValueError, "num_nodes"),
    "num_nodes negative": (lambda c: dict(num_nodes=torch.tensor([-1, 1], dtype=torch.int32)),
                           ValueError, "num_nodes"),
    "state dtype": (lambda c: dict(state=c["state"].half()), TypeError, "state"),
    "state layout": (lambda c: dict(state=c["state"].transpose(2, 3).contiguous().transpose(2, 3)),
                     ValueError, "state"),
    "state heads": (lambda c: dict(state=c["state"][:, :1]), ValueError, "state"),
    "slot past the pool": (lambda c: dict(state_slots=torch.tensor([0, 4], dtype=torch.int32)),
                           ValueError, "state_slots"),
    "slot negative": (lambda c: dict(state_slots=torch.tensor([0, -1], dtype=torch.int32)),
                      ValueError, "state_slots"),
    "no slots, pool not B": (lambda c: dict(state_slots=None), ValueError, "state"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_named(name):
    case = small()
    over, exc, arg = BAD[name]
    with pytest.raises(exc, match=rf"^{arg}\b"):
        call(small(**over(case)))


@pytest.mark.parametrize("scale,exc", [(0.0, ValueError), (float("nan"), ValueError),
                                       ("0.1", TypeError)])
def test_bad_scale(scale, exc):
    with pytest.raises(exc, match="^scale"):
        call(small(), scale=scale)


def test_bad_flag_and_grad():
    with pytest.raises(TypeError, match="^use_qk_l2norm"):
        call(small(), use_qk_l2norm=1)
    case = small()
    case["v"] = case["v"].clone().requires_grad_()
    with pytest.raises(ValueError, match="no backward"):
        call(case)


def test_limits_at_and_one_past():
    """Slots: S - 1 taken, S refused (above); num_nodes: N taken, N + 1 refused; tree nodes:
    MAX_BUDGET taken, one more refused, and at least one."""
    case = small(num_nodes=torch.tensor([6, 6], dtype=torch.int32),
                 state_slots=torch.tensor([3, 0], dtype=torch.int32))
    call(case)
    for n, ok in [(MAX_BUDGET, True), (MAX_BUDGET + 1, False), (0, False)]:
        q = torch.zeros(1, n, 1, 1)
        g = torch.zeros(1, n, 1)
        parents = (torch.arange(n, dtype=torch.int32) - 1)[None]
        args = (q, q, q, g, g, parents, torch.zeros(1, 1, 1, 1), None, None, None, True)
        if ok:
            check_gated_delta_tree(*args)
        else:
            with pytest.raises(ValueError, match="^k must have between 1 and 4096"):
                check_gated_delta_tree(*args)


def test_triton_refuses_a_head_dim_past_its_limit():
    from jetspec_kernels import triton as tr
    k = torch.zeros(1, 1, 1, tr.GATED_DELTA_MAX_DK)
    assert tr.supports("gated_delta_tree", k=k) is None
    k = torch.zeros(1, 1, 1, tr.GATED_DELTA_MAX_DK + 1)
    assert "Dk <= 256" in tr.supports("gated_delta_tree", k=k)
    assert "Dk <= 256" in tr.supports("gated_delta_commit", k=k)


def test_padding_rows_may_hold_any_parent():
    """Rows past num_nodes are padding (an engine leaves the last tree's rows there): their
    parents are not checked, and the valid rows' outputs are those of -1 padding."""
    case = small()
    num = case["num_nodes"].tolist()
    parents = case["parents"].clone()
    for b, count in enumerate(num):
        parents[b, count:] = torch.arange(count, parents.shape[1])       # self-parents
    assert min(num) < parents.shape[1]
    want = call(case)
    got = call(small(parents=parents))
    for b, count in enumerate(num):
        assert torch.equal(got[b, :count], want[b, :count])
