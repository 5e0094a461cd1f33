"""verify_tree (target tokens, filtered sampling and the acceptance walk) against python_ref,
bit-exact integer outputs, on Triton and the cuda kernels (simulator, and a GPU: gpu)."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.tree import Tree
from helpers import (DEV, VERIFY_KEYS, after_rows, api_backend, backend_module, backends, cu,
                     filter_case, kept_by_thresholds, on, poisoned_empty, random_tree,
                     skip_on_interpreter, steering_logits, sync, widened)
from verify_tree_triton_steps import gumbel_uniform, sample_tokens

verify = backend_module("triton", "verify_tree")


def verify_on(backend, tokens, parents, num_nodes, max_depth, logits=None, target=None,
              temperature=0.0, seed=None, offset=None, top_k=None, top_p=None, num_splits=None,
              block_v=None):
    """``backend``'s verify_tree on poisoned outputs -> the outputs on the CPU in VERIFY_KEYS order.

    triton runs its launcher on -7 outputs, with ``num_splits`` / ``block_v`` forcing step 1's
    vocabulary splits and tile width (None: chosen for the device); sim and cuda run the cuda
    wrapper, whose phase-1 splits follow the (simulated) device and V, so those two triton
    knobs do not apply there."""
    dev = backend.device
    to = lambda t: t.to(dev) if torch.is_tensor(t) else t
    args = [to(t) for t in (tokens, parents, num_nodes)]
    if backend.name == "triton":
        B = tokens.shape[0]
        outs = [torch.full(s, -7, dtype=torch.int32, device=dev)
                for s in ((B,), (B, max_depth + 1), (B,), (B, max_depth + 1))]
        with poisoned_empty():
            verify.launch(*args, max_depth, to(logits), to(target), to(temperature), to(seed),
                          to(offset), *outs, num_splits=num_splits, block_v=block_v,
                          top_k=to(top_k), top_p=to(top_p))
    else:
        with poisoned_empty():
            outs = cu().verify_tree(*args, max_depth, to(logits), to(target), to(temperature),
                                    to(seed), to(offset), to(top_k), to(top_p))
    sync(dev)
    return [o.cpu() for o in outs]


def check(backend, tokens, parents, num_nodes, max_depth, logits=None, target=None,
          temperature=0.0, seed=None, offset=None, num_splits=None, top_k=None, top_p=None,
          block_v=None):
    """``backend``'s outputs equal python_ref's, int32, bit for bit; returns python_ref's dict."""
    got = verify_on(backend, tokens, parents, num_nodes, max_depth, logits, target, temperature,
                    seed, offset, top_k, top_p, num_splits, block_v)
    want = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_logits=logits,
                           target_tokens=target, temperature=temperature, seed=seed, offset=offset,
                           top_k=top_k, top_p=top_p)
    for key, g in zip(VERIFY_KEYS, got):
        assert g.dtype == torch.int32
        assert torch.equal(g, want[key].cpu().to(torch.int32)), f"{key}: {g} != {want[key]}"
    return want


def thresholds_on(backend, logits, temperature, top_k=None, top_p=None):
    """``backend``'s filter step on its own (poisoned outputs) -> (thr_x, thr_id) on the CPU."""
    dev = backend.device
    to = lambda t: None if t is None else t.to(dev)
    fn = backend_module(backend.name if backend.name == "triton" else "cuda",
                        "verify_tree").filter_thresholds
    with poisoned_empty():
        thr = fn(logits.to(dev), temperature.to(dev), to(top_k), to(top_p))
    sync(dev)
    return tuple(t.cpu() for t in thr)


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


