"""What ``_C`` says when a launcher rejects its input: called directly (past the Python checks), on
the simulated ``_C``, every rejection is a ValueError that names the op, the argument, its value
and the limit; a case the device cannot run is a RuntimeError that says why.

Each op has a valid baseline call on small real buffers (it must succeed), and each case changes
one or two of its arguments.
"""
import re
import shutil

import pytest
import torch

from helpers import sim_module


@pytest.fixture
def sim():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module()


def ptr(t):
    return t.data_ptr()


def i32(*shape, fill=0):
    return torch.full(shape, fill, dtype=torch.int32)


class Buffers:
    """Small CPU tensors behind the baseline calls (kept alive for the call)."""

    def __init__(self):
        h = torch.float16
        self.q = torch.zeros(1, 4, 2, 64, dtype=h)
        self.kv = torch.zeros(1, 16, 1, 64, dtype=h)
        self.out = torch.zeros(1, 4, 2, 64, dtype=h)
        self.prefix = i32(1, fill=8)
        self.mask = i32(1, 4, 2, fill=1)  # room for words = 2
        self.table = i32(1, 2)
        self.topk_tokens = torch.arange(4, dtype=torch.int32).view(1, 2, 2)
        self.topk_logprobs = torch.tensor([[[-0.1, -2.0], [-0.2, -3.0]]])
        self.root = i32(1, fill=5)
        self.tree = [i32(1, 4) for _ in range(3)] + [torch.zeros(1, 4), i32(1), i32(1, 4, 2)]
        self.logits = torch.zeros(1, 4, 300)
        self.topk_out = (i32(1, 4, 2), torch.zeros(1, 4, 2))
        self.workspace = torch.zeros(1 << 20, dtype=torch.uint8)
        self.hidden = torch.zeros(1, 4, 16, dtype=h)
        self.parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
        self.num_nodes = i32(1, fill=4)
        self.walk = [i32(1), i32(1, 3), i32(1), i32(1, 3)]
        self.part = (torch.zeros(4, 2), i32(4, 2))
        self.seed = torch.zeros(1, dtype=torch.int64)
        self.temperature = torch.ones(1)
        self.top_k = i32(1, fill=5)
        self.top_p = torch.full((1,), 0.5)
        self.thr = (torch.zeros(4), i32(4))
        self.rope_w = torch.ones(64)
        self.positions = i32(1, 4)
        self.rope_cache = torch.zeros(1, 16, 1, 64, dtype=h)
        self.path = torch.tensor([[0, 1, 3]], dtype=torch.int32)
        self.accept = i32(1, fill=2)
        self.hidden_rows = torch.zeros(1, 3, 16, dtype=h)
        self.norm_in = torch.zeros(2, 4, 24, dtype=torch.bfloat16)  # x, residual: rows 24 apart
        self.norm_w = torch.ones(16, dtype=torch.bfloat16)
        self.norm_out = torch.zeros(2, 4, 16, dtype=torch.bfloat16)  # out, total
        self.silu_in = torch.zeros(3, 40, dtype=torch.bfloat16)  # x [3, 2 * 16], rows 40 apart
        self.silu_out = torch.zeros(3, 16, dtype=torch.bfloat16)


def strides(t):
    return list(t.stride()[:3])


def attention_args(B, **kw):
    a = dict(q=ptr(B.q), q_strides=strides(B.q), k_cache=ptr(B.kv), v_cache=ptr(B.kv),
             k_cache_strides=strides(B.kv), v_cache_strides=strides(B.kv), block_table=0,
             block_table_batch_stride=0, page_size=16, cache_outer=1, prefix_lens=ptr(B.prefix),
             tree_mask=ptr(B.mask), tree_mask_batch_stride=8, tree_mask_row_stride=2, tail=1,
             out=ptr(B.out), out_strides=strides(B.out), lse=0, partial_o=0, partial_lse=0, batch=1,
             n=4, hq=2, hkv=1, splits=1, scale=0.125, dtype=1, head_dim=64, kernel=1, stream=0)
    a.update(kw)
    return list(a.values())


