"""Host-side cost of each public op per call (argument checks, backend resolution, output
allocation, result wrapping), timed with pytest-benchmark on small CPU tensors.

The backend kernels are replaced by a stub that returns outputs computed beforehand, so the times
are the Python overhead alone. The calls, the stub and the inputs are those of
``tests/test_op_dispatch.py`` (which asserts that each op returns its kernels' outputs); each case
runs with value checks on (the CPU default) and off (``set_value_checks("never")``, what CUDA
tensors get by default). Not part of ``make test``. Run from the repository root:

    python -m pytest bench/host_overhead.py --benchmark-only

(pytest collects this file because it is named on the command line; it is not a ``bench_*.py``
table script, see bench/common.py.)
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_op_dispatch import CASES, inputs, stub, value_checks  # noqa: E402,F401 (fixtures)


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
@pytest.mark.parametrize("name", CASES)
def test_host_overhead(benchmark, name, stub, inputs, value_checks):
    case = CASES[name](inputs, stub)
    case.check(benchmark(case.call))
    assert {fn for _, fn in stub.calls} == set(case.kernels), "timed something else than the op"
