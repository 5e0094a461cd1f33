"""The Python/C++ boundary: ``_C``'s launchers take named, typed arguments (each launcher's
field list in params.h), the cuda wrappers pass exactly those, ``_C``'s enums and limits are the
ones Python uses, and each backend's ``supports`` answers what it can run."""
import shutil

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as bk
from jetspec_kernels import device_guard
from jetspec_kernels import limits, python_ref
from helpers import cu, sim_module, use_sim


@pytest.fixture
def sim():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module()


def test_python_enums_and_limits_are_C_s(sim):
    """limits.py (the contract limits ops check without _C) and every enum/limit the cuda
    backend reads agree with limits.h as _C exports it."""
    from jetspec_kernels.cuda import extension as ext
    from jetspec_kernels.ops import draft_tree, tree_attention
    for module in (sim, pytest.importorskip("jetspec_kernels._C")):
        assert module.LIMITS["max_budget"] == limits.MAX_BUDGET == draft_tree.MAX_BUDGET
        assert module.LIMITS["max_topk"] == limits.MAX_TOPK == draft_tree.MAX_TOPK
        assert module.LIMITS["top_p_max_vocab"] == python_ref.sampling.MAX_TOP_P_VOCAB
        assert module.ENUMS["TreeAlgorithm"] == {name: i for i, name in
                                                 enumerate(draft_tree.ALGORITHMS)}
        assert set(module.ENUMS["AttnTail"]) == {"mask", *tree_attention.TAILS}
        assert module.ENUMS["DType"] == {"float32": 0, "float16": 1, "bfloat16": 2}
        for name, values in module.ENUMS.items():  # the py::enum_ types carry the same codes
            assert {k: int(v) for k, v in getattr(module, name).__members__.items()} == values
    kernels = {"auto": 0, "mma": 1, "wgmma": 2, "hopper": 4}   # 3: a retired kernel's code
    assert sim.ENUMS["AttnKernel"] == kernels
    C = pytest.importorskip("jetspec_kernels._C")
    assert ext.enum("AttnKernel") == C.ENUMS["AttnKernel"] == kernels
    assert ext.limit("wgmma_head_dims") == C.LIMITS["wgmma_head_dims"] == (64, 128)
    assert ext.limit("walk_max_nodes") == C.LIMITS["walk_max_nodes"] == 4096
    assert ext.dtype_code(torch.empty(0, dtype=torch.bfloat16)) == 2


class Recorder:
    """Stands in for ``_C``: records, per launcher, each call's positional count and keywords."""

    def __init__(self, module):
        self.module, self.calls = module, {}

    def __getattr__(self, name):
        fn = getattr(self.module, name)
        if name not in self.module.FIELDS:
            return fn

        def call(*args, **kwargs):
            self.calls.setdefault(name, []).append((len(args), set(kwargs)))
            return fn(*args, **kwargs)
        return call


