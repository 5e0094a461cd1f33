"""Where the fuzzer runs an op: the backends this machine has, set up for the public API.

An engine is a backend name for ``backend=`` and the device of its tensors: ``reference`` and
``triton`` (under TRITON_INTERPRET=1 on a CPU), ``sim`` (the csrc kernels in tests/cuda_sim behind
``backend="cuda"`` on CPU tensors) and, with a GPU, ``cuda`` and ``triton`` on it.
"""
from __future__ import annotations

import contextlib
import shutil
from typing import NamedTuple

import pytest
import torch

from helpers import on, use_sim_backend


class Engine(NamedTuple):
    name: str     # reference, triton, sim, cuda
    backend: str  # what the public API's backend= gets
    device: str

    def __str__(self):
        return self.name


def engines_here() -> list[Engine]:
    """Every engine that runs on this machine."""
    gpu = torch.cuda.is_available()
    out = [Engine("reference", "reference", "cpu"), Engine("triton", "triton", "cuda" if gpu else "cpu")]
    if gpu:
        out.append(Engine("cuda", "cuda", "cuda"))
    elif shutil.which("g++"):
        out.append(Engine("sim", "cuda", "cpu"))
    return out


def engine_named(name: str) -> Engine:
    for e in engines_here():
        if e.name == name:
            return e
    raise ValueError(f"engine {name!r} does not run here (engines: "
                     f"{[e.name for e in engines_here()]})")


def interpreted(engine: Engine) -> bool:
    """Triton under the CPU interpreter (which cannot do a bf16 tl.dot)."""
    return engine.name == "triton" and engine.device == "cpu"


@contextlib.contextmanager
def engine_ready(engine: Engine, monkeypatch=None):
    """Set up ``engine`` (the simulator as _C for ``sim``) for the duration of the block."""
    if engine.name != "sim":
        yield
        return
    if monkeypatch is not None:
        use_sim_backend(monkeypatch)
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        use_sim_backend(mp)
        yield


def to_engine(call: dict, engine: Engine) -> dict:
    """A call's keyword arguments moved to the engine's device (layouts kept; a Tree or Verdict's
    fields too), plus ``backend=``."""
    import dataclasses

    def move(v):
        if dataclasses.is_dataclass(v):
            return type(v)(**{f.name: move(getattr(v, f.name)) for f in dataclasses.fields(v)})
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return type(v)(*(move(x) for x in v))
        return on(v, engine.device)
    return {**{k: move(v) for k, v in call.items()}, "backend": engine.backend}
