"""pytest-benchmark cases: the host-side cost of each public op (argument checks, backend
resolution, output allocation, result wrapping) per call, on small CPU tensors.

The backend kernel is replaced by a stub that returns outputs computed once beforehand, so the
timings are the Python overhead alone; each case also checks that the op dispatched to the stub
and returned the stub's tensors. Run with ``--benchmark-only`` to see the table; cases run both
with value checks on (the CPU default) and off (``set_value_checks("never")``, what CUDA tensors
get by default).
"""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as jk_backend

B, N, HQ, HKV, DH, L, V, D, K = 4, 64, 8, 2, 64, 256, 1000, 5, 4


@pytest.fixture(params=["cpu", "never"])
def value_checks(request):
    jk.set_value_checks(request.param)
    yield request.param
    jk.set_value_checks("cpu")


@pytest.fixture
def stub(monkeypatch):
    """Replace backend kernels: ``stub.returns[fn]`` is what kernel ``fn`` returns;
    ``stub.calls`` records (backend, fn) per call."""

    class Stub:
        returns: dict = {}
        calls: list = []

    def kernel(name, fn):
        def run(*args, **kwargs):
            Stub.calls.append((name, fn))
            return Stub.returns.get(fn)
        return run

    Stub.returns, Stub.calls = {}, []
    monkeypatch.setattr(jk_backend, "kernel", kernel)
    return Stub


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(B, D, V, generator=gen)
    root = torch.randint(0, V, (B,), generator=gen, dtype=torch.int32)
    tree = jk.draft_tree(logits, root, budget=N, topk=K, backend="reference")
    tk, lp = jk_backend.kernel("reference", "log_softmax_topk")(logits, K)
    tree_parts = (tree.tokens, tree.parents, tree.depths, tree.scores, tree.num_nodes, tree.mask)
    prefix = torch.full((B,), L, dtype=torch.int32)
    target = torch.randn(B, N, V, generator=gen)
    verdict = jk.verify_tree(tree, target, backend="reference")
    return dict(
        logits=logits, root=root, tree=tree, tree_parts=tree_parts, topk=(tk, lp),
        hidden=torch.randn(B, D, 32, generator=gen), lm_head=torch.randn(V, 32, generator=gen),
        q=torch.randn(B, N, HQ, DH, generator=gen), k=torch.randn(B, N, HKV, DH, generator=gen),
        v=torch.randn(B, N, HKV, DH, generator=gen), k_cache=torch.randn(B, L + N, HKV, DH, generator=gen),
        v_cache=torch.randn(B, L + N, HKV, DH, generator=gen), prefix=prefix, target=target,
        verdict=verdict, norm_w=torch.ones(DH), positions=tree.positions(prefix),
    )


def _dispatched(stub, fn):
    assert stub.calls and stub.calls[-1][1] == fn
    assert stub.calls[-1][0] in ("reference", "triton")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_tree_attention_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    out = torch.empty_like(x["q"])
    res = benchmark(jk.tree_attention, x["q"], x["k_cache"], x["v_cache"], x["prefix"],
                    x["tree"].mask, out=out)
    assert res is out
    _dispatched(stub, "tree_attention")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_draft_tree_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    stub.returns.update(log_softmax_topk=x["topk"], build_tree=x["tree_parts"])
    tree = benchmark(jk.draft_tree, x["logits"], x["root"], budget=N, topk=K)
    assert tree.tokens is x["tree_parts"][0] and tree.max_depth == min(D, N - 1)
    _dispatched(stub, "build_tree")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_draft_tree_from_topk_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    stub.returns.update(build_tree=x["tree_parts"])
    tk, lp = x["topk"]
    tree = benchmark(jk.draft_tree_from_topk, tk, lp, x["root"], budget=N)
    assert tree.mask is x["tree_parts"][5]
    _dispatched(stub, "build_tree")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_draft_tree_from_hidden_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    stub.returns.update(hidden_topk=x["topk"], build_tree=x["tree_parts"])
    tree = benchmark(jk.draft_tree_from_hidden, x["hidden"], x["lm_head"], x["root"], budget=N, topk=K)
    assert tree.scores is x["tree_parts"][3]
    assert "hidden_topk" in [fn for _, fn in stub.calls]
    _dispatched(stub, "build_tree")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_pack_mask_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    stub.returns.update(pack_mask=x["tree"].mask)
    mask = benchmark(jk.pack_mask, x["tree"].parents, x["tree"].num_nodes)
    assert mask is x["tree"].mask
    _dispatched(stub, "pack_mask")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_qk_norm_rope_append_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    q_out = torch.empty_like(x["q"])
    stub.returns.update(qk_norm_rope_append=q_out)
    res = benchmark(jk.qk_norm_rope_append, x["q"], x["k"], x["v"], x["norm_w"], x["norm_w"],
                    x["positions"], x["k_cache"], x["v_cache"], rope_theta=1e6, cache_start=x["prefix"])
    assert res is q_out
    _dispatched(stub, "qk_norm_rope_append")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_verify_tree_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    stub.returns.update(verify_tree=tuple(x["verdict"]))
    res = benchmark(jk.verify_tree, x["tree"], x["target"])
    assert isinstance(res, jk.Verdict) and res.path is x["verdict"].path
    _dispatched(stub, "verify_tree")


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
def test_commit_kv_overhead(benchmark, stub, inputs, value_checks):
    x = inputs
    new_lens = x["prefix"] + x["verdict"].accept_len + 1
    stub.returns.update(commit_kv=(new_lens, None))
    res = benchmark(jk.commit_kv, x["k_cache"], x["v_cache"], x["prefix"], x["verdict"])
    assert isinstance(res, jk.Commit) and res.prefix_lens is new_lens and res.hidden is None
    _dispatched(stub, "commit_kv")
