"""verify_tree (target tokens, filtered sampling and the acceptance walk) against python_ref,
bit-exact integer outputs, on the cuda kernels (simulator, and a GPU: gpu) and Triton."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.tree import Tree
from jetspec_kernels.triton import verify
from helpers import (DEV, VERIFY_KEYS, backends, cu, filter_case, kept_by_thresholds,
                     poisoned_empty, random_tree, steering_logits, sync)


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
# (B, N, V, misaligned): one vocab split; a B = 1 verify in 3 splits (with a tie across splits
# and a NaN logit); 2 splits over logits whose rows are not 16-byte aligned (scalar loads).
@pytest.mark.parametrize("b,n,v,misaligned", [(3, 40, 1000, False), (1, 9, 9000, False),
                                              (2, 7, 9001, True)])
def test_verify_tree(dev, dtype, temperature, b, n, v, misaligned):
    gen = torch.Generator().manual_seed(5)
    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)  # frequent matches
    logits = torch.randn(b, n, v + misaligned, generator=gen).to(dtype)[..., misaligned:]
    logits[..., :4] += 4.0
    logits[0, 0, [3, v - 2]] = 40.0  # node 0: equal maxima in the first and last split
    logits[0, 1, v // 2] = float("nan")  # NaN is the maximum (torch.argmax)
    seed = torch.tensor([1, 2, 3], dtype=torch.int64)[:b]
    offset = torch.tensor([7, 7, 2 ** 40], dtype=torch.int64)[:b]
    max_depth = 8
    want = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=logits.float(),
                           temperature=temperature, seed=seed, offset=offset)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), max_depth,
                               logits.to(dev), None, temperature, seed.to(dev), offset.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


@backends("sim", "cuda")
@pytest.mark.parametrize("target", ["tokens", "greedy", "sampled"])
def test_verify_tree_empty_rows(dev, target):
    """num_nodes 0 (value checks off): the root is still verified, so the row is a one-node
    tree: accept_len 0 and the bonus is the target's token at node 0 (given, or from logits)."""
    gen = torch.Generator().manual_seed(6)
    b, n, v = 4, 33, 300
    parents, num_nodes = random_tree(b, n, gen)
    num_nodes[1] = 0
    num_nodes[2] = 1
    tokens = torch.randint(0, 3, (b, n), generator=gen, dtype=torch.int32)
    seed = torch.tensor([1, 2, 3, 4], dtype=torch.int64)
    offset = torch.zeros(b, dtype=torch.int64)
    temperature = 0.8 if target == "sampled" else 0.0
    if target == "tokens":
        tgt = torch.randint(0, 3, (b, n), generator=gen, dtype=torch.int32)
        logits = None
    else:
        logits = torch.randn(b, n, v, generator=gen)
        logits[..., :3] += 3.0
        tgt = ref.sample_tokens(logits, temperature, seed, offset)
    want = ref.verify_tree(tokens, parents, num_nodes, 6, target_tokens=tgt)
    to = lambda t: None if t is None else t.to(dev)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), 6, to(logits),
                               tgt.to(dev) if logits is None else None, temperature,
                               to(seed), to(offset))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key
    assert got[0][1] == 0 and got[2][1] == tgt[1, 0] and got[1][1, 0] == 0


@backends("sim", "cuda")
def test_verify_tree_uniform_clamp(dev):
    """Seed 39114, offset 0, sequence 0, node 0, v 7 hashes to h >> 8 == 2**24 - 1, whose uniform
    rounds to 1.0 in float32 unless clamped to 1 - 2**-24: an infinite Gumbel would make v 7 win
    over token 3's clear lead. One-node trees, so the bonus is the sample at node 0."""
    tokens = torch.zeros(2, 1, dtype=torch.int32)
    parents = torch.full((2, 1), -1, dtype=torch.int32)
    num_nodes = torch.ones(2, dtype=torch.int32)
    logits = torch.zeros(2, 1, 8)
    logits[:, 0, 3] = 30.0
    seed = torch.tensor([39114, 39114], dtype=torch.int64)
    offset = torch.zeros(2, dtype=torch.int64)
    want = ref.verify_tree(tokens, parents, num_nodes, 0, target_logits=logits, temperature=1.0,
                           seed=seed, offset=offset)
    assert want["bonus"].tolist() == [3, 3]
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), 0,
                               logits.to(dev), None, 1.0, seed.to(dev), offset.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
