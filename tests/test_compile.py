"""torch.compile(fullgraph=True) of every public op, of a whole speculative round and of the
models' forward: on the reference backend (CPU inductor), on the cuda backend through its fake
implementations (the simulated kernels run the compiled graph), and torch.library.opcheck of the
reference backend's custom ops. Each compiled result equals eager (integers exactly, floats to
float32 rounding: inductor may fuse and reorder float arithmetic), and a second call with the
same shapes, or another batch size where the batch is marked dynamic, compiles nothing new.

Compile times: docs/perf/compile.md.
"""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import jetspec_kernels as jk
from helpers import use_sim_backend

B, N, HQ, HKV, DH, L, V, K, D = 2, 8, 4, 2, 64, 64, 50, 3, 4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch; value checks stay at their CPU default."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, backend="inductor"):
    """``fn`` compiled whole (fullgraph) by ``backend``, and the counter of its compilations."""
    counter = CompileCounterWithBackend(backend)
    return torch.compile(fn, fullgraph=True, backend=counter), counter


def flat(x):
    """The tensors of an op's result (a Tree, Verdict, Commit, tuple or tensor), in order."""
    if isinstance(x, jk.Tree):
        return [x.tokens, x.parents, x.depths, x.scores, x.num_nodes, x.mask]
    if isinstance(x, (tuple, list)):
        return [t for part in x for t in flat(part)]
    return [] if x is None else [x]


def assert_same(got, want):
    got, want = flat(got), flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.is_floating_point():
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert torch.equal(g, w)


def inputs(batch=B, seed=0, dtype=torch.float32):
    """One round's inputs for ``batch`` sequences (logits float32; activations, caches and
    weights ``dtype``; a contiguous cache)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    a = lambda *s: r(*s).to(dtype)  # noqa: E731
    return dict(
        logits=r(batch, D, V), root=torch.randint(0, V, (batch,), generator=g, dtype=torch.int32),
        hidden=a(batch, D, DH), lm_head=a(V, DH), q=a(batch, N, HQ, DH), k=a(batch, N, HKV, DH),
        v=a(batch, N, HKV, DH), k_cache=a(batch, L, HKV, DH), v_cache=a(batch, L, HKV, DH),
        norm_w=(1 + 0.1 * r(DH)).to(dtype), prefix=torch.randint(0, L - N, (batch,), generator=g,
                                                                 dtype=torch.int32),
        target=r(batch, N, V), x=a(batch, N, 6 * DH), taps=a(batch, N, 3 * DH))


def op_calls(x, backend):
    """name -> a function of no arguments calling that public op (fresh caches where it writes)."""
    tree = jk.draft_tree(x["logits"], x["root"], budget=N, topk=K, backend=backend)
    kw = dict(backend=backend)
    return {
        "draft_tree": lambda: jk.draft_tree(x["logits"], x["root"], budget=N, topk=K, **kw),
        "draft_tree_accum_logp": lambda: jk.draft_tree(x["logits"], x["root"], budget=N, topk=K,
                                                       algorithm="accum_logp", **kw),
        "draft_tree_from_hidden": lambda: jk.draft_tree_from_hidden(
            x["hidden"], x["lm_head"], x["root"], budget=N, topk=K, method="gemm", **kw),
        "draft_tree_from_topk": lambda: jk.draft_tree_from_topk(
            *_topk(x["logits"]), x["root"], budget=N, **kw),
        "pack_mask": lambda: jk.pack_mask(tree.parents, tree.num_nodes, **kw),
        "qk_norm_rope_append": lambda: _append(x, tree, kw),
        "tree_attention": lambda: jk.tree_attention(
            x["q"], x["k_cache"], x["v_cache"], x["prefix"], tree.mask, return_lse=True, **kw),
        "verify_tree": lambda: jk.verify_tree(tree, x["target"], **kw),
        "verify_tree_sampled": lambda: jk.verify_tree(tree, x["target"], temperature=0.8,
                                                      seed=7, offset=3, top_k=5, top_p=0.9, **kw),
        "commit_kv": lambda: _commit(x, tree, kw),
        "rms_norm": lambda: jk.rms_norm(x["x"], x["norm_w"].repeat(6), residual=x["x"].flip(0),
                                        **kw),
        "silu_mul": lambda: jk.silu_mul(x["x"], **kw),
    }


def _topk(logits):
    logprobs, tokens = torch.topk(torch.log_softmax(logits, -1), K)
    return tokens, logprobs


def _append(x, tree, kw):
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    q = jk.qk_norm_rope_append(x["q"], x["k"], x["v"], x["norm_w"], x["norm_w"],
                               tree.positions(x["prefix"]), kc, vc, rope_theta=1e4,
                               cache_start=x["prefix"], **kw)
    return q, kc, vc


def _commit(x, tree, kw):
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    verdict = jk.verify_tree(tree, x["target"], **kw)
    hidden = x["taps"]
    return jk.commit_kv(kc, vc, x["prefix"], verdict, hidden=hidden, **kw), kc, vc


def speculative_round(x, backend):
    """draft_tree -> qk_norm_rope_append -> tree_attention -> verify_tree -> commit_kv."""
    kw = dict(backend=backend)
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    tree = jk.draft_tree(x["logits"], x["root"], budget=N, topk=K, **kw)
    q = jk.qk_norm_rope_append(x["q"], x["k"], x["v"], x["norm_w"], x["norm_w"],
                               tree.positions(x["prefix"]), kc, vc, rope_theta=1e4,
                               cache_start=x["prefix"], **kw)
    out = jk.tree_attention(q, kc, vc, x["prefix"], tree.mask, **kw)
    # The target's logits at each node: a stand-in projection of the attention output.
    verdict = jk.verify_tree(tree, out.flatten(2).float() @ x["lm_head"].float().repeat(1, HQ).T,
                             **kw)
    commit = jk.commit_kv(kc, vc, x["prefix"], verdict, hidden=out.flatten(2), **kw)
    return tree, verdict, commit, kc, vc


REFERENCE_OPS = list(op_calls(inputs(), "reference"))


@pytest.mark.parametrize("op", REFERENCE_OPS)
def test_every_op_compiles_whole_on_the_reference_backend(op):
    call = op_calls(inputs(), "reference")[op]
    fn, counter = compiled(call)
    assert_same(fn(), call())
    fn()
    assert counter.frame_count == 1, f"{op}: recompiled on a second call with the same shapes"


def test_a_round_compiles_whole_and_a_second_batch_size_does_not_recompile():
    """The round as one graph; the batch marked dynamic (as engines vary it): batch 3 after
    batch 2 reuses the graph; the results equal eager for both."""
    fn, counter = compiled(speculative_round)
    for batch, seed in ((2, 0), (2, 1), (3, 2)):
        x = inputs(batch, seed)
        for name in ("logits", "root", "hidden", "q", "k", "v", "k_cache", "v_cache", "prefix",
                     "target"):
            torch._dynamo.mark_dynamic(x[name], 0)
        assert_same(fn(x, "reference"), speculative_round(x, "reference"))
    assert counter.frame_count == 1


def test_values_are_still_checked_in_eager_after_compiling():
    """Compiling skips the host-side value checks (as graph capture does); eager calls keep them."""
    x = inputs()
    fn, _ = compiled(lambda: jk.tree_attention(x["q"], x["k_cache"], x["v_cache"], x["prefix"],
                                               backend="reference"))
    fn()
    with pytest.raises(ValueError, match="prefix_lens"):
        jk.tree_attention(x["q"], x["k_cache"], x["v_cache"], x["prefix"] + L, backend="reference")


def test_static_checks_run_while_compiling():
    """A bad dtype is refused with the op's own message when the call is compiled."""
    x = inputs()
    fn, _ = compiled(lambda: jk.tree_attention(x["q"], x["k_cache"], x["v_cache"],
                                               x["prefix"].float(), backend="reference"))
    with pytest.raises(Exception, match="prefix_lens must have dtype"):
        fn()


