"""Benchmark tree_attention (prefix + tree-masked tail over a KV cache) against dense baselines.

Rows per shape: every usable jetspec backend, and the baselines
``sdpa`` (PyTorch SDPA with a dense bool mask over prefix + tree), ``flex`` (FlexAttention with a
block mask, compiled once per shape; CUDA only), ``flash_causal`` (flash-attn with a causal tail:
no tree, the lower bound for the shape) and ``flashinfer`` (custom-mask batch prefill), the last
two when importable. ``rel_err`` is each row's relative L2 distance to the SDPA output.

Floor per layer: bytes = 2*B*(L+N)*Hkv*Dh*elt (K and V once per kv head) + 2*B*N*Hq*Dh*elt (q, out)
+ 4*B*N*ceil(N/32) (mask); FLOPs = 4*B*N*(L+N)*Hq*Dh (the whole prefix counted; the masked tail
is counted as if dense).

    python bench/bench_tree_attention.py --quick            # CPU: seconds; CUDA: 4 headline shapes
    python bench/bench_tree_attention.py --headline         # CUDA: the three headline shapes, every
        # variant side by side (device_check's attention step); with --quick on the CPU, a smoke
        # run of the same path at small shapes
    python bench/bench_tree_attention.py                    # full DESIGN.md section 7 sweep (GPU)

``--headline`` times, at 1x32K N256, 4x16K N128 and 16x4K N16 (Qwen3-8B heads, bf16): ``auto``
(the backend the public op picks), ``cuda`` (the kernel auto picks there), each cuda kernel by
name, ``triton``, SDPA with a dense mask and flex_attention with a block mask (compiled for every
shape), and prints them side by side in TFLOP/s and time / floor.
"""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench import common as bc

BASELINES = ["sdpa", "flex", "flash_causal", "flashinfer"]


# The headline shapes (docs/perf/tree_attention.md, "Floors at the headline shapes"): (B, L, N) at Qwen3-8B's heads; the first
# two compute-bound, the last memory-bound. On the CPU (--headline --quick) a smoke run at HEADLINE_CPU.
HEADLINE = [(1, 32768, 256), (4, 16384, 128), (16, 4096, 16)]
HEADLINE_CPU = [(1, 96, 32), (2, 64, 16), (4, 32, 8)]
# The cuda kernels by name: auto picks wgmma on sm_90a (Dh 64/128) and mma elsewhere; hopper is
# the candidate to become auto's pick.
CUDA_KERNELS = ("mma", "wgmma", "hopper")


def shapes(opts: bc.Options):
    """(B, L, N) triples and (Hq, Hkv, Dh)."""
    if opts.args.headline:
        return (HEADLINE, (32, 8, 128)) if opts.cuda else (HEADLINE_CPU, (4, 2, 64))
    if not opts.cuda:
        return [(1, 64, 8), (2, 128, 16)], (4, 2, 64)
    if opts.quick:
        return [(1, 4096, 64), (1, 32768, 256), (4, 16384, 128), (16, 4096, 16)], (32, 8, 128)
    grid = itertools.product((1, 4, 16), (1024, 4096, 16384, 32768), (16, 64, 128, 256))
    return list(grid), (32, 8, 128)


def cost(b, l, n, hq, hkv, dh, e):
    """(FLOPs, bytes) of one tree_attention call (see the module docstring)."""
    flops = 4.0 * b * n * (l + n) * hq * dh
    nbytes = 2.0 * b * (l + n) * hkv * dh * e + 2.0 * b * n * hq * dh * e + 4.0 * b * n * math.ceil(n / 32)
    return flops, nbytes


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


_FLEX = None