# ------------------------------------------------------------- target tokens from logits
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def random_logits_case(dtype, b, n, v, misaligned, nan=True):
    """Random padded trees of tokens < 4 (frequent matches), logits with a tie of maxima in the
    first and last vocabulary split of node 0 and (``nan``) a NaN (the maximum, as torch.argmax)
    at node 1, rows off 16 bytes when ``misaligned`` (scalar loads)."""
    gen = torch.Generator().manual_seed(5)
    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)
    logits = torch.randn(b, n, v + misaligned, generator=gen).to(dtype)[..., misaligned:]
    logits[..., :4] += 4.0
    logits[0, 0, [3, v - 2]] = 40.0
    if nan:
        logits[0, 1, v // 2] = float("nan")
    seed = torch.tensor([1, 2, 3], dtype=torch.int64)[:b]
    offset = torch.tensor([7, 7, 2 ** 40], dtype=torch.int64)[:b]
    return dict(tokens=tokens, parents=parents, num_nodes=num_nodes, max_depth=8, logits=logits,
                seed=seed, offset=offset)


def real_logits_case(dtype, B, D, V, budget, topk, gen_seed, splits, seed=None, offset=None):
    """python_ref draft trees with steering target logits (deep walks); random seed / offset
    unless given; ``splits`` forces the triton kernels' vocabulary splits."""
    gen = torch.Generator().manual_seed(gen_seed)
    tokens, parents, num_nodes, max_depth, _ = real_tree(B, D, V, budget, topk, gen)
    logits = steering_logits(tokens, parents, num_nodes, V, gen, dtype=dtype)
    if seed is None:
        seed = torch.randint(0, 2**62, (B,), generator=gen)
        offset = torch.randint(0, 2**40, (B,), generator=gen)
    return dict(tokens=tokens, parents=parents, num_nodes=num_nodes, max_depth=max_depth,
                logits=logits, seed=seed, offset=offset, num_splits=splits)


# (case builder, its arguments, temperatures): the old cuda test_verify_tree shapes (one vocab
# split; a B = 1 verify in 3 splits with a tie across splits and a NaN logit; 2 splits over rows
# not 16-byte aligned) in fp32/fp16/bf16; the old triton real-tree cases (splits 1, 3, 2), its
# fp16 sampling case and its bf16 ones (no tl.dot: bf16 runs under the interpreter; the Qwen
# vocabulary on a GPU only).
LOGIT_CASES = [
    *(pytest.param(random_logits_case, (dt, b, n, v, mis), t,
                   id=f"random-{str(dt)[6:]}-{b}x{n}x{v}{'-misaligned' if mis else ''}-T{t}")
      for b, n, v, mis in ((3, 40, 1000, False), (1, 9, 9000, False), (2, 7, 9001, True))
      for dt in (F32, F16, BF16) for t in (0.0, 0.7)),
    *(pytest.param(real_logits_case, (F32, 3, 6, 700, budget, topk, budget + splits, splits), t,
                   id=f"real-{budget}-{topk}-splits{splits}-T{t}")
      for budget, topk, splits in ((13, 3, 1), (20, 4, 3), (37, 2, 2)) for t in (0.0, 0.8)),
    pytest.param(real_logits_case, (F16, 3, 5, 500, 16, 3, 11, 2, torch.tensor([3, 4, 5]),
                                    torch.tensor([0, 0, 1])), 1.0, id="real-fp16-T1.0"),
    *(pytest.param(real_logits_case, (BF16, 3, 6, 2001, 24, 3, 0, None), t,
                   id=f"real-bf16-small-T{t}") for t in (0.0, 1.0)),
    *(pytest.param(real_logits_case, (BF16, 4, 15, 151936, 64, 7, 0, None), t,
                   id=f"real-bf16-qwen_vocab-T{t}", marks=pytest.mark.gpu) for t in (0.0, 1.0)),
]


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("make,args,temperature", LOGIT_CASES)
def test_verify_tree_logits(backend, make, args, temperature, request):
    """Greedy and sampled target tokens from logits, then the walk: bit-exact python_ref."""
    if backend.name == "sim" and "qwen_vocab" in request.node.callspec.id:
        pytest.skip("the Qwen vocabulary is too large for the simulator (runs on triton and cuda)")
    case = make(*args)
    want = check(backend, case["tokens"], case["parents"], case["num_nodes"], case["max_depth"],
                 logits=case["logits"], temperature=temperature, seed=case["seed"],
                 offset=case["offset"], num_splits=case.get("num_splits"))
    if make is real_logits_case and args[0] == F32:
        assert int(want["accept_len"].max()) >= 2, "the steering should make some walks go deep"


# ------------------------------------------------------------- rows with num_nodes 0
def padded_rows_case(target):
    """The old cuda case: 4 padded random trees of 33 nodes over tokens < 3, V 300, max_depth 6;
    target tokens random (``tokens``) or from random logits."""
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
        logits, per_node = None, torch.randint(0, 3, (b, n), generator=gen, dtype=torch.int32)
    else:
        logits = torch.randn(b, n, v, generator=gen)
        logits[..., :3] += 3.0
        per_node = ref.sample_tokens(logits, temperature, seed, offset)
    return tokens, parents, num_nodes, 6, logits, per_node, temperature, seed, offset, None


def junk_rows_case(target):
    """The old triton case: 4 trees of 9 nodes over tokens < 3 with junk past num_nodes,
    steering logits, max_depth 4, 2 vocabulary splits (triton)."""
    gen = torch.Generator().manual_seed(8)
    B, N, V = 4, 9, 300
    tokens, parents, num_nodes = random_tree_tokens(B, N, 3, gen)
    num_nodes[1] = 0
    num_nodes[2] = 1
    seed, offset = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 0])
    temperature = 0.8 if target == "sampled" else 0.0
    logits = steering_logits(tokens, parents, num_nodes, V, gen)
    per_node = ref.sample_tokens(logits, temperature, seed, offset)
    return tokens, parents, num_nodes, 4, logits, per_node, temperature, seed, offset, 2


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("case", [padded_rows_case, junk_rows_case], ids=["padded", "junk"])
@pytest.mark.parametrize("target", ["tokens", "greedy", "sampled", "filtered"])
def test_verify_tree_empty_rows(backend, case, target):
    """num_nodes 0 (value checks off): the root is still verified, so the row is a one-node
    tree: accept_len 0, path [0, -1, ...] and the bonus is the target's token at node 0 (given,
    or from logits; ``filtered``: sampled under top-k / top-p, which bind the root of the empty
    row 1 too: its top-k 1 leaves only the argmax)."""
    (tokens, parents, num_nodes, max_depth, logits, per_node, temperature, seed, offset,
     splits) = case("sampled" if target == "filtered" else target)
    filters = {}
    if target == "filtered":
        filters = dict(top_k=torch.tensor([3, 1, 0, 2], dtype=torch.int32),
                       top_p=torch.tensor([1.0, 1.0, 0.5, 0.9], dtype=torch.float32))
        per_node = ref.sample_tokens(logits, temperature, seed, offset, **filters)
        assert per_node[1, 0] == logits[1, 0].argmax()
    if target == "tokens":
        kw = dict(target=per_node)
        if logits is not None:       # the junk case's target tokens are its greedy samples
            assert torch.equal(per_node, ref.sample_tokens(logits, 0.0))
    else:
        kw = dict(logits=logits)
    want = check(backend, tokens, parents, num_nodes, max_depth, temperature=temperature,
                 seed=seed, offset=offset, num_splits=splits, **filters, **kw)
    from_tokens = ref.verify_tree(tokens, parents, num_nodes, max_depth, target_tokens=per_node)
    for key in VERIFY_KEYS:                 # the walk over the sampled tokens is the same walk
        assert torch.equal(want[key], from_tokens[key]), key
    assert want["accept_len"][1] == 0 and want["bonus"][1] == per_node[1, 0]
    assert want["path"][1, 0] == 0