def build_tree_args(B, **kw):
    a = dict(topk_tokens=ptr(B.topk_tokens), topk_logprobs=ptr(B.topk_logprobs),
             root_tokens=ptr(B.root), tokens=ptr(B.tree[0]), parents=ptr(B.tree[1]),
             depths=ptr(B.tree[2]), scores=ptr(B.tree[3]), num_nodes=ptr(B.tree[4]),
             mask=ptr(B.tree[5]), batch=1, depth=2, k=2, budget=4, words=1, algorithm=0, stream=0)
    a.update(kw)
    return list(a.values())


def topk_args(B, **kw):
    a = dict(logits=ptr(B.logits), logits_batch_stride=1200, logits_row_stride=300,
             tokens=ptr(B.topk_out[0]), logprobs=ptr(B.topk_out[1]), workspace=ptr(B.workspace),
             batch=1, depth=4, vocab=300, k=2, dtype=0, stream=0)
    a.update(kw)
    return list(a.values())


def rope_args(B, **kw):
    a = dict(q=ptr(B.q), k=ptr(B.kv), v=ptr(B.kv), q_norm_w=ptr(B.rope_w), k_norm_w=ptr(B.rope_w),
             positions=ptr(B.positions), cache_start=0, q_out=ptr(B.out), k_cache=ptr(B.rope_cache),
             v_cache=ptr(B.rope_cache), block_table=0, q_strides=strides(B.q),
             k_strides=strides(B.kv), v_strides=strides(B.kv),
             k_cache_strides=strides(B.rope_cache), v_cache_strides=strides(B.rope_cache),
             block_table_batch_stride=0, batch=1, n=4, hq=2, hkv=1, head_dim=64, page_size=16,
             theta=1e4, eps=1e-6, dtype=1, cache_dtype=1, stream=0)
    a.update(kw)
    return list(a.values())


def target_args(B, **kw):
    a = dict(logits=ptr(B.logits), logits_batch_stride=1200, logits_row_stride=300,
             num_nodes=ptr(B.num_nodes), seed=0, offset=0, partial_value=ptr(B.part[0]),
             partial_token=ptr(B.part[1]), batch=1, n=4, vocab=300, splits=2, split_len=152,
             vec=True, temperature=0, thr_x=0, thr_id=0, dtype=0, stream=0)
    a.update(kw)
    return list(a.values())


def filter_args(B, **kw):
    a = dict(logits=ptr(B.logits), logits_batch_stride=1200, logits_row_stride=300,
             num_nodes=ptr(B.num_nodes), temperature=ptr(B.temperature), top_k=ptr(B.top_k),
             top_p=ptr(B.top_p), thr_x=ptr(B.thr[0]), thr_id=ptr(B.thr[1]), batch=1, n=4, vocab=300,
             vec=True, dtype=0, stream=0)
    a.update(kw)
    return list(a.values())


def walk_args(B, **kw):
    a = dict(tokens=ptr(B.topk_out[0]), parents=ptr(B.parents), num_nodes=ptr(B.num_nodes),
             target=ptr(B.positions), target_batch_stride=4, partial_value=0, partial_token=0,
             splits=1, accept_len=ptr(B.walk[0]), path=ptr(B.walk[1]), bonus=ptr(B.walk[2]),
             emitted=ptr(B.walk[3]), batch=1, n=4, cols=3, stream=0)
    a.update(kw)
    return list(a.values())


