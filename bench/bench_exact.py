"""The exact mode's cost on this machine: the target's verify forward and one decode step, normal
and exact, on the shipped tiny target (docs/perf/exact_mode.md; CPU, reference backend).

    python bench/bench_exact.py [--dtype bfloat16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jetspec_kernels as jk  # noqa: E402
from jetspec_kernels import python_ref as ref  # noqa: E402
from jetspec_kernels.models.assets import load_tiny  # noqa: E402
from jetspec_kernels.ops.exact import exact_mode  # noqa: E402
from jetspec_kernels.tree import Tree  # noqa: E402


def _chain_tree(b: int, n: int) -> Tree:
    """A batch of b trees of n nodes: node i's parent is (i - 1) // 2 (a binary tree)."""
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], dtype=torch.int32)
    parents = parents.expand(b, n).contiguous()
    num = torch.full((b,), n, dtype=torch.int32)
    depths = torch.zeros(b, n, dtype=torch.int32)
    for i in range(1, n):
        depths[:, i] = depths[:, parents[0, i]] + 1
    tokens = torch.randint(0, 250, (b, n), generator=torch.Generator().manual_seed(0),
                           dtype=torch.int32)
    return Tree(tokens, parents, depths, torch.zeros(b, n), num,
                ref.pack_mask(parents, num).to(torch.int32), int(depths.max()))


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(dtype, repeats: int, cases=((1, 16, 64), (4, 64, 64))):
    """Rows (what, B, N, prefix, normal s, exact s, ratio)."""
    target, _ = load_tiny(dtype=dtype)
    rows = []
    for b, n, prefix in cases:
        cache = target.new_cache(b, prefix + n + 2)
        prompt = torch.randint(0, 250, (b, prefix), generator=torch.Generator().manual_seed(1))
        pos = torch.arange(prefix, dtype=torch.int32).expand(b, prefix).contiguous()
        zero = torch.zeros(b, dtype=torch.int32)
        plen = torch.full((b,), prefix, dtype=torch.int32)
        target.forward(prompt, pos, cache, zero)
        tree = _chain_tree(b, n)
        times = {}
        for exact in (False, True):
            with exact_mode(exact):
                times[exact] = (
                    _best(lambda: target.verify(tree, plen, cache, fused_argmax=True), repeats),
                    _best(lambda: target.decode(tree.tokens[:, 0], plen, cache), repeats))
        for k, what in enumerate(("verify forward + argmax", "decode step")):
            rows.append((what, b, n if k == 0 else 1, prefix, times[False][k], times[True][k],
                         times[True][k] / times[False][k]))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    jk.set_backend("reference")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.dtype}, tiny target "
          "(H 192, 4 layers, V 259)")
    print("what | B | N | prefix | normal s | exact s | exact / normal")
    for r in measure(getattr(torch, a.dtype), a.repeats):
        print(" | ".join([str(c) if not isinstance(c, float) else f"{c:.4g}" for c in r]),
              flush=True)


if __name__ == "__main__":
    main()
