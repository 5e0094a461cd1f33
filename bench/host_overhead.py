"""Host time of one eager call of the public ops (the target: at most 25 µs on a GPU host for
tree_attention, qk_norm_rope_append, verify_tree and draft_tree; and rms_norm and silu_mul, the
ops the models call most: twice and once a layer).

On the CPU (default) the kernel launches are replaced by no-ops and the tensors are CPU tensors
sent down the cuda or triton backend's path, with value checks off (what CUDA tensors get): a
``_C`` stand-in whose launchers return at once (limits, enums and fields are the real ones), or
Triton kernels whose ``kernel[grid](...)`` does nothing. What is left is the Python a call costs:
argument checks, backend choice, the cuda custom op's dispatch, the wrappers' packing and the
output allocations. Shapes: Qwen3-8B (Hq 32, Hkv 8, Dh 128, H 4096, I 12288, bf16; V 151936), B1,
a 64-node tree, a 4096-slot cache, 15 draft depths, top-K 8.

    python bench/host_overhead.py                 # µs per call, per op and backend
    python bench/host_overhead.py --stages        # and where it goes (cProfile shares of it)
    python bench/host_overhead.py --baseline REV  # side by side with git revision REV, one run
    python bench/host_overhead.py --binding       # what the stand-in hides: the real _C's argument
                                                  # parsing of each op's launches (batch 0)
    python bench/host_overhead.py --gpu           # on a GPU: host µs per call (no launch stubs),
                                                  # kernel µs (CUDA-graph replay), wall - kernel
    python -m pytest bench/host_overhead.py --benchmark-only   # the same calls, pytest-benchmark,
        # and each op with only its backend kernels stubbed (value checks on and off; the cases of
        # tests/test_op_dispatch.py); pytest collects this file when it is named

``tests/test_host_overhead.py`` holds the budgets (Python calls per op call, counted, and a loose
wall-time bound); docs/perf/decode_round.md, "Host time per eager call", the numbers.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

import torch

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # bench/ is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not torch.cuda.is_available():  # before jetspec_kernels.triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

OPS = ("tree_attention", "qk_norm_rope_append", "verify_tree", "draft_tree", "rms_norm",
       "silu_mul")
BACKENDS = ("cuda", "triton")
B, N, HQ, HKV, DH, L, V, D, K, PREFIX, HID = 1, 64, 32, 8, 128, 4096, 151936, 15, 8, 1000, 4096
INTER = 12288  # the MLP's intermediate size


def op_inputs(device="cpu", dtype=torch.bfloat16, vocab=V) -> dict:
    """Arguments of every op at the shapes above (values random: launches do not read them)."""
    import jetspec_kernels as jk

    gen = torch.Generator().manual_seed(0)

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt)

    logits = randn(B, D, vocab, dt=torch.float32)
    root = torch.zeros(B, dtype=torch.int32, device=device)
    small = torch.randn(B, D, 64, generator=gen).to(device)     # a cheap reference tree of N nodes
    tree = jk.draft_tree(small, root, budget=N, topk=K, backend="reference")
    prefix = torch.full((B,), PREFIX, dtype=torch.int32, device=device)
    return dict(
        q=randn(B, N, HQ, DH), k=randn(B, N, HKV, DH), v=randn(B, N, HKV, DH),
        k_cache=randn(B, L, HKV, DH), v_cache=randn(B, L, HKV, DH), prefix=prefix,
        out=randn(B, N, HQ, DH), norm_w=torch.ones(DH, device=device), tree=tree,
        positions=tree.positions(prefix), target=randn(B, N, vocab, dt=torch.float32),
        logits=logits, root=root, stream=randn(B, N, HID), residual=randn(B, N, HID),
        hidden_norm_w=randn(HID), gate_up=randn(B, N, 2 * INTER))


def calls(x: dict, backend: str) -> dict:
    """Op name -> a call of the public op on ``x`` (what an engine calls once per layer/round)."""
    import jetspec_kernels as jk

    return {
        "tree_attention": lambda: jk.tree_attention(
            x["q"], x["k_cache"], x["v_cache"], x["prefix"], x["tree"].mask, out=x["out"],
            backend=backend),
        "qk_norm_rope_append": lambda: jk.qk_norm_rope_append(
            x["q"], x["k"], x["v"], x["norm_w"], x["norm_w"], x["positions"], x["k_cache"],
            x["v_cache"], rope_theta=1e6, cache_start=x["prefix"], backend=backend),
        "verify_tree": lambda: jk.verify_tree(x["tree"], x["target"], backend=backend),
        "draft_tree": lambda: jk.draft_tree(x["logits"], x["root"], budget=N, topk=K,
                                            backend=backend),
        "rms_norm": lambda: jk.rms_norm(x["stream"], x["hidden_norm_w"], residual=x["residual"],
                                        backend=backend),
        "silu_mul": lambda: jk.silu_mul(x["gate_up"], backend=backend),
    }


def _c_constants():
    """ENUMS, LIMITS and FIELDS of the real _C, else of the simulated one (tests/cuda_sim), else
    None (then the cuda path cannot be stubbed)."""
    try:
        from jetspec_kernels import _C
        return _C
    except ImportError:
        pass
    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path.insert(0, str(tests))
    try:
        from helpers import sim_module
        return sim_module()
    except Exception:
        return None


def noop_c(real) -> types.SimpleNamespace:
    """A ``_C`` whose launchers take any arguments and return at once."""
    def launch(*args, **kwargs):
        return None

    c = types.SimpleNamespace(ENUMS=real.ENUMS, LIMITS=real.LIMITS, FIELDS=real.FIELDS)
    for name in real.FIELDS:
        setattr(c, name, launch)
    c.topk_workspace_bytes = lambda *a, **k: 1024
    return c


@contextlib.contextmanager
def noop_launches(backend: str):
    """CPU tensors go down ``backend``'s path ("cuda" or "triton") with every launch a no-op and
    value checks off (as for CUDA tensors). Restores everything on exit."""
    import jetspec_kernels as jk
    from jetspec_kernels import backend as bk
    from jetspec_kernels import checks

    undo = []

    def patch(obj, name, value):
        undo.append((obj, name, getattr(obj, name, None), hasattr(obj, name)))
        setattr(obj, name, value)

    prev_checks = checks._value_checks
    jk.set_value_checks("never")
    try:
        if backend == "cuda":
            from jetspec_kernels.cuda import extension as ext
            real = _c_constants()
            if real is None:
                raise RuntimeError("no _C and no simulated _C to take limits and enums from")
            patch(jk, "_C", noop_c(real))
            patch(ext, "stream", lambda: 0)
            # An H200's SM count. (Not an ImportError test: the editable install finds a
            # module missing from a --baseline tree's package in this checkout.)
            if hasattr(ext, "sm_count"):   # a tree from before launch_plan.py (e.g. 94d9d96)
                patch(ext, "sm_count", lambda index: 132)
            else:
                from jetspec_kernels import launch_plan
                patch(launch_plan, "sm_count", lambda device: 132)
            reason = bk.unavailable_reason
            patch(bk, "unavailable_reason",
                  lambda name, device: None if name == "cuda" else reason(name, device))
        elif backend == "triton":
            import triton.runtime.interpreter as interp
            import triton.runtime.jit as jit

            def getitem(self, grid):
                return lambda *args, **kwargs: None
            for cls in (interp.InterpretedFunction, jit.KernelInterface):
                if "__getitem__" in vars(cls):
                    patch(cls, "__getitem__", getitem)
        else:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        yield
    finally:
        for obj, name, value, had in reversed(undo):
            if had:
                setattr(obj, name, value)
            else:
                delattr(obj, name)
        checks._value_checks = prev_checks


def per_call_us(fn, calls_per_repeat: int = 300, repeats: int = 9) -> float:
    """Median over ``repeats`` of the mean wall time of ``calls_per_repeat`` calls, in µs."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls_per_repeat):
            fn()
        times.append((time.perf_counter() - t0) / calls_per_repeat * 1e6)
    return statistics.median(times)