def _flex():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def _optional_import(name):
    try:
        return __import__(name), None
    except Exception as e:
        return None, f"{name} is not importable ({type(e).__name__}: {e})"


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(bc.DTYPES), default=None,
                   help="default bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--baselines", default=None,
                   help=f"comma list out of {','.join(BASELINES)} (default: all; sdpa,flex with "
                        "--headline)")
    p.add_argument("--flex-shapes", type=int, default=None,
                   help="compile FlexAttention for the first N shapes only (each shape is a "
                        "recompile; default: all, 2 with --quick)")
    p.add_argument("--headline", action="store_true",
                   help="the three headline shapes, every variant (auto, each cuda kernel, "
                        "triton, SDPA, flex), printed side by side; with --quick on the CPU, small "
                        "shapes")
    opts = bc.options(p, argv)
    headline = opts.args.headline
    if headline and not opts.cuda and not opts.quick:
        p.error("--headline times Qwen3-8B shapes on CUDA; on the CPU add --quick (small shapes)")
    flex_shapes = opts.args.flex_shapes if opts.args.flex_shapes is not None else \
        (2 if opts.quick and not headline else len(shapes(opts)[0]))
    dtype = bc.DTYPES[opts.args.dtype or ("bf16" if opts.cuda else "fp32")]
    wanted = set((opts.args.baselines or ("sdpa,flex" if headline else ",".join(BASELINES))).split(","))
    deferred = []
    dev = opts.device
    import jetspec_kernels as jk

    ceil = bc.measure_ceilings(dev, dtype, opts.quick)
    table = bc.Table("tree_attention", opts, ceil, BASELINES, extra_columns=["rel_err"])
    grid, (hq, hkv, dh) = shapes(opts)
    table.header_lines.append(f"Hq {hq}, Hkv {hkv}, Dh {dh}, {str(dtype)[6:]}; shape = B x L(prefix) x N(tree)")
    table.header_lines.append("cuda: the kernel auto picks (wgmma on sm_90a at Dh 64/128); "
                              "cuda_mma: the mma.sync kernel; cuda_hopper: the Hopper family "
                              "(sm_90a)")
    status = bc.backend_status(opts)
    flash, flash_why = _optional_import("flash_attn")
    finfer, finfer_why = _optional_import("flashinfer")
    e = bc.elt(dtype)
    gen = torch.Generator(device=dev).manual_seed(0)

    for si, (b, l, n) in enumerate(grid):
        shape = f"{b}x{l}x{n}"
        flops, nbytes = cost(b, l, n, hq, hkv, dh, e)
        q = torch.randn(b, n, hq, dh, device=dev, dtype=dtype, generator=gen)
        k_cache = torch.randn(b, l + n, hkv, dh, device=dev, dtype=dtype, generator=gen)
        v_cache = torch.randn(b, l + n, hkv, dh, device=dev, dtype=dtype, generator=gen)
        prefix = torch.full((b,), l, dtype=torch.int32, device=dev)
        tree = bc.random_tree(b, n, dev, seed=si)
        dense = tree.dense_mask()                                            # [B, N, N]

        # SDPA first: its output is the yardstick for rel_err.
        q_t = q.transpose(1, 2).contiguous()
        k_t = k_cache.transpose(1, 2).contiguous()
        v_t = v_cache.transpose(1, 2).contiguous()
        full_mask = torch.cat([torch.ones(b, n, l, dtype=torch.bool, device=dev), dense], -1)[:, None]
        ref_out = None
        if "sdpa" in wanted:
            def sdpa():
                return F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=full_mask,
                                                      enable_gqa=True)
            try:
                ref_out = sdpa().transpose(1, 2)
            except Exception as ex:
                table.skip(shape, "sdpa", f"failed: {ex}"[:300], flops=flops, nbytes=nbytes)
            else:
                table.run(shape, "sdpa", sdpa, flops=flops, nbytes=nbytes, rel_err=0.0)

        for name, why in status.items():
            out = torch.full_like(q, float("nan"))

            def ours(name=name, out=out):
                return jk.tree_attention(q, k_cache, v_cache, prefix, tree.mask, out=out,
                                         backend=name)
            row = table.run_ours(shape, name, why, ours, first_shape=si == 0, flops=flops,
                                 nbytes=nbytes)
            if row["status"] == "ok" and ref_out is not None:
                row["rel_err"] = rel_err(out, ref_out)
        if headline:
            _run_auto(table, shape, q, k_cache, v_cache, prefix, tree, flops, nbytes, ref_out)
        # The cuda backend's other kernels next to `cuda` (auto: wgmma on sm_90a).
        kernels = tuple(k for k in (CUDA_KERNELS if headline else ("mma", "hopper"))
                        if k != "hopper" or bc.hopper_kernel_enabled())
        for kernel in kernels if "cuda" in status else ():
            out_k = torch.full_like(q, float("nan"))

            def cuda_kernel(out=out_k, kernel=kernel):
                from jetspec_kernels import cuda as jc
                jc.tree_attention(q, k_cache, v_cache, prefix, tree.mask, "mask", None,
                                  dh ** -0.5, out, None, kernel=kernel)
                return out
            row = table.run_ours(shape, "cuda", status["cuda"], cuda_kernel, first_shape=si == 0,
                                 flops=flops, nbytes=nbytes, label=f"cuda_{kernel}")
            if row["status"] == "ok" and ref_out is not None:
                row["rel_err"] = rel_err(out_k, ref_out)

        if "flex" in wanted:
            if not opts.cuda:
                table.skip(shape, "flex", "FlexAttention is benchmarked on CUDA only (CPU "
                           "compilation would dominate the quick run)", flops=flops, nbytes=nbytes)
            elif si >= flex_shapes:
                table.skip(shape, "flex", f"compiled for the first {flex_shapes} shapes only "
                           "(--flex-shapes)", flops=flops, nbytes=nbytes)
            elif headline:   # after every other row: a cut run keeps those, flex compiles last
                deferred.append((_run_flex, (table, shape, q_t, k_t, v_t, dense, b, l, n, flops,
                                             nbytes, ref_out)))
            else:
                _run_flex(table, shape, q_t, k_t, v_t, dense, b, l, n, flops, nbytes, ref_out)
        if "flash_causal" in wanted:
            if flash is None:
                table.skip(shape, "flash_causal", flash_why, flops=flops, nbytes=nbytes)
            else:
                from flash_attn import flash_attn_func

                table.run(shape, "flash_causal",
                          lambda: flash_attn_func(q, k_cache, v_cache, causal=True),
                          flops=flops, nbytes=nbytes)
        if "flashinfer" in wanted:
            if finfer is None:
                table.skip(shape, "flashinfer", finfer_why, flops=flops, nbytes=nbytes)
            else:
                _run_flashinfer(table, shape, q, k_cache, v_cache, full_mask, b, l, n,
                                hq, hkv, dh, flops, nbytes, ref_out)
        del q, k_cache, v_cache, q_t, k_t, v_t, full_mask, ref_out
        if opts.cuda:
            torch.cuda.empty_cache()
    for run, args in deferred:
        run(*args)
    rc = table.finish()
    if headline:
        print("\n".join(side_by_side(table.rows)), flush=True)
    return rc


