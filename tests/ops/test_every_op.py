"""Checks across the cuda ops: torch.library.opcheck of each (simulator and GPU), launches on a
device that is not current, and CUDA-graph capture and replay (gpu)."""
import pytest
import torch

from jetspec_kernels import python_ref as ref
from jetspec_kernels.ops.draft_tree import checked_topk
from helpers import TOL, backends, cu, rel_l2


def _round_inputs(dev, gen):
    """Small inputs of every op of a round: q [1, 16, 4, 64] and a 64-row K/V cache (fp16),
    prefix, out, lse, logits [2, 3, 5000], hidden [2, 3, 64], root tokens [2]."""
    b, n, hq, hkv, dh = 1, 16, 4, 2, 64
    q = torch.randn(b, n, hq, dh, generator=gen).half().to(dev)
    kc = torch.randn(b, 64, hkv, dh, generator=gen).half().to(dev)
    vc = torch.randn(b, 64, hkv, dh, generator=gen).half().to(dev)
    prefix = torch.tensor([20], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, n, device=dev)
    logits = torch.randn(2, 3, 5000, generator=gen).to(dev)
    hid = torch.randn(2, 3, 64, generator=gen).half().to(dev)
    root = torch.tensor([1, 2], dtype=torch.int32, device=dev)
    return q, kc, vc, prefix, out, lse, logits, hid, root


@backends("sim", "cuda")
def test_opcheck(dev):
    """torch.library.opcheck of every op: schema (declared mutations), fake implementations
    against the real outputs, autograd registration and AOT dispatch."""
    from torch.library import opcheck

    gen = torch.Generator().manual_seed(1)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs(dev, gen)
    b, n, _, dh = q.shape
    hkv = kc.shape[2]
    for name, kernel in cu().extension.enum("AttnKernel").items():
        if name != "hopper":  # test_opcheck_hopper: a TMA fault must not take the others with it
            opcheck(torch.ops.jetspec.tree_attention.default,
                    (q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, 2, kernel))
    opcheck(torch.ops.jetspec.log_softmax_topk.default, (logits, 4))
    tt, tl = cu().log_softmax_topk(logits, 4)
    opcheck(torch.ops.jetspec.build_tree.default, (tt, tl, root, 20, "topn"))
    opcheck(torch.ops.jetspec.draft_tree.default, (logits, 4, root, 20, "accum_logp"))
    tree = cu().build_tree(tt, tl, root, 20, "topn")
    tlog = torch.randn(2, 20, 300, generator=gen).to(dev)
    opcheck(torch.ops.jetspec.verify_tree.default,
            (tree[0], tree[1], tree[4], 3, tlog, None, None, None, None, None, None))
    i64 = dict(dtype=torch.int64, device=dev)
    opcheck(torch.ops.jetspec.verify_tree.default,  # per-sequence temperature, top-k and top-p
            (tree[0], tree[1], tree[4], 3, tlog, None, torch.tensor([0.0, 0.8], device=dev),
             torch.tensor([1, 2], **i64), torch.tensor([0, 3], **i64),
             torch.tensor([0, 5], dtype=torch.int32, device=dev),
             torch.tensor([0.9, 0.5], device=dev)))
    kn = torch.randn(b, n, hkv, dh, generator=gen).half().to(dev)
    kv_ = torch.randn(b, n, hkv, dh, generator=gen).half().to(dev)
    w = torch.ones(dh, device=dev)
    pos = torch.arange(n, dtype=torch.int32, device=dev)[None]
    opcheck(torch.ops.jetspec.qk_norm_rope_append.default,
            (q, kn, kv_, w, w, pos, kc, vc, 1e6, 1e-6, None, None))
    # a heads-major q ([B, Hq, N, Dh] storage): q_out is contiguous whatever q's strides
    q_heads_major = q.transpose(1, 2).contiguous().transpose(1, 2)
    opcheck(torch.ops.jetspec.qk_norm_rope_append.default,
            (q_heads_major, kn, kv_, w, w, pos, kc, vc, 1e6, 1e-6, None, None))
    path = torch.tensor([[0, 2, 3]], dtype=torch.int32, device=dev)
    acc = torch.tensor([2], dtype=torch.int32, device=dev)
    opcheck(torch.ops.jetspec.commit_kv.default, (kc, vc, prefix, path, acc, None, None))
    xs = torch.randn(5, 96, generator=gen).half().to(dev)
    nw = torch.randn(96, generator=gen).half().to(dev)
    opcheck(torch.ops.jetspec.rms_norm.default, (xs, xs.flip(0), nw, 1e-6))
    opcheck(torch.ops.jetspec.rms_norm.default, (xs, None, nw, 1e-6))
    opcheck(torch.ops.jetspec.silu_mul.default, (xs,))


