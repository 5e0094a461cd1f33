"""commit_kv against python_ref: in-place K/V compaction (bit-exact) and the hidden-row gather, on
the cuda kernel (simulator, and a GPU: gpu) and Triton."""
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.tree import Verdict
from helpers import (DEV, api_backend, backend_module, backends, cache_layout, cu, fenced_empty,
                     paged, poisoned_empty, shuffled_table, sync)
from kernel_constants import cuda_constant

commit = backend_module("triton", "commit_kv")


@backends("sim", "cuda")
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("is_paged", [False, True])
# Rows of whole 16-byte units (16-byte copies) or not (element copies).
@pytest.mark.parametrize("dh,hdim", [(16, 24), (6, 20)])
def test_commit_kv(dev, cache_dtype, is_paged, dh, hdim):
    gen = torch.Generator().manual_seed(9)
    b, lmax, hkv, cols = 2, 64, 2, 5
    kc = torch.randn(b, lmax, hkv, dh, generator=gen).to(cache_dtype)
    table = None
    if is_paged:
        kc, table = paged(kc, 8, gen)
    vc = torch.randn(kc.shape, generator=gen).to(cache_dtype)
    prefix = torch.tensor([3, 20], dtype=torch.int32)
    path = torch.tensor([[0, 2, 3, 7, -1], [0, 1, 5, 6, 9]], dtype=torch.int32)
    accept = torch.tensor([3, 4], dtype=torch.int32)
    hidden = torch.randn(b, 12, hdim, generator=gen).to(torch.bfloat16)
    kr, vr = kc.clone(), vc.clone()
    want_lens, want_rows = ref.commit_kv(kr, vr, prefix, path, accept, table, hidden)
    kd, vd = kc.to(dev), vc.to(dev)
    with poisoned_empty():
        lens, rows = cu().commit_kv(kd, vd, prefix.to(dev), path.to(dev), accept.to(dev),
                                    None if table is None else table.to(dev), hidden.to(dev))
    sync(dev)
    assert torch.equal(lens.cpu(), want_lens) and torch.equal(rows.cpu(), want_rows)
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)


# ---------------------------------------------------------------- the triton kernel


def random_paths(B, M, N, gen, forced=None):
    """Increasing root-first paths with path[i] >= i (-1 padded) and their accept lengths;
    ``forced`` maps a sequence index to an explicit path."""
    path = torch.full((B, M), -1, dtype=torch.int32)
    acc = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        if forced and b in forced:
            nodes = forced[b]
        else:
            a = int(torch.randint(0, M, (), generator=gen))
            nodes = [0] + sorted(torch.randperm(N - 1, generator=gen)[:a].add(1).tolist())
        path[b, :len(nodes)] = torch.tensor(nodes, dtype=torch.int32)
        acc[b] = len(nodes) - 1
    return path, acc


def make_caches(B, cap, HKV, DH, dtype, page, fused, gen):
    """Random caches (as views of one fused K/V tensor when ``fused``) and a shuffled table."""
    if page is None:
        lead, table = (B, cap), None
    else:
        pages = -(-cap // page)
        table, lead = shuffled_table(B, pages, gen, spare=2), (B * pages + 2, page)
    if fused:
        kv = torch.randn(*lead, 2, HKV, DH, generator=gen).to(dtype)
        return kv[:, :, 0], kv[:, :, 1], table
    return (torch.randn(*lead, HKV, DH, generator=gen).to(dtype),
            torch.randn(*lead, HKV, DH, generator=gen).to(dtype), table)


def run_case(B, M, N, HKV, DH, dtype, page, fused, seed, forced=None, hidden_dim=None):
    gen = torch.Generator().manual_seed(seed)
    path, acc = random_paths(B, M, N, gen, forced)
    pre = torch.randint(0, 20, (B,), generator=gen, dtype=torch.int32)
    kc, vc, table = make_caches(B, 20 + N, HKV, DH, dtype, page, fused, gen)
    hidden = None
    if hidden_dim:
        hidden = torch.randn(B, N, hidden_dim + 5, generator=gen).to(dtype)[:, :, 3:3 + hidden_dim]
    kr, vr = kc.clone(), vc.clone()
    want_lens, want_rows = ref.commit_kv(kr, vr, pre, path, acc, block_table=table, hidden=hidden)

    to = lambda t: None if t is None else t.to(DEV)
    kd, vd = kc.to(DEV), vc.to(DEV)
    if fused:                                   # keep the interleaved layout on the device
        kv = torch.stack([kc, vc], dim=-3).to(DEV)
        kd, vd = kv.select(-3, 0), kv.select(-3, 1)
    new_lens = torch.full((B,), -7, dtype=torch.int32, device=DEV)
    rows = None
    if hidden is not None:
        rows = torch.full((B, M, hidden_dim), float("nan"), dtype=dtype, device=DEV)
    commit.launch(kd, vd, to(pre), to(path), to(acc), to(table), to(hidden), new_lens, rows)
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)
    assert new_lens.dtype == torch.int32 and torch.equal(new_lens.cpu(), want_lens)
    if hidden is not None:
        assert torch.equal(rows.cpu(), want_rows)
    return path, acc


