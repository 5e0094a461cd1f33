"""The long differential fuzz run (``make fuzz``): random cases of every op on every engine here.

    python tests/fuzz/run.py [--seconds 600] [--seed S] [--ops a,b] [--engines reference,triton,sim]
    python tests/fuzz/run.py --op verify_tree --seed 12345 [--engines triton]   # replay one case

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600.0, help="stop starting cases after this")
    p.add_argument("--seed", type=int, default=None, help="first case seed (default: from the clock)")
    p.add_argument("--op", "--ops", dest="ops", default=",".join(OPS), help="comma-separated ops")
    p.add_argument("--engines", default=",".join(e.name for e in engines_here()))
    p.add_argument("--cases", type=int, default=None, help="cases per op (default: until --seconds)")
    args = p.parse_args(argv)
    replay = args.seed is not None and args.cases is None and "," not in args.ops
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000 * 1000
    ops = [o for o in args.ops.split(",") if o]
    for op in ops:
        if op not in OPS:
            p.error(f"--ops: unknown op {op!r} (ops: {', '.join(OPS)})")
    engines = [engine_named(n) for n in args.engines.split(",") if n]
    cases = 1 if replay else args.cases
    print(f"fuzz: first seed {seed}, ops {ops}, engines {[e.name for e in engines]}", flush=True)
    t0, failures, counts, slow, i = time.time(), [], {}, [], 0
    while (cases is None and time.time() - t0 < args.seconds) or (cases is not None and i < cases):
        for op in ops:
            s = seed + i
            for engine in engines:
                start = time.time()
                try:
                    status = check(op, s, engine)
                except Exception as e:  # noqa: BLE001 - every failure is reported, then the run goes on
                    status = "FAIL"
                    cmd = f"python tests/fuzz/run.py --op {op} --seed {s} --engines {engine.name}"
                    failures.append(cmd)
                    detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                    print(f"FAIL {op} seed {s} on {engine.name}: {detail[:2000]}\n  replay: {cmd}",
                          flush=True)
                    if replay:
                        traceback.print_exc()
                        print(f"case: {make(op, s).describe()}")
                key = (op, engine.name, status.split(":")[0])
                counts[key] = counts.get(key, 0) + 1
                slow.append((time.time() - start, f"{op} seed {s} on {engine.name}"))
        i += 1
    print(f"fuzz: {i} seeds per op in {time.time() - t0:.0f} s")
    for (op, eng, status), n in sorted(counts.items()):
        print(f"  {op:24s} {eng:10s} {status:12s} {n}")
    print("slowest: " + ", ".join(f"{what} {sec:.1f} s" for sec, what in sorted(slow)[-5:]))
    if failures:
        print(f"{len(failures)} failures; replay each with:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
