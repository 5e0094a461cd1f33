"""The exact mode on triton: the fixed-tile GEMM (triton/exact_matmul.py: fixed tiles, no
split-K, M not specialised) and tree_attention(exact=True, backend="triton")
(triton/exact_attention.py: logical-order blocks and splits, one launch). Under the interpreter
(float32; 16-bit tl.dot does not run there) a GEMM row is the same bits in an M-row launch as
alone and whatever the other rows hold, and a tree node's attention row the same bits as the
decode step's. On a GPU the tests run in bf16 and fp16 too; the exact attention runs there only
with JETSPEC_EXACT_UNVERIFIED=1 (the device check's exact step, which shows it) and is refused
otherwise until the hardware record lists the GPU. The attention tests take ``backend`` as a
parameter so that the device check's triton step runs them."""
import functools
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import rel_l2

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.exact_invariance import tree_vs_decode_mismatches  # noqa: E402

triton = pytest.importorskip("triton")
from jetspec_kernels.triton.exact_matmul import (  # noqa: E402
    exact_grouped_linear, exact_linear, exact_linear_parts, expert_tiles, sum_parts_pairwise, tiles)

from jetspec_kernels.ops.exact import UNVERIFIED_ENV  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEV == "cuda" else [])
# The exact attention on a GPU: only when the device check asks for it (unverified there).
RUN_ATTENTION = DEV == "cpu" or os.environ.get(UNVERIFIED_ENV) == "1"
attention_here = pytest.mark.skipif(not RUN_ATTENTION, reason=(
    f"exact triton attention runs on a GPU only where the hardware record lists it, or with "
    f"{UNVERIFIED_ENV}=1 (the device check)"))