# ------------------------------------------------------------- the uniform's clamp
@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("rows", [1, 2])
def test_uniform_clamp(backend, rows):
    """Seed 39114, offset 0, sequence 0, node 0, v 7 hashes to h >> 8 == 2**24 - 1, whose uniform
    rounds to 1.0 in float32 unless clamped to 1 - 2**-24: an infinite Gumbel would make v 7 win
    over token 3's clear lead. One-node trees, so the bonus is the sample at node 0 (``rows`` 2:
    a second sequence with the same seed). triton also exposes u and the per-node sample."""
    seed = torch.full((rows,), 39114, dtype=torch.int64)
    offset = torch.zeros(rows, dtype=torch.int64)
    logits = torch.zeros(rows, 1, 8)
    logits[:, 0, 3] = 30.0
    if backend.name == "triton":    # the cuda backend has no uniform or per-node sample entry
        u = gumbel_uniform(seed[:1].to(DEV), offset[:1].to(DEV), 1, 8).cpu()
        assert torch.equal(u, ref.gumbel_uniform(seed[:1], offset[:1], 1, 8))
        assert u[0, 0, 7].item() == 1.0 - 2.0 ** -24
        got = sample_tokens(logits[:1].to(DEV), 1.0, seed[:1].to(DEV), offset[:1].to(DEV)).cpu()
        assert torch.equal(got, ref.sample_tokens(logits[:1], 1.0, seed[:1], offset[:1]))
        assert got.item() == 3
    zeros = torch.zeros(rows, 1, dtype=torch.int32)
    want = check(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=logits, temperature=1.0,
                 seed=seed, offset=offset)
    assert want["bonus"].tolist() == [3] * rows


# ------------------------------------------------------------- walks over target tokens
@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("N,max_depth", [(1, 0), (5, 4), (37, 3), (37, 36), (64, 9)])
def test_target_tokens_random_trees(backend, N, max_depth):
    gen = torch.Generator().manual_seed(N * 100 + max_depth)
    B, V = 5, 3                                        # tiny vocab: long walks and many ties
    tokens, parents, num_nodes = random_tree_tokens(B, N, V, gen)
    target = torch.randint(0, V, (B, N), generator=gen, dtype=torch.int32)
    check(backend, tokens, parents, num_nodes, max_depth, target=target)


