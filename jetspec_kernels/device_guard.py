"""The CUDA device guard: make a tensor's CUDA device current around a launch (launches go to the
current device, which need not be the tensors' one in a process driving several GPUs). Below the
backend choice and the backends alike: both enter it (triton kernels through ``backend.select``,
the cuda backend's wrappers through ``cuda/extension.on_device``)."""
from __future__ import annotations

import contextlib

import torch

# The current CUDA device's index without torch.cuda.current_device()'s lazy-init check (asked
# only with CUDA tensors in hand); the public function where a torch build lacks it.
current_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_NO_SWITCH = contextlib.nullcontext()


def cuda_device_guard(device: torch.device):
    """Context that makes CUDA ``device`` current: nothing to do when it is current already, the
    usual case (the guard's host time saved), or when ``device`` is not a CUDA device with an
    index. While torch.compile traces, always ``torch.cuda.device``: dynamo folds it, not the C
    device query."""
    if device.type != "cuda" or device.index is None or (
            not torch.compiler.is_compiling() and current_cuda_device() == device.index):
        return _NO_SWITCH
    return torch.cuda.device(device)