def commit_args(B, **kw):
    a = dict(k_cache=ptr(B.rope_cache), v_cache=ptr(B.kv), k_cache_strides=strides(B.rope_cache),
             v_cache_strides=strides(B.kv), block_table=0, block_table_batch_stride=0,
             prefix_lens=ptr(B.prefix), path=ptr(B.path), accept_len=ptr(B.accept),
             new_prefix_lens=ptr(B.walk[0]), hidden=ptr(B.hidden), hidden_batch_stride=64,
             hidden_row_stride=16, hidden_rows=ptr(B.hidden_rows), batch=1, cols=3, hkv=1,
             head_dim=64, page_size=16, hidden_dim=16, cache_elem_bytes=2, hidden_elem_bytes=2,
             stream=0)
    a.update(kw)
    return list(a.values())


def pack_mask_args(B, **kw):
    a = dict(parents=ptr(B.parents), num_nodes=ptr(B.num_nodes), mask=ptr(B.mask), batch=1, n=4,
             words=1, stream=0)
    a.update(kw)
    return list(a.values())


def rms_norm_args(B, **kw):
    a = dict(x=ptr(B.norm_in[0]), x_row_stride=24, residual=ptr(B.norm_in[1]),
             residual_row_stride=24, weight=ptr(B.norm_w), out=ptr(B.norm_out[0]),
             total=ptr(B.norm_out[1]), rows=4, hidden=16, eps=1e-6, dtype=2, stream=0)
    a.update(kw)
    return list(a.values())


def silu_mul_args(B, **kw):
    a = dict(x=ptr(B.silu_in), x_row_stride=40, out=ptr(B.silu_out), rows=3, inner=16, dtype=2,
             stream=0)
    a.update(kw)
    return list(a.values())


ARGS = {"tree_attention": attention_args, "build_tree": build_tree_args,
        "log_softmax_topk": topk_args,
        "qk_norm_rope_append": rope_args, "verify_target_tokens": target_args,
        "verify_sample_filter": filter_args,
        "verify_walk": walk_args, "commit_kv": commit_args, "pack_mask": pack_mask_args,
        "rms_norm": rms_norm_args, "silu_mul": silu_mul_args}


@pytest.mark.parametrize("op", sorted(ARGS))
def test_baselines_run(sim, op):
    """The unchanged calls are valid, so each case below fails for the argument it changes."""
    B = Buffers()
    getattr(sim, op)(*ARGS[op](B))


ALL = r"is not supported \(0 float32, 1 float16, 2 bfloat16\)"
HALF = r"is not supported \(1 float16, 2 bfloat16\)"
KERNELS = r"is not 0 \(auto\), 1 \(mma\), 2 \(wgmma\) or 4 \(hopper\)"

