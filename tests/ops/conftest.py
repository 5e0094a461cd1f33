"""The op tests' backend switch: each test names its backends with ``helpers.backends``."""
from typing import NamedTuple

import pytest

from helpers import DEV, use_sim_backend


class Backend(NamedTuple):
    name: str    # reference, triton, sim (the CUDA kernels simulated on the CPU) or cuda
    device: str  # the device of the test's tensors


@pytest.fixture
def backend(request, monkeypatch):
    """The backend under test: sim installs the simulated kernels as _C for CPU tensors (and lets
    the public ops' ``backend="cuda"`` take CPU tensors); cuda (gpu-marked by
    ``helpers.backends``) uses the GPU; reference and triton use helpers.DEV."""
    name = request.param
    if name == "sim":
        use_sim_backend(monkeypatch)
        return Backend(name, "cpu")
    return Backend(name, "cuda" if name == "cuda" else DEV)


@pytest.fixture
def dev(backend):
    """The device of the test tensors ("cpu" for the simulator)."""
    return backend.device
