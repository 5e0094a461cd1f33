"""The planted-bug campaign's table (tests/mutations_new_code.py, run by hand) stays runnable:
every mutation's old text occurs exactly once in its file (else the campaign reports it
BAD-PATCH, a planted bug never planted), differs from its new text, and its tests exist."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _table():
    spec = importlib.util.spec_from_file_location("mutations_new_code",
                                                  ROOT / "tests" / "mutations_new_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTATIONS


TABLE = _table()


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_mutation_applies_once(name):
    _, file, old, new, tests = TABLE[name]
    text = (ROOT / file).read_text()
    assert text.count(old) == 1, f"{name}: its old text occurs {text.count(old)} times in {file}"
    assert new != old
    paths = [t for t in tests if t.startswith("tests/")]
    assert paths and all((ROOT / p.split("::")[0]).exists() for p in paths), tests
