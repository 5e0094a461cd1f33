"""Each public op calls the selected backend's kernels once each and returns their outputs as
they are (no copy, ``out=`` written in place), wrapped in the public result types.

The backend kernels are replaced by a stub that returns outputs computed beforehand. Every case
runs with value checks on (the CPU default) and off (``"never"``, what CUDA tensors get by
default). ``bench/host_overhead.py`` times the same calls with pytest-benchmark.
"""
from typing import Callable, NamedTuple

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as jk_backend

B, N, HQ, HKV, DH, L, V, D, K = 4, 64, 8, 2, 64, 256, 1000, 5, 4


class Case(NamedTuple):
    call: Callable[[], object]       # the public op on prepared arguments
    kernels: list                    # backend functions it must call, in order, once each
    check: Callable[[object], None]  # asserts on the op's result


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
    """Valid arguments for every op, and the outputs the stubbed kernels return."""
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


def _tree_attention(x, stub):
    out = torch.empty_like(x["q"])
    return Case(lambda: jk.tree_attention(x["q"], x["k_cache"], x["v_cache"], x["prefix"],
                                          x["tree"].mask, out=out),
                ["tree_attention"], lambda res: _is(res, out))


def _draft_tree(x, stub):
    stub.returns.update(draft_tree=x["tree_parts"])

    def check(tree):
        _is(tree.tokens, x["tree_parts"][0])
        assert tree.max_depth == min(D, N - 1)
    return Case(lambda: jk.draft_tree(x["logits"], x["root"], budget=N, topk=K),
                ["draft_tree"], check)


def _draft_tree_from_topk(x, stub):
    stub.returns.update(build_tree=x["tree_parts"])
    tk, lp = x["topk"]
    return Case(lambda: jk.draft_tree_from_topk(tk, lp, x["root"], budget=N), ["build_tree"],
                lambda tree: _is(tree.mask, x["tree_parts"][5]))


def _draft_tree_from_hidden(x, stub):
    stub.returns.update(hidden_topk=x["topk"], build_tree=x["tree_parts"])
    return Case(lambda: jk.draft_tree_from_hidden(x["hidden"], x["lm_head"], x["root"], budget=N,
                                                  topk=K),
                ["hidden_topk", "build_tree"], lambda tree: _is(tree.scores, x["tree_parts"][3]))


def _pack_mask(x, stub):
    stub.returns.update(pack_mask=x["tree"].mask)
    return Case(lambda: jk.pack_mask(x["tree"].parents, x["tree"].num_nodes), ["pack_mask"],
                lambda mask: _is(mask, x["tree"].mask))


def _qk_norm_rope_append(x, stub):
    q_out = torch.empty_like(x["q"])
    stub.returns.update(qk_norm_rope_append=q_out)
    return Case(lambda: jk.qk_norm_rope_append(x["q"], x["k"], x["v"], x["norm_w"], x["norm_w"],
                                               x["positions"], x["k_cache"], x["v_cache"],
                                               rope_theta=1e6, cache_start=x["prefix"]),
                ["qk_norm_rope_append"], lambda res: _is(res, q_out))


def _verify_tree(x, stub):
    stub.returns.update(verify_tree=tuple(x["verdict"]))

    def check(res):
        assert isinstance(res, jk.Verdict)
        _is(res.path, x["verdict"].path)
    return Case(lambda: jk.verify_tree(x["tree"], x["target"]), ["verify_tree"], check)


def _commit_kv(x, stub):
    new_lens = x["prefix"] + x["verdict"].accept_len + 1
    stub.returns.update(commit_kv=(new_lens, None))

    def check(res):
        assert isinstance(res, jk.Commit) and res.hidden is None
        _is(res.prefix_lens, new_lens)
    return Case(lambda: jk.commit_kv(x["k_cache"], x["v_cache"], x["prefix"], x["verdict"]),
                ["commit_kv"], check)


def _is(got, want):
    assert got is want, "the op must return the kernel's (or the caller's out) tensor, not a copy"


CASES = {f.__name__[1:]: f for f in (_tree_attention, _draft_tree, _draft_tree_from_topk,
                                     _draft_tree_from_hidden, _pack_mask, _qk_norm_rope_append,
                                     _verify_tree, _commit_kv)}


@pytest.mark.parametrize("name", CASES)
def test_op_returns_its_kernels_outputs(name, stub, inputs, value_checks):
    case = CASES[name](inputs, stub)
    case.check(case.call())
    assert [fn for _, fn in stub.calls] == case.kernels
    assert all(backend in ("reference", "triton") for backend, _ in stub.calls)
