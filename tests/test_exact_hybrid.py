"""The exact mode on hybrid (Qwen3.5 / Qwen3.6: Gated DeltaNet + gated attention) targets: every
tree node's verify logits equal the autoregressive step's bit for bit, a prompt's prefill equals
decoding it token by token, the committed states equal the states decoding leaves, a sequence
alone equals itself inside a batch, and greedy speculative output equals greedy autoregressive
output on a near-tie target where the normal mode diverges (the tests' power). Both engines:
the reference (one-row calls, CPU) and triton (triton/exact_gated_delta.py and the exact
kernels; float32 under the interpreter, bf16 too on a GPU, where ``backend`` being a parameter
puts the triton cases in the device check's triton step, which sets JETSPEC_EXACT_UNVERIFIED)."""
import dataclasses
import os

import pytest
import torch

from jetspec_kernels import Verdict
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import DraftHead, Qwen3_5
from jetspec_kernels.models.tiny import random_draft_weights, tiny_draft_config
from jetspec_kernels.models.tiny_hybrid import random_qwen3_5_weights, tiny_qwen3_5_config
from jetspec_kernels.ops.exact import UNVERIFIED_ENV, ExactModeError, exact_mode
from helpers import root_path
from test_exact_decode import _tree, near_tie

pytestmark = pytest.mark.usefixtures("reference_backend")

GPU = torch.cuda.is_available()
# the reference runs on the CPU; triton on the GPU when there is one (unverified: the device check)
ENGINES = ["reference"] + (["triton"] if not GPU or os.environ.get(UNVERIFIED_ENV) == "1" else [])


def _device(backend):
    return "cuda" if backend == "triton" and GPU else "cpu"


def _dtypes(backend):
    """bf16 GEMMs need a GPU under triton (the interpreter has no 16-bit tl.dot)."""
    return [torch.float32, torch.bfloat16] if backend == "reference" or GPU else [torch.float32]


def tiny_qwen3_5(*, dtype=torch.float32, backend="reference", seed=0, **over):
    cfg = tiny_qwen3_5_config(**over)
    dev = _device(backend)
    target = Qwen3_5(cfg, {k: t.to(dtype=dtype, device=dev)
                           for k, t in random_qwen3_5_weights(cfg, seed).items()})
    target.fused_ops_backend = backend
    return target


def _pair(moe, backend="reference"):
    target = tiny_qwen3_5(backend=backend, num_experts=4 if moe else 0)
    dcfg = tiny_draft_config(target.config, target_layer_ids=[1, 3], intermediate_size=96)
    head = DraftHead(dcfg, {k: t.to(target.device) for k, t in random_draft_weights(dcfg, seed=1).items()})
    head.fused_ops_backend = backend
    return target, head


def _on(tree, dev):
    return dataclasses.replace(tree, **{f.name: getattr(tree, f.name).to(dev)
                                        for f in dataclasses.fields(tree) if f.name != "max_depth"})


def _cases(*cases):
    """(backend, moe, dtype, ...) cases of the engines and dtypes this machine runs."""
    return [c for c in cases if c[0] in ENGINES and c[2] in _dtypes(c[0])]

PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8, 0]     # depth 5, branching, a late child of the root


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _states(cache):
    """Every tensor of a hybrid cache the decoding writes (KV, conv and recurrent pools)."""
    return [cache.k, cache.v, *cache.conv, *cache.recurrent]


def _restore(cache, saved):
    for dst, src in zip(_states(cache), saved):
        dst.copy_(src)


@pytest.mark.parametrize("backend,moe,dtype,page_size", _cases(
    ("reference", False, torch.float32, None), ("reference", False, torch.bfloat16, 4),
    ("reference", True, torch.bfloat16, None), ("reference", True, torch.float32, 4),
    ("triton", False, torch.float32, 4), ("triton", True, torch.float32, None),
    ("triton", True, torch.bfloat16, 4)))
