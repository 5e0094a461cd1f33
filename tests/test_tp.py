"""Tensor parallelism on the CPU: gloo process groups of 2 and 4 ranks spawned by the test.

Each spawn runs one scenario on every rank and saves what it found (numbers, tokens, errors) for
the asserts here, so one spawn serves several tests: the split tiny target's logits (dense and
MoE) and the split draft head's equal the unsplit ones (rel-L2), greedy speculative output with
tp 2 and 4 equals tp 1 token for token, a tp group beside another broadcasts from its own first
rank, sampled output is identical on every rank and follows the target's law (test_decode's
chi-square test), a tp that does not divide the heads and ranks that disagree are one clear error,
and a rank that dies makes the others fail instead of hang.
"""
import os
import socket
import time
from dataclasses import asdict, replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import jetspec_kernels as jk
from jetspec_kernels import tp
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import DraftHead, Qwen3
from jetspec_kernels.models.config import Qwen3MoeConfig
from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights,
                                         tiny_draft_config, tiny_models, tiny_qwen3_config)
from helpers import rel_l2

pytestmark = pytest.mark.usefixtures("reference_backend")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]
SPEC = dict(max_new_tokens=12, budget=8, topk=3)


# ---- the ranks' side ------------------------------------------------------------------------

def _entry(rank, world, tmp, scenario, timeout_s, env):
    torch.set_num_threads(1)
    os.environ.update(env)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    jk.set_backend("reference")
    try:
        result = SCENARIOS[scenario](rank, world)
    except Exception as e:              # the asserts run in the test, on what each rank saw
        result = {"error": f"{type(e).__name__}: {e}"}
    torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
    os._exit(0)                         # no teardown: a dead peer must not make it hang


def _pair(cfg, seed, group, **head_fields):
    dcfg = tiny_draft_config(cfg, **head_fields)
    return (Qwen3(cfg, random_qwen3_weights(cfg, seed), group=group),
            DraftHead(dcfg, random_draft_weights(dcfg, seed + 1), group=group))


def _moe_config(**fields):
    base = asdict(tiny_qwen3_config(**fields))
    return Qwen3MoeConfig(**base, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          norm_topk_prob=True, mlp_only_layers=[1])


def _logit_errors(full, split):
    """rel-L2 of the split models' prefill, decode and tree-verify logits and draft logits against
    the unsplit ones (the same weights)."""
    (t1, h1), (t2, h2) = full, split
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, t1.config.vocab_size - 1, (2, 6), generator=gen)
    lens = torch.tensor([6, 4], dtype=torch.int32)
    out = {}
    res = []
    for target in (t1, t2):
        cache = target.new_cache(2, 32)
        last, taps = target.prefill(tokens, lens, cache, taps=[1])
        step = target.decode(tokens[:, 0].contiguous(), lens, cache)
        tree = jk.draft_tree(torch.randn(2, 3, target.config.vocab_size, generator=torch.Generator()
                                         .manual_seed(6)), tokens[:, 1].contiguous(), budget=7, topk=2)
        ver, _ = target.verify(tree, lens + 1, cache)
        res.append((last, step, ver, taps, cache.k.shape[2]))
    for name, a, b in zip(("prefill", "decode", "verify", "taps"), res[0], res[1]):
        out[name] = rel_l2(b, a)
    out["kv_heads"] = (res[0][4], res[1][4])
    anchor = tokens[:, 2].contiguous()
    d1 = h1.draft_logits(res[0][3], anchor, embed_weight=t1.embed_weight, lm_head_weight=t1.lm_head_weight)
    d2 = h2.draft_logits(res[1][3], anchor, embed_weight=t2.embed_weight, lm_head_weight=t2.lm_head_weight)
    out["draft"] = rel_l2(d2, d1)
    return out


def _greedy(full, split):
    """Greedy tokens, speculative and baseline, unsplit then split."""
    (t1, h1), (t2, h2) = full, split
    return {"spec": (generate(t1, h1, PROMPTS, group=tp.ALONE, **SPEC).tokens,
                     generate(t2, h2, PROMPTS, **SPEC).tokens),
            "ar": (generate_ar(t1, PROMPTS, max_new_tokens=12, group=tp.ALONE).tokens,
                   generate_ar(t2, PROMPTS, max_new_tokens=12).tokens)}