def _run_auto(table, shape, q, k_cache, v_cache, prefix, tree, flops, nbytes, ref_out):
    """The row of what a caller gets: the public op with backend="auto" (the note names the
    backend auto picked)."""
    import jetspec_kernels as jk
    from jetspec_kernels import backend as jb

    out = torch.full_like(q, float("nan"))
    picked = jb.resolve(q.device, "auto", "tree_attention")

    def auto():
        return jk.tree_attention(q, k_cache, v_cache, prefix, tree.mask, out=out, backend="auto")
    row = table.run(shape, "auto", auto, flops=flops, nbytes=nbytes, note=f"auto runs {picked}")
    if row["status"] == "ok" and ref_out is not None:
        row["rel_err"] = rel_err(out, ref_out)


def side_by_side(rows: list[dict]) -> list[str]:
    """One line per shape and variant, variants in row order: TFLOP/s, time / floor, and the
    speed-up against SDPA and flex (rows that did not run say why in one word)."""
    lines = ["== tree_attention side by side: TFLOP/s, time / floor (1 = at the roofline), "
             "x_sdpa, x_flex (> 1: faster than it) =="]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        lines.append(f"-- {shape}")
        for r in (r for r in rows if r["shape"] == shape):
            if r["status"] != "ok":
                lines.append(f"   {r['backend']:12s} [{r['status']}] {r['note'][:90]}")
                continue
            xs = "  ".join(f"x_{b} {bc._fmt(r.get(f'x_{b}', math.nan))}" for b in ("sdpa", "flex"))
            lines.append(f"   {r['backend']:12s} {bc._fmt(r['tflops']):>8s} TFLOP/s  "
                         f"{bc._fmt(r['time_over_floor']):>6s} x floor  {xs}")
    return lines


def _run_flex(table, shape, q_t, k_t, v_t, dense, b, l, n, flops, nbytes, ref_out):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(bi, h, q_idx, kv_idx):
        tail = (kv_idx - l).clamp(min=0)
        return (kv_idx < l) | dense[bi, q_idx, tail]

    try:
        block_mask = create_block_mask(mask_mod, b, None, n, l + n, device=q_t.device, _compile=True)
        flex = _flex()
        out = flex(q_t, k_t, v_t, block_mask=block_mask, enable_gqa=True)
    except Exception as ex:
        table.add(shape, "flex", None, flops=flops, nbytes=nbytes, status="error",
                  note=f"{type(ex).__name__}: {ex}"[:300])
        return
    err = rel_err(out.transpose(1, 2), ref_out) if ref_out is not None else math.nan
    table.run(shape, "flex", lambda: flex(q_t, k_t, v_t, block_mask=block_mask, enable_gqa=True),
              flops=flops, nbytes=nbytes, rel_err=err)


def _run_flashinfer(table, shape, q, k_cache, v_cache, full_mask, b, l, n, hq, hkv, dh,
                    flops, nbytes, ref_out):
    import flashinfer

    dev = q.device
    try:
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * n
        kv_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * (l + n)
        wrapper.plan(qo_indptr, kv_indptr, hq, hkv, dh, custom_mask=full_mask[:, 0].reshape(-1),
                     q_data_type=q.dtype)
        qf, kf, vf = q.reshape(b * n, hq, dh), k_cache.reshape(-1, hkv, dh), v_cache.reshape(-1, hkv, dh)
        out = wrapper.run(qf, kf, vf)
    except Exception as ex:
        table.add(shape, "flashinfer", None, flops=flops, nbytes=nbytes, status="error",
                  note=f"{type(ex).__name__}: {ex}"[:300])
        return
    err = rel_err(out.reshape(b, n, hq, dh), ref_out) if ref_out is not None else math.nan
    table.run(shape, "flashinfer", lambda: wrapper.run(qf, kf, vf), flops=flops, nbytes=nbytes,
              rel_err=err)


if __name__ == "__main__":
    bc.main_guard(main)
