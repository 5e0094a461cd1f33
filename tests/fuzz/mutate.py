"""Plant one-line bugs, one at a time, and see whether a test selection catches each.

    python tests/fuzz/mutate.py MUTATIONS.json [--only NAME] [--timeout 900]

MUTATIONS.json is a list of ``{"name", "file", "old", "new", "tests": [pytest args]}``: ``old``
must occur exactly once in ``file`` (relative to the repository root). Each mutation is applied,
the tests run (``-x``, one process), and the file is restored whatever happens; a mutation is
*caught* when the tests fail (a selection that runs no test catches nothing). Prints one line
per mutation and the caught / total count. Keep the mutation lists out of the repository (they
are planted bugs); tests/mutations_new_code.py, a campaign's record, is the exception.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_TESTS_RAN = 5   # pytest's status when the selection (a -k) holds no test: nothing caught it


def run_one(m: dict, timeout: float) -> tuple[str, float, str]:
    path = ROOT / m["file"]
    text = path.read_text()
    if text.count(m["old"]) != 1:
        return "BAD-PATCH", 0.0, f"'old' occurs {text.count(m['old'])} times in {m['file']}"
    t0 = time.time()
    try:
        path.write_text(text.replace(m["old"], m["new"]))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "--benchmark-disable",
                               "-p", "no:cacheprovider", *m["tests"]], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
        lines = proc.stdout.strip().splitlines()
        failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        tail = failed[:1] or lines[-1:] or [""]     # the test that caught it, else the summary
        status = "caught" if proc.returncode not in (0, NO_TESTS_RAN) else "SURVIVED"
        if proc.returncode not in (0, 1, NO_TESTS_RAN):
            status = f"caught (pytest status {proc.returncode})"
        return status, time.time() - t0, tail[0]
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - t0, ""
    finally:
        path.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mutations")
    p.add_argument("--only", default=None, help="comma-separated mutation names")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    muts = json.loads(Path(args.mutations).read_text())
    if args.only:
        keep = set(args.only.split(","))
        muts = [m for m in muts if m["name"] in keep]
    caught = 0
    for m in muts:
        status, sec, tail = run_one(m, args.timeout)
        caught += status.startswith("caught")
        print(f"{status:10s} {sec:6.0f} s  {m['name']}: {m['file']}  [{tail}]", flush=True)
    print(f"{caught}/{len(muts)} caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