def python_calls(fn) -> tuple[int, int]:
    """(calls of Python functions in jetspec_kernels, all Python function calls) made by one call
    of ``fn`` after a warm-up: deterministic, so a budget on it holds on a noisy machine. The
    garbage collector is off during the counted call (and run just before it): a collection that
    fell due inside it would count the finalizers of whatever garbage the process holds (closing
    suspended generators, ``__del__`` methods), which depends on what ran before."""
    fn()
    fn()
    package = str(Path(sys.modules["jetspec_kernels"].__file__).parent)
    ours = total = 0

    def prof(frame, event, arg):
        nonlocal ours, total
        if event == "call":
            total += 1
            ours += frame.f_code.co_filename.startswith(package)

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return ours, total


# Stage -> (module path fragment, function names) whose cumulative time it is. "backend" is the
# backend's interface function with what it calls ("dispatch" and "impl" inside it for cuda: the
# custom op's call above its implementation, and the implementation with its no-op launches).
STAGES = {
    "checks": ("jetspec_kernels/ops/", ("check_tree_attention", "check_qk_norm_rope_append",
                                        "check_verify_tree", "check_draft_tree",
                                        "check_rms_norm", "check_silu_mul")),
    "select": ("jetspec_kernels/backend.py", ("select",)),
    "backend": ("jetspec_kernels/", ("<interface>",)),
    "custom op": ("", ("__call__",)),
    "impl": ("jetspec_kernels/cuda/", ("_tree_attention", "_qk_norm_rope_append", "_verify_tree",
                                       "_draft_tree", "_rms_norm", "_silu_mul")),
}
_INTERFACE = {"tree_attention": ("tree_attention",), "qk_norm_rope_append": ("qk_norm_rope_append",),
              "verify_tree": ("verify_tree",), "draft_tree": ("draft_tree",),
              "rms_norm": ("rms_norm",), "silu_mul": ("silu_mul",)}
