"""``jetspec generate`` (``python -m jetspec_kernels generate``): the shipped trained tiny models
with text prompts, random tiny models, checkpoint directories with and without a tokenizer; bad
input gives one ``jetspec: error:`` line naming the option and exit status 2; the console script."""
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import shlex
import tomllib
from pathlib import Path

import pytest

from jetspec_kernels.__main__ import main as package_main
from jetspec_kernels.decode import generate
from jetspec_kernels.models import save_draft_head, save_qwen3, tiny_models
from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights, tiny_draft_config,
                                         tiny_qwen3_config)

pytestmark = pytest.mark.usefixtures("reference_backend")


@pytest.fixture(autouse=True)
def _private_cost_cache(tmp_path, monkeypatch):
    """Adaptive budgets keep their round costs under XDG_CACHE_HOME: a fresh one per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg_cache"))


@pytest.mark.parametrize("budget", ["auto", "4,8"])
def test_adaptive_budget_from_the_cli(capsys, budget):
    """--budget auto / a size list runs the adaptive loop; greedy output equals the baseline."""
    rc = package_main(["generate", "--random-tiny", "--prompt", "1 2 3", "--max-new-tokens", "6",
                       "--budget", budget, "--topk", "3", "--ar", "--backend", "reference"])
    out = capsys.readouterr().out
    assert rc == 0 and "greedy outputs match" in out


def test_random_tiny_models_with_baseline(capsys):
    rc = package_main(["generate", "--random-tiny", "--prompt", "1 2 3", "--prompt", "4,5",
                       "--max-new-tokens", "6", "--budget", "8", "--topk", "3", "--ar", "--backend",
                       "reference"])
    out = capsys.readouterr().out
    assert rc == 0
    target, head = tiny_models()
    want = generate(target, head, [[1, 2, 3], [4, 5]], max_new_tokens=6, budget=8, topk=3).tokens
    assert " ".join(map(str, want[0])) in out and " ".join(map(str, want[1])) in out
    assert "greedy outputs match" in out and "[jetspec]" in out and "[autoregressive]" in out


def test_top_k_and_top_p_reach_the_sampler(capsys):
    """--top-k / --top-p reach generate: sampling with top-k 1 (or a tiny top-p) is greedy
    decoding, and a sampled run with the filters equals generate called with them."""
    base = ["generate", "--random-tiny", "--prompt", "1 2 3", "--prompt", "4,5", "--max-new-tokens",
            "6", "--budget", "8", "--topk", "3", "--backend", "reference", "--seed", "3"]
    outs = []
    for extra in ([], ["--temperature", "0.9", "--top-k", "1"],
                  ["--temperature", "0.9", "--top-p", "1e-6"]):
        assert package_main(base + extra) == 0
        outs.append(capsys.readouterr().out.split("[jetspec]")[0])
    assert outs[1] == outs[0] and outs[2] == outs[0]
    assert package_main(base + ["--temperature", "2.0", "--top-k", "4", "--top-p", "0.9"]) == 0
    out = capsys.readouterr().out
    target, head = tiny_models()
    want = generate(target, head, [[1, 2, 3], [4, 5]], max_new_tokens=6, budget=8, topk=3, seed=3,
                    temperature=2.0, top_k=4, top_p=0.9).tokens
    assert out.startswith(f"--- prompt 0: '1 2 3'\n{' '.join(map(str, want[0]))}\n"
                          f"--- prompt 1: '4,5'\n{' '.join(map(str, want[1]))}\n")


@pytest.fixture
def checkpoint_dirs(tmp_path):
    tcfg = tiny_qwen3_config()
    dcfg = tiny_draft_config(tcfg)
    save_qwen3(tcfg, random_qwen3_weights(tcfg, seed=0), str(tmp_path / "target"))
    save_draft_head(dcfg, random_draft_weights(dcfg, seed=1), str(tmp_path / "head"))
    return tmp_path / "target", tmp_path / "head"


def test_checkpoints_token_ids(checkpoint_dirs, capsys):
    target_dir, head_dir = checkpoint_dirs
    rc = package_main(["generate", "--target", str(target_dir), "--head", str(head_dir), "--prompt", "5 6 7",
                       "--max-new-tokens", "5", "--backend", "reference"])
    assert rc == 0
    target, head = tiny_models()     # the same seeds as the saved checkpoints
    want = generate(target, head, [[5, 6, 7]], max_new_tokens=5, budget=64, topk=8).tokens[0]
    assert " ".join(map(str, want)) in capsys.readouterr().out
    # EOS from generation_config.json: generation stops right after the first generated token.
    (target_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [want[0], 96]}))
    assert package_main(["generate", "--target", str(target_dir), "--head", str(head_dir), "--prompt",
                         "5 6 7", "--max-new-tokens", "5", "--backend", "reference"]) == 0
    printed = capsys.readouterr().out.split("\n")
    assert printed[1] == str(want[0])
    assert package_main(["generate", "--target", str(target_dir), "--head", str(head_dir),
                         "--prompt", "hello", "--backend", "reference"]) == 2
    assert "--prompt 1 ('hello') is not a list of token ids" in capsys.readouterr().err


def test_checkpoints_with_tokenizer(checkpoint_dirs, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    target_dir, head_dir = checkpoint_dirs
    vocab = {f"w{i}": i for i in range(97)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(target_dir / "tokenizer.json"))
    rc = package_main(["generate", "--target", str(target_dir), "--head", str(head_dir),
                       "--prompt", "w5 w6 w7", "--max-new-tokens", "5", "--backend", "reference"])
    assert rc == 0
    target, head = tiny_models()
    want = generate(target, head, [[5, 6, 7]], max_new_tokens=5).tokens[0]
    assert " ".join(f"w{i}" for i in want) in capsys.readouterr().out


def test_tiny_text_prompt(capsys):
    """--tiny: the shipped trained target and causal head with the byte tokenizer; text in, text
    out, equal to the baseline."""
    from jetspec_kernels.models.assets import load_tiny
    from jetspec_kernels.models.byte_tokenizer import decode, encode
    rc = package_main(["generate", "--tiny", "--prompt", "def f(x):", "--max-new-tokens", "12",
                       "--budget", "8", "--topk", "3", "--ar"])
    out = capsys.readouterr().out
    assert rc == 0
    target, heads = load_tiny()
    want = generate(target, heads["head_causal"], [encode("def f(x):")], max_new_tokens=12, budget=8,
                    topk=3, eos_token_id=257).tokens[0]
    assert out.startswith(f"--- prompt 0: 'def f(x):'\n{decode(want)}\n[jetspec]")
    assert "greedy outputs match" in out


def _mismatched_head(tmp_path):
    """A random tiny target (hidden 64, 97 tokens) beside the shipped head (made for hidden 192)."""
    tcfg = tiny_qwen3_config()
    save_qwen3(tcfg, random_qwen3_weights(tcfg), str(tmp_path / "target"))
    from jetspec_kernels.models.assets import TINY_DIR
    return ["--target", str(tmp_path / "target"), "--head", os.path.join(TINY_DIR, "head_causal")]


# Bad command lines: (arguments after "generate", text the one error line must contain).
BAD = [
    (["--tiny", "--prompt", "x", "--budget", "0"], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", "5000"], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", "many"], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", "8,x"], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", "8,0"], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", ","], "--budget"),
    (["--tiny", "--prompt", "x", "--budget", "4,5000"], "--budget"),
    (["--tiny", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["--tiny", "--prompt", "x", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["--tiny", "--prompt", "x", "--temperature", "-0.5"], "--temperature"),
    (["--tiny", "--prompt", "x", "--temperature", "nan"], "--temperature"),
    (["--tiny", "--prompt", "x", "--temperature", "hot"], "--temperature"),
    (["--tiny", "--prompt", "x", "--top-k", "-1"], "--top-k"),
    (["--tiny", "--prompt", "x", "--top-k", "many"], "--top-k"),
    (["--tiny", "--prompt", "x", "--top-p", "0"], "--top-p"),
    (["--tiny", "--prompt", "x", "--top-p", "1.5"], "--top-p"),
    (["--tiny", "--prompt", "x", "--top-p", "nan"], "--top-p"),
    (["--tiny", "--prompt", "x", "--top-p", "-0.2"], "--top-p"),
    (["--tiny", "--prompt", "x", "--topk", "0"], "--topk"),
    (["--tiny", "--prompt", "x", "--topk", "65"], "--topk"),
    (["--tiny", "--prompt", "x", "--page-size", "0"], "--page-size"),
    (["--tiny", "--prompt", "x", "--eos", "259"], "--eos"),
    (["--tiny", "--prompt", "x", "--seed", str(2 ** 64)], "--seed"),
    (["--tiny", "--prompt", ""], "--prompt"),
    (["--tiny", "--token-ids", "--prompt", "hello"], "--prompt"),
    (["--random-tiny", "--prompt", "1 2 97"], "--prompt"),
    (["--random-tiny", "--prompt", "5 -1"], "--prompt"),
    (["--target", "/nonexistent/jetspec", "--head", "/nonexistent/head", "--prompt", "1"], "--target"),
    (["--target", "{tmp}", "--head", "{tmp}", "--prompt", "1"], "--target"),
    (["--target", "{target}", "--prompt", "1"], "--head"),
    (["--target", "{target}", "--head", "/nonexistent/head", "--prompt", "1"], "--head"),
    (["--tiny", "--head", "{tmp}", "--prompt", "x"], "--head"),
    (["--tiny", "--prompt", "x", "--device", "nonsense"], "--device"),
    (["--tiny", "--prompt", "x", "--backend", "cuda"], "--backend"),
    (["--prompt", "x"], "--target"),
    ("MISMATCH", "--head"),
]


def _argv(args, tmp_path):
    if args == "MISMATCH":
        return _mismatched_head(tmp_path) + ["--prompt", "1 2"]
    target = tmp_path / "good_target"
    if any("{target}" in a for a in args):
        tcfg = tiny_qwen3_config()
        save_qwen3(tcfg, random_qwen3_weights(tcfg), str(target))
    return [a.format(tmp=tmp_path, target=target) for a in args]


def _one_error_line(err: str, option: str) -> None:
    """One line ``jetspec: error: ...`` whose first option named is ``option`` (the one to blame;
    a message may name others after it, e.g. the option that overrides a default)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jetspec: error: "), err
    named = re.findall(r"--[a-z][\w-]*|\{[\w,]+\}", lines[0])
    assert named and named[0] == option, f"blames {named[:1]}, not {option}: {lines[0]}"
    assert "Traceback" not in err


