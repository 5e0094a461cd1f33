"""bench/device_check.sh without a GPU: its dry run prints the plan (the steps in priority order,
each step's limit and the time it holds back for the required steps after it), the limits fit
one call of under 8 minutes, a rerun can pick steps, and what comes back fits the device tool's
limits (at most 8 files, names of letters, digits, '.', '_', '-')."""
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "device_check.sh"
ORDER = ["smi", "setup", "build", "gpu_tests_triton", "gpu_tests", "gpu_tests_hopper", "attention",
         "decode", "sanitizers", "small_ops", "attn_sweep", "hidden_topk", "draft_head",
         "gated_delta", "decode_fused", "decode_exact", "decode_exact_wide", "decode_exact_kparts", "moe",
         "gpu_tests_nopdl", "ncu"]
PLAN = re.compile(r"^\[device_check\] plan (\S+) (\d+) (\d+) (required|optional|conditional): (.*)$")


def dry_run(tmp: Path, *args) -> tuple[list[tuple], str]:
    env = {**os.environ, "OUT": str(tmp), "DEVICE_CHECK_PERSIST": str(tmp / "persist"),
           "TMPDIR": str(tmp)}
    res = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    plan = [(m[1], int(m[2]), int(m[3]), m[4], m[5]) for m in map(PLAN.match, res.stdout.splitlines()) if m]
    return plan, res.stdout


@lru_cache(maxsize=None)
def _plan():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return dry_run(Path(tmp))[0]


def step_limits() -> dict[str, int]:
    """Step name -> its limit in seconds, from the dry run's plan."""
    return {name: limit for name, limit, *_ in _plan()}


def budget() -> tuple[int, int]:
    text = SCRIPT.read_text()
    return (int(re.search(r"BUDGET_S=\$\{DEVICE_CHECK_BUDGET_S:-(\d+)\}", text)[1]),
            int(re.search(r"^RESERVE_S=(\d+)", text, re.M)[1]))


def test_plan_order_and_limits():
    plan = _plan()
    assert [p[0] for p in plan] == ORDER
    total, reserve = budget()
    assert total <= 8 * 60 - 10              # the whole run under 8 minutes, with time to pack
    required = [(name, limit, keep) for name, limit, keep, kind, _ in plan if kind == "required"]
    assert sum(limit for _, limit, _ in required) <= total - reserve
    for i, (name, _, keep) in enumerate(required):          # each holds back exactly what follows
        assert keep == sum(limit for _, limit, _ in required[i + 1:]), name
    kinds = {name: kind for name, _, _, kind, _ in plan}
    assert kinds["build"] == "conditional" and kinds["moe"] == kinds["ncu"] == "optional"
    assert kinds["hidden_topk"] == kinds["draft_head"] == kinds["decode_fused"] == "optional"
    cmds = {name: cmd for name, *_, cmd in plan}
    assert "--gpu-step triton" in cmds["gpu_tests_triton"] and "--gpu-step cuda" in cmds["gpu_tests"]
    assert "--gpu-step hopper" in cmds["gpu_tests_hopper"]
    for name in ("gpu_tests_triton", "gpu_tests", "gpu_tests_hopper"):   # a hung test ends its worker
        assert re.search(r"--timeout \d+", cmds[name]) and "--timeout-method thread" in cmds[name]
        assert re.search(r" -n \d+", cmds[name]) and "--max-worker-restart" in cmds[name]
    assert " -n 14 " in cmds["gpu_tests_triton"]
    assert "bench_tree_attention.py --headline" in cmds["attention"]
    assert "--deadline $((LIMIT - 10))" in cmds["decode"] and "--resume" in cmds["decode"]
    for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
        assert tool in cmds["sanitizers"]
    assert "for be in cuda triton" in cmds["sanitizers"]
    assert "--graphs" in cmds["small_ops"] and "attn_sweep.sh" in cmds["attn_sweep"]
    assert "host_overhead.py --gpu" in cmds["small_ops"]
    assert "--groups from_hidden --batches 1,4,16" in cmds["hidden_topk"]
    assert "bench_draft_head.py --quick --graphs" in cmds["draft_head"]
    assert kinds["gated_delta"] == "optional" and "bench_gated_delta.py --graphs" in cmds[
        "gated_delta"]
    assert "--fused-ops-backend cuda" in cmds["decode_fused"] and "--budgets 64" in cmds["decode_fused"]
    assert kinds["decode_exact"] == "optional" and "--exact --fused-ops-backend triton" in cmds[
        "decode_exact"] and "JETSPEC_EXACT_UNVERIFIED=1" in cmds["decode_exact"]
    assert kinds["decode_exact_wide"] == "optional" and "--exact-tile wide" in cmds[
        "decode_exact_wide"] and "JETSPEC_EXACT_UNVERIFIED=1" in cmds["decode_exact_wide"]
    assert kinds["decode_exact_kparts"] == "optional" and "--exact-k-parts 8" in cmds[
        "decode_exact_kparts"] and "JETSPEC_EXACT_UNVERIFIED=1" in cmds["decode_exact_kparts"]
    assert "SOURCES.sha256" in cmds["setup"] and "make ext " in cmds["build"]