# The launchers whose empty call is rows=0 (the others': batch=0).
_ROWS_LAUNCHERS = ("rms_norm", "silu_mul")


def stages(fn, op: str) -> dict[str, float]:
    """One call's time by stage (µs): cProfile's cumulative times as shares of the profiled call,
    scaled to the unprofiled wall time; "dispatch" = custom op call - impl, "rest" = total -
    checks - select - backend (the op's own glue: outputs, result types)."""
    wall = per_call_us(fn, 200, 5)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        fn()
    prof.disable()
    st = pstats.Stats(prof).stats
    total = max((v[3] for (f, _, name), v in st.items() if name == "<lambda>"), default=0.0)

    def cum(stage):
        path, names = STAGES[stage]
        got = 0.0
        for (f, _, name), v in st.items():
            f = f.replace(os.sep, "/")
            if path not in f:
                continue
            if stage == "backend":
                ok = name in _INTERFACE[op] and ("/cuda/" in f or "/triton/" in f)
            elif stage == "custom op":
                ok = name == "__call__" and ("custom_op" in f or "_library" in f)
            else:
                ok = name in names
            got += v[3] if ok else 0.0
        return got / total * wall if total else 0.0

    out = {s: cum(s) for s in STAGES}
    out["dispatch"] = out.pop("custom op") - out["impl"]
    out["rest"] = wall - out["checks"] - out["select"] - out["backend"]
    out["total"] = wall
    return out


def measure(backend: str, ops=OPS, with_stages: bool = False, with_counts: bool = True) -> dict:
    x = op_inputs()
    fns = calls(x, backend)
    res = {}
    with noop_launches(backend):
        for op in ops:
            row = {"us": per_call_us(fns[op])}
            if with_counts:
                row["ours"], row["calls"] = python_calls(fns[op])
            if with_stages:
                row["stages"] = stages(fns[op], op)
            res[op] = row
    return res


def _print_table(results: dict, stages_on: bool) -> None:
    print("op                    backend   µs/call  py calls (ours/all)")
    for backend, rows in results.items():
        for op, r in rows.items():
            print(f"{op:21s} {backend:8s} {r['us']:8.1f}  {r.get('ours', '-')}/{r.get('calls', '-')}")
            if stages_on:
                print("    " + ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items()))


