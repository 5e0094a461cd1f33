"""``python -m jetspec_kernels generate``: built-in tiny models, checkpoint directories, with and
without a tokenizer."""
import json

import pytest

import jetspec_kernels as jk
from jetspec_kernels.__main__ import main as package_main
from jetspec_kernels.decode import generate
from jetspec_kernels.models import save_draft_head, save_qwen3, tiny_models
from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights, tiny_draft_config,
                                         tiny_qwen3_config)

pytestmark = pytest.mark.usefixtures("reference_backend")


def test_tiny_models_with_baseline(capsys):
    rc = package_main(["generate", "--tiny", "--prompt", "1 2 3", "--prompt", "4,5", "--max-new-tokens", "6",
                       "--budget", "8", "--topk", "3", "--ar", "--backend", "reference"])
    out = capsys.readouterr().out
    assert rc == 0
    target, head = tiny_models()
    want = generate(target, head, [[1, 2, 3], [4, 5]], max_new_tokens=6, budget=8, topk=3).tokens
    assert " ".join(map(str, want[0])) in out and " ".join(map(str, want[1])) in out
    assert "greedy outputs match" in out and "[jetspec]" in out and "[autoregressive]" in out


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
    with pytest.raises(SystemExit, match="not a list of token ids"):
        package_main(["generate", "--target", str(target_dir), "--head", str(head_dir),
                      "--prompt", "hello", "--backend", "reference"])


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
