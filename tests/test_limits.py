"""Every limit at exactly the limit (taken) and one past it (refused, naming the argument).

A limit checked with ``>=`` instead of ``>`` (or the reverse) passes a test that only looks well
past it; these look at both sides. The public ops run with their kernels stubbed out (a call
that passes the checks reaches the stub), so limits as large as a 4096-node tree or a 2**21-token
vocabulary cost nothing. Also: the cuda backend's own limits (what ``supports`` answers, from
``_C.LIMITS`` of the simulated build) and the launchers at their limits in the simulator.
"""
import re

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as bk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.limits import MAX_BUDGET, MAX_TOPK
from jetspec_kernels.python_ref.sampling import MAX_TOP_P_VOCAB
from helpers import cu, use_sim

I32, I64, F32 = torch.int32, torch.int64, torch.float32
F32_AFTER_1 = 1.0000001          # rounds to the float32 just above 1
F32_TINY, F32_ZERO = 1e-45, 1e-46  # the smallest float32 > 0, and a value that rounds to 0


class Dispatched(Exception):
    """The call passed every check and reached the (stubbed) kernel."""


@pytest.fixture
def stub_kernels(monkeypatch):
    def select(device, fn, backend=None, call=None):
        def kernel(*args, **kwargs):
            raise Dispatched(fn)
        return kernel
    monkeypatch.setattr(bk, "select", select)