# sequence 0..3 paths: nothing accepted; full depth in place; gaps; slot i is read (as the
# source of an earlier i) and then written (as a destination) within one commit
FORCED = {0: [0], 1: [0, 1, 2, 3, 4], 2: [0, 3, 7, 8], 3: [0, 2, 3, 4]}


@backends("triton")
@pytest.mark.parametrize("B,HKV,DH,dtype,page,fused", [
    (5, 2, 64, torch.float32, None, False),
    (5, 1, 16, torch.float16, 1, False),
    (7, 8, 128, torch.float32, 16, True),
    (4, 4, 128, torch.float16, None, True),
    (5, 2, 16, torch.float32, 16, False),
])
def test_parity_with_reference(B, HKV, DH, dtype, page, fused):
    path, acc = run_case(B, 5, 13, HKV, DH, dtype, page, fused, seed=B * HKV + DH,
                         forced=FORCED if B >= 4 else None, hidden_dim=24)
    assert acc[:4].tolist() == [0, 4, 3, 3]


@backends("triton")
def test_random_paths_many_sequences():
    run_case(9, 8, 24, 2, 16, torch.float32, 1, False, seed=3, hidden_dim=7)


@backends("triton")
def test_paths_from_real_verification():
    gen = torch.Generator().manual_seed(4)
    B, D, V, budget = 3, 5, 60, 16
    t = ref.draft_tree(torch.randn(B, D, V, generator=gen) * 3,
                       torch.zeros(B, dtype=torch.int32), budget, 3)
    target = t["tokens"].roll(-1, dims=1)          # often a child's token: non-trivial walks
    v = ref.verify_tree(t["tokens"], t["parents"], t["num_nodes"], min(D, budget - 1),
                        target_tokens=target)
    forced = {b: v["path"][b, :int(v["accept_len"][b]) + 1].tolist() for b in range(B)}
    run_case(B, min(D, budget - 1) + 1, budget, 2, 64, torch.float32, 16, False, seed=5,
             forced=forced, hidden_dim=33)


@backends("triton")
def test_public_api_dispatches_to_triton():
    gen = torch.Generator().manual_seed(6)
    B, M, N = 4, 5, 13
    path, acc = random_paths(B, M, N, gen, FORCED)
    verdict = Verdict(acc, path, torch.zeros(B, dtype=torch.int32), path.clone())
    pre = torch.tensor([0, 5, 19, 2], dtype=torch.int32)
    kc, vc, table = make_caches(B, 20 + N, 2, 32, torch.float32, 16, False, gen)
    hidden = torch.randn(B, N, 10, generator=gen)
    kr, vr = kc.clone(), vc.clone()
    got = jk.commit_kv(kc, vc, pre, verdict, block_table=table, hidden=hidden, backend="triton")
    want = jk.commit_kv(kr, vr, pre, verdict, block_table=table, hidden=hidden,
                        backend="reference")
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert torch.equal(got.prefix_lens, want.prefix_lens)
    assert torch.equal(got.hidden, want.hidden)
    none = jk.commit_kv(kc, vc, pre, verdict, block_table=table, backend="triton")
    assert none.hidden is None and torch.equal(none.prefix_lens, want.prefix_lens)


@backends("triton")
@pytest.mark.parametrize("page", [None, 16])
def test_bf16_qwen_shapes(page):
    """No tl.dot in the kernel, so bf16 runs under the interpreter too (about 1.5 s a case)."""
    run_case(16, 16, 64, 8, 128, torch.bfloat16, page, False, seed=7, forced=FORCED,
             hidden_dim=4096)


# ---------------------------------------------------------------- engine layouts
# tests/test_engine_layouts.py checks each layout against a contiguous copy on the same backend;
# this checks them against python_ref, in this op's own file.


@backends("triton", "sim", "cuda")
@pytest.mark.parametrize("is_paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", ["kv_halves", "kv_heads_major", "v_padded", "hidden_taps"])
def test_engine_layouts(backend, layout, is_paged):
    """Caches as K/V halves of one buffer, heads-major or with padded V rows, hidden rows as one
    layer's slice of [B, N, taps, Hh]: bit-exact with python_ref."""
    dev = backend.device
    gen = torch.Generator().manual_seed(len(layout) * 2 + is_paged)
    B, N, Hkv, Dh, Hh, L, page = 3, 7, 2, 16, 24, 18, 6
    k = torch.randn(B, L, Hkv, Dh, generator=gen).half()
    v = torch.randn(B, L, Hkv, Dh, generator=gen).half()
    table = None
    if is_paged:
        k, table = paged(k, page, gen)
        v, _ = paged(v, page, gen, table)
    taps = torch.randn(B, N, 3, Hh, generator=gen).half()
    hidden = taps[:, :, 1].contiguous()
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 3, 6], [0, -1, -1, -1]], dtype=torch.int32)
    accept = torch.tensor([2, 3, 0], dtype=torch.int32)
    prefix = torch.tensor([4, 0, 9], dtype=torch.int32)
    kr, vr = k.clone(), v.clone()
    want_lens, want_rows = ref.commit_kv(kr, vr, prefix, path, accept, table, hidden)
    kd, vd = k.to(dev), v.to(dev)
    hd = hidden.to(dev)
    if layout == "hidden_taps":
        hd = taps.to(dev)[:, :, 1]
    else:
        kd, vd = cache_layout(layout, kd, vd)
    verdict = jk.Verdict(accept.to(dev), path.to(dev), torch.zeros(B, dtype=torch.int32, device=dev),
                         path.to(dev))
    with poisoned_empty():
        got = jk.commit_kv(kd, vd, prefix.to(dev), verdict, block_table=None if table is None else
                           table.to(dev), hidden=hd, backend=api_backend(backend))
    sync(dev)
    assert torch.equal(got.prefix_lens.cpu(), want_lens) and torch.equal(got.hidden.cpu(), want_rows)
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)


