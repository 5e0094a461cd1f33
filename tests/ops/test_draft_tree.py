"""The draft-tree path against python_ref: log-softmax top-K (from logits, and from hidden states:
draft_tree_from_hidden, fused (Triton's hidden_topk) or by a GEMM) and tree building (topn,
accum_logp; bit-exact from top-K), on the cuda kernels (simulator, and a GPU: gpu) and Triton."""
import math

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import launch_plan
from jetspec_kernels import python_ref as ref
from jetspec_kernels.limits import MAX_TOPK
from jetspec_kernels.ops import draft_tree as draft_tree_ops
from jetspec_kernels.ops.draft_tree import checked_topk, gemm_logits
import jetspec_kernels.triton as triton_backend
from helpers import (DEV, TOL, TREE_FIELDS, after_rows, api_backend, assert_padding, backends, cu,
                     on, poisoned_empty, rel_l2, sync, tree_difference, tree_fields, widened)


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_log_softmax_topk(dev, dtype):
    gen = torch.Generator().manual_seed(11)
    # 5 vocabulary chunks of 4096 (the last partial) in the simulator, 38 on a GPU.
    b, d, v, k = 2, 3, 151936 if dev == "cuda" else 18000, 8
    logits = (torch.randn(b, d, v, generator=gen) * 3).to(dtype)
    logits[0, 0, 100:110] = logits[0, 0].max()  # ties within a chunk: lower token first
    logits[1, 2, 4090:4100] = logits[1, 2].max()  # ties across two chunks
    tt, tl = cu().log_softmax_topk(logits.to(dev), k)
    want_t, want_l = ref.log_softmax_topk(logits.double(), k)
    assert torch.equal(tt.cpu(), want_t)
    # 16-bit inputs are exact in fp32 and the log-softmax is fp32 for every input dtype.
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]


@backends("sim", "cuda")
@pytest.mark.parametrize("staged", [True, False])
def test_log_softmax_topk_many_chunks(dev, monkeypatch, staged):
    """34 vocabulary chunks: the merge's sum of exp then has partials from two warps, which a
    missing barrier before the cross-warp sum gets wrong. The merge stages its 340 candidates in
    shared memory, or (a simulated 1 KB per block) reads them from global memory."""
    if not staged:
        if dev == "cuda":
            pytest.skip("the simulator's shared memory per block is what this case changes")
        monkeypatch.setenv("JETSPEC_SIM_SMEM_PER_BLOCK", "1024")
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(1, 2, 33 * 4096 + 5, generator=gen) * 3
    tt, tl = cu().log_softmax_topk(logits.to(dev), 10)
    want_t, want_l = ref.log_softmax_topk(logits.double(), 10)
    assert torch.equal(tt.cpu(), want_t)
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]


F16, BF16 = torch.float16, torch.bfloat16


@backends("cuda")
@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 16])  # 15 rows and 240 rows
def test_cuda_hidden_topk_qwen3_shape(dev, b):
    """Qwen3-8B's lm_head (V=151936, H=4096, bf16) on the cuda backend, method auto: cuBLAS into
    float32 logits, then the cuda log_softmax_topk (the cuda backend has no fused kernel)."""
    gen = torch.Generator(device=dev).manual_seed(b)
    hidden = torch.randn(b, 15, 4096, device=dev, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(151936, 4096, device=dev, generator=gen) / 64).to(torch.bfloat16)
    root = torch.zeros(b, dtype=torch.int32, device=dev)
    tt, tl = checked_topk(hidden, weight, root, budget=64, topk=8, algorithm="topn",
                          backend="cuda")
    want_t, want_l = ref.log_softmax_topk((hidden.float() @ weight.float().T).double(), 8)
    assert torch.equal(tt.cpu().long(), want_t.cpu())
    assert rel_l2(tl, want_l) < TOL[torch.float32]


@backends("sim", "cuda")
@pytest.mark.parametrize("algorithm", ["topn", "accum_logp"])
# (8, 2, 1) and (40, 3, 2): budget above the implicit tree size (3 and 13 nodes), where a lane
# caching another lane's node once made accum_logp pop a max-depth leaf forever.
@pytest.mark.parametrize("budget,k,d", [(64, 4, 15), (256, 8, 15), (7, 3, 2), (100, 64, 3),
                                        (8, 2, 1), (40, 3, 2), (600, 5, 6)])
def test_build_tree(dev, algorithm, budget, k, d):
    gen = torch.Generator().manual_seed(budget + k)
    b = 3
    lp = torch.log_softmax(torch.randn(b, d, 200, generator=gen), -1)
    lp, idx = lp.sort(-1, descending=True)
    lp, idx = lp[..., :k].contiguous(), idx[..., :k].to(torch.int32).contiguous()
    lp[1] = lp[1].round(decimals=1)  # exact score ties exercise the tie rules
    lp[1] = lp[1].sort(-1, descending=True).values
    root = torch.tensor([5, 6, 7], dtype=torch.int32)
    want = ref.build_tree(idx, lp, root, budget, algorithm)
    with poisoned_empty():
        got = cu().build_tree(idx.to(dev), lp.to(dev), root.to(dev), budget, algorithm)
    sync(dev)
    for key, g in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), got):
        assert torch.equal(g.cpu(), want[key].cpu().to(g.dtype)), key


@backends("sim", "cuda")
def test_build_tree_random_configs(dev):
    """Many small trees with heavy score ties (log-probs on a 0.25 grid) and -inf log-probs."""
    gen = torch.Generator().manual_seed(123)
    for trial in range(30):
        d = int(torch.randint(1, 7, (1,), generator=gen))
        k = int(torch.randint(1, 10, (1,), generator=gen))
        budget = int(torch.randint(1, 160, (1,), generator=gen))
        lp = -(torch.rand(2, d, k, generator=gen) * 3 / 0.25).round() * 0.25
        if trial % 5 == 0:
            lp[0, :, k // 2 + 1:] = float("-inf")
        lp = lp.sort(-1, descending=True).values.contiguous()
        idx = torch.randint(0, 1000, (2, d, k), generator=gen, dtype=torch.int32)
        root = torch.tensor([3, 4], dtype=torch.int32)
        for algorithm in ("topn", "accum_logp"):
            want = ref.build_tree(idx, lp, root, budget, algorithm)
            with poisoned_empty():
                got = cu().build_tree(idx.to(dev), lp.to(dev), root.to(dev), budget, algorithm)
            sync(dev)
            for key, g in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), got):
                assert torch.equal(g.cpu(), want[key].cpu().to(g.dtype)), (trial, algorithm, key)


