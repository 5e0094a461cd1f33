"""A fixed-tile Triton GEMM for the exact mode's linears: ``out = x @ weight.T`` whose every row
is the same bits whatever M is and whatever the other rows hold.

What makes a row's bits depend on the launch in a library GEMM is a choice made from M: another
kernel, other tiles, split-K (partial sums of K slices added in another order). Here nothing
depends on M: the tiles are fixed (``BLOCK_M x BLOCK_N x BLOCK_K`` from the dtype alone, not
autotuned), K is reduced by one program in one fixed order (k-blocks ascending, a float32
accumulator, no split-K chosen from M), and M is excluded from Triton's argument specialisation (an M of 1 or a
multiple of 16 would otherwise compile another binary). A row's output element is then the same
sequence of ``tl.dot`` steps over the same k-blocks in every launch; the other rows of its tile
are other rows of the same dot (zeros past M). A split of K into parts fixed by the engine
(:func:`exact_linear_parts`, for tensor parallelism: every rank's K slice is whole parts) keeps
this: each part is its own k loop from its own first k, in any launch.

The tiles are a function of the dtype and of a tile shape the *engine* fixes once (``tile``:
``"narrow"`` or ``"wide"``, the target's ``exact_gemm_tile``), never of the call's M
(:func:`tiles`). Narrow, 16-bit: 64 x 32 x 128, sized for small batches: one M tile covers a B1
verify (M <= 64), so the weights stream once, and 32 columns a program fill an H100 at the
projections' N (o_proj's 4096: 128 programs) without split-K. Wide, 16-bit: 128 x 256 x 64
with 8 warps and 3 stages, sized for large batches: a B16 verify's M of about 1024 is
compute-bound, and the narrow tile re-reads the activations for every 32 columns and runs small
wgmma shapes; the wide one is the large-GEMM shape common on Hopper, at 1 program an SM.
Decode and verify must run the same tile (a row's k-steps differ between tiles), so an engine
picks one for its configuration and keeps it. float32 (the tests' dtype, IEEE FMA dots) takes
16 x 64 x 32 narrow and 32 x 64 x 64 wide (another k step, so the tests can tell the tiles
apart). ``ops.exact.linear`` runs it in the exact mode (docs/perf/exact_mode.md: what the
interpreter can and cannot show, and the predicted cost at Qwen3-8B shapes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..limits import EXACT_GEMM_TILES as GEMM_TILES
from .sizes import cdiv

__all__ = ["exact_linear", "exact_linear_parts", "sum_parts_pairwise", "exact_grouped_linear", "expert_tiles", "tiles"]


def tiles(dtype: torch.dtype, shape: str = "narrow") -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for ``dtype`` and the tile ``shape``
    (one of ``limits.EXACT_GEMM_TILES``): fixed, never chosen from M, N or K (no spills on sm_90a:
    bench/triton_resources.py)."""
    if shape not in GEMM_TILES:
        raise ValueError(f"tile must be one of {GEMM_TILES}, got {shape!r}")
    if dtype == torch.float32:
        return (16, 64, 32, 4, 3) if shape == "narrow" else (32, 64, 64, 4, 3)
    return (64, 32, 128, 4, 4) if shape == "narrow" else (128, 256, 64, 8, 3)


@triton.jit
def _k_loop(x_ptr, row_off, row_ok, w_ptr, cols, N, k_lo, k_hi, stride_wn, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32: rows (element offsets ``row_off``) of x times columns ``cols``
    of w over k in [k_lo, k_hi), reduced by this program in ascending k-blocks from k_lo."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + row_off[:, None] + ks[None, :],
                    mask=row_ok[:, None] & (ks[None, :] < k_hi), other=0.0)
        b = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None],
                    mask=(cols[None, :] < N) & (ks[:, None] < k_hi), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit(do_not_specialize=["M"])