def test_verify_logits_equal_autoregressive_logits(backend, moe, dtype, page_size):
    """Every node's verify logits == decoding its path one token at a time from the same
    committed states (KV, conv and recurrent state restored before each leaf's path)."""
    target = tiny_qwen3_5(dtype=dtype, backend=backend, num_experts=4 if moe else 0)
    dev = target.device
    gen = torch.Generator().manual_seed(7)
    p, n, v = 7, len(PARENTS), target.config.vocab_size
    prompt = torch.randint(0, v, (1, p), generator=gen).to(dev)
    parents = torch.tensor([PARENTS], dtype=torch.int32)
    tree = _tree(parents, torch.randint(0, v, (1, n), generator=gen, dtype=torch.int32))
    tree = _on(tree, dev)
    plen = torch.tensor([p], dtype=torch.int32, device=dev)
    with exact_mode():
        cache = target.new_cache(1, 40, page_size=page_size)
        target.prefill(prompt, plen, cache)
        start = [t.clone() for t in _states(cache)]
        verified, _ = target.verify(tree, plen, cache)
        want = torch.full_like(verified, float("nan"))
        for leaf in set(range(n)) - set(PARENTS):
            _restore(cache, start)
            for d, node in enumerate(root_path(PARENTS, leaf)):
                want[0, node] = target.decode(tree.tokens[:, node], plen + d, cache)[0]
        _restore(cache, start)
        greedy, _ = target.verify(tree, plen, cache, fused_argmax=True)
    assert torch.equal(_bits(verified), _bits(want))
    assert torch.equal(greedy, torch.argmax(want, dim=-1).to(torch.int32))


@pytest.mark.parametrize("backend,moe,dtype", _cases(
    ("reference", True, torch.float32), ("reference", True, torch.bfloat16),
    ("triton", True, torch.float32), ("triton", False, torch.bfloat16)))
def test_commit_leaves_the_states_decoding_leaves(backend, moe, dtype):
    """Verify a tree, commit an accepted path: the conv and recurrent states (and the next
    logits) are the bits that decoding the path's tokens one at a time leaves."""
    target = tiny_qwen3_5(dtype=dtype, backend=backend, num_experts=4 if moe else 0)
    dev = target.device
    gen = torch.Generator().manual_seed(3)
    v, n = target.config.vocab_size, len(PARENTS)
    prompt = torch.randint(0, v, (1, 9), generator=gen).to(dev)
    plen = torch.tensor([9], dtype=torch.int32, device=dev)
    parents = torch.tensor([PARENTS], dtype=torch.int32)
    tree = _tree(parents, torch.randint(0, v, (1, n), generator=gen, dtype=torch.int32))
    tree = _on(tree, dev)
    path = root_path(PARENTS, 10)                                  # 0 1 3 6 9 10
    with exact_mode():
        cache = target.new_cache(1, 40)
        target.prefill(prompt, plen, cache)
        start = [t.clone() for t in _states(cache)]
        for d, node in enumerate(path[:4]):
            target.decode(tree.tokens[:, node], plen + d, cache)
        want = [t.clone() for t in (*cache.conv, *cache.recurrent)]
        want_next = target.decode(tree.tokens[:, path[4]], plen + 4, cache)
        _restore(cache, start)
        target.verify(tree, plen, cache)
        padded = torch.tensor([path[:4] + [-1] * (len(path) - 4)], dtype=torch.int32, device=dev)
        verdict = Verdict(torch.tensor([3], dtype=torch.int32, device=dev), padded,
                          torch.zeros(1, dtype=torch.int32, device=dev), padded)
        target.commit_states(cache, verdict)
        got = [t.clone() for t in (*cache.conv, *cache.recurrent)]
        # the KV the tree wrote sits in tree slots; decode the next token over a committed cache
        _restore(cache, start)
        for d, node in enumerate(path[:4]):
            target.decode(tree.tokens[:, node], plen + d, cache)
        for dst, src in zip((*cache.conv, *cache.recurrent), got):
            dst.copy_(src)
        got_next = target.decode(tree.tokens[:, path[4]], plen + 4, cache)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(_bits(got_next), _bits(want_next))


@pytest.mark.parametrize("backend,moe,dtype", _cases(
    ("reference", False, torch.bfloat16), ("reference", True, torch.bfloat16),
    ("triton", True, torch.float32), ("triton", False, torch.bfloat16)))
