"""The exact mode end to end: the verify pass's rows equal the autoregressive step's bit for bit,
so greedy speculative output equals greedy autoregressive output on an adversarial near-tie
target, where the normal mode is shown to diverge on this machine (the tests' power)."""
from dataclasses import asdict

import pytest
import torch

from jetspec_kernels import python_ref as ref
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models.config import Qwen3MoeConfig
from jetspec_kernels.models.qwen3 import Qwen3
from jetspec_kernels.models.tiny import random_qwen3_weights, tiny_models, tiny_qwen3_config
from jetspec_kernels.ops.exact import ExactModeError, exact_mode
from jetspec_kernels.tree import Tree


@pytest.fixture(autouse=True)
def _reference(reference_backend):
    """The draft head's ops on the reference too (under the interpreter auto picks triton)."""


def near_tie(target) -> None:
    """Make every odd lm_head row its even neighbour scaled by 1 + eps/2 of the dtype (each entry
    within one ULP): whenever the top token is in a pair, the top-2 margin is at rounding scale,
    so one flipped bit anywhere in the forward can flip the greedy token."""
    w = target.lm_head_weight.clone()
    v = w.shape[0]
    eps = torch.finfo(w.dtype).eps
    w[1:v:2] = (w[0:v - 1:2].double() * (1 + eps / 2)).to(w.dtype)[: v // 2]
    target.lm_head_weight = w


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 90, (int(torch.randint(3, 12, (1,), generator=gen)),),
                          generator=gen).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def fp32_models():
    target, head = tiny_models(dtype=torch.float32)
    near_tie(target)
    return target, head


def test_normal_mode_diverges_on_the_near_tie_target(fp32_models):
    """The power of the end-to-end tests: without the exact mode, speculative and autoregressive
    greedy outputs differ here (float32 GEMM rows differ between M = 1 and M = N launches)."""
    target, head = fp32_models
    prompts = _prompts(4)
    ar = generate_ar(target, prompts, max_new_tokens=16).tokens
    spec = generate(target, head, prompts, max_new_tokens=16, budget=16).tokens
    assert ar != spec


@pytest.mark.parametrize("batch,budget,page_size", [(1, 16, None), (4, 16, 4), (1, 64, 16),
                                                    (4, 64, None)])
def test_exact_speculative_equals_autoregressive(fp32_models, batch, budget, page_size):
    target, head = fp32_models
    prompts = _prompts(batch)
    new = 6 if batch * budget > 64 else 10
    ar = generate_ar(target, prompts, max_new_tokens=new, page_size=page_size, exact=True).tokens
    spec = generate(target, head, prompts, max_new_tokens=new, budget=budget, page_size=page_size,
                    exact=True)
    assert spec.tokens == ar


def test_exact_bf16_and_a_sequence_alone_equals_inside_a_batch():
    target, head = tiny_models(dtype=torch.bfloat16)
    near_tie(target)
    prompts = _prompts(3, seed=1)
    batch = generate(target, head, prompts, max_new_tokens=8, budget=16, exact=True).tokens
    alone = generate(target, head, prompts[2:3], max_new_tokens=8, budget=16, exact=True).tokens
    ar = generate_ar(target, prompts[2:3], max_new_tokens=8, exact=True).tokens
    assert alone[0] == batch[2] == ar[0]


def _moe_target(dtype):
    cfg = Qwen3MoeConfig(**asdict(tiny_qwen3_config()), num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])
    return Qwen3(cfg, {k: t.to(dtype) for k, t in random_qwen3_weights(cfg, 0).items()})


def _tree(parents, tokens):
    n = parents.shape[1]
    num = torch.tensor([n], dtype=torch.int32)
    depths = torch.zeros_like(parents)
    for i in range(1, n):
        depths[0, i] = depths[0, parents[0, i]] + 1
    return Tree(tokens, parents, depths, torch.zeros(1, n), num,
                ref.pack_mask(parents, num).to(torch.int32), int(depths.max()))


@pytest.mark.parametrize("kind,dtype,page_size,fused_backend,tile,k_parts", [
    ("dense", torch.bfloat16, None, None, "narrow", None),
    ("dense", torch.float32, 4, None, "narrow", None), ("moe", torch.bfloat16, 4, None, "narrow", None),
    ("dense", torch.float32, 4, "triton", "narrow", None),
    ("dense", torch.float32, None, "triton", "wide", None),
    ("moe", torch.float32, None, "triton", "narrow", None),
    ("dense", torch.bfloat16, 4, None, "narrow", 4), ("dense", torch.float32, None, "triton", "narrow", 2),
    ("moe", torch.bfloat16, None, None, "narrow", 2), ("moe", torch.float32, 4, "triton", "narrow", 4)])
