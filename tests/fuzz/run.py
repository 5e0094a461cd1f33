"""The long differential fuzz run (``make fuzz``): random cases of every op on every engine here.

    python tests/fuzz/run.py [--seconds 600] [--seed S] [--ops a,b] [--engines reference,triton,sim]
        [--progress 30]     # a progress line every 30 s; unsupported cases listed with their reasons
    python tests/fuzz/run.py --op verify_tree --seed 12345 [--engines triton]   # replay one case

Besides the public ops, the exact mode's invariance property of each op of the target's forward
runs as an op of its own, ``exact_<op>`` (fuzz_invariance.py; ``--ops exact_tree_attention``).
Cases are numbered from ``--seed`` on (the default is new each run and printed); each is drawn
from (op, case seed) alone, so every failure prints the command that replays it. Exits 1 when a
case failed. To keep a failure as a test, add its (op, seed) to tests/fuzz/test_fuzz.py's
REGRESSIONS.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fuzz_cases import OPS, make  # noqa: E402
from fuzz_check import check  # noqa: E402
from fuzz_engines import engine_named, engines_here  # noqa: E402
from fuzz_invariance import INVARIANCE_OPS, check_invariance  # noqa: E402

ALL_OPS = OPS + INVARIANCE_OPS


def progress_line(seeds: int, seconds: float, counts: dict[tuple[str, str, str], int]) -> str:
    """One line of a running fuzz: seeds per op so far, and cases per status over every op and
    engine (``counts``: (op, engine, status) -> cases)."""
    total: dict[str, int] = {}
    for (_, _, status), n in counts.items():
        total[status] = total.get(status, 0) + n
    parts = ", ".join(f"{status} {n}" for status, n in sorted(total.items()))
    return f"fuzz: {seconds:.0f} s, {seeds} seeds per op: {parts or 'no case yet'}"


def count_lines(counts: dict[tuple[str, str, str], int],
                reasons: dict[tuple[str, str, str], int]) -> list[str]:
    """The final table: cases per (op, engine, status), each unsupported count followed by the
    reasons the engine gave, most cases first (``reasons``: (op, engine, reason) -> cases)."""
    lines = []
    for (op, eng, status), n in sorted(counts.items()):
        lines.append(f"  {op:24s} {eng:10s} {status:12s} {n}")
        if status == "unsupported":
            mine = [(-m, why) for (o, e, why), m in reasons.items() if (o, e) == (op, eng)]
            lines += [f"      {-m:5d} x {why}" for m, why in sorted(mine)]   # most cases first
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600.0, help="stop starting cases after this")
    p.add_argument("--seed", type=int, default=None, help="first case seed (default: from the clock)")
    p.add_argument("--op", "--ops", dest="ops", default=",".join(ALL_OPS), help="comma-separated ops")
    p.add_argument("--engines", default=",".join(e.name for e in engines_here()))
    p.add_argument("--cases", type=int, default=None, help="cases per op (default: until --seconds)")
    p.add_argument("--progress", type=float, default=30.0,
                   help="print a progress line every this many seconds (0: after every seed)")
    args = p.parse_args(argv)
    replay = args.seed is not None and args.cases is None and "," not in args.ops
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000 * 1000
    ops = [o for o in args.ops.split(",") if o]
    for op in ops:
        if op not in ALL_OPS:
            p.error(f"--ops: unknown op {op!r} (ops: {', '.join(ALL_OPS)})")
    engines = [engine_named(n) for n in args.engines.split(",") if n]
    cases = 1 if replay else args.cases
    print(f"fuzz: first seed {seed}, ops {ops}, engines {[e.name for e in engines]}", flush=True)
    t0, failures, counts, slow, i = time.time(), [], {}, [], 0
    reasons: dict[tuple[str, str, str], int] = {}
    last_progress = t0
    while (cases is None and time.time() - t0 < args.seconds) or (cases is not None and i < cases):
        for op in ops:
            s = seed + i
            for engine in engines:
                start = time.time()
                try:
                    status = (check_invariance if op in INVARIANCE_OPS else check)(op, s, engine)
                except Exception as e:  # noqa: BLE001 - every failure is reported, then the run goes on
                    status = "FAIL"
                    cmd = f"python tests/fuzz/run.py --op {op} --seed {s} --engines {engine.name}"
                    failures.append(cmd)
                    detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                    print(f"FAIL {op} seed {s} on {engine.name}: {detail[:2000]}\n  replay: {cmd}",
                          flush=True)
                    if replay:
                        traceback.print_exc()
                        if op.removeprefix("exact_") in OPS:
                            print(f"case: {make(op.removeprefix('exact_'), s).describe()}")
                kind, _, reason = status.partition(":")
                counts[(op, engine.name, kind)] = counts.get((op, engine.name, kind), 0) + 1
                if reason:
                    key = (op, engine.name, reason.strip())
                    reasons[key] = reasons.get(key, 0) + 1
                slow.append((time.time() - start, f"{op} seed {s} on {engine.name}"))
        i += 1
        if time.time() - last_progress >= args.progress:
            last_progress = time.time()
            print(progress_line(i, last_progress - t0, counts), flush=True)
    print(f"fuzz: {i} seeds per op in {time.time() - t0:.0f} s")
    print("\n".join(count_lines(counts, reasons)))
    print("slowest: " + ", ".join(f"{what} {sec:.1f} s" for sec, what in sorted(slow)[-5:]))
    if failures:
        print(f"{len(failures)} failures; replay each with:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