# (N, V, misaligned): vector loads; a vocabulary in several phase-1 splits (and a two-pass id
# select among ties); rows off 16 bytes (scalar loads).
@pytest.mark.parametrize("n,v,misaligned", [(5, 300, False), (4, 9000, False), (3, 1001, True)])
def test_verify_tree_filters(dev, dtype, n, v, misaligned):
    """Per-sequence temperature (one sequence greedy), top-k and top-p with exact ties at both
    boundaries (helpers.filter_case): the thresholds keep exactly python_ref.filter_keep's
    tokens, and every node's sample (one-node trees) and whole-tree verdicts are python_ref's."""
    gen = torch.Generator().manual_seed(n * 7 + v)
    logits, temp, top_k, top_p = filter_case(gen, n, v + misaligned, dtype)
    logits = logits[..., misaligned:]
    to = lambda t: None if t is None else t.to(dev)
    sampled = temp > 0
    x = logits.float() / temp[:, None, None]
    for k_, p_ in ((top_k, None), (None, top_p), (top_k, top_p)):
        with poisoned_empty():
            thr = cu().verify.filter_thresholds(logits.to(dev), temp.to(dev), to(k_), to(p_))
        sync(dev)
        kept = kept_by_thresholds(logits, temp, *thr)
        assert torch.equal(kept[sampled], ref.filter_keep(x, k_, p_)[sampled]), (k_, p_)

    b = logits.shape[0]
    rep = lambda t: t.repeat_interleave(n)           # every node its own one-node tree
    rows = logits.reshape(b * n, 1, v)
    zeros = torch.zeros(b * n, 1, dtype=torch.int32)
    seed = torch.arange(b * n, dtype=torch.int64) * 7919 + 3
    offset = torch.arange(b * n, dtype=torch.int64) % 5
    kw = dict(temperature=rep(temp), seed=seed, offset=offset, top_k=rep(top_k), top_p=rep(top_p))
    want = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows, **kw)
    with poisoned_empty():
        got = cu().verify_tree(zeros.to(dev), (zeros - 1).to(dev), (zeros[:, 0] + 1).to(dev), 0,
                               rows.to(dev), None, *(to(kw[k]) for k in ("temperature", "seed",
                                                                         "offset", "top_k", "top_p")))
    sync(dev)
    assert torch.equal(got[2].cpu(), want["bonus"].cpu())
    unfiltered = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows,
                                 temperature=rep(temp), seed=seed, offset=offset)
    assert not torch.equal(want["bonus"], unfiltered["bonus"]), "the filters should change samples"

    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)
    seed, offset = seed[:b], offset[:b]
    want = ref.verify_tree(tokens, parents, num_nodes, n - 1, target_logits=logits,
                           temperature=temp, seed=seed, offset=offset, top_k=top_k, top_p=top_p)
    with poisoned_empty():
        got = cu().verify_tree(tokens.to(dev), parents.to(dev), num_nodes.to(dev), n - 1,
                               logits.to(dev), None, temp.to(dev), seed.to(dev), offset.to(dev),
                               top_k.to(dev), top_p.to(dev))
    sync(dev)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].cpu()), key


