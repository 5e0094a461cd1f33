"""Print the short summary of a device-check run: step status, then one compact line per measured
jetspec row of every bench CSV (time, time/floor, speed-up against each baseline; the attention
sweep's rows by shape, fastest first), the host time per eager call (host_overhead.txt), the
hardware record, then the Nsight Compute lines (ncu_summary.txt) when the run has them.

    python bench/summarize.py --steps steps.tsv --results DIR

``steps.tsv`` lines are ``name<TAB>status<TAB>seconds<TAB>detail`` (written by device_check.sh).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

try:  # imported as bench.summarize (tests) or run as a script (bench/ on sys.path)
    from bench import hardware_record
except ImportError:
    import hardware_record

BENCH_ORDER = ["tree_attention", "attn_sweep", "draft_tree", "verify", "draft_head", "decode"]
HOST_LINES = 60     # of host_overhead.txt in the summary (the file is in the tarball)


def _num(v: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _f(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def steps_table(path: Path) -> list[str]:
    """Lines of the step table from ``steps.tsv`` (missing file: one line saying so)."""
    if not path.exists():
        return [f"(no step log at {path})"]
    rows = [line.rstrip("\n").split("\t") for line in path.read_text().splitlines() if line.strip()]
    lines = [f"{'step':28s} {'status':10s} {'seconds':>8s}  detail"]
    for r in rows:
        r = (r + ["", "", "", ""])[:4]
        lines.append(f"{r[0]:28s} {r[1]:10s} {r[2]:>8s}  {r[3]}")
    return lines


def attn_sweep_lines(csv_path: Path) -> list[str]:
    """The attention sweep's rows (bench/attn_sweep.sh: kernel, shape, status, eager / graph µs,
    TFLOP/s, x_floor, ...) by shape, the checked kernels fastest first, then those that failed."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [f"-- attn_sweep ({csv_path.name}, {len(rows)} rows): per shape, kernel, best of eager "
             "and graph us, TFLOP/s, time/floor, rel_l2"]

    def best_us(r):
        times = [t for t in (_num(r.get("eager_us")), _num(r.get("graph_us"))) if not math.isnan(t)]
        return min(times) if times else math.inf
    for shape in dict.fromkeys(r.get("shape", "?") for r in rows):
        mine = [r for r in rows if r.get("shape", "?") == shape]
        good = sorted((r for r in mine if r.get("status") == "pass"), key=best_us)
        for r in good:
            lines.append(f"{shape:16s} {r.get('kernel', '?'):16s} {_f(best_us(r)):>8s} "
                         f"{_f(_num(r.get('tflops'))):>6s} {_f(_num(r.get('x_floor'))):>6s}  "
                         f"{_f(_num(r.get('rel_l2')))}")
        for r in (r for r in mine if r.get("status") != "pass"):
            lines.append(f"{shape:16s} {r.get('kernel', '?'):16s} [{r.get('status', '?')}] "
                         f"{(r.get('note') or '')[:90]}")
    return lines


def other_csv_lines(csv_path: Path) -> list[str]:
    """A CSV of no layout known here: its size and columns, so it is not lost from sight."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        n = sum(1 for _ in reader)
        cols = reader.fieldnames or []
    return [f"-- {csv_path.parent.name}/{csv_path.name}: {n} rows; columns {', '.join(cols)[:150]}"]


def csv_lines(csv_path: Path) -> list[str]:
    """The summary lines of one CSV, by its layout."""
    if csv_path.stem == "decode":
        return decode_lines(csv_path)
    if csv_path.stem == "attn_sweep":
        return attn_sweep_lines(csv_path)
    with open(csv_path, newline="") as f:
        cols = csv.DictReader(f).fieldnames or []
    if {"backend", "status", "shape", "median_us"} <= set(cols):
        return bench_lines(csv_path)
    return other_csv_lines(csv_path)


def bench_lines(csv_path: Path) -> list[str]:
    """Compact lines for the non-baseline rows of one bench CSV."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        cols = reader.fieldnames or []
    xcols = [c for c in cols if c.startswith("x_")]
    baselines = {c[2:] for c in xcols}
    lines = [f"-- {csv_path.stem} ({rows[0].get('device') or '?' if rows else '?'}): time [us], time/floor, "
             + ", ".join(xcols) + " (> 1: faster than that baseline)"]
    skipped = {}
    for r in rows:
        if r["backend"] in baselines:
            continue
        if r["status"] != "ok":
            skipped.setdefault((r["backend"], r["status"], r["note"][:120]), 0)
            skipped[(r["backend"], r["status"], r["note"][:120])] += 1
            continue
        xs = " ".join(f"{c}={_f(_num(r[c]))}" for c in xcols if r.get(c))
        lines.append(f"{r['shape']:34s} {r['backend']:16s} {_f(_num(r['median_us'])):>9s} "
                     f"{_f(_num(r['time_over_floor'])):>7s}  {xs}")
    for (backend, status, note), count in sorted(skipped.items()):
        lines.append(f"  [{status} x{count}] {backend}: {note}")
    return lines