def tree(n=5, num=None, max_depth=None, tokens=None, parents=None, depths=None, b=2):
    par = torch.tensor([-1] + list(range(n - 1)), dtype=I32).repeat(b, 1) if parents is None else parents
    return jk.Tree(torch.zeros(b, n, dtype=I32) if tokens is None else tokens, par,
                   torch.arange(n, dtype=I32).clamp(max=n - 1).repeat(b, 1) if depths is None else depths,
                   torch.zeros(b, n), torch.full((b,), n, dtype=I32) if num is None else num,
                   torch.zeros(b, n, (n + 31) // 32, dtype=I32),
                   n - 1 if max_depth is None else max_depth)


def topk_inputs(k=3, d=2, b=1):
    lp = -torch.arange(b * d * k, dtype=F32).view(b, d, k) / 10
    return torch.zeros(b, d, k, dtype=I32), lp


def attention(prefix, L=12, n=5, paged=False, table_hi=None, scale=None):
    b, h, dh = 2, 2, 16
    k = torch.zeros(b, L, h, dh) if not paged else torch.zeros(2 * 3, 4, h, dh)
    table = None
    if paged:
        table = torch.arange(6, dtype=I32).view(2, 3)
        if table_hi is not None:
            table[1, 2] = table_hi
    return dict(q=torch.zeros(b, n, h, dh), k_cache=k, v_cache=k.clone(),
                prefix_lens=torch.tensor([0, prefix], dtype=I32), block_table=table, scale=scale)


def rope(positions=None, start=None, eps=1e-6, theta=1e4, L=12, n=5):
    b, h, dh = 2, 2, 16
    pos = torch.arange(n, dtype=I32).repeat(b, 1) if positions is None else positions
    return dict(q=torch.zeros(b, n, h, dh), k=torch.zeros(b, n, h, dh), v=torch.zeros(b, n, h, dh),
                q_norm_w=torch.ones(dh), k_norm_w=torch.ones(dh), positions=pos,
                k_cache=torch.zeros(b, L, h, dh), v_cache=torch.zeros(b, L, h, dh), rope_theta=theta,
                eps=eps, cache_start=start)


def last_pos(value, n=5, dtype=I32):
    pos = torch.arange(n, dtype=dtype).repeat(2, 1)
    pos[1, -1] = value
    return pos


def first_pos(value, n=5):
    pos = torch.arange(1, n + 1, dtype=I32).repeat(2, 1)
    pos[1, 0] = value
    return pos


def verify(v=7, n=5, **kw):
    t = kw.pop("tree", None) or tree(n)
    return dict(tree=t, target_logits=torch.zeros(2, n, v), **kw)


def sampled(**kw):
    return verify(temperature=kw.pop("temperature", 1.0), seed=kw.pop("seed", 0),
                  offset=kw.pop("offset", 0), **kw)


def commit(accept=None, prefix=7, hidden_n=5, path=None):
    b, L = 2, 12
    k = torch.zeros(b, L, 1, 4)
    p = torch.tensor([[0, 1, 2], [0, 2, 4]], dtype=I32) if path is None else path
    acc = torch.tensor([2, 2], dtype=I32) if accept is None else accept
    return dict(k_cache=k, v_cache=k.clone(), prefix_lens=torch.tensor([0, prefix], dtype=I32),
                verdict=jk.Verdict(acc, p, torch.zeros(b, dtype=I32), p.clone()),
                hidden=torch.zeros(b, hidden_n, 3))


def with_tokens(value):
    toks = torch.zeros(2, 5, dtype=I32)
    toks[1, 4] = value
    return tree(tokens=toks)


def with_parent(value):
    par = torch.tensor([-1, 0, 1, 2, 3], dtype=I32).repeat(2, 1)
    par[1, 4] = value
    return par


def with_depth(value):
    dep = torch.tensor([0, 1, 2, 3, 3], dtype=I32).repeat(2, 1)
    dep[1, 4] = value
    return dep


# (name, op, arguments at the limit, one past it, the argument the refusal names)
LIMITS = [
    # draft trees
    ("budget max", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 5), root_tokens=torch.zeros(1, dtype=I32), budget=v, topk=2),
     MAX_BUDGET, MAX_BUDGET + 1, "budget"),
    ("budget min", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 5), root_tokens=torch.zeros(1, dtype=I32), budget=v, topk=2),
     1, 0, "budget"),
    ("topk max", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 100), root_tokens=torch.zeros(1, dtype=I32), budget=8, topk=v),
     MAX_TOPK, MAX_TOPK + 1, "topk"),
    ("topk vocab", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 10), root_tokens=torch.zeros(1, dtype=I32), budget=8, topk=v),
     10, 11, "topk"),
    ("topk min", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 10), root_tokens=torch.zeros(1, dtype=I32), budget=8, topk=v),
     1, 0, "topk"),
    ("root token", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 10), root_tokens=torch.tensor([v], dtype=I32), budget=8, topk=2),
     9, 10, "root_tokens"),
    ("logits -inf row", jk.draft_tree,
     lambda v: dict(logits=torch.tensor([[[v, float("-inf"), float("-inf")]]]),
                    root_tokens=torch.zeros(1, dtype=I32), budget=3, topk=1),
     -3.4e38, float("-inf"), "logits"),
    ("logits +inf", jk.draft_tree,
     lambda v: dict(logits=torch.tensor([[[v, 0.0]]]), root_tokens=torch.zeros(1, dtype=I32),
                    budget=3, topk=1),
     3.4e38, float("inf"), "logits"),
    ("hidden finite", jk.draft_tree_from_hidden,
     lambda v: dict(hidden=torch.full((1, 1, 8), v), lm_head_weight=torch.zeros(10, 8),
                    root_tokens=torch.zeros(1, dtype=I32), budget=3, topk=1),
     3.4e38, float("inf"), "hidden"),
    ("topk K max", jk.draft_tree_from_topk,
     lambda v: dict(zip(("topk_tokens", "topk_logprobs"), topk_inputs(k=v)),
                    root_tokens=torch.zeros(1, dtype=I32), budget=8),
     MAX_TOPK, MAX_TOPK + 1, "topk_tokens"),
    ("topk budget max", jk.draft_tree_from_topk,
     lambda v: dict(zip(("topk_tokens", "topk_logprobs"), topk_inputs()),
                    root_tokens=torch.zeros(1, dtype=I32), budget=v),
     MAX_BUDGET, MAX_BUDGET + 1, "budget"),
    ("topk token int32", jk.draft_tree_from_topk,
     lambda v: dict(topk_tokens=torch.full((1, 2, 3), v, dtype=I64), topk_logprobs=topk_inputs()[1],
                    root_tokens=torch.zeros(1, dtype=I32), budget=8),
     2 ** 31 - 1, 2 ** 31, "topk_tokens"),
    ("topk root int32", jk.draft_tree_from_topk,
     lambda v: dict(zip(("topk_tokens", "topk_logprobs"), topk_inputs()),
                    root_tokens=torch.tensor([v], dtype=I64), budget=8),
     2 ** 31 - 1, 2 ** 31, "root_tokens"),
    ("topk logprob <= 0", jk.draft_tree_from_topk,
     lambda v: dict(topk_tokens=topk_inputs()[0], topk_logprobs=torch.tensor([[[v, -1.0, -2.0]] * 2]),
                    root_tokens=torch.zeros(1, dtype=I32), budget=8),
     0.0, F32_TINY, "topk_logprobs"),
    ("hidden topk vocab", jk.draft_tree_from_hidden,
     lambda v: dict(hidden=torch.zeros(1, 2, 8), lm_head_weight=torch.zeros(10, 8),
                    root_tokens=torch.zeros(1, dtype=I32), budget=8, topk=v),
     10, 11, "topk"),
    # pack_mask
    ("num_nodes max", jk.pack_mask,
     lambda v: dict(parents=torch.tensor([[-1, 0, 1]], dtype=I32), num_nodes=torch.tensor([v], dtype=I32)),
     3, 4, "num_nodes"),
    ("num_nodes min", jk.pack_mask,   # every tree has its root, as verify_tree needs
     lambda v: dict(parents=torch.tensor([[-1, 0, 1]], dtype=I32), num_nodes=torch.tensor([v], dtype=I32)),
     1, 0, "num_nodes"),
    ("parent below own index", jk.pack_mask,
     lambda v: dict(parents=torch.tensor([[-1, 0, v]], dtype=I32), num_nodes=torch.tensor([3], dtype=I32)),
     1, 2, "parents"),
    ("parent of padding", jk.pack_mask,
     lambda v: dict(parents=torch.tensor([[-1, 0, v]], dtype=I32), num_nodes=torch.tensor([v], dtype=I32)),
     2, 3, "parents"),
    # tree_attention
    ("prefix + N = cache", jk.tree_attention, lambda v: attention(v), 7, 8, "prefix_lens"),
    ("prefix + N = pages", jk.tree_attention, lambda v: attention(v, paged=True), 7, 8, "prefix_lens"),
    ("prefix min", jk.tree_attention, lambda v: attention(v), 0, -1, "prefix_lens"),
    ("block table page", jk.tree_attention, lambda v: attention(2, paged=True, table_hi=v), 5, 6,
     "block_table"),
    ("block table min", jk.tree_attention, lambda v: attention(2, paged=True, table_hi=v), 0, -1,
     "block_table"),
    ("scale > 0", jk.tree_attention, lambda v: attention(2, scale=v), F32_TINY, 0.0, "scale"),
    # qk_norm_rope_append
    ("position = cache slot", jk.qk_norm_rope_append, lambda v: rope(last_pos(v)), 11, 12, "positions"),
    ("position min", jk.qk_norm_rope_append, lambda v: rope(first_pos(v)), 0, -1, "positions"),
    ("cache_start + N = cache", jk.qk_norm_rope_append,
     lambda v: rope(start=torch.tensor([0, v], dtype=I32)), 7, 8, "cache_start"),
    ("position int32", jk.qk_norm_rope_append,
     lambda v: rope(last_pos(v, dtype=I64), start=torch.zeros(2, dtype=I32)), 2 ** 31 - 1, 2 ** 31,
     "positions"),
    ("eps >= 0", jk.qk_norm_rope_append, lambda v: rope(eps=v), 0.0, -F32_TINY, "eps"),
    ("rope_theta > 0", jk.qk_norm_rope_append, lambda v: rope(theta=v), F32_TINY, 0.0, "rope_theta"),
    # verify_tree
    ("top_p max", jk.verify_tree, lambda v: sampled(top_p=v), 1.0, F32_AFTER_1, "top_p"),
    ("top_p min", jk.verify_tree, lambda v: sampled(top_p=v), F32_TINY, F32_ZERO, "top_p"),
    ("top_p tensor max", jk.verify_tree, lambda v: sampled(top_p=torch.tensor([0.5, v])), 1.0,
     F32_AFTER_1, "top_p"),
    ("top_p tensor min", jk.verify_tree, lambda v: sampled(top_p=torch.tensor([0.5, v])), F32_TINY,
     0.0, "top_p"),
    ("top_p vocabulary", jk.verify_tree, lambda v: sampled(v=v, n=1, tree=tree(1), top_p=0.5),
     MAX_TOP_P_VOCAB, MAX_TOP_P_VOCAB + 1, "target_logits"),
    ("top_k min", jk.verify_tree, lambda v: sampled(top_k=v), 0, -1, "top_k"),
    ("top_k tensor min", jk.verify_tree, lambda v: sampled(top_k=torch.tensor([3, v])), 0, -1, "top_k"),
    ("temperature min", jk.verify_tree, lambda v: verify(temperature=v), 0.0, -F32_TINY, "temperature"),
    ("temperature tensor min", jk.verify_tree,
     lambda v: sampled(temperature=torch.tensor([1.0, v])), 0.0, -F32_TINY, "temperature"),
    ("seed max", jk.verify_tree, lambda v: sampled(seed=v), 2 ** 63 - 1, 2 ** 63, "seed"),
    ("seed min", jk.verify_tree, lambda v: sampled(seed=v), -2 ** 63, -2 ** 63 - 1, "seed"),
    ("offset max", jk.verify_tree, lambda v: sampled(offset=v), 2 ** 63 - 1, 2 ** 63, "offset"),
    ("max_depth", jk.verify_tree, lambda v: verify(tree=tree(max_depth=v)), 4, 5, "tree.max_depth"),
    ("num_nodes max", jk.verify_tree, lambda v: verify(tree=tree(num=torch.tensor([5, v], dtype=I32))),
     5, 6, "tree.num_nodes"),
    ("num_nodes min", jk.verify_tree, lambda v: verify(tree=tree(num=torch.tensor([5, v], dtype=I32))),
     1, 0, "tree.num_nodes"),
    ("tree token < V", jk.verify_tree, lambda v: verify(tree=with_tokens(v)), 6, 7, "tree.tokens"),
    ("tree parent < N", jk.verify_tree, lambda v: verify(tree=tree(parents=with_parent(v))), 4, 5,
     "tree.parents"),
    ("tree depth <= max_depth", jk.verify_tree,
     lambda v: verify(tree=tree(depths=with_depth(v), max_depth=3)), 3, 4, "tree.depths"),
    ("target token min", jk.verify_tree,
     lambda v: dict(tree=tree(), target_tokens=torch.full((2, 5), v, dtype=I32)), 0, -1, "target_tokens"),
    # commit_kv
    ("accept_len max", jk.commit_kv, lambda v: commit(accept=torch.tensor([2, v], dtype=I32)), 2, 3,
     "verdict.accept_len"),
    ("prefix + path = cache", jk.commit_kv, lambda v: commit(prefix=v), 7, 8, "prefix_lens"),
    ("path < hidden rows", jk.commit_kv, lambda v: commit(hidden_n=v), 5, 4, "hidden"),
]