def test_prefill_equals_decoding_token_by_token_and_is_batch_invariant(backend, moe, dtype):
    """A prompt's prefill is its tokens stepped one at a time: its last logits and states equal
    prefilling its first token and decoding the rest; prefilled inside a ragged batch (another
    length, so other padding and chunking) it gives the same bits as alone."""
    target = tiny_qwen3_5(dtype=dtype, backend=backend, num_experts=4 if moe else 0)
    dev = target.device
    gen = torch.Generator().manual_seed(5)
    v = target.config.vocab_size
    t = 11 if backend == "reference" else 7          # the interpreter's time
    prompts = torch.randint(0, v, (3, t), generator=gen).to(dev)
    lens = torch.tensor([t, 4, 6], dtype=torch.int32, device=dev)
    with exact_mode():
        batch = target.new_cache(3, 20)
        batched, _ = target.prefill(prompts, lens, batch)
        for b in range(3):
            alone = target.new_cache(1, 20)
            logits, _ = target.prefill(prompts[b:b + 1, :lens[b]], lens[b:b + 1], alone)
            assert torch.equal(_bits(logits[0]), _bits(batched[b])), b
            stepped = target.new_cache(1, 20)
            last, _ = target.prefill(prompts[b:b + 1, :1], lens.new_ones(1), stepped)
            for i in range(1, int(lens[b])):
                last = target.decode(prompts[b:b + 1, i], lens.new_full((1,), i), stepped)
            assert torch.equal(_bits(last[0]), _bits(logits[0])), b
            for a, s in zip((*alone.conv, *alone.recurrent), (*stepped.conv, *stepped.recurrent)):
                assert torch.equal(a, s)
            for a, s in zip((*alone.conv, *alone.recurrent), (*batch.conv, *batch.recurrent)):
                assert torch.equal(a[0], s[b])


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def near_tie_pair(request):
    target, head = _pair(moe=request.param)
    near_tie(target)
    return target, head


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 90, (int(torch.randint(3, 12, (1,), generator=gen)),),
                          generator=gen).tolist() for _ in range(n)]


def test_normal_mode_diverges_on_the_near_tie_hybrid(near_tie_pair):
    """The power of the test below: without the exact mode greedy speculative decoding leaves
    autoregressive decoding's tokens here (the tree's chunked form and the one-token step round
    differently)."""
    target, head = near_tie_pair
    prompts = _prompts(4)
    ar = generate_ar(target, prompts, max_new_tokens=16).tokens
    assert generate(target, head, prompts, max_new_tokens=16, budget=16, topk=3).tokens != ar


@pytest.mark.parametrize("batch,budget,page_size", [(1, 16, None), (3, 16, 4), (2, 64, None)])
def test_exact_speculative_equals_autoregressive(near_tie_pair, batch, budget, page_size):
    target, head = near_tie_pair
    prompts = _prompts(batch, seed=1)
    ar = generate_ar(target, prompts, max_new_tokens=10, page_size=page_size, exact=True).tokens
    spec = generate(target, head, prompts, max_new_tokens=10, budget=budget, topk=3,
                    page_size=page_size, exact=True)
    assert spec.tokens == ar


@pytest.mark.parametrize("backend", ENGINES)
def test_exact_sequence_alone_equals_inside_a_batch(backend):
    """Greedy speculative output of a sequence alone == inside a batch of 3 == autoregressive,
    on the near-tie MoE hybrid (on triton: the whole round on the exact kernels)."""
    target, head = _pair(moe=True, backend=backend)
    near_tie(target)
    prompts = _prompts(3, seed=2)
    new = 8 if backend == "reference" else 5          # the interpreter's time
    batch = generate(target, head, prompts, max_new_tokens=new, budget=16, topk=3, exact=True).tokens
    alone = generate(target, head, prompts[1:2], max_new_tokens=new, budget=16, topk=3, exact=True).tokens
    ar = generate_ar(target, prompts[1:2], max_new_tokens=new, exact=True).tokens
    assert alone[0] == batch[1] == ar[0]


def test_exact_refusals():
    """The cuda backend (no exact kernels) is refused by name; a bad split of K is named."""
    target = tiny_qwen3_5()
    tokens = torch.tensor([[1, 2, 3]])
    lens = torch.tensor([3], dtype=torch.int32)
    target.fused_ops_backend = "cuda"
    with exact_mode(), pytest.raises(ExactModeError, match="'cuda' backend"):
        target.prefill(tokens, lens, target.new_cache(1, 8))
    target.fused_ops_backend = "reference"
    target.exact_k_parts = 3
    with exact_mode(), pytest.raises(ValueError, match="exact_k_parts must be None or a power of two"):
        target.prefill(tokens, lens, target.new_cache(1, 8))
    target.exact_k_parts = 64         # linear_attn.out_proj's K (32) is not 64 parts
    with exact_mode(), pytest.raises(ValueError, match="out_proj"):
        target.prefill(tokens, lens, target.new_cache(1, 8))


