"""make fuzz (tests/fuzz/run.py): its arguments once, a progress line while it runs, and the reason
each engine gave for a case it does not support."""
import re
import subprocess
from pathlib import Path

import run

ROOT = Path(__file__).resolve().parents[2]


def test_make_fuzz_passes_each_argument_once():
    for args, seconds in (("--seconds 5 --seed 1", 1), ("--seed 1", 0)):
        res = subprocess.run(["make", "-n", "fuzz", f"FUZZ_ARGS={args}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        line = next(l for l in res.stdout.splitlines() if "tests/fuzz/run.py" in l)
        assert line.count("--seconds") == seconds and line.endswith(args), line


def test_progress_line_counts_every_status():
    counts = {("verify_tree", "triton", "ok"): 3, ("verify_tree", "reference", "ok"): 4,
              ("tree_attention", "triton", "unsupported"): 2}
    assert run.progress_line(4, 31.4, counts) == "fuzz: 31 s, 4 seeds per op: ok 7, unsupported 2"
    assert run.progress_line(0, 0.0, {}).endswith("no case yet")


def test_count_lines_give_the_reasons_under_their_engine():
    counts = {("tree_attention", "triton", "ok"): 5, ("tree_attention", "triton", "unsupported"): 3,
              ("tree_attention", "reference", "unsupported"): 1}
    reasons = {("tree_attention", "triton", "bf16 tl.dot"): 2,
               ("tree_attention", "triton", "bf16 casts"): 1,
               ("tree_attention", "reference", "head dim 48"): 1}
    lines = run.count_lines(counts, reasons)
    ref = lines.index(next(l for l in lines if "reference" in l and "unsupported" in l))
    assert "head dim 48" in lines[ref + 1]
    tri = lines.index(next(l for l in lines if "triton" in l and "unsupported" in l))
    assert {lines[tri + 1].split("x ", 1)[1], lines[tri + 2].split("x ", 1)[1]} == \
        {"bf16 tl.dot", "bf16 casts"}
    assert re.match(r"\s+2 x bf16 tl.dot", lines[tri + 1])


def test_main_prints_progress_and_reasons(monkeypatch, capsys):
    statuses = iter(["ok", "unsupported: the interpreter cannot run it"] * 4)
    monkeypatch.setattr(run, "check", lambda op, seed, engine: next(statuses))
    assert run.main(["--ops", "pack_mask", "--engines", "reference,triton", "--cases", "2",
                     "--seed", "7", "--progress", "0"]) == 0
    out = capsys.readouterr().out
    assert "fuzz: 0 s, 1 seeds per op: ok 1, unsupported 1" in out
    assert "2 seeds per op: ok 2, unsupported 2" in out
    assert "2 x the interpreter cannot run it" in out
