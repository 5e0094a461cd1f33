"""jetspec_kernels/launch_plan.py: the SM count (one query per CUDA device) and the split-KV rules
on a table of shapes and GPUs (H100 / H200: 132 SMs, A100: 108), and that the backends' wrappers
plan with them (a patched sm_count changes their split counts). The triton attention wrapper's
use is checked where it runs, in tests/ops/test_tree_attention.py."""
import pytest
import torch

from jetspec_kernels import launch_plan as lp

H100 = H200 = 132
A100 = 108


# (base CTAs, CTAs per SM, capacity, SMs) -> splits
CUDA_TABLE = [
    (32, 2, 4160, H200, 8),     # 264 slots / 32 = 8 (rounds down: 9 would start a second wave)
    (32, 2, 4160, A100, 6),     # 216 / 32
    (16, 1, 4160, H100, 8),     # one CTA per SM
    (8, 2, 32784, H200, 32),    # capped at CUDA_MAX_SPLITS
    (8, 2, 32784, A100, 27),
    (8, 2, 1040, H200, 4),      # short cache: 4 x 256 keys
    (72, 2, 4096, H200, 3),
    (72, 2, 4096, A100, 3),     # 216 / 72
    (120, 2, 4096, A100, 1),    # 120 base CTAs fill over half of an A100's 216 slots
    (120, 2, 4096, H200, 2),    # ... but not of an H200's 264
    (132, 2, 4096, H200, 1),    # exactly half of the 264 slots: no split
    (131, 2, 4096, H200, 2),    # one CTA under half: 264 // 131
    (512, 2, 4096, H200, 1),    # the grid fills the GPU
    (0, 2, 4096, H200, 1),      # nothing to compute
]

# (base programs, max prefix, SMs, min keys) -> splits
TRITON_TABLE = [
    (8, 32768, H200, 256, 33),  # ceil(2 * 132 / 8): rounds up
    (8, 32768, A100, 256, 27),
    (1024, 32768, H200, 256, 1),
    (8, 200, H200, 256, 1),     # a short prefix feeds no split
    (1, 10 ** 7, H200, 256, lp.TRITON_MAX_SPLITS),
    (1, 10 ** 7, A100, 256, lp.TRITON_MAX_SPLITS),
    (3, 1000, lp.CPU_SM_COUNT, 32, 3),   # the interpreter's stand-in
    (0, 100, H200, 256, 1),
]


@pytest.mark.parametrize("base,per_sm,capacity,sms,want", CUDA_TABLE)
def test_cuda_attention_splits(base, per_sm, capacity, sms, want):
    got = lp.cuda_attention_splits(base, per_sm, capacity, sms)
    assert got == want
    assert got == 1 or base * got <= per_sm * sms       # never a second wave


@pytest.mark.parametrize("base,max_prefix,sms,min_keys,want", TRITON_TABLE)
def test_triton_attention_splits(base, max_prefix, sms, min_keys, want):
    assert lp.triton_attention_splits(base, max_prefix, sms, min_keys) == want


def test_the_rules_differ_where_kernels_md_says():
    """Qwen3-8B heads, B 1, N 16, 32K keys: 8 base CTAs / programs. cuda fills one wave of two
    CTAs per SM (capped at 32), triton aims at two programs per SM rounding up (33)."""
    assert lp.cuda_attention_splits(8, 2, 32784, H200) == 32
    assert lp.triton_attention_splits(8, 32768, H200, 256) == 33


def test_sm_count_is_queried_once_per_device(monkeypatch):
    calls = []

    class Props:
        def __init__(self, index):
            self.multi_processor_count = {0: H200, 1: A100}[index]

    def props(index):
        calls.append(index)
        return Props(index)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    lp._cuda_sm_count.cache_clear()
    try:
        assert lp.sm_count(torch.device("cuda", 0)) == H200
        assert lp.sm_count("cuda:1") == A100
        assert lp.sm_count(0) == H200
        assert lp.sm_count(torch.device("cuda", 1)) == A100
        assert calls == [0, 1]
        assert lp.sm_count("cpu") == lp.CPU_SM_COUNT and calls == [0, 1]
    finally:
        lp._cuda_sm_count.cache_clear()