@backends("sim", "cuda")
def test_verify_tree_filters_survive_nan_logits(dev):
    """NaN logits are outside the contract (the result is unspecified), but the filter's search
    must still finish without a trap: its integer divisions are guarded."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 500, generator=gen)
    logits[0, 0, ::7] = float("nan")
    logits[1, 1] = float("nan")
    temp = torch.tensor([1.0, 0.5])
    for k_, p_ in ((torch.tensor([5, 0], dtype=torch.int32), None), (None, torch.tensor([0.5, 0.3])),
                   (torch.tensor([5, 0], dtype=torch.int32), torch.tensor([0.5, 0.3]))):
        cu().verify.filter_thresholds(logits.to(dev), temp.to(dev), None if k_ is None else k_.to(dev),
                                      None if p_ is None else p_.to(dev))
    sync(dev)


@backends("sim", "cuda")
def test_verify_tree_walk_limit(dev):
    # The walk stages at most walk_max_nodes nodes; a larger tree is an error from the launcher
    # (and `auto` never sends one there).
    n = cu()._util.limit("walk_max_nodes")
    tokens = torch.zeros(1, n + 1, dtype=torch.int32, device=dev)
    parents = torch.full((1, n + 1), -1, dtype=torch.int32, device=dev)
    num_nodes = torch.tensor([n + 1], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=rf"verify_walk: n {n + 1} exceeds {n}$"):
        cu().verify_tree(tokens, parents, num_nodes, 1, None, tokens, 0.0, None, None)
    with poisoned_empty():
        got = cu().verify_tree(tokens[:, :n], parents[:, :n], num_nodes - 1, 1, None,
                               tokens[:, :n], 0.0, None, None)
    sync(dev)
    assert got[0].cpu().tolist() == [0] and got[2].cpu().tolist() == [0]


# ---------------------------------------------------------------- the triton kernels


def run_triton(tokens, parents, num_nodes, max_depth, logits=None, target=None, temperature=0.0,
               seed=None, offset=None, num_splits=None, block_v=None, top_k=None, top_p=None):
    """The kernels on poisoned (-7) outputs and partials; returns the outputs on the CPU in
    VERIFY_KEYS order."""
    B = tokens.shape[0]
    to = lambda t: None if t is None else t.to(DEV)
    outs = [torch.full(s, -7, dtype=torch.int32, device=DEV)
            for s in ((B,), (B, max_depth + 1), (B,), (B, max_depth + 1))]
    if torch.is_tensor(temperature):
        temperature = temperature.to(DEV)
    with poisoned_empty():
        verify.launch(to(tokens), to(parents), to(num_nodes), max_depth, to(logits), to(target),
                      temperature, to(seed), to(offset), *outs, num_splits=num_splits,
                      block_v=block_v, top_k=to(top_k), top_p=to(top_p))
    return [o.cpu() for o in outs]


def check(tokens, parents, num_nodes, max_depth, logits=None, target=None, temperature=0.0,
          seed=None, offset=None, num_splits=None, top_k=None, top_p=None):
    got = run_triton(tokens, parents, num_nodes, max_depth, logits, target, temperature, seed,
                     offset, num_splits, top_k=top_k, top_p=top_p)
    want = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=logits,
                           target_tokens=target, temperature=temperature, seed=seed, offset=offset,
                           top_k=top_k, top_p=top_p)
    for key, g in zip(VERIFY_KEYS, got):
        assert g.dtype == torch.int32
        assert torch.equal(g, want[key].to(torch.int32)), f"{key}: {g} != {want[key]}"
    return want


def real_tree(B, D, V, budget, topk, gen):
    logits = torch.randn(B, D, V, generator=gen) * 3
    roots = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    t = ref.draft_tree(logits, roots, budget, topk)
    return (t["tokens"].to(torch.int32), t["parents"].to(torch.int32),
            t["num_nodes"].to(torch.int32), min(D, budget - 1), t)


def random_tree_tokens(B, N, V, gen):
    """Random tokens, parents (parents[i] < i) and ragged num_nodes, padding rows per
    CONTRIBUTING.md, and junk beyond num_nodes that a walk must ignore."""
    tokens = torch.randint(0, V, (B, N), generator=gen, dtype=torch.int32)
    parents, num_nodes = random_tree(B, N, gen, min_nodes=1, pad=False)
    num_nodes[0] = N
    for b in range(1, B):
        n = int(num_nodes[b])
        tokens[b, n:] = tokens[b, 0]          # junk that matches if num_nodes were ignored
        parents[b, n:] = 0
    return tokens, parents, num_nodes


@backends("triton")
def test_uniform_bit_exact():
    seed = torch.tensor([0, 1, -1, 2**40 + 12345, 2**63 - 1], dtype=torch.int64)
    offset = torch.tensor([0, 7, 2**33 + 1, -5, 99], dtype=torch.int64)
    got = verify.gumbel_uniform(seed.to(DEV), offset.to(DEV), 3, 4099).cpu()
    want = ref.gumbel_uniform(seed, offset, 3, 4099)
    assert torch.equal(got, want)
    assert float(got.min()) > 0.0 and float(got.max()) < 1.0


@backends("triton")
def test_uniform_clamp_below_one():
    """Seed 39114, offset 0, b 0, node 0, v 7 reaches h >> 8 == 2**24 - 1, which rounds to 1.0 in
    float32 unless clamped: u, the sample and a one-node walk's bonus must match python_ref, and
    an infinite Gumbel at v 7 must not beat token 3's lead."""
    seed, offset = torch.tensor([39114], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)
    u = verify.gumbel_uniform(seed.to(DEV), offset.to(DEV), 1, 8).cpu()
    assert torch.equal(u, ref.gumbel_uniform(seed, offset, 1, 8))
    assert u[0, 0, 7].item() == 1.0 - 2.0 ** -24
    logits = torch.zeros(1, 1, 8)
    logits[0, 0, 3] = 30.0
    got = verify.sample_tokens(logits.to(DEV), 1.0, seed.to(DEV), offset.to(DEV)).cpu()
    assert torch.equal(got, ref.sample_tokens(logits, 1.0, seed, offset)) and got.item() == 3
    zeros = torch.zeros(1, 1, dtype=torch.int32)
    want = check(zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=logits, temperature=1.0,
                 seed=seed, offset=offset)
    assert want["bonus"].tolist() == [3]


