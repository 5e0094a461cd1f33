"""The differential fuzzer's deterministic slice (in ``make test``) and the cases it found.

Every public op, on every engine here (reference, triton under the interpreter, the cuda kernels
in the simulator; cuda and triton on a GPU), against python_ref: fuzz_cases.py draws the inputs,
fuzz_check.py compares. ``make fuzz`` (tests/fuzz/run.py) runs many more seeds for minutes and
prints a replay command for every failure; a failure it finds becomes a line of REGRESSIONS.
The exact mode's invariance property (fuzz_invariance.py: row i of an M-row exact call == the
one-row call on row i, bitwise; a tree row == its decode step) has its own slice here.
"""
import pytest

from fuzz_cases import OPS
from fuzz_check import check
from fuzz_engines import engines_here
from fuzz_invariance import INVARIANCE_OPS, check_invariance

# Seeds per op in make test: about 60 s on the 2-core CPU machine for all engines.
SLICE_SEEDS = 8
# Seeds per op of the exact mode's invariance property (fuzz_invariance.py) in make test.
INVARIANCE_SEEDS = 3

# (op, seed, what it found): cases that failed before a fix.
REGRESSIONS = [
    ("verify_tree", 2000, "NaN logit with top-p: cuda kept no token and returned 2**31 - 1, "
                          "triton skipped the NaN (it is the maximum, as torch.argmax)"),
    ("verify_tree", 2010, "NaN logit, sampled: triton skipped the NaN"),
    ("verify_tree", 2050, "NaN logit, sampled with top-k: triton skipped the NaN"),
]

ENGINES = [pytest.param(e, id=e.name) for e in engines_here()]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op,seed", [(op, s) for op in OPS for s in range(SLICE_SEEDS)])
def test_fuzz_slice(op, seed, engine, monkeypatch):
    status = check(op, seed, engine, monkeypatch)
    if status != "ok":
        pytest.skip(status)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op,seed,found", REGRESSIONS, ids=[f"{o}-{s}" for o, s, _ in REGRESSIONS])
def test_fuzz_regressions(op, seed, found, engine, monkeypatch):
    status = check(op, seed, engine, monkeypatch)
    if status != "ok":
        pytest.skip(status)


# argmax and the embedding are torch's ops (the reference engine runs them); linear and the MoE
# block are the reference's or triton's.
INVARIANCE_CASES = [pytest.param(n, s, e, id=f"{n}-{s}-{e.name}") for e in engines_here()
                    for n in INVARIANCE_OPS for s in range(INVARIANCE_SEEDS)
                    if e.name == "reference" or n not in ("exact_argmax", "exact_embedding")
                    and (e.name == "triton" or n not in ("exact_linear", "exact_moe",
                                                          "exact_gated_delta"))]


@pytest.mark.parametrize("name,seed,engine", INVARIANCE_CASES)
def test_exact_invariance_slice(name, seed, engine, monkeypatch):
    status = check_invariance(name, seed, engine, monkeypatch)
    if status != "ok":
        pytest.skip(status)


def test_exact_invariance_catches_the_normal_forms(monkeypatch):
    """The property's power: with the normal float32 GEMM in place of ops.exact.linear, the
    normal MoE block (its experts' GEMMs over all their rows) in place of the exact one, the
    chunked Gated DeltaNet tree form in place of the exact walk, or the normal tree attention
    in place of the exact one, some case of the slice fails it."""
    import jetspec_kernels as jk
    import torch.nn.functional as F
    from jetspec_kernels.ops import exact as ex

    ref = engines_here()[0]

    def fails(name, seeds):
        for seed in seeds:
            try:
                check_invariance(name, seed, ref)
            except AssertionError:
                return True
        return False

    with monkeypatch.context() as m:
        m.setattr(ex, "linear", lambda x, w, backend=None, tile="narrow", parts=1, partial=False:
                  F.linear(x, w).float() if partial else F.linear(x, w))
        assert fails("exact_linear", range(20))
    from jetspec_kernels.models import moe

    def normal_moe(x, router, gate_up, down, top_k, norm, backend=None, parts=1):
        weights, experts = moe.route(x, router, top_k, norm)
        return moe.grouped_experts(x, weights, experts, gate_up, down, grouped_mm=False)
    with monkeypatch.context() as m:
        m.setattr(moe, "exact_moe", normal_moe)
        assert fails("exact_moe", range(20))
    from jetspec_kernels import python_ref
    from jetspec_kernels.models import hybrid_exact

    def chunked_walk(q, k, v, g, beta, parents, counts, pool, slots, store_last):
        return python_ref.gated_delta_tree_chunked(q, k, v, g, beta, parents, pool, slots, counts,
                                                   scale=1.0, use_qk_l2norm=False)
    with monkeypatch.context() as m:      # the normal (chunked) tree form in place of the walk
        m.setattr(hybrid_exact, "_reference_walk", chunked_walk)
        assert fails("exact_gated_delta", range(20))
    normal = jk.tree_attention
    monkeypatch.setattr(jk, "tree_attention", lambda *a, exact=False, **k: normal(*a, **k))
    assert fails("exact_tree_attention", range(20))