def test_no_eager_rerun_and_inner_limits_stay_in_the_step():
    """small_ops times the benches from CUDA graphs only (host_overhead --gpu times the eager
    calls); every limit inside a step is `timeout --foreground -k`, which stays in the step's
    process group (a plain timeout makes its own, and a cut step would keep the GPU busy)."""
    plan = _plan()
    benches = re.findall(r"bench/bench_\w+\.py[^|;&]*", dict((p[0], p[4]) for p in plan)["small_ops"])
    assert benches and all("--graphs" in b for b in benches), benches
    for name, *_, cmd in plan:
        for m in re.finditer(r"(?<![-\w])timeout (.{0,20})", cmd):
            assert m[1].startswith("--foreground -k "), (name, m[0])
    script = SCRIPT.read_text()
    plain = [line for line in script.splitlines() if re.search(r"\btimeout -k 5 \"\$limit\"", line)]
    assert len(plain) == 1 and "&" in plain[0]          # the step's own limit, waited on by pid
    assert 'kill -KILL -- "-$pid"' in script
    for line in (ROOT / "bench" / "attn_sweep.sh").read_text().splitlines():   # the steps' helpers
        m = re.search(r"(?<![-\w])timeout (\S+)", line.split(" #")[0])
        assert m is None or m[1] == "--foreground", line


def test_rerun_picks_steps_and_results_fit_the_device_tool(tmp_path):
    plan, out = dry_run(tmp_path, "--steps", "setup,decode,moe")
    assert [p[0] for p in plan] == ["setup", "build", "decode", "moe"]
    assert all(keep == 0 for _, _, keep, *_ in plan)
    files = [p for p in tmp_path.iterdir() if p.is_file()]
    assert 0 < len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert "== device check: steps ==" in (tmp_path / "summary.txt").read_text()
    # the device tool returns at most 8 files: the script copies at most these into $OUT
    copied = set(re.findall(r'"\$OUT/([A-Za-z0-9._-]+)"', SCRIPT.read_text()))
    assert copied <= {"summary.txt", "steps.tsv", "nvidia-smi.txt", "decode.csv", "decode_moe.csv",
                      "attention.csv", "hw_record.jsonl", "device_check.tar.gz"}
    assert len(copied) <= 8


def test_source_hash_names_the_sources():
    """--source-hash (what make device-bundle writes beside _C) is a sha256 of csrc/ and
    CMakeLists.txt; setup uses the carried _C only when it matches."""
    h = subprocess.run(["bash", str(SCRIPT), "--source-hash"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert "device-bundle:" in (ROOT / "Makefile").read_text()
    assert "--source-hash > $(DEVICE_BUNDLE)/SOURCES.sha256" in (ROOT / "Makefile").read_text()


def _env(tmp: Path, **extra) -> dict:
    return {**os.environ, "OUT": str(tmp / "out"), "DEVICE_CHECK_PERSIST": str(tmp / "persist"),
            "TMPDIR": str(tmp / "tmp"), **extra}


def test_refuses_without_a_gpu_and_leaves_nothing(tmp_path):
    """Not on the GPU machine: one line on stderr, exit 2, no file written, no link left in the
    package (a python without torch, and one whose torch sees no GPU)."""
    (tmp_path / "tmp").mkdir()
    no_torch = tmp_path / "no_torch_python"
    no_torch.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    no_torch.chmod(0o755)
    link = ROOT / "jetspec_kernels" / "python_ref"
    had_link = link.is_symlink()
    pythons = [str(no_torch)]
    venv = ROOT / ".venv" / "bin" / "python"
    if venv.exists() and subprocess.run([str(venv), "-c", "import torch, sys; "
                                         "sys.exit(torch.cuda.is_available())"]).returncode == 0:
        pythons.append(str(venv))
    for py in pythons:
        res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT,
                             env=_env(tmp_path, DEVICE_CHECK_PYTHON=py), timeout=120)
        assert res.returncode == 2, res
        assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("device_check: ") and "--dry-run" in res.stderr
        assert not (tmp_path / "out").exists() and not any((tmp_path / "tmp").iterdir())
        assert link.is_symlink() == had_link
    assert "cannot import torch (ModuleNotFoundError" in subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT,
        env=_env(tmp_path, DEVICE_CHECK_PYTHON=str(no_torch)), timeout=120).stderr


