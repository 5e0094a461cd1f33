"""The public API on the reference backend: output types, dtypes, in-place outputs, and a full round."""
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref

I32 = torch.int32


def test_draft_tree_paths_agree():
    g = torch.Generator().manual_seed(1)
    b, d, v, h = 2, 5, 64, 16
    hidden = torch.randn(b, d, h, generator=g)
    w = torch.randn(v, h, generator=g)
    roots = torch.tensor([3, 9], dtype=I32)
    logits = hidden @ w.T
    t1 = jk.draft_tree(logits, roots, budget=20, topk=3, backend="reference")
    t2 = jk.draft_tree_from_hidden(hidden, w, roots, budget=20, topk=3, backend="reference")
    tk, lp = ref.log_softmax_topk(logits, 3)
    t3 = jk.draft_tree_from_topk(tk, lp.float(), roots.long(), budget=20, backend="reference")
    for t in (t1, t2, t3):
        assert t.max_depth == min(d, 19) and t.capacity == 20
        assert t.tokens.dtype == t.parents.dtype == t.depths.dtype == t.num_nodes.dtype == t.mask.dtype == I32
        assert t.scores.dtype == torch.float32
        assert torch.equal(t.tokens[:, 0], roots)
    for f in ("tokens", "parents", "depths", "num_nodes", "mask"):
        assert torch.equal(getattr(t1, f), getattr(t2, f)) and torch.equal(getattr(t1, f), getattr(t3, f))


def test_tree_attention_out_and_lse():
    g = torch.Generator().manual_seed(2)
    b, n, hq, hkv, dh, L = 2, 6, 4, 2, 16, 20
    q = torch.randn(b, n, hq, dh, generator=g, dtype=torch.float16)
    kc = torch.randn(b, L, hkv, dh, generator=g, dtype=torch.float16)
    vc = torch.randn(b, L, hkv, dh, generator=g, dtype=torch.float16)
    prefix = torch.tensor([3, 14], dtype=I32)
    out = torch.full_like(q, float("nan"))
    lse_buf = torch.full((b, hq, n), float("nan"))
    res, lse = jk.tree_attention(q, kc, vc, prefix, tail="full", out=out, lse=lse_buf, backend="reference")
    assert lse is lse_buf
    assert res is out and out.dtype == torch.float16 and torch.isfinite(out).all()
    assert lse.shape == (b, hq, n) and lse.dtype == torch.float32
    o64, l64 = ref.tree_attention(q.double(), kc.double(), vc.double(), prefix, None, "full")
    assert ((out.double() - o64).norm() / o64.norm()) < 2e-3
    assert torch.allclose(lse.double(), l64, atol=1e-3)


def test_round_on_reference_backend_moves_the_accepted_kv():
    g = torch.Generator().manual_seed(3)
    b, d, v, n, hq, hkv, dh, L = 2, 4, 30, 12, 2, 1, 8, 40
    tree = jk.draft_tree(torch.randn(b, d, v, generator=g) * 3, torch.tensor([1, 2], dtype=I32),
                         budget=n, topk=3, backend="reference")
    prefix = torch.tensor([5, 17], dtype=I32)
    kc = torch.zeros(b, L, hkv, dh)
    vc = torch.zeros(b, L, hkv, dh)
    q = torch.randn(b, n, hq, dh, generator=g)
    k = torch.randn(b, n, hkv, dh, generator=g)
    vv = torch.randn(b, n, hkv, dh, generator=g)
    w = torch.ones(dh)
    q_out = jk.qk_norm_rope_append(q, k, vv, w, w, tree.positions(prefix), kc, vc, rope_theta=1e4,
                                   cache_start=prefix, backend="reference")
    assert q_out.shape == q.shape
    for bb in range(b):
        assert torch.equal(vc[bb, prefix[bb]:prefix[bb] + n], vv[bb])
    # target that agrees with node 1's token at the root, then stops
    tl = torch.randn(b, n, v, generator=g)
    tl[:, 0, :] = -10
    tl[torch.arange(b), 0, tree.tokens[:, 1].long()] = 10
    verdict = jk.verify_tree(tree, tl, backend="reference")
    assert verdict.path.shape == (b, tree.max_depth + 1) and torch.all(verdict.accept_len >= 1)
    before = vc.clone()
    hidden = torch.randn(b, n, 5, generator=g)
    commit = jk.commit_kv(kc, vc, prefix, verdict, hidden=hidden, backend="reference")
    assert torch.equal(commit.prefix_lens, prefix + verdict.accept_len + 1)
    for bb in range(b):
        for i in range(int(verdict.accept_len[bb]) + 1):
            src = int(prefix[bb]) + int(verdict.path[bb, i])
            assert torch.equal(vc[bb, int(prefix[bb]) + i], before[bb, src])
            assert torch.equal(commit.hidden[bb, i], hidden[bb, verdict.path[bb, i]])
        assert torch.all(commit.hidden[bb, int(verdict.accept_len[bb]) + 1:] == 0)


def test_sampling_accepts_int_seeds_and_is_deterministic():
    tree = jk.draft_tree(torch.randn(2, 3, 20), torch.tensor([0, 1], dtype=I32), budget=8, topk=2,
                         backend="reference")
    tl = torch.randn(2, 8, 20)
    a = jk.verify_tree(tree, tl, temperature=0.7, seed=5, offset=torch.tensor(9), backend="reference")
    b = jk.verify_tree(tree, tl, temperature=0.7, seed=torch.tensor([5, 5]), offset=9, backend="reference")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_demo_runs(capsys):
    from jetspec_kernels.demo import main
    assert main(["--random-round", "--backend", "reference", "--batch", "3", "--prefix", "40",
                 "--vocab", "999", "--budget", "37", "--heads", "4", "2", "16"]) == 0
    text = capsys.readouterr().out
    assert "tree 0: 37 nodes" in text and "round total" in text and "finite: True" in text
