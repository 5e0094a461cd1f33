"""Speculative decoding of a hybrid (Qwen3.5: Gated DeltaNet + attention) target: greedy output
equals the autoregressive baseline token for token (random and oracle draft heads, ragged batch,
paged caches, adaptive budgets, dense and MoE), the linear layers' states are committed along the
accepted path only, sampling follows the target's law, and the CLI runs a hybrid checkpoint."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels.__main__ import main as package_main
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import DraftHead, Qwen3_5, load_target, save_draft_head
from jetspec_kernels.models.tiny import random_draft_weights, tiny_draft_config
from jetspec_kernels.models.tiny_hybrid import (random_qwen3_5_weights, save_qwen3_5,
                                                tiny_qwen3_5_config)
from test_decode import OracleHead, check_sampling_law, sampling_law_runs

pytestmark = pytest.mark.usefixtures("reference_backend")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]


def _pair(moe=False, seed=0, **over):
    cfg = tiny_qwen3_5_config(num_experts=4 if moe else 0, **over)
    target = Qwen3_5(cfg, random_qwen3_5_weights(cfg, seed=seed))
    dcfg = tiny_draft_config(cfg, target_layer_ids=[1, 3], intermediate_size=96)
    return target, DraftHead(dcfg, random_draft_weights(dcfg, seed=seed + 1))


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def hybrid(request):
    prev = jk.get_backend()
    jk.set_backend("reference")
    target, head = _pair(moe=request.param)
    ar = generate_ar(target, PROMPTS, max_new_tokens=16).tokens
    jk.set_backend(prev)
    return target, head, ar


@pytest.mark.parametrize("kw", [dict(budget=1, topk=1), dict(budget=16, topk=3),
                                dict(budget=8, topk=2, page_size=4),
                                dict(budget=[4, 8], topk=2, cost_model={4: 1.0, 8: 1.5}),
                                dict(budget=8, topk=2, fused_draft=False, algorithm="accum_logp")],
                         ids=["chain1", "b16", "paged", "adaptive", "accum-unfused"])
def test_greedy_speculative_equals_autoregressive(hybrid, kw):
    target, head, ar = hybrid
    out = generate(target, head, PROMPTS, max_new_tokens=16, **kw)
    assert out.tokens == ar


def test_oracle_head_long_paths(hybrid):
    """A head proposing the target's own continuation (some ranks wrong or missing): long and
    varying accepted paths, so the linear states are committed along paths of every length."""
    target, _, ar = hybrid
    oracle = OracleHead([p + t for p, t in zip(PROMPTS, ar)], target.config.vocab_size)
    out = generate(target, oracle, PROMPTS, max_new_tokens=16, budget=16, topk=3, fused_draft=False)
    assert out.tokens == ar and out.stats.mean_accept > 2.0
    chain = generate(target, oracle, PROMPTS, max_new_tokens=16, budget=5, topk=1, fused_draft=False)
    assert chain.tokens == ar and len(set(chain.stats.accept_lengths)) >= 3


def test_commit_only_the_accepted_path(hybrid, monkeypatch):
    """Dropping the linear layers' commit (states left at the prefix) breaks decoding: the test
    above depends on commit_states."""
    target, head, ar = hybrid
    monkeypatch.setattr(type(target), "commit_states", None)
    assert generate(target, head, PROMPTS, max_new_tokens=16, budget=16, topk=3).tokens != ar


def test_sampling_follows_the_target_law():
    cfg = tiny_qwen3_5_config(vocab_size=7)
    target = Qwen3_5(cfg, random_qwen3_5_weights(cfg, seed=3, logit_scale=2.0))
    dcfg = tiny_draft_config(cfg, block_size=4, target_layer_ids=[3])
    head = DraftHead(dcfg, random_draft_weights(dcfg, seed=4))
    for name, tokens in sampling_law_runs(target, head, n=600).items():
        check_sampling_law(name, tokens, target)


def test_exact_mode_runs_on_a_hybrid_target(hybrid):
    """exact=True runs the hybrid's exact forward (tests/test_exact_hybrid.py: its bits); greedy
    speculative output equals autoregressive output in it too."""
    target, head, _ = hybrid
    ar = generate_ar(target, PROMPTS, max_new_tokens=6, exact=True).tokens
    assert generate(target, head, PROMPTS, max_new_tokens=6, budget=8, topk=2, exact=True).tokens == ar


def _saved_hybrid(tmp_path):
    cfg = tiny_qwen3_5_config()
    save_qwen3_5(cfg, random_qwen3_5_weights(cfg, seed=2), str(tmp_path / "target"), multimodal=True)
    dcfg = tiny_draft_config(cfg, target_layer_ids=[1, 3])
    save_draft_head(dcfg, random_draft_weights(dcfg, seed=1), str(tmp_path / "head"))
    return ["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "head"),
            "--prompt", "5 6 7", "--max-new-tokens", "6", "--budget", "8", "--ar",
            "--backend", "reference"]


def test_cli_runs_a_hybrid_target(tmp_path, capsys):
    argv = _saved_hybrid(tmp_path)
    target = load_target(str(tmp_path / "target"))
    assert isinstance(target, Qwen3_5)
    rc = package_main(argv)
    out = capsys.readouterr().out
    assert rc == 0 and "greedy outputs match" in out
    want = generate_ar(target, [[5, 6, 7]], max_new_tokens=6).tokens[0]
    assert " ".join(map(str, want)) in out


def test_cli_exact_on_a_hybrid_target(tmp_path, capsys):
    argv = _saved_hybrid(tmp_path)
    rc = package_main(argv + ["--exact"])
    assert rc == 0 and "greedy outputs match" in capsys.readouterr().out
    # triton (the interpreter here): the exact kernels of tests/test_exact_gated_delta_triton.py
    rc = package_main([a if a != "reference" else "triton" for a in argv] + ["--exact"])
    assert rc == 0 and "greedy outputs match" in capsys.readouterr().out