@backends("triton", "sim", "cuda")
def test_sibling_token_ties_lowest_index_wins(backend):
    #        0
    #   1(5) 2(5) 3(7)        num_nodes = 7; node 7 is padding-beyond-num_nodes junk
    #   5(9) 4(9)<-2  6(9)<-1
    tokens = torch.tensor([[1, 5, 5, 7, 9, 9, 9, 5]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 0, 2, 1, 1, 0]], dtype=torch.int32)
    num_nodes = torch.tensor([7], dtype=torch.int32)
    target = torch.tensor([[5, 9, 3, 3, 3, 4, 2, 8]], dtype=torch.int32)
    want = check(backend, tokens, parents, num_nodes, 3, target=target)
    assert want["path"].tolist() == [[0, 1, 5, -1]]
    assert want["emitted"].tolist() == [[5, 9, 4, -1]]
    target[0, 0] = 7
    check(backend, tokens, parents, num_nodes, 3, target=target)
    target[0, 0] = 8                                   # only junk node 7 (beyond num_nodes) has 8
    tokens[0, 7] = 8
    want = check(backend, tokens, parents, num_nodes, 3, target=target)
    assert int(want["accept_len"][0]) == 0


@backends("sim", "cuda")
def test_verify_tree_walk_limit(dev):
    # The cuda walk stages at most walk_max_nodes nodes; a larger tree is an error from the
    # launcher (and `auto` never sends one there). triton has no such limit.
    n = cu().extension.limit("walk_max_nodes")
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


# ------------------------------------------------------------- top-k / top-p filters
# (dtype, N, V, misaligned, generator seed): the old cuda cases (vector loads; a vocabulary in
# several phase-1 splits and a two-pass id select among ties; rows off 16 bytes: scalar loads)
# and the old triton ones (step 0 alone; V 700: two tiles of step 0). Under the interpreter the
# triton filter step costs 4 to 38 s a case, so there triton runs only its own cases.
CUDA_FILTER_CASES = [(dt, n, v, mis, n * 7 + v)
                     for n, v, mis in ((5, 300, False), (4, 9000, False), (3, 1001, True))
                     for dt in (F32, F16, BF16)]
TRITON_FILTER_CASES = [(dt, 4, v, False, v) for dt, v in ((F32, 64), (BF16, 64), (F32, 700))]
filter_id = lambda c: f"{str(c[0])[6:]}-{c[1]}x{c[2]}{'-misaligned' if c[3] else ''}-seed{c[4]}"
FILTER_CASES = [pytest.param(*c, id=filter_id(c)) for c in CUDA_FILTER_CASES + TRITON_FILTER_CASES]
INTERPRETER_COST = "the filter step costs 4 to 38 s a case"


def filter_logits(n, v, misaligned, dtype, gen_seed):
    gen = torch.Generator().manual_seed(gen_seed)
    logits, temp, top_k, top_p = filter_case(gen, n, v + misaligned, dtype)
    return gen, logits[..., misaligned:], temp, top_k, top_p


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("dtype,n,v,misaligned,gen_seed", FILTER_CASES)
def test_filter_thresholds(backend, dtype, n, v, misaligned, gen_seed):
    """Per-sequence temperature (one sequence greedy), top-k and top-p with exact ties at both
    boundaries (helpers.filter_case): the thresholds keep exactly python_ref.filter_keep's
    tokens, node for node."""
    if (dtype, n, v, misaligned, gen_seed) in CUDA_FILTER_CASES:
        skip_on_interpreter(backend, INTERPRETER_COST)
    _, logits, temp, top_k, top_p = filter_logits(n, v, misaligned, dtype, gen_seed)
    sampled = temp > 0
    x = logits.float() / temp[:, None, None]
    for k_, p_ in ((top_k, None), (None, top_p), (top_k, top_p)):
        kept = kept_by_thresholds(logits, temp, *thresholds_on(backend, logits, temp, k_, p_))
        want = ref.filter_keep(x, k_, p_)
        assert torch.equal(kept[sampled], want[sampled]), (k_, p_)
    assert want[0, 0].sum() == 3 and want[0, 1].sum() == 2 and want[3].sum(-1).eq(1).all()


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("dtype,n,v,misaligned,gen_seed", FILTER_CASES[:9])
def test_filtered_verdicts(backend, dtype, n, v, misaligned, gen_seed):
    """Every node's filtered sample (one-node trees; greedy for the temperature-0 sequence)
    and whole-tree verdicts with per-sequence temperature, top-k and top-p are python_ref's."""
    skip_on_interpreter(backend, INTERPRETER_COST)
    gen, logits, temp, top_k, top_p = filter_logits(n, v, misaligned, dtype, gen_seed)
    b = logits.shape[0]
    rep = lambda t: t.repeat_interleave(n)           # every node its own one-node tree
    rows = logits.reshape(b * n, 1, v)
    zeros = torch.zeros(b * n, 1, dtype=torch.int32)
    seed = torch.arange(b * n, dtype=torch.int64) * 7919 + 3
    offset = torch.arange(b * n, dtype=torch.int64) % 5
    want = check(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows,
                 temperature=rep(temp), seed=seed, offset=offset, top_k=rep(top_k),
                 top_p=rep(top_p))
    unfiltered = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows,
                                 temperature=rep(temp), seed=seed, offset=offset)
    assert not torch.equal(want["bonus"], unfiltered["bonus"]), "the filters should change samples"

    parents, num_nodes = random_tree(b, n, gen)
    tokens = torch.randint(0, 4, (b, n), generator=gen, dtype=torch.int32)
    check(backend, tokens, parents, num_nodes, n - 1, logits=logits, temperature=temp,
          seed=seed[:b], offset=offset[:b], top_k=top_k, top_p=top_p)



