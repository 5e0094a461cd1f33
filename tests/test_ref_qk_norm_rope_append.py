"""python_ref RoPE / qk_norm_rope_append against numpy float64 brute force (RoPE as a
complex-number rotation)."""

import numpy as np
import pytest
import torch

from jetspec_kernels import python_ref as R
from helpers import np_rms_norm


def np_angles(pos, Dh, theta):
    """The documented convention: float32 inv_freq (correctly rounded), one float32 multiply."""
    inv = np.array([theta ** (-2.0 * i / Dh) for i in range(Dh // 2)], dtype=np.float64)
    inv32 = inv.astype(np.float32)
    return (np.float32(pos) * inv32).astype(np.float64)


def np_rope_vec(x, pos, theta):
    """Rotate one head vector x [Dh]: pairs (x[i], x[i + Dh/2]) are complex numbers."""
    x = np.asarray(x, dtype=np.float64)
    Dh = x.shape[-1]
    h = Dh // 2
    z = (x[:h] + 1j * x[h:]) * np.exp(1j * np_angles(pos, Dh, theta))
    return np.concatenate([z.real, z.imag])


@pytest.mark.parametrize("Dh,theta", [(8, 10000.0), (64, 1e6), (16, 500.0)])
def test_apply_rope_is_complex_rotation(Dh, theta):
    g = torch.Generator().manual_seed(Dh)
    B, N, H = 2, 5, 3
    x = torch.randn(B, N, H, Dh, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 40000, (B, N), generator=g, dtype=torch.int32)
    y = R.apply_rope(x, pos, theta)
    assert y.shape == x.shape and y.dtype == torch.float64
    for b in range(B):
        for n in range(N):
            for hh in range(H):
                expect = np_rope_vec(x[b, n, hh].numpy(), int(pos[b, n]), theta)
                assert np.allclose(y[b, n, hh].numpy(), expect, rtol=0, atol=1e-12)


def test_apply_rope_properties():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 2, 32, generator=g, dtype=torch.float64)
    # position 0 is the identity; rotation preserves the norm of each head vector
    assert torch.equal(R.apply_rope(x, torch.zeros(1, 4, dtype=torch.int32), 1e4), x)
    pos = torch.tensor([[1, 7, 100, 3000]], dtype=torch.int32)
    y = R.apply_rope(x, pos, 1e4)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-13)
    # relative-position property: <rope(q, m), rope(k, n)> depends on m - n only (exact math;
    # the float32 angle makes it hold to ~1e-5 at these positions)
    q = torch.randn(1, 1, 1, 32, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 32, generator=g, dtype=torch.float64)
    def dot(m, n):
        return (R.apply_rope(q, torch.tensor([[m]]), 1e4) * R.apply_rope(k, torch.tensor([[n]]), 1e4)).sum().item()
    assert abs(dot(10, 3) - dot(107, 100)) < 1e-4 * (q.norm() * k.norm()).item()
    # the float32-angle convention is within float32 rounding of exact real angles
    Dh, theta, p = 32, 1e4, 50
    h = Dh // 2
    xv = x[0, 0, 0].numpy()
    exact = (xv[:h] + 1j * xv[h:]) * np.exp(1j * p * theta ** (-2.0 * np.arange(h) / Dh))
    got = R.apply_rope(x[:, :1, :1], torch.tensor([[p]]), theta)[0, 0, 0].numpy()
    assert np.abs(got - np.concatenate([exact.real, exact.imag])).max() < 1e-5


def test_rope_broadcast_positions():
    # positions [T] broadcast over batch (as the draft head uses it)
    x = torch.randn(2, 3, 1, 8, dtype=torch.float64)
    p = torch.tensor([4, 5, 6])
    assert torch.equal(R.apply_rope(x, p, 1e4), R.apply_rope(x, p.expand(2, 3), 1e4))


def expected_append(q, k, v, qw, kw, pos, theta, eps):
    B, N, Hq, Dh = q.shape
    Hkv = k.shape[2]
    qo = np.zeros((B, N, Hq, Dh))
    ko = np.zeros((B, N, Hkv, Dh))
    for b in range(B):
        for n in range(N):
            p = int(pos[b, n])
            for h in range(Hq):
                qo[b, n, h] = np_rope_vec(np_rms_norm(q[b, n, h].double().numpy(), qw.double().numpy(), eps), p, theta)
            for h in range(Hkv):
                ko[b, n, h] = np_rope_vec(np_rms_norm(k[b, n, h].double().numpy(), kw.double().numpy(), eps), p, theta)
    return qo, ko


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("use_cache_start", [False, True])
@pytest.mark.parametrize("cache_dtype", [torch.float64, torch.float16])
def test_qk_norm_rope_append(paged, use_cache_start, cache_dtype):
    g = torch.Generator().manual_seed(7)
    B, N, Hq, Hkv, Dh, theta, eps = 2, 4, 4, 2, 8, 1e6, 1e-6
    q = torch.randn(B, N, Hq, Dh, generator=g, dtype=torch.float64)
    k = torch.randn(B, N, Hkv, Dh, generator=g, dtype=torch.float64)
    v = torch.randn(B, N, Hkv, Dh, generator=g, dtype=torch.float64)
    qw = torch.rand(Dh, generator=g, dtype=torch.float64) + 0.5
    kw = torch.rand(Dh, generator=g, dtype=torch.float64) + 0.5
    prefix = torch.tensor([3, 6], dtype=torch.int32)
    if use_cache_start:
        # tree verification: RoPE at prefix + depth (repeated positions), slot prefix + n
        depth = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]], dtype=torch.int32)
        pos = prefix[:, None] + depth
    else:
        # plain append: slot = position (not necessarily consecutive)
        pos = torch.tensor([[3, 4, 5, 9], [6, 7, 8, 2]], dtype=torch.int32)
    cache_start = prefix if use_cache_start else None
    # logical slot of row n
    slots = (prefix[:, None] + torch.arange(N)) if use_cache_start else pos
    L = 12
    page_size = 4
    if paged:
        bt = torch.tensor([[5, 0, 2], [1, 4, 3]], dtype=torch.int32)
        kc = torch.full((6, page_size, Hkv, Dh), -7.0, dtype=cache_dtype)
    else:
        bt = None
        kc = torch.full((B, L, Hkv, Dh), -7.0, dtype=cache_dtype)
    vc = kc.clone()
    q_out = R.qk_norm_rope_append(q, k, v, qw, kw, pos, kc, vc, theta, eps, bt, cache_start)
    qo, ko = expected_append(q, k, v, qw, kw, pos, theta, eps)
    assert q_out.dtype == torch.float64
    assert np.allclose(q_out.numpy(), qo, rtol=0, atol=1e-12)

    def loc(b, p):
        return (b, p) if bt is None else (int(bt[b, p // page_size]), p % page_size)

    written = set()
    for b in range(B):
        for n in range(N):
            i0, i1 = loc(b, int(slots[b, n]))
            written.add((i0, i1))
            exp_k = torch.tensor(ko[b, n])
            # float64 cache: rounding-level agreement; fp16 cache: within one fp16 ulp
            tol = 1e-12 if cache_dtype == torch.float64 else 2.0 ** -10 * exp_k.abs() + 1e-7
            assert ((kc[i0, i1].double() - exp_k).abs() <= tol).all(), (b, n)
            assert torch.equal(vc[i0, i1], v[b, n].to(cache_dtype)), (b, n)
    # every other slot untouched
    for i0 in range(kc.shape[0]):
        for i1 in range(kc.shape[1]):
            if (i0, i1) not in written:
                assert (kc[i0, i1] == -7).all() and (vc[i0, i1] == -7).all()


def test_qk_norm_rope_append_float32_compute():
    g = torch.Generator().manual_seed(8)
    q = torch.randn(1, 2, 2, 8, generator=g)
    k = torch.randn(1, 2, 1, 8, generator=g)
    v = torch.randn(1, 2, 1, 8, generator=g)
    w = torch.ones(8)
    kc = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    vc = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    pos = torch.tensor([[1, 2]], dtype=torch.int32)
    q_out = R.qk_norm_rope_append(q, k, v, w, w, pos, kc, vc, 1e4)
    assert q_out.dtype == torch.float32
    qo, ko = expected_append(q, k, v, w, w, pos, 1e4, 1e-6)
    assert np.abs(q_out.double().numpy() - qo).max() < 1e-5
    assert ((kc[0, 1:3].double() - torch.tensor(ko[0])).abs() <= 2.0 ** -7 * torch.tensor(ko[0]).abs()).all()
    assert not (kc[0, 0] != 0).any() and not (kc[0, 3] != 0).any()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("use_cache_start", [False, True])
def test_kv_only_append_matches_full_call(paged, use_cache_start):
    """q=None writes exactly the caches the full call writes, touches nothing else, returns None."""
    g = torch.Generator().manual_seed(11)
    B, N, Hq, Hkv, Dh, theta, eps = 2, 3, 4, 2, 8, 1e4, 1e-6
    q = torch.randn(B, N, Hq, Dh, generator=g, dtype=torch.float64)
    k = torch.randn(B, N, Hkv, Dh, generator=g, dtype=torch.float64)
    v = torch.randn(B, N, Hkv, Dh, generator=g, dtype=torch.float64)
    kw = torch.rand(Dh, generator=g, dtype=torch.float64) + 0.5
    pos = torch.tensor([[5, 6, 7], [1, 2, 3]], dtype=torch.int32)
    start = torch.tensor([2, 8], dtype=torch.int32) if use_cache_start else None
    bt = torch.tensor([[3, 0, 1], [2, 5, 4]], dtype=torch.int32) if paged else None
    shape = (6, 4, Hkv, Dh) if paged else (B, 12, Hkv, Dh)
    kc_full = torch.full(shape, -7.0, dtype=torch.float64)
    vc_full = kc_full.clone()
    R.qk_norm_rope_append(q, k, v, torch.ones(Dh, dtype=torch.float64), kw, pos, kc_full, vc_full,
                          theta, eps, bt, start)
    kc, vc = torch.full_like(kc_full, -7.0), torch.full_like(vc_full, -7.0)
    assert R.qk_norm_rope_append(None, k, v, None, kw, pos, kc, vc, theta, eps, bt, start) is None
    assert torch.equal(kc, kc_full) and torch.equal(vc, vc_full)
    # and the written values are the documented ones (checked against numpy)
    _, ko = expected_append(q, k, v, kw, kw, pos, theta, eps)
    slots = (start[:, None] + torch.arange(N)) if use_cache_start else pos
    for b in range(B):
        for n in range(N):
            s = int(slots[b, n])
            i0, i1 = (b, s) if bt is None else (int(bt[b, s // 4]), s % 4)
            assert np.allclose(kc[i0, i1].numpy(), ko[b, n], rtol=0, atol=1e-12)
            assert torch.equal(vc[i0, i1], v[b, n])
    assert int((kc != -7.0).all(-1).all(-1).sum()) == B * N