TRITON = pytest.mark.parametrize("backend", ["triton"])


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@TRITON
@pytest.mark.parametrize("tile", ["narrow", "wide"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k,n", [(64, 64), (80, 96), (200, 130)])
def test_rows_are_launch_invariant(dtype, k, n, tile, backend):
    gen = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=gen).to(dtype).to(DEV)
    block_m = tiles(dtype, tile)[0]
    x = torch.randn(2 * block_m + 3, k, generator=gen).to(dtype).to(DEV)
    full = exact_linear(x, w, tile)
    other = torch.randn(x.shape, generator=gen).to(dtype).to(DEV)
    for i in (0, 1, block_m - 1, block_m, 2 * block_m + 2):
        alone = exact_linear(x[i:i + 1].clone(), w, tile)
        mixed = other.clone()
        mixed[i] = x[i]
        assert torch.equal(_bits(full[i]), _bits(alone[0])), i
        assert torch.equal(_bits(full[i]), _bits(exact_linear(mixed, w, tile)[i])), i
        mixed5 = exact_linear(mixed[i - min(i, 4):i + 1].clone(), w, tile)   # a 1..5-row launch
        assert torch.equal(_bits(full[i]), _bits(mixed5[-1])), i
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_l2(full.double(), F.linear(x.double(), w.double())) < tol


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_tile_is_part_of_a_rows_bits(dtype, backend):
    """Narrow and wide tiles step through K in other blocks, so a row's bits differ between them
    (why decode and verify must run one tile, fixed by the engine, never chosen by M); each is
    the product to rounding."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 200, generator=gen).to(dtype).to(DEV)
    w = torch.randn(130, 200, generator=gen).to(dtype).to(DEV)
    assert tiles(dtype, "narrow") != tiles(dtype, "wide")
    narrow, wide = exact_linear(x, w, "narrow"), exact_linear(x, w, "wide")
    assert not torch.equal(_bits(narrow), _bits(wide))
    want = F.linear(x.double(), w.double())
    assert rel_l2(narrow.double(), want) < _tol(dtype) and rel_l2(wide.double(), want) < _tol(dtype)


@TRITON
@pytest.mark.parametrize("tile", ["narrow", "wide"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_k_parts_equal_ranks_holding_them(dtype, tile, backend, monkeypatch):
    """The fixed split of K (ops.exact.linear(parts=P) on triton: exact_linear_parts, then the
    pairwise tree): ranks 2, 4, 8 each reducing their K slices' parts unrounded and summed along
    the tree give the one-rank bits (tp t == tp 1), including parts whose length is not a whole
    k block (K 200: parts of 100, 50, 25); rows launch-invariant; parts change the float32 sums
    (the power)."""
    from helpers import k_parts_as_ranks
    from jetspec_kernels.ops import exact as ex
    monkeypatch.setenv(UNVERIFIED_ENV, "1")      # the check that shows it, on a GPU too
    gen = torch.Generator().manual_seed(9)
    linear = functools.partial(ex.linear, backend=backend, tile=tile)
    for k in (512, 200):
        w = torch.randn(72, k, generator=gen).to(dtype).to(DEV)
        x = torch.randn(tiles(dtype, tile)[0] + 3, k, generator=gen).to(dtype).to(DEV)
        for parts in (1, 2, 4, 8):
            full = linear(x, w, parts=parts)
            for ranks in (r for r in (2, 4, 8) if parts % r == 0):
                got = k_parts_as_ranks(linear, x, w, parts, ranks)
                assert torch.equal(_bits(got), _bits(full)), (k, parts, ranks)
            for i in (0, x.shape[0] - 1):
                assert torch.equal(_bits(linear(x[i:i + 1].clone(), w, parts=parts)[0]), _bits(full[i]))
            assert rel_l2(full.double(), F.linear(x.double(), w.double())) < _tol(dtype)
        assert not torch.equal(linear(x, w, parts=4, partial=True), linear(x, w, partial=True))


@TRITON
def test_k_parts_shapes_and_bad_arguments(backend):
    w = torch.randn(24, 40, device=DEV)
    x = torch.randn(2, 3, 40, device=DEV)
    parts = exact_linear_parts(x, w, 4)
    assert parts.shape == (4, 2, 3, 24) and parts.dtype == torch.float32
    assert torch.equal(exact_linear(x[..., 10:20].contiguous(), w[:, 10:20].contiguous(),
                                    out_dtype=torch.float32), parts[1])
    assert exact_linear(x, w, out_dtype=torch.float32).dtype == torch.float32
    assert exact_linear_parts(torch.randn(0, 40, device=DEV), w, 2).shape == (2, 0, 24)
    for bad in (0, 3, 2.5):
        with pytest.raises(ValueError, match="parts must be a positive int dividing K = 40"):
            exact_linear_parts(x, w, bad)


@TRITON
@pytest.mark.parametrize("out", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_tree_kernel_is_sum_pairwise(out, backend):
    """sum_parts_pairwise (one launch) == ops.exact.sum_pairwise (the tree the tensor-parallel
    ranks continue) bit for bit, parts 2 to 64 (the limit), sizes not a multiple of its block,
    magnitudes 1e-6 to 1e6 (float16 overflows to inf alike); 3 parts and 16-bit parts refused.
    bfloat16 on a GPU only: the interpreter truncates float32 to bfloat16 where the GPU rounds
    to nearest even (torch's rounding)."""
    from jetspec_kernels.ops.exact import sum_pairwise
    if out == torch.bfloat16 and DEV == "cpu":
        pytest.skip("the interpreter truncates float32 -> bfloat16 (a GPU rounds to nearest even)")
    gen = torch.Generator().manual_seed(11)
    for count in (2, 4, 8, 64):
        parts = torch.randn(count, 37, 29, generator=gen) * torch.logspace(-6, 6, count)[:, None, None]
        parts = parts.to(DEV)
        want = sum_pairwise(parts.unbind(0), out)
        with warnings.catch_warnings():          # the interpreter's numpy cast to float16 at inf
            warnings.simplefilter("ignore", RuntimeWarning)
            got = sum_parts_pairwise(parts, out)
        assert got.dtype == out and got.shape == (37, 29)
        assert torch.equal(_bits(got), _bits(want)), count
    assert sum_parts_pairwise(torch.zeros(4, 0, device=DEV), out).shape == (0,)
    for bad in (torch.zeros(3, 5, device=DEV), torch.zeros(4, 5, device=DEV).half(),
                torch.zeros(5, 4, device=DEV).T):
        with pytest.raises(ValueError, match="parts must be contiguous float32"):
            sum_parts_pairwise(bad, out)


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_moe_in_k_parts_equals_ranks_holding_them(dtype, backend, monkeypatch):
    """exact_moe on triton with parts 4 (the grouped GEMM's K parts, the tree kernel): two
    ranks' float32 down shares summed along the pairwise tree == the one-rank output, bit for
    bit; the grouped parts are each slice's grouped GEMM; the block is the sparse MLP to
    rounding."""
    from helpers import moe_as_ranks
    from jetspec_kernels.models.moe import exact_moe
    monkeypatch.setenv(UNVERIFIED_ENV, "1")
    got, want, plain = moe_as_ranks(exact_moe, backend, dtype, ranks=2, parts=4)
    assert torch.equal(_bits(got), _bits(want))
    assert rel_l2(want.double(), plain.double()) < _tol(dtype)
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(10, 40, generator=gen).to(dtype).to(DEV)
    w = torch.randn(3, 24, 40, generator=gen).to(dtype).to(DEV)
    experts = torch.randint(0, 3, (5, 2), generator=gen).to(DEV)
    parts = exact_grouped_linear(x, w, experts, per_token=1, parts=4)
    assert parts.shape == (4, 10, 24) and parts.dtype == torch.float32
    for p in range(4):
        alone = exact_grouped_linear(x[:, p * 10:(p + 1) * 10].contiguous(),
                                     w[..., p * 10:(p + 1) * 10].contiguous().to(dtype), experts,
                                     per_token=1, parts=1)
        assert torch.equal(parts[p], alone[0]), p
    with pytest.raises(ValueError, match="parts must be None or a positive int dividing K = 40"):
        exact_grouped_linear(x, w, experts, per_token=1, parts=3)
    router = torch.randn(3, 24, generator=gen).to(dtype).to(DEV)
    gate_up = torch.randn(3, 80, 24, generator=gen).to(dtype).to(DEV)      # w as down: H 24, I 40
    none = torch.empty(0, 24, dtype=dtype, device=DEV)
    for parts in (1, 4):        # no token: an empty [0, H] (the kernels' views need a row)
        assert exact_moe(none, router, gate_up, w, 2, True, backend, parts=parts).shape == (0, 24)


@TRITON
def test_shapes_and_bad_arguments(backend):
    w = torch.randn(24, 40, device=DEV)
    assert exact_linear(torch.randn(2, 3, 40, device=DEV), w).shape == (2, 3, 24)
    assert exact_linear(torch.randn(0, 40, device=DEV), w).shape == (0, 24)
    with pytest.raises(ValueError, match="weight must be"):
        exact_linear(torch.randn(2, 41, device=DEV), w)
    with pytest.raises(ValueError, match="x must be"):
        exact_linear(torch.randn(2, 40, device=DEV).to(torch.int32), w)
    with pytest.raises(ValueError, match="contiguous"):
        exact_linear(torch.randn(40, 2, device=DEV).T, w)
    with pytest.raises(ValueError, match="tile must be one of"):
        exact_linear(torch.randn(2, 40, device=DEV), w, "square")


def test_expert_tiles_cover_every_entry_once():
    gen = torch.Generator().manual_seed(2)
    for t, k, e, bm in ((7, 2, 5, 4), (33, 3, 4, 16), (1, 1, 3, 16), (40, 2, 9, 8)):
        experts = torch.randint(0, e, (t, k), generator=gen)
        experts[0, 0] = e - 1                              # the last expert has a row
        order, expert, first, rows = expert_tiles(experts, e, bm)
        assert expert.numel() == -(-t * k // bm) + e
        seen = []
        for tile in range(expert.numel()):
            if int(expert[tile]) == e:
                assert int(rows[tile]) == 0
                continue
            assert 0 < int(rows[tile]) <= bm
            entries = order[int(first[tile]):int(first[tile]) + int(rows[tile])].long()
            assert (experts.flatten()[entries] == expert[tile]).all()
            seen += entries.tolist()
        assert sorted(seen) == list(range(t * k))
        assert (expert[:-1] <= expert[1:]).all()           # experts in order, empty tiles last


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_rows_depend_on_their_row_and_expert_alone(dtype, backend):
    """Every (token, choice) row of the grouped GEMM is the bits of the dense fixed-tile GEMM of
    its row by its expert's matrix, whatever the other tokens are and where they are routed."""
    gen = torch.Generator().manual_seed(9)
    t, k, e, h, n = 37, 2, 5, 80, 48
    x = torch.randn(t, h, generator=gen).to(dtype).to(DEV)
    w = (torch.randn(e, n, h, generator=gen) / h ** 0.5).to(dtype).to(DEV)
    experts = torch.randint(0, e, (t, k), generator=gen).to(DEV)
    full = exact_grouped_linear(x, w, experts, per_token=k)
    for tok in (0, 5, t - 1):
        for j in range(k):
            alone = exact_linear(x[tok:tok + 1].clone(), w[int(experts[tok, j])])
            assert torch.equal(_bits(full[tok * k + j]), _bits(alone[0])), (tok, j)
        one = exact_grouped_linear(x[tok:tok + 1].clone(), w, experts[tok:tok + 1].clone(), k)
        assert torch.equal(_bits(one), _bits(full[tok * k:(tok + 1) * k]))
    h2 = torch.randn(t * k, h, generator=gen).to(dtype).to(DEV)     # a row per entry
    per_entry = exact_grouped_linear(h2, w, experts, per_token=1)
    want = torch.stack([h2[i].double() @ w[int(experts.flatten()[i])].double().T
                        for i in range(t * k)])
    assert rel_l2(per_entry.double().cpu(), want.cpu()) < _tol(dtype)
    with pytest.raises(ValueError, match="rows"):
        exact_grouped_linear(x[:5], w, experts, per_token=k)
    with pytest.raises(ValueError, match="weight"):
        exact_grouped_linear(x, w[..., :10], experts, per_token=k)
    with pytest.raises(ValueError, match="experts must be int32 or int64"):
        exact_grouped_linear(x, w, experts.float(), per_token=k)


@attention_here
@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("prefix,n,page_size,pad,heads", [
    (5, 8, None, 0, (4, 2)), (13, 8, 4, 2, (4, 2)),
    (60, 12, None, 0, (4, 1)),        # the tree crosses the key block at 64: shared in the
    (60, 12, 16, 3, (6, 2)),          # decode steps past 64, each row's own in the tree; G 3
    (130, 40, None, 4, (4, 4)),       # 40 rows: three tiles of 16 (G 1: 64 rows a tile)
])
def test_exact_triton_tree_row_equals_decode_row(prefix, n, page_size, pad, heads, dtype, backend):
    gen = torch.Generator().manual_seed(prefix + n)
    assert tree_vs_decode_mismatches(prefix, n, dtype, gen, exact=True, heads=heads,
                                     page_size=page_size, pad=pad, dh=16 if DEV == "cpu" else 128,
                                     backend=backend, device=DEV) == 0


@attention_here
@TRITON
@pytest.mark.parametrize("page_size", [None, 32])
def test_exact_triton_row_across_the_split_boundary(page_size, backend):
    """A chain whose rows end on both sides of the first split boundary (SPLIT_KEYS logical keys):
    the rows past it combine two splits, as their decode steps do."""
    from jetspec_kernels.triton.exact_attention import SPLIT_KEYS
    n, prefix = 12, SPLIT_KEYS - 6
    parents = torch.arange(-1, n - 1, dtype=torch.int32)[None]
    gen = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        assert tree_vs_decode_mismatches(prefix, n, dtype, gen, exact=True, heads=(2, 1),
                                         page_size=page_size, dh=16, backend=backend,
                                         parents=parents, device=DEV) == 0, dtype


def _ragged_batch(gen, dtype, dh=16, hq=4, hkv=2, cap=160):
    """Three sequences: prefixes 3, 61 and 100, trees of 9 nodes (random, a chain, two padding
    nodes), one paged cache of pages of 8 with a shuffled table."""
    import jetspec_kernels.python_ref as ref
    from bench.exact_invariance import random_tree_mask
    n = 9
    masks = [random_tree_mask(n, gen)[2], ref.pack_mask(torch.arange(-1, n - 1, dtype=torch.int32)[None],
                                                        torch.tensor([n], dtype=torch.int32)).to(torch.int32),
             random_tree_mask(n, gen, pad=2)[2]]
    pages = cap // 8
    k = torch.randn(3 * pages, 8, hkv, dh, generator=gen)
    v = torch.randn(3 * pages, 8, hkv, dh, generator=gen) * 30
    table = torch.randperm(3 * pages, generator=gen).to(torch.int32).view(3, pages)
    q = torch.randn(3, n, hq, dh, generator=gen) * 4
    return (q.to(dtype).to(DEV), k.to(dtype).to(DEV), v.to(dtype).to(DEV),
            torch.tensor([3, 61, 100], dtype=torch.int32, device=DEV), torch.cat(masks).to(DEV),
            table.to(DEV))


@attention_here
@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_triton_sequence_alone_equals_in_a_batch(dtype, backend):
    import jetspec_kernels as jk
    gen = torch.Generator().manual_seed(21)
    q, k, v, pl, mask, table = _ragged_batch(gen, dtype)
    full, full_lse = jk.tree_attention(q, k, v, pl, mask, block_table=table, return_lse=True,
                                       exact=True, backend=backend)
    for b in range(3):
        one, one_lse = jk.tree_attention(q[b:b + 1].clone(), k, v, pl[b:b + 1].clone(),
                                         mask[b:b + 1].clone(), block_table=table[b:b + 1].clone(),
                                         return_lse=True, exact=True, backend=backend)
        assert torch.equal(_bits(one[0]), _bits(full[b])), b
        assert torch.equal(_bits(one_lse[0]), _bits(full_lse[b])), b
    want, want_lse = jk.tree_attention(*(t.cpu() for t in (q, k, v, pl, mask)),
                                       block_table=table.cpu(), return_lse=True,
                                       backend="reference")
    assert rel_l2(full.cpu().double(), want.double()) < _tol(dtype)
    assert rel_l2(full_lse.cpu().double(), want_lse.double()) < _tol(dtype)


@attention_here
@TRITON
@pytest.mark.parametrize("case", ["tree paged", "causal", "full"])
def test_exact_triton_row_groups_and_chunks_change_no_bit(case, backend, monkeypatch):
    """A tile's rows split over 1, 2, 3 or every-row programs, and the rows launched in chunks of
    one or two whole tiles (a long prefill's bound on the split partials), with and without lse:
    scheduling choices that follow B, N and the SM count. Rows of sequence 0 end on both sides of
    the split at SPLIT_KEYS, N 40 is three tiles of 16 (fp32, G 2): out and lse the same bits,
    every row written (outputs poisoned)."""
    from bench.exact_invariance import random_tree_mask
    from jetspec_kernels.triton import exact_attention
    from jetspec_kernels.triton.exact_attention import SPLIT_KEYS, exact_tree_attention
    gen = torch.Generator().manual_seed(8)
    n, hkv, cap = 40, 2, SPLIT_KEYS + 48
    q = torch.randn(2, n, 4, 16, generator=gen).to(DEV)
    k, v = (torch.randn(2, cap, hkv, 16, generator=gen).to(DEV) for _ in range(2))
    pl = torch.tensor([SPLIT_KEYS - 20, 7], dtype=torch.int32, device=DEV)
    mask = table = None
    if case == "tree paged":
        mask = torch.cat([random_tree_mask(n, gen)[2], random_tree_mask(n, gen, pad=3)[2]]).to(DEV)
        table = torch.randperm(2 * cap // 8, generator=gen).to(torch.int32).view(2, -1).to(DEV)
        k, v = (t.reshape(-1, 8, hkv, 16) for t in (k, v))
    tail = "full" if case == "full" else "causal"
    # bytes a row of partials: B 2 x Hq 4 x (Dh + 1) 17 x 4 x 2 splits = 1088; a tile 16 rows
    results = []
    for groups, workspace, with_lse in ((1, None, True), (2, None, True), (3, None, True),
                                        (n, None, True), (None, 20000, True), (2, 40000, True),
                                        (1, 20000, False)):
        monkeypatch.setattr(exact_attention, "WORKSPACE_BYTES", workspace or 256 << 20)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((2, 4, n), float("nan"), device=DEV) if with_lse else None
        exact_tree_attention(q, k, v, pl, mask, tail, table, 0.25, out, lse, row_groups=groups)
        assert not out.isnan().any() and (lse is None or not lse.isnan().any()), (groups, workspace)
        results.append(((groups, workspace), out, lse))
    for what, out, lse in results[1:]:
        assert torch.equal(_bits(out), _bits(results[0][1])), what
        assert lse is None or torch.equal(_bits(lse), _bits(results[0][2])), what
    want = _reference_attention(q, k, v, pl, mask, tail, table)
    assert rel_l2(results[0][1].cpu().double(), want.double()) < 1e-5


def _reference_attention(q, k, v, pl, mask, tail, table):
    import jetspec_kernels as jk
    return jk.tree_attention(*(t.cpu() for t in (q, k, v, pl)), None if mask is None else mask.cpu(),
                             tail=tail, block_table=None if table is None else table.cpu(),
                             scale=0.25, backend="reference")


def test_exact_attention_row_groups_plan():
    from jetspec_kernels import launch_plan
    assert launch_plan.exact_attention_row_groups(32, 16, 132) == 5       # B1 N64 p512, 8 kv heads
    assert launch_plan.exact_attention_row_groups(4, 16, 132) == 16       # never more than the rows
    assert launch_plan.exact_attention_row_groups(512, 16, 132) == 1      # B16: filled already
    assert launch_plan.exact_attention_row_groups(4, 1, 132) == 1         # a decode step: one row
    assert launch_plan.exact_attention_row_groups(0, 0, 132) == 1


@attention_here
@TRITON
@pytest.mark.parametrize("tail", ["causal", "full"])
def test_exact_triton_without_a_mask_and_strided_q_and_v(tail, backend):
    import jetspec_kernels as jk
    gen = torch.Generator().manual_seed(5)
    big = torch.randn(2, 5, 6, 16, generator=gen)
    q = big[:, :, 1:5]                                 # strided heads
    k = torch.randn(2, 80, 2, 16, generator=gen)
    v = torch.randn(2, 80, 2, 24, generator=gen)[..., 3:19]     # V's strides are not K's
    pl = torch.tensor([70, 0], dtype=torch.int32)
    got, got_lse = jk.tree_attention(q.to(DEV), k.to(DEV), v.to(DEV), pl.to(DEV), tail=tail,
                                     return_lse=True, exact=True, backend=backend)
    want, want_lse = jk.tree_attention(q, k, v, pl, tail=tail, return_lse=True, backend="reference")
    assert rel_l2(got.cpu().double(), want.double()) < 1e-5
    assert rel_l2(got_lse.cpu().double(), want_lse.double()) < 1e-5


@attention_here
@TRITON
@pytest.mark.parametrize("tail,prefix", [("causal", 0), ("causal", 45), ("full", 30)])
def test_exact_triton_rows_without_a_mask_equal_their_decode_steps(tail, prefix, backend):
    """Causal and full tails (a prefill chunk, a draft block): row i == the one-token call over its
    keys in place (causal: prefix + i + 1 keys; full: all prefix + N), bitwise; 70 rows in several
    tiles, so most blocks are shared by a tile's rows and the last ones run row by row."""
    import jetspec_kernels as jk
    gen = torch.Generator().manual_seed(prefix + 1)
    n, hq, hkv, dh = 70, 4, 2, 16
    k = torch.randn(2, prefix + n + 3, hkv, dh, generator=gen).to(DEV)
    v = torch.randn(2, prefix + n + 3, hkv, dh, generator=gen).to(DEV)
    q = torch.randn(2, n, hq, dh, generator=gen).to(DEV)
    pl = torch.tensor([prefix, prefix], dtype=torch.int32, device=DEV)
    full, full_lse = jk.tree_attention(q, k, v, pl, tail=tail, return_lse=True, exact=True,
                                       backend=backend)
    for i in (0, 1, 17, n - 1):
        seen = prefix + (i + 1 if tail == "causal" else n)
        one, one_lse = jk.tree_attention(q[1:2, i:i + 1].clone(), k[1:2, :seen].clone(),
                                         v[1:2, :seen].clone(), pl[:1] * 0 + seen - 1,
                                         return_lse=True, exact=True, backend=backend)
        assert torch.equal(_bits(one[0, 0]), _bits(full[1, i])), i
        assert torch.equal(_bits(one_lse[0, :, 0]), _bits(full_lse[1, :, i])), i


@attention_here
def test_exact_triton_edge_calls():
    """A row that sees no key is written as 0 / -inf (not left as it was); zero query heads
    return; a head dim the kernels do not take is refused by name."""
    import jetspec_kernels as jk
    from jetspec_kernels.triton.exact_attention import exact_tree_attention
    q = torch.randn(1, 2, 2, 16, device=DEV)
    k = v = torch.randn(1, 4, 1, 16, device=DEV)
    mask = torch.tensor([[[1], [0]]], dtype=torch.int32, device=DEV)      # row 1: no bit at all
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 2), 7.0, device=DEV)
    exact_tree_attention(q, k, v, torch.zeros(1, dtype=torch.int32, device=DEV), mask, "causal",
                         None, 0.25, out, lse)
    assert torch.equal(out[0, 1].cpu(), torch.zeros(2, 16)) and (lse[0, :, 1] == float("-inf")).all()
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(lse[0, :, 0]).all()
    empty = torch.empty(1, 2, 0, 16, device=DEV)
    exact_tree_attention(empty, k, v, torch.zeros(1, dtype=torch.int32, device=DEV), None,
                         "causal", None, 0.25, empty.clone(), None)
    q48, k48 = torch.randn(1, 2, 2, 48, device=DEV), torch.randn(1, 4, 1, 48, device=DEV)
    with pytest.raises(jk.BackendUnavailableError, match="head dim"):
        jk.tree_attention(q48, k48, k48, torch.ones(1, dtype=torch.int32, device=DEV), exact=True,
                          backend="triton")


@attention_here
def test_tail_order_once_per_mask_inside_a_forward_scope(monkeypatch):
    """Inside ops.exact.forward_scope the tree's tail order is computed once per mask tensor (a
    forward's layers share it); outside, and for another mask, it is computed again; the rows
    are the same bits either way."""
    import jetspec_kernels as jk
    from jetspec_kernels.ops.exact import forward_scope
    from jetspec_kernels.triton import exact_attention as ea
    calls = []
    real = ea.tail_order
    monkeypatch.setattr(ea, "tail_order", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(4)
    q, k, v, pl, mask, table = _ragged_batch(gen, torch.float32)

    def run(m):
        return jk.tree_attention(q, k, v, pl, m, block_table=table, exact=True, backend="triton")
    alone = run(mask)
    with forward_scope("triton"):
        first, again = run(mask), run(mask)
        assert len(calls) == 2                         # one outside the scope, one inside
        run(mask.clone())
        assert len(calls) == 3
    run(mask)
    assert len(calls) == 4
    assert torch.equal(_bits(first), _bits(alone)) and torch.equal(_bits(again), _bits(alone))


@pytest.mark.skipif(DEV == "cuda", reason="the interpreter's power check")
def test_normal_triton_tree_row_differs_from_decode_row():
    gen = torch.Generator().manual_seed(11)
    assert tree_vs_decode_mismatches(5, 8, torch.float32, gen, exact=False, dh=32,
                                     backend="triton") > 0


@TRITON
def test_exact_triton_attention_agrees_with_the_reference(backend, monkeypatch):
    import jetspec_kernels as jk
    gen = torch.Generator().manual_seed(12)
    q = torch.randn(2, 3, 4, 32, generator=gen)
    k, v = torch.randn(2, 12, 2, 32, generator=gen), torch.randn(2, 12, 2, 32, generator=gen)
    pl = torch.tensor([4, 9], dtype=torch.int32)
    want, want_lse = jk.tree_attention(q, k, v, pl, return_lse=True, backend="reference")
    if DEV == "cuda":
        with monkeypatch.context() as m:
            m.delenv(UNVERIFIED_ENV, raising=False)
            from jetspec_kernels.ops import exact as ex
            if torch.cuda.get_device_name() not in ex.exact_verified_devices():
                with pytest.raises(jk.ExactModeError, match="not shown"):
                    jk.tree_attention(q.cuda(), k.cuda(), v.cuda(), pl.cuda(), exact=True,
                                      backend=backend)
        if not RUN_ATTENTION:
            return
    got, got_lse = jk.tree_attention(q.to(DEV), k.to(DEV), v.to(DEV), pl.to(DEV),
                                     return_lse=True, exact=True, backend=backend)
    assert rel_l2(got.cpu(), want) < 1e-5 and rel_l2(got_lse.cpu(), want_lse) < 1e-5


@attention_here
@TRITON
@pytest.mark.parametrize("page_size", [None, 8])
def test_exact_triton_forest_with_the_prefix_one_short_of_a_key_block(page_size, backend):
    """A forest (nodes 0, 2, 4 and 8 children of the prefix) whose prefix ends one key short of
    a key block: that block holds each row's first tail key, which is another node for each
    tree, so it is the rows' own, not shared (a single-rooted tree, node 0 first for every row,
    cannot tell)."""
    from jetspec_kernels.triton.exact_attention import block_sizes
    dh = 16 if DEV == "cpu" else 128
    parents = torch.tensor([[-1, 0, -1, 2, -1, 1, 3, 4, -1]], dtype=torch.int32)
    for dtype in DTYPES:
        prefix = block_sizes(dh, dtype)[1] - 1
        gen = torch.Generator().manual_seed(8)
        assert tree_vs_decode_mismatches(prefix, parents.shape[1], dtype, gen, exact=True,
                                         heads=(4, 2), page_size=page_size, dh=dh,
                                         backend=backend, parents=parents, device=DEV) == 0, dtype


@TRITON
@pytest.mark.parametrize("norm", [False, True])
def test_exact_moe_on_triton_is_the_sparse_mlp(norm, backend):
    """models.moe.exact_moe on triton (the router by the fixed-tile GEMM, route_rows, the
    grouped GEMMs, the k choices summed in order) is the sparse MLP, within float32 rounding of
    a float64 loop over tokens and choices: the invariance properties alone pass a block that
    is consistently wrong (a flag dropped, a choice not summed)."""
    from jetspec_kernels.models.moe import exact_moe
    gen = torch.Generator().manual_seed(31)
    t, h, inter, e, k = 40, 48, 32, 4, 3         # 30 rows an expert: tiles of 16 and 64 differ
    x = torch.randn(t, h, generator=gen)
    router = torch.randn(e, h, generator=gen) / h ** 0.5
    gate_up = torch.randn(e, 2 * inter, h, generator=gen) / h ** 0.5
    down = torch.randn(e, h, inter, generator=gen) / inter ** 0.5
    probs = torch.softmax(x.double() @ router.double().T, dim=-1)
    top = probs.topk(k + 1, dim=-1).values
    assert (top[:, k - 1] - top[:, k]).min() > 1e-4          # no near-tie: the same experts
    weights, ids = probs.topk(k, dim=-1)
    if norm:
        weights = weights / weights.sum(-1, keepdim=True)
    want = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            gu = gate_up[ids[i, j]].double() @ x[i].double()
            want[i] += weights[i, j] * (down[ids[i, j]].double() @ (F.silu(gu[:inter]) * gu[inter:]))
    got = exact_moe(x.to(DEV), router.to(DEV), gate_up.to(DEV), down.to(DEV), k, norm,
                    backend=backend)
    assert got.dtype == torch.float32 and got.shape == (t, h)
    assert rel_l2(got.cpu().double(), want) < 1e-5


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_routing_is_softmax_topk_a_row_at_a_time(dtype, backend):
    """triton.exact_route.route_rows: the experts torch's softmax and top-k pick (no near ties)
    and their probabilities within float32 rounding, E not a power of two; renormalised, the k
    chosen probabilities divided by their sum in choice order ((w0 + w1) + w2, float32: torch's
    sum may pick its order by T on a GPU); ties to the lower id; a row's bits the same alone as
    among other rows (NaN rows too); top_k past E named."""
    from jetspec_kernels.triton.exact_route import route_rows
    gen = torch.Generator().manual_seed(4)
    t, e, k = 37, 60, 3
    logits = (torch.randn(t, e, generator=gen) * 3).to(dtype)
    probs = torch.softmax(logits.double(), -1)
    top, idx = probs.topk(k + 1, dim=-1)
    keep = (top[:, k - 1] - top[:, k] > 1e-3) & (top[:, :k - 1] - top[:, 1:k] > 1e-3).all(-1)
    raw_w, raw_e = route_rows(logits.to(DEV), k, False)
    w, ex_ = route_rows(logits.to(DEV), k, True)
    assert torch.equal(raw_e, ex_) and ex_.dtype == torch.int64 and w.dtype == dtype
    assert torch.equal(ex_.cpu()[keep], idx[keep, :k])
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(raw_w.cpu().double()[keep], top[keep, :k], atol=tol, rtol=tol)
    if dtype == torch.float32:
        f = raw_w
        assert torch.equal(_bits(w), _bits(f / ((f[:, :1] + f[:, 1:2]) + f[:, 2:3])))
    for r in (0, 17, t - 1):
        mixed = torch.full((5, e), float("nan"), dtype=dtype)
        mixed[3] = logits[r]
        mixed[1, :-1] = logits[r, :-1]                # one NaN logit: a NaN row, as torch's
        one_w, one_e = route_rows(logits[r:r + 1].to(DEV), k, True)
        many_w, many_e = route_rows(mixed.to(DEV), k, True)
        assert torch.equal(_bits(one_w[0]), _bits(w[r])) and torch.equal(one_e[0], ex_[r])
        assert torch.equal(_bits(many_w[3]), _bits(w[r])) and torch.equal(many_e[3], ex_[r])
        # NaN propagates (torch's softmax makes the whole row NaN) and no id leaves [0, E)
        assert many_w[[0, 1, 2, 4]].isnan().all()
        assert many_e[[0, 1, 2, 4]].tolist() == [list(range(k))] * 4
    ties = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0, -1.0]], dtype=dtype)
    tw, te = route_rows(ties.to(DEV), 4, False)
    assert te.tolist() == [[1, 2, 4, 0]] and tw[0, 0] == tw[0, 1] == tw[0, 2] > tw[0, 3]
    assert route_rows(ties.to(DEV), 6, False)[1].sort().values.tolist() == [list(range(6))]
    with pytest.raises(ValueError, match="top_k"):
        route_rows(ties.to(DEV), 7, False)
    assert route_rows(torch.zeros(0, e, dtype=dtype, device=DEV), k, True)[0].shape == (0, k)


@TRITON
def test_exact_moe_routes_with_the_row_kernel(backend, monkeypatch):
    """exact_moe on triton routes by route_rows (a program per token), not torch's softmax and
    top-k (library kernels whose choice may follow T)."""
    from jetspec_kernels.models import moe
    from jetspec_kernels.triton import exact_route
    gen = torch.Generator().manual_seed(5)
    seen = []
    real = exact_route.route_rows
    monkeypatch.setattr(exact_route, "route_rows",
                        lambda *a, **k: seen.append(a[1:]) or real(*a, **k))
    monkeypatch.setattr(moe, "route_logits", None)          # the normal block's: not called
    x = torch.randn(3, 8, generator=gen).to(DEV)
    moe.exact_moe(x, torch.randn(6, 8, generator=gen).to(DEV),
                  torch.randn(6, 10, 8, generator=gen).to(DEV),
                  torch.randn(6, 8, 5, generator=gen).to(DEV), 2, True, backend)
    assert seen == [(2, True)]