@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("which", ["top_k", "top_p"])
def test_one_filter_alone(backend, which):
    """top_k alone and top_p alone (the other None) filter the samples as python_ref does: every
    node its own one-node tree, the filter changing some samples."""
    skip_on_interpreter(backend, INTERPRETER_COST)
    n, v = 5, 300
    gen, logits, temp, top_k, top_p = filter_logits(n, v, False, F32, 3)
    b = logits.shape[0]
    rep = lambda t: t.repeat_interleave(n)
    rows = logits.reshape(b * n, 1, v)
    zeros = torch.zeros(b * n, 1, dtype=torch.int32)
    seed = torch.arange(b * n, dtype=torch.int64) * 7919 + 3
    offset = torch.arange(b * n, dtype=torch.int64) % 5
    kw = {which: rep(top_k if which == "top_k" else top_p)}
    want = check(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows,
                 temperature=rep(temp), seed=seed, offset=offset, **kw)
    unfiltered = ref.verify_tree(zeros, zeros - 1, zeros[:, 0] + 1, 0, target_logits=rows,
                                 temperature=rep(temp), seed=seed, offset=offset)
    assert not torch.equal(want["bonus"], unfiltered["bonus"]), f"{which} should change samples"

@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("num_splits", [1, 3])
def test_filtered_samples_and_verdicts_equal_reference(backend, num_splits):
    """Deep whole-tree verdicts (steering logits) with per-sequence temperature, top-k and top-p
    in one batch (triton: step 1 in 1 or 3 vocabulary splits of 128); triton also compares every
    node's filtered sample (greedy for the temperature-0 sequence) with python_ref's."""
    gen = torch.Generator().manual_seed(num_splits)
    N, V = 6, 300
    logits, temp, top_k, top_p = filter_case(gen, N, V)
    B = logits.shape[0]
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    want = ref.sample_tokens(logits, temp, seed, offset, top_k, top_p)
    if backend.name == "triton":    # the cuda backend has no per-node sample entry
        got = sample_tokens(logits.to(DEV), temp.to(DEV), seed.to(DEV), offset.to(DEV),
                            top_k.to(DEV), top_p.to(DEV)).cpu()
        assert torch.equal(got, want)
    assert torch.equal(want[1], ref.sample_tokens(logits, 0.0)[1])          # greedy sequence
    assert not torch.equal(want, ref.sample_tokens(logits, temp, seed, offset))
    tokens, parents, num_nodes = random_tree_tokens(B, N, 4, gen)
    logits = torch.maximum(logits, steering_logits(tokens, parents, num_nodes, V, gen, boost=40.0))
    want = check(backend, tokens, parents, num_nodes, N - 1, logits=logits, temperature=temp,
                 seed=seed, offset=offset, num_splits=num_splits, block_v=128, top_k=top_k,
                 top_p=top_p)
    assert int(want["accept_len"].max()) >= 2, "the steering should make some walks go deep"


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("num_splits", [3])
def test_nan_and_inf_logits(backend, num_splits):
    """A NaN logit is the maximum, as in torch.argmax (the first NaN wins), greedy or sampled,
    whatever top-k and top-p say (before, triton skipped NaNs and cuda with a filter could keep
    no token at all and return 2**31 - 1); +inf and -inf are values (a row of -inf gives token
    0). One-node trees, so each bonus is that row's target token."""
    V = 300
    rows = torch.randn(12, 1, V, generator=torch.Generator().manual_seed(3))
    rows[0, 0, [7, 200]] = float("nan")                          # two NaNs: the first wins
    rows[1, 0, 250] = float("nan")                               # a NaN in a late split
    rows[1, 0, 3] = float("inf")
    rows[2, 0, [5, 260]] = float("inf")                          # tied maxima: the lower id
    rows[3, 0] = float("-inf")                                   # no finite value: token 0
    rows[4, 0, 100:] = float("-inf")
    rows[5, 0] = float("nan")                                    # all NaN: token 0
    rows[6, 0, 299] = float("nan")
    rows[6, 0, 0] = 1e30
    rows[7:] = rows[:5].clone()
    rows[7:, 0, 150] = float("nan")
    rows[11, 0] = torch.arange(V) * 1e-3                          # +inf maxima off id 0 with
    rows[11, 0, [9, 11, 40]] = float("inf")                      # top-p: each weighs 2**32
    b = rows.shape[0]
    zeros = torch.zeros(b, 1, dtype=torch.int32)
    seed, offset = torch.arange(b, dtype=torch.int64) + 5, torch.zeros(b, dtype=torch.int64)
    temp = torch.tensor([0.0, 1.0, 0.7, 2.0] * 3)
    top_k = torch.tensor([0, 1, 5, 299, 300, 2] * 2, dtype=torch.int32)
    top_p = torch.tensor([1.0, 1e-4, 0.5, 0.9] * 3)
    for kw in (dict(), dict(temperature=temp), dict(temperature=temp, top_p=top_p),
               dict(temperature=temp, top_k=top_k, top_p=top_p)):
        want = check(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows, seed=seed,
                     offset=offset, num_splits=num_splits, block_v=128, **kw)
        first_nan = [int(r[0].isnan().nonzero()[0]) if r[0].isnan().any() else None for r in rows]
        for i, n in enumerate(first_nan):
            if n is not None:
                assert int(want["bonus"][i]) == n, (kw, i)
        assert int(want["bonus"][3]) == 0 and int(want["bonus"][5]) == 0
        assert int(want["bonus"][11]) == 9