def test_exact_verify_logits_equal_autoregressive_logits(kind, dtype, page_size, fused_backend,
                                                          tile, k_parts):
    """Every tree node's verify logits == the logits of autoregressive decoding along its path
    (its ancestors committed at prefix .. prefix + depth - 1), bit for bit."""
    target = tiny_models(dtype=dtype)[0] if kind == "dense" else _moe_target(dtype)
    target.fused_ops_backend = fused_backend
    target.exact_gemm_tile = tile
    target.exact_k_parts = k_parts
    gen = torch.Generator().manual_seed(7)
    p, n, v = 7, 12, target.config.vocab_size
    prompt = torch.randint(0, v, (1, p), generator=gen)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8, 0]], dtype=torch.int32)
    tree = _tree(parents, torch.randint(0, v, (1, n), generator=gen, dtype=torch.int32))
    zero, plen = torch.zeros(1, dtype=torch.int32), torch.tensor([p], dtype=torch.int32)
    pos = torch.arange(p, dtype=torch.int32)[None]
    with exact_mode():
        cache = target.new_cache(1, 40, page_size=page_size)
        target.forward(prompt, pos, cache, zero)
        start = (cache.k.clone(), cache.v.clone())
        verified, _ = target.verify(tree, plen, cache)
        want = torch.full_like(verified, float("nan"))
        children = set(parents[0, 1:].tolist())
        for leaf in (i for i in range(n) if i not in children):
            path = [leaf]
            while parents[0, path[-1]] >= 0:
                path.append(int(parents[0, path[-1]]))
            cache.k.copy_(start[0])
            cache.v.copy_(start[1])
            for d, node in enumerate(reversed(path)):
                want[0, node] = target.decode(tree.tokens[:, node], plen + d, cache)[0]
        greedy, _ = target.verify(tree, plen, cache, fused_argmax=True)
    assert torch.equal(verified.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert torch.equal(greedy, torch.argmax(want, dim=-1).to(torch.int32))


def test_exact_gemm_tile_reaches_every_gemm():
    """The target's ``exact_gemm_tile`` is the tile its exact forward runs (the narrow and wide
    tiles give other bits), and the lm_head alone already shows it."""
    target = tiny_models(dtype=torch.float32)[0]
    target.fused_ops_backend = "triton"
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, target.config.vocab_size, (1, 9), generator=gen)
    pos = torch.arange(9, dtype=torch.int32)[None]
    zero = torch.zeros(1, dtype=torch.int32)
    out = {}
    for tile in ("narrow", "wide"):
        target.exact_gemm_tile = tile
        with exact_mode():
            hidden, _ = target.forward(tokens, pos, target.new_cache(1, 16), zero)
            out[tile] = (hidden, target.logits(hidden[0, -1:]))
    wide_head = out["wide"][1]
    target.exact_gemm_tile = "narrow"
    with exact_mode():
        narrow_head = target.logits(out["wide"][0][0, -1:])     # the wide hidden, narrow lm_head
    assert not torch.equal(out["narrow"][0], out["wide"][0])
    assert not torch.equal(narrow_head, wide_head)
    torch.testing.assert_close(out["narrow"][1], out["wide"][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_exact_k_parts_reach_the_row_parallel_gemms(backend, monkeypatch):
    """``exact_k_parts`` splits K of o_proj and the MLP's down (the row-parallel GEMMs, whose
    tensor-parallel shares are summed) and of nothing else; alone the sum is rounded in the op
    (no float32 share leaves it); the split changes the forward's bits (the power)."""
    from jetspec_kernels.ops import exact as ex
    target = tiny_models(dtype=torch.float32)[0]
    target.fused_ops_backend = backend
    cfg = target.config
    row_parallel = {(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim),
                    (cfg.hidden_size, cfg.intermediate_size)}
    seen, real = [], ex.linear
    monkeypatch.setattr(ex, "linear", lambda x, w, **kw: seen.append(
        (tuple(w.shape), kw.get("parts", 1), kw.get("partial", False))) or real(x, w, **kw))
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, cfg.vocab_size, (1, 5), generator=gen)
    pos = torch.arange(5, dtype=torch.int32)[None]
    zero = torch.zeros(1, dtype=torch.int32)
    hidden = {}
    for parts in (None, 4):
        seen.clear()
        target.exact_k_parts = parts
        with exact_mode():
            hidden[parts], _ = target.forward(tokens, pos, target.new_cache(1, 8), zero)
        assert len(seen) == 4 * cfg.num_hidden_layers           # qkv, o, gate_up, down
        assert {(s, p) for s, p, _ in seen} == {(s, (parts or 1) if s in row_parallel else 1)
                                                for s, _, _ in seen}
        assert not any(partial for _, _, partial in seen)
    assert not torch.equal(hidden[None], hidden[4])


def test_exact_k_parts_limits_and_refusals():
    """exact_k_parts: a power of two up to limits.EXACT_MAX_K_PARTS (64 runs, 128 is refused), a
    K that is not whole parts named (a dense down, a MoE target's experts' down)."""
    target = tiny_models(dtype=torch.float32)[0]      # o_proj K 64, down K 128
    for bad, match in ((3, "power of two"), (True, "power of two"), (0, "power of two"),
                       (128, "power of two <= 64, got 128")):
        target.exact_k_parts = bad
        with pytest.raises(ValueError, match=match):
            generate_ar(target, [[1, 2]], max_new_tokens=2, exact=True)
    target.exact_k_parts = 64
    assert generate_ar(target, [[1, 2]], max_new_tokens=2, exact=True).tokens
    cfg = tiny_qwen3_config(intermediate_size=96)
    odd = Qwen3(cfg, random_qwen3_weights(cfg, 0))
    odd.exact_k_parts = 64
    with pytest.raises(ValueError, match=r"K of mlp.down_proj.weight \(96\) is not 64 equal parts"):
        generate_ar(odd, [[1, 2]], max_new_tokens=2, exact=True)
    moe = _moe_target(torch.float32)
    k = moe.config.moe_intermediate_size
    moe.exact_k_parts = 64
    with pytest.raises(ValueError, match=rf"K of mlp.experts.down_proj \({k}\) is not 64 equal parts"):
        generate_ar(moe, [[1, 2]], max_new_tokens=2, exact=True)


def test_exact_moe_speculative_equals_autoregressive():
    target = _moe_target(torch.bfloat16)
    near_tie(target)
    head = tiny_models(dtype=torch.bfloat16)[1]
    prompts = _prompts(2, seed=3)
    ar = generate_ar(target, prompts, max_new_tokens=8, exact=True).tokens
    assert generate(target, head, prompts, max_new_tokens=8, budget=16, exact=True).tokens == ar


def test_exact_refusals(fp32_models):
    target, head = fp32_models
    with pytest.raises(TypeError, match="exact must be a bool"):
        generate_ar(target, [[1, 2]], max_new_tokens=2, exact="yes")
    target.exact_gemm_tile = "square"
    try:
        with pytest.raises(ValueError, match="exact_gemm_tile must be one of"):
            generate_ar(target, [[1, 2]], max_new_tokens=2, exact=True)
    finally:
        del target.exact_gemm_tile
    target.fused_ops_backend = "cuda"
    try:
        with pytest.raises(ExactModeError, match="'cuda' backend"):
            generate_ar(target, [[1, 2]], max_new_tokens=2, exact=True)
    finally:
        target.fused_ops_backend = None


@pytest.mark.parametrize("kind,tile", [("dense", "narrow"), ("dense", "wide"), ("moe", "narrow")])
def test_exact_triton_speculative_equals_autoregressive(fp32_models, kind, tile):
    """The triton exact path (fixed-tile GEMMs, grouped for the experts, per-row norms, the
    logical-order attention in one launch), under the interpreter: greedy speculative ==
    autoregressive on the near-tie target, a batch of two ragged prompts, paged, budget 16;
    with either GEMM tile the engine fixes."""
    target, head = fp32_models
    if kind == "moe":
        target = _moe_target(torch.float32)
        near_tie(target)
    prompts = _prompts(2, seed=6)        # a seed whose drafts get tokens accepted (each kind)
    target.fused_ops_backend = "triton"
    target.exact_gemm_tile = tile
    try:
        ar = generate_ar(target, prompts, max_new_tokens=8, page_size=4, exact=True).tokens
        spec = generate(target, head, prompts, max_new_tokens=8, budget=16, page_size=4,
                        exact=True)
    finally:
        target.fused_ops_backend = None
        del target.exact_gemm_tile
    assert spec.tokens == ar
    assert sum(spec.stats.accept_histogram[1:]) >= 1, "some draft token should be accepted"


@pytest.mark.slow
@pytest.mark.parametrize("batch,budget,page_size", [(16, 64, 8), (1, 256, 16)])
def test_exact_triton_large_batches_and_budgets(fp32_models, batch, budget, page_size):
    """The issue's largest cases on the triton exact path (minutes under the interpreter: make
    test-slow): B 16 at budget 64 and B 1 at budget 256, paged; greedy speculative ==
    autoregressive on the near-tie target."""
    target, head = fp32_models
    prompts = _prompts(batch, seed=4)
    target.fused_ops_backend = "triton"
    try:
        ar = generate_ar(target, prompts, max_new_tokens=6, page_size=page_size, exact=True).tokens
        spec = generate(target, head, prompts, max_new_tokens=6, budget=budget,
                        page_size=page_size, exact=True)
    finally:
        target.fused_ops_backend = None
    assert spec.tokens == ar


def test_cli_exact(capsys, monkeypatch):
    from jetspec_kernels.__main__ import main
    from jetspec_kernels.ops import exact as ex
    from jetspec_kernels.triton import exact_matmul
    seen = []
    real = exact_matmul.exact_linear
    monkeypatch.setattr(exact_matmul, "exact_linear",
                        lambda x, w, tile="narrow", **kw: seen.append(tile) or real(x, w, tile, **kw))
    for backend, tile in (("reference", None), ("triton", None), ("triton", "wide")):
        seen.clear()
        rc = main(["generate", "--random-tiny", "--prompt", "1 2 3", "--max-new-tokens", "4",
                   "--budget", "16", "--ar", "--exact", "--backend", backend]
                  + (["--exact-tile", tile] if tile else []))
        assert rc == 0 and "greedy outputs match" in capsys.readouterr().out, backend
        assert set(seen) == (set() if backend == "reference" else {tile or "narrow"}), seen
    rc = main(["generate", "--random-tiny", "--prompt", "1 2 3", "--exact-tile", "wide"])
    assert rc == 2 and "--exact-tile needs --exact" in capsys.readouterr().err
    rc = main(["generate", "--random-tiny", "--prompt", "1 2 3", "--exact-k-parts", "2"])
    assert rc == 2 and "--exact-k-parts needs --exact" in capsys.readouterr().err
    exact_k = ["generate", "--random-tiny", "--prompt", "1 2 3", "--max-new-tokens", "4", "--exact",
               "--backend", "reference", "--ar", "--exact-k-parts"]
    assert main(exact_k + ["2"]) == 0 and "greedy outputs match" in capsys.readouterr().out
    assert main(exact_k + ["3"]) == 2
    assert ("--exact-k-parts: exact_k_parts must be None or a power of two <= 64, got 3"
            in capsys.readouterr().err)
    assert main(exact_k + ["0"]) == 2 and "must be an int >= 1" in capsys.readouterr().err

    def refuse(op, device, backend):
        raise ExactModeError(f"exact mode: {op} on {device.type} is not shown row-invariant")
    monkeypatch.setattr(ex, "exact_backend", refuse)
    rc = main(["generate", "--random-tiny", "--prompt", "1 2 3", "--max-new-tokens", "4",
               "--exact", "--backend", "reference"])
    err = capsys.readouterr().err
    assert rc == 2 and "--exact: exact mode" in err and "not shown row-invariant" in err


def _sharp_models():
    from test_decode import _sharp_tiny
    return _sharp_tiny()


@pytest.mark.parametrize("controls", [dict(temperature=0.9),
                                      dict(temperature=torch.tensor([0.7, 0.0, 1.3]), top_k=3,
                                           top_p=0.9)], ids=["T", "per-sequence T, top-k, top-p"])
def test_exact_sampling_is_pathwise(controls):
    """Same seed: speculative sampling emits autoregressive sampling's tokens (the noise keyed by
    logical position); the normal mode's noise is keyed by round and node, so it does not."""
    target, head = _sharp_models()
    prompts = [[1, 2, 3], [4, 5], [6, 0, 1, 2]]
    kw = dict(max_new_tokens=8, seed=5, **controls)
    spec = generate(target, head, prompts, budget=6, topk=3, exact=True, **kw)
    assert sum(spec.stats.accept_histogram[1:]) >= 2, "the draft should get some tokens accepted"
    assert spec.tokens == generate_ar(target, prompts, exact=True, **kw).tokens


def test_normal_sampling_is_not_pathwise():
    target, head = _sharp_models()
    prompts = [[1, 2, 3], [4, 5], [6, 0, 1, 2]]
    kw = dict(max_new_tokens=8, seed=5, temperature=0.9)
    assert generate(target, head, prompts, budget=6, topk=3, **kw).tokens != \
        generate_ar(target, prompts, **kw).tokens


def test_exact_sampling_follows_the_target_law():
    """Autoregressive sampling in the exact mode (noise keyed by position) samples the target's
    law (chi-square on three tokens); the pathwise test carries it to speculative sampling."""
    from test_decode import SHARP_PROMPT, SHARP_TEMPERATURE, check_sampling_law
    target, _ = _sharp_models()
    tokens = generate_ar(target, [SHARP_PROMPT] * 600, max_new_tokens=3,
                         temperature=SHARP_TEMPERATURE, seed=11, exact=True).tokens
    check_sampling_law("exact ar", tokens, target)
