"""Shared benchmark machinery: options, timing, ceilings, roofline, the result table, CSV and PNG.

Every ``bench_*.py`` script builds one :class:`Table`, adds one row per (shape, backend or
baseline), and calls :meth:`Table.finish`, which prints the table and writes
``<out>/<bench>.csv`` and ``<out>/<bench>.png`` (time / roofline floor across shapes).

Timing: on CUDA, ``triton.testing.do_bench`` (CUDA events, median; it clears a 256 MB buffer
before every call, so L2 is cold) or, with ``cold_l2=False``, a median of event-timed calls;
on the CPU, the median of ``time.perf_counter`` runs.

Ceilings: a large device-to-device copy (bytes read + bytes written) and a large matmul in the
benchmark dtype, measured in the same run; the datasheet values are printed beside them.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_ROOT = BENCH_DIR / "results"

# Columns every CSV carries, in this order; speed-up columns ``x_<baseline>`` and the bench's own
# extra columns follow, then ``note``.
CORE_COLUMNS = ["bench", "device", "shape", "backend", "status", "median_us", "tflops", "gbps",
                "floor_us", "time_over_floor", "flops", "bytes"]

# Datasheet peaks by device-name substring: (bytes/s, dense bf16 FLOP/s).
DATASHEET = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
    "A100": (2.039e12, 312e12),
}

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------
# Options and devices
# ----------------------------------------------------------------------------------------------

def device_name(device: torch.device) -> str:
    """A file-name-safe device label: ``NVIDIA_H200`` or ``cpu-x86_64``."""
    if device.type == "cuda":
        raw = torch.cuda.get_device_name(device)
    else:
        raw = f"cpu-{platform.machine() or 'unknown'}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")


def comma_list(parse: Callable[[str], object]):
    """An argparse type: a non-empty comma list, each item through ``parse`` (an argparse type
    such as ``int_at_least(1)``, whose ArgumentTypeError argparse reports with the option)."""
    def parse_list(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"must be a comma list, got {text!r}")
        return [parse(t) for t in items]
    return parse_list


def one_of(choices):
    """An argparse type: one of ``choices`` (for items of :func:`comma_list`)."""
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def parser(description: str) -> argparse.ArgumentParser:
    """The options every bench takes; scripts add their own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="small sweep: seconds on the CPU, a short GPU subset on CUDA")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for CSV/PNG (default bench/results/<device-name>/)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--backends", default=None,
                   help="comma list of jetspec backends (default: cuda,triton on CUDA; "
                        "reference,triton on CPU)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--graphs", action="store_true",
                   help="CUDA: time each call replayed from a CUDA graph (kernel time without "
                        "the host's launch overhead; L2 warm); writes <bench>_graphs.csv. "
                        "Ignored on the CPU")
    return p


@dataclass
class Options:
    """Parsed common options plus what follows from them."""

    quick: bool
    device: torch.device
    out: Path
    backends: list[str]
    plot: bool
    args: argparse.Namespace
    graphs: bool = False

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def options(p: argparse.ArgumentParser, argv=None) -> Options:
    """Parse ``argv`` with parser ``p`` and resolve the device, output dir and backends."""
    args = p.parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    else:
        backends = ["cuda", "triton"] if dev.type == "cuda" else ["reference", "triton"]
    out = args.out if args.out is not None else RESULTS_ROOT / device_name(dev)
    return Options(quick=args.quick, device=dev, out=Path(out), backends=backends,
                   plot=not args.no_plot, args=args,
                   graphs=args.graphs and dev.type == "cuda")


def backend_status(opts: Options) -> dict[str, str | None]:
    """For each requested backend: None if usable on the device, else why not."""
    import jetspec_kernels as jk

    avail = jk.available_backends(opts.device)
    return {b: avail.get(b, f"unknown backend {b!r}") for b in opts.backends}


