"""Code says why, not which ticket: no source file cites an issue by number (a reader has the code,
not the tracker; the history is in git)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("jetspec_kernels", "python_ref", "csrc", "bench", "tests")
SUFFIXES = {".py", ".cu", ".cuh", ".h", ".cpp", ".sh"}
# The word issue or issues before a number, or right after an opening parenthesis (any case).
CITATION = re.compile(r"\bissues?\s+\d|\(issue\b", re.IGNORECASE)
HERE = Path(__file__).resolve()   # its own examples aside


def sources():
    for top in DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile") \
                    and "results" not in path.parts and path != HERE:
                yield path


def citations(text: str) -> list[int]:
    """Line numbers (1-based) of ``text`` that cite an issue by number."""
    return [i for i, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]


def test_the_pattern_finds_citations():
    assert citations("a\n# issue 27: host time\nb (Issue 3)\nissues 26 and 27\n(issue) x") == [
        2, 3, 4, 5]
    assert citations("tissue 3\nno issue here\nissued 4 times\n") == []


def test_no_source_file_cites_an_issue_number():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sources()
             for n in citations(p.read_text(errors="replace"))]
    assert not found, "say why, not which issue:\n" + "\n".join(found)
