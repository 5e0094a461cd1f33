"""The demo on the shipped tiny models: runs, reports, and fails loudly when outputs differ."""
import os

import pytest

import jetspec_kernels.decode as decode_mod
import jetspec_kernels.demo as demo_mod
from jetspec_kernels.demo import main

SMALL = ["--backend", "reference", "--device", "cpu", "--prompts", "1", "--max-new-tokens", "24",
         "--budget", "16", "--budgets", "1", "16", "--table-tokens", "12"]


def test_demo_lossless_and_report(tmp_path, capsys):
    assert main(SMALL + ["--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "lossless check: PASS" in text
    for needle in ("tokens/s", "speed-up:", "accepted per round: [", "head_causal", "head_dflash", "chain"):
        assert needle in text, needle
    with open(tmp_path / "demo_acceptance.csv") as f:
        rows = f.read().splitlines()
    assert rows[0] == "drafter,budget_1,budget_16"
    assert [r.split(",")[0] for r in rows[1:]] == ["head_causal", "head_dflash", "chain"]
    assert all(float(r.split(",")[1]) == 0.0 for r in rows[1:])   # budget 1: the root only
    assert os.path.getsize(tmp_path / "demo_acceptance.png") > 1000
    # a line as each stage starts and as each budget of the table is done
    assert "decoding 1 prompts x 24 tokens" in text
    assert "budget 1 done (1/2)" in text and "budget 16 done (2/2)" in text


@pytest.mark.parametrize("argv,budgets", [
    ([], [4, 16, 64]),                                   # make demo: about a minute on 2 cores
    (["--full"], [1, 4, 16, 64, 256]),
    (["--full", "--budgets", "8"], [8]),
    (["--budgets"], []),
])
def test_demo_table_budgets(monkeypatch, argv, budgets):
    seen = {}

    def run(args, device):
        seen["b"] = args.budgets
        return 0

    monkeypatch.setattr(demo_mod, "_run_tiny", run)
    assert main(argv) == 0
    assert seen["b"] == budgets


def test_demo_fails_when_outputs_differ(tmp_path, capsys, monkeypatch):
    real = decode_mod.generate

    def corrupted(*args, **kwargs):
        out = real(*args, **kwargs)
        out.tokens[0][-1] = (out.tokens[0][-1] + 1) % 256
        return out

    monkeypatch.setattr(decode_mod, "generate", corrupted)
    assert main(SMALL[:-5] + ["--budgets", "--out", str(tmp_path)]) == 1
    assert "lossless check: FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv,option", [
    (["--prompts", "0"], "--prompts"),
    (["--prompts", "5"], "--prompts"),
    (["--backend", "bogus"], "--backend"),
    (["--device", "nonsense"], "--device"),
    (["--budget", "0"], "--budget"),
    (["--budget", "4097"], "--budget"),
    (["--topk", "65"], "--topk"),
    (["--budgets", "1", "0"], "--budgets"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--dtype", "float8"], "--dtype"),
    (["--bogus"], "--bogus"),
    (["--backend", "cuda", "--device", "cpu"], "--backend"),
    (["--random-round", "--vocab", "0"], "--vocab"),
    (["--random-round", "--topk", "9", "--vocab", "5"], "--topk"),
    (["--random-round", "--heads", "3", "2", "64"], "--heads"),
    (["--random-round", "--budget", "4097"], "--budget"),
    (["--random-round", "--backend", "cuda", "--device", "cpu"], "--backend"),
])
def test_bad_input_is_one_line_and_status_2(capsys, argv, option):
    """Bad demo options: one line ``jetspec: error:`` naming the option first, exit status 2."""
    import re
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("jetspec: error: ")
    assert re.findall(r"--[a-z][\w-]*", lines[0])[0] == option, lines[0]
