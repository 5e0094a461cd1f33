"""Builds jetspec_kernels._C with CMake where it can run or when asked; otherwise a pure-Python
install (backends 'reference' and 'triton').

Environment:
  JETSPEC_BUILD_CUDA=auto     (the default) build _C when a GPU driver loads (libcuda.so.1) and
                              nvcc is found: an extension that cannot run here is not built
  JETSPEC_BUILD_CUDA=1        build _C whenever nvcc is found, driver or not (the tests of the
                              build itself; bundles for another machine); no nvcc is an error
  JETSPEC_BUILD_CUDA=0        never build _C
  JETSPEC_SKIP_CUDA_BUILD=1   never build _C (wins over JETSPEC_BUILD_CUDA)
  JETSPEC_CUDA_ARCHS="90a;80" CUDA architectures (CMake syntax)
  JETSPEC_PTXAS_VERBOSE=1     pass -Xptxas -v (register / spill report in the build log)
  CUDA_HOME                   where to look for bin/nvcc when it is not on PATH

``python setup.py --cuda-plan`` prints the decision in one line and exits (the Makefile shows it
before installing, since pip -q hides the build's own output).
"""
import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BUILD_CHOICES = ("auto", "0", "1")
DEFAULT_ARCHS = "90a;80"


def find_nvcc(env=os.environ):
    """Path of nvcc (PATH, then CUDA_HOME or /usr/local/cuda), or None."""
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc is None:
        cand = Path(env.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
        nvcc = str(cand) if cand.exists() else None
    return nvcc


def driver_present() -> bool:
    """Whether the NVIDIA driver's library (libcuda.so.1) loads: without it _C cannot run."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def build_request(env=os.environ) -> str:
    """'auto', '0' or '1' from JETSPEC_SKIP_CUDA_BUILD / JETSPEC_BUILD_CUDA (SystemExit naming the
    variable for any other value)."""
    skip = env.get("JETSPEC_SKIP_CUDA_BUILD", "")
    if skip not in ("", "0", "1"):
        raise SystemExit(f"jetspec_kernels: JETSPEC_SKIP_CUDA_BUILD must be 0 or 1, got {skip!r}")
    if skip == "1":
        return "0"
    build = env.get("JETSPEC_BUILD_CUDA", "") or "auto"
    if build not in BUILD_CHOICES:
        raise SystemExit(f"jetspec_kernels: JETSPEC_BUILD_CUDA must be one of auto, 0, 1, got "
                         f"{build!r}")
    return build


def cuda_build_plan(env=os.environ, nvcc_finder=find_nvcc, driver_check=driver_present):
    """``(nvcc path or None, one line saying what the install does and why)``: None means no _C.
    JETSPEC_BUILD_CUDA=1 without nvcc raises SystemExit."""
    request = build_request(env)
    skip_hint = "JETSPEC_BUILD_CUDA=1 builds it anyway"
    if request == "0":
        why = ("JETSPEC_SKIP_CUDA_BUILD=1" if env.get("JETSPEC_SKIP_CUDA_BUILD") == "1"
               else "JETSPEC_BUILD_CUDA=0")
        return None, f"jetspec_kernels: {why}: installing without the CUDA extension _C"
    nvcc = nvcc_finder(env)
    if nvcc is None:
        if request == "1":
            raise SystemExit("jetspec_kernels: JETSPEC_BUILD_CUDA=1 but nvcc was not found (PATH, "
                             "CUDA_HOME): install the CUDA toolkit or unset JETSPEC_BUILD_CUDA")
        return None, ("jetspec_kernels: nvcc not found (PATH, CUDA_HOME): installing without the "
                      "CUDA extension _C (backends 'reference' and 'triton')")
    if request == "auto" and not driver_check():
        return None, ("jetspec_kernels: no GPU driver here (libcuda.so.1 does not load): installing "
                      f"without the CUDA extension _C, which could not run ({skip_hint})")
    archs = env.get("JETSPEC_CUDA_ARCHS") or DEFAULT_ARCHS
    why = "asked by JETSPEC_BUILD_CUDA=1" if request == "1" else "a GPU driver is present"
    return nvcc, (f"jetspec_kernels: building the CUDA extension _C for {archs} with {nvcc} ({why}); "
                  "a first build takes minutes (about 5-6 on 2 cores for two architectures), "
                  "JETSPEC_SKIP_CUDA_BUILD=1 skips it")


def _build_ext_class(nvcc):
    from setuptools.command.build_ext import build_ext

    class CMakeBuild(build_ext):
        def build_extension(self, ext):
            import pybind11

            env_bin = Path(sys.executable).parent
            cmake = shutil.which("cmake", path=str(env_bin)) or shutil.which("cmake")
            ninja = shutil.which("ninja", path=str(env_bin)) or shutil.which("ninja")
            out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
            build_dir = ROOT / "build" / "cmake"  # persistent: incremental rebuilds
            build_dir.mkdir(parents=True, exist_ok=True)
            args = [
                f"-S{ROOT}", f"-B{build_dir}", "-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_CUDA_COMPILER={nvcc}",
                f"-DPython_EXECUTABLE={sys.executable}",
                f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                f"-DJETSPEC_OUTPUT_DIR={out_dir}",
            ]
            if os.environ.get("JETSPEC_CUDA_ARCHS"):
                args.append(f"-DJETSPEC_CUDA_ARCHS={os.environ['JETSPEC_CUDA_ARCHS']}")
            if os.environ.get("JETSPEC_PTXAS_VERBOSE") == "1":
                args.append("-DJETSPEC_PTXAS_VERBOSE=ON")
            start = time.monotonic()
            subprocess.run([cmake, *args], check=True)
            subprocess.run([cmake, "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2)],
                           check=True)
            print(f"jetspec_kernels: _C built in {time.monotonic() - start:.0f} s")

    return CMakeBuild


def main():
    from setuptools import Extension, find_packages, setup

    nvcc, plan = cuda_build_plan()
    print(plan)
    # python_ref/ stays at the top of the checkout but installs inside the package's namespace,
    # so the wheel adds one top-level name only.
    packages = (find_packages(include=["jetspec_kernels", "jetspec_kernels.*"])
                + ["jetspec_kernels.python_ref"])
    setup(
        packages=packages,
        package_dir={"jetspec_kernels.python_ref": "python_ref"},
        ext_modules=[Extension("jetspec_kernels._C", sources=[])] if nvcc else [],
        cmdclass={"build_ext": _build_ext_class(nvcc)} if nvcc else {},
    )


# setuptools' build backend runs this file as __main__; tests import it under another name.
if __name__ == "__main__":
    if sys.argv[1:] == ["--cuda-plan"]:
        print(cuda_build_plan()[1])
    else:
        main()
