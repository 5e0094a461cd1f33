"""The exact mode's ops (jetspec_kernels.ops.exact, tree_attention(exact=True)): every row is the
same bits as the one-row call (and as the decode step at the same logical position, for
attention), whatever the launch's other rows hold. The normal forms are shown to break it on
this machine where they do (the tests' power): float32 GEMMs and tree attention."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jetspec_kernels as jk  # noqa: E402
from bench.exact_invariance import (op_cases, row_mismatches, same_bits,  # noqa: E402
                                    tree_vs_decode_mismatches)
from jetspec_kernels.ops import exact as ex  # noqa: E402
from helpers import rel_l2  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_exact_op_is_row_invariant(dtype):
    for op, shape, _, exact, inputs in op_cases(dtype, quick=True):
        bad = row_mismatches(exact, inputs, torch.Generator().manual_seed(3))
        assert bad == 0, f"exact {op} {shape} {dtype}: {bad} of {inputs[0].shape[0]} rows differ"


def test_exact_linear_at_random_row_counts():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(96, 80, generator=gen)
    for m in (1, 2, 7, 33):
        x = torch.randn(3, m, 80, generator=gen)
        out = ex.linear(x, w)
        assert out.shape == (3, m, 96)
        for b in range(3):
            for i in range(m):
                assert same_bits(out[b, i], F.linear(x[b, i][None].clone(), w)[0])


def test_normal_float32_linear_is_not_row_invariant():
    """The power of the row checks: on this machine torch's float32 GEMM gives a row other bits
    inside an M-row launch than alone (an M = 1 GEMV)."""
    for op, shape, normal, _, inputs in op_cases(torch.float32, quick=True):
        if op.startswith("linear"):
            assert row_mismatches(normal, inputs, torch.Generator().manual_seed(3)) > 0, op


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("prefix,n,page_size,pad", [
    (0, 1, None, 0), (5, 16, None, 0), (31, 16, 16, 0), (13, 24, 4, 5), (62, 40, 1, 0),
    (100, 33, None, 3), (16, 16, 16, 0)])
def test_exact_tree_row_equals_decode_row(dtype, prefix, n, page_size, pad):
    gen = torch.Generator().manual_seed(prefix * 100 + n)
    bad = tree_vs_decode_mismatches(prefix, n, dtype, gen, exact=True, page_size=page_size, pad=pad)
    assert bad == 0


@pytest.mark.parametrize("shape", ["chain", "wide"])
def test_exact_tree_row_equals_decode_row_deep_and_wide(shape):
    n = 48
    if shape == "chain":
        parents = torch.arange(-1, n - 1, dtype=torch.int32)[None]
    else:
        parents = torch.zeros(1, n, dtype=torch.int32)
        parents[0, 0] = -1
    gen = torch.Generator().manual_seed(9)
    assert tree_vs_decode_mismatches(29, n, torch.bfloat16, gen, exact=True, page_size=8,
                                     parents=parents) == 0


def test_normal_tree_attention_is_not_decode_invariant():
    """The power: tree rows of the normal form differ from decode rows (float32 here; bf16 too,
    less often: docs/perf/exact_mode.md)."""
    gen = torch.Generator().manual_seed(5)
    assert tree_vs_decode_mismatches(37, 16, torch.float32, gen, exact=False) > 0


def test_exact_tree_attention_returns_lse_and_writes_out():
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 3, 4, 16, generator=gen)
    k, v = torch.randn(2, 12, 2, 16, generator=gen), torch.randn(2, 12, 2, 16, generator=gen)
    pl = torch.tensor([4, 9], dtype=torch.int32)
    want, want_lse = jk.tree_attention(q, k, v, pl, return_lse=True, backend="reference")
    out, lse = torch.full_like(q, float("nan")), torch.full((2, 4, 3), float("nan"))
    got, got_lse = jk.tree_attention(q, k, v, pl, out=out, lse=lse, exact=True)
    assert got is out and got_lse is lse
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-6, atol=1e-6)


def test_exact_refuses_what_is_not_invariant():
    q = torch.randn(1, 2, 4, 16)
    k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    pl = torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ex.ExactModeError, match="tree_attention on the 'cuda' backend"):
        jk.tree_attention(q, k, v, pl, exact=True, backend="cuda")
    with pytest.raises(ex.ExactModeError, match="silu_mul on the 'cuda' backend"):
        ex.silu_mul(torch.randn(2, 8), backend="cuda")
    with pytest.raises(ex.ExactModeError, match="rms_norm on the 'cuda' backend"):
        ex.rms_norm(torch.randn(2, 8), torch.ones(8), backend="cuda")
    with pytest.raises(TypeError, match="exact must be a bool"):
        jk.tree_attention(q, k, v, pl, exact=1)
    for backend in ("reference", "triton"):     # a tile name is checked on every path
        with pytest.raises(ValueError, match="tile must be one of"):
            ex.linear(torch.randn(2, 8), torch.randn(4, 8), backend=backend, tile="square")


def test_exact_triton_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET the exact GEMM (which launches its kernel itself) refuses as the
    ops behind backend.select do, with BackendUnavailableError, not triton's driver error."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(jk.BackendUnavailableError, match="exact mode: linear on the 'triton' "
                                                         "backend is not available: CPU tensors"):
        ex.linear(x, w, backend="triton")
    with pytest.raises(jk.BackendUnavailableError, match="TRITON_INTERPRET"):
        ex.rms_norm(x, torch.ones(8), backend="triton")
    assert ex.linear(x, w, backend="reference").shape == (2, 4)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with ex.exact_mode("yes"):
            pass


def test_exact_mode_is_scoped_and_nests():
    assert not ex.exact_enabled()
    with ex.exact_mode():
        assert ex.exact_enabled()
        with ex.exact_mode(False):
            assert not ex.exact_enabled()
        assert ex.exact_enabled()
    assert not ex.exact_enabled()


def test_per_row_keeps_shapes_of_empty_and_tuple_outputs():
    x = torch.randn(0, 3, 8)
    assert ex.per_row(lambda r: r * 2, x).shape == (0, 3, 8)
    a, b = ex.per_row(lambda r, s: (r + s, r - s), torch.randn(2, 5, 4), torch.randn(2, 5, 4))
    assert a.shape == b.shape == (2, 5, 4)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "meta"])
def test_exact_on_a_gpu_only_where_shown(device, monkeypatch):
    """A GPU runs the exact mode on triton only on a device model the hardware record lists (or
    with JETSPEC_EXACT_UNVERIFIED=1); the reference on a GPU (torch's kernels) and any other
    device are refused by name (a device, not a tensor: no GPU needed)."""
    dev = torch.device(device)
    monkeypatch.delenv(ex.UNVERIFIED_ENV, raising=False)
    if dev.type == "meta":
        for backend in ("auto", "reference", "triton"):
            with pytest.raises(ex.ExactModeError, match="rms_norm on meta "):
                ex.exact_backend("rms_norm", dev, backend)
        return
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    with pytest.raises(ex.ExactModeError, match="rms_norm on cuda with the reference backend"):
        ex.exact_backend("rms_norm", dev, "reference")
    with pytest.raises(ex.ExactModeError, match="on cuda with the reference backend"):
        ex.exact_scope(True, dev, "reference")
    for backend in ("auto", "triton"):
        with pytest.raises(ex.ExactModeError,
                           match=r"tree_attention on cuda \(NVIDIA H100 80GB HBM3\) is not shown"):
            ex.exact_backend("tree_attention", dev, backend)
    monkeypatch.setattr(ex, "exact_verified_devices", lambda: ("NVIDIA H100 80GB HBM3",))
    assert ex.exact_backend("tree_attention", dev, "auto") == "triton"
    monkeypatch.setattr(ex, "exact_verified_devices", lambda: ("NVIDIA H200",))
    with pytest.raises(ex.ExactModeError, match="not shown"):
        ex.exact_backend("linear", dev, "triton")
    monkeypatch.setenv(ex.UNVERIFIED_ENV, "1")
    assert ex.exact_backend("linear", dev, "triton") == "triton"


def test_exact_verified_devices_reads_the_record(monkeypatch, tmp_path):
    from jetspec_kernels import backend as bk
    assert isinstance(ex.exact_verified_devices(), tuple)
    for text, want in (('{"trusted": {}, "rows": []}', ()),
                       ('{"exact": {"triton": ["NVIDIA H200"]}}', ("NVIDIA H200",))):
        path = tmp_path / "record.json"
        path.write_text(text)
        monkeypatch.setattr(bk, "HARDWARE_RECORD", path)
        ex.exact_verified_devices.cache_clear()
        assert ex.exact_verified_devices() == want
    path.write_text('{"exact": {"triton": "NVIDIA H200"}}')
    ex.exact_verified_devices.cache_clear()
    with pytest.raises(ValueError, match="must be a list of device names"):
        ex.exact_verified_devices()
    monkeypatch.undo()
    ex.exact_verified_devices.cache_clear()


def test_sample_at_positions_keys_each_draw_by_seed_and_position():
    """The exact sampler's noise is keyed by (seed[b], positions[b, i], b): nodes at one position
    draw alike and at distinct positions not; a new seed for sequence 1 changes its draws and no
    other; moving one node changes that draw alone; a node draws as a one-node call would."""
    v = 4096
    logits = torch.zeros(2, 8, v)          # uniform: each draw is the noise's argmax
    pos = torch.tensor([[5, 6, 6, 7, 7, 7, 8, 9], [3, 4, 5, 6, 7, 8, 9, 10]], dtype=torch.int32)
    seed = torch.tensor([11, 12])

    def draw(s, p, lg=logits):
        return ex.sample_at_positions(lg, p, s, 1.0)

    base = draw(seed, pos)
    assert base.dtype == torch.int32 and base.shape == (2, 8)
    assert base[0, 1] == base[0, 2] and base[0, 3] == base[0, 4] == base[0, 5]
    assert len(set(base[1].tolist())) == 8
    reseeded = draw(torch.tensor([11, 13]), pos)
    assert torch.equal(reseeded[0], base[0]) and bool((reseeded[1] != base[1]).all())
    moved = pos.clone()
    moved[1, 4] += 100
    shifted = draw(seed, moved)
    assert torch.equal(shifted[0], base[0])
    assert (shifted[1] != base[1]).nonzero().flatten().tolist() == [4]
    for i in range(8):
        assert torch.equal(draw(seed, pos[:, i:i + 1], logits[:, i:i + 1])[:, 0], base[:, i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sum_in_order_adds_every_part_in_the_given_order_rounding_once(dtype):
    """ops.exact.sum_in_order (the tp rank-order reduction, the MoE choices): float32 sums left to
    right over all the parts, one rounding to the parts' dtype; for float32 parts another order
    gives other bits (the check's power)."""
    gen = torch.Generator().manual_seed(6)
    parts = [(torch.randn(5, 7, generator=gen) * s).to(dtype) for s in (1e7, 1.0, -1e7, 1e-3)]
    got = ex.sum_in_order(parts)
    total = parts[0].float()
    for p in parts[1:]:
        total = total + p.float()
    assert got.dtype == dtype and torch.equal(got, total.to(dtype))
    if dtype == torch.float32:
        assert not torch.equal(total, parts[3] + parts[2] + parts[1] + parts[0])
    assert torch.equal(ex.sum_in_order(parts[:1]), parts[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sum_pairwise_is_one_fixed_tree_that_nests(dtype):
    """ops.exact.sum_pairwise (the tensor-parallel reduction, K parts): (0+1)+(2+3) in float32,
    an odd last part carried up, rounded once; the tree over 8 parts is the tree over two runs of
    4 (a rank's parts), and over four runs of 2; a left-to-right sum gives other bits (the power)."""
    gen = torch.Generator().manual_seed(7)
    parts = [(torch.randn(6, 9, generator=gen) * s).to(dtype)
             for s in (1e7, 1.0, -1e7, 1e-3, 3e5, -2.0, 1e-6, -3e5)]
    f = [p.float() for p in parts]
    assert torch.equal(ex.sum_pairwise(parts[:4]), (f[0] + f[1]) + (f[2] + f[3]))
    assert torch.equal(ex.sum_pairwise(parts[:3]), (f[0] + f[1]) + f[2])
    assert torch.equal(ex.sum_pairwise(parts[:5]), ((f[0] + f[1]) + (f[2] + f[3])) + f[4])
    assert torch.equal(ex.sum_pairwise(parts[:1], dtype), parts[0])
    whole = ex.sum_pairwise(parts)
    assert whole.dtype == torch.float32
    assert torch.equal(whole, ex.sum_pairwise([ex.sum_pairwise(parts[:4]), ex.sum_pairwise(parts[4:])]))
    assert torch.equal(whole, ex.sum_pairwise([ex.sum_pairwise(parts[i:i + 2]) for i in range(0, 8, 2)]))
    assert torch.equal(ex.sum_pairwise(parts, dtype), whole.to(dtype))
    left = f[0]
    for p in f[1:]:
        left = left + p
    assert not torch.equal(left, whole)
    with pytest.raises(ValueError, match="at least one"):
        ex.sum_pairwise([])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_in_k_parts_equals_ranks_holding_them(dtype):
    """ops.exact.linear(parts=P) on the reference: tp ranks (1, 2, 4, ... dividing P) each
    reducing their slices' parts unrounded and summed along the pairwise tree give the one-rank
    result bit for bit (what lets tp t equal tp 1); rows stay launch-invariant; the split is part
    of a row's bits (parts 4's float32 sums differ from parts 1's: the power)."""
    from helpers import k_parts_as_ranks
    gen = torch.Generator().manual_seed(8)
    for n, k in ((48, 256), (13, 200), (7, 40)):   # N % 4 and K / parts odd: the CPU GEMV's edges
        x = (torch.randn(5, k, generator=gen) * torch.logspace(-2, 2, k)).to(dtype)
        w = torch.randn(n, k, generator=gen).to(dtype)
        _parts_equal_ranks(x, w, dtype, k_parts_as_ranks)


def _parts_equal_ranks(x, w, dtype, k_parts_as_ranks):
    for parts in (1, 2, 4, 8):
        full = ex.linear(x, w, parts=parts)
        assert full.dtype == dtype
        for ranks in (r for r in (2, 4, 8) if parts % r == 0):
            assert same_bits(k_parts_as_ranks(ex.linear, x, w, parts, ranks), full), (parts, ranks)
        for i in (0, 4):
            assert same_bits(ex.linear(x[i:i + 1].clone(), w, parts=parts)[0], full[i])
        assert rel_l2(full.double(), F.linear(x.double(), w.double())) < (1e-5 if dtype == torch.float32 else 1e-2)
    # unrounded (16-bit outputs round most float32 differences away)
    assert not torch.equal(ex.linear(x, w, parts=4, partial=True), ex.linear(x, w, partial=True))
    assert torch.equal(ex.linear(x, w, parts=2, partial=True).to(dtype), ex.linear(x, w, parts=2))


def test_linear_parts_limits_and_bad_arguments():
    """parts: a power of two up to limits.EXACT_MAX_K_PARTS (64) dividing K; 128, 3, 8 not
    dividing 12, 0, floats and bools refused by name."""
    x, w = torch.randn(2, 128), torch.randn(8, 128)
    torch.testing.assert_close(ex.linear(x, w, parts=64), F.linear(x, w), rtol=1e-5, atol=1e-5)
    for parts, k in ((128, 128), (3, 12), (8, 12), (0, 12), (2.0, 12), (True, 12)):
        with pytest.raises(ValueError, match=f"parts must be a power of two <= 64 dividing K = {k}"):
            ex.linear(torch.randn(2, k), torch.randn(8, k), parts=parts)


def test_silu_mul_column_bits_do_not_follow_the_row_length():
    """ops.exact.silu_mul on the reference: a column's bits are the same in a row of I and in a
    tensor-parallel rank's slice of it (I / 2, I / 4), where the CPU's vector loop would give
    the slice's last elements a scalar tail (float32 I 48 and 40 differed before the padding)."""
    gen = torch.Generator().manual_seed(12)
    for i in (24, 40, 48, 100, 200):
        gate, up = torch.randn(3, i, generator=gen) * 3, torch.randn(3, i, generator=gen)
        full = ex.silu_mul(torch.cat([gate, up], -1))
        torch.testing.assert_close(full, F.silu(gate) * up)
        for ranks in (r for r in (2, 4) if i % r == 0):
            step = i // ranks
            shards = [ex.silu_mul(torch.cat([gate[:, s:s + step], up[:, s:s + step]], -1))
                      for s in range(0, i, step)]
            assert same_bits(torch.cat(shards, -1), full), (i, ranks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_exact_moe_in_k_parts_equals_ranks_holding_them(dtype):
    """models.moe.exact_moe on the reference with parts 4: two ranks, each holding half of every
    expert's I (gate/up columns, down's K) with 2 parts, their float32 down shares summed along
    the pairwise tree (the reduce), give the one-rank output bit for bit; without parts or
    reduce the block is the unsplit sparse MLP to rounding."""
    from helpers import moe_as_ranks
    from jetspec_kernels.models.moe import exact_moe
    got, want, plain = moe_as_ranks(exact_moe, "reference", dtype, ranks=2, parts=4)
    assert same_bits(got, want)
    torch.testing.assert_close(want.float(), plain.float(),
                               **({} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_column_bits_do_not_follow_n(dtype):
    """ops.exact.linear on the reference: a column's bits are the same in an N-column call and in
    a tensor-parallel rank's call on its slice of the columns (N / 2, N / 4), for N whose slices
    are not a multiple of the CPU GEMV's column group (float32 differed at 2, 3, 6 columns a rank
    before the weights were padded)."""
    gen = torch.Generator().manual_seed(15)
    for n, k in ((8, 28), (12, 30), (24, 60), (259 * 4, 64)):
        x = torch.randn(3, k, generator=gen).to(dtype)
        w = torch.randn(n, k, generator=gen).to(dtype)
        full = ex.linear(x, w)
        for ranks in (2, 4):
            step = n // ranks
            cols = [ex.linear(x, w[s:s + step].contiguous()) for s in range(0, n, step)]
            assert same_bits(torch.cat(cols, -1), full), (n, k, ranks)


def test_exact_moe_parts_checked_and_no_tokens():
    """exact_moe's parts: a power of two <= 64 dividing the experts' intermediate size, else a
    ValueError naming parts (not a late error from a kernel); likewise top_k in [1, E], on
    either engine; no token: an empty [0, H]."""
    from jetspec_kernels.models.moe import exact_moe
    gen = torch.Generator().manual_seed(16)
    x, router = torch.randn(3, 16, generator=gen), torch.randn(4, 16, generator=gen)
    gate_up, down = torch.randn(4, 96, 16, generator=gen), torch.randn(4, 16, 48, generator=gen)
    assert exact_moe(x, router, gate_up, down, 2, True, parts=16).shape == (3, 16)
    for bad in (True, 3, 0, 32, 128, 2.0):
        with pytest.raises(ValueError, match="parts must be a power of two <= 64 dividing the "
                                             "experts' intermediate size 48"):
            exact_moe(x, router, gate_up, down, 2, True, parts=bad)
    for parts, reduce in ((1, None), (2, None), (1, lambda s: s.to(x.dtype))):
        out = exact_moe(x[:0], router, gate_up, down, 2, True, parts=parts, reduce=reduce)
        assert out.shape == (0, 16)
    # top_k outside [1, E]: the same named error on either engine (torch.topk's own on the
    # reference's CPU rows was a RuntimeError)
    pytest.importorskip("triton")
    for backend in ("reference", "triton"):
        for k in (0, 5):
            with pytest.raises(ValueError, match="top_k"):
                exact_moe(x, router, gate_up, down, k, True, backend=backend)
