"""The examples/ scripts run (as a newcomer runs them) and check themselves against python_ref;
the README's tour is made of their lines."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script, *args, env=None):
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_tour_matches_python_ref(backend):
    out = _run("tour.py", "--backend", backend, env={"TRITON_INTERPRET": "1"})
    assert f"all results equal to python_ref (backend {backend} on cpu)" in out
    assert re.search(r"accepted \[[1-9], [1-9]\] draft tokens", out), out   # a verdict worth showing


def test_decode_tiny_is_lossless():
    out = _run("decode_tiny.py", "--max-new-tokens", "16")
    assert "greedy outputs identical to autoregressive decoding" in out


def test_readme_tour_is_lines_of_the_example():
    """Every code line of the README's tour (comments aside) is a line of examples/tour.py, so
    the README cannot show a call the example does not run."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## 30-second API tour.*?```python\n(.*?)```", readme, re.S).group(1)

    def code_lines(text):
        lines = [line.split("  #")[0].strip() for line in text.splitlines()]
        return [line for line in lines if line and not line.startswith("#")]

    example = set(code_lines((EXAMPLES / "tour.py").read_text()))
    tour = code_lines(block)
    assert len(tour) >= 8
    assert [line for line in tour if line not in example] == []