# ---------------------------------------------------------------- the triton kernels


ALGS = ("topn", "accum_logp")


def sorted_logprobs(gen, B, D, K, levels=None):
    """Random per-depth log-probs [B, D, K], descending; ``levels`` quantises them (ties)."""
    lp = -torch.rand(B, D, K, generator=gen) * 6
    if levels:
        lp = (lp * levels).round() / levels
    return lp.sort(dim=-1, descending=True).values.contiguous()


def separated_logits(gen, B, D, V, K, dtype):
    """Logits whose fp32 log-softmax is exactly the logits: each row has a 0, K + 2 distinct
    candidates at -(30 + distinct integers) and fillers at -1000, so the log-sum-exp rounds to 0
    and every backend sees the same integer log-probs (ties broken by the same rules)."""
    x = torch.full((B, D, V), -1000.0)
    for b in range(B):
        for d in range(D):
            where = torch.randperm(V, generator=gen)[:K + 3]
            vals = torch.randperm(40, generator=gen)[:K + 2].float() + 30
            x[b, d, where[0]] = 0.0
            x[b, d, where[1:]] = -vals
    return x.to(dtype)


def check_tree_exact(got, want):
    g, w = tree_fields(got), tree_fields(want)
    for key in TREE_FIELDS:
        assert g[key].dtype == (torch.float32 if key == "scores" else torch.int32), key
        assert torch.equal(g[key], w[key].to(g[key].dtype)), f"{key}:\n{g[key]}\n{w[key]}"


# ------------------------------------------------------------------------------ top-K
@backends("triton")
@pytest.mark.parametrize("B,D,V,k,block_v,dtype", [
    (3, 5, 1000, 7, None, torch.float32),
    (1, 3, 5003, 3, 512, torch.float16),
    (3, 1, 5003, 2, None, torch.float32),
    (1, 1, 1000, 1, 64, torch.float16),
    (1, 3, 1000, 64, 256, torch.float32),
])
def test_log_softmax_topk_blocks(B, D, V, k, block_v, dtype):
    gen = torch.Generator().manual_seed(B * 100 + V + k)
    x = (torch.randn(B, D, V, generator=gen) * 3).to(dtype)
    x[0, 0, 7] = x[0, 0, 3] = x[0, 0].max() + 1  # a tied maximum: the lower id comes first
    with poisoned_empty():
        tok, lp = triton_backend.log_softmax_topk(x.to(DEV), k, block_v=block_v)
    want_tok, want_lp = ref.log_softmax_topk(x.double(), k)
    assert tok.dtype == torch.int32 and lp.dtype == torch.float32
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]
    assert tok[0, 0, 0] == 3 and (k == 1 or tok[0, 0, 1] == 7)


@backends("triton", "sim", "cuda")
def test_log_softmax_topk_masked_chunk_and_signed_zeros(backend):
    """Logits as a constrained decoder leaves them: a whole 4096-entry vocabulary chunk at -inf
    (both kernels' chunk 1; its partial counts for nothing, it is no NaN), and a tied maximum of
    -0.0 and +0.0, which the token ids order (-0.0 == +0.0), either way round."""
    gen = torch.Generator().manual_seed(8)
    x = -1 - torch.rand(2, 2, 2 * 4096 + 300, generator=gen)
    x[:, :, 4096:8192] = float("-inf")
    x[0, 0, 9], x[0, 0, 12] = -0.0, 0.0
    x[1, 1, 9], x[1, 1, 12] = 0.0, -0.0
    with poisoned_empty():
        if backend.name == "triton":
            tok, lp = triton_backend.log_softmax_topk(x.to(DEV), 4)
        else:
            tok, lp = cu().log_softmax_topk(x.to(backend.device), 4)
    want_tok, want_lp = ref.log_softmax_topk(x.double(), 4)
    assert torch.equal(tok.cpu(), want_tok)
    assert tok[0, 0, :2].tolist() == [9, 12] and tok[1, 1, :2].tolist() == [9, 12]
    assert not lp.isnan().any() and rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@backends("triton")
def test_log_softmax_topk_strided_rows():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 1000, generator=gen)[1::2, ::2]  # strided B and D, contiguous V
    tok, lp = triton_backend.log_softmax_topk(x.to(DEV), 4, block_v=128)
    want_tok, want_lp = ref.log_softmax_topk(x.double(), 4)
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@backends("triton")
@pytest.mark.parametrize("B,D,H,V,k,dtype", [
    (3, 5, 40, 1000, 7, torch.float32),
    (1, 3, 64, 5003, 3, torch.float16),
    (2, 9, 96, 1000, 1, torch.float16),
])
def test_hidden_topk_triton_shapes(B, D, H, V, k, dtype):
    gen = torch.Generator().manual_seed(H + V)
    hidden = torch.randn(B, D, H, generator=gen).to(dtype)
    weight = torch.randn(V, H, generator=gen).to(dtype)
    with poisoned_empty():
        tok, lp = triton_backend.hidden_topk(hidden.to(DEV), weight.to(DEV), k)
    want_tok, want_lp = ref.log_softmax_topk(hidden.double() @ weight.double().T, k)
    assert torch.equal(tok.cpu(), want_tok)
    # fp16 inputs are exact in fp32; only the accumulation order differs from float64
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@backends("triton")
def test_draft_tree_from_hidden_public_api():
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(2, 3, 32, generator=gen)
    weight = torch.randn(1000, 32, generator=gen)
    root = torch.tensor([5, 9], dtype=torch.int32)
    got = jk.draft_tree_from_hidden(hidden.to(DEV), weight.to(DEV), root.to(DEV), budget=10,
                                    topk=3, backend="triton")
    want = ref.draft_tree((hidden.double() @ weight.double().T), root, 10, 3)
    assert tree_difference(got, want, 1e-4) is None


