"""The layouts serving engines hand to kernels, on every op and every backend.

Each case calls a public op twice on one backend: on the engine's layout (K and V as the two
halves of one buffer or paged pool, V rows padded wider than K, q/k/v sliced out of one fused
qkv projection, logits of a padded vocabulary, outputs and hidden states with padded outer
strides, index tables sliced from wider buffers) and on contiguous copies of the same values.
The answers, caches written in place included, must be identical; a layout a backend cannot
load is refused up front (and ``auto`` passes it on). Backends: reference, triton (the
interpreter on a CPU), cuda in the simulator (as in tests/ops) and on a GPU (gpu).
"""
import dataclasses
import zlib
from typing import NamedTuple

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels import backend as _backend
from helpers import (after_rows, cache_layout, fused_qkv, paged, poisoned_empty, random_tree,
                     steering_logits, use_sim_backend, widened)

NAN = float("nan")


class Engine(NamedTuple):
    backend: str
    device: str


@pytest.fixture(params=["reference", "triton", "sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def engine(request, monkeypatch):
    """The backend under test and the device of its tensors."""
    if request.param == "sim":
        use_sim_backend(monkeypatch)
        return Engine("cuda", "cpu")
    if request.param == "cuda":
        return Engine("cuda", "cuda")
    gpu = request.param == "triton" and torch.cuda.is_available()
    return Engine(request.param, "cuda" if gpu else "cpu")


def copies(args):
    """``args`` with every tensor replaced by a contiguous copy of its own."""
    return {key: val.clone(memory_format=torch.contiguous_format) if isinstance(val, torch.Tensor)
            else val for key, val in args.items()}


def assert_same(got, want, what="result"):
    """Identical results (NaN where the other has NaN): tensors, tuples, Trees, None."""
    if dataclasses.is_dataclass(got):
        for f in dataclasses.fields(got):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{what}.{f.name}")
    elif isinstance(got, tuple):
        assert isinstance(want, tuple) and len(got) == len(want), what
        names = getattr(got, "_fields", range(len(got)))
        for name, g, w in zip(names, got, want):
            assert_same(g, w, f"{what}.{name}")
    elif isinstance(got, torch.Tensor):
        assert isinstance(want, torch.Tensor) and got.dtype == want.dtype, what
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{what} differs from the contiguous call: {m}")
    else:
        assert got == want, what


def run_both(op, args, mutated=()):
    """``op(**args)`` on the given layout and on contiguous copies (outputs poisoned); checks that
    both give the same results and leave the same contents in the ``mutated`` arguments."""
    flat = copies(args)
    with poisoned_empty():
        got = op(**args)
        want = op(**flat)
    assert_same(got, want)
    for name in mutated:
        assert_same(args[name], flat[name], name)
    return got


def gen_for(*key):
    """A generator seeded from the case's parameters (stable across processes)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


# ---- tree_attention ----

# Cache layouts meet every tail loop; the others only change q, the outputs or the index tables.
ATTN_CASES = [(layout, tail) for layout in ("kv_halves", "kv_heads_major", "v_padded",
                                            "v_misaligned") for tail in ("mask", "causal", "full")]
ATTN_CASES += [(layout, "mask") for layout in ("qkv", "outputs", "tables")]


def attention_args(engine, layout, is_paged, tail, dtype):
    """tree_attention's arguments (NaN-poisoned out and lse included) in ``layout``."""
    B, N, Hq, Hkv, Dh, page = 3, 7, 4, 2, 64, 6
    dev = engine.device
    gen = gen_for("attn", layout, is_paged, tail)
    prefix = torch.tensor([0, 11, 5], dtype=torch.int32)
    L = 24                                              # >= max prefix + N, whole pages
    q = torch.randn(B, N, Hq, Dh, generator=gen).to(dtype)
    k = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    v = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    for b in range(B):                                  # past each sequence's end: never read
        k[b, int(prefix[b]) + N:] = NAN
        v[b, int(prefix[b]) + N:] = NAN
    table = None
    if is_paged:
        k, table = paged(k, page, gen)
        v, _ = paged(v, page, gen, table)
    mask = None
    if tail == "mask":
        parents, num_nodes = random_tree(B, N, gen)
        mask = ref.pack_mask(parents, num_nodes).to(torch.int32).to(dev)
    q, k, v = q.to(dev), k.to(dev), v.to(dev)
    table = None if table is None else table.to(dev)
    out = torch.full((B, N, Hq, Dh), NAN, dtype=dtype, device=dev)
    lse = torch.full((B, Hq, N), NAN, device=dev)
    k, v = cache_layout(layout, k, v)
    if layout == "v_misaligned":                        # rows off 16-byte boundaries
        v = widened(v, 3)
    elif layout == "qkv":
        q = fused_qkv(q, torch.randn(B, N, Hkv, Dh, dtype=dtype, device=dev),
                      torch.randn(B, N, Hkv, Dh, dtype=dtype, device=dev))[0]
    elif layout == "outputs":                           # o_proj input and lse in padded buffers
        out = widened(out.flatten(2), 24).view(B, N, Hq, Dh)
        lse = widened(lse, 5)
    elif layout == "tables":
        mask = None if mask is None else widened(mask, 3, dim=1, fill=-1)
        table = None if table is None else widened(table, 2, fill=-1)
    return dict(q=q, k_cache=k, v_cache=v, prefix_lens=prefix.to(dev), tree_mask=mask,
                tail="causal" if tail == "mask" else tail, block_table=table, out=out, lse=lse,
                backend=engine.backend)


@pytest.mark.parametrize("is_paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout,tail", ATTN_CASES)
def test_tree_attention(engine, layout, tail, is_paged):
    dtype = torch.float16 if engine.backend == "cuda" else torch.float32  # cuda: fp16/bf16 only
    args = attention_args(engine, layout, is_paged, tail, dtype)
    if layout == "v_misaligned" and engine.backend == "cuda":
        # cp.async / TMA cannot load such rows: rejected before any launch (auto goes elsewhere)
        with pytest.raises(jk.BackendUnavailableError, match="v_cache rows on 16-byte"):
            jk.tree_attention(**args)
        return
    got, got_lse = run_both(jk.tree_attention, args, mutated=("out", "lse"))
    assert got is args["out"] and got_lse is args["lse"]
    assert not got.isnan().any() and not got_lse.isnan().any()


def test_tree_attention_auto_routes_misaligned_cache_past_cuda(monkeypatch):
    # auto tries cuda first, as for CUDA tensors; a V cache it cannot load goes to triton.
    use_sim_backend(monkeypatch)
    monkeypatch.setattr(_backend, "_auto_candidates",
                        lambda device, fn=None: ("cuda", "triton", "reference"))
    args = attention_args(Engine("auto", "cpu"), "v_misaligned", True, "mask", torch.float16)
    flat = dict(copies(args), backend="triton")
    assert_same(jk.tree_attention(**args), jk.tree_attention(**flat))


# ---- qk_norm_rope_append ----

@pytest.mark.parametrize("with_q", [True, False], ids=["q", "kv_only"])
@pytest.mark.parametrize("is_paged,dtype", [(False, torch.float32), (True, torch.float16)],
                         ids=["contiguous-fp32", "paged-fp16"])
@pytest.mark.parametrize("layout", ["qkv", "kv_halves", "kv_heads_major", "v_padded"])
def test_qk_norm_rope_append(engine, layout, is_paged, dtype, with_q):
    B, N, Hq, Hkv, Dh, L, page = 3, 5, 6, 2, 32, 20, 4
    dev = engine.device
    gen = gen_for("rope", layout, is_paged, with_q, dtype)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(dev)
    q, k, v = rnd(B, N, Hq, Dh), rnd(B, N, Hkv, Dh), rnd(B, N, Hkv, Dh)
    qw = (torch.rand(Dh, generator=gen) + 0.5).to(dev)
    kw = (torch.rand(Dh, generator=gen) + 0.5).to(dev)
    prefix = torch.tensor([2, 9, 0], dtype=torch.int32)
    caches = torch.full((B, L, Hkv, Dh), NAN, dtype=dtype)
    table = start = None
    if is_paged:                                        # tree rows: RoPE at depth, slot at row
        caches, table = paged(caches, page, gen)
        depths = torch.tensor([0, 1, 1, 2, 3])
        positions = prefix[:, None] + depths[None, :]
        start = prefix.to(dev)
        table = table.to(dev)
    else:
        positions = prefix[:, None] + torch.arange(N)[None, :]
    positions = positions.to(torch.int32).to(dev)
    k_cache, v_cache = caches.to(dev), caches.clone().to(dev)   # two tensors, also on the CPU
    if layout == "qkv":
        q, k, v = fused_qkv(q, k, v)
        positions = widened(positions, 3, fill=-1)
    else:
        k_cache, v_cache = cache_layout(layout, k_cache, v_cache)
    args = dict(q=q if with_q else None, k=k, v=v, q_norm_w=qw if with_q else None, k_norm_w=kw,
                positions=positions, k_cache=k_cache, v_cache=v_cache, rope_theta=1e6,
                block_table=table, cache_start=start, backend=engine.backend)
    q_out = run_both(jk.qk_norm_rope_append, args, mutated=("k_cache", "v_cache"))
    assert (q_out is None) != with_q
    assert int((~k_cache.isnan()).sum()) == B * N * Hkv * Dh        # every row written once


# ---- commit_kv ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("is_paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", ["kv_halves", "kv_heads_major", "v_padded", "hidden"])
def test_commit_kv(engine, layout, is_paged, dtype):
    B, N, Hkv, Dh, Hh, L, page = 3, 7, 2, 16, 24, 18, 6
    dev = engine.device
    gen = gen_for("commit", layout, is_paged, dtype)
    k = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    v = torch.randn(B, L, Hkv, Dh, generator=gen).to(dtype)
    table = None
    if is_paged:
        k, table = paged(k, page, gen)
        v, _ = paged(v, page, gen, table)
        table = table.to(dev)
    k, v = k.to(dev), v.to(dev)
    hidden = torch.randn(B, N, Hh, generator=gen).to(dtype).to(dev)
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 3, 6], [0, -1, -1, -1]], dtype=torch.int32)
    verdict = jk.Verdict(torch.tensor([2, 3, 0], dtype=torch.int32).to(dev), path.to(dev),
                         torch.zeros(B, dtype=torch.int32, device=dev), path.to(dev))
    if layout in ("kv_halves", "kv_heads_major", "v_padded"):
        k, v = cache_layout(layout, k, v)
    else:                                               # one layer's taps of [B, N, taps, Hh]
        taps = torch.randn(B, N, 3, Hh, generator=gen).to(dtype).to(dev)
        taps[:, :, 1] = hidden
        hidden = taps[:, :, 1]
    args = dict(k_cache=k, v_cache=v, prefix_lens=torch.tensor([4, 0, 9], dtype=torch.int32,
                                                               device=dev),
                verdict=verdict, block_table=table, hidden=hidden, backend=engine.backend)
    got = run_both(jk.commit_kv, args, mutated=("k_cache", "v_cache"))
    assert got.prefix_lens.cpu().tolist() == [7, 4, 10]