def _exact_logits(target):
    """The exact mode's prefill, decode and tree-verify logits of ``target`` on fixed inputs."""
    from jetspec_kernels.ops.exact import exact_mode
    gen = torch.Generator().manual_seed(5)
    v = target.config.vocab_size
    tokens = torch.randint(0, v - 1, (2, 6), generator=gen)
    lens = torch.tensor([6, 4], dtype=torch.int32)
    cache = target.new_cache(2, 32, page_size=4)
    with exact_mode():
        last, _ = target.prefill(tokens, lens, cache)
        step = target.decode(tokens[:, 0].contiguous(), lens, cache)
        tree = jk.draft_tree(torch.randn(2, 3, v, generator=gen), tokens[:, 1].contiguous(),
                             budget=7, topk=2)
        verified, _ = target.verify(tree, lens + 1, cache)
    return {"prefill": last, "decode": step, "verify": verified}


def _k_parts_logits(cfg, seed, parts):
    """:func:`_exact_logits` split over the group and alone, both with ``exact_k_parts = parts``
    (the claim: the same bits; float32 and bfloat16, where a rank's share must stay unrounded),
    and split with the default (tp's own parts) beside alone with one part (the power: they
    differ)."""
    out = {}
    for name, group, k_parts in (("split", None, parts), ("alone", tp.ALONE, parts),
                                 ("split default", None, None), ("alone default", tp.ALONE, None)):
        weights = random_qwen3_weights(cfg, seed)
        target = Qwen3(cfg, weights, group=group)
        target.exact_k_parts = k_parts
        out[name] = _exact_logits(target)
        if k_parts is not None:
            target = Qwen3(cfg, {k: t.to(torch.bfloat16) for k, t in weights.items()}, group=group)
            target.exact_k_parts = k_parts
            out[name].update({f"{k} bf16": t for k, t in _exact_logits(target).items()})
    return out


def _errors(fn):
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def scenario_two(rank, world):
    """tp 2: logits and greedy output of dense and MoE models, sampling, the refusals."""
    from test_decode import _sharp_tiny, sampling_law_runs
    out = {}
    for name, cfg in (("dense", tiny_qwen3_config()), ("moe", _moe_config())):
        full, split = _pair(cfg, 0, tp.ALONE), _pair(cfg, 0, None)
        out[name] = {"logits": _logit_errors(full, split), "greedy": _greedy(full, split)}
    out["sampled"] = sampling_law_runs(*_sharp_tiny(), n=600, runs=("topn",))["topn"]
    full = _pair(tiny_qwen3_config(), 0, tp.ALONE)
    out["unsplit_models_on_a_group"] = _errors(lambda: generate(*full, PROMPTS, **SPEC))
    split = _pair(tiny_qwen3_config(), 0, None)
    mine = [p + [rank] for p in PROMPTS]
    out["ranks_disagree"] = _errors(lambda: generate(*split, mine, **SPEC))
    out["ar_ranks_disagree"] = _errors(lambda: generate_ar(split[0], mine, max_new_tokens=4))
    # Adaptive budget, each rank with its own cost model: rank 0's makes size 2 the best, rank 1's
    # size 8; every rank must use rank 0's (else the ranks verify trees of different sizes).
    costs = {2: 1.0, 4: 50.0, 8: 50.0} if rank == 0 else {2: 50.0, 4: 50.0, 8: 1.0}
    adaptive = generate(*split, PROMPTS, max_new_tokens=12, budget=[2, 4, 8], topk=3,
                        cost_model=costs)
    out["adaptive"] = (adaptive.tokens, adaptive.stats.budget_sizes)
    out["check_can_fail"] = _errors(lambda: tp.check_same(torch.tensor([rank]), split[0].shard, "x"))
    out["odd_heads"] = _errors(lambda: _pair(tiny_qwen3_config(num_attention_heads=3,
                                                               num_key_value_heads=1), 0, None))
    out["group_fields"] = _group_field_errors(rank)
    return out


