"""The hardware record of a GPU test run: one row per op x backend, with the dtypes its tests
covered and whether all of them passed, in the form of the "Hardware record" table of
bench/NOTES.md, plus the ops whose cuda rows all passed (what ``HARDWARE_VERIFIED`` in
jetspec_kernels/backend.py may then list).

The rows come from the JSON lines that tests/conftest.py writes when ``JETSPEC_HW_RECORD`` names a
file (device_check.sh sets it for its GPU test steps):

    python bench/hardware_record.py RECORD.jsonl [RECORD2.jsonl ...] [--device "NVIDIA H200"] [--run TEXT]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from jetspec_kernels.backend import INTERFACE_FUNCTIONS

# Test-function name fragments -> the interface function they test (first match wins).
OP_OF_TEST = (("tree_attention", "tree_attention"), ("log_softmax_topk", "log_softmax_topk"),
              ("hidden_topk", "hidden_topk"), ("build_tree", "build_tree"),
              ("draft_tree", "build_tree"), ("norm_rope_append", "qk_norm_rope_append"),
              ("rope", "qk_norm_rope_append"), ("verify", "verify_tree"), ("commit", "commit_kv"),
              ("pack_mask", "pack_mask"))
DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


def classify(entry: dict) -> tuple[str, str, str | None]:
    """(op, backend, dtype or None) of one recorded test. ``entry`` has ``file``, ``test`` (the
    function name) and ``params`` (parameter name -> str of its value). In tests/ops the file
    names the op when the test's name does not, and every test has a ``backend`` parameter."""
    test, params = entry["test"], entry.get("params", {})
    path = Path(entry["file"])
    name = path.name
    op = next((fn for frag, fn in OP_OF_TEST if frag in test), None)
    if op is None and path.parent.name == "ops":
        op = next((fn for frag, fn in OP_OF_TEST if frag in name), None)
    op = op or f"other: {test}"
    if "backend" in params:
        backend = params["backend"]
    elif name.startswith("test_cuda"):
        backend = "cuda" if params.get("dev", "cuda") == "cuda" else f"cuda ({params['dev']})"
    elif name.startswith("test_triton"):
        backend = "triton"
    else:
        backend = name.removeprefix("test_").removesuffix(".py")
    if params.get("kernel", "auto") != "auto":  # the cuda attention kernels are recorded apart
        backend += f" kernel={params['kernel']}"
    dtypes = sorted({DTYPE_NAMES[v] for v in params.values() if v in DTYPE_NAMES})
    return op, backend, ",".join(dtypes) or None


def aggregate(entries: list[dict]) -> dict[tuple[str, str], dict]:
    """(op, backend) -> {"dtypes": set, "passed": n, "failed": [test ids], "skipped": n}."""
    rows: dict[tuple[str, str], dict] = defaultdict(
        lambda: {"dtypes": set(), "passed": 0, "failed": [], "skipped": 0})
    for e in entries:
        op, backend, dtype = classify(e)
        row = rows[(op, backend)]
        if dtype:
            row["dtypes"].update(dtype.split(","))
        if e["outcome"] == "passed":
            row["passed"] += 1
        elif e["outcome"] == "skipped":
            row["skipped"] += 1
        else:
            row["failed"].append(e["nodeid"])
    return rows


def status(row: dict) -> str:
    if row["failed"]:
        return f"FAILED ({len(row['failed'])} of {len(row['failed']) + row['passed']})"
    return "passed" if row["passed"] else "not run"


def verified_ops(rows: dict[tuple[str, str], dict]) -> list[str]:
    """Interface functions whose cuda rows ran and all passed."""
    return [fn for fn in INTERFACE_FUNCTIONS
            if (fn, "cuda") in rows and status(rows[(fn, "cuda")]) == "passed"]


def table(rows: dict[tuple[str, str], dict], device: str, run: str) -> list[str]:
    order = {fn: i for i, fn in enumerate(INTERFACE_FUNCTIONS)}
    lines = ["| op (interface function) | backend | dtypes | device | status | run |",
             "|---|---|---|---|---|---|"]
    for (op, backend), row in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0])):
        dtypes = ", ".join(sorted(row["dtypes"])) or "-"
        lines.append(f"| {op} | {backend} | {dtypes} | {device} | {status(row)} | {run} |")
    return lines


def read(paths: list[Path]) -> list[dict]:
    entries = []
    for p in paths:
        if p.exists():
            entries += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return entries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", type=Path, nargs="+")
    p.add_argument("--device", default="?")
    p.add_argument("--run", default="-", help="what to write in the run column (date, commit)")
    a = p.parse_args(argv)
    entries = read(a.records)
    if not entries:
        print(f"(no test record in {', '.join(map(str, a.records))})")
        return 0
    rows = aggregate(entries)
    print("\n".join(table(rows, a.device, a.run)))
    print(f"\ncuda ops whose every GPU test passed: {', '.join(verified_ops(rows)) or 'none'}")
    for (op, backend), row in sorted(rows.items()):
        for nodeid in row["failed"][:5]:
            print(f"  failed: {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