def _baseline_tree(rev: str) -> Path:
    """A copy of git revision ``rev`` under a temp dir, with this checkout's _C (if built) and
    python_ref linked in, importable through PYTHONPATH."""
    root = Path(__file__).resolve().parents[1]
    # keyed on the commit, not the name: a copy made for "HEAD" or a branch goes stale
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=root,
                         check=True, capture_output=True, text=True).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"jetspec_host_base_{sha}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", sha], cwd=root, check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest)
    pkg = dest / "jetspec_kernels"
    if not (pkg / "python_ref").exists():
        (pkg / "python_ref").symlink_to(dest / "python_ref")
    for so in (root / "jetspec_kernels").glob("_C*.so"):
        if not (pkg / so.name).exists():
            (pkg / so.name).symlink_to(so)
    own = subprocess.run(["git", "show", f"{sha}:bench/host_overhead.py"], cwd=root,
                         capture_output=True, text=True).stdout
    if '"--json"' not in own:   # a tree from before this script (94d9d96's is pytest-benchmark
        # cases only): a copy of this one, run from that tree
        (dest / "bench").mkdir(exist_ok=True)
        shutil.copyfile(Path(__file__).resolve(), dest / "bench" / "host_overhead.py")
    return dest


def compare(rev: str, rounds: int, backends) -> None:
    """This checkout against revision ``rev``: subprocesses alternating, per op the median of
    their per-call times, and the ratio."""
    base = _baseline_tree(rev)
    root = Path(__file__).resolve().parents[1]
    runs: dict = {"base": [], "this": []}
    for _ in range(rounds):
        for which, path in (("base", base), ("this", root)):
            env = {**os.environ, "PYTHONPATH": str(path), "TRITON_INTERPRET": "1"}
            # Each tree's own script (_baseline_tree gives an older tree a copy of this one): the
            # script puts its own checkout first on sys.path, so this checkout's script run for
            # the other tree would import this checkout's package (measuring it twice).
            out = subprocess.run([sys.executable, str(path / "bench" / "host_overhead.py"), "--json",
                                  "--backends", ",".join(backends)],
                                 env=env, cwd=path, capture_output=True, text=True, check=True)
            runs[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"µs per call, median of {rounds} alternating runs; {rev} | this checkout | ratio; "
          f"Python calls (ours/all) {rev} | this (- where that tree's script does not count)")
    for backend in backends:
        for op in OPS:
            t = statistics.median(r[backend][op]["us"] for r in runs["this"])
            counts = [r[backend].get(op, {}) for r in (runs["base"][0], runs["this"][0])]
            calls = " | ".join(f"{c['ours']}/{c['calls']}" if "calls" in c else "-" for c in counts)
            if any(op not in r[backend] for r in runs["base"]):   # a tree from before the op
                print(f"{op:21s} {backend:8s} {'-':>8s} | {t:8.1f} |     -   calls {calls}")
                continue
            b = statistics.median(r[backend][op]["us"] for r in runs["base"])
            print(f"{op:21s} {backend:8s} {b:8.1f} | {t:8.1f} | {b / t:5.2f}x   calls {calls}")


def binding(rounds: int = 3, x: dict | None = None) -> dict:
    """What the no-op stand-in hides: the real ``_C`` launchers' argument parsing. Each op's
    cuda-path launches are recorded (keywords as the wrappers pass them), then replayed on the
    real ``_C`` with ``batch=0`` (``rows=0`` for rms_norm and silu_mul), which every launcher
    parses in full and returns on before any CUDA call (so this runs without a GPU). Op ->
    {"launches", "c_us": real parsing per op call, "stub_us": the stand-in's own cost for the same
    calls}; minimum over ``rounds``; ``x``: the inputs (default :func:`op_inputs`)."""
    import jetspec_kernels as jk
    from jetspec_kernels import _C

    fns = calls(op_inputs() if x is None else x, "cuda")
    stub = noop_c(_C).verify_walk        # any launcher of the stand-in: the same function
    res = {}
    for op in OPS:
        recorded = []
        with noop_launches("cuda"):
            for name in jk._C.FIELDS:
                setattr(jk._C, name,
                        lambda *a, _name=name, **kw: recorded.append(
                            (_name, {**kw, "rows" if _name in _ROWS_LAUNCHERS else "batch": 0})))
            fns[op]()
        launches = [(getattr(_C, name), kw) for name, kw in recorded]

        def real():
            for f, kw in launches:
                f(**kw)

        def stubbed():
            for _, kw in launches:
                stub(**kw)

        res[op] = {"launches": [name for name, _ in recorded],
                   "c_us": min(per_call_us(real, 1000, 5) for _ in range(rounds)),
                   "stub_us": min(per_call_us(stubbed, 1000, 5) for _ in range(rounds))}
    return res