def _group_field_errors(rank):
    """The group checks, each field alone: a Shard claiming another rank, size or no group
    (tp.shard_of), and a model split over a shard differing from the run's in only its rank,
    size or process group (check_group). Local checks only: a rank that fails one must not leave
    its peer waiting in a collective."""
    from types import SimpleNamespace
    from jetspec_kernels.decode.arguments import check_group
    world = tp.shard_of(None)
    other = dist.new_group([0, 1])                 # the same ranks, another process group
    model = lambda **f: SimpleNamespace(shard=replace(world, **f))
    return {
        "shard_rank_zero": _errors(lambda: tp.shard_of(tp.Shard(world.group, 0, 2))),
        "shard_size": _errors(lambda: tp.shard_of(tp.Shard(world.group, rank, 4))),
        "shard_no_group": _errors(lambda: tp.shard_of(tp.Shard(None, 0, 2))),
        "models_on_rank_zero": _errors(lambda: _pair(tiny_qwen3_config(), 0,
                                                     tp.Shard(world.group, 0, 2))),
        "model_same": _errors(lambda: check_group(None, target=model())),
        "model_rank": _errors(lambda: check_group(None, target=model(rank=1 - rank))),
        "model_size": _errors(lambda: check_group(None, target=model(size=4))),
        "model_group": _errors(lambda: check_group(None, head=model(group=other))),
    }


