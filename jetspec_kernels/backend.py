"""Backend selection: ``auto``, ``cuda``, ``triton``, ``reference``.

Order of precedence: the ``backend=`` argument of an op, then :func:`set_backend`, then the
``JETSPEC_BACKEND`` environment variable, then ``auto``. For CUDA tensors ``auto`` tries, per
interface function, the backends listed for it in :data:`HARDWARE_VERIFIED` (they passed its
parity tests on a GPU in a recorded run; fastest first), then ``triton``, then ``reference``; an
unlisted ``cuda`` is never auto's choice, and ``cuda`` only runs when ``_C`` is built for the
device and the driver can run its CUDA runtime. For CPU tensors ``reference``, or ``triton``
first when ``TRITON_INTERPRET=1``. An op whose inputs a candidate cannot take (a dtype, a head
dim, a kernel not written yet) goes to the next one. An explicitly requested backend that cannot
run raises :class:`BackendUnavailableError` with the reason; an explicit choice never falls back.
"""
from __future__ import annotations

import functools
import json
import operator
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch

from .backend_error import BackendUnavailableError
from .device_guard import cuda_device_guard

BACKENDS = ("auto", "cuda", "triton", "reference")



# What the hardware record may trust.
GPU_BACKENDS = ("cuda", "triton")

# The record of GPU parity runs, one row per op x backend x dtype, and per op the backends auto
# trusts (package data; bench/README.md, "The hardware record", has its rules).
HARDWARE_RECORD = Path(__file__).with_name("hardware_record.json")


def _trusted_backends(path: Path) -> dict[str, tuple[str, ...]]:
    """Interface function -> the backends ``path``'s ``trusted`` lists for it, in its order."""
    try:
        trusted = json.loads(path.read_text())["trusted"]
        out = {fn: tuple(entry["backends"]) for fn, entry in trusted.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"hardware record {path}: unreadable ({type(e).__name__}: {e})") from e
    for fn, backends in out.items():
        if not backends or not set(backends) <= set(GPU_BACKENDS) or len(set(backends)) != len(backends):
            raise ValueError(f"hardware record {path}: trusted {fn!r} must list distinct backends of "
                             f"{GPU_BACKENDS}, got {list(backends)}")
    return out


# Per interface function (CONTRIBUTING.md, backend interface): the backends whose kernels passed
# its parity tests on real hardware in a recorded run (bench/device_check.sh, HARDWARE_RECORD),
# fastest first in that run's benches. ``auto`` tries them in this order for CUDA tensors, then
# triton (its choice where no backend is listed: what users got before any hardware evidence),
# then reference. A cuda kernel that is not listed is never auto's choice; ``backend="cuda"``
# still runs it. An op x backend joins the record's ``trusted`` in the commit that records its
# passing run; which run put each there, and why the others are not: the rows' notes.
HARDWARE_VERIFIED: dict[str, tuple[str, ...]] = _trusted_backends(HARDWARE_RECORD)

INTERFACE_FUNCTIONS = ("tree_attention", "log_softmax_topk", "hidden_topk", "build_tree",
                       "draft_tree", "qk_norm_rope_append", "verify_tree", "commit_kv", "pack_mask",
                       "rms_norm", "silu_mul", "gated_delta_tree", "gated_delta_commit",
                       "causal_conv1d_tree", "causal_conv1d_commit")
# Interface functions that chain others in one backend call (the same kernels in fewer host
# steps): a backend is verified for one where it is verified for every
# function of its chain, so auto sends a chain where every function of it may go (one backend
# runs all of them). A chain has no rows of its own in the hardware record and no entry in
# HARDWARE_VERIFIED.
CHAINS: dict[str, tuple[str, ...]] = {"draft_tree": ("log_softmax_topk", "build_tree")}
# Interface functions a backend may lack, and the backends that lack them (tests/test_backend.py
# checks this against the backend modules): draft_tree_from_hidden then takes its "gemm" method
# (torch's GEMM, then the backend's log_softmax_topk). The cuda backend has no hidden_topk: its
# mma.sync kernel lost to Triton's on the H200 and was deleted (docs/perf/hidden_topk.md).
# The Gated DeltaNet tree ops have no cuda kernel (docs/perf/gated_delta_tree.md).
# The Gated DeltaNet conv ops have no cuda kernel either (a Triton program a node and channel
# block reads W inputs a channel: nothing for a hand-written kernel to win).
OPTIONAL_FUNCTIONS: dict[str, tuple[str, ...]] = {"hidden_topk": ("cuda",),
                                                  "gated_delta_tree": ("cuda",),
                                                  "gated_delta_commit": ("cuda",),
                                                  "causal_conv1d_tree": ("cuda",),
                                                  "causal_conv1d_commit": ("cuda",)}

