"""What the cuda backend needs of the machine before it may run: an architecture list that covers
the device (SASS or PTX, CMake's -real / -virtual entries), a driver new enough for the linked CUDA
runtime, and which code an sm_90 device runs (the wgmma kernels only exist in sm_90a code).

Runs on the CPU through the simulated ``_C`` (same bindings.cpp and arch_list.h as the real one).
"""
import shutil

import pytest
import torch

import jetspec_kernels
import jetspec_kernels as jk
from jetspec_kernels import backend as bk
from jetspec_kernels.cuda import availability
from helpers import sim_module

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA simulator needs g++")


@pytest.fixture(scope="module")
def sim():
    return sim_module()


@pytest.mark.parametrize("archs,wgmma,sm90", [
    ("90a,80", True, True), ("90a", True, True), ("80,90a", True, True),
    ("90,80", False, True),    # plain sm_90 code: binaryVersion 90 with an empty wgmma kernel
    ("90a,90", False, True),   # the runtime may pick either sm_90 binary
    ("90f,80", False, True),
    ("80", False, True),       # compute_80 PTX, compiled by the driver for sm_90: mma.sync path
    ("100a,80", False, True), ("", False, False),
    # CMake's -real (SASS only) and -virtual (PTX only) entries
    ("90a-real", True, True), ("90a-real,80-real", True, True), ("90a-virtual,80", True, True),
    ("90a-virtual,90", False, True), ("90-real,80", False, True),
    ("80-real", False, False), ("100a-real,80-real", False, False), ("80-virtual", False, True),
    ("100a", False, False), ("native", False, False), ("90x,80-real", False, False),
])
def test_arch_lists(sim, archs, wgmma, sm90):
    """Which builds run on sm_90 and which hold the wgmma kernels there."""
    assert sim.wgmma_built(archs) is wgmma
    assert sim.supports_arch(90, archs) is sm90


@pytest.mark.parametrize("archs,sm,runs", [
    ("90a,80", 100, True), ("90a,80", 120, True),     # compute_80 PTX is compiled for them
    ("90a-real,80-real", 100, False), ("90a-real,80-real", 86, True), ("90a-real,80-real", 89, True),
    ("80", 86, True), ("86", 80, False), ("90a", 91, False), ("90a,80", 75, False),
    ("100f-real", 103, True), ("100f-real", 110, False), ("100f-virtual", 103, True),
    ("100a-virtual", 103, False), ("100-virtual", 120, True), ("120-real", 121, True),
])
def test_arch_list_devices(sim, archs, sm, runs):
    assert sim.supports_arch(sm, archs) is runs


def test_default_build_runs_on_hopper_and_newer(sim):
    assert sim.built_archs() == "90a,80"
    assert sim.wgmma_built()
    assert all(sim.supports_arch(sm) for sm in (80, 86, 89, 90, 100, 103, 120))
    assert not sim.supports_arch(75)


@pytest.mark.parametrize("driver,runtime,ok", [
    (13000, 13000, True), (13020, 13000, True), (13000, 13020, True),  # minor compatibility
    (14000, 13000, True), (12080, 13000, False), (12040, 12080, True), (11080, 12000, False),
])
def test_driver_runtime_reason(driver, runtime, ok):
    reason = availability.driver_runtime_reason(driver, runtime)
    assert (reason is None) is ok
    if not ok:
        major, minor = divmod(driver, 1000)
        assert f"CUDA {major}.{minor // 10}" in reason and f"CUDA {runtime // 1000}." in reason
    assert "no CUDA driver" in availability.driver_runtime_reason(0, runtime)


@pytest.fixture
def sim_as_C(sim, monkeypatch):
    """The simulated _C installed as jetspec_kernels._C, on a pretend sm_90 device."""
    monkeypatch.setattr(jetspec_kernels, "_C", sim, raising=False)
    monkeypatch.setattr(availability, "module_error", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    for cached in (availability.driver_reason, availability.arch_reason):
        cached.cache_clear()
    yield sim
    for cached in (availability.driver_reason, availability.arch_reason):
        cached.cache_clear()


def test_old_driver_makes_cuda_unavailable(sim_as_C, monkeypatch):
    """R550/R570 drivers (CUDA 12.x) cannot run the CUDA 13 runtime _C links: an explicit cuda
    backend says so with both versions, and auto does not pick it, even for verified ops."""
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {fn: ("cuda",) for fn in bk.INTERFACE_FUNCTIONS})
    assert bk.unavailable_reason("cuda", dev) is None
    assert bk.resolve(dev, "auto") == "cuda"

    monkeypatch.setenv("JETSPEC_SIM_DRIVER_VERSION", "12080")
    availability.driver_reason.cache_clear()
    with pytest.raises(jk.BackendUnavailableError, match=r"driver supports CUDA 12\.8 .*CUDA 13\.0 runtime"):
        bk.resolve(dev, "cuda")
    assert bk.resolve(dev, "auto") == "triton"
    assert "CUDA 12.8" in jk.available_backends(dev)["cuda"]


def test_unbuilt_architecture_is_reported(sim_as_C, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    with pytest.raises(jk.BackendUnavailableError, match=r"built for sm_90a,80 but the device is sm_75"):
        bk.resolve(torch.device("cuda", 0), "cuda")
