"""gated_delta_commit against python_ref (float64) and against decoding the accepted path one token
at a time with transformers' recurrent gated delta rule, on the reference and triton backends:
permuted slots with the unused ones poisoned and untouched, accept_len 0 and P - 1, poison past
accept_len, Hv = 2H, bf16 / fp32; no host reads; the argument checks and the limits."""
import sys
from pathlib import Path

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from helpers import TOL, backends, rel_l2

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.decode_round import HostReads  # noqa: E402

NAN = float("nan")


def make_case(B, N, P, H, Hv, Dk, Dv, gen, dtype=torch.float32, spare=2, accept=None):
    """Random node inputs, paths of distinct nodes with random accept lengths (the entries past
    accept_len -1 or a node whose inputs are NaN), a pool of B + spare slots (spare ones NaN)."""
    k = torch.randn(B, N, H, Dk, generator=gen).to(dtype)
    v = torch.randn(B, N, Hv, Dv, generator=gen).to(dtype)
    g = -2 * torch.rand(B, N, Hv, generator=gen)
    beta = torch.rand(B, N, Hv, generator=gen).to(dtype)
    path = torch.full((B, P), -1, dtype=torch.int32)
    if accept is None:
        accept = torch.randint(0, P, (B,), generator=gen, dtype=torch.int32)
    for b in range(B):
        nodes = torch.randperm(N, generator=gen)[:P]
        a = int(accept[b])
        path[b, :a + 1] = nodes[:a + 1].to(torch.int32)
        if a + 1 < P:                 # a node past accept_len whose inputs are poison
            path[b, a + 1] = int(nodes[a + 1])
            v[b, nodes[a + 1]] = NAN
            g[b, nodes[a + 1]] = NAN
    S = B + spare
    state = torch.full((S, Hv, Dk, Dv), NAN)
    slots = torch.randperm(S, generator=gen)[:B].to(torch.int32)
    state[slots.long()] = torch.randn(B, Hv, Dk, Dv, generator=gen)
    return dict(k=k, v=v, g=g, beta=beta, path=path, accept_len=accept, state=state,
                state_slots=slots)


def run(case, dev, backend_name, **kw):
    c = {key: (x.to(dev) if torch.is_tensor(x) else x) for key, x in case.items()}
    c["state"] = c["state"].clone()
    jk.gated_delta_commit(c["k"], c["v"], c["g"], c["beta"], c["path"], c["accept_len"],
                          c["state"], state_slots=c["state_slots"], backend=backend_name, **kw)
    return c["state"].cpu()


def spec(case, **kw):
    pool = case["state"].double().clone()
    c = {key: (x.double() if x.is_floating_point() else x) for key, x in case.items()
         if torch.is_tensor(x)}
    ref.gated_delta_commit(c["k"], c["v"], c["g"], c["beta"], c["path"], c["accept_len"], pool,
                           state_slots=case["state_slots"], **kw)
    return pool


def check(case, got, dtype, **kw):
    want = spec(case, **kw)
    used = case["state_slots"].long()
    unused = torch.ones(want.shape[0], dtype=torch.bool)
    unused[used] = False
    assert got[unused].isnan().all(), "an unused slot was written"
    assert not got[used].isnan().any()
    assert rel_l2(got[used], want[used]) < TOL[dtype]


@backends("reference", "triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,N,P,H,Hv,Dk,Dv", [
    (3, 8, 4, 1, 1, 8, 8),
    (2, 12, 6, 2, 4, 12, 80),      # Hv = 2H, two Dv tiles, Dk not a power of two
])
def test_matches_python_ref(backend, dev, dtype, B, N, P, H, Hv, Dk, Dv):
    gen = torch.Generator().manual_seed(N * 10 + P)
    case = make_case(B, N, P, H, Hv, Dk, Dv, gen, dtype=dtype)
    check(case, run(case, dev, backend.name), dtype)


@backends("reference", "triton")
@pytest.mark.parametrize("accept", ["zero", "full"])
def test_accept_len_at_its_ends(backend, dev, accept):
    gen = torch.Generator().manual_seed(4)
    B, P = 3, 5
    a = torch.zeros(B, dtype=torch.int32) if accept == "zero" else torch.full((B,), P - 1,
                                                                               dtype=torch.int32)
    case = make_case(B, 9, P, 1, 2, 8, 8, gen, accept=a)
    check(case, run(case, dev, backend.name), torch.float32)
    check(case, run(case, dev, backend.name, use_qk_l2norm=False), torch.float32,
          use_qk_l2norm=False)


