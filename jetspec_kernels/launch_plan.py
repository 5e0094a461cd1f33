"""How both backends size their launches for the GPU they run on: its SM count (one query per
device, cached) and the split-KV rules, each a named function of static shapes (no host sync, so a
launch plan is fixed under CUDA-graph capture).

Split-KV: when (query tile, sequence, kv head) programs alone cannot fill the GPU, each
sequence's keys are shared among ``splits`` programs whose partial results a combine step merges.
The backends use different rules, each kept as it was measured or written, until a GPU run picks
one (docs/kernels.md, "Split-KV rules"):

* :func:`cuda_attention_splits` (cuda backend, mma.sync / wgmma kernels): one wave of the
  kernel's CTAs per SM, never a second, nearly empty one.
* :func:`triton_attention_splits` (triton backend): about two programs per SM.
* kernel="hopper" (cuda): the kernel's CTAs per SM from the CUDA occupancy calculator and the
  fewest splits whose last wave is within 85 % of the best fill: ``hopper_split_count`` in
  csrc/include/jetspec/attention_hopper.cuh, in C++ because it needs the occupancy calculator
  and the torch-free sweep harness (bench/attn_sweep) plans with it too. The cuda wrapper passes
  it :func:`sm_count`, so all three rules follow one number (patch it to plan for another GPU).

Which rule stays is for one GPU measurement, not run yet: tree_attention with ``num_splits``
forced to 1, 2, 3, 4, 6, 8, 16 and 32 (both wrappers take it) on one card, CUDA-graph replay,
combine included, at base grids of 0.25 to 1.5 x the SM count and 4K / 32K keys (the grid is in
docs/perf/tree_attention.md, "Split-KV rules"). Neither bench/device_check.sh nor bench/attn_sweep forces a
count today: the sweep's CSV (device_check step ``attn_sweep``: kernel, shape, splits, graph_us)
holds each kernel's own pick only, so it compares kernels, not rules. Per cell, the rule whose
pick is within 5 % of the fastest forced count most often (and never 20 % off) plans for both
backends; the others go, with their rows in tests/test_launch_plan.py.

A plan depends on static shapes, dtypes and devices only: :func:`planned` computes one once per
such signature (and per :func:`sm_count` in use), not on every eager call.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from . import checks

# The SM count assumed on devices that are not CUDA (the Triton interpreter and the CUDA
# simulator run on the CPU): small, so that CPU tests exercise the split path.
CPU_SM_COUNT = 4

CUDA_MAX_SPLITS = 32            # cuda_attention_splits: at most this many splits ...
CUDA_MIN_KEYS_PER_SPLIT = 256   # ... and at least this many keys a split at full capacity
TRITON_MAX_SPLITS = 128
# triton_attention_splits: the smallest prefix share worth a split, by device type (the
# interpreter's is small so that CPU tests split short caches).
TRITON_MIN_KEYS_PER_SPLIT = {"cuda": 256, "cpu": 32}


@lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device`` (a torch.device, a device string, or a CUDA device
    index), queried once per CUDA device; :data:`CPU_SM_COUNT` for a device that is not CUDA."""
    if isinstance(device, int):
        return _cuda_sm_count(device)
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


_PLANS: dict = {}   # (rule, sm_count, id(pin), key) -> (plan, pin); bounded (checks.remember)


def planned(key: tuple, rule, *args, pin=None):
    """``rule(*args)``, remembered under ``key``: what the plan depends on in ``args`` (shapes,
    dtypes, devices, names; never tensor values), hashable. It is also remembered per
    :func:`sm_count` as it is now (a patched one plans afresh) and per ``pin``, an object the plan
    depends on by identity (the ``_C`` module in use; it need not be hashable): the entry holds
    it, so its id cannot be reused while the plan is kept. A rule that raises remembers nothing.
    A full cache is emptied first."""
    full = (rule, sm_count, id(pin), key)
    hit = _PLANS.get(full)
    if hit is not None:
        return hit[0]
    return checks.remember(_PLANS, full, (rule(*args), pin))[0]