# (op, changed arguments, what the message must say after "jetspec_kernels._C.<op>: "); a limit
# is passed by one (tests/test_limits.py runs the launchers at their limits).
BAD = [
    ("tree_attention", dict(head_dim=96), r"head_dim 96 is not supported \(64, 128, 256\)"),
    ("tree_attention", dict(dtype=0), r"dtype 0 \(float32\) " + HALF),
    ("tree_attention", dict(head_dim=256, kernel=2),
     r"head_dim 256 is not supported by the wgmma kernel \(64, 128\)"),
    ("tree_attention", dict(kernel=3), r"kernel 3 " + KERNELS),   # a retired kernel's code
    ("tree_attention", dict(kernel=7), r"kernel 7 " + KERNELS),
    ("tree_attention", dict(kernel=-1), r"kernel -1 " + KERNELS),
    ("tree_attention", dict(tail=5), r"tail 5 is not 0 \(mask\), 1 \(causal\) or 2 \(full\)"),
    ("tree_attention", dict(tail=0, tree_mask=0), r"tail 0 \(mask\) needs tree_mask"),
    ("tree_attention", dict(splits=0), r"splits 0 is below 1"),
    ("tree_attention", dict(splits=65536, partial_o=1, partial_lse=1), r"splits 65536 exceeds 65535"),
    ("tree_attention", dict(splits=2), r"splits 2 needs partial_o and partial_lse"),
    ("tree_attention", dict(hkv=0), r"hkv 0 is below 1"),
    ("tree_attention", dict(hq=3, hkv=2), r"hq 3 is not a multiple of hkv 2"),
    ("tree_attention", dict(batch=65536), r"batch \* hkv = 65536 exceeds 65535"),
    ("tree_attention", dict(kernel=4, block_table=1, page_size=12),
     r"page_size 12 is not a multiple of 8 \(kernel 4, hopper\)"),
    ("build_tree", dict(budget=4097, words=129), r"budget 4097 exceeds 4096"),
    ("build_tree", dict(budget=0, words=0), r"budget 0 is below 1"),
    ("build_tree", dict(k=65), r"k 65 exceeds 64"),
    ("build_tree", dict(k=0), r"k 0 is below 1"),
    ("build_tree", dict(depth=0), r"depth 0 is below 1"),
    ("build_tree", dict(algorithm=2), r"algorithm 2 is not 0 \(topn\) or 1 \(accum_logp\)"),
    ("build_tree", dict(words=2), r"words 2 is not ceil\(budget / 32\) = 1"),
    ("log_softmax_topk", dict(dtype=3), r"dtype 3 " + ALL),
    ("log_softmax_topk", dict(k=301), r"k 301 exceeds vocab 300"),
    ("log_softmax_topk", dict(k=0), r"k 0 is below 1"),
    ("log_softmax_topk", dict(vocab=65535 * 4096 + 1),
     r"vocab 268431361 exceeds 268431360 \(65535 chunks of 4096\)"),
    ("log_softmax_topk", dict(batch=1 << 16, depth=1 << 16),
     r"batch \* depth = 4294967296 exceeds 2147483647"),
    ("qk_norm_rope_append", dict(head_dim=63), r"head_dim 63 is not even \(RoPE rotates halves\)"),
    ("qk_norm_rope_append", dict(head_dim=514), r"head_dim 514 exceeds 512"),
    ("qk_norm_rope_append", dict(dtype=4), r"dtype 4 " + ALL),
    ("qk_norm_rope_append", dict(cache_dtype=4), r"cache_dtype 4 " + ALL),
    ("qk_norm_rope_append", dict(q_norm_w=0), r"q needs q_norm_w"),
    ("qk_norm_rope_append", dict(k_norm_w=0), r"q_norm_w needs k_norm_w \(both norms or neither\)"),
    ("qk_norm_rope_append", dict(rotary_dim=66),
     r"rotary_dim 66 is not 0 or an even number in \[2, head_dim 64\]"),
    ("qk_norm_rope_append", dict(rotary_dim=7),
     r"rotary_dim 7 is not 0 or an even number in \[2, head_dim 64\]"),
    ("verify_target_tokens", dict(dtype=5), r"dtype 5 " + ALL),
    ("verify_target_tokens", dict(splits=0), r"splits 0 is below 1"),
    ("verify_target_tokens", dict(splits=65536), r"splits 65536 exceeds 65535"),
    ("verify_target_tokens", dict(split_len=144),
     r"splits 2 \* split_len 144 = 288 do not cover vocab 300"),
    ("verify_target_tokens", dict(split_len=154), r"split_len 154 is not a multiple of 8 \(vec\)"),
    ("verify_target_tokens", dict(temperature=1), r"temperature needs seed and offset"),
    ("verify_target_tokens", dict(thr_x=1), r"thr_x needs thr_id and temperature"),
    ("verify_sample_filter", dict(dtype=4), r"dtype 4 " + ALL),
    ("verify_sample_filter", dict(vocab=(1 << 21) + 1), r"vocab 2097153 exceeds 2097152"),
    ("verify_sample_filter", dict(vocab=0), r"vocab 0 is below 1"),
    ("verify_sample_filter", dict(thr_id=0), r"temperature, thr_x and thr_id are required"),
    ("verify_sample_filter", dict(batch=1 << 16, n=1 << 16),
     r"batch \* n = 4294967296 exceeds 2147483647"),
    ("verify_walk", dict(n=0), r"n 0 is below 1"),
    ("verify_walk", dict(n=4097), r"n 4097 exceeds 4096"),
    ("verify_walk", dict(target=0), r"target = 0 needs partial_value and partial_token"),
    ("verify_walk", dict(cols=0), r"cols 0 is below 1"),
    ("commit_kv", dict(cache_elem_bytes=3), r"cache_elem_bytes 3 is not 2 or 4"),
    ("commit_kv", dict(hidden_elem_bytes=8), r"hidden_elem_bytes 8 is not 2 or 4"),
    ("commit_kv", dict(cols=65536), r"cols 65536 exceeds 65535"),
    ("pack_mask", dict(words=2), r"words 2 is not ceil\(n / 32\) = 1"),
    ("rms_norm", dict(hidden=0), r"hidden 0 is below 1"),
    ("rms_norm", dict(rows=-1), r"rows -1 is below 0"),
    ("rms_norm", dict(x_row_stride=-24), r"x_row_stride -24 is below 0"),
    ("rms_norm", dict(residual_row_stride=-1), r"residual_row_stride -1 is below 0"),
    ("rms_norm", dict(eps=0.0), r"eps 0 is not positive"),
    ("rms_norm", dict(eps=float("nan")), r"eps nan is not positive"),
    ("rms_norm", dict(dtype=3), r"dtype 3 " + ALL),
    ("rms_norm", dict(weight=0), r"x, weight and out are required \(rows 4\)"),
    ("rms_norm", dict(x=0), r"x, weight and out are required \(rows 4\)"),
    ("silu_mul", dict(inner=0), r"inner 0 is below 1"),
    ("silu_mul", dict(inner=-16), r"inner -16 is below 1"),
    ("silu_mul", dict(rows=-1), r"rows -1 is below 0"),
    ("silu_mul", dict(x_row_stride=-40), r"x_row_stride -40 is below 0"),
    ("silu_mul", dict(dtype=3), r"dtype 3 " + ALL),
    ("silu_mul", dict(dtype=-1), r"dtype -1 " + ALL),
    ("silu_mul", dict(x=0), r"x and out are required \(rows 3\)"),
    ("silu_mul", dict(out=0), r"x and out are required \(rows 3\)"),
    ("pack_mask", dict(n=-1), r"n -1 is below 0"),
    # A grid limit itself is accepted: at it, the call fails at a later argument instead. (The
    # limits the simulator can run at are run there by tests/test_limits.py; these would take hours.)
    ("log_softmax_topk", dict(depth=2**31 - 1, k=0), r"k 0 is below 1"),
    ("tree_attention", dict(splits=65535), r"splits 65535 needs partial_o and partial_lse"),
    ("commit_kv", dict(cols=65535, hidden_elem_bytes=8), r"hidden_elem_bytes 8 is not 2 or 4"),
    ("verify_target_tokens", dict(splits=65535, split_len=8, vec=True, temperature=1),
     r"temperature needs seed and offset"),
    ("verify_sample_filter", dict(vocab=1 << 21, thr_id=0),
     r"temperature, thr_x and thr_id are required"),
]