def test_sm_count_of_a_bare_cuda_device_is_the_current_ones(monkeypatch):
    """"cuda" without an index is the current device (torch's meaning), not device 0: a process
    driving an A100 as device 1 plans for 108 SMs there."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: type("P", (), {"multi_processor_count": {0: H200, 1: A100}[index]}))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    lp._cuda_sm_count.cache_clear()
    try:
        assert lp.sm_count("cuda") == A100
        assert lp.sm_count(torch.device("cuda")) == A100
        assert lp.sm_count("cuda:0") == H200
    finally:
        lp._cuda_sm_count.cache_clear()


@pytest.mark.parametrize("sms", [A100, H200, 1000])
def test_backends_plan_with_its_sm_count(monkeypatch, sms):
    """Patch launch_plan.sm_count: the cuda attention (one wave of 2 CTAs per SM at Dh 128) and
    both backends' vocabulary splits of verify_tree follow it."""
    from jetspec_kernels.cuda.tree_attention import choose_splits
    from jetspec_kernels.cuda.verify_tree import target_splits
    import importlib
    triton_verify = importlib.import_module("jetspec_kernels.triton.verify_tree")

    monkeypatch.setattr(lp, "sm_count", lambda device: sms)
    # B 1, N 16, Hq 32, Hkv 8: 8 base CTAs of one 64-row tile.
    assert choose_splits(1, 16, 32, 8, 1 << 20, "cpu") == min(2 * sms // 8, lp.CUDA_MAX_SPLITS)
    assert choose_splits(1, 16, 32, 8, 1 << 20, "cpu") == lp.cuda_attention_splits(
        8, 2, 1 << 20, sms)
    # verify_tree, 4 rows: about 4 programs per SM (triton: V / 512-token blocks at most).
    assert triton_verify._splits(4, 151936, 512, torch.device("cuda", 0)) == min(sms, 297)
    assert target_splits(4, 151936, sms)[0] == min(sms, 38)
    # 64 rows: about 4 CTAs per SM in total, ceil(4 * sms / 64) splits a row (below the V cap)
    assert target_splits(64, 151936, sms)[0] == min(-(-4 * sms // 64), 38)


def test_cuda_verify_plans_with_its_sm_count(monkeypatch):
    """The cuda verify_tree wrapper (on the simulator) sizes its vocabulary splits from
    launch_plan.sm_count."""
    import importlib

    from helpers import cu, use_sim
    verify = importlib.import_module("jetspec_kernels.cuda.verify_tree")
    use_sim(monkeypatch)
    monkeypatch.setattr(lp, "sm_count", lambda device: 7)
    seen = []
    rule = verify.target_splits
    monkeypatch.setattr(verify, "target_splits", lambda *a: seen.append(a) or rule(*a))
    i32 = torch.int32
    tokens = torch.tensor([[5, 1, 2, 3]], dtype=i32)
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=i32)
    logits = torch.randn(1, 4, 50, generator=torch.Generator().manual_seed(0))
    cu().verify_tree(tokens, parents, torch.tensor([4], dtype=i32), 2, logits, None, 0.0, None,
                     None)
    assert seen == [(4, 50, 7)]


# ---------------------------------------------------------------------- hidden top-K method

def test_hidden_topk_method_is_fused_until_measured():
    """No GPU run has measured the crossover yet: auto keeps the fused kernel at every size,
    dtype and device (docs/perf/hidden_topk.md says how to flip it)."""
    assert lp.HIDDEN_TOPK_GEMM_MIN_ROWS == {"cuda": None}
    for rows in (1, 15, 60, 240, 1024, 10 ** 6):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for device in ("cuda", torch.device("cuda", 1), "cpu"):
                assert lp.hidden_topk_method(rows, dtype, device) == "fused"


# (rows, dtype, device) -> method, with a crossover of 64 rows set for CUDA (no cap on the rows:
# the gemm method chunks what does not fit HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES)
GEMM_AT_64 = [
    (63, torch.bfloat16, "cuda", "fused"),    # below the crossover
    (64, torch.bfloat16, "cuda", "gemm"),     # at it
    (240, torch.float16, torch.device("cuda", 0), "gemm"),
    (240, torch.float32, "cuda", "fused"),    # fp32: not measured
    (240, torch.bfloat16, "cpu", "fused"),    # no crossover for the CPU
    (1 << 30, torch.bfloat16, "cuda", "gemm"),
]


@pytest.mark.parametrize("rows,dtype,device,want", GEMM_AT_64)
def test_hidden_topk_method_rule(monkeypatch, rows, dtype, device, want):
    monkeypatch.setitem(lp.HIDDEN_TOPK_GEMM_MIN_ROWS, "cuda", 64)
    assert lp.hidden_topk_method(rows, dtype, device) == want


# ---------------------------------------------------------------------- the verify's argmax
# (rows, vocab, elt) -> columns per chunk, at the defaults (chunks of at most 32 MiB of logits
# or 32768 columns, whichever is more; balanced, multiples of 256)
ARGMAX_CHUNKS = [
    (64, 151936, 2, 151936),     # B1 x 64 nodes of Qwen3-8B: 19.4 MB of logits, one pass
    (110, 151936, 2, 151936),    # 33,425,920 bytes: fits 32 MiB
    (111, 151936, 2, 76032),     # one row more: two balanced chunks, not 151040 + 896
    (256, 151936, 2, 50688),     # B4 x 64: at most 65536 columns fit, 3 chunks
    (1024, 151936, 2, 30464),    # B16 x 64: at most the minimum, 32768: 5 chunks (as before)
    (4096, 151936, 4, 30464),
    (0, 151936, 2, 151936),      # no rows: one (empty) pass
    (1, 1000, 4, 1000),
    (10 ** 6, 1000, 2, 1000),    # the vocabulary is below the minimum chunk: one pass
]


@pytest.mark.parametrize("rows,vocab,elt,want", ARGMAX_CHUNKS)
def test_argmax_chunk(rows, vocab, elt, want):
    assert lp.ARGMAX_MIN_CHUNK == 32768 and lp.ARGMAX_CHUNK_BYTES == 32 << 20
    got = lp.argmax_chunk(rows, vocab, elt)
    assert got == want
    if got < vocab:   # a multiple of 256, within the bound, and no chunk fewer would do
        most = max(lp.ARGMAX_MIN_CHUNK, lp.ARGMAX_CHUNK_BYTES // (rows * elt) // 256 * 256)
        assert got % 256 == 0 and got <= most
        assert -(-vocab // got) == -(-vocab // most)


# ---- Plans once per signature (launch_plan.planned: host time per eager call) ----

def test_planned_keys_on_the_signature_and_the_sm_count(monkeypatch):
    """One rule call per key: the same key again is a lookup; another device (or shape, dtype)
    is another key; a patched sm_count plans afresh."""
    monkeypatch.setattr(lp, "_PLANS", {})
    calls = []

    def rule(*args):
        calls.append(args)
        return len(calls)

    for dev in ("cuda:0", "cuda:0", "cuda:1", "cuda:0"):
        lp.planned((torch.device(dev), (4, 16)), rule, dev)
    assert calls == [("cuda:0",), ("cuda:1",)]
    assert lp.planned((torch.device("cuda:0"), (4, 17)), rule, "x") == 3
    assert lp.planned((torch.device("cuda:0"), (4, 16)), rule, "x") == 1
    monkeypatch.setattr(lp, "sm_count", lambda device: 7)
    assert lp.planned((torch.device("cuda:0"), (4, 16)), rule, "x") == 4

    pin = object()
    assert lp.planned((torch.device("cuda:0"), (4, 16)), rule, "x", pin=pin) == 5
    assert lp.planned((torch.device("cuda:0"), (4, 16)), rule, "x", pin=pin) == 5
    assert lp.planned((torch.device("cuda:0"), (4, 16)), rule, "x", pin=object()) == 6

    def refuse():
        raise ValueError("no")
    for _ in range(2):   # a refusal is not remembered: it is raised again
        with pytest.raises(ValueError):
            lp.planned(("bad",), refuse)


def _attention_args(n=16, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, 4, 64, generator=gen).to(dtype)
    kc = torch.randn(1, 4096, 2, 64, generator=gen).to(dtype)
    vc = torch.randn(1, 4096, 2, 64, generator=gen).to(dtype)
    prefix = torch.tensor([100 + seed], dtype=torch.int32)
    return q, kc, vc, prefix, None, "causal", None, 0.125, torch.empty_like(q), None


def test_cuda_attention_plans_once_per_signature(monkeypatch):
    """The cuda tree_attention wrapper (simulator) runs its split rule once per signature: new
    values are no new plan; another shape, dtype or kernel is; so is a patched sm_count. The
    planned split count is the one the rule gives."""
    from helpers import cu, use_sim

    use_sim(monkeypatch)
    monkeypatch.setattr(lp, "_PLANS", {})
    seen = []
    rule = lp.cuda_attention_splits
    monkeypatch.setattr(lp, "cuda_attention_splits", lambda *a: seen.append(a) or rule(*a))
    cu().tree_attention(*_attention_args(seed=0), kernel="mma")
    cu().tree_attention(*_attention_args(seed=1), kernel="mma")     # other values, same shapes
    assert len(seen) == 1
    cu().tree_attention(*_attention_args(n=8), kernel="mma")
    cu().tree_attention(*_attention_args(dtype=torch.bfloat16), kernel="mma")
    assert len(seen) == 3
    seven = lambda device: 7  # noqa: E731
    monkeypatch.setattr(lp, "sm_count", seven)
    cu().tree_attention(*_attention_args(seed=2), kernel="mma")
    assert len(seen) == 4 and seen[-1][-1] == 7
    assert list(lp._PLANS.values())[-1][0] == (cu().extension.enum("AttnKernel")["mma"],
                                               rule(*seen[-1]))
    use_sim(monkeypatch)       # another _C (a fresh stand-in), the same sm_count: another plan
    monkeypatch.setattr(lp, "sm_count", seven)
    cu().tree_attention(*_attention_args(seed=3), kernel="mma")
    assert len(seen) == 5
    with pytest.raises(ValueError, match="kernel must be one of"):
        cu().tree_attention(*_attention_args(), kernel="nope")


def test_cuda_attention_plans_per_cache_shape(monkeypatch):
    """The plan's key holds the cache's shape and the block table's width: a longer cache, more
    kv heads or a wider block table is another plan, with the capacity of that call (a short
    cache's plan reused for a long one would split 32K keys as if they were 4K)."""
    from helpers import cu, use_sim

    use_sim(monkeypatch)
    monkeypatch.setattr(lp, "_PLANS", {})
    seen = []
    rule = lp.cuda_attention_splits
    monkeypatch.setattr(lp, "cuda_attention_splits", lambda *a: seen.append(a) or rule(*a))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 4, 64, generator=gen).half()
    prefix = torch.tensor([100], dtype=torch.int32)

    def call(kc, table=None):
        cu().tree_attention(q, kc, kc, prefix, None, "causal", table, 0.125, torch.empty_like(q),
                            None, kernel="mma")
        return seen[-1][2]      # the capacity the rule saw

    assert call(torch.randn(1, 1024, 2, 64, generator=gen).half()) == 1024
    assert call(torch.randn(1, 4096, 2, 64, generator=gen).half()) == 4096
    assert call(torch.randn(1, 1024, 4, 64, generator=gen).half()) == 1024 and len(seen) == 3
    pages = torch.randn(4, 16, 2, 64, generator=gen).half()
    assert call(pages, torch.zeros(1, 16, dtype=torch.int32)) == 256
    assert call(pages, torch.zeros(1, 64, dtype=torch.int32)) == 1024
    assert len(seen) == 5


@pytest.mark.parametrize("sms", [1, 33, 132, 264])
def test_hopper_rule_follows_sm_count(monkeypatch, sms):
    """A patched launch_plan.sm_count reaches the hopper kernel's split rule (C++, from _C): the
    simulator's occupancy is one CTA per SM, so the rule sees ``sms`` slots; the wrapper's plan
    for kernel="hopper" is that count."""
    from helpers import use_sim
    from jetspec_kernels.cuda.tree_attention import attention_plan, hopper_splits
    from ops.test_tree_attention_hopper import wave_rule

    use_sim(monkeypatch)
    monkeypatch.setattr(lp, "_PLANS", {})
    monkeypatch.setattr(lp, "sm_count", lambda device: sms)
    b, n, hq, hkv, prefix = 1, 16, 32, 8, 32768      # Qwen3-8B heads: 8 base CTAs (small variant)
    q = torch.zeros(b, n, hq, 128, dtype=torch.bfloat16)
    got = hopper_splits(q, hkv, prefix + n)
    # The rule restated in tests/ops/test_tree_attention_hopper.py, with ``sms`` slots.
    assert got == wave_rule(8, sms, -(-(prefix + n) // 64))
    kc = torch.zeros(1, 1, hkv, 128, dtype=torch.bfloat16).expand(b, prefix + n, hkv, 128)
    assert attention_plan("hopper", q, kc, None)[1] == got
