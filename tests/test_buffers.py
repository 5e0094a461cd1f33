"""jetspec_kernels/buffers.py: an op's outputs and workspaces in one allocation (issue 27), and the
cuda ops that use it (on the simulator): their outputs are disjoint, contiguous views of one
buffer that holds nothing but them."""
import pytest
import torch

from jetspec_kernels import buffers
from helpers import cu, use_sim

I32, F32, I64, U8 = torch.int32, torch.float32, torch.int64, torch.uint8


def test_layout_aligns_each_part():
    lay = buffers.layout(((3,), U8), ((2, 5), F32), ((1,), I64), ((7,), I32))
    assert [p.offset for p in lay.parts] == [0, 16, 64, 80]
    assert lay.nbytes == 112 and lay.nbytes % buffers.ALIGN == 0
    assert [p.strides for p in lay.parts] == [(1,), (5, 1), (1,), (1,)]
    packed = buffers.layout(((3,), I32), ((2, 5), F32), ((1,), I64), align=buffers.PACKED)
    assert [p.offset for p in packed.parts] == [0, 12, 56]     # int64: its own 8 bytes
    assert packed.nbytes == 64


def test_layout_is_cached_per_shapes_and_dtypes():
    a = buffers.layout(((4, 4), I32), ((4,), F32))
    assert buffers.layout(((4, 4), I32), ((4,), F32)) is a
    assert buffers.layout(((4, 4), I32), ((4,), I32)) is not a
    assert buffers.layout(((4, 4), I32), ((4,), F32), align=4) is not a
    # Unhashable sizes (symbolic ones under torch.compile) are laid out without the cache.
    assert buffers.layout(([4, 4], I32), ([4], F32)) == a


def test_carve_gives_disjoint_contiguous_views():
    lay = buffers.layout(((2, 3), I32), ((5,), F32), ((2, 2, 2), I32), align=buffers.PACKED)
    buf = buffers.empty(lay, "cpu")
    views = buffers.carve(buf, lay)
    assert [v.shape for v in views] == [(2, 3), (5,), (2, 2, 2)]
    assert [v.dtype for v in views] == [I32, F32, I32]
    assert all(v.is_contiguous() for v in views)
    assert all(v.untyped_storage().data_ptr() == buf.data_ptr() for v in views)
    assert [v.data_ptr() for v in views] == buffers.addresses(buf, lay)
    assert sum(v.nbytes for v in views) == lay.nbytes      # packed: no padding
    for i, v in enumerate(views):    # a write to one view reaches no other
        for w in views:
            w.zero_()
        v.fill_(7)
        assert all(not w.any() for j, w in enumerate(views) if j != i)
    assert len(buffers.carve(buf, lay, 2)) == 2


def _owned_views(outputs):
    """The outputs share one storage, do not overlap, are contiguous and cover it exactly."""
    storage = outputs[0].untyped_storage()
    assert all(o.untyped_storage().data_ptr() == storage.data_ptr() for o in outputs)
    assert all(o.is_contiguous() for o in outputs)
    spans = sorted((o.data_ptr(), o.data_ptr() + o.nbytes) for o in outputs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    for o in outputs:
        o.fill_(-3)
    snapshot = [o.clone() for o in outputs]
    for i, o in enumerate(outputs):
        o.fill_(5)
        assert all(torch.equal(p, s) for j, (p, s) in enumerate(zip(outputs, snapshot)) if j != i)
        o.copy_(snapshot[i])


@pytest.mark.parametrize("b,budget", [(1, 20), (3, 7)])
def test_cuda_op_outputs_share_one_buffer(monkeypatch, b, budget):
    """log_softmax_topk, build_tree and verify_tree on the simulator: each call's outputs are
    views of one allocation (the ops return it; the wrappers carve it), and the values match the
    same call's separate-tensor reference (tests/ops hold the parity against python_ref)."""
    from jetspec_kernels import python_ref as ref

    use_sim(monkeypatch)
    gen = torch.Generator().manual_seed(b)
    logits = torch.randn(b, 3, 300, generator=gen)
    root = torch.arange(b, dtype=I32)
    tt, tl = cu().log_softmax_topk(logits, 4)
    want = torch.log_softmax(logits, -1).topk(4, -1)
    assert torch.equal(tt.long(), want.indices) and torch.allclose(tl, want.values, atol=1e-5)
    _owned_views([tt, tl])

    tt, tl = cu().log_softmax_topk(logits, 4)
    tree = cu().build_tree(tt, tl, root, budget, "topn")
    expect = ref.build_tree(tt, tl, root, budget, "topn")
    for name, got in zip(("tokens", "parents", "depths", "scores", "num_nodes", "mask"), tree):
        assert torch.equal(got, expect[name].to(got.dtype)), name
    _owned_views(list(tree))

    tree = cu().build_tree(tt, tl, root, budget, "topn")
    tlog = torch.randn(b, budget, 300, generator=gen)
    verdict = cu().verify_tree(tree[0], tree[1], tree[4], 3, tlog, None, 0.0, None, None)
    assert [v.shape for v in verdict] == [(b,), (b, 4), (b,), (b, 4)]
    again = cu().verify_tree(tree[0], tree[1], tree[4], 3, None, tlog.argmax(-1).to(I32), 0.0,
                             None, None)
    assert all(torch.equal(x, y) for x, y in zip(verdict, again))
    _owned_views(list(verdict))