@backends("triton", "sim", "cuda")
def test_logit_magnitudes(backend):
    """Logits of 1e-4 (near-uniform: the Gumbel noise decides, bit for bit), 1e3 with T 0.05
    (x / T = 2e4), half the float32 range (x / T overflows to inf), and rows of one repeated
    value (every token ties: top-k keeps the lowest ids), greedy and sampled with per-sequence
    top-k and top-p: python_ref's tokens."""
    V = 200
    gen = torch.Generator().manual_seed(21)
    scales = [1e-4, 1e-4, 1e3, 1e3, 1.7e38, 1.0, 1.0, 1e-4]
    rows = torch.randn(len(scales), 1, V, generator=gen) * torch.tensor(scales)[:, None, None]
    rows[5] = 0.25                                                # every token ties
    rows[6] = -3.0
    b = rows.shape[0]
    zeros = torch.zeros(b, 1, dtype=torch.int32)
    seed, offset = torch.arange(b, dtype=torch.int64) * 31 + 1, torch.arange(b, dtype=torch.int64)
    temp = torch.tensor([1.0, 0.0, 0.05, 1.0, 0.5, 1.0, 0.7, 2.0])
    top_k = torch.tensor([0, 0, 3, 0, 2, 5, 0, 7], dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.9, 1.0, 0.5, 0.05])
    want = check(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows, temperature=temp,
                 seed=seed, offset=offset, top_k=top_k, top_p=top_p)
    assert int(want["bonus"][5]) < 5 and int(want["bonus"][6]) < 100