# ------------------------------------------------------------------------------ trees
@backends("triton")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("B,D,K,budget", [
    (1, 1, 1, 1), (3, 1, 3, 2), (3, 3, 2, 10), (1, 5, 7, 37), (3, 3, 3, 64),
    (1, 1, 7, 10), (3, 5, 1, 64), (1, 3, 2, 37), (1, 5, 2, 64),
])
def test_draft_tree_from_topk_bit_exact(B, D, K, budget, algorithm):
    """Quantised log-probs make many exact score ties: the tie rules must match the spec."""
    gen = torch.Generator().manual_seed(B + 10 * D + 100 * K + budget)
    lp = sorted_logprobs(gen, B, D, K, levels=2)
    tok = torch.randint(0, 50000, (B, D, K), generator=gen, dtype=torch.int32)
    root = torch.randint(0, 50000, (B,), generator=gen, dtype=torch.int32)
    with poisoned_empty():
        got = jk.draft_tree_from_topk(tok.to(DEV), lp.to(DEV), root.to(DEV), budget=budget,
                                      algorithm=algorithm, backend="triton")
    want = ref.build_tree(tok, lp, root, budget, algorithm)
    check_tree_exact(got, want)
    assert got.max_depth == min(D, budget - 1)
    assert_padding(tree_fields(got), budget)


def build_exact(lp, seed, budget, algorithm="topn"):
    """Triton tree from log-probs ``lp [B, D, K]`` (random tokens) vs python_ref, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    B, D, K = lp.shape
    tok = torch.randint(0, 151936, (B, D, K), generator=gen, dtype=torch.int32)
    root = torch.randint(0, 151936, (B,), generator=gen, dtype=torch.int32)
    with poisoned_empty():
        got = jk.draft_tree_from_topk(tok.to(DEV), lp.to(DEV), root.to(DEV), budget=budget,
                                      algorithm=algorithm, backend="triton")
    check_tree_exact(got, ref.build_tree(tok, lp, root, budget, algorithm))
    assert_padding(tree_fields(got), budget)


@backends("triton")
@pytest.mark.parametrize("levels,zeros", [(1, False), (2, True), (1, True)])
@pytest.mark.parametrize("B,D,K,budget", [(2, 6, 4, 100), (1, 4, 8, 200), (2, 9, 2, 64)])
def test_topn_batch_ties_across_depths(B, D, K, budget, levels, zeros):
    """Integer / half-integer log-probs (and log-prob 0: a child scores exactly as its parent)
    make a node tie with nodes of other depths and with the best child of a node taken in the
    same batch; batches must stop at exactly the spec's tie order."""
    gen = torch.Generator().manual_seed(B + D + K + budget + levels)
    lp = sorted_logprobs(gen, B, D, K, levels=levels) / 3
    if zeros:
        lp[:, ::2, 0] = 0.0
    build_exact(lp.sort(dim=-1, descending=True).values.contiguous(), D * K, budget)


@backends("triton")
@pytest.mark.parametrize("B,D,K,budget", [(2, 5, 3, 64), (1, 3, 16, 256), (2, 2, 64, 128)])
def test_topn_all_equal_logprobs(B, D, K, budget):
    """Every sibling ties: order is by depth, then rank sequence (breadth-first), and the budget
    cuts through one huge tie group."""
    lp = torch.full((B, D, K), -0.5)
    build_exact(lp, D * K, budget)


@backends("triton")
@pytest.mark.parametrize("D,budget", [(40, 64), (70, 64), (1, 2)])
def test_topn_k1_chain(D, budget):
    gen = torch.Generator().manual_seed(D)
    lp = sorted_logprobs(gen, 2, D, 1, levels=1)
    build_exact(lp, D, budget)


@backends("triton")
def test_topn_neg_inf_logprobs():
    """Impossible candidates (-inf) tie with each other at every depth: depth, then rank order."""
    gen = torch.Generator().manual_seed(9)
    lp = sorted_logprobs(gen, 3, 6, 5, levels=2)
    lp[:, :, 3:] = float("-inf")
    lp[1, 2, 1:] = float("-inf")
    lp[2, 1, :] = float("-inf")
    build_exact(lp, 9, 150)
    build_exact(lp, 10, 150, algorithm="accum_logp")


@backends("triton")
@pytest.mark.parametrize("D,K,levels", [(6, 4, 2), (5, 5, 1)])
def test_topn_budget_4096(D, K, levels):
    """Largest budget (window of one child a parent); D 5 K 5 has 3906 nodes < 4096: padding."""
    gen = torch.Generator().manual_seed(D * K)
    lp = sorted_logprobs(gen, 1, D, K, levels=levels)
    build_exact(lp, D + K, 4096)


