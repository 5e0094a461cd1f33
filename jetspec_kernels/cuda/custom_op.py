"""``torch.library.custom_op`` for the cuda wrappers, with an eager fast path.

Called eagerly on plain tensors, a custom op goes through the dispatcher's Python kernels
(autograd, ADInplaceOrView, the backend wrapper and its aliasing check) before it reaches the
implementation: about half of a small op's host time (docs/perf/decode_round.md, "Host time
per eager call"). :func:`custom_op` registers the op exactly as ``torch.library.custom_op`` does (fake
implementation, schema, ``torch.ops.jetspec.*``, opcheck) and returns an object that calls the
implementation directly when nothing but the plain eager path could be involved: not compiling or
tracing, no dispatch or torch-function mode, no tensor subclass, no input needing grad, no
profiler (whose trace names the op). It bumps the version counters of the mutated arguments, as the
dispatcher's ADInplaceOrView kernel does. Every other call goes through the registered op.
"""
from __future__ import annotations

import inspect

import torch

_C = torch._C
# The private torch hooks the fast path asks (torch 2.11 to 2.13 have them all); without one of
# them every call takes the dispatcher.
_HOOKS = ("_len_torch_dispatch_stack", "_is_torch_function_mode_enabled",
          "_are_functorch_transforms_active")
_FAST = all(hasattr(_C, h) for h in _HOOKS) and hasattr(torch.autograd, "_profiler_enabled")
_SCALARS = (type(None), bool, int, float, str)  # (isinstance on torch.Tensor is slow for these)


def eager_fast_path(args) -> bool:
    """Whether a call with ``args`` may skip the dispatcher (see the module docstring)."""
    if not _FAST or torch.compiler.is_compiling():
        return False
    if (_C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()
            or _C._are_functorch_transforms_active() or torch.autograd._profiler_enabled()):
        return False
    grad = _C.is_grad_enabled()
    for a in args:
        kind = type(a)
        if kind is torch.Tensor:
            if grad and a.requires_grad:
                return False
        elif kind not in _SCALARS and isinstance(a, torch.Tensor):   # a subclass
            return False
    return True


class EagerOp:
    """A registered custom op (``.op``) and its implementation (``.impl``); calls take positional
    arguments only, as the wrappers pass them."""

    def __init__(self, op, impl, mutated: tuple[int, ...]):
        self.op, self.impl, self.mutated = op, impl, mutated
        self.register_fake = op.register_fake

    def __call__(self, *args):
        if not eager_fast_path(args):
            return self.op(*args)
        for i in self.mutated:
            if args[i] is not None and not args[i].is_inference():  # those have no version
                torch.autograd.graph.increment_version(args[i])
        return self.impl(*args)


def custom_op(name: str, *, mutates_args: tuple[str, ...]):
    """Decorator: ``torch.library.custom_op(name, mutates_args=...)`` with the eager fast path."""
    def wrap(impl):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(impl)
        params = list(inspect.signature(impl).parameters)
        return EagerOp(op, impl, tuple(params.index(m) for m in mutates_args))
    return wrap