def gpu(backends, seconds: float) -> None:
    """On CUDA tensors, no stubs: host µs per call (the call's own wall time, no sync: the GPU
    keeps up with these small kernels), kernel µs per call (calls replayed from a CUDA graph,
    bench/common.py's time_fn), and the wall time per call of a loop of calls ended by one sync,
    minus the kernel time."""
    from bench import common as bc

    x = op_inputs("cuda")
    deadline = time.perf_counter() + seconds
    print("op                    backend   host µs  kernel µs  wall µs  wall-kernel", flush=True)
    for backend in backends:
        fns = calls(x, backend)
        for op in OPS:
            if time.perf_counter() > deadline:
                print(f"{op:21s} {backend:8s} (out of time)", flush=True)
                continue
            fn = fns[op]
            try:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                host = []
                for _ in range(300):
                    t0 = time.perf_counter()
                    fn()
                    host.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(300):
                    fn()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / 300 * 1e6
                kernel = bc.time_fn(fn, torch.device("cuda"), quick=True, graph=True) * 1e6
                print(f"{op:21s} {backend:8s} {statistics.median(host):8.1f} {kernel:9.1f} "
                      f"{wall:8.1f} {wall - kernel:9.1f}", flush=True)
            except Exception as e:  # a failing op must not hide the others
                print(f"{op:21s} {backend:8s} error: {type(e).__name__}: {e}"[:200], flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--stages", action="store_true", help="split each call's time by stage")
    ap.add_argument("--baseline", metavar="REV", help="compare with this git revision")
    ap.add_argument("--rounds", type=int, default=5, help="alternating runs for --baseline")
    ap.add_argument("--json", action="store_true", help="print one JSON line (for --baseline)")
    ap.add_argument("--gpu", action="store_true", help="CUDA tensors, real launches")
    ap.add_argument("--binding", action="store_true",
                    help="the real _C's argument parsing per op call (CPU, batch 0)")
    ap.add_argument("--seconds", type=float, default=15.0, help="--gpu: stop starting ops after")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if args.gpu:
        gpu(backends, args.seconds)
    elif args.binding:
        print("op                    _C parsing µs  stand-in µs  launches (real _C, batch 0, CPU)")
        for op, r in binding().items():
            print(f"{op:21s} {r['c_us']:13.2f} {r['stub_us']:12.2f}  {', '.join(r['launches'])}")
    elif args.baseline:
        compare(args.baseline, args.rounds, backends)
    else:
        res = {b: measure(b, with_stages=args.stages) for b in backends}
        if args.json:
            print(json.dumps(res))
        else:
            print(f"CPU, launches no-ops ({os.cpu_count()} cores, shared: noisy)")
            _print_table(res, args.stages)


# ---- pytest-benchmark (collected when this file is named on the pytest command line) ----

@pytest.mark.benchmark(group="eager_noop_launch", max_time=0.2, min_rounds=20)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_eager_noop_launch(benchmark, op, backend):
    fn = calls(op_inputs(), backend)[op]
    with noop_launches(backend):
        benchmark(fn)


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_op_dispatch import CASES, inputs, stub, value_checks  # noqa: E402,F401


@pytest.mark.benchmark(group="host_overhead", max_time=0.2, min_rounds=20)
@pytest.mark.parametrize("name", CASES)
def test_host_overhead(benchmark, name, stub, inputs, value_checks):
    """Each op with its backend kernels replaced by a stub returning precomputed outputs."""
    case = CASES[name](inputs, stub)
    case.check(benchmark(case.call))
    assert {fn for _, fn in stub.calls} == set(case.kernels), "timed something else than the op"


if __name__ == "__main__":
    main()