@backends("triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0, 1.7])
def test_sample_tokens_equal_reference(dtype, temperature):
    gen = torch.Generator().manual_seed(int(temperature * 10))
    B, N, V = 3, 7, 3001
    logits = (torch.randn(B, N, V, generator=gen) * 2).to(dtype)
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    got = verify.sample_tokens(logits.to(DEV), temperature, seed.to(DEV), offset.to(DEV)).cpu()
    assert torch.equal(got, ref.sample_tokens(logits, temperature, seed, offset))


@backends("triton")
def test_greedy_ties_go_to_lower_id():
    gen = torch.Generator().manual_seed(5)
    B, N, V = 3, 6, 2100
    logits = torch.randint(0, 3, (B, N, V), generator=gen).float()
    logits[1, 2] = float("-inf")                      # torch.argmax gives 0
    logits[2, 1, 2049] = 7.0                          # maximum only in a late tile
    logits[2, 3, :] = 0.0
    logits[2, 3, 1000] = 1.0                          # tie across tiles and splits
    logits[2, 3, 2099] = 1.0
    want = ref.sample_tokens(logits, 0.0)
    assert torch.equal(verify.sample_tokens(logits.to(DEV), 0.0).cpu(), want)
    # every row as its own one-node tree: the walk's bonus is that row's folded target token
    rows = logits.view(B * N, 1, V)
    zeros = torch.zeros(B * N, 1, dtype=torch.int32)
    for splits, block_v in ((1, 256), (2, 2048), (5, 256), (9, 128)):
        got = run_triton(zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows, num_splits=splits,
                         block_v=block_v)
        assert torch.equal(got[2], want.flatten()), (splits, block_v)
        assert torch.equal(got[3][:, 0], want.flatten())


@backends("triton")
@pytest.mark.parametrize("budget,topk,splits", [(13, 3, 1), (20, 4, 3), (37, 2, 2)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_real_trees_match_reference(budget, topk, splits, temperature):
    gen = torch.Generator().manual_seed(budget + splits)
    B, D, V = 3, 6, 700
    tokens, parents, num_nodes, max_depth, _ = real_tree(B, D, V, budget, topk, gen)
    logits = steering_logits(tokens, parents, num_nodes, V, gen)
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    want = check(tokens, parents, num_nodes, max_depth, logits=logits, temperature=temperature,
                 seed=seed, offset=offset, num_splits=splits)
    assert int(want["accept_len"].max()) >= 2, "the steering should make some walks go deep"


@backends("triton")
def test_fp16_logits_sampling():
    gen = torch.Generator().manual_seed(11)
    B, D, V = 3, 5, 500
    tokens, parents, num_nodes, max_depth, _ = real_tree(B, D, V, 16, 3, gen)
    logits = steering_logits(tokens, parents, num_nodes, V, gen, dtype=torch.float16)
    check(tokens, parents, num_nodes, max_depth, logits=logits, temperature=1.0,
          seed=torch.tensor([3, 4, 5]), offset=torch.tensor([0, 0, 1]), num_splits=2)


@backends("triton")
def test_sibling_token_ties_lowest_index_wins():
    #        0
    #   1(5) 2(5) 3(7)        num_nodes = 7; node 7 is padding-beyond-num_nodes junk
    #   5(9) 4(9)<-2  6(9)<-1
    tokens = torch.tensor([[1, 5, 5, 7, 9, 9, 9, 5]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 0, 2, 1, 1, 0]], dtype=torch.int32)
    num_nodes = torch.tensor([7], dtype=torch.int32)
    target = torch.tensor([[5, 9, 3, 3, 3, 4, 2, 8]], dtype=torch.int32)
    want = check(tokens, parents, num_nodes, 3, target=target)
    assert want["path"].tolist() == [[0, 1, 5, -1]]
    assert want["emitted"].tolist() == [[5, 9, 4, -1]]
    target[0, 0] = 7
    check(tokens, parents, num_nodes, 3, target=target)
    target[0, 0] = 8                                   # only junk node 7 (beyond num_nodes) has 8
    tokens[0, 7] = 8
    want = check(tokens, parents, num_nodes, 3, target=target)
    assert int(want["accept_len"][0]) == 0


@backends("triton")
@pytest.mark.parametrize("target", ["tokens", "greedy", "sampled"])
def test_empty_rows_verify_the_root(target):
    """num_nodes 0 (value checks off): the root is still verified; the row acts as a one-node
    tree, so its bonus is the target's token at node 0 (given, or from its logits)."""
    gen = torch.Generator().manual_seed(8)
    B, N, V = 4, 9, 300
    tokens, parents, num_nodes = random_tree_tokens(B, N, 3, gen)
    num_nodes[1] = 0
    num_nodes[2] = 1
    seed, offset = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 0])
    temperature = 0.8 if target == "sampled" else 0.0
    logits = steering_logits(tokens, parents, num_nodes, V, gen)
    per_node = ref.sample_tokens(logits, temperature, seed, offset)
    kw = dict(target=per_node) if target == "tokens" else dict(logits=logits)
    want = check(tokens, parents, num_nodes, 4, temperature=temperature, seed=seed, offset=offset,
                 num_splits=2, **kw)
    assert want["accept_len"][1] == 0 and want["bonus"][1] == per_node[1, 0]