@backends("cuda")
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_ops_on_a_device_that_is_not_current():
    """Tensors on cuda:1 while cuda:0 is current: every op launches on its tensors' device (the
    CPU tests check that every _C call sits inside ext.on_device; this checks it on hardware)."""
    gen = torch.Generator().manual_seed(3)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs("cuda:1", gen)
    lm_head = torch.randn(700, 64, generator=gen).half().to("cuda:1")
    tlog = torch.randn(2, 20, 300, generator=gen).to("cuda:1")

    def round_outputs():
        o = torch.empty_like(out)
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, o, None, 2, None)
        tt, tl = cu().log_softmax_topk(logits, 4)
        ht, hl = checked_topk(hid, lm_head, root, budget=20, topk=4, algorithm="topn",
                              backend="cuda")   # cuBLAS, then the cuda top-K
        tree = cu().build_tree(tt, tl, root, 20, "topn")
        chained = cu().draft_tree(logits, 4, root, 20, "topn")
        acc = cu().verify_tree(tree[0], tree[1], tree[4], 3, tlog, None, 0.0, None, None)
        mask = cu().pack_mask(tree[1], tree[4])
        return [o, tt, tl, ht, hl, *tree, *chained, *acc, mask]

    with torch.cuda.device(1):
        want = round_outputs()
    with torch.cuda.device(0):
        got = round_outputs()
    torch.cuda.synchronize(1)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device == torch.device("cuda:1") and torch.equal(g, w), i


def _hopper_inputs(dev, gen, n):
    """_round_inputs' attention tensors with n tree rows: 2n packed rows per kv head, so n = 40
    runs the hopper kernel's wide variant (two consumer warpgroups) and n = 16 its small one."""
    _, kc, vc, prefix, _, _ = _round_inputs(dev, gen)[:6]
    q = torch.randn(1, n, 4, 64, generator=gen).half().to(dev)
    return q, kc, vc, prefix, torch.empty_like(q), torch.empty(1, 4, n, device=dev)


@backends("sim", "cuda")
@pytest.mark.parametrize("n", [16, 40])
def test_opcheck_hopper(dev, n):
    """opcheck of tree_attention with the hopper kernel (its own test, so that on a GPU a fault in
    its TMA copies cannot break the CUDA context of the other ops' checks; device_check.sh runs it
    apart)."""
    from torch.library import opcheck

    q, kc, vc, prefix, out, lse = _hopper_inputs(dev, torch.Generator().manual_seed(1), n)
    opcheck(torch.ops.jetspec.tree_attention.default,
            (q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, 2,
             cu().extension.enum("AttnKernel")["hopper"]))