# ---- draft trees: log_softmax_topk, hidden_topk (triton), build_tree; pack_mask ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["vocab_padded", "block_rows"])
def test_draft_tree_logits(engine, layout, dtype):
    B, D, V = 3, 4, 1000
    dev = engine.device
    gen = gen_for("draft", layout, dtype)
    logits = (torch.randn(B, D, V, generator=gen) * 3).to(dtype).to(dev)
    if layout == "vocab_padded":                        # lm_head padded to a multiple of 64
        logits = widened(logits, 24)
    else:                                               # depths 1..D: rows 1.. of the block
        logits = after_rows(logits, 1)
    roots = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32).to(dev)
    args = dict(logits=logits, root_tokens=roots, budget=13, topk=3, backend=engine.backend)
    run_both(jk.draft_tree, args)


def test_draft_tree_from_topk(engine):
    B, D, K = 3, 4, 3
    dev = engine.device
    gen = gen_for("from_topk")
    lp, tok = torch.randn(B, D, 50, generator=gen).log_softmax(-1).topk(K + 2, dim=-1)
    args = dict(topk_tokens=tok.to(torch.int32).to(dev)[..., :K],
                topk_logprobs=lp.to(dev)[..., :K],
                root_tokens=torch.zeros(B, dtype=torch.int32, device=dev), budget=11,
                backend=engine.backend)
    assert args["topk_tokens"].stride(1) == K + 2
    run_both(jk.draft_tree_from_topk, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["block_rows", "padded"])
