"""Whether this machine can run the cuda backend on a CUDA device: ``_C`` is built, the driver
supports the CUDA runtime ``_C`` links, and ``_C``'s architectures cover the device (docs/DESIGN.md
section 2). :func:`jetspec_kernels.backend.unavailable_reason` asks :func:`unavailable_reason`."""
from __future__ import annotations

from functools import lru_cache

import torch

__all__ = ["unavailable_reason", "driver_runtime_reason", "cuda_version"]


def unavailable_reason(device: torch.device) -> str | None:
    """Why the cuda backend cannot run on CUDA ``device``, or None when it can."""
    err = module_error() or driver_reason()
    if err:
        return err
    return arch_reason(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=None)
def module_error() -> str | None:
    try:
        from .. import _C  # noqa: F401
    except ImportError as e:
        return ("the CUDA extension jetspec_kernels._C is not built (it is built at install "
                f"time when nvcc is found; import said: {e})")
    return None


def cuda_version(v: int) -> str:
    """``"major.minor"`` of a CUDA version given as 1000 * major + 10 * minor."""
    return f"{v // 1000}.{v % 1000 // 10}"


def driver_runtime_reason(driver: int, runtime: int) -> str | None:
    """Why a CUDA runtime of version ``runtime`` cannot run under a driver that supports CUDA
    ``driver`` (both 1000 * major + 10 * minor, as cudaDriverGetVersion gives them), or None.
    A runtime runs on any driver of its major version or newer (minor version compatibility)."""
    if driver <= 0:
        return "no CUDA driver was found"
    if driver // 1000 < runtime // 1000:
        return (f"the CUDA driver supports CUDA {cuda_version(driver)} but _C links the CUDA "
                f"{cuda_version(runtime)} runtime, which needs a driver for CUDA "
                f"{runtime // 1000}.0 or newer (cudaErrorInsufficientDriver); update the driver, "
                f"or rebuild _C with a CUDA {driver // 1000}.x toolkit")
    return None


@lru_cache(maxsize=None)
def driver_reason() -> str | None:
    from .. import _C
    return driver_runtime_reason(_C.driver_version(), _C.runtime_version())


@lru_cache(maxsize=None)
def arch_reason(index: int) -> str | None:
    from .. import _C
    major, minor = torch.cuda.get_device_capability(index)
    if not _C.supports_arch(major * 10 + minor):
        return (f"_C was built for sm_{_C.built_archs()} but the device is "
                f"sm_{major}{minor} (rebuild with JETSPEC_CUDA_ARCHS)")
    return None
