"""The other side of the ops' limits: tests/test_limits.py takes each limit at exactly the limit
and one past it on the side where calls usually go wrong; these take the sides it leaves (lower
bounds of ranges it checks at their top, and the reverse), the limits that hold only while a
control is on, and the controls as tensors, each at the limit (taken) and one past it (refused
with a ValueError naming the argument). The kernels are stubbed, as there.
"""
import re

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as bk
from jetspec_kernels.checks import INT32_MAX
from jetspec_kernels.python_ref.sampling import MAX_TOP_P_VOCAB
from test_limits import (F32_AFTER_1, F32_TINY, I32, I64, Dispatched, commit, rope, sampled,
                         stub_kernels, topk_inputs, tree, verify)

F32_MAX = torch.finfo(torch.float32).max
F64_ROUNDS_TO_1 = 1 + 2 ** -30   # a float64 above 1 whose float32 is 1.0
F64_ROUNDS_TO_0 = 2 ** -151      # a float64 above 0 whose float32 is 0.0


def with_field(field, value, base):
    """The 2 x 5 chain tree of test_limits with ``field``'s element [1, 4] set to ``value``."""
    t = base.clone()
    t[1, 4] = value
    return t


CHAIN_PARENTS = torch.tensor([-1, 0, 1, 2, 3], dtype=I32).repeat(2, 1)
CHAIN_DEPTHS = torch.tensor([0, 1, 2, 3, 3], dtype=I32).repeat(2, 1)

# (name, op, arguments from the value, at the limit, one past it, the argument the refusal names)
LIMITS = [
    # verify_tree: top-p's vocabulary limit holds while top-p is on, a scalar or a tensor
    ("top_p tensor vocabulary", jk.verify_tree,
     lambda v: sampled(v=v, n=1, tree=tree(1), top_p=torch.tensor([0.5, 1.0])),
     MAX_TOP_P_VOCAB, MAX_TOP_P_VOCAB + 1, "target_logits"),
    ("top_p tensor float64 max", jk.verify_tree,
     lambda v: sampled(top_p=torch.tensor([0.5, v], dtype=torch.float64)), F64_ROUNDS_TO_1,
     F32_AFTER_1, "top_p"),
    ("top_p tensor float64 min", jk.verify_tree,
     lambda v: sampled(top_p=torch.tensor([0.5, v], dtype=torch.float64)), F32_TINY,
     F64_ROUNDS_TO_0, "top_p"),
    ("top_k int64 tensor min", jk.verify_tree,
     lambda v: sampled(top_k=torch.tensor([3, v], dtype=I64)), 0, -1, "top_k"),
    ("temperature max", jk.verify_tree, lambda v: sampled(temperature=v), F32_MAX, float("inf"),
     "temperature"),
    ("temperature tensor max", jk.verify_tree,
     lambda v: sampled(temperature=torch.tensor([1.0, v])), F32_MAX, float("inf"), "temperature"),
    ("offset min", jk.verify_tree, lambda v: sampled(offset=v), -2 ** 63, -2 ** 63 - 1, "offset"),
    ("max_depth min", jk.verify_tree, lambda v: verify(n=1, tree=tree(1, max_depth=v)), 0, -1,
     "tree.max_depth"),
    ("tree token min", jk.verify_tree,
     lambda v: verify(tree=tree(tokens=with_field("tokens", v, torch.zeros(2, 5, dtype=I32)))), 0, -1,
     "tree.tokens"),
    ("tree token < V, tokens target", jk.verify_tree,
     lambda v: dict(tree=tree(tokens=with_field("tokens", v, torch.zeros(2, 5, dtype=I32))),
                    target_tokens=torch.zeros(2, 5, dtype=I32)), INT32_MAX, -1, "tree.tokens"),
    ("tree parent min", jk.verify_tree,
     lambda v: verify(tree=tree(parents=with_field("parents", v, CHAIN_PARENTS))), -1, -2,
     "tree.parents"),
    ("tree depth min", jk.verify_tree,
     lambda v: verify(tree=tree(depths=with_field("depths", v, CHAIN_DEPTHS), max_depth=3)), -1, -2,
     "tree.depths"),
    # draft trees
    ("root token min", jk.draft_tree,
     lambda v: dict(logits=torch.zeros(1, 2, 10), root_tokens=torch.tensor([v], dtype=I32), budget=8,
                    topk=2), 0, -1, "root_tokens"),
    ("topk token min", jk.draft_tree_from_topk,
     lambda v: dict(topk_tokens=torch.full((1, 2, 3), v, dtype=I32), topk_logprobs=topk_inputs()[1],
                    root_tokens=torch.zeros(1, dtype=I32), budget=8), 0, -1, "topk_tokens"),
    ("topk root min", jk.draft_tree_from_topk,
     lambda v: dict(zip(("topk_tokens", "topk_logprobs"), topk_inputs()),
                    root_tokens=torch.tensor([v], dtype=I64), budget=8), 0, -1, "root_tokens"),
    # commit_kv
    ("accept_len min", jk.commit_kv, lambda v: commit(accept=torch.tensor([2, v], dtype=I32)), 0, -1,
     "verdict.accept_len"),
    ("prefix min", jk.commit_kv, lambda v: commit(prefix=v), 0, -1, "prefix_lens"),
    # qk_norm_rope_append
    ("cache_start min", jk.qk_norm_rope_append,
     lambda v: rope(start=torch.tensor([0, v], dtype=I32)), 0, -1, "cache_start"),
]