@backends("triton")
@pytest.mark.parametrize("N,max_depth", [(1, 0), (5, 4), (37, 3), (37, 36), (64, 9)])
def test_target_tokens_random_trees(N, max_depth):
    gen = torch.Generator().manual_seed(N * 100 + max_depth)
    B, V = 5, 3                                        # tiny vocab: long walks and many ties
    tokens, parents, num_nodes = random_tree_tokens(B, N, V, gen)
    target = torch.randint(0, V, (B, N), generator=gen, dtype=torch.int32)
    check(tokens, parents, num_nodes, max_depth, target=target)


@backends("triton")
def test_sampling_distribution_tiny_vocab():
    """Many (seed, node) draws on one 5-token distribution: chi-square against softmax(x/T)."""
    B, N, V, T = 16, 40, 5, 0.8
    x = torch.tensor([1.0, 0.2, -0.5, 0.9, -2.0])
    logits = x.expand(B, N, V).contiguous()
    seed = torch.arange(B, dtype=torch.int64) * 7919 + 1
    offset = torch.arange(B, dtype=torch.int64) % 3
    got = verify.sample_tokens(logits.to(DEV), T, seed.to(DEV), offset.to(DEV)).cpu()
    counts = torch.bincount(got.flatten().long(), minlength=V).double()
    expect = torch.softmax(x.double() / T, 0) * (B * N)
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 18.5, (counts, expect)               # 4 dof: P(chi2 > 18.5) ~ 1e-3


@backends("triton")
@pytest.mark.parametrize("dtype,V", [(torch.float32, 64), (torch.bfloat16, 64),
                                     (torch.float32, 700)])   # 700: two tiles of step 0
def test_filter_thresholds_keep_reference_set(dtype, V):
    """Step 0 alone, per-sequence controls with exact ties at the top-k and top-p boundaries
    (helpers.filter_case): the kept sets are python_ref.filter_keep's, node for node."""
    gen = torch.Generator().manual_seed(V)
    logits, temp, top_k, top_p = filter_case(gen, 4, V, dtype)
    sampled = temp > 0
    x = logits.float() / temp[:, None, None]
    to = lambda t: None if t is None else t.to(DEV)
    for k_, p_ in ((top_k, None), (None, top_p), (top_k, top_p)):
        with poisoned_empty():
            thr = verify.filter_thresholds(logits.to(DEV), temp.to(DEV), to(k_), to(p_))
        kept = kept_by_thresholds(logits, temp, *thr)
        want = ref.filter_keep(x, k_, p_)
        assert torch.equal(kept[sampled], want[sampled]), (k_, p_)
    assert want[0, 0].sum() == 3 and want[0, 1].sum() == 2 and want[3].sum(-1).eq(1).all()