def interpreted(backend: str, device: torch.device) -> bool:
    """Triton on the CPU runs under the (slow) interpreter: time it on the first shape only."""
    return backend == "triton" and device.type == "cpu"


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, *, quick: bool = False,
            cold_l2: bool = True, reps: int | None = None, max_s: float = 2.0,
            graph: bool = False) -> float:
    """Median time of ``fn()`` in seconds.

    Parameters
    ----------
    fn : callable with no arguments (its result is ignored)
    device : where ``fn`` runs; CUDA uses events, the CPU ``perf_counter``
    quick : shorter warm-up and repetition budget
    cold_l2 : CUDA only; True -> ``triton.testing.do_bench`` (flushes L2 before each call)
    reps : CPU only; timed runs (default 5, 3 when quick), cut short after ``max_s`` seconds
    graph : CUDA only; ``triton.testing.do_bench_cudagraph``: many calls captured in one graph
        and replayed (no launch overhead, L2 warm); ``fn`` must be capturable (no host sync)
    """
    if device.type == "cuda" and graph:
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=10 if quick else 20, return_mode="median") * 1e-3
    if device.type == "cuda":
        if cold_l2:
            from triton.testing import do_bench

            warmup, rep = (10, 40) if quick else (25, 150)
            return do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e-3
        return _time_events(fn, device, 10 if quick else 50)
    fn()  # warm-up: first-call costs (allocation, lazy imports) stay out of the median
    n = reps or (3 if quick else 5)
    times = []
    t_end = time.perf_counter() + max_s
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            break
    return statistics.median(times)


def _time_events(fn, device, n):
    for _ in range(3):
        fn()
    sync(device)
    start = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        start[i].record()
        fn()
        end[i].record()
    sync(device)
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) * 1e-3


def wall_time(fn: Callable[[], object], device: torch.device, reps: int = 3) -> float:
    """Median host wall-clock seconds of ``fn()`` with a device sync after each call
    (for end-to-end runs whose host work is part of what is measured)."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------------
# Ceilings and the roofline
# ----------------------------------------------------------------------------------------------

@dataclass
class Ceilings:
    """Peak bandwidth (bytes/s) and matmul rate (FLOP/s) measured here, and the datasheet's."""

    bandwidth: float
    flops: float
    flops_dtype: str
    datasheet_bandwidth: float | None
    datasheet_flops: float | None

    def floor_s(self, flops: float, nbytes: float) -> float:
        """Roofline floor ``max(flops / peak, bytes / bandwidth)`` in seconds."""
        return max(flops / self.flops, nbytes / self.bandwidth)

    def describe(self) -> str:
        def ds(v, unit, scale):
            return f"datasheet {v / scale:.3g} {unit}" if v else "datasheet n/a"

        return (f"ceilings measured here: copy {self.bandwidth / 1e9:.1f} GB/s "
                f"({ds(self.datasheet_bandwidth, 'TB/s', 1e12)}); {self.flops_dtype} matmul "
                f"{self.flops / 1e12:.3g} TFLOP/s ({ds(self.datasheet_flops, 'TFLOP/s', 1e12)})")


_CEILINGS: dict[tuple[str, str], Ceilings] = {}