@pytest.mark.parametrize("args,option", BAD, ids=[" ".join(a) if a != "MISMATCH" else a for a, _ in BAD])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, args, option):
    rc = package_main(["generate"] + _argv(args, tmp_path))
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    _one_error_line(captured.err, option)


@pytest.mark.parametrize("budget", ["0", "5000", "many", "8,x", "8,0", ",", "4,5000", "8,,16", "",
                                    "-1", "auto,8"])
def test_budget_errors_share_one_message(capsys, budget):
    """Every bad --budget gets the message naming the three forms and the range, with the text."""
    rc = package_main(["generate", "--tiny", "--prompt", "x", "--budget", budget])
    assert rc == 2
    assert capsys.readouterr().err == (
        "jetspec: error: argument --budget: must be an int in [1, 4096], 'auto', or "
        f"comma-separated sizes in [1, 4096] like 8,16,32, got {budget!r}\n")


def test_readme_cli_error_example_is_the_real_message(capsys):
    """The README's example of a bad command line prints what it says it prints."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    match = re.search(r"Bad input prints one line and exits with status 2: `jetspec ([^`]+)` gives\s+"
                      r"`([^`]+)`", readme)
    assert match, "the README's CLI error example moved"
    assert package_main(shlex.split(match.group(1))) == 2
    assert capsys.readouterr().err.strip() == match.group(2)


@pytest.mark.parametrize("argv,option", [
    (["generate", "--tiny", "--prompt", "x", "--budget", "0"], "--budget"),
    (["generate", "--tiny", "--prompt", "x", "--temperature", "-1"], "--temperature"),
    (["generate", "--tiny", "--prompt", "x", "--top-p", "2"], "--top-p"),
    (["generate", "--random-tiny", "--prompt", "1 300"], "--prompt"),
    ("MISMATCH", "--head"),
    ([], "{demo,generate,info}"),
    (["serve"], "{demo,generate,info}"),      # the subcommand argument, then 'serve'
    (["info", "--bogus"], "--bogus"),
    (["demo", "--prompts", "0"], "--prompts"),
])
def test_bad_input_in_a_process(tmp_path, argv, option):
    """The same through ``python -m jetspec_kernels``: exit status 2, no traceback."""
    if argv == "MISMATCH":
        argv = ["generate"] + _argv(argv, tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-m", "jetspec_kernels", *argv], capture_output=True,
                          text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    _one_error_line(proc.stderr, option)


def test_help_imports_no_torch():
    """``jetspec --help`` answers at once: neither torch nor the ops are imported for it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "jetspec_kernels", "--help"],
                          capture_output=True, text=True, cwd=root, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0 and proc.stdout.startswith("usage: jetspec")
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "jetspec_kernels.cli_common" in imported
    assert not [m for m in imported if m == "torch" or m.startswith(("torch.", "jetspec_kernels.ops"))]


