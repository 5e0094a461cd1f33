"""Integer dtypes an engine passes in: lengths, positions, cache slots and root tokens
(prefix_lens, cache_start, positions, root_tokens) as int64 give what int32 gives on every
backend, through a whole round; values past int32 are refused naming the argument (where value
checks run); the tensors the package makes (Tree, masks, Verdict) and block_table stay int32."""
import pytest
import torch

import jetspec_kernels as jk
from helpers import api_backend, backends

B, N, HQ, HKV, DH, L, V, K, D = 2, 8, 4, 2, 64, 128, 40, 3, 4
I64 = torch.int64


def _round(backend, dev, idx_dtype):
    """A round with the README tour's natural index tensors (torch.tensor([37, 100]) is int64)
    in ``idx_dtype``: draft_tree -> positions -> qk_norm_rope_append -> tree_attention ->
    verify_tree -> commit_kv. Returns every output and the caches."""
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g).half().to(dev)  # noqa: E731 (cuda: fp16/bf16)
    kw = dict(backend=api_backend(backend))
    prefix = torch.tensor([37, 100], dtype=idx_dtype, device=dev)
    root = torch.tensor([3, 17], dtype=idx_dtype, device=dev)
    kc, vc = r(B, L, HKV, DH), r(B, L, HKV, DH)
    tree = jk.draft_tree(r(B, D, V).float(), root, budget=N, topk=K, **kw)
    pos = tree.positions(prefix)
    q = jk.qk_norm_rope_append(r(B, N, HQ, DH), r(B, N, HKV, DH), r(B, N, HKV, DH), r(DH), r(DH),
                               pos.to(idx_dtype), kc, vc, rope_theta=1e4, cache_start=prefix, **kw)
    out = jk.tree_attention(q, kc, vc, prefix, tree.mask, **kw)
    verdict = jk.verify_tree(tree, r(B, N, V).float(), **kw)
    commit = jk.commit_kv(kc, vc, prefix, verdict, **kw)
    return [tree.tokens, tree.mask, pos, q, out, *verdict, commit.prefix_lens, kc, vc]


@backends("reference", "triton", "sim", "cuda")
def test_int64_lengths_positions_and_tokens_give_the_int32_round(backend, dev):
    got = _round(backend, dev, I64)
    want = _round(backend, dev, torch.int32)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
    assert got[2].dtype == torch.int32 and got[-3].dtype == torch.int32  # positions, new lens


@backends("reference", "triton", "sim")
def test_int64_values_past_int32_are_refused_naming_the_argument(backend, dev):
    kw = dict(backend=api_backend(backend))
    big = 2**32 + 5   # narrowed to int32 it would be 5, a valid length
    q, kc, vc = (torch.randn(B, N, HQ, DH), torch.randn(B, L, HKV, DH), torch.randn(B, L, HKV, DH))
    prefix = torch.tensor([big, 0], dtype=I64)
    with pytest.raises(ValueError, match="prefix_lens"):
        jk.tree_attention(q, kc, vc, prefix, **kw)
    tree = jk.draft_tree(torch.randn(B, D, V), torch.tensor([1, 2]), budget=N, topk=K, **kw)
    with pytest.raises(ValueError, match="prefix_lens"):
        tree.positions(prefix)
    pos = torch.zeros(B, N, dtype=I64)
    k, w = torch.randn(B, N, HKV, DH), torch.ones(DH)
    with pytest.raises(ValueError, match="cache_start"):
        jk.qk_norm_rope_append(q, k, k, w, w, pos, kc, vc, rope_theta=1e4, cache_start=prefix, **kw)
    with pytest.raises(ValueError, match="positions"):
        jk.qk_norm_rope_append(q, k, k, w, w, pos + big, kc, vc, rope_theta=1e4,
                               cache_start=torch.zeros(B, dtype=I64), **kw)
    with pytest.raises(ValueError, match="root_tokens"):
        jk.draft_tree(torch.randn(B, D, V), torch.tensor([big, 1]), budget=N, topk=K, **kw)
    verdict = jk.verify_tree(tree, torch.randn(B, N, V), **kw)
    with pytest.raises(ValueError, match="prefix_lens"):
        jk.commit_kv(kc, vc, prefix, verdict, **kw)


@backends("reference")
def test_other_integer_dtypes_and_package_made_tensors_stay_refused(backend, dev):
    """int16 lengths, and int64 where the package made the tensor (a mask) or an engine's page
    table (block_table) is int32 everywhere: TypeError naming the argument."""
    q, kc, vc = (torch.randn(B, N, HQ, DH), torch.randn(B, L, HKV, DH), torch.randn(B, L, HKV, DH))
    prefix = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="prefix_lens"):
        jk.tree_attention(q, kc, vc, prefix.to(torch.int16))
    tree = jk.draft_tree(torch.randn(B, D, V), prefix, budget=N, topk=K)
    with pytest.raises(TypeError, match="tree_mask"):
        jk.tree_attention(q, kc, vc, prefix, tree.mask.long())
    with pytest.raises(TypeError, match="block_table"):
        jk.tree_attention(q, kc.view(-1, 16, HKV, DH), vc.view(-1, 16, HKV, DH), prefix,
                          block_table=torch.arange(2 * L // 16).view(B, -1))
