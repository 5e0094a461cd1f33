"""Tensor parallelism of hybrid (Qwen3.5) targets on the CPU: gloo groups of 2 ranks spawned by
the test. The split tiny hybrid's (dense and MoE) prefill, decode, tree-verify and committed
decode logits equal the unsplit ones, greedy speculative and autoregressive output with tp 2
equals tp 1 token for token, and a tp that does not divide the linear layers' heads is one clear
error naming the field."""
import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import jetspec_kernels as jk
from jetspec_kernels import tp
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import DraftHead, Qwen3_5
from jetspec_kernels.models.tiny import random_draft_weights, tiny_draft_config
from jetspec_kernels.models.tiny_hybrid import random_qwen3_5_weights, tiny_qwen3_5_config
from helpers import rel_l2

pytestmark = pytest.mark.usefixtures("reference_backend")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]
SPEC = dict(max_new_tokens=10, budget=8, topk=3)


def _pair(cfg, group):
    dcfg = tiny_draft_config(cfg, target_layer_ids=[1, 3], intermediate_size=96)
    return (Qwen3_5(cfg, random_qwen3_5_weights(cfg, 0), group=group),
            DraftHead(dcfg, random_draft_weights(dcfg, 1), group=group))


def _logits(target):
    """Prefill, decode, tree verify, then (the states committed along one path) decode again."""
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, target.config.vocab_size, (2, 6), generator=gen)
    lens = torch.tensor([6, 4], dtype=torch.int32)
    cache = target.new_cache(2, 32)
    last, _ = target.prefill(tokens, lens, cache)
    step = target.decode(tokens[:, 0].contiguous(), lens, cache)
    tree = jk.draft_tree(torch.randn(2, 3, target.config.vocab_size, generator=gen),
                         tokens[:, 1].contiguous(), budget=7, topk=2)
    ver, _ = target.verify(tree, lens + 1, cache)
    verdict = jk.verify_tree(tree, target_tokens=ver.argmax(-1).to(torch.int32))
    commit = jk.commit_kv(cache.k, cache.v, lens + 1, verdict)
    target.commit_states(cache, verdict)
    after = target.decode(verdict.bonus, commit.prefix_lens, cache)
    return {"prefill": last, "decode": step, "verify": ver, "after_commit": after,
            "pool_heads": cache.recurrent[0].shape[1]}


# widths on the CPU's vector edges (AVX-512: 32-float chunks): 40 v-heads (a rank's 20 gates are
# all a scalar tail, tp 1's first 32 a vector body), conv channels 304 / 152, attention 96 / 48
ODD = dict(linear_num_key_heads=4, linear_num_value_heads=40, linear_value_head_dim=6,
           num_attention_heads=6)


def _exact(cfg, dtypes=(torch.float32, torch.bfloat16), tokens=True):
    """The exact mode split and alone: with ``exact_k_parts`` 4 (two parts a rank) the logits of
    :func:`_logits`, float32 and bfloat16; with tp's own parts (the default) split, greedy
    speculative and autoregressive tokens, and the logits beside alone's (the power)."""
    from jetspec_kernels.ops.exact import exact_mode
    out = {}
    for name, group, parts in (("split", None, 4), ("alone", tp.ALONE, 4),
                               ("split default", None, None), ("alone default", tp.ALONE, None)):
        for dtype in (dtypes if parts else (torch.float32,)):
            weights = {k: t.to(dtype) for k, t in random_qwen3_5_weights(cfg, 0).items()}
            target = Qwen3_5(cfg, weights, group=group)
            target.exact_k_parts = parts
            with exact_mode():
                got = _logits(target)
            out[f"{name} {dtype}"] = {k: v for k, v in got.items() if k != "pool_heads"}
    if tokens:
        target, head = _pair(cfg, None)
        out["tokens"] = (generate(target, head, PROMPTS, exact=True, **SPEC).tokens,
                         generate_ar(target, PROMPTS, max_new_tokens=10, exact=True).tokens)
    return out