@backends("triton")
@pytest.mark.parametrize("seed", range(8))
def test_topn_random_shapes(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    B = int(torch.randint(1, 4, (1,), generator=gen))
    D = int(torch.randint(1, 10, (1,), generator=gen))
    K = int(torch.randint(1, 12, (1,), generator=gen))
    budget = int(torch.randint(1, 300, (1,), generator=gen))
    lp = sorted_logprobs(gen, B, D, K, levels=(0, 1, 4)[seed % 3])
    build_exact(lp, seed, budget)


@backends("triton")
@pytest.mark.parametrize("algorithm", ALGS)
def test_build_tree_continuous_and_strided(algorithm):
    gen = torch.Generator().manual_seed(3)
    lp = sorted_logprobs(gen, 5, 4, 6).transpose(0, 1).contiguous().transpose(0, 1)
    tok = torch.randint(0, 1000, (5, 4, 6), generator=gen, dtype=torch.int32)
    root = torch.arange(5, dtype=torch.int32)
    got = triton_backend.build_tree(tok.to(DEV), lp.to(DEV), root.to(DEV), 45, algorithm)
    check_tree_exact(got, ref.build_tree(tok, lp, root, 45, algorithm))


@backends("triton")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("B,D,V,K,budget,dtype", [
    (3, 5, 1000, 3, 37, torch.float32),
    (1, 3, 5003, 7, 64, torch.float16),
    (3, 1, 1000, 2, 10, torch.float16),
    (1, 5, 1000, 2, 64, torch.float32),
    (1, 3, 1000, 1, 2, torch.float32),
])
def test_draft_tree_separated_bit_exact(B, D, V, K, budget, dtype, algorithm):
    gen = torch.Generator().manual_seed(V + K + budget)
    logits = separated_logits(gen, B, D, V, K, dtype)
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    with poisoned_empty():
        got = jk.draft_tree(logits.to(DEV), root.to(DEV), budget=budget, topk=K,
                            algorithm=algorithm, backend="triton")
    check_tree_exact(got, ref.draft_tree(logits.float(), root, budget, K, algorithm))


@backends("triton")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("B,D,V,K,budget,dtype,tied", [
    (3, 3, 1000, 3, 37, torch.float32, False),
    (1, 5, 5003, 2, 64, torch.float16, False),
    (3, 3, 1000, 7, 64, torch.float32, True),
    (1, 5, 1000, 3, 37, torch.float16, True),
])
def test_draft_tree_vs_float64_reference(B, D, V, K, budget, dtype, tied, algorithm):
    """Against the float64 spec the scores differ by rounding, so ties within eps may resolve
    either way; ``tied`` draws logits from a few levels so that such ties are everywhere."""
    gen = torch.Generator().manual_seed(V + budget + int(tied))
    if tied:
        x = torch.randint(0, 4, (B, D, V), generator=gen).float() * 0.5
    else:
        x = torch.randn(B, D, V, generator=gen) * 3
    logits = x.to(dtype)
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    got = jk.draft_tree(logits.to(DEV), root.to(DEV), budget=budget, topk=K,
                        algorithm=algorithm, backend="triton")
    want = ref.draft_tree(logits.double(), root, budget, K, algorithm)
    why = tree_difference(got, want, 1e-4)
    assert why is None, why
    f = tree_fields(got)
    assert torch.equal(f["mask"], ref.pack_mask(f["parents"], f["num_nodes"]))
    assert_padding(f, budget)


def hand_tree(tokens, parents, scores):
    n = len(tokens)
    return {"tokens": torch.tensor([tokens], dtype=torch.int32),
            "parents": torch.tensor([parents], dtype=torch.int32),
            "depths": torch.tensor([[0] + [1] * (n - 1)], dtype=torch.int32),
            "scores": torch.tensor([scores], dtype=torch.float32),
            "num_nodes": torch.tensor([n], dtype=torch.int32),
            "mask": torch.zeros(1, n, 1, dtype=torch.int32)}


@backends("triton")
def test_tree_difference_accepts_only_ties():
    a = hand_tree([0, 1, 2, 3], [-1, 0, 0, 0], [0.0, -1.0, -2.0, -3.0])
    assert tree_difference(a, a, 1e-6) is None
    # node 3 or node 4 at the cutoff: a tie within eps is accepted, a clear winner is not
    assert tree_difference(a, hand_tree([0, 1, 2, 4], [-1, 0, 0, 0], [0, -1, -2, -3.00001]),
                           1e-4) is None
    assert tree_difference(a, hand_tree([0, 1, 2, 4], [-1, 0, 0, 0], [0, -1, -2, -2.5]),
                           1e-4) is not None
    # a matched node with a different score: beyond eps, within eps but beyond the fp32 rule
    # (relative L2 2.4e-5), NaN
    assert tree_difference(a, hand_tree([0, 1, 2, 3], [-1, 0, 0, 0], [0, -1, -2.01, -3]),
                           1e-4) is not None
    assert tree_difference(a, hand_tree([0, 1, 2, 3], [-1, 0, 0, 0], [0, -1, -2.00009, -3]),
                           1e-4) is not None
    assert tree_difference(a, hand_tree([0, 1, 2, 3], [-1, 0, 0, 0], [0, -1, float("nan"), -3]),
                           1e-4) is not None
    assert tree_difference(a, hand_tree([0, 1, 2], [-1, 0, 0], [0, -1, -2]), 1e-4) is not None


# ------------------------------------------------------------------------------ bf16
# log_softmax_topk and build_tree have no tl.dot, so bf16 runs under the interpreter (a small
# shape); hidden_topk's bf16 tl.dot does not (the interpreter multiplies raw bits): GPU only.
@backends("triton")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("B,D,V,K,budget", [
    pytest.param(2, 4, 3001, 4, 20, id="small"),
    pytest.param(2, 15, 151936, 8, 256, id="qwen_vocab", marks=pytest.mark.gpu),
])
def test_bf16_logits(B, D, V, K, budget, algorithm):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(B, D, V, generator=gen) * 4).to(torch.bfloat16)
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    with poisoned_empty():
        tok, lp = triton_backend.log_softmax_topk(logits.to(DEV), K)
    want_tok, want_lp = ref.log_softmax_topk(logits.double(), K)
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]
    with poisoned_empty():
        got = jk.draft_tree(logits.to(DEV), root.to(DEV), budget=budget, topk=K,
                            algorithm=algorithm, backend="triton")
    why = tree_difference(got, ref.draft_tree(logits.double(), root, budget, K, algorithm), 1e-4)
    assert why is None, why
    with poisoned_empty():
        exact = jk.draft_tree_from_topk(tok, lp, root.to(DEV), budget=budget, algorithm=algorithm,
                                        backend="triton")
    check_tree_exact(exact, ref.build_tree(tok.cpu(), lp.cpu(), root, budget, algorithm))