def _fixed_tile_matmul(x_ptr, w_ptr, out_ptr, M, N, K_PART, stride_xm, stride_wn, stride_om,
                       stride_op, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Program (i, j, p): rows tile i, columns tile j, K part p (k in [p K_PART, (p+1) K_PART)),
    written to ``out + p * stride_op``."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(2)
    k_lo = part * K_PART
    acc = _k_loop(x_ptr, rows * stride_xm, rows < M, w_ptr, cols, N, k_lo, k_lo + K_PART,
                  stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION)
    tl.store(out_ptr + part.to(tl.int64) * stride_op + rows[:, None] * stride_om + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _grouped_fixed_tile_matmul(x_ptr, w_ptr, out_ptr, tile_expert_ptr, tile_first_ptr,
                               tile_rows_ptr, order_ptr, num_experts, per_token, N, K_PART,
                               stride_xm, stride_we, stride_wn, stride_om, stride_op,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """A tile of one expert's rows: entry ``order[first + i]`` (a (token, choice) row) reads x's
    row ``entry // per_token`` and writes out's row ``entry``; program (t, j, p): K part p, as
    ``_fixed_tile_matmul``'s."""
    t = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + t)
    if expert < num_experts:                 # tiles past the last expert's are empty
        first = tl.load(tile_first_ptr + t)
        count = tl.load(tile_rows_ptr + t)
        i = tl.arange(0, BLOCK_M)
        ok = i < count
        entry = tl.load(order_ptr + first + i, mask=ok, other=0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        part = tl.program_id(2)
        k_lo = part * K_PART
        acc = _k_loop(x_ptr, (entry // per_token) * stride_xm, ok,
                      w_ptr + expert.to(tl.int64) * stride_we, cols, N, k_lo, k_lo + K_PART,
                      stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION)
        tl.store(out_ptr + part.to(tl.int64) * stride_op + entry[:, None] * stride_om + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & (cols[None, :] < N))


@triton.jit
def _sum_parts_pairwise(parts_ptr, out_ptr, numel, stride_p, PARTS: tl.constexpr,
                        LEVELS: tl.constexpr, BLOCK: tl.constexpr):
    """out[e] = the pairwise tree over the parts of element e ((0 + 1) + (2 + 3), ...), float32
    adds, one rounding at the store. Elementwise: BLOCK does not change a bit."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    p = tl.arange(0, PARTS).to(tl.int64)
    x = tl.load(parts_ptr + offs[:, None] + p[None, :] * stride_p, mask=ok[:, None], other=0.0)
    for level in tl.static_range(LEVELS):       # adjacent pairs, row-major: parts 2i and 2i + 1
        a, b = tl.split(tl.reshape(x, (BLOCK, PARTS >> (level + 1), 2)))
        x = a + b
    tl.store(out_ptr + offs, tl.reshape(x, (BLOCK,)).to(out_ptr.dtype.element_ty,
                                                       fp_downcast_rounding="rtne"), mask=ok)


def sum_parts_pairwise(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``parts`` float32 [P, ...] (P a power of two, contiguous) summed over P along the pairwise
    tree of ``ops.exact.sum_pairwise`` (parts 0 + 1, 2 + 3, then pairs of those), in float32,
    rounded once to ``dtype``: one launch (P 1: part 0 in ``dtype``). Returns [...] in ``dtype``."""
    count = parts.shape[0]
    if parts.dtype != torch.float32 or not parts.is_contiguous() or count < 1 or count & (count - 1):
        raise ValueError(f"parts must be contiguous float32 [P, ...] with P a power of two, got "
                         f"{parts.dtype} {list(parts.shape)}")
    if count == 1:
        return parts[0].to(dtype)
    out = torch.empty(parts.shape[1:], dtype=dtype, device=parts.device)
    numel = out.numel()
    if numel:
        block = min(1024, max(64, 8192 // count))
        _sum_parts_pairwise[(cdiv(numel, block),)](parts, out, numel, parts.stride(0), PARTS=count,
                                                   LEVELS=count.bit_length() - 1, BLOCK=block,
                                                   num_warps=4)
    return out


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("x and weight must be tensors")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if weight.dtype != x.dtype or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be {x.dtype} [N, {x.shape[-1]}] (x's last dim), got "
                         f"{weight.dtype} {list(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device {x.device}, got {weight.device}")
    if x.dim() < 1 or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight must be contiguous in their last dimension")


def _launch(x: torch.Tensor, weight: torch.Tensor, tile: str, parts: int,
            out_dtype: torch.dtype) -> torch.Tensor:
    """out_dtype [parts, M, N]: part p is rows of x times weight over k in [p K/parts, (p+1) K/parts)."""
    bm, bn, bk, warps, stages = tiles(x.dtype, tile)
    k, n = weight.shape[1], weight.shape[0]
    rows = x.reshape(-1, k)
    out = torch.empty(parts, rows.shape[0], n, dtype=out_dtype, device=x.device)
    if rows.shape[0] and n:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"   # tf32: ignored for 16-bit
        grid = (cdiv(rows.shape[0], bm), cdiv(n, bn), parts)
        _fixed_tile_matmul[grid](rows, weight, out, rows.shape[0], n, k // parts, rows.stride(0),
                                 weight.stride(0), out.stride(1), out.stride(0), BLOCK_M=bm,
                                 BLOCK_N=bn, BLOCK_K=bk, INPUT_PRECISION=precision,
                                 num_warps=warps, num_stages=stages)
    return out


def exact_linear(x: torch.Tensor, weight: torch.Tensor, tile: str = "narrow", *,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight)`` with M-independent tiles (see the module doc).

    Parameters
    ----------
    x : float16/bfloat16/float32 [..., K], last dim contiguous
    weight : x.dtype [N, K], last dim contiguous
    tile : one of ``limits.EXACT_GEMM_TILES``: the engine's tile shape; a row's bits depend on it,
        so every call whose rows must agree (decode and verify) passes the same one
    out_dtype : the output's dtype (None: x.dtype); float32 keeps the accumulator unrounded (a
        tensor-parallel rank's partial sum, added across ranks before one rounding)

    Returns
    -------
    [..., N] in out_dtype, accumulated in float32 (float32 inputs: IEEE products, no TF32).
    """
    _check(x, weight)
    out = _launch(x, weight, tile, 1, x.dtype if out_dtype is None else out_dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def exact_linear_parts(x: torch.Tensor, weight: torch.Tensor, parts: int,
                       tile: str = "narrow") -> torch.Tensor:
    """The products of :func:`exact_linear` over ``parts`` equal slices of K, each reduced alone
    from its own first k (a fixed split-K chosen by the engine, never by M), unsummed. Slice p of
    ``x`` and ``weight`` gives the same bits as :func:`exact_linear` (``out_dtype=float32``) of
    those slices alone, so a tensor-parallel rank holding slices p.. computes the same parts.

    Parameters
    ----------
    x, weight, tile : as :func:`exact_linear`; parts : int >= 1 dividing K

    Returns
    -------
    float32 [parts, ..., N]: part p is ``x[..., s] @ weight[:, s].T``, s the p-th slice of K.
    """
    _check(x, weight)
    k = weight.shape[1]
    if not isinstance(parts, int) or parts < 1 or k % parts:
        raise ValueError(f"parts must be a positive int dividing K = {k}, got {parts!r}")
    out = _launch(x, weight, tile, parts, torch.float32)
    return out.reshape(parts, *x.shape[:-1], weight.shape[0])


def expert_tiles(experts: torch.Tensor, num_experts: int, block_m: int):
    """The tiles of a grouped GEMM over the ``(token, choice)`` rows of ``experts`` (int [T, k]):
    each expert's rows (in (token, choice) order) cut into tiles of ``block_m``.

    Returns (order int32 [T*k]: the entries sorted by expert, stably; tile_expert, tile_first,
    tile_rows int32 [cdiv(T*k, block_m) + num_experts]: per tile its expert (``num_experts`` past
    the last tile), its first position in ``order`` and its row count). Device ops, no host sync:
    the tile count is the bound, not the count."""
    flat = experts.reshape(-1)
    dev = flat.device
    order = torch.argsort(flat, stable=True)
    # Rows per expert from the sorted ids (bincount would read its maximum on the host).
    ids = torch.arange(num_experts, device=dev, dtype=flat.dtype)
    sorted_ids = flat[order]
    counts = torch.searchsorted(sorted_ids, ids, right=True) - torch.searchsorted(sorted_ids, ids)
    tiles_e = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles_e, 0)                          # one past each expert's last tile
    bound = cdiv(flat.numel(), block_m) + num_experts
    t = torch.arange(bound, device=dev)
    expert = torch.searchsorted(tile_end, t, right=True)         # num_experts past the end
    e = expert.clamp(max=num_experts - 1)
    within = t - (tile_end[e] - tiles_e[e])                      # the tile's index in its expert
    seg_start = torch.cumsum(counts, 0) - counts
    first = seg_start[e] + within * block_m
    rows = (counts[e] - within * block_m).clamp(min=0, max=block_m)
    rows = torch.where(expert < num_experts, rows, torch.zeros_like(rows))
    return (order.to(torch.int32), expert.to(torch.int32), first.to(torch.int32),
            rows.to(torch.int32))


def exact_grouped_linear(x: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor,
                         per_token: int, plan=None, *, parts: int | None = None) -> torch.Tensor:
    """Every ``(token, choice)`` row through its expert's matrix, with the dense kernel's narrow
    tiles and k order, so a row's bits depend on its input row and its expert alone (always the
    narrow tile: an expert's share of even a B16 verify is tens of rows).

    Parameters
    ----------
    x : float16/bfloat16/float32 [T * k / per_token, K], last dim contiguous: entry e's input is
        row ``e // per_token`` (``per_token = k``: the tokens' hidden states; 1: a row per entry)
    weight : x.dtype [E, N, K], last dim contiguous
    experts : int32/int64 [T, k] on x's device, values in [0, E) (entry ``e`` is
        ``experts.flatten()[e]``; the values are not checked, which would read them on the host:
        an entry of another id is left unwritten)

    plan : ``expert_tiles(experts, E, tiles(x.dtype)[0])``, or None to compute it here (a MoE
        layer's two GEMMs share one)
    parts : None, or an int >= 1 dividing K: K reduced in that many equal parts, each alone
        from its own first k, unsummed (as :func:`exact_linear_parts`)

    Returns
    -------
    [T * k, N] in x.dtype: row e is ``x[e // per_token] @ weight[experts.flatten()[e]].T``;
    with ``parts``, float32 [parts, T * k, N]: part p is that product over the p-th slice of K.
    """
    if weight.dim() != 3 or weight.dtype != x.dtype or weight.shape[2] != x.shape[-1] \
            or weight.stride(2) != 1 or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [R, K] and weight x.dtype [E, N, K], both contiguous in K, got "
                         f"x {x.dtype} {list(x.shape)}, weight {weight.dtype} {list(weight.shape)}")
    if experts.dtype not in (torch.int32, torch.int64) or experts.device != x.device:
        raise ValueError(f"experts must be int32 or int64 on {x.device} (values in [0, "
                         f"{weight.shape[0]}): not checked, a row of another id is left unwritten), "
                         f"got {experts.dtype} on {experts.device}")
    if per_token < 1 or x.shape[0] * per_token != experts.numel():
        raise ValueError(f"x must have experts.numel() / per_token = {experts.numel()} / {per_token} "
                         f"rows, got {x.shape[0]}")
    num_experts, n, k = weight.shape
    if parts is not None and (not isinstance(parts, int) or parts < 1 or k % parts):
        raise ValueError(f"parts must be None or a positive int dividing K = {k}, got {parts!r}")
    count = 1 if parts is None else parts
    entries = experts.numel()
    out = torch.empty(count, entries, n, dtype=x.dtype if parts is None else torch.float32,
                      device=x.device)
    if entries and n:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"
        bm, bn, bk, warps, stages = tiles(x.dtype)
        order, tile_expert, tile_first, tile_rows = (
            expert_tiles(experts, num_experts, bm) if plan is None else plan)
        grid = (tile_expert.numel(), cdiv(n, bn), count)
        _grouped_fixed_tile_matmul[grid](
            x, weight, out, tile_expert, tile_first, tile_rows, order, num_experts, per_token, n,
            k // count, x.stride(0), weight.stride(0), weight.stride(1), out.stride(1),
            out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, INPUT_PRECISION=precision,
            num_warps=warps, num_stages=stages)
    return out[0] if parts is None else out
