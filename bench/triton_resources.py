"""Compile every Triton kernel for sm_90a offline (no GPU) and report its resources.

    python bench/triton_resources.py [--csv PATH] [--ptx-dir DIR]

The Triton interpreter checks the kernels' logic on the CPU but never compiles them, so it
cannot see bf16 ``tl.dot`` lowering, register spills or shared memory beyond the 227 KB an
sm_90 block may use. This script compiles each kernel exactly as the backend launches it on
a CUDA device (same wrappers, block sizes and constexprs), at the Qwen3-8B shapes of the
benchmarks, and reads registers, stack and spills from ``ptxas -v`` (the ptxas Triton uses)
and shared memory from the compiled kernel. tests/test_triton_sm90_resources.py fails on any
spill or on shared memory over the limit.

How it compiles without a GPU: a stand-in Triton driver reports an sm_90 target, and every
launch becomes ``warmup=True`` (compile, do not run). The wrappers get CPU tensors of the right
dtypes and shapes (never read), and their device-dependent choices are told "cuda". Triton
internals (``JITFunction.run``, ``driver.set_active``) are used on purpose: this is a build check,
not library code. Works with triton 3.6 (the device machine's) and 3.9 (CI's).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # must precede the kernels' @triton.jit

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SM90_MAX_SHARED = 227 * 1024  # opt-in dynamic shared memory per block on sm_90
H200_SMS = 132


class _Sm90Driver:
    """The parts of a Triton driver that compiling needs: an sm_90 target, device 0."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 64)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


def _install(compiled: list) -> None:
    driver.set_active(_Sm90Driver())
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only


def _as_cuda(module) -> None:
    """Make a wrapper's device-dependent choices (block sizes, split counts) those of an H200."""
    cuda = torch.device("cuda", 0)
    if hasattr(module, "_block_sizes"):  # attention
        block_sizes = module._block_sizes
        module._block_sizes = lambda device, rows, head_dim: block_sizes(cuda, rows, head_dim)
    if hasattr(module, "_splits"):  # verify
        splits = module._splits
        module._splits = lambda rows, V, block_v, device: splits(rows, V, block_v, cuda)