def cuda_attention_splits(base_ctas: int, ctas_per_sm: int, capacity: int, sms: int) -> int:
    """Split-KV count of the cuda backend's attention kernels (not hopper): one wave.

    ``base_ctas`` = query tiles x B x Hkv, the grid without splitting; ``ctas_per_sm`` the CTAs
    of the kernel one SM holds; ``capacity`` the keys a sequence's cache can hold; ``sms`` the
    GPU's SM count. No split once the base grid fills half the GPU's CTA slots; else as many
    splits as one wave holds (rounding down: rounding up would start a second, nearly empty wave
    that costs as much as the first; B 1, 32 base CTAs, 132 SMs, two per SM: 8 splits = 256 CTAs,
    not 9 = 288), at most CUDA_MAX_SPLITS and at least CUDA_MIN_KEYS_PER_SPLIT keys a split.
    Returns an int in [1, CUDA_MAX_SPLITS].
    """
    if base_ctas <= 0:  # nothing to compute (the launcher returns early)
        return 1
    slots = ctas_per_sm * sms
    if base_ctas >= slots // 2:
        return 1
    return max(1, min(slots // base_ctas, capacity // CUDA_MIN_KEYS_PER_SPLIT, CUDA_MAX_SPLITS))


def triton_attention_splits(base_programs: int, max_prefix: int, sms: int, min_keys: int) -> int:
    """Split-KV count of the triton backend's attention: about two programs per SM.

    ``base_programs`` = query tiles x B x Hkv, the grid without splitting; ``max_prefix`` an
    upper bound on prefix_lens from the cache shape (capacity - N); ``sms`` the SM count;
    ``min_keys`` the smallest prefix share worth a split (TRITON_MIN_KEYS_PER_SPLIT). Rounds up
    (ceil(2 x sms / base)), never more splits than the prefix bound feeds with ``min_keys`` keys
    each. Returns an int in [1, TRITON_MAX_SPLITS].
    """
    base = max(1, base_programs)
    want = -(-2 * sms // base)
    by_length = max(1, -(-max(0, max_prefix) // min_keys))
    return max(1, min(want, by_length, TRITON_MAX_SPLITS))


def exact_attention_row_groups(base_programs: int, rows: int, sms: int) -> int:
    """Row groups a tile of the exact attention (triton/exact_attention.py) is split into: each
    group's program runs the tile's shared blocks and the per-row blocks of its own rows, so the
    per-row chain, the latency of a small launch, shortens. One wave: the kernel holds one
    program an SM at bf16 Dh 128 (243 registers x 256 threads), and a second wave would add its
    whole chain again.

    ``base_programs`` = tiles x B x Hkv x splits, the grid without groups; ``rows`` the tree rows
    a tile holds (at most N). Scheduling only: a row runs the same dots in the same order in any
    group, so unlike the exact kernel's block and split sizes this may follow B, N and the SM
    count. Returns an int in [1, max(rows, 1)].
    """
    want = -(-sms // max(1, base_programs))
    return max(1, min(want, rows))


# ----------------------------------------------------------------------------------------------
# Hidden top-K: the fused kernel or a GEMM plus log_softmax_topk
# ----------------------------------------------------------------------------------------------
# draft_tree_from_hidden can compute its per-depth top-K two ways (ops/draft_tree.py):
#   "fused": the backend's hidden_topk kernel (lm_head GEMM and top-K in one pass, no logits in
#            memory); reads lm_head once, so it is near the read floor at small B*D. Triton and
#            the reference have one; the cuda backend's (mma.sync) lost to Triton's by 1.5-3x
#            on the H200 and was deleted (a kernel that loses on hardware goes), so the cuda
#            backend always takes the GEMM path;
#   "gemm":  float32 logits [B*D, V] by torch (cuBLAS on a GPU), then the backend's
#            log_softmax_topk, over row chunks whose logits fit HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES;
#            costs the logits' write + read, but runs the GEMM at cuBLAS speed where the fused
#            kernels fall behind (docs/perf/hidden_topk.md).
# Per device type: the smallest B*D from which the GEMM path wins, None = never. An entry
# changes only with a GPU run that measured the crossover (bench_draft_tree.py's from_hidden rows
# <backend>:gemm against the fused ones, in the same run); until then auto keeps the fused kernel
# everywhere. To be measured at H 4096, V 151936 (Qwen3-8B): B*D is the GEMM's FLOPs per
# lm_head byte, so the crossover is a number of rows; V and H enter only through the logits'
# share of the traffic (their write + read is 4 * B*D / H of the bf16 lm_head read), small at
# H >= 4096.
HIDDEN_TOPK_GEMM_MIN_ROWS: dict[str, int | None] = {"cuda": None}
# The dtypes the crossover is measured for (tensor-core GEMMs; fp32 never measured: fused).
HIDDEN_TOPK_GEMM_DTYPES = (torch.float16, torch.bfloat16)
# The GEMM path's float32 logits buffer is at most this big (1 GiB: 1766 rows at V 151936; at
# least one row whatever V): bigger calls run in row chunks.
HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES = 1 << 30
HIDDEN_TOPK_METHODS = ("fused", "gemm")


def hidden_topk_method(rows: int, dtype: torch.dtype, device) -> str:
    """How ``method="auto"`` computes draft_tree_from_hidden's top-K: "fused" or "gemm".

    ``rows`` = B*D (hidden rows), ``dtype`` the hidden / lm_head dtype, ``device`` a
    torch.device or device string. "gemm" when the device type has a measured crossover in
    :data:`HIDDEN_TOPK_GEMM_MIN_ROWS` (None: never), ``dtype`` is one of
    :data:`HIDDEN_TOPK_GEMM_DTYPES` and ``rows`` reaches the crossover; "fused" otherwise (a
    backend without a fused kernel takes "gemm" whatever this says: ops/draft_tree.py). A
    function of static shapes only (fixed under CUDA-graph capture).
    """
    min_rows = HIDDEN_TOPK_GEMM_MIN_ROWS.get(torch.device(device).type)
    if min_rows is None or dtype not in HIDDEN_TOPK_GEMM_DTYPES or rows < min_rows:
        return "fused"
    return "gemm"


# ----------------------------------------------------------------------------------------------
# The greedy verify's argmax over the vocabulary (models.Qwen3.argmax)
# ----------------------------------------------------------------------------------------------
# The lm_head GEMM and the argmax run in vocabulary chunks so that the logits of a big verify
# (B16 x 256 nodes: 1.2 GB in bf16) never exist at once. A chunk costs two launches (the GEMM
# slice and its max) and the chunks' merge four, against three for one pass, so a call takes as
# few chunks as ARGMAX_CHUNK_BYTES of logits allow, and never more than chunks of
# ARGMAX_MIN_CHUNK columns would need (one pass at B1 x 64 nodes of Qwen3-8B: 19 MB).
ARGMAX_MIN_CHUNK = 32768
ARGMAX_CHUNK_BYTES = 32 << 20


def argmax_chunk(rows: int, vocab: int, elt: int) -> int:
    """Vocabulary columns per chunk of the chunked argmax over ``rows`` hidden rows (``elt``:
    bytes a logit): ``vocab`` (one pass) when the logits fit ARGMAX_CHUNK_BYTES; else the fewest
    chunks of at most max(ARGMAX_MIN_CHUNK, the columns that fit, a multiple of 256) columns,
    sized alike (a multiple of 256; the last one is the rest). Static shapes only."""
    fit = ARGMAX_CHUNK_BYTES // max(1, rows * elt)
    if fit >= vocab:
        return vocab
    most = max(ARGMAX_MIN_CHUNK, fit - fit % 256)
    n = -(-vocab // most)
    return min(vocab, -(-vocab // (n * 256)) * 256)
