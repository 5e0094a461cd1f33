"""cuda backend: tree_attention (fp16/bf16): a wgmma kernel on sm_90a for head dims 64/128, the
mma.sync kernel for head dim 256 and on other GPUs; kernel="hopper" picks the Hopper family
(attention_hopper.cuh: TMA producer, ping-pong consumers, 128-key blocks, splits from the
kernel's occupancy); which kernel auto picks follows the hardware record (docs/DESIGN.md section
2, jetspec_kernels/hardware_record.json)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import launch_plan
from . import extension as ext
from .custom_op import custom_op
from .supports import attention_kernel, attention_kernel_reason


def choose_splits(batch: int, n: int, hq: int, hkv: int, capacity: int, device) -> int:
    """Split-KV factor of the mma / wgmma kernels for q [batch, n, hq, Dh] over caches of
    ``capacity`` keys a sequence on ``device``: :func:`launch_plan.cuda_attention_splits` (one
    wave) of CTAs of ``attn_rows`` packed rows, ``attn_ctas_per_sm`` to an SM (_C's limits.h).
    Static shapes only (no host sync, fixed under graph capture)."""
    rows, per_sm = ext.limit("attn_rows"), ext.limit("attn_ctas_per_sm")
    base = -(-n * (hq // hkv) // rows) * batch * hkv
    if base == 0:  # nothing to compute (the launcher returns early)
        return 1
    return launch_plan.cuda_attention_splits(base, per_sm, capacity,
                                             launch_plan.sm_count(device))


def hopper_splits(q: torch.Tensor, hkv: int, capacity: int) -> int:
    """Split-KV count of the hopper kernel for q [B, N, Hq, Dh] over caches of ``capacity`` keys a
    sequence: _C's, from the kernel's occupancy on q's device, :func:`launch_plan.sm_count` and a
    wave-efficiency rule (static shapes only: no host sync, fixed under graph capture)."""
    b, n, hq, dh = q.shape
    if b == 0 or n == 0:
        return 1
    with ext.on_device(q.device):
        return int(ext.module().tree_attention_hopper_splits(
            batch=b, n=n, hq=hq, hkv=hkv, capacity=capacity, dtype=ext.dtype_code(q), head_dim=dh,
            sms=launch_plan.sm_count(q.device)))


def attention_plan(kernel: str, q: torch.Tensor, k_cache: torch.Tensor, block_table) -> tuple:
    """(kernel code, split count) of a call: checks that ``kernel`` takes these shapes
    (ValueError), then the split rule of the kernel that runs. Reads names, shapes, dtypes and
    devices only, so :func:`tree_attention` keeps one plan per signature
    (:func:`launch_plan.planned`)."""
    code = kernel_code(kernel, q, k_cache, block_table)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    if kernel == "hopper" and q.shape[-1] in ext.limit("wgmma_head_dims"):
        splits = hopper_splits(q, k_cache.shape[2], capacity)
    else:
        splits = choose_splits(q.shape[0], q.shape[1], q.shape[2], k_cache.shape[2], capacity,
                               q.device)
    return code, splits


def kernel_code(kernel: str, q: torch.Tensor, k_cache: torch.Tensor, block_table) -> int:
    """_C's code of the attention kernel named ``kernel``, checked to take these shapes
    (ValueError)."""
    # The wgmma (cp.async) kernel goes once the Hopper family has passed and been timed on hardware.
    kernels = ext.enum("AttnKernel")
    if kernel not in kernels:
        raise ValueError(f"kernel must be one of {sorted(kernels)}, got {kernel!r}")
    reason = attention_kernel_reason(kernel, q, k_cache, block_table)
    if reason:
        raise ValueError(reason)
    return kernels[kernel]


@custom_op("jetspec::tree_attention", mutates_args=("out", "lse"))
def _tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    prefix_lens: torch.Tensor, tree_mask: Optional[torch.Tensor], tail: str,
                    block_table: Optional[torch.Tensor], scale: float, out: torch.Tensor,
                    lse: Optional[torch.Tensor], num_splits: int, kernel: int) -> None:
    _C = ext.module()
    if num_splits == 0:  # a compiled call: planned here, from the shapes the call has
        name = next(n for n, c in ext.enum("AttnKernel").items() if c == kernel)
        num_splits = attention_plan(name, q, k_cache, block_table)[1]
    with ext.on_device(q.device):
        # Layout decisions read data_ptr(), so they live inside the op (opaque to torch.compile).
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not ext.aligned16(t):
                raise ValueError(f"{name} rows must start on 16-byte boundaries for the cuda backend "
                                 f"(strides {t.stride()}, data_ptr % 16 = {t.data_ptr() % 16})")
        if not ext.aligned16(q):
            q = q.clone(memory_format=torch.contiguous_format)
        # The epilogue stores pairs of elements (4 bytes); lse is written as a contiguous [B, Hq, N].
        direct = out.data_ptr() % 4 == 0 and all(s % 2 == 0 for s in out.stride()[:3])
        out_buf = out if direct else torch.empty_like(q, memory_format=torch.contiguous_format)
        lse_buf = lse if lse is None or lse.is_contiguous() else torch.empty_like(
            lse, memory_format=torch.contiguous_format)

        b, n, hq, dh = q.shape
        hkv = k_cache.shape[2]
        prefix_lens = prefix_lens.contiguous()
        mode = "mask" if tree_mask is not None else tail
        if tree_mask is not None:
            tree_mask = tree_mask.contiguous()
        if block_table is not None:
            block_table = block_table.contiguous()
        partial_o = partial_lse = 0
        if num_splits > 1:  # float32 partial_o [splits, B, Hq, N, Dh], partial_lse [.., N]
            rows = num_splits * b * hq * n
            # (work: kept alive until the launch is queued)
            work, (partial_o, partial_lse) = ext.workspaces(q.device, rows * dh * 4, rows * 4)
        _C.tree_attention(
            q=q.data_ptr(), q_strides=ext.strides3(q), k_cache=k_cache.data_ptr(),
            v_cache=v_cache.data_ptr(),
            k_cache_strides=ext.strides3(k_cache), v_cache_strides=ext.strides3(v_cache),
            block_table=ext.ptr(block_table),
            block_table_batch_stride=0 if block_table is None else block_table.stride(0),
            page_size=k_cache.shape[1], cache_outer=k_cache.shape[0],
            prefix_lens=prefix_lens.data_ptr(), tree_mask=ext.ptr(tree_mask),
            tree_mask_batch_stride=0 if tree_mask is None else tree_mask.stride(0),
            tree_mask_row_stride=0 if tree_mask is None else tree_mask.stride(1),
            tail=ext.enum("AttnTail")[mode], out=out_buf.data_ptr(),
            out_strides=ext.strides3(out_buf),
            lse=ext.ptr(lse_buf), partial_o=partial_o, partial_lse=partial_lse, batch=b,
            n=n, hq=hq, hkv=hkv, splits=num_splits,
            scale=float(scale), dtype=ext.dtype_code(q), head_dim=dh, kernel=kernel,
            stream=ext.stream())
        if out_buf is not out:
            out.copy_(out_buf)
        if lse_buf is not lse:
            lse.copy_(lse_buf)


@_tree_attention.register_fake
def _(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse, num_splits,
      kernel):
    return None


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse,
                   num_splits: int | None = None, kernel: str | None = None):
    """Fill ``out`` [B, N, Hq, Dh] (q.dtype) and ``lse`` float32 [B, Hq, N] (if given).

    Parameters are those of the backend interface (CONTRIBUTING.md), already validated;
    ``num_splits`` overrides the split-KV heuristic (tests use it to exercise the combine);
    ``kernel`` is "auto" (wgmma where the GPU runs sm_90a code and Dh is 64 or 128, else
    mma.sync), "mma", "wgmma" or "hopper" (the Hopper family; Dh other than 64 / 128 runs
    mma.sync; paged caches need a page size that is a multiple of 8); an sm_90a kernel where it
    cannot run is a RuntimeError from _C.
    None reads ``JETSPEC_ATTN_KERNEL`` (default "auto"). A kernel that cannot take the shapes is
    a ValueError. Other limits are not re-checked here: ``backend.select`` asked :func:`supports`
    before choosing this backend, and _C refuses bad input to a direct call (ValueError).
    """
    kernel = attention_kernel(kernel)
    if torch.compiler.is_compiling():
        # The split count depends on the batch, which the graph may keep symbolic, and a plan
        # cached while tracing would change what the graph guards on: the op plans when it runs.
        code, splits = kernel_code(kernel, q, k_cache, block_table), 0
    else:
        table = None if block_table is None else block_table.shape
        key = (kernel, q.shape, q.dtype, q.device, k_cache.shape, table)
        code, splits = launch_plan.planned(key, attention_plan, kernel, q, k_cache, block_table,
                                           pin=ext.module())
    if num_splits is None:
        num_splits = splits
    _tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, float(scale),
                    out, lse, int(num_splits), code)