def call_every_wrapper():
    """Runs every cuda wrapper (jetspec_kernels.cuda) on small CPU tensors, each _C path once."""
    c = cu()
    gen = torch.Generator().manual_seed(0)
    h, i32 = torch.float16, torch.int32
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=i32)
    num_nodes = torch.tensor([4], dtype=i32)
    c.pack_mask(parents, num_nodes)
    logits = torch.randn(1, 4, 50, generator=gen)
    topk_tokens, topk_logprobs = c.log_softmax_topk(logits, 2)
    tokens, parents, *_ = c.build_tree(topk_tokens, topk_logprobs, torch.tensor([7], dtype=i32),
                                       4, "topn")
    q = torch.randn(1, 4, 2, 64, generator=gen).to(h)
    cache = torch.randn(2, 16, 1, 64, generator=gen).to(h)
    prefix = torch.tensor([8], dtype=i32)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 4)
    c.tree_attention(q, cache[0:1], cache[1:2], prefix, None, "causal", None, 0.125, out, lse,
                     num_splits=2)
    kv = torch.randn(1, 4, 1, 64, generator=gen).to(h)
    w = torch.ones(64)
    positions = torch.arange(4, dtype=i32)[None]
    k_cache, v_cache = torch.zeros(1, 16, 1, 64, dtype=h), torch.zeros(1, 16, 1, 64, dtype=h)
    c.qk_norm_rope_append(q, kv, kv, w, w, positions, k_cache, v_cache, 1e4, 1e-6, None, None)
    c.qk_norm_rope_append(None, kv, kv, None, w, positions, k_cache, v_cache, 1e4, 1e-6, None,
                          prefix)
    seed = offset = torch.zeros(1, dtype=torch.int64)
    c.verify_tree(tokens, parents, num_nodes, 2, logits, None, 0.0, None, None)
    c.verify_tree(tokens, parents, num_nodes, 2, None, tokens, 0.0, None, None)
    accept_len, path, *_ = c.verify_tree(tokens, parents, num_nodes, 2, logits, None, 1.0, seed,
                                         offset, torch.tensor([3], dtype=i32), None)
    c.commit_kv(k_cache, v_cache, prefix, path, accept_len, None, torch.randn(1, 4, 8))
    x = torch.randn(3, 16, generator=gen).to(h)
    c.rms_norm(x, torch.randn(3, 16, generator=gen).to(h), torch.ones(16, dtype=h), 1e-6)
    c.rms_norm(x, None, torch.ones(16, dtype=h), 1e-6)
    c.silu_mul(torch.randn(3, 32, generator=gen).to(h))


def test_wrappers_pass_every_field_by_keyword(monkeypatch):
    """The cuda wrappers, run on the simulator, call each _C launcher with keywords only, naming
    every field it requires (and none it lacks): a field added to or renamed in a params.h list
    without its wrapper fails here, and so does a launcher no wrapper calls."""
    import jetspec_kernels
    use_sim(monkeypatch)
    recorder = Recorder(jetspec_kernels._C)
    monkeypatch.setattr(jetspec_kernels, "_C", recorder)
    call_every_wrapper()
    fields = sim_module().FIELDS
    assert set(recorder.calls) == set(fields)
    for op, rows in fields.items():
        names = {name for name, _, _ in rows}
        required = {name for name, _, optional in rows if not optional}
        for positional, keywords in recorder.calls[op]:
            assert positional == 0, op
            assert required <= keywords <= names, (op, required ^ keywords)


def cpu(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype)


def test_cuda_supports_answers():
    """The cases the old per-backend tables in ops/ covered, now cuda.supports' answers."""
    pytest.importorskip("jetspec_kernels._C")
    s = jk.cuda.supports
    q, kv = cpu(1, 2, 4, 128), cpu(1, 16, 2, 128)
    assert s("tree_attention", q=q, k_cache=kv, v_cache=kv, kernel="auto") is None
    assert "head dim 96" in s("tree_attention", q=cpu(1, 2, 4, 96), k_cache=kv, v_cache=kv)
    assert "float16/bfloat16" in s("tree_attention", q=q.float(), k_cache=kv, v_cache=kv)
    wide = cpu(1, 16, 2, 136)[..., 1:129]
    assert "v_cache rows on 16-byte" in s("tree_attention", q=q, k_cache=kv, v_cache=wide)
    q256, kv256 = cpu(1, 2, 4, 256), cpu(1, 16, 2, 256)
    assert s("tree_attention", q=q256, k_cache=kv256, v_cache=kv256, kernel="mma") is None
    assert "head dims (64, 128)" in s("tree_attention", q=q256, k_cache=kv256, v_cache=kv256,
                                      kernel="wgmma")
    paged = cpu(4, 12, 2, 128)
    table = torch.zeros(1, 2, dtype=torch.int32)
    assert "multiple of 8, got 12" in s("tree_attention", q=q, k_cache=paged, v_cache=paged,
                                        block_table=table, kernel="hopper")
    assert s("tree_attention", q=q, k_cache=paged, v_cache=paged, block_table=table,
             kernel="mma") is None
    # hopper runs other head dims on mma.sync, whose paged loads take any page size
    assert s("tree_attention", q=q256, k_cache=cpu(4, 12, 2, 256), v_cache=cpu(4, 12, 2, 256),
             block_table=table, kernel="hopper") is None
    assert "at most 4096 nodes, got N=4097" in s("verify_tree", tokens=cpu(1, 4097,
                                                                           dtype=torch.int32))
    assert s("verify_tree", tokens=cpu(1, 4096, dtype=torch.int32)) is None
    assert "head dims up to 512" in s("qk_norm_rope_append", k=cpu(1, 1, 1, 514))
    assert s("build_tree", topk_tokens=None) is None  # no limits past the contract
    assert bk.supports("reference", "tree_attention", q=cpu(1, 1, 1, 8)) is None
    assert "head dim 8" in bk.supports("triton", "tree_attention", q=cpu(1, 1, 1, 8))
    assert bk.supports("triton", "tree_attention", q=q256) is None


