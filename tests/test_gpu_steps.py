"""The GPU steps of bench/device_check.sh (triton, cuda, hopper: tests/conftest.py's --gpu-step)
split the tests that need a GPU between them: every triton case of every op lands in one, each
test in exactly one, and only the Hopper attention family's tests in the hopper step's process."""
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from gpu_step_rules import GPU_STEPS, names_hopper_kernel

ROOT = Path(__file__).resolve().parents[1]
# Where the op tests run triton cases (the fuzz tests' random shapes are left out on purpose).
OP_TESTS = ("tests/ops", "tests/test_engine_layouts.py")


# Prints "nodeid<TAB>step<TAB>gpu-marked" for every test collected (tests/conftest.py's gpu_step).
REPORT = """
import sys, pytest
class Report:
    def pytest_collection_finish(self, session):
        mod = next(p for p in session.config.pluginmanager.get_plugins() if hasattr(p, "gpu_step"))
        for item in session.items:
            print("STEP", item.nodeid, mod.gpu_step(item), "gpu" in item.keywords, sep="\\t")
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]],
                     plugins=[Report()]))
"""


def _run(*args: str) -> str:
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode in (0, 5), res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


@lru_cache(maxsize=None)
def steps() -> dict[str, tuple[str, bool]]:
    """Every test of OP_TESTS -> (the GPU step gpu_step gives it, or "None"; gpu-marked), from one
    collection in a subprocess (this session's own options must not leak in)."""
    out = _run("-c", REPORT, *OP_TESTS)
    rows = [line.split("\t")[1:] for line in out.splitlines() if line.startswith("STEP\t")]
    return {nodeid: (step, gpu == "True") for nodeid, step, gpu in rows}


@lru_cache(maxsize=None)
def collect(*options: str) -> frozenset[str]:
    """Node ids pytest collects from OP_TESTS with ``options``."""
    out = _run("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options, *OP_TESTS)
    return frozenset(line for line in out.splitlines() if "::" in line)


def in_step(step: str) -> set[str]:
    return {n for n, (s, _) in steps().items() if s == step}


def param_words(nodeid: str) -> set[str]:
    ids = nodeid.partition("[")[2].rstrip("]")
    return set(ids.split("-")) if ids else set()


@pytest.mark.parametrize("name, hopper", [
    ("test_log_softmax_topk_many_chunks[cuda]", False),
    ("test_opcheck_hopper[16-cuda]", True),
    ("test_tree_attention[dtype0-128-2-37-8-2-mask-False-1-hopper-cuda]", True),
    ("test_hopper_one_hot_probe[small-cuda]", True),
    ("test_tree_attention[dtype0-128-2-37-8-2-mask-False-1-wgmma-cuda]", False),
    ("test_HOPPER_upper[x]", True),
    ("test_tmax_and_hoppers[cuda]", False),
    ("test_grasshopper_stomach[mma]", False),
])
def test_names_hopper_kernel_matches_the_word(name, hopper):
    assert names_hopper_kernel(name) is hopper


def test_the_option_selects_the_step():
    """--gpu-step selects exactly the tests gpu_step gives that step (and --on-gpu their union)."""
    assert collect("--gpu-step", "triton") == in_step("triton")
    assert collect("--on-gpu") == set().union(*map(in_step, GPU_STEPS))


def test_every_triton_case_runs_in_the_triton_step():
    """Each op test with a triton parameter (its own id) is in the triton step, and the triton
    step holds nothing else; the log_softmax_topk cases (whose name holds "tma") among them."""
    triton = {n for n in steps() if "triton" in param_words(n)}
    assert {n for n in triton if "log_softmax_topk" in n}, "no triton log_softmax_topk case?"
    assert triton == in_step("triton")


def test_hopper_step_holds_only_hopper_kernel_tests_and_all_of_them():
    hopper = in_step("hopper")
    assert hopper and all(re.search(r"(^|[^a-z])hopper([^a-z]|$)", n.split("::")[-1])
                          for n in hopper)
    cuda_hopper = {n for n, (_, gpu) in steps().items() if gpu
                   and "hopper" in re.split(r"[^a-z0-9]+", n.split("::")[-1])
                   and "sim" not in param_words(n) and "triton" not in param_words(n)}
    assert cuda_hopper == hopper


def test_every_gpu_marked_test_but_the_simulators_is_in_a_step():
    """A gpu-marked test is in some step, unless it runs the CUDA simulator (a CPU build,
    gpu-marked for its size); the cuda step holds the rest of the gpu-marked tests."""
    marked = {n for n, (_, gpu) in steps().items() if gpu}
    sim = {n for n in marked if "sim" in param_words(n)}
    assert sim, "no gpu-marked simulator case left to check"
    assert all(steps()[n][0] == "None" for n in sim)
    assert all(steps()[n][0] in GPU_STEPS for n in marked - sim)
    assert in_step("cuda") and all(steps()[n][1] for n in in_step("cuda"))


def test_offline_sm90_compiles_are_in_no_step():
    out = _run("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--on-gpu",
               "tests/test_triton_sm90_resources.py")
    assert "::" not in out and "5 deselected" in out, out[-1000:]


def test_crash_entry_names_backend_and_kernel():
    from gpu_step_rules import crash_entry

    e = crash_entry("tests/ops/test_tree_attention.py::test_tree_attention[dtype0-128-1-hopper-cuda]",
                    ROOT)
    assert e["params"] == {"backend": "cuda", "kernel": "hopper"} and e["outcome"] == "failed"
    assert e["test"] == "test_tree_attention"
    assert e["file"] == str(ROOT / "tests/ops/test_tree_attention.py")
    from bench import hardware_record as hr
    assert hr.classify(e) == ("tree_attention", "cuda kernel=hopper", ["-"])
    assert crash_entry("tests/test_x.py::test_y", ROOT)["params"] == {}


def test_a_crashed_worker_is_recorded_failed_and_the_rest_still_run(tmp_path):
    """Under xdist, a test that kills its worker (as pytest-timeout's thread method does) is a
    failed line of the hardware record, and the tests after it run on a new worker."""
    import json
    import os

    pytest.importorskip("xdist")
    case = tmp_path / "test_crashing.py"
    case.write_text("import os\nimport pytest\n\n"
                    "@pytest.mark.parametrize('backend', ['triton'])\n"
                    "def test_dies(backend):\n    os._exit(3)\n\n"
                    "@pytest.mark.parametrize('n', range(3))\n"
                    "def test_after(n):\n    pass\n")
    record = tmp_path / "record.jsonl"
    # the inner run's controller must not look like a worker of the outer run (make test's -n 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(JETSPEC_HW_RECORD=str(record),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "conftest", "-n", "1", "--max-worker-restart", "4", str(case)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 3 passed" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    crashed = [e for e in lines if e.get("crashed")]
    assert len(crashed) == 1 and crashed[0]["params"] == {"backend": "triton"}
    assert crashed[0]["test"] == "test_dies" and crashed[0]["outcome"] == "failed"
    assert sum(e["outcome"] == "passed" for e in lines) == 3