@pytest.mark.usefixtures("stub_kernels")
@pytest.mark.parametrize("name,op,make,ok,bad,arg", LIMITS, ids=[c[0] for c in LIMITS])
def test_limit_exactly_and_one_past(name, op, make, ok, bad, arg):
    with pytest.raises(Dispatched):
        op(**make(ok))
    with pytest.raises(ValueError) as info:
        op(**make(bad))
    assert re.match(rf"{re.escape(arg)}\b(?![.\w])", str(info.value)), str(info.value)


# ------------------------------------------------------------------ generate and the CLI


@pytest.mark.parametrize("name,ok,bad", [("budget", MAX_BUDGET, MAX_BUDGET + 1),
                                         ("budget", 1, 0),
                                         ("topk", MAX_TOPK, MAX_TOPK + 1),
                                         ("max_new_tokens", 1, 0),
                                         ("page_size", 1, 0),
                                         ("sync_every", 1, 0),
                                         ("eos_token_id", 96, 97),
                                         ("eos_token_id", 0, -1),
                                         ("top_k", 0, -1),
                                         ("top_p", 1.0, F32_AFTER_1),
                                         ("temperature", 0.0, -F32_TINY),
                                         ("seed", 2 ** 63 - 1, 2 ** 63)])
def test_generate_limits(name, ok, bad):
    """generate's own checks (decode.check_generate_args, run before any model work) on the
    random tiny models (vocabulary 97)."""
    from jetspec_kernels.decode import check_generate_args
    from jetspec_kernels.models import tiny_models
    target, head = tiny_models()
    kw = dict(max_new_tokens=4, budget=8, topk=2)
    check_generate_args(target, head, [[1, 2]], **{**kw, name: ok})
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        check_generate_args(target, head, [[1, 2]], **{**kw, name: bad})


