"""Builds jetspec_kernels._C with CMake when nvcc is found; otherwise a pure-Python install.

Environment:
  JETSPEC_SKIP_CUDA_BUILD=1   never build _C
  JETSPEC_CUDA_ARCHS="90a;80" CUDA architectures (CMake syntax)
  JETSPEC_PTXAS_VERBOSE=1     pass -Xptxas -v (register / spill report in the build log)
  CUDA_HOME                   where to look for bin/nvcc when it is not on PATH
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def find_nvcc():
    if os.environ.get("JETSPEC_SKIP_CUDA_BUILD") == "1":
        print("jetspec_kernels: JETSPEC_SKIP_CUDA_BUILD=1, skipping the CUDA extension")
        return None
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        cand = Path(home) / "bin" / "nvcc"
        nvcc = str(cand) if cand.exists() else None
    if nvcc is None:
        print("jetspec_kernels: nvcc not found (PATH, CUDA_HOME); building without the CUDA "
              "extension: backends 'reference' and 'triton' only")
    return nvcc


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
            f"-DCMAKE_CUDA_COMPILER={NVCC}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DJETSPEC_OUTPUT_DIR={out_dir}",
        ]
        if os.environ.get("JETSPEC_CUDA_ARCHS"):
            args.append(f"-DJETSPEC_CUDA_ARCHS={os.environ['JETSPEC_CUDA_ARCHS']}")
        if os.environ.get("JETSPEC_PTXAS_VERBOSE") == "1":
            args.append("-DJETSPEC_PTXAS_VERBOSE=ON")
        subprocess.run([cmake, *args], check=True)
        subprocess.run([cmake, "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2)],
                       check=True)


NVCC = find_nvcc()
# python_ref/ stays at the top of the checkout but installs inside the package's namespace, so the
# wheel adds one top-level name only.
PACKAGES = find_packages(include=["jetspec_kernels", "jetspec_kernels.*"]) + ["jetspec_kernels.python_ref"]
setup(
    packages=PACKAGES,
    package_dir={"jetspec_kernels.python_ref": "python_ref"},
    ext_modules=[Extension("jetspec_kernels._C", sources=[])] if NVCC else [],
    cmdclass={"build_ext": CMakeBuild} if NVCC else {},
)
