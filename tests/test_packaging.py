"""What the wheel installs: one top-level name, the references inside it, and references that
never import the rest of the package; when setup.py builds the CUDA extension, and what the
Makefile's install paths ask of it."""
import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, JETSPEC_SKIP_CUDA_BUILD="1", PIP_NO_INDEX="1")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, env=env, cwd=out)
    (wheel,) = out.glob("jetspec_kernels-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_wheel_adds_one_top_level_name(wheel_names):
    top = {n.split("/")[0] for n in wheel_names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"jetspec_kernels"}


def test_wheel_carries_the_license(wheel_names):
    """pyproject's license = "Apache-2.0" ships with its text (LICENSE at the top of the checkout)."""
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel_names), wheel_names
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_wheel_ships_the_hardware_record(wheel_names):
    """backend.py reads auto's trusted backends from the package's hardware_record.json at import:
    an installed package without it could not import."""
    assert "jetspec_kernels/hardware_record.json" in wheel_names


def test_wheel_holds_the_references_inside_the_package(wheel_names):
    refs = {Path(n).name for n in wheel_names if n.startswith("jetspec_kernels/python_ref/")}
    on_disk = {p.name for p in (ROOT / "python_ref").glob("*.py")}
    assert on_disk and refs == on_disk


@pytest.mark.parametrize("path", sorted((ROOT / "python_ref").glob("*.py")), ids=lambda p: p.name)
def test_references_never_import_the_package(path):
    """Only relative imports inside python_ref/, or third-party ones: no `jetspec_kernels`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [] if node.level else [node.module or ""]
        else:
            continue
        assert not any(n.split(".")[0] == "jetspec_kernels" for n in names), (path.name, names)


def _load_setup():
    """setup.py as a module (it runs setup() only as __main__, which the build backend uses)."""
    spec = importlib.util.spec_from_file_location("jetspec_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def setup_py():
    return _load_setup()


def _plan(setup_py, env, *, nvcc="/opt/cuda/bin/nvcc", driver=True):
    return setup_py.cuda_build_plan(env, nvcc_finder=lambda env: nvcc, driver_check=lambda: driver)


def test_cuda_build_skipped_without_a_driver(setup_py):
    """The default builds _C only where it can run: no driver, no 5-minute nvcc build."""
    nvcc, line = _plan(setup_py, {}, driver=False)
    assert nvcc is None and "libcuda.so.1" in line and "JETSPEC_BUILD_CUDA=1" in line


def test_cuda_build_with_a_driver_and_nvcc(setup_py):
    nvcc, line = _plan(setup_py, {"JETSPEC_BUILD_CUDA": "auto"})
    assert nvcc == "/opt/cuda/bin/nvcc"
    assert "building the CUDA extension _C for 90a;80" in line and "minutes" in line


def test_cuda_build_without_nvcc_is_a_pure_python_install(setup_py):
    nvcc, line = _plan(setup_py, {}, nvcc=None)
    assert nvcc is None and "nvcc not found" in line


def test_cuda_build_asked_for_builds_without_a_driver(setup_py):
    nvcc, line = _plan(setup_py, {"JETSPEC_BUILD_CUDA": "1", "JETSPEC_CUDA_ARCHS": "90a"},
                       driver=False)
    assert nvcc == "/opt/cuda/bin/nvcc" and "for 90a with" in line and "JETSPEC_BUILD_CUDA=1" in line


def test_cuda_build_asked_for_without_nvcc_is_an_error(setup_py):
    with pytest.raises(SystemExit, match="JETSPEC_BUILD_CUDA=1 but nvcc was not found"):
        _plan(setup_py, {"JETSPEC_BUILD_CUDA": "1"}, nvcc=None)


@pytest.mark.parametrize("env,why", [
    ({"JETSPEC_BUILD_CUDA": "0"}, "JETSPEC_BUILD_CUDA=0"),
    ({"JETSPEC_SKIP_CUDA_BUILD": "1"}, "JETSPEC_SKIP_CUDA_BUILD=1"),
    ({"JETSPEC_SKIP_CUDA_BUILD": "1", "JETSPEC_BUILD_CUDA": "1"}, "JETSPEC_SKIP_CUDA_BUILD=1"),
])
def test_cuda_build_refused_by_the_environment(setup_py, env, why):
    nvcc, line = _plan(setup_py, env)
    assert nvcc is None and why in line


@pytest.mark.parametrize("env,name", [
    ({"JETSPEC_BUILD_CUDA": "yes"}, "JETSPEC_BUILD_CUDA"),
    ({"JETSPEC_SKIP_CUDA_BUILD": "true"}, "JETSPEC_SKIP_CUDA_BUILD"),
])
def test_cuda_build_bad_setting_names_the_variable(setup_py, env, name):
    with pytest.raises(SystemExit, match=f"{name} must be"):
        _plan(setup_py, env)


def test_driver_present_reads_libcuda(setup_py, monkeypatch):
    loaded = []

    def fake_cdll(name):
        loaded.append(name)
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(setup_py.ctypes, "CDLL", fake_cdll)
    assert setup_py.driver_present() is False and loaded == ["libcuda.so.1"]
    monkeypatch.setattr(setup_py.ctypes, "CDLL", lambda name: object())
    assert setup_py.driver_present() is True


def test_find_nvcc_falls_back_to_cuda_home(setup_py, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    assert setup_py.find_nvcc({"PATH": str(tmp_path / "none"), "CUDA_HOME": str(tmp_path)}) \
        == str(tmp_path / "bin" / "nvcc")
    assert setup_py.find_nvcc({"PATH": str(tmp_path / "none"), "CUDA_HOME": str(tmp_path / "x")}) is None


def _make_dry_run(target, *args):
    """The commands ``make TARGET`` would run (every prerequisite remade). Run as a top-level make
    (inside ``make test`` the inherited MAKELEVEL / MAKEFLAGS add "Entering directory" lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-n", "-B", target, *args], cwd=ROOT, capture_output=True,
                          text=True, check=True, env=env).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_builds_cuda_for_its_tests_and_demo_does_not_ask():
    """make test reinstalls with JETSPEC_BUILD_CUDA=1 where nvcc is found (tests/test_cuda_build.py
    needs _C, GPU or not); make demo leaves the decision to setup.py (no driver: no _C)."""
    test_cmds = _make_dry_run("test", "NVCC=/bin/sh")
    assert "JETSPEC_BUILD_CUDA=1" in test_cmds and "pip install -q --no-build-isolation --no-deps -e ." in test_cmds
    assert "JETSPEC_BUILD_CUDA=auto" in _make_dry_run("test", "NVCC=/nonexistent/nvcc")
    demo_cmds = _make_dry_run("demo", "DEMO_ARGS=--full")
    assert "JETSPEC_BUILD_CUDA" not in demo_cmds and "setup.py --cuda-plan" in demo_cmds
    assert demo_cmds.rstrip().endswith("-m jetspec_kernels demo --full")