# ---- the cuda kernels' loops at their boundaries ------------------------------------------------
# commit_kv.cuh: a slot's Hkv * Dh elements in units (16 bytes where every cache row allows, else
# one element), kCommitThreads threads a block, at most 64 blocks a sequence (the literal cap in
# commit_kv's `chunks`), so a row past 64 * kCommitThreads units loops; the hidden gather copies
# a row's units with one block of kCommitThreads threads.
COMMIT_THREADS = cuda_constant("commit_kv.cuh", "kCommitThreads")
COMMIT_MAX_CHUNKS = 64  # commit_kv.cuh commit_kv: min(ceil_div(units, kCommitThreads), 64)
_CAP = COMMIT_MAX_CHUNKS * COMMIT_THREADS

# (cache dtype, Hkv, Dh, hidden size, bf16 hidden): slot rows of exactly one block's units and one
# more (16-byte units: fp16 Dh 8), exactly the 64 blocks' units and one more (every thread loops
# once more), the same on the scalar path (float32 Dh 6: 24-byte heads); hidden rows of a block's
# units exactly, one more, and one element (scalar) past.
COMMIT_BOUNDARY = [
    (torch.float16, COMMIT_THREADS, 8, 8 * COMMIT_THREADS, True),
    (torch.float16, COMMIT_THREADS + 1, 8, 8 * COMMIT_THREADS + 8, True),
    (torch.float16, _CAP // 8, 64, 8 * COMMIT_THREADS + 1, True),
    (torch.float16, _CAP // 8 + 1, 64, 2 * COMMIT_THREADS + 1, False),
    (torch.float32, COMMIT_THREADS // 2, 6, COMMIT_THREADS, False),
    (torch.float32, _CAP // 6 + 1, 6, COMMIT_THREADS + 1, False),
]


@backends("sim", "cuda")
@pytest.mark.parametrize("dtype,hkv,dh,hdim,bf16", COMMIT_BOUNDARY,
                         ids=[f"{str(d)[6:]}-H{h}x{dh}-hidden{hd}" for d, h, dh, hd, _ in
                              COMMIT_BOUNDARY])
def test_commit_kv_rows_at_the_kernels_edges(backend, dtype, hkv, dh, hdim, bf16):
    """Slot rows and hidden rows whose units end exactly on a block's threads, on the last of the
    64 blocks' threads, or one unit past either: bit-exact caches and hidden rows."""
    dev = backend.device
    units = hkv * dh * torch.finfo(dtype).bits // 8 // (16 if dh * torch.finfo(dtype).bits % 128
                                                        == 0 else torch.finfo(dtype).bits // 8)
    assert units % COMMIT_THREADS in (0, 1) or units > _CAP
    gen = torch.Generator().manual_seed(hkv + dh)
    B, L = 2, 10
    k = torch.randn(B, L, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(B, L, hkv, dh, generator=gen).to(dtype)
    hidden = torch.randn(B, 6, hdim, generator=gen).to(torch.bfloat16 if bf16 else torch.float32)
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 3, 4]], dtype=torch.int32)
    accept = torch.tensor([2, 3], dtype=torch.int32)
    prefix = torch.tensor([1, 4], dtype=torch.int32)
    kr, vr = k.clone(), v.clone()
    want_lens, want_rows = ref.commit_kv(kr, vr, prefix, path, accept, None, hidden)
    kd, vd = k.to(dev), v.to(dev)
    verdict = jk.Verdict(accept.to(dev), path.to(dev), torch.zeros(B, dtype=torch.int32, device=dev),
                         path.to(dev))
    with fenced_empty():
        got = jk.commit_kv(kd, vd, prefix.to(dev), verdict, hidden=hidden.to(dev),
                           backend=api_backend(backend))
    sync(dev)
    assert torch.equal(got.prefix_lens.cpu(), want_lens) and torch.equal(got.hidden.cpu(), want_rows)
    assert torch.equal(kd.cpu(), kr) and torch.equal(vd.cpu(), vr)