@backends("triton")
@pytest.mark.gpu
def test_gpu_bf16_hidden_topk():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 15, 256, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(151936, 256, generator=gen) / 16).to(torch.bfloat16)
    tok, lp = triton_backend.hidden_topk(hidden.cuda(), weight.cuda(), 8)
    want_tok, want_lp = ref.log_softmax_topk(hidden.double() @ weight.double().T, 8)
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@backends("triton")
@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGS)
def test_gpu_large_budget(algorithm):
    gen = torch.Generator().manual_seed(2)
    lp = sorted_logprobs(gen, 2, 20, 16, levels=4)
    tok = torch.randint(0, 151936, (2, 20, 16), generator=gen, dtype=torch.int32)
    root = torch.tensor([1, 2], dtype=torch.int32)
    got = triton_backend.build_tree(tok.cuda(), lp.cuda(), root.cuda(), 4096, algorithm)
    check_tree_exact(got, ref.build_tree(tok, lp, root, 4096, algorithm))


# ------------------------------------------------------------------ engine layouts
# tests/test_engine_layouts.py checks each layout against a contiguous copy on the same backend;
# these check them against python_ref, in this op's own file.


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("layout", ["tokens_sliced", "logprobs_sliced", "batch_major_swapped",
                                    "int64_tokens"])
def test_draft_tree_from_topk_engine_layouts(backend, layout, algorithm):
    """Per-depth top-K an engine holds: K columns of a wider top-k buffer (tokens, log-probs or
    both), depth-major storage, int64 tokens; bit-exact with python_ref."""
    gen = torch.Generator().manual_seed(len(layout))
    B, D, K = 3, 4, 3
    lp = sorted_logprobs(gen, B, D, K + 2, levels=2)
    tok = torch.randint(0, 50000, (B, D, K + 2), generator=gen, dtype=torch.int32)
    root = torch.randint(0, 50000, (B,), generator=gen, dtype=torch.int32)
    dev = backend.device
    tok_d, lp_d = on(tok, dev), on(lp, dev)
    if layout == "tokens_sliced":
        tok_d, lp_d = tok_d[..., :K], lp_d[..., :K].contiguous()
    elif layout == "logprobs_sliced":
        tok_d, lp_d = tok_d[..., :K].contiguous(), lp_d[..., :K]
    elif layout == "batch_major_swapped":
        tok_d = tok_d[..., :K].transpose(0, 1).contiguous().transpose(0, 1)
        lp_d = lp_d[..., :K].transpose(0, 1).contiguous().transpose(0, 1)
    else:
        tok_d, lp_d = tok_d[..., :K].to(torch.int64), lp_d[..., :K].contiguous()
    with poisoned_empty():
        got = jk.draft_tree_from_topk(tok_d, lp_d, root.to(dev), budget=20, algorithm=algorithm,
                                      backend=api_backend(backend))
    sync(dev)
    check_tree_exact(got, ref.build_tree(tok[..., :K], lp[..., :K].contiguous(), root, 20, algorithm))


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("layout", ["vocab_padded", "block_rows", "batch_major_swapped"])
def test_draft_tree_engine_layouts(backend, layout):
    """Logits of a padded vocabulary, the rows 1.. of a draft block, depth-major storage: the
    same tree as python_ref (logits whose fp32 log-softmax is exact)."""
    gen = torch.Generator().manual_seed(len(layout) + 7)
    B, D, V, K = 3, 4, 1000, 3
    dtype = torch.float16 if backend.name != "triton" else torch.float32
    logits = separated_logits(gen, B, D, V, K, dtype)
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    x = logits.to(backend.device)
    if layout == "vocab_padded":
        x = widened(x, 24)
    elif layout == "block_rows":
        x = after_rows(x, 1)
    else:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    with poisoned_empty():
        got = jk.draft_tree(x, root.to(backend.device), budget=13, topk=K,
                            backend=api_backend(backend))
    sync(backend.device)
    check_tree_exact(got, ref.draft_tree(logits.float(), root, 13, K))


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("B,D,V,K,budget", [
    (3, 5, 1000, 3, 37),   # top-K of 180 bytes: the cuda chain's next scratch part is rounded up
    (1, 3, 5003, 7, 64),
    (2, 1, 999, 1, 2),
    (0, 3, 1000, 3, 16),   # no sequences: empty outputs, nothing launched
])
def test_draft_tree_chain_is_its_parts(backend, algorithm, B, D, V, K, budget):
    """The backend's draft_tree (backend.CHAINS; on cuda one custom op whose top-K lives in
    scratch space) gives build_tree(*log_softmax_topk(...)) bit for bit, on outputs and scratch
    poisoned first; the public op runs it. (On reference and triton the chain is that
    composition: those cases check the public op's dispatch.)"""
    from jetspec_kernels import backend as jk_backend
    gen = torch.Generator().manual_seed(B * 100 + K)
    logits = (torch.randn(B, D, V, generator=gen) * 4).to(backend.device)
    if B:
        logits[0, -1, 7:11] = logits[0, -1].max()   # ties: the lower token first, on both paths
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32).to(backend.device)
    name = api_backend(backend)
    fn = {f: jk_backend.kernel(name, f) for f in ("draft_tree", "log_softmax_topk", "build_tree")}
    with poisoned_empty():
        chained = fn["draft_tree"](logits, K, root, budget, algorithm)
        parts = fn["build_tree"](*fn["log_softmax_topk"](logits, K), root, budget, algorithm)
        public = jk.draft_tree(logits, root.long(), budget=budget, topk=K, algorithm=algorithm,
                               backend=name)
    sync(backend.device)
    assert len(chained) == len(parts) == len(TREE_FIELDS)
    c, p, q = tree_fields(chained), tree_fields(parts), tree_fields(public)
    for key in TREE_FIELDS:
        assert torch.equal(c[key], p[key]) and torch.equal(q[key], p[key]), key
    assert public.max_depth == min(D, budget - 1)


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("layout", ["block_rows", "padded"])
def test_draft_tree_from_hidden_engine_layouts(backend, layout):
    """Hidden states as rows 1.. of the draft block, or hidden and lm_head_weight in padded rows
    (16-byte aligned): python_ref's tree up to ties within float32 rounding."""
    gen = torch.Generator().manual_seed(len(layout) + 11)
    B, D, H, V = 3, 4, 64, 300
    hidden = torch.randn(B, D, H, generator=gen).half()
    weight = (torch.randn(V, H, generator=gen) / 4).half()
    root = torch.zeros(B, dtype=torch.int32)
    h, w = hidden.to(backend.device), weight.to(backend.device)
    if layout == "block_rows":
        h = after_rows(h, 1)
    else:
        h, w = widened(h, 8), widened(w, 8)
    with poisoned_empty():
        got = jk.draft_tree_from_hidden(h, w, root.to(backend.device), budget=12, topk=3,
                                        backend=api_backend(backend))
    sync(backend.device)
    why = tree_difference(got, ref.draft_tree(hidden.double() @ weight.double().T, root, 12, 3), 1e-4)
    assert why is None, why


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("scale", [1e-4, 1e3, "identical"])
def test_draft_tree_logit_magnitudes(backend, scale):
    """Logits of 1e-4 (near-uniform log-probs, close to -log V) and 1e3 (spreads of thousands)
    against the float64 spec, up to ties within float32 rounding at that scale; rows of one
    repeated value (every candidate ties: the lowest ids, bit for bit with the fp32 spec)."""
    gen = torch.Generator().manual_seed(5)
    B, D, V, K, budget = 2, 3, 700, 4, 30
    dtype = torch.float32 if backend.name == "triton" else torch.float16
    if scale == "identical":
        logits = (torch.randn(B, D, 1, generator=gen) * 5).expand(B, D, V).contiguous().to(dtype)
    else:
        logits = (torch.randn(B, D, V, generator=gen) * scale).to(dtype)
    root = torch.tensor([3, 4], dtype=torch.int32)
    with poisoned_empty():
        got = jk.draft_tree(logits.to(backend.device), root.to(backend.device), budget=budget,
                            topk=K, backend=api_backend(backend))
    sync(backend.device)
    if scale == "identical":
        want = ref.draft_tree(logits.float(), root, budget, K)
        for key in ("tokens", "parents", "depths", "num_nodes", "mask"):
            assert torch.equal(tree_fields(got)[key], want[key].to(torch.int32)), key
        assert tree_fields(got)["tokens"][:, 1:1 + K].tolist() == [list(range(K))] * B
        return
    eps = 1e-5 + 4e-7 * D * max(1.0, scale)
    why = tree_difference(got, ref.draft_tree(logits.double(), root, budget, K), eps,
                          score_tol=TOL[torch.float32])
    assert why is None, why


