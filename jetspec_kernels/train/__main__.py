"""``python -m jetspec_kernels.train``: remake the tiny shipped models (or re-measure them).

Examples::

    python -m jetspec_kernels.train                       # the shipped recipe -> jetspec_kernels/assets/tiny
    python -m jetspec_kernels.train --out /tmp/tiny --preset quick
    python -m jetspec_kernels.train --eval-only           # re-measure acceptance of the shipped files
    python -m jetspec_kernels.train --check-data          # is this Python's stdlib the recorded corpus?
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .recipe import PRESETS, evaluate_dir, run_recipe

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny")


def _print_table(table: dict) -> None:
    budgets = list(next(iter(table.values())))
    print(f"{'mean accepted':14s}" + "".join(f"{'B=' + b:>8s}" for b in budgets))
    for name, row in table.items():
        print(f"{name:14s}" + "".join(f"{row[b]:8.2f}" for b in budgets))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jetspec_kernels.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: the package's assets/tiny)")
    p.add_argument("--preset", choices=tuple(PRESETS), default="default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-only", action="store_true", help="only measure the acceptance of --out")
    p.add_argument("--check-data", action="store_true",
                   help="check that this Python's stdlib matches --out/recipe.json's data manifest")
    args = p.parse_args(argv)
    if args.eval_only or args.check_data:
        with open(os.path.join(args.out, "recipe.json")) as f:
            recipe = json.load(f)
        from .data import load_corpus
        for split in ("train", "heldout"):
            load_corpus(recipe["data"], split)        # raises on a missing or different file
        print(f"data: all {len(recipe['data']['files'])} files match the manifest")
        if args.eval_only:
            import torch
            torch.set_num_threads(args.threads)
            _print_table(evaluate_dir(args.out, recipe["data"]))
            print("recorded:")
            _print_table(recipe["acceptance"]["mean_accepted_length"])
        return 0
    command = " ".join(["python -m jetspec_kernels.train"] + (sys.argv[1:] if argv is None else list(argv)))
    recipe = run_recipe(args.out, preset=args.preset, seed=args.seed, threads=args.threads, command=command)
    _print_table(recipe["acceptance"]["mean_accepted_length"])
    print(f"wrote {args.out} in {recipe['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