def decode_lines(csv_path: Path) -> list[str]:
    """The decoding round table (bench_decode): per row the time against its floor and
    prediction; spec rows add the stage split, host syncs, GPU busy and tokens/s projections."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [f"-- decode ({csv_path.parent.name}/{csv_path.name}, {rows[0]['device'] if rows else '?'}): "
             "ms, floor ms, x floor, pred ms | spec: draft/verify/accept ms, host syncs per round, "
             "GPU busy, tok/s at the paper's length, AR tok/s, x AR, x JetSpec engine (B1)"]
    for r in rows:
        g = {k: _num(r.get(k, "")) for k in r}
        if r["status"] != "ok":
            lines.append(f"{r['shape']:18s} {r['backend']:8s} [{r['status']}] {r['note'][:110]}")
            continue
        line = (f"{r['shape']:18s} {r['backend']:8s} {_f(g['median_us'] / 1e3):>7s} {_f(g['floor_ms']):>7s} "
                f"{_f(g['median_us'] / 1e3 / g['floor_ms']) if g['floor_ms'] > 0 else '-':>5s} "
                f"{_f(g.get('pred_ms', math.nan)):>7s}")
        if r["backend"].startswith("spec"):
            line += (f" | {_f(g['draft_ms'])}/{_f(g['verify_ms'])}/{_f(g['accept_commit_ms'])} "
                     f"syncs {_f(g['host_syncs_per_round'])} busy {_f(g['gpu_busy'])} "
                     f"tok/s {_f(g['tok_s_paper'])} AR {_f(g['ar_tok_s'])} x {_f(g['x_ar_paper'])} "
                     f"engine x {_f(g['x_engine'])}")
        lines.append(line)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=Path, required=True)
    p.add_argument("--results", type=Path, required=True)
    a = p.parse_args(argv)
    lines = ["== device check: steps ==", *steps_table(a.steps), "", "== benchmarks =="]
    csvs = sorted((c for c in a.results.rglob("*.csv") if not c.name.startswith("ncu_")), key=lambda c: (BENCH_ORDER.index(c.stem)
                                                           if c.stem in BENCH_ORDER else 99, c.name))
    if not csvs:
        lines.append(f"(no bench CSV under {a.results})")
    for c in csvs:
        try:
            lines += csv_lines(c)
        except Exception as e:  # one broken CSV must not hide the others
            lines.append(f"-- {c.name}: unreadable ({type(e).__name__}: {e})")
    host = a.results / "host_overhead.txt"
    if host.exists():
        text = host.read_text().splitlines()
        lines += ["", "== host time per eager call (host_overhead.txt) ==", *text[:HOST_LINES]]
        if len(text) > HOST_LINES:
            lines.append(f"({len(text) - HOST_LINES} more lines in host_overhead.txt)")
    record = a.results / "hw_record.jsonl"
    if record.exists():
        lines += ["", "== hardware record (rows of this run; merge them into "
                  "jetspec_kernels/hardware_record.json with bench/hardware_record.py --merge) =="]
        skipped: list[str] = []
        rows = hardware_record.aggregate(hardware_record.read([record], skipped))
        lines += skipped
        lines += [json.dumps(r) for r in hardware_record.record_rows(rows, "this GPU", "this run", "-", [])]
        lines += hardware_record.verified_lines(rows)
    ncu = a.results / "ncu_summary.txt"
    if ncu.exists():
        lines += ["", "== Nsight Compute: one launch of each kernel (bench/profile_kernels.py) ==",
                  *ncu.read_text().splitlines()]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