# ------------------------------------------------------------------------------ method="gemm"
# draft_tree_from_hidden's "gemm" method: float32 logits by torch (ops.draft_tree.gemm_logits),
# then the backend's log_softmax_topk. It has no tl.dot, so bf16 runs under the interpreter too,
# and fp32 on the cuda backend (whose fused kernel refuses it). The reference is the float64
# product of the same inputs: 16-bit inputs are exact in fp32, so TOL[float32] holds only if the
# logits are float32 sums (fp16- or bf16-rounded logits miss it by 30x or more).
F32 = torch.float32
# (dtype, B, D, H, V, k, hidden layout, scale): B*D = 1, 21, 17, 18 and 2; V prime or odd;
# H tails of 8, 1 and 3 past a multiple of 32; hidden sliced (strided B and D), as rows 1.. of
# the draft block, in padded rows (NaN past H); magnitudes 1e-3 and 1e2.
GEMM_CASES = [
    (BF16, 1, 1, 72, 1009, 8, "contiguous", 1.0),
    (F16, 3, 7, 40, 1237, 5, "block_rows", 1.0),
    (F32, 17, 1, 33, 777, 3, "padded", 1.0),
    (BF16, 2, 9, 67, 3001, 1, "sliced", 1.0),
    (F16, 2, 9, 67, 3001, 6, "sliced", 1e-3),
    (BF16, 1, 2, 96, 1500, 4, "padded", 1e2),
]


def _gemm_hidden(gen, dtype, b, d, h, scale, layout, device):
    """Hidden states [b, d, h] (the values) and the same values in ``layout`` on ``device``."""
    if layout == "sliced":
        base = (torch.randn(2 * b, 3 * d, h, generator=gen) * scale).to(dtype)
        return base[1::2, ::3], on(base.to(device), device)[1::2, ::3]
    hidden = (torch.randn(b, d, h, generator=gen) * scale).to(dtype)
    x = hidden.to(device)
    if layout == "block_rows":
        x = after_rows(x, 1)
    elif layout == "padded":
        x = widened(x, 8)
    return hidden, x


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype,b,d,h,v,k,layout,scale", GEMM_CASES)
def test_hidden_topk_gemm(backend, dtype, b, d, h, v, k, layout, scale):
    gen = torch.Generator().manual_seed(h + v + k)
    hidden, x = _gemm_hidden(gen, dtype, b, d, h, scale, layout, backend.device)
    weight = (torch.randn(v, h, generator=gen) / 4).to(dtype)
    # Ten equal logits in row (0, 0), the largest of it, spread over the vocabulary (v - 1
    # included): with small integer values every product and sum is exact in float32, so the
    # tie is exact in any summation order and the lower token ids must win.
    tied = [2, 3, 5, 40, 77, 100, 129, 500, 700, v - 1]
    weight[tied] = torch.randint(-2, 3, (h,), generator=gen).to(dtype)
    hidden[0, 0] = weight[2] * 4
    x[0, 0] = hidden[0, 0].to(backend.device)
    w = widened(weight.to(backend.device), 8) if layout == "padded" else weight.to(backend.device)
    root = torch.zeros(b, dtype=torch.int32, device=backend.device)
    with poisoned_empty():
        tt, tl = checked_topk(x, w, root, budget=16, topk=k, algorithm="topn",
                              backend=api_backend(backend), method="gemm")
    sync(backend.device)
    logits = hidden.double() @ weight.double().T
    want_t, want_l = ref.log_softmax_topk(logits, k)
    assert tt.shape == (b, d, k) and tt.dtype == torch.int32 and tl.dtype == torch.float32
    assert tt.cpu()[0, 0].tolist() == tied[:k]
    assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]
    if scale >= 1:
        assert torch.equal(tt.cpu().long(), want_t)
    else:
        # Logits of 1e-3 give log-probs near -log(V) whose neighbours may tie in float32 (the
        # kernels' selection) but not in float64: each chosen token's float64 log-prob must be
        # the k-th best one within float32 rounding at that scale.
        got_l = torch.log_softmax(logits, -1).gather(-1, tt.cpu().long())
        assert (got_l - want_l).abs().max() < 4e-6


