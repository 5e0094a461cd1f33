"""``python -m jetspec_kernels demo``: real speculative decoding with the shipped tiny models.

Loads the tiny byte-level Qwen3 target and its trained JetSpec draft head from
``jetspec_kernels/assets/tiny`` (see ``recipe.json`` there and ``python -m jetspec_kernels.train``),
decodes a few Python-source prompts with speculative decoding and autoregressively, checks that
the outputs are identical (exit status 1 if not), prints tokens/s of both, the speed-up and the
accepted length of every round, then measures the mean accepted length against the tree budget
for the causal head, the bidirectional (DFlash) head and a chain (top-1 path, budget = depth + 1),
prints the table and writes it as a PNG (and CSV). By default the table has the budgets 4, 16 and
64 (about a minute on 2 CPU cores); ``--full`` measures 1 to 256 (several minutes), and
``--budgets`` any list. A line is printed as each stage starts and as each budget is done.

``demo --random-round`` runs one round end to end on random data at realistic shapes instead
(jetspec_kernels/demo_random.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as _backend
from jetspec_kernels.demo_random import random_round
from jetspec_kernels.generate_cli import PROG, Parser, UsageError, int_at_least, parse_device, report
from jetspec_kernels.limits import MAX_BUDGET, MAX_TOPK

PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Parse the arguments and run.\"\"\"\n    ",
    "class Queue:\n    \"\"\"A simple first-in first-out queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n"
    "        self.",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, ",
    "        if not isinstance(name, str):\n            raise TypeError(",
)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
QUICK_BUDGETS = (4, 16, 64)
FULL_BUDGETS = (1, 4, 16, 64, 256)


def _tiny_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"{PROG} demo", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-round", action="store_true",
                   help="run the one-round random-data demo instead (its own flags follow)")
    p.add_argument("--backend", default=None, choices=_backend.BACKENDS)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--models", default=None, help="tiny-model directory (default: the shipped one)")
    p.add_argument("--prompts", type=int_at_least(1, len(PROMPTS)), default=3,
                   help=f"how many built-in prompts (1..{len(PROMPTS)})")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=64)
    p.add_argument("--budget", type=int_at_least(1, MAX_BUDGET), default=None,
                   help="tree budget of the timed speculative run (default: 16 on cpu, where the "
                        "verify forward's cost grows with the tree size; 64 on a GPU)")
    p.add_argument("--topk", type=int_at_least(1, MAX_TOPK), default=8)
    p.add_argument("--budgets", type=int_at_least(1, MAX_BUDGET), nargs="*", default=None,
                   help=f"budgets of the acceptance table (default {' '.join(map(str, QUICK_BUDGETS))}; "
                        "none: skip the table)")
    p.add_argument("--full", action="store_true",
                   help=f"the full acceptance table: budgets {' '.join(map(str, FULL_BUDGETS))} "
                        "(several minutes on a CPU)")
    p.add_argument("--table-tokens", type=int_at_least(1), default=32,
                   help="new tokens per prompt for the table")
    p.add_argument("--out", default=os.path.join("bench", "results", "demo"),
                   help="directory for demo_acceptance.png / .csv")
    return p


def _decode_each(fn, target, prompts, **kw):
    """Decode prompts one at a time (clean per-round statistics); returns (outputs, seconds)."""
    outs, seconds = [], 0.0
    for p in prompts:
        o = fn(target, prompt_ids=[p], **kw)
        outs.append(o)
        seconds += o.stats.seconds
    return outs, seconds


def _write_table(table: dict, budgets, out_dir: str) -> list[str]:
    """CSV and (when matplotlib is installed) PNG of the acceptance table; returns written paths."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "demo_acceptance.csv")
    with open(csv_path, "w") as f:
        f.write("drafter," + ",".join(f"budget_{b}" for b in budgets) + "\n")
        for name, row in table.items():
            f.write(name + "," + ",".join(f"{row[str(b)]:.4f}" for b in budgets) + "\n")
    written = [csv_path]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG written")
        return written
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    labels = {"head_causal": "JetSpec causal head (tree)", "head_dflash": "DFlash bidirectional head (tree)",
              "chain": "causal head, chain (top-1)"}
    for name, row in table.items():
        ax.plot(budgets, [row[str(b)] for b in budgets], marker="o", label=labels.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("tree budget (nodes, root included)")
    ax.set_ylabel("mean accepted draft tokens / round")
    ax.set_title("tiny byte-level Qwen3 on stdlib-style Python (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(out_dir, "demo_acceptance.png")
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return written + [png]


def tiny_demo(argv=None) -> int:
    """The real-model demo (see the module docstring); returns the exit status (1 if lossy)."""
    args = _tiny_parser().parse_args(argv)
    if args.budgets is None:
        args.budgets = list(FULL_BUDGETS if args.full else QUICK_BUDGETS)
    device = parse_device(args.device)
    previous = jk.get_backend()
    if args.backend is not None:
        jk.set_backend(args.backend)
    try:
        return _run_tiny(args, device)
    finally:
        jk.set_backend(previous)


def _run_tiny(args, device) -> int:
    from .decode import generate, generate_ar
    from .models.assets import TINY_DIR, load_tiny
    from .models.byte_tokenizer import EOS_ID, decode, encode

    backend = _backend.resolve(device)
    if args.budget is None:
        args.budget = 16 if device.type == "cpu" else 64
    target, heads = load_tiny(args.models or TINY_DIR, dtype=DTYPES[args.dtype], device=device)
    head = heads["head_causal"]
    tc = target.config
    n_params = sum(t.numel() for t in [target.embed_weight, target.norm_weight]
                   + [t for layer in target.layers for t in layer.values()])
    print(f"jetspec_kernels {jk.__version__} demo: tiny byte-level Qwen3 ({tc.num_hidden_layers} layers, "
          f"hidden {tc.hidden_size}, {n_params / 1e6:.2f}M parameters) + JetSpec causal head "
          f"({head.config.num_hidden_layers} layers, block {head.block_size}, taps "
          f"{head.target_layer_ids}); backend {backend!r} on {device} ({args.dtype})")
    prompts = [encode(p) for p in PROMPTS[:args.prompts]]
    kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=EOS_ID)
    print(f"decoding {len(prompts)} prompts x {args.max_new_tokens} tokens, speculatively then "
          "autoregressively ...", flush=True)
    spec, spec_s = _decode_each(generate, target, prompts, head=head, budget=args.budget,
                                topk=args.topk, **kw)
    ar, ar_s = _decode_each(generate_ar, target, prompts, **kw)

    same = True
    for i, (s, a) in enumerate(zip(spec, ar)):
        ok = s.tokens == a.tokens
        same &= ok
        print(f"\nprompt {i}: {PROMPTS[i]!r}")
        print(f"  continuation: {decode(s.tokens[0])!r}")
        print(f"  accepted per round: {s.stats.accept_lengths}  (mean {s.stats.mean_accept:.2f}, "
              f"{s.stats.rounds} rounds for {s.stats.new_tokens} tokens)  "
              f"{'identical to' if ok else 'DIFFERS FROM'} autoregressive")
    n_spec = sum(o.stats.new_tokens for o in spec)
    n_ar = sum(o.stats.new_tokens for o in ar)
    acc = [a for o in spec for a in o.stats.accept_lengths]
    print(f"\nspeculative (budget {args.budget}, topk {args.topk}): {n_spec} tokens in {spec_s:.2f}s = "
          f"{n_spec / spec_s:.1f} tokens/s, mean accepted length {sum(acc) / max(1, len(acc)):.2f} "
          f"({1 + sum(acc) / max(1, len(acc)):.2f} tokens/round)")
    print(f"autoregressive: {n_ar} tokens in {ar_s:.2f}s = {n_ar / ar_s:.1f} tokens/s")
    print(f"speed-up: {(n_spec / spec_s) / (n_ar / ar_s):.2f}x (batch 1, {backend} backend on {device})")
    print(f"lossless check: {'PASS, outputs identical' if same else 'FAIL, outputs differ'}")

    if args.budgets:
        budgets = sorted(set(args.budgets))
        table = _acceptance_with_progress(target, heads, prompts, budgets, args)
        print(f"\nmean accepted length per round vs budget (topk {args.topk}; chain: topk 1, "
              f"depth = budget - 1 up to {head.block_size - 1}), {len(prompts)} prompts x "
              f"{args.table_tokens} tokens")
        print(f"{'drafter':14s}" + "".join(f"{b:>8d}" for b in budgets))
        for name, row in table.items():
            print(f"{name:14s}" + "".join(f"{row[str(b)]:8.2f}" for b in budgets))
        for path in _write_table(table, budgets, args.out):
            print(f"wrote {path}")
    return 0 if same else 1


def _acceptance_with_progress(target, heads, prompts, budgets, args) -> dict:
    """The acceptance table one budget at a time, printing a line as each is done."""
    from .decode.acceptance import acceptance_table
    from .models.byte_tokenizer import EOS_ID

    print(f"\nmeasuring the acceptance table: budgets {budgets}, {len(heads) + 1} drafters, "
          f"{len(prompts)} prompts x {args.table_tokens} tokens"
          + ("" if args.full else " (--full: budgets 1 to 256, several minutes on a CPU)"),
          flush=True)
    table, start = {}, time.perf_counter()
    for i, b in enumerate(budgets):
        column = acceptance_table(target, heads, prompts, budgets=[b], topk=args.topk,
                                  max_new_tokens=args.table_tokens, eos_token_id=EOS_ID,
                                  chain_head="head_causal")
        for name, row in column.items():
            table.setdefault(name, {}).update(row)
        print(f"  budget {b} done ({i + 1}/{len(budgets)}), {time.perf_counter() - start:.0f} s so far",
              flush=True)
    return table


def main(argv=None) -> int:
    """``python -m jetspec_kernels demo [--random-round] ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "--random-round" in argv:
            argv.remove("--random-round")
            return random_round(argv)
        return tiny_demo(argv)
    except UsageError as e:
        return report(str(e))
    except jk.BackendUnavailableError as e:
        return report(f"--backend: {e}")