@backends("sim", "cuda")
def test_verify_tree_filters_survive_nan_logits(dev):
    """A NaN logit breaks the filter search's invariants (a NaN is kept anyway, see
    test_nan_and_inf_logits), but the search must still finish without a trap: its integer
    divisions are guarded."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 500, generator=gen)
    logits[0, 0, ::7] = float("nan")
    logits[1, 1] = float("nan")
    temp = torch.tensor([1.0, 0.5])
    for k_, p_ in ((torch.tensor([5, 0], dtype=torch.int32), None), (None, torch.tensor([0.5, 0.3])),
                   (torch.tensor([5, 0], dtype=torch.int32), torch.tensor([0.5, 0.3]))):
        backend_module("cuda", "verify_tree").filter_thresholds(
            logits.to(dev), temp.to(dev), None if k_ is None else k_.to(dev),
            None if p_ is None else p_.to(dev))
    sync(dev)


# ------------------------------------------------------------- triton's own entry points
# gumbel_uniform, sample_tokens and the forced splits / tile widths exist on triton only.


@backends("triton")
def test_uniform_bit_exact():
    seed = torch.tensor([0, 1, -1, 2**40 + 12345, 2**63 - 1], dtype=torch.int64)
    offset = torch.tensor([0, 7, 2**33 + 1, -5, 99], dtype=torch.int64)
    got = gumbel_uniform(seed.to(DEV), offset.to(DEV), 3, 4099).cpu()
    want = ref.gumbel_uniform(seed, offset, 3, 4099)
    assert torch.equal(got, want)
    assert float(got.min()) > 0.0 and float(got.max()) < 1.0


@backends("triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0, 1.7])
def test_sample_tokens_equal_reference(dtype, temperature):
    gen = torch.Generator().manual_seed(int(temperature * 10))
    B, N, V = 3, 7, 3001
    logits = (torch.randn(B, N, V, generator=gen) * 2).to(dtype)
    seed = torch.randint(0, 2**62, (B,), generator=gen)
    offset = torch.randint(0, 2**40, (B,), generator=gen)
    got = sample_tokens(logits.to(DEV), temperature, seed.to(DEV), offset.to(DEV)).cpu()
    assert torch.equal(got, ref.sample_tokens(logits, temperature, seed, offset))


@backends("triton")
def test_greedy_ties_go_to_lower_id(backend):
    gen = torch.Generator().manual_seed(5)
    B, N, V = 3, 6, 2100
    logits = torch.randint(0, 3, (B, N, V), generator=gen).float()
    logits[1, 2] = float("-inf")                      # torch.argmax gives 0
    logits[2, 1, 2049] = 7.0                          # maximum only in a late tile
    logits[2, 3, :] = 0.0
    logits[2, 3, 1000] = 1.0                          # tie across tiles and splits
    logits[2, 3, 2099] = 1.0
    want = ref.sample_tokens(logits, 0.0)
    assert torch.equal(sample_tokens(logits.to(DEV), 0.0).cpu(), want)
    # every row as its own one-node tree: the walk's bonus is that row's folded target token
    rows = logits.view(B * N, 1, V)
    zeros = torch.zeros(B * N, 1, dtype=torch.int32)
    for splits, block_v in ((1, 256), (2, 2048), (5, 256), (9, 128)):
        got = verify_on(backend, zeros, zeros - 1, zeros[:, 0] + 1, 0, logits=rows,
                        num_splits=splits, block_v=block_v)
        assert torch.equal(got[2], want.flatten()), (splits, block_v)
        assert torch.equal(got[3][:, 0], want.flatten())


@backends("triton")
def test_sampling_distribution_tiny_vocab():
    """Many (seed, node) draws on one 5-token distribution: chi-square against softmax(x/T)."""
    B, N, V, T = 16, 40, 5, 0.8
    x = torch.tensor([1.0, 0.2, -0.5, 0.9, -2.0])
    logits = x.expand(B, N, V).contiguous()
    seed = torch.arange(B, dtype=torch.int64) * 7919 + 1
    offset = torch.arange(B, dtype=torch.int64) % 3
    got = sample_tokens(logits.to(DEV), T, seed.to(DEV), offset.to(DEV)).cpu()
    counts = torch.bincount(got.flatten().long(), minlength=V).double()
    expect = torch.softmax(x.double() / T, 0) * (B * N)
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 18.5, (counts, expect)               # 4 dof: P(chi2 > 18.5) ~ 1e-3


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


# ------------------------------------------------------------- engine layouts
# tests/test_engine_layouts.py checks each layout against a contiguous copy on the same backend;
# this checks them against python_ref, in this op's own file.


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("layout", ["vocab_padded", "vocab_padded_aligned", "rows",
                                    "target_tokens", "tree_fields"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_layouts(backend, layout, temperature):
    """Logits of a padded vocabulary (rows off 16 bytes, or aligned), the tree's rows of a longer
    forward, target tokens or tree fields sliced from wider buffers: python_ref's verdicts."""
    if layout == "target_tokens" and temperature:
        pytest.skip("target tokens are greedy")
    dev = backend.device
    gen = torch.Generator().manual_seed(len(layout) + int(temperature * 10))
    B, D, V = 3, 4, 500
    tokens, parents, num_nodes, max_depth, _ = real_tree(B, D, V, 15, 3, gen)
    logits = steering_logits(tokens, parents, num_nodes, V, gen, boost=40.0)
    target = ref.sample_tokens(logits, 0.0)
    seed, offset = torch.tensor([1, 2, 3]), torch.tensor([0, 5, 9])
    want = ref.verify_tree(tokens, parents, num_nodes, max_depth,
                           target_logits=None if layout == "target_tokens" else logits,
                           target_tokens=target if layout == "target_tokens" else None,
                           temperature=temperature, seed=seed, offset=offset)
    parts = [on(t, dev) for t in (tokens, parents, ref.pack_mask(parents, num_nodes).to(torch.int32))]
    lg = logits.to(dev)
    kw = dict(target_logits=lg)
    if layout == "vocab_padded":
        kw["target_logits"] = widened(lg, 13)
    elif layout == "vocab_padded_aligned":
        kw["target_logits"] = widened(lg, 12)
    elif layout == "rows":
        kw["target_logits"] = after_rows(lg, 2)
    elif layout == "target_tokens":
        kw = dict(target_tokens=widened(target.to(dev), 3, fill=-1))
    else:
        parts = [widened(parts[0], 2, fill=7), widened(parts[1], 2, fill=0), parts[2]]
    tree = Tree(parts[0], parts[1], torch.zeros_like(parts[1]).contiguous(),
                torch.zeros(B, tokens.shape[1], device=dev), num_nodes.to(dev), parts[2], max_depth)
    got = jk.verify_tree(tree, temperature=temperature, seed=seed.to(dev), offset=offset.to(dev),
                         backend=api_backend(backend), **kw)
    for key, g in zip(VERIFY_KEYS, got):
        assert torch.equal(g.cpu(), want[key].to(torch.int32)), key
    assert int(want["accept_len"].sum()) > 0



