"""python_ref draft_tree is log_softmax_topk then build_tree."""

import torch

from jetspec_kernels import python_ref as R


def test_draft_tree_is_topk_then_build():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 30, generator=g)
    roots = torch.tensor([1, 2], dtype=torch.int32)
    for alg in ("topn", "accum_logp"):
        t1 = R.draft_tree(logits, roots, 20, 3, alg)
        tt, tl = R.log_softmax_topk(logits, 3)
        t2 = R.build_tree(tt, tl, roots, 20, alg)
        for k in t1:
            assert torch.equal(t1[k], t2[k]), k