def _cases():
    """(label, thunk) pairs: each thunk calls one backend wrapper as a GPU caller would."""
    import importlib

    import jetspec_kernels.triton as kernels
    from jetspec_kernels import launch_plan
    attention = importlib.import_module("jetspec_kernels.triton.tree_attention")
    verify = importlib.import_module("jetspec_kernels.triton.verify_tree")
    rms_norm_mod = importlib.import_module("jetspec_kernels.triton.rms_norm")

    for m in (attention, verify):
        _as_cuda(m)
    launch_plan.sm_count = lambda device: H200_SMS  # split counts as on an H200 (its 132 SMs)
    e = torch.empty
    i32 = dict(dtype=torch.int32)
    bf16 = torch.bfloat16
    hq, hkv = 32, 8

    def attn(dtype, dh, n, tail, paged, splits, with_lse, v_pad=0):
        b, length = 2, 4096
        q = e(b, n, hq, dh, dtype=dtype)
        if paged:
            kc = e(b * length // 16, 16, hkv, dh, dtype=dtype)
            table = e(b, length // 16, **i32)
        else:
            kc, table = e(b, length, hkv, dh, dtype=dtype), None
        # V rows padded wider than K: the kernel keeps a second offset vector for V.
        vc = e(b, length, hkv, dh + v_pad, dtype=dtype)[..., :dh] if v_pad else kc
        mask = e(b, n, -(-n // 32), **i32) if tail == "mask" else None
        lse = e(b, hq, n) if with_lse else None
        return lambda: attention.launch_tree_attention(
            q, kc, vc, e(b, **i32), mask, "causal" if tail == "mask" else tail, table, 0.088,
            torch.empty_like(q), lse, num_splits=splits)

    variants = (("mask paged split lse", ("mask", True, 4, True)),
                ("mask lse", ("mask", False, 1, True)),
                ("causal", ("causal", False, 1, False)))
    for dtype, dhs in ((bf16, (64, 128, 256)), (torch.float16, (128,))):  # fp16 compiles alike
        for dh in dhs:
            for n in (16, 64):
                for what, args in variants:
                    yield (f"tree_attention {str(dtype)[6:]} Dh{dh} N{n} {what}",
                           attn(dtype, dh, n, *args))
    yield ("tree_attention bfloat16 Dh128 N64 causal V padded",  # the most registers
           attn(bf16, 128, 64, "causal", False, 1, False, v_pad=16))

    exact_attn = importlib.import_module("jetspec_kernels.triton.exact_attention")
    exact_mm = importlib.import_module("jetspec_kernels.triton.exact_matmul")

    def exact(dtype, dh, n, paged, masked=True):   # the exact attention: 8192 positions, 8 splits
        b, length = 2, 8192
        q = e(b, n, hq, dh, dtype=dtype)
        kc = e(b * length // 16, 16, hkv, dh, dtype=dtype) if paged else e(b, length, hkv, dh, dtype=dtype)
        table = e(b, length // 16, **i32) if paged else None
        mask = torch.zeros(b, n, -(-n // 32), **i32) if masked else None
        return lambda: exact_attn.exact_tree_attention(
            q, kc, kc, torch.zeros(b, **i32), mask, "causal", table, 0.088, torch.empty_like(q),
            e(b, hq, n))

    for dh in (64, 128, 256):
        for paged in (False, True):
            yield (f"exact tree_attention bfloat16 Dh{dh} N64{' paged' if paged else ''}",
                   exact(bf16, dh, 64, paged))
    for dh in (64, 128, 256):               # no mask: a prefill chunk, a decode step
        yield (f"exact tree_attention bfloat16 Dh{dh} N512 causal",
               exact(bf16, dh, 512, False, masked=False))
    for dh in (64, 128):    # float32 (the tests' dtype; its IEEE dots spill at Dh 256, any tile)
        yield f"exact tree_attention float32 Dh{dh} N64", exact(torch.float32, dh, 64, False)
    for dtype in (bf16, torch.float16, torch.float32):
        for tile, m, k_dim, n_dim in (("narrow", 64, 4096, 6144), ("narrow", 1, 12288, 4096),
                                      ("wide", 1024, 4096, 6144), ("wide", 16, 12288, 4096)):
            yield (f"exact linear {tile} {str(dtype)[6:]} M{m} K{k_dim} N{n_dim}",
                   lambda dtype=dtype, m=m, k_dim=k_dim, n_dim=n_dim, tile=tile:
                   exact_mm.exact_linear(e(m, k_dim, dtype=dtype), e(n_dim, k_dim, dtype=dtype),
                                         tile))
        # exact_k_parts 8 (tp-invariant mode): o_proj's K in 8 parts, then the tree kernel
        yield (f"exact linear parts 8 narrow {str(dtype)[6:]} M64 K4096 N4096",
               lambda dtype=dtype: exact_mm.exact_linear_parts(
                   e(64, 4096, dtype=dtype), e(4096, 4096, dtype=dtype), 8))
        yield (f"exact k parts tree 8 -> {str(dtype)[6:]} M64 N4096",
               lambda dtype=dtype: exact_mm.sum_parts_pairwise(e(8, 64, 4096), dtype))
        # Qwen3-30B-A3B's experts (128 of them, top-8, H 2048, I 768): gate_up at T 64
        yield (f"exact grouped linear {str(dtype)[6:]} T64 k8 E128 K2048 N1536",
               lambda dtype=dtype: exact_mm.exact_grouped_linear(
                   e(64, 2048, dtype=dtype), e(128, 1536, 2048, dtype=dtype),
                   torch.zeros(64, 8, dtype=torch.int64), per_token=8))

    yield ("exact k parts tree 64 (the limit) -> bfloat16 M64 N4096",
           lambda: exact_mm.sum_parts_pairwise(e(64, 64, 4096), bf16))
    v, d, k = 151936, 15, 8
    yield ("log_softmax_topk bf16 V151936",
           lambda: kernels.log_softmax_topk(e(1, d, v, dtype=bf16), k))
    yield ("hidden_topk bf16 H4096", lambda: kernels.hidden_topk(e(1, d, 4096, dtype=bf16),
                                                                 e(v, 4096, dtype=bf16), k))
    for budget in (64, 256, 1024):
        for alg in ("topn", "accum_logp"):
            yield (f"build_tree {alg} budget {budget}",
                   lambda budget=budget, alg=alg: kernels.build_tree(
                       e(1, d, k, **i32), e(1, d, k), e(1, **i32), budget, alg))
    yield "pack_mask N256", lambda: kernels.pack_mask(e(4, 256, **i32), e(4, **i32))
    for n, temp in ((64, 0.0), (256, 0.8)):
        yield (f"verify_tree bf16 N{n} T{temp}",
               lambda n=n, temp=temp: verify.verify_tree(
                   e(4, n, **i32), e(4, n, **i32), e(4, **i32), 15, e(4, n, v, dtype=bf16), None,
                   temp, e(4, dtype=torch.int64), e(4, dtype=torch.int64)))
    yield ("verify_tree bf16 N256 T0.8 top-k top-p",
           lambda: verify.verify_tree(
               e(4, 256, **i32), e(4, 256, **i32), e(4, **i32), 15, e(4, 256, v, dtype=bf16), None,
               0.8, e(4, dtype=torch.int64), e(4, dtype=torch.int64), e(4, **i32), e(4)))
    yield ("qk_norm_rope_append bf16 Dh128",
           lambda: kernels.qk_norm_rope_append(
               e(2, 64, hq, 128, dtype=bf16), e(2, 64, hkv, 128, dtype=bf16),
               e(2, 64, hkv, 128, dtype=bf16), e(128), e(128), e(2, 64, **i32),
               e(2, 4096, hkv, 128, dtype=bf16), e(2, 4096, hkv, 128, dtype=bf16), 1e6, 1e-6,
               None, e(2, **i32)))
    for what, h, res in (("H4096 + residual", 4096, True), ("H4096", 4096, False),
                         ("H 2 x one-pass max + residual", 2 * rms_norm_mod.ONE_PASS_MAX, True)):
        yield (f"rms_norm bf16 {what}",
               lambda h=h, res=res: kernels.rms_norm(e(64, h, dtype=bf16),
                                                     e(64, h, dtype=bf16) if res else None,
                                                     e(h, dtype=bf16), 1e-6))
    yield ("silu_mul bf16 I12288", lambda: kernels.silu_mul(e(64, 2 * 12288, dtype=bf16)))
    # Qwen3.6-35B-A3B's Gated DeltaNet layers: 16 q/k heads, 32 v-heads, Dk = Dv = 128
    for dtype in (bf16, torch.float32):
        for n in (16, 64, 256):
            yield (f"gated_delta_tree {str(dtype)[6:]} Dk128 N{n}",
                   lambda dtype=dtype, n=n: kernels.gated_delta_tree(
                       e(2, n, 16, 128, dtype=dtype), e(2, n, 16, 128, dtype=dtype),
                       e(2, n, 32, 128, dtype=dtype), e(2, n, 32), e(2, n, 32, dtype=dtype),
                       e(2, n, **i32), e(4, 32, 128, 128), e(2, **i32), e(2, **i32), None, True))
    # the hybrids' exact mode (triton/exact_gated_delta.py) at the same shapes; hidden 2048
    exact_gd = importlib.import_module("jetspec_kernels.triton.exact_gated_delta")
    walk_plan = importlib.import_module("jetspec_kernels.models.walk_plan")

    def plan(b, n):
        return walk_plan.WalkPlan(e(b, n, **i32), e(b, n, **i32), e(b, n, **i32), 15)
    for dtype in (bf16, torch.float32):
        name = str(dtype)[6:]
        yield (f"exact gated_delta walk {name} Dk128 N64",
               lambda dtype=dtype: exact_gd.walk(
                   e(2, 64, 16, 128), e(2, 64, 16, 128), e(2, 64, 32, 128, dtype=dtype),
                   e(2, 64, 32), e(2, 64, 32), plan(2, 64), e(2, **i32), e(4, 32, 128, 128),
                   e(2, **i32), out=True, store_last=False))
        yield (f"exact gated_delta prep {name} C8192 W4",
               lambda dtype=dtype: exact_gd.prep(
                   e(2, 67, 8192, dtype=dtype), e(2, 64, 4, **i32), e(8192, 4, dtype=dtype),
                   e(2, 64, 32, dtype=dtype), e(2, 64, 32, dtype=dtype), e(32, dtype=dtype),
                   e(32, dtype=dtype), 16, 128, 128, 128 ** -0.5))
    exact_route = importlib.import_module("jetspec_kernels.triton.exact_route")
    for experts, k in ((128, 8), (256, 8)):         # Qwen3-30B-A3B, Qwen3.6-35B-A3B
        yield (f"exact route_rows bf16 E{experts} k{k}",
               lambda experts=experts, k=k: exact_route.route_rows(
                   e(64, experts, dtype=bf16), k, True))
    yield ("exact zc_norm_rows bf16 H2048",
           lambda: exact_gd.zc_norm_rows(e(64, 2048, dtype=bf16), e(2048, dtype=bf16), 1e-6))
    yield ("exact gated_norm_rows bf16 Dv128",
           lambda: exact_gd.gated_norm_rows(e(64, 32, 128), e(64, 32, 128, dtype=bf16),
                                            e(128, dtype=bf16), 1e-6))
    yield ("exact sigmoid_gate bf16 4096 + base",
           lambda: exact_gd.sigmoid_gate(e(64, 4096, dtype=bf16), e(64, 4096, dtype=bf16),
                                         e(64, 4096, dtype=bf16)))
    yield ("commit_kv bf16 Dh128 + hidden",
           lambda: kernels.commit_kv(e(2, 4096, hkv, 128, dtype=bf16),
                                     e(2, 4096, hkv, 128, dtype=bf16), e(2, **i32),
                                     e(2, 16, **i32), e(2, **i32), None,
                                     e(2, 64, 3 * 4096, dtype=bf16)))


def _usage(ptx: str, name: str, tmp: Path) -> dict:
    """{registers, stack, spill_stores, spill_loads} of entry ``name``: ``ptxas -v`` on the
    kernel's PTX, run as Triton runs it for sm_90a."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = tmp / "kernel.ptx"
    path.write_text(ptx)
    # The flags Triton's make_cubin passes (register allocation differs without them).
    cmd = [get_ptxas(90).path, "-lineinfo", "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a",
           str(path), "-o", str(tmp / "kernel.o")]
    log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    # The entry's "Function properties" block comes right after "Compiling entry function".
    entry = log[log.index(f"Compiling entry function '{name}'"):]
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      entry)
    regs = re.search(r"Used (\d+) registers", entry)
    return dict(registers=int(regs.group(1)), stack=int(frame.group(1)),
                spill_stores=int(frame.group(2)), spill_loads=int(frame.group(3)))


def collect(ptx_dir: Path | None = None) -> list[dict]:
    """One row per compiled kernel: case, kernel, warps, stages, registers, stack, shared;
    ``ptx_dir``: also write each kernel's PTX there as ``<row index>_<kernel>.ptx``."""
    compiled: list = []
    _install(compiled)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, thunk in _cases():
            start = len(compiled)
            thunk()
            for name, kernel in compiled[start:]:
                md = kernel.metadata
                if ptx_dir is not None:
                    (ptx_dir / f"{len(rows)}_{name}.ptx").write_text(kernel.asm["ptx"])
                rows.append(dict(case=label, kernel=name, warps=md.num_warps,
                                 stages=md.num_stages, shared=md.shared,
                                 **_usage(kernel.asm["ptx"], md.name, Path(tmp))))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=None, help="also write the rows as CSV")
    p.add_argument("--ptx-dir", type=Path, default=None,
                   help="also write each kernel's PTX there (<row index>_<kernel>.ptx)")
    args = p.parse_args(argv)
    if args.ptx_dir:
        args.ptx_dir.mkdir(parents=True, exist_ok=True)
    rows = collect(args.ptx_dir)
    cols = ["case", "kernel", "warps", "stages", "registers", "stack", "spill_stores",
            "spill_loads", "shared"]
    width = max(len(r["case"]) for r in rows)
    kw = max(len(r["kernel"]) for r in rows)
    print(f"{'case':{width}s}  {'kernel':{kw}s}  warps stages  regs  stack  spill st/ld  shared")
    for r in rows:
        flag = "  <- spills" if r["spill_stores"] or r["spill_loads"] else ""
        flag += "  <- shared over 227 KB" if r["shared"] > SM90_MAX_SHARED else ""
        print(f"{r['case']:{width}s}  {r['kernel']:{kw}s}  {r['warps']:5d} {r['stages']:6d} "
              f"{r['registers']:5d} {r['stack']:6d} {r['spill_stores']:6d}/{r['spill_loads']:<5d}"
              f"{r['shared']:7d}{flag}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    print(f"triton {triton.__version__}, target sm_90a; {len(rows)} kernels compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
