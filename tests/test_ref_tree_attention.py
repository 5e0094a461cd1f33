"""python_ref.tree_attention against an explicit per-query float64 loop (numpy)."""

import math

import numpy as np
import pytest
import torch

from jetspec_kernels import python_ref as R
from jetspec_kernels.python_ref.tree_attention import tree_attention_logical
from helpers import ancestor_set, rel_l2 as rel, shuffled_table


def random_tree_parents(N, gen):
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, N)]


def pack(rows, N):
    """rows: list over queries of sets of visible tail indices -> int32 [N, W] (two's complement)."""
    W = (N + 31) // 32
    out = np.zeros((N, W), dtype=np.int64)
    for i, s in enumerate(rows):
        for j in s:
            out[i, j // 32] |= 1 << (j % 32)
    out = np.where(out >= 2 ** 31, out - 2 ** 32, out)
    return torch.tensor(out, dtype=torch.int32)


def brute_attention(q, keys, vals, prefix_lens, visible_tail, scale):
    """q [B,N,Hq,Dh]; keys/vals: per-sequence logical arrays [L_b, Hkv, Dh];
    visible_tail[b][i] = set of visible tail indices j. Returns out [B,N,Hq,Dh], lse [B,Hq,N]."""
    q = q.double().numpy()
    B, N, Hq, Dh = q.shape
    Hkv = keys[0].shape[1]
    out = np.zeros((B, N, Hq, Dh))
    lse = np.full((B, Hq, N), -np.inf)
    for b in range(B):
        P = prefix_lens[b]
        K = keys[b].double().numpy()
        V = vals[b].double().numpy()
        for i in range(N):
            visible = list(range(P)) + [P + j for j in sorted(visible_tail[b][i])]
            for h in range(Hq):
                hk = h // (Hq // Hkv)
                if not visible:
                    continue
                s = [scale * float(np.dot(q[b, i, h], K[p, hk])) for p in visible]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = sum(w)
                lse[b, h, i] = m + math.log(z)
                out[b, i, h] = sum(wk / z * V[p, hk] for wk, p in zip(w, visible))
    return out, lse


def make_caches(keys, vals, Lmax, paged, page_size, gen):
    """Place logical K/V into a NaN-poisoned contiguous or paged cache."""
    B = len(keys)
    Hkv, Dh = keys[0].shape[1:]
    dt = keys[0].dtype
    if not paged:
        kc = torch.full((B, Lmax, Hkv, Dh), float("nan"), dtype=dt)
        vc = kc.clone()
        for b in range(B):
            kc[b, :len(keys[b])] = keys[b]
            vc[b, :len(vals[b])] = vals[b]
        return kc, vc, None
    max_pages = (Lmax + page_size - 1) // page_size
    num_pages = B * max_pages + 3
    bt = shuffled_table(B, max_pages, gen, spare=3)
    kc = torch.full((num_pages, page_size, Hkv, Dh), float("nan"), dtype=dt)
    vc = kc.clone()
    for b in range(B):
        for p in range(len(keys[b])):
            kc[bt[b, p // page_size], p % page_size] = keys[b][p]
            vc[bt[b, p // page_size], p % page_size] = vals[b][p]
    return kc, vc, bt


def run_case(B, N, Hq, Hkv, Dh, prefix_lens, mode, paged, dtype=torch.float64, scale=None, seed=0,
             page_size=4, attend=R.tree_attention):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, Hq, Dh, generator=gen, dtype=torch.float64).to(dtype)
    keys = [torch.randn(P + N, Hkv, Dh, generator=gen, dtype=torch.float64).to(dtype) for P in prefix_lens]
    vals = [torch.randn(P + N, Hkv, Dh, generator=gen, dtype=torch.float64).to(dtype) for P in prefix_lens]
    Lmax = max(prefix_lens) + N + 5
    kc, vc, bt = make_caches(keys, vals, Lmax, paged, page_size, gen)
    if mode == "tree":
        vis, masks = [], []
        for b in range(B):
            par = random_tree_parents(N, gen)
            rows = [ancestor_set(par, i) for i in range(N)]
            vis.append(rows)
            masks.append(pack(rows, N))
        tree_mask, tail = torch.stack(masks), "causal"
    else:
        tree_mask, tail = None, mode
        vis = [[set(range(i + 1)) if mode == "causal" else set(range(N)) for i in range(N)]] * B
    pl = torch.tensor(prefix_lens, dtype=torch.int32)
    out, lse = attend(q, kc, vc, pl, tree_mask, tail, bt, scale)
    s = 1.0 / math.sqrt(Dh) if scale is None else scale
    ref_out, ref_lse = brute_attention(q, keys, vals, prefix_lens, vis, s)
    return out, lse, ref_out, ref_lse


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("mode", ["tree", "causal", "full"])
def test_tree_attention_vs_loop(mode, paged):
    out, lse, ro, rl = run_case(3, 6, 4, 2, 8, [0, 3, 9], mode, paged, seed=1)
    assert out.shape == (3, 6, 4, 8) and lse.shape == (3, 4, 6)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert rel(out, ro) < 1e-12
    assert rel(lse, rl) < 1e-12


@pytest.mark.parametrize("paged", [False, True])
def test_tree_attention_multiword_mask(paged):
    # N=40: two mask words, bit 31 (int32 sign bit) in use; MHA (Hq == Hkv).
    out, lse, ro, rl = run_case(2, 40, 2, 2, 4, [5, 0], "tree", paged, seed=2, page_size=8)
    assert rel(out, ro) < 1e-12 and rel(lse, rl) < 1e-12


def test_tree_attention_gqa_group4_and_scale():
    out, lse, ro, rl = run_case(2, 5, 8, 2, 16, [7, 2], "tree", False, scale=0.3, seed=3)
    assert rel(out, ro) < 1e-12 and rel(lse, rl) < 1e-12


def test_tree_attention_float32_compute():
    out, lse, ro, rl = run_case(2, 6, 4, 1, 8, [4, 1], "tree", True, dtype=torch.float32, seed=4)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert rel(out, ro) < 1e-5 and rel(lse, rl) < 1e-5


def test_tree_attention_half_inputs_compute_in_float32():
    out, lse, ro, rl = run_case(1, 4, 2, 1, 8, [3], "causal", False, dtype=torch.float16, seed=5)
    assert out.dtype == torch.float32
    assert rel(out, ro) < 1e-5   # the brute force sees the same fp16-rounded inputs


def test_tree_attention_no_visible_key_gives_zero_not_nan():
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    kc = torch.randn(1, 4, 1, 4, dtype=torch.float64)
    vc = torch.randn(1, 4, 1, 4, dtype=torch.float64)
    mask = torch.tensor([[[0], [3]]], dtype=torch.int32)   # row 0 sees nothing (prefix 0)
    out, lse = R.tree_attention(q, kc, vc, torch.tensor([0], dtype=torch.int32), mask)
    assert torch.equal(out[0, 0], torch.zeros(1, 4, dtype=torch.float64))
    assert torch.isneginf(lse[0, 0, 0])
    assert torch.isfinite(out).all() and torch.isfinite(lse[0, 0, 1])


def test_tree_attention_only_reads_visible_positions():
    # Changing an invisible tail key (a non-ancestor) must not change the result; changing a
    # visible one must.
    gen = torch.Generator().manual_seed(6)
    B, N, H, Dh, P = 1, 3, 1, 4, 2
    q = torch.randn(B, N, H, Dh, generator=gen, dtype=torch.float64)
    kc = torch.randn(B, P + N, H, Dh, generator=gen, dtype=torch.float64)
    vc = torch.randn(B, P + N, H, Dh, generator=gen, dtype=torch.float64)
    mask = pack([{0}, {0, 1}, {0, 2}], N).unsqueeze(0)   # nodes 1 and 2 are siblings
    pl = torch.tensor([P], dtype=torch.int32)
    out, _ = R.tree_attention(q, kc, vc, pl, mask)
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[0, P + 2] += 5.0
    vc2[0, P + 2] += 5.0
    out2, _ = R.tree_attention(q, kc2, vc2, pl, mask)
    assert torch.equal(out[0, :2], out2[0, :2])
    assert not torch.allclose(out[0, 2], out2[0, 2])


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("mode", ["tree", "causal", "full"])
def test_tree_attention_logical_vs_loop(mode, paged):
    """The exact mode's row form (each query alone over its visible keys gathered in logical
    order) against the same loop; N = 40: two mask words."""
    for n, seed in ((6, 1), (40, 2)):
        out, lse, ro, rl = run_case(3, n, 4, 2, 8, [0, 3, 9], mode, paged, seed=seed,
                                    attend=tree_attention_logical)
        assert out.shape == (3, n, 4, 8) and lse.shape == (3, 4, n)
        assert rel(out, ro) < 1e-12 and rel(lse, rl) < 1e-12
