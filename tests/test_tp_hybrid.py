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
    mp.start_processes(_entry, args=(2, str(tmp), 120), nprocs=2, join=True, start_method="spawn")
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


def test_tp_must_divide_the_linear_heads(two):
    for res in two:
        assert res["odd_heads"] is not None and "linear_num_key_heads" in res["odd_heads"]