@backends("triton")
@pytest.mark.parametrize("num_splits", [1, 3])
def test_filtered_samples_and_verdicts_equal_reference(num_splits):
    """Every node's filtered sample (greedy for the temperature-0 sequence) equals python_ref's,
    and so do whole-tree verdicts (step 1 in 1 or 3 vocabulary splits), per-sequence
    temperature, top-k and top-p in one batch."""
    gen = torch.Generator().manual_seed(num_splits)
    N, V = 6, 300
    logits, temp, top_k, top_p = filter_case(gen, N, V)
    B = logits.shape[0]
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    got = verify.sample_tokens(logits.to(DEV), temp.to(DEV), seed.to(DEV), offset.to(DEV),
                               top_k.to(DEV), top_p.to(DEV)).cpu()
    want = ref.sample_tokens(logits, temp, seed, offset, top_k, top_p)
    assert torch.equal(got, want)
    assert torch.equal(want[1], ref.sample_tokens(logits, 0.0)[1])          # greedy sequence
    assert not torch.equal(want, ref.sample_tokens(logits, temp, seed, offset))
    tokens, parents, num_nodes = random_tree_tokens(B, N, 4, gen)
    logits = torch.maximum(logits, steering_logits(tokens, parents, num_nodes, V, gen, boost=40.0))
    got = run_triton(tokens, parents, num_nodes, N - 1, logits, None, temp, seed, offset,
                     num_splits, block_v=128, top_k=top_k, top_p=top_p)
    want = ref.verify_tree(tokens, parents, num_nodes, N - 1, target_logits=logits,
                           temperature=temp, seed=seed, offset=offset, top_k=top_k, top_p=top_p)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g, want[key]), key
    assert int(want["accept_len"].max()) >= 2, "the steering should make some walks go deep"


@backends("triton")
def test_public_api_dispatches_to_triton():
    gen = torch.Generator().manual_seed(2)
    B, D, V = 3, 4, 300
    _, _, _, max_depth, t = real_tree(B, D, V, 12, 3, gen)
    tree = Tree(*(t[k].to(torch.int32) for k in ("tokens", "parents", "depths")),
                t["scores"].float(), t["num_nodes"].to(torch.int32), t["mask"].to(torch.int32),
                max_depth)
    logits = steering_logits(tree.tokens, tree.parents, tree.num_nodes, V, gen)
    for kw in (dict(), dict(temperature=0.9, seed=5, offset=torch.tensor([1, 2, 3])),
               dict(temperature=torch.tensor([0.0, 0.9, 1.5]), seed=5, offset=3,
                    top_k=torch.tensor([0, 2, 3]), top_p=0.7)):
        got = jk.verify_tree(tree, logits, backend="triton", **kw)
        want = jk.verify_tree(tree, logits, backend="reference", **kw)
        for g, w in zip(got, want):
            assert g.dtype == torch.int32 and torch.equal(g, w)


@backends("triton")
@pytest.mark.parametrize("B,D,V,budget,topk", [
    pytest.param(3, 6, 2001, 24, 3, id="small"),     # no tl.dot: bf16 runs under the interpreter
    pytest.param(4, 15, 151936, 64, 7, id="qwen_vocab", marks=pytest.mark.gpu),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bf16_logits(B, D, V, budget, topk, temperature):
    gen = torch.Generator().manual_seed(0)
    tokens, parents, num_nodes, max_depth, _ = real_tree(B, D, V, budget, topk, gen)
    logits = steering_logits(tokens, parents, num_nodes, V, gen, dtype=torch.bfloat16)
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    got = run_triton(tokens, parents, num_nodes, max_depth, logits, None, temperature, seed,
                     offset)
    want = ref.verify_tree(tokens.to(DEV), parents.to(DEV), num_nodes.to(DEV), max_depth,
                           target_logits=logits.to(DEV), temperature=temperature,
                           seed=seed.to(DEV), offset=offset.to(DEV))
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g, want[key].cpu().to(torch.int32)), key
