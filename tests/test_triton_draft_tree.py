"""Triton draft-tree path vs python_ref: log-softmax top-K (from logits and fused from hidden
states), tree building (topn, accum_logp; bit-exact from top-K), pack_mask, and draft_tree."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.triton import tree_build as triton_tree
from jetspec_kernels.triton import topk as triton_topk
from helpers import (TREE_FIELDS, assert_padding, poisoned_empty, rel_l2, tree_difference,
                     tree_fields)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ALGS = ("topn", "accum_logp")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


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


def random_tree(gen, B, N):
    parents = torch.full((B, N), -1, dtype=torch.int32)
    num = torch.randint(1, N + 1, (B,), generator=gen, dtype=torch.int32)
    for b in range(B):
        for i in range(1, int(num[b])):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
    return parents, num


def check_tree_exact(got, want):
    g, w = tree_fields(got), tree_fields(want)
    for key in TREE_FIELDS:
        assert g[key].dtype == (torch.float32 if key == "scores" else torch.int32), key
        assert torch.equal(g[key], w[key].to(g[key].dtype)), f"{key}:\n{g[key]}\n{w[key]}"


# ------------------------------------------------------------------------------ top-K
@pytest.mark.parametrize("B,D,V,k,block_v,dtype", [
    (3, 5, 1000, 7, None, torch.float32),
    (1, 3, 5003, 3, 512, torch.float16),
    (3, 1, 5003, 2, None, torch.float32),
    (1, 1, 1000, 1, 64, torch.float16),
    (1, 3, 1000, 64, 256, torch.float32),
])
def test_log_softmax_topk(B, D, V, k, block_v, dtype):
    gen = torch.Generator().manual_seed(B * 100 + V + k)
    x = (torch.randn(B, D, V, generator=gen) * 3).to(dtype)
    x[0, 0, 7] = x[0, 0, 3] = x[0, 0].max() + 1  # a tied maximum: the lower id comes first
    with poisoned_empty():
        tok, lp = triton_topk.log_softmax_topk(x.to(DEV), k, block_v=block_v)
    want_tok, want_lp = ref.log_softmax_topk(x.double(), k)
    assert tok.dtype == torch.int32 and lp.dtype == torch.float32
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]
    assert tok[0, 0, 0] == 3 and (k == 1 or tok[0, 0, 1] == 7)


def test_log_softmax_topk_strided_rows():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 1000, generator=gen)[1::2, ::2]  # strided B and D, contiguous V
    tok, lp = triton_topk.log_softmax_topk(x.to(DEV), 4, block_v=128)
    want_tok, want_lp = ref.log_softmax_topk(x.double(), 4)
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@pytest.mark.parametrize("B,D,H,V,k,dtype", [
    (3, 5, 40, 1000, 7, torch.float32),
    (1, 3, 64, 5003, 3, torch.float16),
    (2, 9, 96, 1000, 1, torch.float16),
])
def test_hidden_topk(B, D, H, V, k, dtype):
    gen = torch.Generator().manual_seed(H + V)
    hidden = torch.randn(B, D, H, generator=gen).to(dtype)
    weight = torch.randn(V, H, generator=gen).to(dtype)
    with poisoned_empty():
        tok, lp = triton_topk.hidden_topk(hidden.to(DEV), weight.to(DEV), k)
    want_tok, want_lp = ref.log_softmax_topk(hidden.double() @ weight.double().T, k)
    assert torch.equal(tok.cpu(), want_tok)
    # fp16 inputs are exact in fp32; only the accumulation order differs from float64
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


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


@pytest.mark.parametrize("B,D,K,budget", [(2, 5, 3, 64), (1, 3, 16, 256), (2, 2, 64, 128)])
def test_topn_all_equal_logprobs(B, D, K, budget):
    """Every sibling ties: order is by depth, then rank sequence (breadth-first), and the budget
    cuts through one huge tie group."""
    lp = torch.full((B, D, K), -0.5)
    build_exact(lp, D * K, budget)


@pytest.mark.parametrize("D,budget", [(40, 64), (70, 64), (1, 2)])
def test_topn_k1_chain(D, budget):
    gen = torch.Generator().manual_seed(D)
    lp = sorted_logprobs(gen, 2, D, 1, levels=1)
    build_exact(lp, D, budget)


def test_topn_neg_inf_logprobs():
    """Impossible candidates (-inf) tie with each other at every depth: depth, then rank order."""
    gen = torch.Generator().manual_seed(9)
    lp = sorted_logprobs(gen, 3, 6, 5, levels=2)
    lp[:, :, 3:] = float("-inf")
    lp[1, 2, 1:] = float("-inf")
    lp[2, 1, :] = float("-inf")
    build_exact(lp, 9, 150)
    build_exact(lp, 10, 150, algorithm="accum_logp")


@pytest.mark.parametrize("D,K,levels", [(6, 4, 2), (5, 5, 1)])
def test_topn_budget_4096(D, K, levels):
    """Largest budget (window of one child a parent); D 5 K 5 has 3906 nodes < 4096: padding."""
    gen = torch.Generator().manual_seed(D * K)
    lp = sorted_logprobs(gen, 1, D, K, levels=levels)
    build_exact(lp, D + K, 4096)


@pytest.mark.parametrize("seed", range(8))
def test_topn_random_shapes(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    B = int(torch.randint(1, 4, (1,), generator=gen))
    D = int(torch.randint(1, 10, (1,), generator=gen))
    K = int(torch.randint(1, 12, (1,), generator=gen))
    budget = int(torch.randint(1, 300, (1,), generator=gen))
    lp = sorted_logprobs(gen, B, D, K, levels=(0, 1, 4)[seed % 3])
    build_exact(lp, seed, budget)


@pytest.mark.parametrize("algorithm", ALGS)
def test_build_tree_continuous_and_strided(algorithm):
    gen = torch.Generator().manual_seed(3)
    lp = sorted_logprobs(gen, 5, 4, 6).transpose(0, 1).contiguous().transpose(0, 1)
    tok = torch.randint(0, 1000, (5, 4, 6), generator=gen, dtype=torch.int32)
    root = torch.arange(5, dtype=torch.int32)
    got = triton_tree.build_tree(tok.to(DEV), lp.to(DEV), root.to(DEV), 45, algorithm)
    check_tree_exact(got, ref.build_tree(tok, lp, root, 45, algorithm))


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


# ------------------------------------------------------------------------------ pack_mask
@pytest.mark.parametrize("B,N", [(1, 1), (3, 37), (2, 64), (1, 70)])
def test_pack_mask(B, N):
    gen = torch.Generator().manual_seed(N)
    parents, num = random_tree(gen, B, N)
    with poisoned_empty():
        got = jk.pack_mask(parents.to(DEV), num.to(DEV), backend="triton")
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), ref.pack_mask(parents, num))


def test_pack_mask_deep_chain_sets_bit_31():
    parents = (torch.arange(64, dtype=torch.int32) - 1).reshape(1, 64)
    num = torch.tensor([64], dtype=torch.int32)
    got = triton_tree.pack_mask(parents.to(DEV), num.to(DEV)).cpu()
    assert torch.equal(got, ref.pack_mask(parents, num))
    assert got[0, 63, 0] == -1 and got[0, 63, 1] == -1  # all 32 bits set: two's complement


# ------------------------------------------------------------------------------ bf16
# log_softmax_topk and build_tree have no tl.dot, so bf16 runs under the interpreter (a small
# shape); hidden_topk's bf16 tl.dot does not (the interpreter multiplies raw bits): GPU only.
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
        tok, lp = triton_topk.log_softmax_topk(logits.to(DEV), K)
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


@pytest.mark.gpu
def test_gpu_bf16_hidden_topk():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 15, 256, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(151936, 256, generator=gen) / 16).to(torch.bfloat16)
    tok, lp = triton_topk.hidden_topk(hidden.cuda(), weight.cuda(), 8)
    want_tok, want_lp = ref.log_softmax_topk(hidden.double() @ weight.double().T, 8)
    assert torch.equal(tok.cpu(), want_tok)
    assert rel_l2(lp.cpu(), want_lp) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGS)
def test_gpu_large_budget(algorithm):
    gen = torch.Generator().manual_seed(2)
    lp = sorted_logprobs(gen, 2, 20, 16, levels=4)
    tok = torch.randint(0, 151936, (2, 20, 16), generator=gen, dtype=torch.int32)
    root = torch.tensor([1, 2], dtype=torch.int32)
    got = triton_tree.build_tree(tok.cuda(), lp.cuda(), root.cuda(), 4096, algorithm)
    check_tree_exact(got, ref.build_tree(tok, lp, root, 4096, algorithm))