def test_console_script_entry_point(capsys):
    """pyproject.toml's ``jetspec`` script resolves to the package's main, which runs subcommands
    (the installed script may predate it, so the entry point is built from pyproject.toml)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    ep = importlib.metadata.EntryPoint(name="jetspec", value=scripts["jetspec"], group="console_scripts")
    main = ep.load()
    assert main is package_main
    assert main(["generate", "--random-tiny", "--prompt", "1 2", "--max-new-tokens", "2", "--budget", "2",
                 "--topk", "1", "--backend", "reference"]) == 0
    assert "[jetspec] 2 tokens" in capsys.readouterr().out
    assert main(["generate", "--random-tiny", "--prompt", "1", "--budget", "0"]) == 2


def test_info(capsys):
    """``jetspec info`` prints the version and every backend's availability, exit 0; anything after
    it is bad input (status 2, the argument named), not ignored."""
    import jetspec_kernels as jk
    assert package_main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"jetspec_kernels {jk.__version__}, torch ")
    for name in ("cuda", "triton", "reference"):
        assert re.search(rf"^  cpu   {name} ", out, re.M), name
    from jetspec_kernels import backend
    for dev in ("cpu", "cuda"):   # a line per op: auto's pick on this device's tensors and why
        section = out.split(f"  auto on {dev} tensors", 1)[1].split("\n  auto on", 1)[0]
        for fn in backend.INTERFACE_FUNCTIONS:
            assert re.search(rf"^    {fn} +(cuda|triton|reference) +\S", section, re.M), (dev, fn)
    for bad in (["--bogus"], ["extra"], ["--verbose", "1"]):
        assert package_main(["info", *bad]) == 2, bad
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jetspec: error: info takes no arguments")
        assert bad[0] in lines[0]


def test_ar_outputs_that_differ_exit_1(monkeypatch, capsys):
    """``generate --ar`` compares greedy outputs with the baseline: a difference is reported and
    the exit status is 1 (0 when they match; sampled runs are not compared)."""
    import jetspec_kernels.decode as decode_mod
    real = decode_mod.generate_ar

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out.tokens[-1][-1] = (out.tokens[-1][-1] + 1) % 97
        return out

    argv = ["generate", "--random-tiny", "--prompt", "1 2 3", "--prompt", "4", "--max-new-tokens",
            "4", "--budget", "4", "--topk", "2", "--ar", "--backend", "reference"]
    monkeypatch.setattr(decode_mod, "generate_ar", off_by_one)
    assert package_main(argv) == 1
    captured = capsys.readouterr()
    assert "greedy outputs DIFFER" in captured.out and captured.err == ""
    assert package_main(argv + ["--temperature", "0.8"]) == 0
    assert "greedy outputs" not in capsys.readouterr().out
    monkeypatch.setattr(decode_mod, "generate_ar", real)
    assert package_main(argv) == 0
    assert "greedy outputs match" in capsys.readouterr().out


def test_eos_errors_blame_the_right_thing(checkpoint_dirs, capsys):
    """An --eos out of the vocabulary blames --eos; a bad default EOS from the checkpoint blames
    that default (and says --eos overrides it), and --eos then fixes the run; an unreadable
    generation_config.json blames --target."""
    target_dir, head_dir = checkpoint_dirs
    base = ["generate", "--target", str(target_dir), "--head", str(head_dir), "--prompt", "5 6",
            "--max-new-tokens", "2", "--budget", "4", "--topk", "2", "--backend", "reference"]

    def error_of(argv):
        assert package_main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        return lines[0]

    assert error_of(base + ["--eos", "97"]) == \
        "jetspec: error: --eos: eos_token_id must be in [0, 96], got 97"
    assert error_of(base + ["--eos", "5", "--eos", "-1"]) == \
        "jetspec: error: --eos: eos_token_id must be in [0, 96], got -1"
    (target_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 500]}))
    assert error_of(base) == ("jetspec: error: the target's default eos_token_id (override it with "
                              "--eos): eos_token_id must be in [0, 96], got 500")
    assert package_main(base + ["--eos", "96"]) == 0
    capsys.readouterr()
    (target_dir / "generation_config.json").write_text("{not json")
    assert error_of(base).startswith(f"jetspec: error: --target {target_dir}: "
                                     "generation_config.json cannot be read")


def test_options_at_their_limits_run(capsys):
    """Every bounded option at exactly its limit is accepted (one past it is in BAD): the lower
    limits together, then --topk at its upper limit (the vocabulary's 97 > MAX_TOPK 64)."""
    from jetspec_kernels.limits import MAX_TOPK
    base = ["generate", "--random-tiny", "--prompt", "1 2", "--backend", "reference", "--max-new-tokens", "1"]
    assert package_main(base + ["--budget", "1", "--topk", "1", "--top-k", "0", "--page-size", "1",
                                "--tp", "1", "--temperature", "0", "--top-p", "1"]) == 0
    target, head = tiny_models()
    want = generate(target, head, [[1, 2]], max_new_tokens=1, budget=1, topk=1).tokens[0]
    assert capsys.readouterr().out.startswith(f"--- prompt 0: '1 2'\n{want[0]}\n[jetspec] 1 tokens")
    assert package_main(base + ["--budget", "2", "--topk", str(MAX_TOPK)]) == 0
    assert capsys.readouterr().out.startswith(f"--- prompt 0: '1 2'\n{want[0]}\n[jetspec] 1 tokens")


def test_default_eos_zero_from_generation_config(tmp_path, capsys):
    """eos_token_id 0 in generation_config.json is an EOS like any other, not 'unset'."""
    tcfg = tiny_qwen3_config()
    weights = random_qwen3_weights(tcfg, seed=0)
    weights["lm_head.weight"].zero_()        # every logit 0: greedy emits id 0 (ties to the lower id)
    save_qwen3(tcfg, weights, str(tmp_path / "target"))
    dcfg = tiny_draft_config(tcfg)
    save_draft_head(dcfg, random_draft_weights(dcfg, seed=1), str(tmp_path / "head"))
    argv = ["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "head"),
            "--prompt", "5 6", "--max-new-tokens", "4", "--budget", "4", "--topk", "2",
            "--backend", "reference"]
    assert package_main(argv) == 0
    assert capsys.readouterr().out.split("\n")[1] == "0 0 0 0"      # no EOS configured
    (tmp_path / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert package_main(argv) == 0
    assert capsys.readouterr().out.split("\n")[1] == "0"
