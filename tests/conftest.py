"""Test configuration: Triton runs under the interpreter when there is no GPU; `gpu` tests skip."""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from gpu_step_rules import GPU_STEPS, crash_entry, names_hopper_kernel  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HAS_CUDA = torch.cuda.is_available()
# Under pytest-xdist (make test), one intra-op thread per worker: the workers already share the
# cores, and two OpenMP pools spinning on each core slowed some tests several times over.
if os.environ.get("PYTEST_XDIST_WORKER") and not HAS_CUDA:
    torch.set_num_threads(1)


# Files whose triton tests compile for sm_90a offline, a GPU or not (bench/triton_resources.py).
OFFLINE_FILES = {"test_triton_sm90_resources.py"}


def pytest_addoption(parser):
    parser.addoption("--gpu-only", action="store_true",
                     help="run only the tests marked gpu (also through a fixture parameter, which "
                          "-m gpu does not see)")
    parser.addoption("--on-gpu", action="store_true",
                     help="run only the tests that need the GPU when one is there: the gpu-marked "
                          "ones and every triton case (a backend or engine parameter 'triton'), "
                          "less those that need none (offline sm_90a compiles, simulator cases)")
    parser.addoption("--gpu-step", choices=GPU_STEPS, default=None,
                     help="run only one of the GPU steps device_check.sh runs, which split the "
                          "--on-gpu tests between them: triton (the triton cases), cuda (the "
                          "other gpu-marked tests) or hopper (the Hopper attention family's tests)")
    parser.addoption("--hopper", choices=("all", "only", "skip"), default="all",
                     help="tests of the Hopper attention family (whose name, parameter ids "
                          "included, has the word hopper): all, only, or skip (device_check.sh "
                          "runs them in a process of their own)")


def _engine(item) -> set[str]:
    """The backend names a test is parametrised over (``backend``, ``engine`` or a parameter named
    ``*_backend``; the fuzz tests' Engine objects are not names: their random shapes would
    recompile Triton for every case, so no GPU step runs them)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return {v for k, v in params.items()
            if (k in ("backend", "engine") or k.endswith("_backend")) and isinstance(v, str)}


def on_gpu(item) -> bool:
    """Whether a test needs the GPU when one is there: gpu-marked, or a triton case (Triton tests
    use CUDA tensors whenever CUDA is available); not the offline sm_90a compiles nor a case of
    the CUDA simulator (a CPU build, even where the test is gpu-marked for its size)."""
    engine = _engine(item)
    if item.path.name in OFFLINE_FILES or "sim" in engine:
        return False
    return "gpu" in item.keywords or "triton" in engine


def gpu_step(item) -> str | None:
    """The GPU step of device_check.sh that runs ``item`` (one of GPU_STEPS), or None when the
    test needs no GPU. Every on_gpu test gets exactly one step."""
    if not on_gpu(item):
        return None
    if "triton" in _engine(item):       # whatever its other parameters say, no cuda kernel runs
        return "triton"
    return "hopper" if names_hopper_kernel(item.name) else "cuda"


def pytest_collection_modifyitems(config, items):
    gpu_only, hopper = config.getoption("--gpu-only"), config.getoption("--hopper")
    gpu_side, step = config.getoption("--on-gpu"), config.getoption("--gpu-step")
    if gpu_only or gpu_side or step or hopper != "all":
        keep, drop = [], []
        for item in items:
            ok = (not gpu_only or "gpu" in item.keywords) and (not gpu_side or on_gpu(item))
            ok = ok and (step is None or gpu_step(item) == step)
            if hopper != "all":
                ok = ok and (names_hopper_kernel(item.name) == (hopper == "only"))
            (keep if ok else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With JETSPEC_HW_RECORD set, append each test's outcome and parameters to that file (one
    JSON line; bench/hardware_record.py turns a GPU run's lines into the hardware record)."""
    report = (yield).get_result()
    path = os.environ.get("JETSPEC_HW_RECORD")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    if report.when == "teardown" and report.outcome == "skipped":
        return
    params = getattr(getattr(item, "callspec", None), "params", {})
    _record(path, {"nodeid": item.nodeid, "file": str(item.path), "test": item.originalname,
                   "params": {k: str(v) for k, v in params.items()}, "outcome": report.outcome})


def _record(path: str, entry: dict) -> None:
    import json
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def pytest_runtest_logreport(report):
    """With JETSPEC_HW_RECORD set, record a test whose worker crashed as failed: xdist reports it
    on the controller (when "???"), and the worker that would have recorded it is gone."""
    path = os.environ.get("JETSPEC_HW_RECORD")
    if path and report.when == "???" and not os.environ.get("PYTEST_XDIST_WORKER"):
        _record(path, crash_entry(report.nodeid, Path(__file__).resolve().parents[1]))


@pytest.fixture
def reference_backend():
    """Pin the default backend to `reference` (under TRITON_INTERPRET=1, `auto` picks triton)."""
    import jetspec_kernels as jk

    prev = jk.get_backend()
    jk.set_backend("reference")
    yield
    jk.set_backend(prev)
