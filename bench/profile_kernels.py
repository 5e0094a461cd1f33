"""Run each public op once at the headline shapes of docs/perf/, for Nsight Compute.

bench/device_check.sh runs it under ``ncu --profile-from-start off``: every op runs once to warm
up (module load, lazy init), then once more between ``torch.cuda.profiler.start()`` and
``stop()``, so ncu profiles exactly one launch of each kernel per shape. The ``profile:`` lines
on stdout give the order of the ops, to match against ncu's kernel list.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section Occupancy --section LaunchStats --csv python bench/profile_kernels.py
    python bench/profile_kernels.py --device cpu --small     # the same calls, small, on the CPU
    python bench/profile_kernels.py --summarize ncu.csv      # one line per kernel from ncu's CSV
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import jetspec_kernels as jk
from bench import common as bc

# Qwen3-8B: Hq 32, Hkv 8, Dh 128, V 151936, H 4096 (bf16). --small shrinks every size.
FULL = dict(hq=32, hkv=8, dh=128, v=151936, h=4096, d=15, k=8)
SMALL = dict(hq=4, hkv=2, dh=64, v=1000, h=64, d=5, k=4)


def random_tree(b, n, v, d, k, dev, gen):
    """A tree of n nodes drafted from random logits (the reference builder; not profiled)."""
    logits = torch.randn(b, d, v, generator=gen) * 3
    root = torch.randint(0, v, (b,), generator=gen, dtype=torch.int32)
    t = jk.draft_tree(logits, root, budget=n, topk=k, backend="reference")
    return jk.Tree(*(getattr(t, f).to(dev) for f in
                     ("tokens", "parents", "depths", "scores", "num_nodes", "mask")),
                   max_depth=t.max_depth)


def ops(dev, dtype, backend, s, small):
    """(label, fn) pairs, one per profiled op and shape."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, dh, v, h, d, k = (s[x] for x in ("hq", "hkv", "dh", "v", "h", "d", "k"))

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dev, dt)

    def attention(b, l, n, kernel):
        tree = random_tree(b, n, v, d, k, dev, gen)
        q, kc, vc = rand(b, n, hq, dh), rand(b, l + n, hkv, dh), rand(b, l + n, hkv, dh)
        prefix = torch.full((b,), l, dtype=torch.int32, device=dev)

        def run():
            with bc.using_attention_kernel(kernel):
                jk.tree_attention(q, kc, vc, prefix, tree.mask, backend=backend)
        return run

    def draft(b, budget):
        logits, root = rand(b, d, v), torch.zeros(b, dtype=torch.int32, device=dev)
        return lambda: jk.draft_tree(logits, root, budget=budget, topk=k, backend=backend)

    def from_hidden(b, budget):
        hid, w = rand(b, d, h), rand(v, h) / 64
        root = torch.zeros(b, dtype=torch.int32, device=dev)
        return lambda: jk.draft_tree_from_hidden(hid, w, root, budget=budget, topk=k,
                                                 backend=backend)

    def verify(b, n):
        tree = random_tree(b, n, v, d, k, dev, gen)
        target = rand(b, n, v)
        return lambda: jk.verify_tree(tree, target, backend=backend)

    def rope(b, n, l):
        q, kk, vv = rand(b, n, hq, dh), rand(b, n, hkv, dh), rand(b, n, hkv, dh)
        kc, vc = rand(b, l + n, hkv, dh), rand(b, l + n, hkv, dh)
        w = torch.ones(dh, device=dev, dtype=dtype)
        pos = torch.arange(n, device=dev, dtype=torch.int32).expand(b, n) + l
        start = torch.full((b,), l, dtype=torch.int32, device=dev)
        return lambda: jk.qk_norm_rope_append(q, kk, vv, w, w, pos, kc, vc, rope_theta=1e6,
                                              cache_start=start, backend=backend)

    def commit(b, n, l):
        tree = random_tree(b, n, v, d, k, dev, gen)
        verdict = jk.verify_tree(tree, rand(b, n, v), backend=backend)
        kc, vc = rand(b, l + n, hkv, dh), rand(b, l + n, hkv, dh)
        prefix = torch.full((b,), l, dtype=torch.int32, device=dev)
        return lambda: jk.commit_kv(kc, vc, prefix, verdict, backend=backend)

    l4k, l32k = (64, 256) if small else (4096, 32768)
    n64, n256 = (20, 24) if small else (64, 256)
    return [
        ("attention B1 L4K N64 (auto: wgmma on sm_90a)", attention(1, l4k, n64, None)),
        ("attention B1 L4K N64 (mma.sync)", attention(1, l4k, n64, "mma")),
        ("attention B1 L32K N16 (auto)", attention(1, l32k, 16, None)),
        ("draft_tree B1 D15 K8 n256 topn (top-K + tree)", draft(1, n256)),
        ("draft_tree_from_hidden B1 D15 n64", from_hidden(1, n64)),
        ("verify_tree greedy B1 N64", verify(1, n64)),
        ("qk_norm_rope_append B16 N256", rope(16 if not small else 2, n256, l4k)),
        ("commit_kv B16 N64", commit(16 if not small else 2, n64, l4k)),
        # Last: a fault in it would break the CUDA context of every launch after it.
        *([("attention B1 L4K N64 (hopper)", attention(1, l4k, n64, "hopper"))]
          if bc.hopper_kernel_enabled() else []),
    ]


# Metrics of ncu's SpeedOfLight / Occupancy / LaunchStats sections that the summary shows.
SUMMARY_METRICS = ["Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput",
                   "Registers Per Thread", "Achieved Occupancy"]


def summarize(path) -> None:
    """Print one line per profiled kernel from ``ncu --csv --page details`` output."""
    kernels: dict[str, dict] = {}
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if header is None:
        print(f"{path}: no ncu metric table found")
        return
    cols = rows[header]
    at = {c: cols.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Unit",
                                      "Metric Value")}
    for r in rows[header + 1:]:
        k = kernels.setdefault(r[at["ID"]], {"name": r[at["Kernel Name"]]})
        k[r[at["Metric Name"]]] = f"{r[at['Metric Value']]} {r[at['Metric Unit']]}".strip()
    print("id | kernel | " + " | ".join(SUMMARY_METRICS))
    for i, k in kernels.items():
        name = k["name"].removeprefix("void ").split("(")[0].split("<")[0][-48:]
        print(f"{i} | {name} | " + " | ".join(k.get(m, "-") for m in SUMMARY_METRICS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default=None, help="default: cuda on CUDA, reference on the CPU")
    p.add_argument("--small", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--summarize", metavar="CSV", help="summarise ncu's CSV instead of running")
    args = p.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
        return 0
    dev = torch.device(args.device)
    backend = args.backend or ("cuda" if dev.type == "cuda" else "reference")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sizes = SMALL if args.small else FULL
    failed = 0
    for label, fn in ops(dev, dtype, backend, sizes, args.small):
        try:
            fn()  # warm-up
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            print(f"profile: {label}", flush=True)
        except Exception as e:  # keep profiling the other ops
            failed += 1
            print(f"profile: {label}: FAILED {type(e).__name__}: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
