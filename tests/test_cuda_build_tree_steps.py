"""The CUDA topn build_tree's step count against tests/tree_steps_model.py.

A bound made stricter (or a wrong heap minimum, or a smaller window) still builds the right
tree, only in more steps, so parity tests cannot see it; this test can. It calls ``_C.build_tree``
directly with its test-only ``steps`` output ([B] int32), on the simulator (and a GPU if any).
"""
import shutil

import pytest
import torch

from jetspec_kernels import python_ref as ref
from helpers import sim_module
from tree_steps_model import topn_steps

FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes", "mask")


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu), "sim"])
def backend(request):
    """(the _C module, the device of its tensors, its stream handle)."""
    if request.param == "cuda":
        from jetspec_kernels import _C
        return _C, "cuda", torch.cuda.current_stream().cuda_stream
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module(), "cpu", 0


def run_build_tree(backend, lp, budget, algorithm=0):
    """lp float32 [B, D, K] -> (the tree's six outputs as in python_ref, steps int32 [B])."""
    C, dev, stream = backend
    b, d, k = lp.shape
    w = (budget + 31) // 32
    tt = torch.arange(b * d * k, dtype=torch.int32).reshape(b, d, k).to(dev)
    tl = lp.to(dev).contiguous()
    root = torch.arange(b, dtype=torch.int32).to(dev)
    outs = [torch.full((b, budget), -7, dtype=torch.int32, device=dev) for _ in range(3)]
    outs += [torch.full((b, budget), float("nan"), device=dev),
             torch.full((b,), -7, dtype=torch.int32, device=dev),
             torch.full((b, budget, w), -7, dtype=torch.int32, device=dev)]
    steps = torch.full((b,), -7, dtype=torch.int32, device=dev)
    C.build_tree(*(t.data_ptr() for t in (tt, tl, root, *outs)), b, d, k, budget, w, algorithm,
                 stream, steps=steps.data_ptr())
    if dev == "cuda":
        torch.cuda.synchronize()
    got = dict(zip(FIELDS, (t.cpu() for t in outs)))
    want = ref.build_tree(tt.cpu(), lp, root.cpu(), budget, ("topn", "accum_logp")[algorithm])
    for key in FIELDS:
        assert torch.equal(got[key], want[key].to(got[key].dtype)), key
    return steps.cpu()


def log_probs(gen, d, k, kind):
    """float32 [D, K], sorted descending: random logits, a near-uniform top-K (flat: children
    behind the window beat every grandchild, so the hidden-child bound decides), a 0.25 grid
    (ties), or a grid whose upper half of ranks is -inf."""
    if kind == "logits":
        scale = torch.linspace(6, 2, d)[:, None]
        lp = torch.log_softmax(torch.randn(d, max(k, 64), generator=gen) * scale, -1)
    elif kind == "flat":
        lp = torch.log_softmax(torch.randn(d, k, generator=gen) * 0.3, -1)
    else:
        lp = -(torch.rand(d, k, generator=gen) * 12).round() * 0.25
        if kind == "inf":
            lp[:, k // 2 + 1:] = float("-inf")
    return lp.sort(-1, descending=True).values[:, :k].contiguous()


KINDS = ("logits", "flat", "ties", "inf")


def configs():
    """(D, K, budget) of awkward sizes; K > 8 (12, 20) has children behind the window."""
    gen = torch.Generator().manual_seed(7)
    out = [(15, 8, 256), (15, 12, 256), (15, 20, 100), (1, 1, 1), (15, 1, 17), (2, 3, 17),
           (3, 2, 256), (15, 2, 256), (4, 5, 64)]
    for _ in range(16):
        d = int(torch.randint(1, 16, (1,), generator=gen))
        k = (1, 2, 3, 5, 8, 12, 20)[int(torch.randint(0, 7, (1,), generator=gen))]
        budget = (1, 2, 17, 64, 100, 256)[int(torch.randint(0, 6, (1,), generator=gen))]
        out.append((d, k, budget))
    return out


@pytest.mark.parametrize("d,k,budget", configs())
def test_topn_steps_match_model(backend, d, k, budget):
    gen = torch.Generator().manual_seed(1000 * d + 10 * k + budget)
    lp = torch.stack([log_probs(gen, d, k, kind) for kind in KINDS])
    steps = run_build_tree(backend, lp, budget)
    want = [topn_steps(lp[i].numpy(), budget) for i in range(len(KINDS))]
    assert steps.tolist() == want, dict(zip(KINDS, want))


def test_accum_logp_leaves_steps_unwritten(backend):
    lp = torch.stack([log_probs(torch.Generator().manual_seed(0), 4, 3, "ties")])
    assert run_build_tree(backend, lp, 20, algorithm=1).tolist() == [-7]