@backends("reference", "triton")
def test_equals_decoding_the_path_one_token_at_a_time(backend, dev):
    """The committed state is transformers' recurrent form run over the accepted tokens."""
    qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(5)
    case = make_case(2, 10, 5, 2, 4, 16, 16, gen)
    got = run(case, dev, backend.name)
    for b in range(2):
        nodes = case["path"][b, :int(case["accept_len"][b]) + 1].long()
        slot = int(case["state_slots"][b])
        k = case["k"][b:b + 1, nodes]
        _, final = qwen3_5.torch_recurrent_gated_delta_rule(
            torch.randn(k.shape), k, case["v"][b:b + 1, nodes], g=case["g"][b:b + 1, nodes],
            beta=case["beta"][b:b + 1, nodes], initial_state=case["state"][slot][None].clone(),
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert rel_l2(got[slot], final[0]) < 1e-6


def test_reference_reads_no_values_on_the_host():
    gen = torch.Generator().manual_seed(6)
    case = make_case(2, 8, 4, 1, 2, 8, 8, gen)
    jk.set_value_checks("never")
    try:
        with HostReads(refuse=True):
            ref.gated_delta_commit(case["k"], case["v"], case["g"], case["beta"], case["path"],
                                   case["accept_len"], case["state"].clone(),
                                   state_slots=case["state_slots"])
            run(case, "cpu", "reference")
    finally:
        jk.set_value_checks("cpu")


# ---------------------------------------------------------------- argument checks


def small(**over):
    gen = torch.Generator().manual_seed(7)
    case = make_case(2, 6, 3, 1, 2, 4, 4, gen, accept=torch.tensor([2, 1], dtype=torch.int32))
    case.update(over)
    return case


def at_accept_len(case, node):
    """``case``'s path with ``node`` at column accept_len[b] of each sequence (its last node)."""
    path = case["path"].clone()
    path[torch.arange(path.shape[0]), case["accept_len"].long()] = node
    return path


BAD = {
    "k dtype": (lambda c: dict(k=c["k"].double()), TypeError, "k"),
    "v dtype": (lambda c: dict(v=c["v"].half()), TypeError, "v"),
    "g dtype": (lambda c: dict(g=c["g"].half()), TypeError, "g"),
    "beta shape": (lambda c: dict(beta=c["beta"][:, :3]), ValueError, "beta"),
    "path dtype": (lambda c: dict(path=c["path"].long()), TypeError, "path"),
    "path empty": (lambda c: dict(path=c["path"][:, :0]), ValueError, "path"),
    "path node past N": (lambda c: dict(path=c["path"].clone().index_fill_(
        1, torch.tensor([1]), 6)), ValueError, "path"),
    "path -1 inside": (lambda c: dict(path=c["path"].clone().index_fill_(
        1, torch.tensor([1]), -1)), ValueError, "path"),
    "path node past N at accept_len": (lambda c: dict(path=at_accept_len(c, 6)), ValueError, "path"),
    "path -1 at accept_len": (lambda c: dict(path=at_accept_len(c, -1)), ValueError, "path"),
    "accept_len past P - 1": (lambda c: dict(accept_len=torch.tensor([3, 0], dtype=torch.int32)),
                              ValueError, "accept_len"),
    "accept_len negative": (lambda c: dict(accept_len=torch.tensor([-1, 0], dtype=torch.int32)),
                            ValueError, "accept_len"),
    "accept_len shape": (lambda c: dict(accept_len=c["accept_len"][:1]), ValueError, "accept_len"),
    "state dtype": (lambda c: dict(state=c["state"].double()), TypeError, "state"),
    "state layout": (lambda c: dict(state=c["state"].transpose(2, 3).contiguous().transpose(2, 3)),
                     ValueError, "state"),
    "slot past the pool": (lambda c: dict(state_slots=torch.tensor([0, 4], dtype=torch.int32)),
                           ValueError, "state_slots"),
    "slots repeated": (lambda c: dict(state_slots=torch.tensor([1, 1], dtype=torch.int32)),
                       ValueError, "state_slots"),
    "no slots, pool not B": (lambda c: dict(state_slots=None), ValueError, "state"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_named(name):
    over, exc, arg = BAD[name]
    case = small()
    with pytest.raises(exc, match=rf"^{arg}\b"):
        run(small(**over(case)), "cpu", "reference")


def test_limits_at_and_one_past():
    """accept_len P - 1 and a path node N - 1 taken (one past: above), slot S - 1 taken, a path
    entry past accept_len holds anything."""
    case = small(accept_len=torch.tensor([2, 2], dtype=torch.int32),
                 path=torch.tensor([[0, 1, 5], [5, 2, 3]], dtype=torch.int32),
                 state_slots=torch.tensor([3, 0], dtype=torch.int32))
    run(case, "cpu", "reference")
    case = small(accept_len=torch.tensor([0, 0], dtype=torch.int32),
                 path=torch.tensor([[0, 99, -5], [1, -1, 7]], dtype=torch.int32))
    got = run(case, "cpu", "reference")
    check(case, got, torch.float32)
    with pytest.raises(TypeError, match="^use_qk_l2norm"):
        run(small(), "cpu", "reference", use_qk_l2norm="yes")
