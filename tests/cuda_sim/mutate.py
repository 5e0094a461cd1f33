"""The runner of the hand-run mutation checks (mutations_hopper.py, mutations_silu_mul.py): each
mutation replaces the first occurrence of a text in one file, reruns a set of simulator tests,
and restores the file; every mutation must make them fail (a wrong result, a simulator rule or a
deadlock). One line per mutation says how; a text no longer in its file is reported as stale."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(muts: dict, pytest_args: list, names=None, timeout=1800) -> int:
    """muts: name -> (file, text, replacement). Returns 1 if any mutation escaped or was stale."""
    escaped = 0
    for name in names or list(muts):
        path, a, b = muts[name]
        orig = path.read_text()
        if a not in orig:
            print(f"{name}: stale (its text is not in {path.name})")
            escaped += 1
            continue
        path.write_text(orig.replace(a, b, 1))
        try:
            env = dict(os.environ, JETSPEC_SIM_WATCHDOG_S="60")
            r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-s", "-p",
                                "no:cacheprovider", *pytest_args],
                               cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
        finally:
            path.write_text(orig)
        out = (r.stdout + r.stderr).splitlines()
        why = [line for line in out if "cuda_sim:" in line or " passed" in line or " failed" in line]
        caught = r.returncode != 0
        escaped += not caught
        print(f"{name}: {'caught' if caught else 'ESCAPED'} ({' | '.join(why[-2:])[:180]})",
              flush=True)
    return 1 if escaped else 0
