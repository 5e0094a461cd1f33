"""Test configuration: Triton runs under the interpreter when there is no GPU; `gpu` tests skip."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HAS_CUDA = torch.cuda.is_available()
# Under pytest-xdist (make test), one intra-op thread per worker: the workers already share the
# cores, and two OpenMP pools spinning on each core slowed some tests several times over.
if os.environ.get("PYTEST_XDIST_WORKER") and not HAS_CUDA:
    torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--gpu-only", action="store_true",
                     help="run only the tests marked gpu (also through a fixture parameter, which "
                          "-m gpu does not see)")
    parser.addoption("--on-gpu", action="store_true",
                     help="run only the tests whose tensors are on the GPU when one is there: the "
                          "gpu-marked ones and every triton case (a backend or engine parameter "
                          "'triton', or a tests/test_triton_*.py file); device_check.sh runs these")
    parser.addoption("--tma", choices=("all", "only", "skip"), default="all",
                     help="tests of the TMA kernels (whose name, parameter ids included, says "
                          "tma or hopper): all, only, or skip (device_check.sh runs them in a "
                          "process of their own)")


def on_gpu(item) -> bool:
    """Whether a test's tensors are on the GPU when one is there: gpu-marked, or a triton case
    (Triton tests use CUDA tensors whenever CUDA is available)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    triton = any(params.get(k) == "triton" for k in ("backend", "engine"))
    return "gpu" in item.keywords or triton or item.path.name.startswith("test_triton")


def pytest_collection_modifyitems(config, items):
    gpu_only, tma = config.getoption("--gpu-only"), config.getoption("--tma")
    gpu_side = config.getoption("--on-gpu")
    if gpu_only or gpu_side or tma != "all":
        keep, drop = [], []
        for item in items:
            ok = (not gpu_only or "gpu" in item.keywords) and (not gpu_side or on_gpu(item))
            if tma != "all":
                tma_kernel = "tma" in item.name or "hopper" in item.name
                ok = ok and (tma_kernel == (tma == "only"))
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
    import json
    params = getattr(getattr(item, "callspec", None), "params", {})
    entry = {"nodeid": item.nodeid, "file": str(item.path), "test": item.originalname,
             "params": {k: str(v) for k, v in params.items()}, "outcome": report.outcome}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


@pytest.fixture
def reference_backend():
    """Pin the default backend to `reference` (under TRITON_INTERPRET=1, `auto` picks triton)."""
    import jetspec_kernels as jk

    prev = jk.get_backend()
    jk.set_backend("reference")
    yield
    jk.set_backend(prev)