# Interface functions whose work the models ran as torch ops before the function existed: on CUDA
# tensors ``auto`` keeps them on those ops (the reference backend) until a GPU backend is listed in
# HARDWARE_VERIFIED, rather than trading hardware-proven torch ops for an unverified kernel. The
# Gated DeltaNet tree and conv ops too: their references are torch ops without host reads (the
# chunked form, the conv's gathers: a CUDA graph holds them) and no GPU kernel of theirs has run
# on a GPU.
REFERENCE_UNTIL_VERIFIED = ("rms_norm", "silu_mul", "gated_delta_tree", "gated_delta_commit",
                            "causal_conv1d_tree", "causal_conv1d_commit")


def _check_name(name: str, argname: str = "backend") -> str:
    if not isinstance(name, str) or name.lower() not in BACKENDS:
        raise ValueError(f"{argname} must be one of {BACKENDS}, got {name!r}")
    return name.lower()


_current = _check_name(os.environ.get("JETSPEC_BACKEND", "auto"), "JETSPEC_BACKEND")


def set_backend(name: str) -> None:
    """Set the process-wide default backend (``auto``, ``cuda``, ``triton`` or ``reference``)."""
    global _current
    _current = _check_name(name)


def get_backend() -> str:
    """The process-wide default backend name."""
    return _current


def _load_reference():
    import jetspec_kernels.ops._reference as reference   # the backends' own, not the ops'
    return reference


def _load_triton():
    from . import triton
    return triton


def _load_cuda():
    from . import cuda
    return cuda


def _load_cuda_availability():
    from .cuda import availability
    return availability


# Each backend by name, and "cuda.availability" (what the cuda backend needs of the machine: _C,
# driver, architectures): imported on first use, so the package imports without triton or _C.
_LOADERS: dict[str, Callable[[], Any]] = {"reference": _load_reference, "triton": _load_triton,
                                          "cuda": _load_cuda,
                                          "cuda.availability": _load_cuda_availability}
_LOADED: dict[str, Any] = {}


def _module(name: str):
    """What ``_LOADERS[name]`` loads, on first use (a dict lookup after that: ops ask on every
    call)."""
    return _LOADED.get(name) or _load(name)


def _load(name: str):
    # While torch.compile traces, _loaded_module_name runs as it is (a constant to the compiler)
    # and the module is read as an attribute of its package: the compiler's copy of _LOADED
    # predates the load.
    package, _, child = _loaded_module_name(name).rpartition(".")
    return getattr(sys.modules[package], child)


@torch.compiler.assume_constant_result
def _loaded_module_name(name: str) -> str:
    module = _LOADED[name] = _LOADERS[name]()
    return module.__name__


def triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@lru_cache(maxsize=None)
def _triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return f"triton is not importable ({e})"
    return None


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why backend ``name`` cannot run on ``device``, or None when it can."""
    if name == "reference":
        return None
    if name == "triton":
        err = _triton_import_error()
        if err:
            return err
        if device.type == "cpu" and not triton_interpret():
            return "CPU tensors need TRITON_INTERPRET=1 (the Triton interpreter)"
        if device.type not in ("cpu", "cuda"):
            return f"device type {device.type!r} is not supported"
        return None
    if name == "cuda":
        if device.type != "cuda":
            return f"tensors are on {device.type}, the cuda backend needs CUDA tensors"
        return _module("cuda.availability").unavailable_reason(device)
    raise ValueError(f"unknown backend {name!r}")


def verified_backends(fn: str | None) -> tuple[str, ...]:
    """The backends that passed interface function ``fn``'s parity tests on hardware, fastest first
    (``HARDWARE_VERIFIED``; for a chain, ``CHAINS``, those of every function of the chain, in the
    order of the first); ``fn`` None: those listed for every interface function, in the order of
    the first."""
    if fn is not None and fn not in CHAINS:
        return tuple(HARDWARE_VERIFIED.get(fn, ()))
    first, *rest = map(verified_backends, CHAINS[fn] if fn is not None else INTERFACE_FUNCTIONS)
    return tuple(b for b in first if all(b in other for other in rest))


def hardware_verified(name: str, fn: str | None) -> bool:
    """Whether ``auto`` may pick backend ``name`` for interface function ``fn`` on a CUDA device
    (``fn`` None: for every interface function but those in ``REFERENCE_UNTIL_VERIFIED``, which
    :func:`resolve` then does not describe). The cuda backend is gated, and both GPU backends for
    the functions in ``REFERENCE_UNTIL_VERIFIED``; elsewhere triton is auto's choice where no
    backend has passed on hardware."""
    held = any(f in REFERENCE_UNTIL_VERIFIED for f in CHAINS.get(fn, (fn,)))  # a chain: any part
    if name == "reference" or (name == "triton" and not held):
        return True
    return name in verified_backends(fn)


# fn -> (the tables it was worked out from, auto's candidates on CUDA): select runs on every op
# call. The tables are constants, replaced whole when changed (tests: monkeypatch.setattr), so
# the entry is valid while they are the same objects (held here, so no other object takes their
# ids).
_CUDA_CANDIDATES: dict = {}


def _auto_candidates(device: torch.device, fn: str | None = None) -> tuple[str, ...]:
    if device.type == "cuda":
        tables = (HARDWARE_VERIFIED, REFERENCE_UNTIL_VERIFIED, CHAINS)
        hit = _CUDA_CANDIDATES.get(fn)
        if hit is not None and all(map(operator.is_, hit[0], tables)):
            return hit[1]
        order = verified_backends(fn) + ("triton", "reference")
        found = tuple(dict.fromkeys(c for c in order if hardware_verified(c, fn)))
        _CUDA_CANDIDATES[fn] = (tables, found)
        return found
    if triton_interpret():
        return ("triton", "reference")
    return ("reference",)


def resolve(device: torch.device, backend: str | None = None, fn: str | None = None) -> str:
    """The backend that ops on ``device`` use first: for interface function ``fn``, or for every
    op but those in ``REFERENCE_UNTIL_VERIFIED`` when ``fn`` is None (``auto`` may still pass an
    op it cannot take to the next backend; see :func:`select`)."""
    name = _current if backend is None else _check_name(backend)
    if name == "auto":
        for cand in _auto_candidates(device, fn):
            if unavailable_reason(cand, device) is None:
                return cand
        return "reference"
    reason = unavailable_reason(name, device)
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
    return name


def kernel(name: str, fn: str):
    """The function ``fn`` of backend ``name`` (see CONTRIBUTING.md, backend interface)."""
    impl = getattr(_module(name), fn, None)
    if impl is None:
        why = (f"it has no {fn} (an optional interface function)" if not implements(name, fn)
               else f"it does not implement {fn} yet")
        raise BackendUnavailableError(f"backend {name!r} is not available: {why}")
    return impl


def implements(backend: str | None, fn: str) -> bool:
    """Whether ``backend`` (None: the process default; "auto": always, its candidates include the
    reference) has interface function ``fn`` (``OPTIONAL_FUNCTIONS``; imports nothing, so a
    backend that cannot load still answers, and :func:`select` says why it cannot run); a bad name
    is a ValueError naming ``backend``."""
    name = _current if backend is None else _check_name(backend)
    return name not in OPTIONAL_FUNCTIONS.get(fn, ())


def supports(name: str, fn: str, **call) -> str | None:
    """Why backend ``name`` cannot run interface function ``fn`` with these arguments (passed by
    name), or None when it can: the backend module's own ``supports(fn, **call)``; a backend
    without one takes every validated call."""
    check = getattr(_module(name), "supports", None)
    return None if check is None else check(fn, **call)


def select(device: torch.device, fn: str, backend: str | None = None,
           call: dict[str, Any] | None = None):
    """The implementation of interface function ``fn`` for tensors on ``device``.

    ``call`` holds the call's arguments by name: each candidate is asked whether it
    :func:`supports` them. ``auto`` takes the first candidate that can run the call; an explicit
    backend that cannot raises :class:`BackendUnavailableError` with the reason.
    """
    name = _current if backend is None else _check_name(backend)
    candidates = _auto_candidates(device, fn) if name == "auto" else (name,)
    reasons = []
    for cand in candidates:
        reason = unavailable_reason(cand, device)
        if reason is None and call is not None:
            reason = supports(cand, fn, **call)
        if reason is None:
            try:
                impl = kernel(cand, fn)
            except BackendUnavailableError as e:
                reasons.append(str(e))
                continue
            return _on_device(impl, device) if cand == "triton" and device.type == "cuda" else impl
        reasons.append(f"backend {cand!r} is not available: {reason}")
    raise BackendUnavailableError("; ".join(reasons))


@lru_cache(maxsize=256)
def _on_device(impl: Callable, device: torch.device) -> Callable:
    """``impl`` run with ``device`` current (``device_guard.cuda_device_guard``): Triton launches
    on the current CUDA device, not the tensors' one. (The cuda backend's ops set the device
    themselves, also when called as ``torch.ops.jetspec.*``.) One wrapper per (impl, device), not
    one per call."""
    @functools.wraps(impl)
    def run(*args, **kwargs):
        with cuda_device_guard(device):
            return impl(*args, **kwargs)
    return run


def _why_picked(name: str, fn: str, device: torch.device) -> str:
    if device.type != "cuda":
        return ("TRITON_INTERPRET=1: the Triton kernels under the interpreter" if name == "triton"
                else "tensors off CUDA run the reference (torch ops)")
    if name in verified_backends(fn):
        return "passed its parity tests on hardware (the hardware record), fastest of those"
    if name == "triton":
        return "the hardware record lists no backend for it (passed and fastest); triton until it does"
    if any(f in REFERENCE_UNTIL_VERIFIED for f in CHAINS.get(fn, (fn,))):
        return "kept on the torch ops until a GPU kernel of it passes on hardware"
    return "no GPU backend can run here"


def auto_choice(fn: str, device: str | torch.device, *, machine: bool = True) -> tuple[str, str]:
    """The backend ``auto`` tries first for interface function ``fn`` on ``device``, and why:
    ``(name, reason)``, the reason naming each candidate passed over. ``machine=False`` judges by
    the tables alone, as on a machine where every backend loads (what ``jetspec info`` shows for
    CUDA tensors where there is no GPU). A call the pick cannot take (a dtype, a head dim) still
    goes on to the next candidate (:func:`select`)."""
    if fn not in INTERFACE_FUNCTIONS:
        raise ValueError(f"fn must be one of {INTERFACE_FUNCTIONS}, got {fn!r}")
    device = torch.device(device)
    passed = []
    for cand in _auto_candidates(device, fn):
        why_not = unavailable_reason(cand, device) if machine else None
        if why_not is None and not implements(cand, fn):
            why_not = f"it has no {fn}"
        if why_not is not None:
            passed.append(f"{cand}: {why_not}")
            continue
        why = _why_picked(cand, fn, device)
        return cand, why + (f" (passed over {'; '.join(passed)})" if passed else "")
    raise AssertionError("the reference backend is every list's last candidate")


def available_backends(device: str | torch.device = "cpu") -> dict[str, str | None]:
    """Map each concrete backend to None (usable on ``device``) or the reason it is not."""
    device = torch.device(device)
    return {name: unavailable_reason(name, device) for name in BACKENDS[1:]}