def test_aligned16_reads_every_row_stride(monkeypatch):
    """cuda/extension.aligned16 judges every stride but the last: heads 136 bytes apart or rows
    of an odd float32 vocabulary are off 16-byte boundaries even where the outer strides are
    not; the cuda attention wrapper refuses such a cache (cp.async needs aligned rows)."""
    from jetspec_kernels.cuda import extension as ext

    assert ext.aligned16(torch.empty(2, 16, 4, 72, dtype=torch.half)[..., :64])
    heads = torch.empty(2, 16, 4 * 68, dtype=torch.half).view(2, 16, 4, 68)[..., :64]
    assert not ext.aligned16(heads)                          # strides (1088, 68, ...)
    assert not ext.aligned16(torch.empty(2, 4, 1001))        # rows 4004 bytes apart
    assert ext.aligned16(torch.empty(2, 4, 1004))
    assert not ext.aligned16(torch.empty(2, 4, 1024)[..., 1:])

    use_sim(monkeypatch)
    q = torch.zeros(1, 16, 4, 64, dtype=torch.half)
    kc = torch.zeros(1, 64, 2 * 68, dtype=torch.half).view(1, 64, 2, 68)[..., :64]
    with pytest.raises(ValueError, match="k_cache rows must start on 16-byte boundaries"):
        cu().tree_attention(q, kc, kc, torch.tensor([20], dtype=torch.int32), None, "causal",
                            None, 0.125, torch.empty_like(q), None, 1, "mma")


def test_workspaces_share_one_allocation():
    """cuda/extension.workspaces: each part on a 16-byte boundary, inside one buffer, disjoint
    (sizes of 0 included), in the order asked."""
    from jetspec_kernels.cuda import extension as ext

    sizes = (5, 0, 64, 3, 1)
    buf, addrs = ext.workspaces("cpu", *sizes)
    assert buf.dtype == torch.uint8 and buf.is_contiguous()
    base = buf.data_ptr()
    assert [a - base for a in addrs] == [0, 16, 16, 80, 96]
    assert all(a % 16 == base % 16 for a in addrs)
    assert addrs[-1] + sizes[-1] <= base + buf.numel()
    assert ext.workspaces("cpu")[1] == []


def test_on_device_switches_only_to_another_device(monkeypatch):
    """cuda/extension.on_device (device_guard.cuda_device_guard): a CPU device or the current CUDA
    device needs no switch (a do-nothing context); another device gets torch.cuda.device of it."""
    from jetspec_kernels.cuda import extension as ext

    made = []
    monkeypatch.setattr(device_guard, "current_cuda_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda d: made.append(d) or "switch")
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
    assert ext.on_device(cuda1) is ext.on_device(cpu)
    with ext.on_device(cuda1):
        pass
    assert made == []
    assert ext.on_device(cuda0) == "switch" and made == [cuda0]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)   # dynamo: always switch
    assert ext.on_device(cuda1) == "switch" and made[-1] == cuda1
    assert ext.on_device(cpu) is ext.on_device(torch.device("cpu"))