@backends("reference", "triton", "sim", "cuda")
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_draft_tree_from_hidden_gemm_tree(backend, dtype):
    """The public op with method="gemm": python_ref's tree (up to ties within fp32 rounding),
    the same as method="fused" gives where the backend has a fused kernel taking the dtype, and
    the same as auto on the cuda backend (which has none)."""
    gen = torch.Generator().manual_seed(23)
    B, D, H, V = 2, 4, 64, 1201
    hidden = torch.randn(B, D, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) / 4).to(dtype)
    root = torch.tensor([7, 1100], dtype=torch.int32)
    h, w, r = hidden.to(backend.device), weight.to(backend.device), root.to(backend.device)
    want = ref.draft_tree(hidden.double() @ weight.double().T, root, 20, 3)
    with poisoned_empty():
        got = jk.draft_tree_from_hidden(h, w, r, budget=20, topk=3, backend=api_backend(backend),
                                        method="gemm")
    sync(backend.device)
    why = tree_difference(got, want, 1e-4)
    assert why is None, why
    if backend.name in ("sim", "cuda"):
        # No fused kernel on the cuda backend: asked for, a BackendUnavailableError; auto takes
        # the GEMM method whatever launch_plan's rule says.
        with pytest.raises(jk.BackendUnavailableError,
                           match=r"^backend 'cuda' has no fused hidden top-K \(method='fused';"):
            jk.draft_tree_from_hidden(h, w, r, budget=20, topk=3, backend="cuda", method="fused")
        auto = jk.draft_tree_from_hidden(h, w, r, budget=20, topk=3, backend="cuda",
                                         method="auto")
        assert tree_difference(got, auto, 0.0) is None
    elif not (backend.name == "triton" and DEV == "cpu" and dtype == BF16):
        fused = jk.draft_tree_from_hidden(h, w, r, budget=20, topk=3,
                                          backend=api_backend(backend), method="fused")
        assert tree_difference(got, fused, 1e-4) is None


@backends("reference", "triton", "sim", "cuda")
def test_hidden_topk_gemm_topk_limit(backend):
    """k at its limit, min(MAX_TOPK, V), and one past it (a ValueError naming topk), for a
    vocabulary below MAX_TOPK and one above; a row of identical logits (hidden 0: every logit
    0) takes the lowest ids at -log(V)."""
    gen = torch.Generator().manual_seed(31)
    dtype = F16
    for v, k in ((40, 40), (1000, MAX_TOPK)):
        hidden = torch.randn(1, 3, 24, generator=gen).to(dtype)
        hidden[0, 1] = 0
        weight = torch.randn(v, 24, generator=gen).to(dtype)
        x, w = hidden.to(backend.device), weight.to(backend.device)
        root = torch.zeros(1, dtype=torch.int32, device=backend.device)
        with poisoned_empty():
            tt, tl = checked_topk(x, w, root, budget=8, topk=k, algorithm="topn",
                                  backend=api_backend(backend), method="gemm")
        sync(backend.device)
        want_t, want_l = ref.log_softmax_topk(hidden.double() @ weight.double().T, k)
        assert torch.equal(tt.cpu().long(), want_t)
        assert rel_l2(tl.cpu(), want_l) < TOL[torch.float32]
        assert tt.cpu()[0, 1].tolist() == list(range(k))
        assert torch.allclose(tl.cpu()[0, 1].double(), torch.full((k,), -math.log(v)).double(),
                              rtol=1e-6, atol=0)
        with pytest.raises(ValueError, match="topk"):
            checked_topk(x, w, root, budget=8, topk=k + 1, algorithm="topn",
                         backend=api_backend(backend), method="gemm")


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gemm_logits(dtype, device):
    """gemm_logits: float32 [B, D, V] = hidden @ lm_head_weight.T summed in float32 (on a GPU:
    cuBLAS with a float32 output), never rounded to the input dtype; padded weight rows."""
    gen = torch.Generator().manual_seed(41)
    hidden = (torch.randn(3, 5, 200, generator=gen) * 3).to(dtype)
    weight = torch.randn(901, 200, generator=gen).to(dtype)
    got = gemm_logits(hidden.to(device), widened(weight.to(device), 8))
    assert got.dtype == torch.float32 and got.shape == (3, 5, 901)
    want = hidden.double() @ weight.double().T
    assert rel_l2(got.cpu(), want) < TOL[torch.float32]
    if dtype != F32:  # the input dtype's rounding would be visible at this tolerance
        assert rel_l2(want.to(dtype), want) > 10 * TOL[torch.float32]


# ------------------------------------------------------------------------------ which method
def _spy_gemm(monkeypatch):
    """Count the calls of ops.draft_tree.gemm_logits (the gemm method's first step)."""
    calls = []
    real = draft_tree_ops.gemm_logits

    def spy(hidden, weight):
        calls.append(tuple(hidden.shape))
        return real(hidden, weight)

    monkeypatch.setattr(draft_tree_ops, "gemm_logits", spy)
    return calls