def test_reference_custom_ops_pass_opcheck():
    """torch.library.opcheck of each jetspec_ref op: schema (declared mutations), fake against
    real outputs, autograd registration and AOT dispatch."""
    from torch.library import opcheck

    x = inputs()
    tree = jk.draft_tree(x["logits"], x["root"], budget=N, topk=K, backend="reference")
    tt, tl = _topk(x["logits"])
    ops = torch.ops.jetspec_ref
    for algorithm in ("topn", "accum_logp"):
        opcheck(ops.build_tree.default, (tt.int(), tl, x["root"], N, algorithm))
    opcheck(ops.pack_mask.default, (tree.parents, tree.num_nodes))
    for budget in (32, 33):    # the fakes' W = ceil(N / 32) mask words: one word, then two
        opcheck(ops.build_tree.default, (tt.int(), tl, x["root"], budget, "topn"))
        big = jk.draft_tree(x["logits"], x["root"], budget=budget, topk=K, backend="reference")
        opcheck(ops.pack_mask.default, (big.parents, big.num_nodes))
    out, lse = torch.empty_like(x["q"]), torch.empty(B, HQ, N)
    for mask, lse_ in ((tree.mask, lse), (None, None)):
        opcheck(ops.tree_attention.default, (x["q"], x["k_cache"].clone(), x["v_cache"].clone(),
                                             x["prefix"], mask, "causal", None, 0.125, out, lse_))
    fields = (tree.tokens, tree.parents, tree.num_nodes, tree.max_depth)
    target = torch.argmax(x["target"], -1).int()
    i64 = dict(dtype=torch.int64)
    opcheck(ops.verify_tree.default, (*fields, None, target, 0.0, None, None, None, None, None))
    seed, offset = torch.tensor([1, 2], **i64), torch.tensor([3, 4], **i64)
    opcheck(ops.verify_tree.default, (*fields, x["target"], None, 0.8, None, seed, offset, None,
                                      None))
    opcheck(ops.verify_tree.default,   # per-sequence temperature, top-k and top-p
            (*fields, x["target"], None, 0.0, torch.tensor([0.0, 0.8]), seed, offset,
             torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0.9, 0.5])))
    path = torch.tensor([[0, 2, 3, -1, -1], [0, -1, -1, -1, -1]], dtype=torch.int32)
    acc = torch.tensor([2, 0], dtype=torch.int32)
    for hidden in (x["taps"], None):
        opcheck(ops.commit_kv.default, (x["k_cache"].clone(), x["v_cache"].clone(), x["prefix"],
                                        path, acc, None, hidden))


