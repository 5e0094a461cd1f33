"""What the wheel installs: one top-level name, the references inside it, and references that
never import the rest of the package."""
import ast
import os
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
