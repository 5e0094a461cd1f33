"""The hardware record of a GPU test run: one row per op x backend x dtype, with whether every test
of it passed, the device, date, commit and result files, as the rows of
jetspec_kernels/hardware_record.json; plus, per interface function, the GPU backends whose every
row passed (what that file's ``trusted`` may then list, fastest first by the run's benches).

The rows come from the JSON lines that tests/conftest.py writes when ``JETSPEC_HW_RECORD`` names a
file (device_check.sh sets it for its GPU test steps):

    python bench/hardware_record.py RECORD.jsonl [RECORD2.jsonl ...] [--device "NVIDIA H200"]
        [--date 2026-12-06] [--commit abc1234] [--files bench/results/NVIDIA_H200/...]
        [--merge jetspec_kernels/hardware_record.json]

prints the rows, one JSON object a line; ``--merge`` writes them into the record instead, each
replacing the row of the same op, backend, dtype and device. ``trusted`` is never changed here:
an op x backend joins it by hand, in the commit that merges its passing rows (bench/README.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from jetspec_kernels.backend import GPU_BACKENDS, INTERFACE_FUNCTIONS, implements

# Test-function name fragments -> the interface function they test (first match wins).
OP_OF_TEST = (("tree_attention", "tree_attention"), ("log_softmax_topk", "log_softmax_topk"),
              ("hidden_topk", "hidden_topk"), ("build_tree", "build_tree"),
              ("draft_tree", "build_tree"), ("norm_rope_append", "qk_norm_rope_append"),
              ("rope", "qk_norm_rope_append"), ("verify", "verify_tree"), ("commit", "commit_kv"),
              ("pack_mask", "pack_mask"), ("rms_norm", "rms_norm"), ("silu_mul", "silu_mul"))
DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}
NO_DTYPE = "-"
ROW_FIELDS = ("op", "backend", "dtype", "device", "status", "date", "commit", "files")
RECORD = Path(__file__).resolve().parents[1] / "jetspec_kernels" / "hardware_record.json"


def classify(entry: dict) -> tuple[str, str, list[str]]:
    """(op, backend, dtypes) of one recorded test (dtypes: the dtype names among its parameters,
    or ``["-"]``). ``entry`` has ``file``, ``test`` (the function name) and ``params`` (parameter
    name -> str of its value). In tests/ops the file names the op when the test's name does not;
    the backend is the ``backend`` (tests/ops) or ``engine`` (engine layouts) parameter."""
    test, params = entry["test"], entry.get("params", {})
    path = Path(entry["file"])
    name = path.name
    op = next((fn for frag, fn in OP_OF_TEST if frag in test), None)
    if op is None and path.parent.name == "ops":
        op = next((fn for frag, fn in OP_OF_TEST if frag in name), None)
    op = op or f"other: {test}"
    if "backend" in params or "engine" in params:
        backend = params.get("backend", params.get("engine"))
    elif name.startswith("test_cuda"):
        backend = "cuda" if params.get("dev", "cuda") == "cuda" else f"cuda ({params['dev']})"
    elif name.startswith("test_triton"):
        backend = "triton"
    else:
        backend = name.removeprefix("test_").removesuffix(".py")
    if params.get("kernel", "auto") != "auto":  # the cuda attention kernels are recorded apart
        backend += f" kernel={params['kernel']}"
    dtypes = sorted({DTYPE_NAMES[v] for v in params.values() if v in DTYPE_NAMES})
    return op, backend, dtypes or [NO_DTYPE]


def aggregate(entries: list[dict]) -> dict[tuple[str, str, str], dict]:
    """(op, backend, dtype) -> {"passed": n, "failed": [test ids], "skipped": n}."""
    rows: dict[tuple[str, str, str], dict] = defaultdict(lambda: {"passed": 0, "failed": [], "skipped": 0})
    for e in entries:
        op, backend, dtypes = classify(e)
        for dtype in dtypes:
            row = rows[(op, backend, dtype)]
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


def verified(rows: dict[tuple[str, str, str], dict]) -> dict[str, list[str]]:
    """Interface function -> the GPU backends (``GPU_BACKENDS``) whose rows for it ran and all
    passed, every dtype and every test (the candidates for ``HARDWARE_VERIFIED``); a backend
    without the function (``backend.OPTIONAL_FUNCTIONS``: the cuda hidden_topk tests run its
    GEMM method) is never one."""
    out = {}
    for fn in INTERFACE_FUNCTIONS:
        ok = []
        for b in filter(lambda b: implements(b, fn), GPU_BACKENDS):
            mine = [r for (op, backend, _), r in rows.items() if op == fn and backend == b]
            if mine and all(status(r) == "passed" for r in mine):
                ok.append(b)
        if ok:
            out[fn] = ok
    return out


def record_rows(rows: dict[tuple[str, str, str], dict], device: str, date: str, commit: str,
                files: list[str]) -> list[dict]:
    """The run's rows of the hardware record (``ROW_FIELDS``): interface functions in
    INTERFACE_FUNCTIONS order, then other tests."""
    order = {fn: i for i, fn in enumerate(INTERFACE_FUNCTIONS)}
    return [dict(zip(ROW_FIELDS, (op, backend, dtype, device, status(row), date, commit, list(files))))
            for (op, backend, dtype), row in sorted(rows.items(),
                                                    key=lambda kv: (order.get(kv[0][0], 99), kv[0]))]


def _key(row: dict) -> tuple[str, str, str, str]:
    return row["op"], row["backend"], row["dtype"], row["device"]


def merge(record: dict, new_rows: list[dict]) -> dict:
    """``record`` (the parsed hardware_record.json) with ``new_rows`` in it: each replaces the row
    of the same op, backend, dtype and device (its note goes with it), the rest are kept in order
    and new ones are appended. ``trusted`` is left as it is."""
    for row in new_rows:
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise ValueError(f"new_rows: a row lacks {missing}: {row}")
    fresh = {_key(r): r for r in new_rows}
    kept = [fresh.pop(_key(r), r) for r in record.get("rows", [])]
    return {**record, "rows": kept + [r for r in new_rows if _key(r) in fresh]}


def dumps(record: dict) -> str:
    """The record as hardware_record.json keeps it: one row (and one trusted op) a line, so a run's
    diff is its rows."""
    def line(value) -> str:
        return json.dumps(value, ensure_ascii=False)
    parts = []
    for key, value in record.items():
        if key == "rows":
            continue
        if isinstance(value, dict):
            inner = ",\n".join(f"  {line(k)}: {line(v)}" for k, v in value.items())
            parts.append(f" {line(key)}: {{\n{inner}\n }}")
        else:
            parts.append(f" {line(key)}: {line(value)}")
    rows = ",\n".join(f"  {line(r)}" for r in record.get("rows", []))
    parts.append(f' "rows": [\n{rows}\n ]')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def verified_lines(rows) -> list[str]:
    """One line per interface function: the GPU backends whose every test passed in this run."""
    ok = verified(rows)
    return [f"passed on this run, every dtype: {fn}: {', '.join(ok[fn])}" for fn in INTERFACE_FUNCTIONS
            if fn in ok] or ["passed on this run: no interface function on any GPU backend"]


def read(paths: list[Path], skipped: list[str] | None = None) -> list[dict]:
    """The test outcomes in the JSON-line files ``paths`` (missing files are empty). A line that
    is not a whole entry (a run killed mid-write) is skipped with a warning: appended to
    ``skipped`` when given, else printed to stderr."""
    entries = []
    for p in paths:
        if not p.exists():
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not {"nodeid", "file", "test", "outcome"} <= entry.keys():
                    raise ValueError("not a test entry")
            except ValueError as e:
                why = f"hardware_record: skipped line {i} of {p} ({type(e).__name__}: {e}): {line[:80]!r}"
                if skipped is None:
                    print(why, file=sys.stderr)
                else:
                    skipped.append(why)
                continue
            entries.append(entry)
    return entries


def _head_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", type=Path, nargs="+")
    p.add_argument("--device", default="?")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    p.add_argument("--commit", default=None, help="default: git rev-parse --short HEAD")
    p.add_argument("--files", default="-",
                   help="where the run's logs and CSVs were committed (comma-separated)")
    p.add_argument("--merge", type=Path, default=None, metavar="RECORD_JSON",
                   help=f"write the rows into this hardware record (e.g. {RECORD.relative_to(RECORD.parents[1])})")
    a = p.parse_args(argv)
    entries = read(a.records)
    if not entries:
        print(f"(no test record in {', '.join(map(str, a.records))})")
        return 0
    rows = aggregate(entries)
    files = [f.strip() for f in a.files.split(",") if f.strip()]
    new = record_rows(rows, a.device, a.date, a.commit or _head_commit(), files)
    if a.merge is None:
        print("\n".join(json.dumps(r, ensure_ascii=False) for r in new))
    else:
        a.merge.write_text(dumps(merge(json.loads(a.merge.read_text()), new)))
        print(f"{len(new)} rows merged into {a.merge}")
    print("\n" + "\n".join(verified_lines(rows)))
    for key, row in sorted(rows.items()):
        for nodeid in row["failed"][:5]:
            print(f"  failed: {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