@pytest.mark.usefixtures("stub_kernels")
@pytest.mark.parametrize("name,op,make,ok,bad,arg", LIMITS, ids=[c[0] for c in LIMITS])
def test_limit_exactly_and_one_past_on_the_other_side(name, op, make, ok, bad, arg):
    with pytest.raises(Dispatched):
        op(**make(ok))
    with pytest.raises(ValueError) as info:
        op(**make(bad))
    assert re.search(rf"(?<![.\w]){re.escape(arg)}(?![.\w])", str(info.value)), str(info.value)


@pytest.mark.usefixtures("stub_kernels")
@pytest.mark.parametrize("controls", [dict(top_p=1.0), dict(top_k=5),
                                      dict(top_p=torch.tensor([1.0, 1.0]), top_k=0)],
                         ids=["top_p_off", "top_k_alone", "top_p_tensor_ones"])
def test_top_p_vocabulary_limit_only_binds_top_p(controls):
    """Past top-p's vocabulary limit, a call without top-p on is taken (top-k has no vocabulary
    limit; top_p 1 is off) — except a top_p tensor, which may hold values below 1 on another
    call and is refused (the check is per call, not per value)."""
    call = lambda: jk.verify_tree(**sampled(v=MAX_TOP_P_VOCAB + 1, n=1, tree=tree(1), **controls))
    if isinstance(controls.get("top_p"), torch.Tensor):
        with pytest.raises(ValueError, match="target_logits"):
            call()
    else:
        with pytest.raises(Dispatched):
            call()


def test_top_k_past_int32_is_off_not_wrapped(monkeypatch):
    """top_k past int32 (a scalar, or an int64 tensor) reaches the kernels as INT32_MAX (keep all:
    k >= V), never as a wrapped negative or small k."""
    seen = []

    def select(device, fn, backend=None, call=None):
        def kernel(*args, **kwargs):
            seen.append(args[9])  # verify_tree's backends take top_k tenth
            raise Dispatched(fn)
        return kernel
    monkeypatch.setattr(bk, "select", select)
    for k in (INT32_MAX, INT32_MAX + 1, 2 ** 40):
        for given in (k, torch.tensor([3, k], dtype=I64)):
            with pytest.raises(Dispatched):
                jk.verify_tree(**sampled(top_k=given))
            got = seen.pop()
            assert got.dtype == I32 and int(got[-1]) == INT32_MAX, (given, got)