@pytest.mark.parametrize("parts", [2, 4])
def test_exact_k_parts_keep_verify_equal_to_decode(parts, monkeypatch):
    """With ``exact_k_parts`` the row-parallel GEMMs (out_proj, o_proj, down, the shared
    expert's and the experts' down) run in parts, and verify still equals decode."""
    from jetspec_kernels.ops import exact as ex
    target = tiny_qwen3_5(num_experts=4)
    target.exact_k_parts = parts
    seen = []
    real = ex.linear
    monkeypatch.setattr(ex, "linear", lambda x, w, **kw: seen.append((w.shape, kw.get("parts", 1)))
                        or real(x, w, **kw))
    plen = torch.tensor([5], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    tree = _tree(parents, torch.tensor([[4, 5, 6, 7]], dtype=torch.int32))
    with exact_mode():
        cache = target.new_cache(1, 16)
        target.prefill(torch.tensor([[1, 2, 3, 4, 5]]), plen, cache)
        start = [t.clone() for t in _states(cache)]
        verified, _ = target.verify(tree, plen, cache)
        _restore(cache, start)
        a = target.decode(tree.tokens[:, 0], plen, cache)
        b = target.decode(tree.tokens[:, 1], plen + 1, cache)
        c = target.decode(tree.tokens[:, 3], plen + 2, cache)
    assert torch.equal(verified[0, 0], a[0]) and torch.equal(verified[0, 1], b[0])
    assert torch.equal(verified[0, 3], c[0])
    cfg = target.config
    row_parallel = {(cfg.hidden_size, cfg.linear_num_value_heads * cfg.linear_value_head_dim),
                    (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim),
                    (cfg.hidden_size, cfg.shared_expert_intermediate_size)}
    assert {tuple(s) for s, p in seen if p == parts} == row_parallel
    assert all(p == 1 for s, p in seen if tuple(s) not in row_parallel)


@pytest.mark.parametrize("backend", ENGINES)
def test_exact_is_the_model(backend):
    """The exact form computes the layer, not just a self-consistent function: its prefill and
    verify logits are the normal path's within float32 rounding (the normal path equals
    transformers: test_models_qwen3_5), and its greedy tokens on a target without near ties are
    the normal mode's (catches a dropped scale, weight or gate that every bit-equality test,
    comparing the exact form with itself, would miss)."""
    target = tiny_qwen3_5(backend=backend, num_experts=4)
    dev = target.device
    gen = torch.Generator().manual_seed(11)
    v = target.config.vocab_size
    prompts = torch.randint(0, v, (2, 9), generator=gen).to(dev)
    lens = torch.tensor([9, 5], dtype=torch.int32, device=dev)
    parents = torch.tensor([PARENTS] * 2, dtype=torch.int32)
    tree = _on(_tree(parents[:1], torch.randint(0, v, (1, len(PARENTS)), generator=gen,
                                                dtype=torch.int32)), dev)
    tree = dataclasses.replace(tree, **{f.name: getattr(tree, f.name).expand(2, *getattr(
        tree, f.name).shape[1:]).contiguous() for f in dataclasses.fields(tree) if f.name != "max_depth"})
    got = {}
    for mode in (False, True):
        with exact_mode(mode):
            cache = target.new_cache(2, 40)
            last, _ = target.prefill(prompts, lens, cache)
            verified, _ = target.verify(tree, lens, cache)
            got[mode] = (last, verified)
    for normal, exact in zip(got[False], got[True]):
        assert (exact - normal).norm() / normal.norm() < 1e-5
    prompt = [[3, 14, 15, 92, 65]]
    assert (generate_ar(target, prompt, max_new_tokens=8, exact=True).tokens
            == generate_ar(target, prompt, max_new_tokens=8).tokens)


@pytest.mark.parametrize("backend", ENGINES)
def test_a_sequence_among_others_in_other_slots_equals_alone(backend):
    """A ragged batch (num_nodes < N, padding nodes after the valid ones, their parents pointing
    at valid nodes) whose sequences sit in permuted slots of a larger state pool: every valid
    row is the bits of its sequence verified alone in slot 0 (a slot read or written as the
    batch index, or padding walked as nodes, would break it)."""
    target = tiny_qwen3_5(backend=backend)
    dev = target.device
    gen = torch.Generator().manual_seed(13)
    v, n = target.config.vocab_size, len(PARENTS)
    prompts = torch.randint(0, v, (3, 8), generator=gen).to(dev)
    lens = torch.tensor([8, 3, 6], dtype=torch.int32, device=dev)
    tokens = torch.randint(0, v, (3, n), generator=gen, dtype=torch.int32)
    # padding that looks like data: the padding nodes' parents point into the valid nodes
    parents = torch.tensor([PARENTS, [-1, 0, 1, 1] + [0, 2, 3, 1, 0, 4, 2, 5][:n - 4],
                            [-1] + [0] * (n - 1)], dtype=torch.int32)
    num = torch.tensor([n, 4, 1], dtype=torch.int32)
    from jetspec_kernels import python_ref as ref
    from jetspec_kernels.tree import Tree
    depths = torch.zeros_like(parents)
    for b in range(3):
        for i in range(1, int(num[b])):
            depths[b, i] = depths[b, parents[b, i]] + 1
    tree = _on(Tree(tokens, parents, depths, torch.zeros(3, n), num,
                    ref.pack_mask(parents, num).to(torch.int32), int(depths.max())), dev)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=dev)
    with exact_mode():
        cache = target.new_cache(3, 40, pool_size=5, slots=slots)
        target.prefill(prompts, lens, cache)
        batch, _ = target.verify(tree, lens, cache)
        for b in range(3):
            alone = target.new_cache(1, 40)
            target.prefill(prompts[b:b + 1, :lens[b]], lens[b:b + 1], alone)
            k = int(num[b])
            one = dataclasses.replace(tree, **{f.name: getattr(tree, f.name)[b:b + 1, :k].contiguous()
                                              for f in dataclasses.fields(tree)
                                              if f.name not in ("max_depth", "num_nodes", "mask")})
            one = dataclasses.replace(one, num_nodes=tree.num_nodes[b:b + 1],
                                      mask=ref.pack_mask(one.parents.cpu(), tree.num_nodes[b:b + 1].cpu())
                                      .to(torch.int32).to(dev))
            got, _ = target.verify(one, lens[b:b + 1], alone)
            assert torch.equal(_bits(got[0]), _bits(batch[b, :k])), b