def test_device_left_sizes_the_budget(tmp_path):
    plan, out = dry_run(tmp_path, "--device-left", "300", "--steps", "setup,decode,moe")
    assert "[device_check] budget 240s (300s of device time left)" in out
    plan, out = dry_run(tmp_path, "--device-left", "900")
    assert "[device_check] budget 470s" in out                     # never above the default
    for left in ("100", "abc"):
        res = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--device-left", left],
                             capture_output=True, text=True, cwd=ROOT, env=_env(tmp_path), timeout=60)
        assert res.returncode == 2 and res.stderr.startswith("device_check: "), res


FAKE_PYTHON = """#!/bin/bash
# Stands in for the GPU machine's python3: torch sees a GPU, the package imports, and pytest
# leaves a process running in the background, then sleeps (a step the call cuts short).
case "$*" in
  *"-m pytest"*"--gpu-step triton"*) sleep 300 & echo $! >"$FAKE_DIR/straggler.pid"; echo "1 passed"; exit 0 ;;
  *"-m pytest"*) echo $$ >"$FAKE_DIR/running.pid"; echo "1 passed"; sleep 60 ;;
esac
exit 0
"""


def test_each_step_publishes_and_leaves_no_process_behind(tmp_path):
    """After each step the step table and logs are in $OUT (a call cut short returns what it
    measured), and a process a step left running is gone when the step ends."""
    import signal
    import time

    (tmp_path / "tmp").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = _env(tmp_path, DEVICE_CHECK_PYTHON=str(bin_dir / "python3"), FAKE_DIR=str(tmp_path),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.Popen(["bash", str(SCRIPT), "--steps", "smi,gpu_tests_triton,gpu_tests"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out = tmp_path / "out"
    try:
        deadline = time.time() + 60
        while time.time() < deadline and "gpu_tests_triton" not in \
                ((out / "steps.tsv").read_text() if (out / "steps.tsv").exists() else ""):
            time.sleep(0.2)
        steps = (out / "steps.tsv").read_text()
        assert re.search(r"^smi\tPASS\t", steps, re.M) and re.search(r"^gpu_tests_triton\tPASS", steps, re.M)
        assert "H100" in (out / "nvidia-smi.txt").read_text()
        assert (out / "device_check.tar.gz").stat().st_size > 0
        straggler = int((tmp_path / "straggler.pid").read_text())
        time.sleep(0.5)
        assert not Path(f"/proc/{straggler}").exists() or \
            Path(f"/proc/{straggler}/stat").read_text().split()[2] == "Z", "a step's process outlived it"
        deadline = time.time() + 60
        while time.time() < deadline and not (tmp_path / "running.pid").exists():
            time.sleep(0.2)
        assert proc.poll() is None               # the cuda step is still running: cut it short
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    running = int((tmp_path / "running.pid").read_text())        # the step the call cut short
    time.sleep(0.5)
    assert not Path(f"/proc/{running}").exists() or \
        Path(f"/proc/{running}/stat").read_text().split()[2] == "Z", "the cut step outlived the run"
    assert {p.name for p in out.iterdir()} <= {"steps.tsv", "nvidia-smi.txt", "device_check.tar.gz"}
    assert not any((tmp_path / "tmp").iterdir())     # the work directory went with the run


def test_build_fallback_is_make_ext_alone():
    """The build step's `make ext`: _C alone (no attention sweep, no pip), sm_90a only, with
    CMake and ninja into the package, the python named on the command line."""
    res = subprocess.run(["make", "-n", "ext", "EXT_PYTHON=python3", "CMAKE=cmake", "NINJA=ninja"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    cmds = res.stdout
    assert "-DJETSPEC_CUDA_ARCHS=90a " in cmds and "-DPython_EXECUTABLE=python3 " in cmds
    assert f"-DJETSPEC_OUTPUT_DIR={ROOT / 'jetspec_kernels'}" in cmds
    assert re.search(r"cmake --build \S+ --target _C --parallel", cmds)
    assert "attn_sweep" not in cmds and "pip" not in cmds