def scenario_four(rank, world):
    """tp 4 (8 query and 4 key/value heads): logits and greedy output; the default tiny models
    (2 key/value heads) refused."""
    cfg = tiny_qwen3_config(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    full, split = _pair(cfg, 2, tp.ALONE), _pair(cfg, 2, None)
    out = {"logits": _logit_errors(full, split), "greedy": _greedy(full, split),
           "kv_heads_2": _errors(lambda: _pair(tiny_qwen3_config(), 0, None)),
           "cli": _cli(rank, ["generate", "--tiny", "--prompt", "x", "--device", "cpu", "--tp", "4"],
                       dict(RANK=str(rank), WORLD_SIZE=str(world)))}
    out["reduce_rows"] = _reduce_row_mismatches(rank, split[0].shard)
    exact = dict(max_new_tokens=6, group=None, exact=True)
    out["exact"] = (generate(*split, PROMPTS, budget=8, topk=3, **exact).tokens,
                    generate_ar(split[0], PROMPTS, **exact).tokens)
    out["k_parts"] = _k_parts_logits(cfg, 2, 4)
    out["k_parts_moe"] = _k_parts_logits(_moe_config(num_attention_heads=8, num_key_value_heads=4,
                                                     head_dim=8), 3, 4)
    split[0].exact_k_parts = 2       # tp 4 does not divide it
    out["k_parts_2"] = _errors(lambda: generate_ar(split[0], PROMPTS, **exact))
    # Two tp groups of two ranks (as beside data parallelism): each has its own first rank.
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    shard = tp.shard_of(groups[rank // 2])
    x = torch.tensor([100 + rank])
    tp.broadcast_first(x, shard)
    out["subgroup"] = (shard.rank, shard.size, int(x))
    return out


def _reduce_row_mismatches(rank, shard):
    """Rows of a [M, H] sum over the ranks whose bits differ from the same row summed alone
    ([1, H]): (tp.all_reduce's, tp.all_reduce_pairwise's), and the latter's result."""
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(16, 64, generator=gen) * torch.logspace(-3, 3, 64)
    full, ordered = tp.all_reduce(x.clone(), shard), tp.all_reduce_pairwise(x, shard)
    plain = sum(not torch.equal(tp.all_reduce(x[i:i + 1].clone(), shard)[0], full[i])
                for i in range(16))
    mine = sum(not torch.equal(tp.all_reduce_pairwise(x[i:i + 1].clone(), shard)[0],
                               ordered[i]) for i in range(16))
    return plain, mine, ordered


def _cli(rank, argv, env):
    """``jetspec`` with ``argv`` on this rank (the group already up): (status, stdout, stderr)."""
    import contextlib
    import io

    from jetspec_kernels.__main__ import main
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def scenario_death(rank, world):
    """Rank 1 dies after joining; rank 0's generate must fail, not hang."""
    if rank == 1:
        os._exit(0)
    split = _pair(tiny_qwen3_config(), 0, None)
    t0 = time.monotonic()
    err = _errors(lambda: generate(*split, PROMPTS, **SPEC))
    return {"error_seen": err, "seconds": time.monotonic() - t0}


def scenario_cli(rank, world):
    """The CLI as torchrun starts it (RANK / WORLD_SIZE / MASTER_* set, no group yet)."""
    import contextlib
    import io

    from jetspec_kernels.__main__ import main
    dist.destroy_process_group()        # the CLI initialises its own from the environment
    out, err = io.StringIO(), io.StringIO()
    argv = ["generate", "--tiny", "--prompt", "def f(x):", "--max-new-tokens", "6", "--budget", "4",
            "--device", "cpu", "--backend", "reference", "--tp", str(world), "--ar"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
        bad_rc = main(argv[:-3] + ["--tp", str(world + 1)])
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "bad_rc": bad_rc}


def scenario_exact(rank, world):
    """tp 2 in the exact mode on the near-tie target (test_exact_decode): greedy speculative and
    autoregressive tokens, exact and normal, split; and the exact tokens unsplit, for the record."""
    from test_exact_decode import _prompts, near_tie
    out = {}
    for name, group in (("split", None), ("alone", tp.ALONE)):
        target, head = tiny_models(dtype=torch.float32, group=group)
        near_tie(target)
        prompts = _prompts(4)
        for mode, exact in (("exact", True), ("normal", False)):
            if name == "alone" and not exact:
                continue
            ar = generate_ar(target, prompts, max_new_tokens=10, exact=exact, group=group).tokens
            spec = generate(target, head, prompts, max_new_tokens=10, budget=16, exact=exact,
                            group=group).tokens
            out[f"{name} {mode}"] = (spec, ar)
        target.exact_k_parts = 4        # two parts a rank split, four alone: the same bits
        out[f"{name} k_parts"] = (
            generate(target, head, prompts, max_new_tokens=10, budget=16, exact=True,
                     group=group).tokens,
            generate_ar(target, prompts, max_new_tokens=10, exact=True, group=group).tokens)
    out["k_parts"] = _k_parts_logits(tiny_qwen3_config(), 0, 4)
    out["k_parts_moe"] = _k_parts_logits(_moe_config(), 1, 4)
    # widths at the CPU's edges: hidden 30 (N % 4), I / tp 66 (silu's vector tail, parts of 33)
    out["k_parts_odd"] = _k_parts_logits(tiny_qwen3_config(hidden_size=30, intermediate_size=132), 0, 2)
    out["k_parts_cli"] = _cli(rank, K_PARTS_CLI + ["--tp", str(world)],
                              dict(RANK=str(rank), WORLD_SIZE=str(world)))
    return out


# tp 2 and tp 1 print the same tokens with these (the test compares them)
K_PARTS_CLI = ["generate", "--tiny", "--prompt", "def f(x):", "--prompt", "x = 1",
               "--max-new-tokens", "8", "--budget", "6", "--device", "cpu", "--backend",
               "reference", "--exact", "--exact-k-parts", "2", "--ar"]


SCENARIOS = {"two": scenario_two, "four": scenario_four, "death": scenario_death, "cli": scenario_cli,
             "exact": scenario_exact}


# ---- the test's side --------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path, world, scenario, timeout_s=60, env=None):
    env = dict(env or {})
    mp.start_processes(_entry, args=(world, str(tmp_path), scenario, timeout_s, env), nprocs=world,
                       join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") if (tmp_path / f"rank{r}.pt").exists() else None
            for r in range(world)]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("tp2"), 2, "two", env={tp.CHECK_ENV: "1"})


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("tp4"), 4, "four", env={tp.CHECK_ENV: "1"})


def _no_errors(results):
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_split_logits_equal_unsplit(two, model):
    _no_errors(two)
    for res in two:
        err = res[model]["logits"]
        assert err["kv_heads"] == (2 * 2, 2 * 1)          # 2 layers x (2 heads alone, 1 per rank)
        for what in ("prefill", "decode", "verify", "taps", "draft"):
            assert err[what] < 1e-5, (model, what, err[what])


def test_split_logits_equal_unsplit_four_ranks(four):
    _no_errors(four)
    for res in four:
        err = res["logits"]
        assert err["kv_heads"] == (2 * 4, 2 * 1)
        for what in ("prefill", "decode", "verify", "taps", "draft"):
            assert err[what] < 1e-5, (what, err[what])


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_greedy_output_tp2_equals_tp1(two, model):
    _no_errors(two)
    for res in two:
        for loop in ("spec", "ar"):
            alone, split = res[model]["greedy"][loop]
            assert split == alone, (model, loop)
        assert res[model]["greedy"]["spec"][0] == res[model]["greedy"]["ar"][0]
    assert two[0][model]["greedy"] == two[1][model]["greedy"]


def test_subgroups_broadcast_from_their_own_first_rank(four):
    _no_errors(four)
    assert [res["subgroup"] for res in four] == [(0, 2, 100), (1, 2, 100), (0, 2, 102), (1, 2, 102)]


def test_greedy_output_tp4_equals_tp1(four):
    _no_errors(four)
    for res in four:
        for loop in ("spec", "ar"):
            alone, split = res["greedy"][loop]
            assert split == alone, loop


@pytest.fixture(scope="module")
def exact_two(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("tp2exact"), 2, "exact", timeout_s=300)


def test_exact_mode_tp2_speculative_equals_autoregressive(exact_two):
    """The exact mode at tp 2 (row-parallel sums gathered and added along the pairwise tree):
    greedy speculative output equals greedy autoregressive output, token for token, on every
    rank, on the near-tie target where the normal mode's differ."""
    results = [{k: v for k, v in res.items() if not k.startswith("k_parts")} for res in exact_two]
    _no_errors(results)
    assert results[0] == results[1]
    spec, ar = results[0]["split exact"]
    assert spec == ar
    normal_spec, normal_ar = results[0]["split normal"]
    assert normal_spec != normal_ar, "the near-tie target no longer separates the modes at tp 2"


def _same_bits(a, b):
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def _assert_k_parts_logits(results, key="k_parts"):
    """Split == alone bit for bit with exact_k_parts on every rank (prefill, decode, tree verify);
    split with tp's own parts != alone with one (the power)."""
    _no_errors(results)
    for res in results:
        got = res[key]
        assert len(got["split"]) == 6
        for what in got["split"]:
            assert _same_bits(got["split"][what], got["alone"][what]), what
        assert any(not _same_bits(got["split default"][w], got["alone default"][w])
                   for w in ("prefill", "decode", "verify"))


def test_exact_k_parts_tp2_equals_tp1(exact_two):
    """exact_k_parts 4 at tp 2 (two parts a rank, then the ranks' tree) and alone (four parts):
    the same logits bit for bit, dense and MoE (the experts' down shares summed per (token,
    choice) row before the choices are weighted), and the same greedy speculative and
    autoregressive tokens on the near-tie target."""
    _assert_k_parts_logits(exact_two)
    _assert_k_parts_logits(exact_two, "k_parts_moe")
    _assert_k_parts_logits(exact_two, "k_parts_odd")
    for res in exact_two:
        assert res["split k_parts"] == res["alone k_parts"]
        spec, ar = res["split k_parts"]
        assert spec == ar


def test_cli_exact_k_parts_tp2_prints_tp1s_tokens(exact_two):
    """``jetspec generate --exact --exact-k-parts 2 --ar`` under tp 2 (gloo) prints the tokens the
    same command prints alone, and its speculative output matches its baseline."""
    import contextlib
    import io

    from jetspec_kernels.__main__ import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(K_PARTS_CLI) == 0

    def tokens(text):
        lines = text.splitlines()
        return [lines[i + 1] for i, line in enumerate(lines) if line.startswith("--- prompt")]
    rc, printed, err = exact_two[0]["k_parts_cli"]
    assert rc == 0, err
    assert "greedy outputs match" in printed and "greedy outputs match" in out.getvalue()
    assert len(tokens(printed)) == 2 and tokens(printed) == tokens(out.getvalue())


def test_exact_k_parts_tp4_equals_tp1(four):
    _assert_k_parts_logits(four)
    _assert_k_parts_logits(four, "k_parts_moe")
    assert all(res["k_parts_2"] == "ValueError: exact_k_parts (2) must be a multiple of tp (4): "
               "every rank reduces whole parts of K" for res in four)


def test_rank_order_reduction_is_row_invariant(four):
    """At tp 4 gloo's all_reduce sums a row in another order inside a 16-row message than alone
    (the power); the exact mode's rank-order sum gives every row the same bits either way, and
    every rank the same bits."""
    _no_errors(four)
    for res in four:
        plain, mine, _ = res["reduce_rows"]
        assert plain > 0 and mine == 0, (plain, mine)
    assert all(torch.equal(res["reduce_rows"][2], four[0]["reduce_rows"][2]) for res in four)


def test_exact_mode_tp4_speculative_equals_autoregressive(four):
    _no_errors(four)
    spec, ar = four[0]["exact"]
    assert spec == ar
    assert all(res["exact"] == four[0]["exact"] for res in four)


def test_sampled_output_same_on_every_rank_and_follows_the_target(two):
    from test_decode import check_sampling_law
    _no_errors(two)
    assert two[0]["sampled"] == two[1]["sampled"]
    check_sampling_law("topn, tp 2", two[0]["sampled"])


def test_bad_tp_and_disagreeing_ranks_are_one_clear_error(two, four):
    for res in two:
        assert res["unsplit_models_on_a_group"].startswith("ValueError: group: the target is split "
                                                           "over tp=1")
        assert "generate's arguments" in res["ranks_disagree"] and "differ across the 2 ranks" in \
            res["ranks_disagree"]
        assert res["check_can_fail"].startswith("RuntimeError: tensor parallelism: x differ")
        assert "tp=2 must divide num_attention_heads (3) and num_key_value_heads (1)" in res["odd_heads"]
    for rank, res in enumerate(four):
        assert res["kv_heads_2"].startswith("ValueError: Qwen3: tp=4 must divide "
                                            "num_attention_heads (4) and num_key_value_heads (2)")
        rc, out, err = res["cli"]                     # the shipped tiny models: 2 key/value heads
        assert rc == 2 and out == ""
        if rank:
            assert err == ""
        else:
            assert err.startswith("jetspec: error: --tp 4: target checkpoint ") and err.endswith(
                "tp=4 must divide num_attention_heads (4) and num_key_value_heads (2): each rank "
                "holds whole heads\n") and err.count("\n") == 1, err


def test_the_group_check_catches_each_field_alone(two):
    """Two ranks both claiming rank 0 of the group (models loaded with that Shard would hold the
    same slices and sum them twice) fail on the rank that is not 0; a Shard's size, a parallel
    Shard without a group, and a model's shard differing from the run's in only its rank, size or
    process group: each one clear error naming group."""
    for rank, res in enumerate(two):
        g = res["group_fields"]
        claim = (f"ValueError: group: the Shard says rank 0 of 2, but this process is rank {rank} "
                 f"of 2 in its process group")
        assert g["shard_rank_zero"] == (claim if rank else None)
        assert g["models_on_rank_zero"] == (claim if rank else None)
        assert g["shard_size"] == (f"ValueError: group: the Shard says rank {rank} of 4, but this "
                                   f"process is rank {rank} of 2 in its process group")
        assert g["shard_no_group"] == ("ValueError: group: the Shard says rank 0 of 2, but this "
                                       "process is rank 0 of 1 without a process group")
        assert g["model_same"] is None
        assert g["model_rank"].startswith(f"ValueError: group: the target is split over tp=2 ranks "
                                          f"(this rank {1 - rank}), the process group has 2 (this "
                                          f"rank {rank})")
        assert g["model_size"].startswith("ValueError: group: the target is split over tp=4 ranks")
        assert g["model_group"].startswith("ValueError: group: the head is split over another "
                                           "process group of 2 ranks")


def test_generate_ar_refuses_ranks_that_disagree(two):
    """generate_ar checks its arguments across ranks as generate does (prompts that differ would
    mix the ranks' partial sums silently)."""
    for res in two:
        err = res["ar_ranks_disagree"]
        assert err is not None and err.startswith("RuntimeError: tensor parallelism: generate_ar's "
                                                  "arguments") and "differ across the 2 ranks" in err


def test_adaptive_budget_uses_the_first_ranks_cost_model(two):
    _no_errors(two)
    for res in two:
        tokens, sizes = res["adaptive"]
        assert tokens == res["dense"]["greedy"]["ar"][0]
        assert sizes and set(sizes) == {2}, sizes


def test_a_dead_rank_makes_the_others_fail_not_hang(tmp_path):
    t0 = time.monotonic()
    res = _spawn(tmp_path, 2, "death", timeout_s=5)
    assert res[1] is None                              # it died without a word
    assert res[0]["error_seen"] is not None, "rank 0 finished a collective without its peer"
    assert res[0]["seconds"] < 30 and time.monotonic() - t0 < 90


def test_cli_tiny_tp2_on_gloo(tmp_path):
    port = _free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    res = _spawn_cli(tmp_path, env)
    assert res[0]["rc"] == 0 and res[1]["rc"] == 0, res
    assert "greedy outputs match" in res[0]["out"] and "tp 2" in res[0]["out"]
    assert res[1]["out"] == "" and res[1]["err"] == ""               # rank 0 alone prints
    assert res[0]["bad_rc"] == 2 and res[1]["bad_rc"] == 2
    assert res[0]["err"].strip() == ("jetspec: error: --tp 3 needs exactly 3 processes (run under "
                                     "torchrun --nproc-per-node 3); this launch has WORLD_SIZE=2")


def _spawn_cli(tmp_path, env):
    """scenario_cli on 2 ranks, each with torchrun's RANK / LOCAL_RANK in its environment."""
    procs = []
    ctx = mp.get_context("spawn")
    for rank in range(2):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(ctx.Process(target=_entry, args=(rank, 2, str(tmp_path), "cli", 60, e)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