def test_draft_tree_from_hidden(engine, layout, dtype):
    B, D, H, V = 3, 4, 64, 300
    dev = engine.device
    gen = gen_for("hidden", layout, dtype)
    hidden = torch.randn(B, D, H, generator=gen).to(dtype).to(dev)
    weight = (torch.randn(V, H, generator=gen) / 4).to(dtype).to(dev)
    if layout == "block_rows":                          # depths 1..D: rows 1.. of the block
        hidden = after_rows(hidden, 1)
    else:
        hidden = widened(hidden, 8)
        weight = widened(weight, 8)
    args = dict(hidden=hidden, lm_head_weight=weight,
                root_tokens=torch.zeros(B, dtype=torch.int32, device=dev), budget=12, topk=3,
                backend=engine.backend)
    run_both(jk.draft_tree_from_hidden, args)


def test_hidden_topk_auto_passes_cuda_to_triton(monkeypatch):
    # auto tries cuda first, as for CUDA tensors; the cuda backend has no fused hidden_topk, so
    # the fused method (auto's rule below a crossover) runs on the next candidate, triton.
    use_sim_backend(monkeypatch)
    monkeypatch.setattr(_backend, "_auto_candidates",
                        lambda device, fn=None: ("cuda", "triton", "reference"))
    gen = gen_for("hidden_auto")
    hidden = torch.randn(3, 4, 64, generator=gen).half()
    weight = widened((torch.randn(300, 64, generator=gen) / 4).half(), 3)
    args = dict(hidden=hidden, lm_head_weight=weight, root_tokens=torch.zeros(3, dtype=torch.int32),
                budget=12, topk=3)
    flat = dict(copies(args), backend="triton", method="fused")
    assert_same(jk.draft_tree_from_hidden(**args, method="fused"),
                jk.draft_tree_from_hidden(**flat))