def test_generate_size_lists_and_prompts_at_the_limits():
    from jetspec_kernels.decode import check_generate_args
    from jetspec_kernels.models import tiny_models
    target, head = tiny_models()
    kw = dict(max_new_tokens=4, budget=8, topk=2)
    check_generate_args(target, head, [[0, 96]], **{**kw, "budget": [1, MAX_BUDGET]})
    with pytest.raises(ValueError, match=r"^budget\[1\]"):
        check_generate_args(target, head, [[1, 2]], **{**kw, "budget": [MAX_BUDGET, MAX_BUDGET + 1]})
    with pytest.raises(ValueError, match=r"prompt_ids\[0\]\[1\] = 97"):
        check_generate_args(target, head, [[96, 97]], **kw)


# ------------------------------------------------------------------ the cuda backend's limits


@pytest.fixture
def sim_limits(monkeypatch):
    """The cuda backend reading the simulated build's _C.LIMITS."""
    use_sim(monkeypatch)
    return cu().extension.limit


def test_cuda_supports_at_each_limit(sim_limits):
    walk, rope_dh = sim_limits("walk_max_nodes"), sim_limits("rope_max_head_dim")
    align = sim_limits("row_align_bytes")
    ask = bk.supports
    assert ask("cuda", "verify_tree", tokens=torch.zeros(1, walk, dtype=I32)) is None
    assert str(walk) in ask("cuda", "verify_tree", tokens=torch.zeros(1, walk + 1, dtype=I32))
    assert ask("cuda", "qk_norm_rope_append", k=torch.zeros(1, 1, 1, rope_dh)) is None
    assert str(rope_dh) in ask("cuda", "qk_norm_rope_append", k=torch.zeros(1, 1, 1, rope_dh + 2))
    h = torch.float16
    cache = torch.zeros(1, 4, 1, 64 + align, dtype=h)   # fp16 rows 128 + 2 * align bytes apart
    q, per = torch.zeros(1, 1, 1, 64, dtype=h), align // 2
    for first, want in ((per, None), (per - 1, f"rows on {align}-byte boundaries")):
        kv = cache[..., first:first + 64]
        got = ask("cuda", "tree_attention", q=q, k_cache=kv, v_cache=kv, kernel="mma")
        assert got == want if want is None else want in got
    for dh in sim_limits("attn_head_dims"):
        q = torch.zeros(1, 1, 1, dh, dtype=h)
        assert ask("cuda", "tree_attention", q=q, k_cache=q, v_cache=q, kernel="mma") is None
    for dh in (32, 96, 512):
        q = torch.zeros(1, 1, 1, dh, dtype=h)
        assert "head dim" in ask("cuda", "tree_attention", q=q, k_cache=q, v_cache=q)
    page = sim_limits("attn_tma_page_multiple")
    for size, ok in ((page, True), (page + 1, False), (2 * page, True)):
        kc = torch.zeros(4, size, 1, 64, dtype=h)
        got = ask("cuda", "tree_attention", q=kc[:1], k_cache=kc, v_cache=kc, kernel="hopper",
                  block_table=torch.zeros(1, 1, dtype=I32))
        assert (got is None) == ok, (size, got)


