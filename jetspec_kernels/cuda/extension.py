"""How the cuda backend wrappers call the ``_C`` extension: the module, its enums and limits, the
device and stream a launch runs on, and Python values as its arguments (pointers, strides, dtype
codes, alignment)."""
from __future__ import annotations

import sys

import torch

from ..backend_error import BackendUnavailableError
from ..device_guard import cuda_device_guard, current_cuda_device


_PACKAGE = __name__.rsplit(".", 2)[0]


def module():
    """The ``_C`` module, imported on first use (the package imports without it). Read from the
    package on every call (tests swap in the simulated kernels), without the import machinery."""
    c = getattr(sys.modules[_PACKAGE], "_C", None)
    if c is None:
        from .. import _C as c
    return c


def enum(name: str) -> dict[str, int]:
    """``_C.ENUMS[name]``: the codes of a limits.h enum by their Python names."""
    return module().ENUMS[name]


def limit(name: str):
    """``_C.LIMITS[name]``: a number (or tuple) of csrc/include/jetspec/limits.h."""
    return module().LIMITS[name]


# The raw stream handle without a torch.cuda.Stream object (what inductor's generated code
# calls); the public path where a torch build lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# Context that makes a CUDA device current, entered around every _C call with the tensors'
# device (``ext.on_device(q.device)``): _C launches on the current device's stream and sizes its
# launch plans for the current device. A do-nothing context for a CPU device or the current one.
on_device = cuda_device_guard


def stream() -> int:
    """Raw handle of the current CUDA stream (what _C launches on; inside :data:`on_device`)."""
    if _raw_stream is None:
        return torch.cuda.current_stream().cuda_stream
    return _raw_stream(current_cuda_device())


_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in (torch.float32, torch.float16,
                                                            torch.bfloat16)}


def dtype_code(t: torch.Tensor) -> int:
    """jetspec::DType code of ``t``'s dtype."""
    name = _DTYPE_NAMES.get(t.dtype) or str(t.dtype).removeprefix("torch.")
    return enum("DType")[name]


def ptr(t: torch.Tensor | None) -> int:
    """Device pointer of ``t`` (0 for None, which the kernels read as "absent")."""
    return 0 if t is None else t.data_ptr()


def strides3(t: torch.Tensor) -> list[int]:
    """Strides (elements) of dims 0..2 of a 4-d tensor whose dim 3 is contiguous."""
    return list(t.stride()[:3])


def aligned16(t: torch.Tensor) -> bool:
    """Whether every row of the last dim starts on a 16-byte boundary (cp.async needs it)."""
    per = 16 // t.element_size()
    return t.data_ptr() % 16 == 0 and not any(map(per.__rmod__, t.stride()[:-1]))


def workspaces(device, *nbytes: int) -> tuple[torch.Tensor, list[int]]:
    """Scratch space of ``nbytes[i]`` bytes each in one uninitialised allocation (one
    caching-allocator call, not one per workspace: host time), each part on a 16-byte boundary:
    (the buffer, to keep alive until the launches are queued; each part's device address).
    For workspaces only: a launch needs their addresses, nobody sees them as tensors."""
    offsets, at = [], 0
    for size in nbytes:
        offsets.append(at)
        at += -(-size // 16) * 16
    buf = torch.empty(at, dtype=torch.uint8, device=device)
    return buf, list(map(buf.data_ptr().__add__, offsets))


def unavailable(what: str) -> BackendUnavailableError:
    return BackendUnavailableError(f"backend 'cuda' is not available: {what}")


def require(reason: str | None) -> None:
    """Raise :func:`unavailable` for a ``supports`` answer that is not None (direct calls)."""
    if reason is not None:
        raise unavailable(reason)