@backends("reference")
def test_hidden_topk_method_choice(monkeypatch):
    """auto follows launch_plan.hidden_topk_method (fused by default; gemm from its crossover
    once one is set); method= and JETSPEC_HIDDEN_TOPK force one; bad values name the argument."""
    monkeypatch.delenv("JETSPEC_HIDDEN_TOPK", raising=False)
    calls = _spy_gemm(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(300, 16, generator=gen).half()
    root = torch.zeros(2, dtype=torch.int32)

    def tree(d, **kw):
        hidden = torch.randn(2, d, 16, generator=gen).half()
        return jk.draft_tree_from_hidden(hidden, weight, root, budget=8, topk=2,
                                         backend="reference", **kw)

    tree(3)
    tree(3, method="auto")
    assert calls == []                                   # no crossover on the CPU: fused
    monkeypatch.setitem(launch_plan.HIDDEN_TOPK_GEMM_MIN_ROWS, "cpu", 8)
    tree(3)                                              # 6 rows: below the crossover
    assert calls == []
    tree(4)                                              # 8 rows: at it
    assert calls == [(2, 4, 16)]
    tree(4, method="fused")                              # forced, either way
    monkeypatch.setenv("JETSPEC_HIDDEN_TOPK", "fused")
    tree(4)
    assert len(calls) == 1
    monkeypatch.setitem(launch_plan.HIDDEN_TOPK_GEMM_MIN_ROWS, "cpu", None)
    tree(1, method="gemm")
    monkeypatch.setenv("JETSPEC_HIDDEN_TOPK", "gemm")
    tree(1)
    assert calls[1:] == [(2, 1, 16), (2, 1, 16)]
    for bad in ("GEMM", "cublas", "", 1):
        with pytest.raises(ValueError, match=r"^method must be one of \('auto', 'fused', 'gemm'\)"):
            tree(1, method=bad)
    monkeypatch.setenv("JETSPEC_HIDDEN_TOPK", "unfused")
    with pytest.raises(ValueError, match=r"^JETSPEC_HIDDEN_TOPK must be one of .*'unfused'"):
        tree(1)
    tree(1, method="fused")                              # an explicit method ignores the variable


@backends("sim")
def test_fused_asked_of_the_cuda_backend(monkeypatch):
    """The cuda backend has no fused hidden top-K: asked for by method= or by JETSPEC_HIDDEN_TOPK
    (the process default being cuda, as in a decode loop), a BackendUnavailableError naming where
    the ask came from; method= overrides the variable; auto takes the GEMM method."""
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(1, 3, 16, generator=gen).half()
    w = torch.randn(40, 16, generator=gen).half()
    r = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setenv("JETSPEC_HIDDEN_TOPK", "fused")
    prev = jk.get_backend()
    jk.set_backend("cuda")
    try:
        with pytest.raises(jk.BackendUnavailableError,
                           match=r"^backend 'cuda' has no fused hidden top-K \(JETSPEC_HIDDEN_TOPK="):
            jk.draft_tree_from_hidden(h, w, r, budget=6, topk=2)
        want = ref.draft_tree(h.double() @ w.double().T, r, 6, 2)
        for method in ("gemm", "auto"):
            got = jk.draft_tree_from_hidden(h, w, r, budget=6, topk=2, method=method)
            assert tree_difference(got, want, 1e-4) is None
    finally:
        jk.set_backend(prev)


@backends("reference", "triton", "sim")
@pytest.mark.parametrize("cap,chunk", [(4 * 300 * 3, 3), (4 * 300 * 3 + 4, 3), (4 * 300 - 1, 1),
                                       (4 * 300 * 8, 8)])
def test_gemm_topk_chunks_rows_by_the_logits_cap(backend, monkeypatch, cap, chunk):
    """The gemm method never holds more than HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES of float32 logits
    (B * D * V * 4 bytes; V the lm_head rows): bigger calls run in chunks of floor(cap / 4V)
    rows (one at least; the last chunk partial), with the result of one pass. Strided hidden
    states (B and D sliced) are chunked over their B * D rows in order."""
    calls = _spy_gemm(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(300, 16, generator=gen).half()               # V 300, H 16
    base = torch.randn(4, 8, 16, generator=gen).half()
    hidden = base[::2, 1::2]                                          # B 2, D 4: 8 rows
    root = torch.zeros(2, dtype=torch.int32)
    x, w, r = (on(t, backend.device) for t in (hidden, weight, root))
    one = checked_topk(x, w, r, budget=8, topk=5, algorithm="topn", backend=api_backend(backend),
                       method="gemm")
    assert calls == [(2, 4, 16)]
    monkeypatch.setattr(launch_plan, "HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES", cap)
    with poisoned_empty():
        got = checked_topk(x, w, r, budget=8, topk=5, algorithm="topn",
                           backend=api_backend(backend), method="gemm")
    sync(backend.device)
    sizes = [min(chunk, 8 - i) for i in range(0, 8, chunk)]
    assert calls[1:] == ([(2, 4, 16)] if chunk >= 8 else [(1, n, 16) for n in sizes])
    assert got[0].shape == (2, 4, 5) and got[1].shape == (2, 4, 5)
    # The same tokens; log-probs within float32 rounding of one pass (a GEMM of fewer rows may
    # sum in another order: torch's CPU matmul takes a GEMV path for one row).
    assert torch.equal(got[0].cpu(), one[0].cpu())
    want_t, want_l = ref.log_softmax_topk(hidden.double() @ weight.double().T, 5)
    assert torch.equal(got[0].cpu().long(), want_t)
    assert rel_l2(got[1].cpu(), one[1].cpu()) < TOL[torch.float32]
    assert rel_l2(got[1].cpu(), want_l) < TOL[torch.float32]


@backends("reference")
@pytest.mark.parametrize("method", ["fused", "gemm"])
def test_hidden_and_lm_head_must_be_finite(method):
    """A NaN or infinite value in hidden or in lm_head_weight gives logits with no log-softmax:
    a ValueError naming the argument, whichever method runs."""
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(1, 2, 16, generator=gen).half()
    weight = torch.randn(50, 16, generator=gen).half()
    root = torch.zeros(1, dtype=torch.int32)
    for name in ("hidden", "lm_head_weight"):
        for bad in (float("nan"), float("inf")):
            h, w = hidden.clone(), weight.clone()
            (h if name == "hidden" else w).view(-1)[7] = bad
            with pytest.raises(ValueError, match=f"^{name} must be finite"):
                jk.draft_tree_from_hidden(h, w, root, budget=8, topk=2, backend="reference",
                                          method=method)