def test_cuda_launchers_at_their_limits(monkeypatch):
    """The simulated kernels take a tree of exactly max_budget nodes, K = max_topk children, a head
    dim of exactly rope_max_head_dim (against python_ref), a top-K of the whole vocabulary."""
    use_sim(monkeypatch)
    limit = cu().extension.limit
    n, k = limit("max_budget"), limit("max_topk")
    tok = torch.arange(2 * k, dtype=I32).view(1, 2, k)
    lp = -(torch.arange(2 * k, dtype=F32).view(1, 2, k) % k) / 8
    root = torch.tensor([7], dtype=I32)
    for algorithm in ("topn", "accum_logp"):
        got = cu().build_tree(tok, lp, root, n, algorithm)
        assert int(got[4][0]) == n, algorithm                    # 1 + 64 + 64**2 > 4096 nodes
        par = got[1][0]
        assert bool((par[1:] < torch.arange(1, n)).all()) and bool((par[1:] >= 0).all())
    want = ref.build_tree(tok, lp, root, 100, "topn")
    got = cu().build_tree(tok, lp, root, 100, "topn")
    for key, g in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), got):
        assert torch.equal(g, want[key].to(g.dtype)), key
    logits = torch.randn(1, 2, k, generator=torch.Generator().manual_seed(0))
    tt, tl = cu().log_softmax_topk(logits, k)                     # K = V = max_topk
    want_t, want_l = ref.log_softmax_topk(logits.double(), k)
    assert torch.equal(tt, want_t) and float((tl - want_l).abs().max()) < 1e-5
    dh = limit("rope_max_head_dim")
    gen = torch.Generator().manual_seed(1)
    q, kk = torch.randn(1, 2, 1, dh, generator=gen), torch.randn(1, 2, 1, dh, generator=gen)
    pos = torch.tensor([[3, 9]], dtype=I32)
    kc, kr = torch.zeros(1, 10, 1, dh), torch.zeros(1, 10, 1, dh, dtype=torch.float64)
    out = cu().qk_norm_rope_append(q, kk, kk, torch.ones(dh), torch.ones(dh), pos, kc, kc.clone(),
                                   1e4, 1e-6, None, None)
    want = ref.qk_norm_rope_append(q.double(), kk.double(), kk.double(), torch.ones(dh).double(),
                                   torch.ones(dh).double(), pos, kr, kr.clone(), 1e4)
    assert float((out - want).norm() / want.norm()) < 1e-5
    assert float((kc - kr).norm() / kr.norm()) < 1e-5