def test_greedy_defaults_shortcut_returns_what_the_checks_return():
    """check_sampling's shortcut for the greedy defaults (float 0.0, int 0, float 1.0) returns
    what the full checks return for the same values as other types; anything else is checked in
    full (a bool top_k, top_p past 1, a negative temperature are refused, a sampling call keeps
    its filters)."""
    from jetspec_kernels.ops.verify_tree import check_sampling
    cpu = torch.device("cpu")
    fast = check_sampling(0.0, 0, 1.0, 2, cpu)
    full = check_sampling(0, 0, 1, 2, cpu)   # the same values, as types the shortcut does not take
    assert fast == full == (0.0, None, None) and type(fast[0]) is type(full[0])
    assert type(check_sampling(0, 0, 1.0, 2, cpu)[0]) is float   # an int 0 is not the shortcut's
    with pytest.raises(TypeError, match="top_k"):
        check_sampling(0.0, False, 1.0, 2, cpu)
    with pytest.raises(ValueError, match="top_p"):
        check_sampling(0.0, 0, 1.5, 2, cpu)
    with pytest.raises(ValueError, match="temperature"):
        check_sampling(-1.0, 0, 1.0, 2, cpu)
    t, k, p = check_sampling(0.5, 5, 0.5, 2, cpu)
    assert t == 0.5 and k.tolist() == [5, 5] and p.tolist() == [0.5, 0.5]


# ------------------------------------------------------------- same-token siblings
@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("target", ["tokens", "greedy", "mixed"])
def test_same_token_siblings_greedy_longest_sampled_first(backend, target):
    """Nodes 1 and 2 share token 5 (a merged draft): a greedy row follows node 2, whose subtree
    agrees two levels deeper (path 0, 2, 4, 5); a sampled row keeps the first agreeing sibling
    (0, 1, 3). ``mixed``: one sequence of each in one call (temperature [0, 1]; logits so
    peaked that the samples are the targets)."""
    #        0
    #   1(5)      2(5)
    #   3(6)      4(6)
    #             5(7)
    tokens = torch.tensor([[1, 5, 5, 6, 6, 7]] * 2, dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 4]] * 2, dtype=torch.int32)
    num_nodes = torch.tensor([6, 6], dtype=torch.int32)
    per_node = torch.tensor([[5, 6, 6, 0, 7, 8]] * 2, dtype=torch.int32)
    logits = torch.nn.functional.one_hot(per_node.long(), 10).float() * 100.0
    kw = dict(target=per_node) if target == "tokens" else dict(logits=logits)
    if target == "mixed":
        kw.update(temperature=torch.tensor([0.0, 1.0]), seed=torch.tensor([3, 4]),
                  offset=torch.tensor([0, 0]))
    want = check(backend, tokens, parents, num_nodes, 4, **kw)
    assert want["path"][0].tolist() == [0, 2, 4, 5, -1]
    assert want["path"][1].tolist() == ([0, 1, 3, -1, -1] if target == "mixed"
                                        else [0, 2, 4, 5, -1])