def case_id(op, changes):
    return "-".join([op] + [f"{k}={v}" for k, v in changes.items()])


@pytest.mark.parametrize("op,changes,message", BAD, ids=[case_id(op, c) for op, c, _ in BAD])
def test_rejected_input_names_argument_and_limit(sim, op, changes, message):
    B = Buffers()
    with pytest.raises(ValueError) as info:
        getattr(sim, op)(*ARGS[op](B, **changes))
    assert re.fullmatch(rf"jetspec_kernels\._C\.{op}: {message}", str(info.value)), str(info.value)


def test_attention_grid_y_limit_is_accepted(sim, monkeypatch):
    """batch * hkv = 65535 (grid y's limit) passes the checks: the call gets as far as asking for
    the head-dim-256 kernel's shared memory, which a device with 64 KB per block refuses."""
    monkeypatch.setenv("JETSPEC_SIM_SMEM_OPTIN", "65536")
    B = Buffers()
    with pytest.raises(RuntimeError, match=r"cudaFuncSetAttribute\(max dynamic shared memory") as info:
        sim.tree_attention(*attention_args(B, batch=65535, head_dim=256))
    assert not isinstance(info.value, ValueError)


def test_commit_kv_checks_before_moving(sim):
    """A bad hidden element size is refused before the K/V moves, not after them."""
    B = Buffers()
    B.rope_cache.copy_(torch.arange(B.rope_cache.numel()).view_as(B.rope_cache))
    before = B.rope_cache.clone()
    with pytest.raises(ValueError, match="hidden_elem_bytes 3"):
        sim.commit_kv(*commit_args(B, hidden_elem_bytes=3))
    assert torch.equal(B.rope_cache, before)