def test_bad_trees_and_prompts_are_named():
    """The exact forward takes what the normal one takes and refuses the same inputs by name: a
    parent after its child, num_nodes past N, a parent below -1, a slot outside the pool, a
    prompt length of 0."""
    target = tiny_qwen3_5()
    tokens = torch.tensor([[1, 2, 3]])
    pos = torch.tensor([[5, 6, 7]], dtype=torch.int32)
    five = torch.tensor([5], dtype=torch.int32)
    cases = [(dict(parents=torch.tensor([[-1, 2, 0]], dtype=torch.int32)), "parent"),
             (dict(parents=torch.tensor([[-1, 0, 1]], dtype=torch.int32),
                   num_nodes=torch.tensor([4], dtype=torch.int32)), "num_nodes"),
             (dict(parents=torch.tensor([[-1, -2, 0]], dtype=torch.int32)), "parents")]
    for mode in (False, True):
        for kw, name in cases:
            cache = target.new_cache(1, 16)
            with exact_mode(mode), pytest.raises(ValueError, match=name):
                target.forward(tokens, pos, cache, five, write_start=five, **kw)
    cache = target.new_cache(1, 16, pool_size=2, slots=torch.tensor([-1], dtype=torch.int32))
    with exact_mode(), pytest.raises(ValueError, match="state_slots"):
        target.forward(tokens, pos, cache, five, write_start=five,
                       parents=torch.tensor([[-1, 0, 1]], dtype=torch.int32))
    with exact_mode(), pytest.raises(ValueError, match="prompt_lens"):
        target.prefill(tokens, torch.tensor([0], dtype=torch.int32), target.new_cache(1, 16))
    for mode in (False, True):
        with exact_mode(mode), pytest.raises(TypeError, match="max_depth"):
            target.forward(tokens, pos, target.new_cache(1, 16), five, write_start=five,
                           parents=torch.tensor([[-1, 0, 1]], dtype=torch.int32), max_depth=1.5)