def scenario_two(rank, world):
    out = {}
    for name, moe in (("dense", 0), ("moe", 4)):
        cfg = tiny_qwen3_5_config(num_experts=moe)
        full, split = _pair(cfg, tp.ALONE), _pair(cfg, None)
        a, b = _logits(full[0]), _logits(split[0])
        out[name] = {k: rel_l2(b[k], a[k]) for k in ("prefill", "decode", "verify", "after_commit")}
        out[name]["pool_heads"] = (a["pool_heads"], b["pool_heads"])
        out[name]["spec"] = (generate(*full, PROMPTS, group=tp.ALONE, **SPEC).tokens,
                             generate(*split, PROMPTS, **SPEC).tokens)
        out[name]["ar"] = (generate_ar(full[0], PROMPTS, max_new_tokens=10, group=tp.ALONE).tokens,
                           generate_ar(split[0], PROMPTS, max_new_tokens=10).tokens)
        out[name]["exact"] = _exact(cfg)
    out["odd"] = _exact(tiny_qwen3_5_config(**ODD), dtypes=(torch.float32,), tokens=False)
    try:
        _pair(tiny_qwen3_5_config(linear_num_key_heads=1, linear_num_value_heads=3), None)
        out["odd_heads"] = None
    except ValueError as e:
        out["odd_heads"] = str(e)
    return out


def _entry(rank, world, tmp, timeout_s):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    jk.set_backend("reference")
    try:
        result = scenario_two(rank, world)
    except Exception as e:              # the asserts run in the test, on what each rank saw
        result = {"error": f"{type(e).__name__}: {e}"}
    torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
    os._exit(0)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp2_hybrid")
    mp.start_processes(_entry, args=(2, str(tmp), 300), nprocs=2, join=True, start_method="spawn")
    results = [torch.load(tmp / f"rank{r}.pt") for r in range(2)]
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_split_hybrid_equals_unsplit(two, model):
    for res in two:
        got = res[model]
        for what in ("prefill", "decode", "verify", "after_commit"):
            assert got[what] < 1e-5, (what, got[what])
        assert got["pool_heads"] == (4, 2)
        assert got["spec"][0] == got["spec"][1] == got["ar"][0] == got["ar"][1]
    assert two[0][model]["spec"] == two[1][model]["spec"]


def _same_bits(a, b):
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_exact_hybrid_tp2_equals_tp1(two, model):
    """The exact mode at tp 2: with exact_k_parts 4 (out_proj, o_proj, the MLP's, the shared
    expert's and the experts' down in parts, the ranks' float32 shares summed along the parts'
    tree) tp 2's prefill, decode, tree-verify and after-commit logits are tp 1's bit for bit in
    float32 and bfloat16; by default (tp's own parts) greedy speculative == autoregressive."""
    for res in two:
        got = res[model]["exact"]
        for dtype in (torch.float32, torch.bfloat16):
            split, alone = got[f"split {dtype}"], got[f"alone {dtype}"]
            for what in ("prefill", "decode", "verify", "after_commit"):
                assert _same_bits(split[what], alone[what]), (dtype, what)
        spec, ar = got["tokens"]
        assert spec == ar
        default = got[f"split default {torch.float32}"], got[f"alone default {torch.float32}"]
        assert any(not _same_bits(default[0][w], default[1][w])
                   for w in ("prefill", "decode", "verify", "after_commit")), \
            "tp's own parts gave tp 1's bits: the k_parts assertion above has no power here"
    assert two[0][model]["exact"]["tokens"] == two[1][model]["exact"]["tokens"]


def test_exact_hybrid_tp2_equals_tp1_at_odd_widths(two):
    """The same claim where a rank's rows of gates, conv channels and attention gates end in
    the CPU's scalar tail and tp 1's do not (the reference's padded lanes keep them equal)."""
    for res in two:
        split, alone = res["odd"][f"split {torch.float32}"], res["odd"][f"alone {torch.float32}"]
        for what in ("prefill", "decode", "verify", "after_commit"):
            assert _same_bits(split[what], alone[what]), what


def test_tp_must_divide_the_linear_heads(two):
    for res in two:
        assert res["odd_heads"] is not None and "linear_num_key_heads" in res["odd_heads"]
