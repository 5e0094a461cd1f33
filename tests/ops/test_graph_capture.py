"""Every public op captured in a CUDA graph on each GPU backend (cuda, triton), replayed on new
input values, equal to the same op run eagerly on those values (in-place caches included).

On the CPU (reference, and triton under the interpreter; reference on a GPU too) the "capture" is
a fake one: the op runs under bench/decode_round.HostReads(refuse=True) with value checks off, so
an op wrapper that reads a tensor value on the host (which a real capture refuses) fails here, and
the replay reruns it."""
import sys
from pathlib import Path

import pytest
import torch

import jetspec_kernels as jk
from helpers import backends, rel_l2

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.decode_round import HostReads  # noqa: E402

B, N, HQ, HKV, DH, L, V, D, K, H = 2, 24, 4, 2, 64, 64, 500, 4, 3, 64


class Captured:
    """``fn`` captured in a CUDA graph (``replay`` reruns it and returns the captured outputs), or,
    with ``graph=False`` (the CPU; the reference backend, which reads values on the host by
    design), run under a host-read guard that treats the kernels as opaque (``replay`` reruns it
    eagerly)."""

    def __init__(self, fn, graph):
        self.fn, self.cuda = fn, graph
        if not self.cuda:
            with HostReads(refuse=True):
                self.out = fn()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()                                   # warm-up: compilation, handles
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()

    def replay(self):
        if not self.cuda:
            return self.fn()
        self.graph.replay()
        torch.cuda.synchronize()
        return self.out


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _flat(y)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for y in vars(x).values() for t in _flat(y)]
    return []


def _same(got, want, what):
    for g, w in zip(_flat(got), _flat(want), strict=True):
        if g.is_floating_point():
            assert rel_l2(g.float(), w.float()) < 1e-6, what
        else:
            assert torch.equal(g.cpu(), w.cpu()), what


@pytest.fixture
def no_value_checks():
    jk.set_value_checks("never")
    yield
    jk.set_value_checks("cpu")


@backends("reference", "triton", "cuda")
def test_every_op_replays_from_a_graph(backend, dev, no_value_checks):
    name = backend.name
    dtype = torch.float16 if dev == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(11)

    def rnd(*shape, scale=1.0, dt=None):
        return (torch.randn(*shape, generator=gen) * scale).to(dt or dtype).to(dev)

    logits = rnd(B, D, V, scale=3.0, dt=torch.float32)
    hidden, lm_head = rnd(B, D, H), rnd(V, H, scale=0.2)
    root = torch.tensor([5, 9], dtype=torch.int32, device=dev)
    tree0 = jk.draft_tree(logits, root, budget=N, topk=K, backend=name)
    topk_lp, topk_tok = torch.log_softmax(logits, -1).topk(K, dim=-1)
    q, k, v = rnd(B, N, HQ, DH), rnd(B, N, HKV, DH), rnd(B, N, HKV, DH)
    kc, vc = rnd(B, L + N, HKV, DH), rnd(B, L + N, HKV, DH)
    qw, kw = rnd(DH, scale=0.1, dt=torch.float32) + 1, rnd(DH, scale=0.1, dt=torch.float32) + 1
    prefix = torch.tensor([L - 3, L - 20], dtype=torch.int32, device=dev)
    pos = tree0.positions(prefix)
    target = rnd(B, N, V, scale=3.0, dt=torch.float32)
    temp = torch.tensor([0.0, 0.9], device=dev)
    top_k = torch.tensor([7, 0], dtype=torch.int32, device=dev)     # per sequence, as decode passes
    top_p = torch.tensor([0.9, 1.0], device=dev)
    seed = torch.tensor([1, 2], dtype=torch.int64, device=dev)
    offset = torch.tensor([0, 4], dtype=torch.int64, device=dev)
    tree = tree0
    verdict = jk.verify_tree(tree, target, backend=name)
    stream, residual, norm_w = rnd(B, N, H), rnd(B, N, H), rnd(H, scale=0.1) + 1

    ops = {
        "pack_mask": lambda: jk.pack_mask(tree.parents, tree.num_nodes, backend=name),
        "draft_tree": lambda: jk.draft_tree(logits, root, budget=N, topk=K, backend=name),
        "draft_tree_from_topk": lambda: jk.draft_tree_from_topk(topk_tok, topk_lp, root, budget=N,
                                                                backend=name),
        "draft_tree_from_hidden": lambda: jk.draft_tree_from_hidden(hidden, lm_head, root, budget=N,
                                                                    topk=K, backend=name),
        "tree_attention": lambda: jk.tree_attention(q, kc, vc, prefix, tree.mask, backend=name),
        "qk_norm_rope_append": lambda: jk.qk_norm_rope_append(
            q, k, v, qw, kw, pos, kc, vc, rope_theta=1e6, cache_start=prefix, backend=name),
        "verify_tree greedy": lambda: jk.verify_tree(tree, target, backend=name),
        "verify_tree sampled": lambda: jk.verify_tree(tree, target, temperature=temp, seed=seed,
                                                      offset=offset, top_k=top_k, top_p=top_p, backend=name),
        "commit_kv": lambda: jk.commit_kv(kc, vc, prefix, verdict, backend=name),
        "rms_norm": lambda: jk.rms_norm(stream, norm_w, residual=residual, backend=name),
        "silu_mul": lambda: jk.silu_mul(stream, backend=name),
    }
    inputs = [logits, hidden, lm_head, q, k, v, kc, vc, target, stream, residual]
    for what, fn in ops.items():
        g = Captured(fn, graph=dev == "cuda" and name != "reference")
        for t in inputs:                           # new values in the same buffers
            t.copy_((torch.randn(t.shape, generator=gen) * 2).to(t.dtype))
        new_lp, new_tok = torch.log_softmax(logits, -1).topk(K, dim=-1)
        topk_lp.copy_(new_lp)
        topk_tok.copy_(new_tok)
        saved = kc.clone(), vc.clone()
        got = [t.clone() for t in _flat(g.replay())]
        got_caches = kc.clone(), vc.clone()
        kc.copy_(saved[0])
        vc.copy_(saved[1])
        want = fn()
        _same(got, want, what)
        _same(got_caches, (kc, vc), f"{what}: caches")


@backends("triton", "cuda")
@pytest.mark.gpu
@pytest.mark.xfail(reason="verify_tree turns a Python top_p < 1 into a CPU tensor and copies it to the "
                   "GPU (ops/verify_tree.check_sampling): a host-to-device copy, refused during "
                   "capture; decode passes per-sequence tensors. Expected to fail until fixed",
                   strict=False)
def test_python_number_filters_capture(backend, dev, no_value_checks):
    """verify_tree with top_k / top_p given as Python numbers, captured in a CUDA graph."""
    gen = torch.Generator().manual_seed(12)
    logits = (torch.randn(B, D, V, generator=gen) * 3).to(dev)
    root = torch.tensor([5, 9], dtype=torch.int32, device=dev)
    tree = jk.draft_tree(logits, root, budget=N, topk=K, backend=backend.name)
    target = (torch.randn(B, N, V, generator=gen) * 3).to(dev)
    seed = torch.tensor([1, 2], dtype=torch.int64, device=dev)
    offset = torch.tensor([0, 4], dtype=torch.int64, device=dev)
    Captured(lambda: jk.verify_tree(tree, target, temperature=0.8, seed=seed, offset=offset,
                                    top_k=7, top_p=0.9, backend=backend.name), graph=True)