def measure_ceilings(device: torch.device, dtype: torch.dtype, quick: bool = False) -> Ceilings:
    """Measure copy bandwidth and matmul rate on ``device`` (cached per process).

    CUDA: a 2 GiB device-to-device copy (1 GiB when quick; bytes read plus written) and an
    8192^3 matmul on random data in ``dtype`` (bf16/fp16; fp32 runs as fp32/tf32 per torch's
    settings). CPU: a 64 MiB copy and a 1024^3 fp32 matmul.
    """
    key = (str(device), str(dtype))
    if key in _CEILINGS:
        return _CEILINGS[key]
    gen = torch.Generator(device=device).manual_seed(0)
    if device.type == "cuda":
        n_copy = (1 << 30) if quick else (2 << 30)
        mm_n, mm_dtype = 8192, dtype
    else:
        n_copy, mm_n, mm_dtype = 64 << 20, 1024, torch.float32
    src = torch.empty(n_copy, dtype=torch.uint8, device=device).random_(generator=gen)
    dst = torch.empty_like(src)
    t_copy = time_fn(lambda: dst.copy_(src), device, quick=quick)
    del src, dst
    a = torch.randn(mm_n, mm_n, device=device, dtype=mm_dtype, generator=gen)
    b = torch.randn(mm_n, mm_n, device=device, dtype=mm_dtype, generator=gen)
    t_mm = time_fn(lambda: a @ b, device, quick=quick, cold_l2=False)
    del a, b
    sheet = (None, None)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        sheet = next((v for k, v in DATASHEET.items() if k in name), (None, None))
    c = Ceilings(bandwidth=2 * n_copy / t_copy, flops=2 * mm_n ** 3 / t_mm,
                 flops_dtype=str(mm_dtype).replace("torch.", ""),
                 datasheet_bandwidth=sheet[0],
                 datasheet_flops=sheet[1] if mm_dtype in (torch.bfloat16, torch.float16) else None)
    _CEILINGS[key] = c
    return c


# ----------------------------------------------------------------------------------------------
# The result table
# ----------------------------------------------------------------------------------------------

def _fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000 or abs(v) < 0.01:
            return f"{v:.{digits}g}"
        return f"{v:.{digits}g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