@pytest.mark.skipif("triton" not in ENGINES, reason="the triton engine's walk plan")
def test_a_depth_bound_below_the_tree_is_named(monkeypatch):
    """The triton walk keeps ``max_depth`` states (``Tree.max_depth``, the verify's): a tree
    deeper than the bound it is given is refused by name where values are checked (on a GPU:
    NaN for the nodes past the slots, tests/test_exact_gated_delta_triton.py)."""
    target = tiny_qwen3_5(backend="triton")
    dev = target.device
    tokens = torch.tensor([[1, 2, 3, 4]], device=dev)
    pos = torch.tensor([[5, 6, 7, 6]], dtype=torch.int32, device=dev)
    five = torch.tensor([5], dtype=torch.int32, device=dev)
    parents = torch.tensor([[-1, 0, 1, 0]], dtype=torch.int32, device=dev)   # the root branches
    with exact_mode():
        target.forward(tokens, pos, target.new_cache(1, 16), five, write_start=five,
                       parents=parents, max_depth=2)
        # verify passes the tree's bound: its scratch is the depth's slots, not N's
        from jetspec_kernels.triton import exact_gated_delta
        seen = []
        walk = exact_gated_delta.walk

        def spy(*args, **kw):
            seen.append(args[5].num_slots)
            return walk(*args, **kw)
        wide = [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5]           # depth 3, N 12: 3 slots, not 5
        tree = _on(_tree(torch.tensor([wide], dtype=torch.int32),
                         torch.arange(1, 13, dtype=torch.int32)[None]), dev)
        assert tree.max_depth == 3
        with monkeypatch.context() as m:
            m.setattr(exact_gated_delta, "walk", spy)
            target.verify(tree, five, target.new_cache(1, 32))
        assert seen and set(seen) == {3}
        with pytest.raises(ValueError, match="max_depth 0"):
            target.forward(tokens, pos, target.new_cache(1, 16), five, write_start=five,
                           parents=parents, max_depth=0)


@pytest.mark.parametrize("backend", ENGINES)
def test_commit_of_a_batch_equals_each_sequence_alone(backend):
    """Two sequences verified together and committed along different paths (3 and 1 accepted)
    leave each its own slot's conv and recurrent states as committing it alone would: the
    commit gathers each sequence's own kept operands."""
    target = tiny_qwen3_5(backend=backend, num_experts=4)
    dev = target.device
    gen = torch.Generator().manual_seed(17)
    v, n = target.config.vocab_size, len(PARENTS)
    prompts = torch.randint(0, v, (2, 6), generator=gen).to(dev)
    lens = torch.tensor([6, 6], dtype=torch.int32, device=dev)
    parents = torch.tensor([PARENTS, PARENTS], dtype=torch.int32)
    tree = _tree(parents[:1], torch.randint(0, v, (1, n), generator=gen, dtype=torch.int32))
    tokens = torch.cat([tree.tokens, torch.randint(0, v, (1, n), generator=gen, dtype=torch.int32)])
    tree = _on(dataclasses.replace(tree, **{f.name: torch.cat([getattr(tree, f.name)] * 2)
                                            for f in dataclasses.fields(tree)
                                            if f.name not in ("max_depth", "tokens")},
                                   tokens=tokens), dev)
    paths = [root_path(PARENTS, 9), root_path(PARENTS, 2)]             # 0 1 3 6 9 / 0 2
    accept = [3, 1]
    padded = torch.tensor([p[:a + 1] + [-1] * (6 - a - 1) for p, a in zip(paths, accept)],
                          dtype=torch.int32, device=dev)
    acc = torch.tensor(accept, dtype=torch.int32, device=dev)
    with exact_mode():
        both = target.new_cache(2, 40)
        target.prefill(prompts, lens, both)
        target.verify(tree, lens, both)
        target.commit_states(both, Verdict(acc, padded, acc.new_zeros(2), padded))
        for b in range(2):
            alone = target.new_cache(1, 40)
            target.prefill(prompts[b:b + 1], lens[b:b + 1], alone)
            one = dataclasses.replace(tree, **{f.name: getattr(tree, f.name)[b:b + 1]
                                               for f in dataclasses.fields(tree) if f.name != "max_depth"})
            target.verify(one, lens[b:b + 1], alone)
            target.commit_states(alone, Verdict(acc[b:b + 1], padded[b:b + 1], acc.new_zeros(1),
                                                padded[b:b + 1]))
            for mine, theirs in zip((*alone.conv, *alone.recurrent), (*both.conv, *both.recurrent)):
                assert torch.equal(mine[0], theirs[b]), b