def test_wgmma_where_it_cannot_run(sim, monkeypatch):
    """An sm_90a kernel asked for where the runtime picked other code is a RuntimeError saying so
    (not bad input: the same call runs on an H200)."""
    monkeypatch.setenv("JETSPEC_SIM_BINARY_VERSION", "80")
    B = Buffers()
    for kernel, name in ((2, "wgmma"), (4, "hopper")):
        with pytest.raises(RuntimeError) as info:
            sim.tree_attention(*attention_args(B, kernel=kernel))
        assert not isinstance(info.value, ValueError)
        assert re.fullmatch(rf"jetspec_kernels\._C\.tree_attention: kernel {kernel} \({name}\) "
                            r"needs sm_90a code, which this device does not run "
                            r"\(built for 90a,80\)",
                            str(info.value)), str(info.value)
    sim.tree_attention(*attention_args(B, kernel=0))  # auto takes mma.sync there


def test_strides_name_op_and_argument(sim):
    B = Buffers()
    with pytest.raises(ValueError, match=r"^jetspec_kernels\._C\.tree_attention: "
                                         r"k_cache_strides needs 3 strides, got 2$"):
        sim.tree_attention(*attention_args(B, k_cache_strides=[1, 2]))


def test_tensor_map_layout_refused(sim):
    """A K/V layout the driver cannot describe as a tensor map (rows 136 bytes apart) is refused
    by the hopper kernel with the tensor and its byte strides named."""
    B = Buffers()
    with pytest.raises(ValueError) as info:
        sim.tree_attention(*attention_args(B, kernel=4, k_cache_strides=[1024, 68, 64]))
    assert re.fullmatch(r"jetspec_kernels\._C\.tree_attention: cuTensorMapEncodeTiled refused "
                        r"k_cache \(CUresult 1; byte strides 128, 136, 2048\): TMA needs a 16-byte "
                        r"aligned base and strides that are multiples of 16 bytes "
                        r"\(kernel 4, hopper\)",
                        str(info.value)), str(info.value)


def test_device_shared_memory_limits(sim, monkeypatch):
    """On a device with less opt-in shared memory (64 KB), a failed CUDA call says what it was
    for, and is not a ValueError."""
    monkeypatch.setenv("JETSPEC_SIM_SMEM_OPTIN", "65536")
    B = Buffers()
    with pytest.raises(RuntimeError) as info:
        sim.build_tree(*build_tree_args(B, budget=4096, words=128))
    assert not isinstance(info.value, ValueError)
    assert re.fullmatch(r"jetspec_kernels\._C\.build_tree: cudaFuncSetAttribute\(max dynamic "
                        r"shared memory 118800 bytes\): CUDA error 1 \(cudaErrorInvalidValue\): .+",
                        str(info.value)), str(info.value)