class Table:
    """Rows of one bench run; ``finish`` adds speed-ups, prints, and writes CSV and PNG.

    Parameters
    ----------
    bench : str                 e.g. ``"tree_attention"`` (the CSV / PNG file stem)
    opts : Options
    ceilings : Ceilings
    baselines : list of str     backend labels whose times the other rows are compared to
    extra_columns : list of str bench-specific columns (e.g. ``rel_err``)
    stream : bool               append each row to the CSV as it is added (default)
    """

    def __init__(self, bench: str, opts: Options, ceilings: Ceilings, baselines: list[str],
                 extra_columns: list[str] | None = None, stream: bool = True):
        self.bench = bench + ("_graphs" if opts.graphs else "")
        self.opts = opts
        self.ceilings = ceilings
        self.baselines = list(baselines)
        self.extra_columns = list(extra_columns or [])
        self.rows: list[dict] = []
        self.header_lines: list[str] = []
        # Each row reaches the CSV as it is added (a killed run keeps them; finish rewrites the
        # file with the speed-ups); stream=False writes it at the end only.
        self.stream = stream
        if stream:
            self._write_csv()

    @property
    def columns(self) -> list[str]:
        return (CORE_COLUMNS + [f"x_{b}" for b in self.baselines] + self.extra_columns + ["note"])

    @property
    def csv_path(self) -> Path:
        return self.opts.out / f"{self.bench}.csv"

    def _write_csv(self, rows=()) -> None:
        self.opts.out.mkdir(parents=True, exist_ok=True)
        with open(self.csv_path, "w" if not rows else "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if not rows:
                w.writeheader()
            for r in rows:
                w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v)
                            for k, v in r.items()})

    def add(self, shape: str, backend: str, seconds: float | None, *, flops: float,
            nbytes: float, status: str = "ok", note: str = "", floor_s: float | None = None,
            **extra) -> dict:
        """Add one row; ``seconds`` None means not measured (then ``status`` says why).
        ``floor_s`` replaces the roofline floor of ``flops`` and ``nbytes`` (e.g. a sum over stages)."""
        floor = self.ceilings.floor_s(flops, nbytes) if floor_s is None else floor_s
        ok = seconds is not None and status == "ok"
        row = {
            "bench": self.bench, "device": device_name(self.opts.device), "shape": shape,
            "backend": backend, "status": status if seconds is not None or status != "ok" else "skip",
            "median_us": seconds * 1e6 if ok else math.nan,
            "tflops": flops / seconds / 1e12 if ok else math.nan,
            "gbps": nbytes / seconds / 1e9 if ok else math.nan,
            "floor_us": floor * 1e6,
            "time_over_floor": seconds / floor if ok and floor > 0 else math.nan,
            "flops": float(flops), "bytes": float(nbytes), "note": note,
        }
        for k in self.extra_columns:
            row[k] = extra.get(k, math.nan)
        self.rows.append(row)
        if self.stream:
            self._write_csv([row])
        return row

    def run(self, shape: str, backend: str, fn: Callable[[], object], *, flops: float,
            nbytes: float, cold_l2: bool = True, reps: int | None = None, **extra) -> dict:
        """Time ``fn`` and add its row; an exception becomes a ``skip``/``error`` row."""
        from jetspec_kernels import BackendUnavailableError

        try:
            t = time_fn(fn, self.opts.device, quick=self.opts.quick, cold_l2=cold_l2, reps=reps,
                        graph=self.opts.graphs)
        except BackendUnavailableError as e:
            return self.add(shape, backend, None, flops=flops, nbytes=nbytes, status="skip",
                            note=str(e))
        except Exception as e:  # a broken kernel must not hide the other rows
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            return self.add(shape, backend, None, flops=flops, nbytes=nbytes, status="error",
                            note=tb[:300])
        return self.add(shape, backend, t, flops=flops, nbytes=nbytes, **extra)

    def run_ours(self, shape: str, backend: str, why: str | None, fn: Callable[[], object], *,
                 first_shape: bool, flops: float, nbytes: float, label: str | None = None) -> dict:
        """Row of one of our backends (``why``: None if usable, else why not). The Triton
        interpreter is timed on the first shape only, with two repetitions."""
        label = label or backend
        slow = interpreted(backend, self.opts.device)
        if why is None and slow and not first_shape:
            why = "Triton interpreter: timed on the first shape only"
        if why is not None:
            return self.skip(shape, label, why, flops=flops, nbytes=nbytes)
        return self.run(shape, label, fn, flops=flops, nbytes=nbytes, reps=2 if slow else None)

    def skip(self, shape: str, backend: str, reason: str, *, flops: float = 0.0,
             nbytes: float = 0.0) -> dict:
        return self.add(shape, backend, None, flops=flops, nbytes=nbytes, status="skip",
                        note=reason)

    def _speedups(self) -> None:
        base = {(r["shape"], r["backend"]): r["median_us"] for r in self.rows
                if r["backend"] in self.baselines and r["status"] == "ok"}
        for r in self.rows:
            for b in self.baselines:
                t_b = base.get((r["shape"], b))
                ok = r["status"] == "ok" and t_b is not None
                r[f"x_{b}"] = t_b / r["median_us"] if ok else math.nan

    def render(self) -> str:
        """The printed table: header lines, one line per row, then the notes."""
        shown = ["shape", "backend", "status", "median_us", "tflops", "gbps", "floor_us",
                 "time_over_floor"] + [f"x_{b}" for b in self.baselines] + self.extra_columns
        cells = [[_fmt(r[c]) for c in shown] for r in self.rows]
        width = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(shown)]
        lines = [f"== {self.bench} on {device_name(self.opts.device)} "
                 f"({'quick' if self.opts.quick else 'full'} sweep) ==",
                 self.ceilings.describe(), *self.header_lines,
                 *(["times: calls replayed from a CUDA graph (triton.testing.do_bench_cudagraph; "
                    "no launch overhead, L2 warm)"] if self.opts.graphs else []),
                 "x_<baseline> = baseline time / row time (> 1: faster than the baseline)",
                 "  ".join(c.rjust(w) for c, w in zip(shown, width))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
        notes = sorted({(r["backend"], r["status"], r["note"]) for r in self.rows if r["note"]})
        for backend, status, note in notes:
            lines.append(f"  [{status}] {backend}: {note}")
        return "\n".join(lines)

    def finish(self) -> int:
        """Compute speed-ups, print the table, write CSV (and PNG). Returns an exit code."""
        self._speedups()
        print(self.render(), flush=True)
        self._write_csv()
        self._write_csv(self.rows)
        print(f"wrote {self.csv_path}")
        if self.opts.plot:
            png = self.opts.out / f"{self.bench}.png"
            if plot_time_over_floor(self.rows, png, f"{self.bench} on {device_name(self.opts.device)}"):
                print(f"wrote {png}")
        return 0


def plot_time_over_floor(rows: list[dict], path: Path, title: str) -> bool:
    """PNG of time / roofline floor per shape, one line per backend (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # matplotlib is a test extra; the CSV is what matters
        print(f"no PNG: matplotlib is not importable ({e})", file=sys.stderr)
        return False
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(shapes) + 2), 4.5))
    for backend in dict.fromkeys(r["backend"] for r in rows):
        pts = [(shapes.index(r["shape"]), r["time_over_floor"]) for r in rows
               if r["backend"] == backend and r["status"] == "ok"
               and math.isfinite(r["time_over_floor"])]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=backend)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("time / roofline floor")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------------
# Inputs shared by several benches
# ----------------------------------------------------------------------------------------------

def random_tree(batch: int, budget: int, device: torch.device, *, depth: int = 15, topk: int = 7,
                seed: int = 0):
    """A realistic draft tree (JetSpec's heap over random per-depth top-K), built on the CPU by
    the reference backend and moved to ``device``.

    Returns
    -------
    jetspec_kernels.Tree with capacity ``budget``
    """
    import jetspec_kernels as jk
    from jetspec_kernels.tree import Tree

    gen = torch.Generator().manual_seed(seed)
    # Sharper distributions at shallow depths, like a trained head.
    logits = torch.randn(batch, depth, 256, generator=gen) * torch.linspace(4, 1.5, depth)[:, None]
    root = torch.randint(0, 256, (batch,), generator=gen, dtype=torch.int32)
    tree = jk.draft_tree(logits, root, budget=budget, topk=topk, algorithm="accum_logp",
                         backend="reference")
    return Tree(*(getattr(tree, f).to(device) for f in
                  ("tokens", "parents", "depths", "scores", "num_nodes", "mask")),
                max_depth=tree.max_depth)


def elt(dtype: torch.dtype) -> int:
    """Bytes per element."""
    return torch.empty((), dtype=dtype).element_size()


def main_guard(main: Callable[[list[str] | None], int]) -> None:
    """``sys.exit(main())`` with a clean message on Ctrl-C."""
    try:
        sys.exit(main(None))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


@contextmanager
def using_backend(name: str):
    """Make ``name`` the process-wide jetspec backend inside the block (for model code, whose
    ops take no ``backend=`` argument)."""
    import jetspec_kernels as jk

    old = jk.get_backend()
    jk.set_backend(name)
    try:
        yield
    finally:
        jk.set_backend(old)


def hopper_kernel_enabled() -> bool:
    """Whether benches and checks should run the cuda backend's Hopper attention family: not when
    ``JETSPEC_SKIP_HOPPER`` is set (device_check.sh sets it unless the family's GPU tests passed,
    so a faulting kernel cannot break the CUDA context of every measurement after it)."""
    return not os.environ.get("JETSPEC_SKIP_HOPPER")


@contextmanager
def using_attention_kernel(name: str | None):
    """Inside the block, the cuda backend's tree_attention uses kernel ``name`` ("mma", "wgmma",
    "hopper", "auto"; None leaves the choice as it is), through ``JETSPEC_ATTN_KERNEL``."""
    if name is None:
        yield
        return
    old = os.environ.get("JETSPEC_ATTN_KERNEL")
    os.environ["JETSPEC_ATTN_KERNEL"] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ["JETSPEC_ATTN_KERNEL"]
        else:
            os.environ["JETSPEC_ATTN_KERNEL"] = old
