"""Build csrc against cuda_sim.h with g++ and load it as a stand-in for ``jetspec_kernels._C``.

The result runs the real kernel source of every op on CPU threads (the attention kernel's PTX
wrappers are emulated by mma_sim.h), behind the same bindings.cpp, so the cuda backend's Python
wrappers can be tested against python_ref on a machine without a GPU. ``load("_primitives")``
builds the test-only launchers of csrc/include/jetspec/primitives (primitives.cpp) the same way.
Modules are cached under ``build/cuda_sim/<hash of the sources>``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = Path(__file__).resolve().parent
SOURCES = {
    "_C": [ROOT / "csrc" / f for f in ("bindings.cpp", "attention.cu", "draft_tree.cu",
                                       "verify_tree.cu", "commit_kv.cu", "pack_mask.cu",
                                       "qk_norm_rope_append.cu", "rms_norm.cu", "silu_mul.cu")],
    "_primitives": [SIM_DIR / "primitives.cpp"],
}


def _fingerprint(name: str) -> str:
    h = hashlib.sha256(name.encode())
    files = [Path(__file__), SIM_DIR / "sim_shared.ld"] + SOURCES[name] + sorted((ROOT / "csrc" / "include").rglob("*")) + sorted(SIM_DIR.glob("*.h"))
    for f in files:
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def compiler() -> str | None:
    return shutil.which("g++")


def load(name: str = "_C"):
    """Build (if needed) and import the simulated ``_C`` (or ``_primitives``); a build error raises
    RuntimeError with the compiler's output."""
    import pybind11

    out_dir = ROOT / "build" / "cuda_sim" / _fingerprint(name)
    so = out_dir / (name + sysconfig.get_config_var("EXT_SUFFIX"))
    if not so.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        # One temporary file per process: two pytest-xdist workers may build at once, and a shared
        # one would be moved away under the other's compiler.
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        # It stands in for the default build ("90a,80"): auto picks the wgmma kernel, as on an H200.
        cmd = [compiler(), "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
               "-Wno-unknown-pragmas", "-fdata-sections", f"-Wl,-T,{SIM_DIR / 'sim_shared.ld'}",
               "-DJETSPEC_CPU_SIM", '-DJETSPEC_CUDA_ARCHS="90a,80"',
               f"-I{ROOT / 'csrc' / 'include'}", f"-I{SIM_DIR}", f"-I{pybind11.get_include()}",
               f"-I{sysconfig.get_paths()['include']}", "-x", "c++", *map(str, SOURCES[name]),
               "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"building the CUDA simulator failed:\n{' '.join(cmd)}\n"
                               f"{proc.stderr[-6000:]}")
        tmp.replace(so)
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    print(load(*sys.argv[1:]).__file__, file=sys.stdout)