def _capture(fn):
    """Runs fn once on a side stream (warm-up, as CUDA-graph capture needs), then captures it:
    returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    return g, result


@backends("cuda")
@pytest.mark.gpu
@pytest.mark.parametrize("n", [16, 40])
def test_graph_replay_hopper(dev, n):
    """The hopper kernel under CUDA-graph capture: its tensor maps are kernel parameters, captured
    by value; replay on new q and cache contents (same buffers)."""
    gen = torch.Generator().manual_seed(2)
    q, kc, vc, prefix, out, lse = _hopper_inputs(dev, gen, n)

    def run():
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, out, lse,
                            num_splits=2, kernel="hopper")

    g, _ = _capture(run)
    for t in (q, kc, vc):
        t.copy_(torch.randn(t.shape, generator=gen).half())
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    o_ref, l_ref = ref.tree_attention(q.double().cpu(), kc.double().cpu(), vc.double().cpu(),
                                      prefix.cpu(), None, "causal", None, 0.125)
    assert rel_l2(out, o_ref) < TOL[torch.float16] and rel_l2(lse, l_ref) < TOL[torch.float16]


@backends("cuda")
@pytest.mark.gpu
def test_graph_replay(dev):
    gen = torch.Generator().manual_seed(1)
    q, kc, vc, prefix, out, lse, logits, hid, root = _round_inputs(dev, gen)

    # CUDA graph: capture draft tree (from logits and from hidden states), verification
    # attention and verify_tree; replay on new inputs.
    w_head = torch.randn(700, 64, generator=gen).half().to(dev)
    tlog1 = torch.randn(2, 20, 9000, generator=gen).to(dev)  # B*N = 40 rows: vocab splits

    def round_():
        cu().tree_attention(q, kc, vc, prefix, None, "causal", None, 0.125, out, lse, num_splits=2)
        t = cu().build_tree(*cu().log_softmax_topk(logits, 4), root, 20, "topn")
        th = cu().build_tree(*checked_topk(hid, w_head, root, budget=20, topk=4,
                                           algorithm="topn", backend="cuda"), root, 20, "topn")
        chained = cu().draft_tree(logits, 4, root, 20, "topn")   # the same two kernels, one op
        return t, th, chained, cu().verify_tree(t[0], t[1], t[4], 3, tlog1, None, 0.0, None, None)

    g, (t_graph, th_graph, chained, verdict) = _capture(round_)
    q.copy_(torch.randn(q.shape, generator=gen).half())
    logits.copy_(torch.randn(logits.shape, generator=gen))
    hid.copy_(torch.randn(hid.shape, generator=gen).half())
    tlog1.copy_(torch.randn(tlog1.shape, generator=gen))
    g.replay()
    torch.cuda.synchronize()
    want_h = ref.draft_tree((hid.double() @ w_head.double().T).cpu(), root.cpu(), 20, 4, "topn")
    assert torch.equal(th_graph[0].cpu(), want_h["tokens"].cpu())
    want_v = ref.verify_tree(t_graph[0].cpu(), t_graph[1].cpu(), t_graph[4].cpu(), 3,
                             target_logits=tlog1.cpu())
    for key, got_v in zip(("accept_len", "path", "bonus", "emitted"), verdict):
        assert torch.equal(got_v.cpu(), want_v[key].cpu()), key
    o_ref, _ = ref.tree_attention(q.double().cpu(), kc.double().cpu(), vc.double().cpu(),
                                  prefix.cpu(), None, "causal", None, 0.125)
    assert rel_l2(out, o_ref) < TOL[torch.float16]
    want = ref.draft_tree(logits.cpu(), root.cpu(), 20, 4, "topn")
    assert torch.equal(t_graph[0].cpu(), want["tokens"].cpu())
    assert torch.equal(t_graph[1].cpu(), want["parents"].cpu())
    for i, (c, t) in enumerate(zip(chained, t_graph)):
        assert torch.equal(c, t), i


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_graph_replay_hidden_topk_gemm(dtype):
    """draft_tree_from_hidden's gemm method (cuBLAS into float32 logits, then log_softmax_topk)
    has no host sync: captured, it replays on new hidden states."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    hidden = torch.randn(4, 15, 256, device="cuda", generator=gen).to(dtype)
    weight = (torch.randn(5003, 256, device="cuda", generator=gen) / 16).to(dtype)
    root = torch.zeros(4, dtype=torch.int32, device="cuda")
    g, (tokens, logprobs) = _capture(lambda: checked_topk(
        hidden, weight, root, budget=16, topk=8, algorithm="topn", method="gemm"))
    g.replay()
    before = tokens.clone()
    hidden.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    want_t, want_l = ref.log_softmax_topk(hidden.double() @ weight.double().T, 8)
    assert torch.equal(tokens.long(), want_t) and not torch.equal(tokens, before)
    assert rel_l2(logprobs, want_l) < TOL[torch.float32]