def test_pack_mask(engine):
    B, N = 3, 37                                        # two mask words
    parents, num_nodes = random_tree(B, N, gen_for("pack"))
    dev = engine.device
    args = dict(parents=widened(parents.to(dev), 5, fill=-1), num_nodes=num_nodes.to(dev),
                backend=engine.backend)
    run_both(jk.pack_mask, args)


# ---- verify_tree ----

@pytest.mark.parametrize("dtype,temperature", [(torch.float32, 0.0), (torch.float16, 0.8)],
                         ids=["fp32-greedy", "fp16-sampled"])
@pytest.mark.parametrize("layout", ["vocab_padded", "vocab_padded_aligned", "rows"])
def test_verify_tree_logits(engine, layout, dtype, temperature):
    B, D, V, budget = 3, 4, 500, 15
    dev = engine.device
    gen = gen_for("verify", layout, dtype, temperature)
    draft = torch.randn(B, D, V, generator=gen) * 3
    roots = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    tree = jk.draft_tree(draft, roots, budget=budget, topk=3, backend="reference")
    logits = steering_logits(tree.tokens, tree.parents, tree.num_nodes, V, gen, dtype=dtype)
    tree = jk.Tree(*(getattr(tree, f.name).to(dev) for f in dataclasses.fields(tree)[:-1]),
                   max_depth=tree.max_depth)
    logits = logits.to(dev)
    if layout == "vocab_padded":                        # rows off 16-byte boundaries
        logits = widened(logits, 13)
    elif layout == "vocab_padded_aligned":              # 512-wide rows: 16-byte aligned
        logits = widened(logits, 12)
    else:                                               # the tree's rows of a longer forward
        logits = after_rows(logits, 2)
    seed = torch.tensor([1, 2, 3], device=dev)
    offset = torch.tensor([0, 5, 9], device=dev)
    args = dict(tree=tree, target_logits=logits, temperature=temperature, seed=seed,
                offset=offset, backend=engine.backend)
    got = run_both(jk.verify_tree, args)
    if temperature == 0:
        assert int(got.accept_len.sum()) > 0            # the walk went below the root


def test_verify_tree_target_tokens(engine):
    B, N, V = 3, 9, 5
    dev = engine.device
    gen = gen_for("verify_tokens")
    parents, num_nodes = random_tree(B, N, gen)
    tokens = torch.randint(0, V, (B, N), generator=gen, dtype=torch.int32)
    depths = torch.full((B, N), -1, dtype=torch.int32)  # max_depth bounds the walk only
    target = torch.randint(0, V, (B, N), generator=gen, dtype=torch.int32)
    tree = jk.Tree(tokens.to(dev), parents.to(dev), depths.to(dev),
                   torch.zeros(B, N, device=dev), num_nodes.to(dev),
                   ref.pack_mask(parents, num_nodes).to(torch.int32).to(dev), max_depth=4)
    args = dict(tree=tree, target_tokens=widened(target.to(dev), 3, fill=-1),
                backend=engine.backend)
    run_both(jk.verify_tree, args)