SIM_OPS = [op for op in REFERENCE_OPS if op != "draft_tree_from_hidden"]


@pytest.mark.parametrize("op", SIM_OPS)
def test_every_op_compiles_whole_on_the_cuda_backend_through_its_fakes(op, monkeypatch):
    """backend="cuda" on CPU tensors with the simulated kernels: dynamo traces the cuda custom
    ops through their fake implementations, and the compiled graph runs the real (simulated)
    kernels. (draft_tree_from_hidden's "gemm" method runs torch's GEMM, then the same top-K op
    as draft_tree: covered there.) aot_eager: the same trace and fakes as inductor, without
    generating code for the few torch ops around the custom ops."""
    use_sim_backend(monkeypatch)
    call = op_calls(inputs(dtype=torch.float16), "cuda")[op]   # (its attention takes fp16/bf16)
    fn, counter = compiled(call, "aot_eager")
    assert_same(fn(), call())
    fn()
    assert counter.frame_count == 1


def test_a_round_compiles_whole_on_the_cuda_backend_through_its_fakes(monkeypatch):
    use_sim_backend(monkeypatch)
    fn, counter = compiled(speculative_round, "aot_eager")
    for batch, seed in ((2, 0), (3, 1)):
        x = inputs(batch, seed, torch.float16)
        for name in ("logits", "root", "q", "k", "v", "k_cache", "v_cache", "prefix"):
            torch._dynamo.mark_dynamic(x[name], 0)
        assert_same(fn(x, "cuda"), speculative_round(x, "cuda"))
    assert counter.frame_count == 1


def test_the_models_forward_compiles_whole(reference_backend):
    """The tiny random Qwen3 target's tree verify forward (prefill eager first) and the draft
    head's block forward, each one graph on the reference backend, equal to eager."""
    from jetspec_kernels.models.tiny import tiny_models

    target, head = tiny_models()
    g = torch.Generator().manual_seed(0)
    b, t = 2, 6
    tokens = torch.randint(0, target.config.vocab_size, (b, t), generator=g)
    lens = torch.tensor([6, 4], dtype=torch.int32)
    cache = target.new_cache(b, 64)
    target.prefill(tokens, lens, cache)
    anchor = tokens[:, -1].contiguous()
    tree = jk.draft_tree(torch.randn(b, 4, target.config.vocab_size, generator=g), anchor,
                         budget=5, topk=2)

    def verify(cache):
        return target.verify(tree, lens, cache, taps=[1])

    def cache_copy():
        c = target.new_cache(b, 64)
        c.k.copy_(cache.k)
        c.v.copy_(cache.v)
        return c

    fn, counter = compiled(verify)
    got_cache, want_cache = cache_copy(), cache_copy()
    assert_same(fn(got_cache), verify(want_cache))
    assert_same((got_cache.k, got_cache.v), (want_cache.k, want_cache.v))
    fn(cache_copy())
    assert counter.frame_count == 1

    state = head.new_state(b, 64)
    head.append_context(state, torch.randn(b, t, head.config.target_hidden_size, generator=g),
                        lens)

    def draft(anchor):
        return head.draft_hidden(state, anchor, target.embed_weight)

    fn, counter = compiled(draft)
    assert_same(fn(anchor), draft(anchor))
    fn(anchor.flip(0))
    assert counter.frame_count == 1


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("op", REFERENCE_OPS)
def test_every_op_compiles_whole_on_a_gpu(op, backend):
    """The GPU backends on CUDA tensors (fp16): dynamo lifts Triton's JITFunction launches into
    the graph and traces the cuda custom ops through their fakes. (On the CPU the triton backend
    runs under TRITON_INTERPRET=1, which dynamo cannot trace: docs/DESIGN.md, "torch.compile".)"""
    x = {k: v.cuda() for k, v in inputs(dtype=torch.float16).items()}
    call = op_calls(x, backend)[op]
    fn, counter = compiled(call)
    assert_same(fn(), call())
    fn()
    assert counter.frame_count == 1
