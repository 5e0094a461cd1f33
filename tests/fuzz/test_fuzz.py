"""The differential fuzzer's deterministic slice (in ``make test``) and the cases it found.

Every public op, on every engine here (reference, triton under the interpreter, the cuda kernels
in the simulator; cuda and triton on a GPU), against python_ref: fuzz_cases.py draws the inputs,
fuzz_check.py compares. ``make fuzz`` (tests/fuzz/run.py) runs many more seeds for minutes and
prints a replay command for every failure; a failure it finds becomes a line of REGRESSIONS.
"""
import pytest

from fuzz_cases import OPS
from fuzz_check import check
from fuzz_engines import engines_here

# Seeds per op in make test: about 60 s on the 2-core CPU machine for all engines.
SLICE_SEEDS = 8

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
