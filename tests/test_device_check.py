"""bench/device_check.sh without a GPU: its dry run prints the plan (issue 31's priority order,
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
ORDER = ["smi", "setup", "build", "gpu_tests", "gpu_tests_tma", "decode", "sanitizers", "small_ops",
         "attn_sweep", "hidden_topk", "draft_head", "decode_fused", "moe", "gpu_tests_nopdl", "ncu"]
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
    assert "--on-gpu" in cmds["gpu_tests"] and "--tma skip" in cmds["gpu_tests"]
    assert "--tma only" in cmds["gpu_tests_tma"]
    assert "--deadline $((LIMIT - 10))" in cmds["decode"] and "--resume" in cmds["decode"]
    for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
        assert tool in cmds["sanitizers"]
    assert "for be in cuda triton" in cmds["sanitizers"]
    assert "--graphs" in cmds["small_ops"] and "attn_sweep.sh" in cmds["attn_sweep"]
    assert "host_overhead.py --gpu" in cmds["small_ops"]
    assert "--groups from_hidden --batches 1,4,16" in cmds["hidden_topk"]
    assert "bench_draft_head.py --quick --graphs" in cmds["draft_head"]
    assert "--fused-ops-backend cuda" in cmds["decode_fused"] and "--budgets 64" in cmds["decode_fused"]
    assert "SOURCES.sha256" in cmds["setup"] and "make device-bundle" in cmds["build"]


def test_rerun_picks_steps_and_results_fit_the_device_tool(tmp_path):
    plan, out = dry_run(tmp_path, "--steps", "setup,decode,moe")
    assert [p[0] for p in plan] == ["setup", "build", "decode", "moe"]
    assert all(keep == 0 for _, _, keep, *_ in plan)
    files = [p for p in tmp_path.iterdir() if p.is_file()]
    assert 0 < len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert "== device check: steps ==" in (tmp_path / "summary.txt").read_text()
    # the device tool returns at most 8 files: the script copies at most these into $OUT
    copied = set(re.findall(r'"\$OUT/([A-Za-z0-9._-]+)"', SCRIPT.read_text()))
    assert copied <= {"summary.txt", "nvidia-smi.txt", "decode.csv", "decode_moe.csv",
                      "hw_record.jsonl", "device_check.tar.gz"}


def test_source_hash_names_the_sources():
    """--source-hash (what make device-bundle writes beside _C) is a sha256 of csrc/ and
    CMakeLists.txt; setup uses the carried _C only when it matches."""
    h = subprocess.run(["bash", str(SCRIPT), "--source-hash"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert "device-bundle:" in (ROOT / "Makefile").read_text()
    assert "--source-hash > $(DEVICE_BUNDLE)/SOURCES.sha256" in (ROOT / "Makefile").read_text()
