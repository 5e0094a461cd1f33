"""Static gates of the Hopper attention family, checked without a GPU on the sweep
harness's build (bench/attn_sweep: every variant, one object each, sm_90a):

* ptxas: no spills, no stack, no wgmma serialisation (C7513 / C7515 / C7517) and no ignored
  setmaxnreg (C7508) in any object; a variant that splits registers with setmaxnreg launches
  with exactly the registers the split assumes (fewer, and setmaxnreg.inc could wait forever);
* occupancy: the CTAs per SM of every variant from its real registers and shared memory (the
  occupancy calculator's rules) equal what its launch bounds ask for, for both shape classes
  (wide: > 64 packed rows a kv head; small: <= 64) and both head dims;
* SASS of the main loop: 64xN HGMMA, QK and P V issued back to back (no wait between), the
  deepest wait (`WARPGROUP.DEPBAR.LE gsb0, 0x1`), no compare around MUFU.EX2 where the fast
  exponential is on (and one where it is off: the check can fail), the ping-pong barriers in
  every issue step, mbarrier releases, setmaxnreg, no local memory;
* the harness itself: `--list` and `--dry-run` run on a machine without a GPU.

The build takes a few minutes on 2 cores (once; make keeps it), so these tests are marked slow:
`make test-slow` runs them. They skip, saying why, without nvcc or cuobjdump.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_cuda_build import NVCC, parse_ptxas

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "bench" / "attn_sweep"
BUILD = ROOT / "build" / "attn_sweep"
HOPPER = "tree_attention_hopper_kernel"


def find_cuobjdump():
    """cuobjdump on PATH, in CUDA's default install, or the copy Triton's wheel carries."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/cuobjdump")
    if default.exists():
        return str(default)
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


@pytest.fixture(scope="module")
def build():
    """The sweep harness built for sm_90a (make keeps it between runs)."""
    if NVCC is None:
        pytest.skip("needs nvcc (the sweep harness is CUDA C++ for sm_90a)")
    env = dict(os.environ, NVCC=NVCC)
    res = subprocess.run(["make", "-C", str(SWEEP), f"-j{os.cpu_count() or 2}"], env=env,
                         capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return BUILD


def config(mangled: str):
    """(head dim, WGS, BN, STAGES, PINGPONG, FAST_EXP, CTAS, ABLATE) of a Hopper kernel's
    mangled name."""
    hd = int(re.search(r"tree_attention_hopper_kernelI\w+?Li(\d+)E", mangled).group(1))
    args = re.search(r"HopperAttnCfgI((?:L[ib]\d+E)+)E", mangled).group(1)
    return (hd, *(int(v) for v in re.findall(r"L[ib](\d+)E", args)))


def launch_regs(threads, ctas):
    return min(65536 // (threads * ctas) // 8 * 8, 255)


def smem_bytes(hd, wgs, bn, stages):
    """attention_hopper_smem_bytes: Q + STAGES K and V tiles + mbarriers + alignment slack."""
    return (wgs * 64 + 2 * stages * bn) * hd * 2 + 4 * stages * 8 + 1024


def occupancy(threads, smem, regs):
    """CTAs per SM by an H100 / H200's limits (cuda_sim.h's jetspec_sim::occupancy)."""
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // per_warp // warps
    by_threads = 2048 // (warps * 32)
    by_smem = 233472 // (-(-(smem + 1024) // 128) * 128)
    return min(by_regs, by_threads, by_smem, 32)


def hopper_reports(build):
    """{object name: (mangled name, ptxas stats)} of every Hopper kernel in the build."""
    out = {}
    for log in sorted(build.glob("variant_*.o.ptxas.log")):
        for (name, arch), stats in parse_ptxas(log.read_text()).items():
            if HOPPER in name and arch == "sm_90a":
                out[log.name.removesuffix(".ptxas.log")] = (name, stats)
    return out


def test_ptxas_every_variant(build):
    logs = sorted(build.glob("*.ptxas.log"))
    assert len(logs) >= 18, [p.name for p in logs]
    for log in logs:
        text = log.read_text()
        bad = [line for line in text.splitlines()
               if re.search(r"C75(08|13|15|17)", line)]
        assert not bad, (log.name, bad[:3])
        for (name, arch), s in parse_ptxas(text).items():
            assert s.get("spill_stores", 0) == 0 and s.get("spill_loads", 0) == 0, (log.name, name, s)
            assert s.get("stack", 0) == 0, (log.name, name, s)
    reports = hopper_reports(build)
    count = int(re.search(r"kSweepVariantCount = (\d+);", (SWEEP / "variants.h").read_text())[1])
    assert len(reports) == count
    for obj, (name, s) in reports.items():
        hd, wgs, bn, stages, pp, fast, ctas, ablate = config(name)
        cap = launch_regs((wgs + 1) * 128, ctas)
        assert s["registers"] <= cap, (obj, s)
        if cap < 232:  # setmaxnreg moves registers: the pool must be exactly what it assumes
            assert s["registers"] == cap, (obj, name, s["registers"], cap)


def test_occupancy_every_variant(build):
    """CTAs per SM from ptxas's registers and the shared memory equal the launch bounds' ask, for
    every variant; of the library's four, small at Dh 64 fits two CTAs per SM, the others one."""
    seen = {}
    for obj, (name, s) in hopper_reports(build).items():
        hd, wgs, bn, stages, pp, fast, ctas, ablate = config(name)
        threads = (wgs + 1) * 128
        got = occupancy(threads, smem_bytes(hd, wgs, bn, stages), s["registers"])
        assert got == ctas, (obj, name, got, ctas)
        seen[(hd, wgs, bn, stages, pp, fast, ctas, ablate)] = got
    for library, ctas in (((128, 2, 128, 2, 1, 1, 1, 0), 1), ((128, 1, 64, 4, 1, 1, 1, 0), 1),
                          ((64, 2, 128, 3, 1, 1, 1, 0), 1), ((64, 1, 64, 4, 1, 1, 2, 0), 2)):
        assert seen[library] == ctas, library


def sass(build, obj):
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("needs cuobjdump (CUDA's, or the one Triton's wheel carries)")
    res = subprocess.run([tool, "-sass", str(build / obj)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = []
    for line in res.stdout.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m:
            lines.append(m.group(1))
    return lines


def object_of(build, **want):
    """The object of the first variant whose config matches ``want`` (keys of config())."""
    keys = ("hd", "wgs", "bn", "stages", "pp", "fast", "ctas", "ablate")
    for obj, (name, _) in hopper_reports(build).items():
        cfg = dict(zip(keys, config(name)))
        if all(cfg[k] == v for k, v in want.items()):
            return obj
    raise AssertionError(f"no variant with {want}")


def issue_regions(lines):
    """[(start, end)] of each wgmma batch: WARPGROUP.ARRIVE up to the next WARPGROUP.DEPBAR."""
    regions, start = [], None
    for i, ins in enumerate(lines):
        if ins.startswith("WARPGROUP.ARRIVE"):
            start = i
        elif ins.startswith("WARPGROUP.DEPBAR") and start is not None:
            regions.append((start, i))
            start = None
    return regions


def test_sass_main_loop_wide(build):
    lines = sass(build, object_of(build, hd=128, wgs=2, bn=128, stages=2, pp=1, fast=1, ablate=0))
    assert not [x for x in lines if re.match(r"(@!?P\d+ )?(LDL|STL)\b", x)], "local memory"
    assert any(x.startswith("USETMAXREG") for x in lines), "no setmaxnreg"
    hgmma = [x for x in lines if "HGMMA" in x]
    assert hgmma and all("HGMMA.64x128x16.F32" in x for x in hgmma), hgmma[:3]
    assert any("tnspB" in x for x in hgmma), "P V should take P from registers, V transposed"
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in lines, "no wait that leaves P V in flight"
    steps = 0
    prev_end = 0
    for start, end in issue_regions(lines):
        body = lines[start:end]
        mma = [x for x in body if "HGMMA" in x]
        qk = [k for k, x in enumerate(mma) if "tnspB" not in x]
        pv = [k for k, x in enumerate(mma) if "tnspB" in x]
        if qk and pv:  # a main-loop step: QK then P V, issued back to back
            steps += 1
            assert len(qk) == 8 and len(pv) == 8, body
            assert max(qk) < min(pv), "P V issued before QK"
            window = lines[prev_end:end]
            assert any(re.search(r"BAR\.SYNC\S* 0x[45], 0x100", x) for x in window), \
                "no ping-pong wait before the step's issue"
            assert any(re.search(r"BAR\.ARV 0x[45], 0x100", x) for x in body), \
                "no ping-pong hand-over after the step's issue"
            after = lines[end]
            assert after == "WARPGROUP.DEPBAR.LE gsb0, 0x1", ("first wait after the step", after)
        prev_end = end
    assert steps == 2, "one issue step in the unmasked loop and one in the masked loop"
    releases = [x for x in lines if x.startswith("SYNCS.ARRIVE")]
    assert len(releases) >= 2 * steps + 2, "K and V stages released in every step"


def exp2_slow_path(lines):
    """exp2f's denormal handling: a compare with -126 around MUFU.EX2."""
    return [x for x in lines if x.startswith("FSETP") and "-126" in x]


def test_sass_fast_exponential(build):
    """ex2.approx.ftz leaves MUFU.EX2 alone; the exp2f ablation shows the compare the gate looks
    for (so the check can fail)."""
    for obj in (object_of(build, hd=128, wgs=2, bn=128, stages=2, pp=1, fast=1, ablate=0),
                object_of(build, hd=128, wgs=1, bn=64, stages=4, fast=1, ablate=0)):
        lines = sass(build, obj)
        assert sum(x.startswith("MUFU.EX2") for x in lines) >= 64
        assert not exp2_slow_path(lines), (obj, exp2_slow_path(lines)[:2])
    slow = sass(build, object_of(build, wgs=2, fast=0))
    assert exp2_slow_path(slow)


def test_sass_no_pingpong_variant_has_no_pingpong(build):
    lines = sass(build, object_of(build, hd=128, wgs=2, pp=0))
    assert not [x for x in lines if re.search(r"BAR\.(ARV|SYNC)\S* 0x[45]", x)]
    small = sass(build, object_of(build, hd=128, wgs=1, bn=64, stages=4, fast=1, ablate=0))
    assert any("HGMMA.64x64x16.F32" in x for x in small)
    assert not [x for x in small if re.search(r"BAR\.ARV", x)]


def test_harness_list_and_dry_run(build):
    """The harness runs on a machine without a GPU in these two modes (the device check's first
    look at a carried binary)."""
    exe = build / "attn_sweep"
    listed = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for name in ("wide", "wide_nopp", "small", "small_2cta", "wide_d64", "small_d64", "mma",
                 "wgmma"):
        assert re.search(rf"^{name}\s", listed.stdout, re.M), name
    for shape in ("1x32Kx256", "4x16Kx128", "1x8Kx256", "16x4Kx16", "1x32Kx16", "4x8Kx32",
                  "4x16Kx128_p16", "16x4Kx16_p64"):
        assert re.search(rf"^{shape}\s", listed.stdout, re.M), shape
    dry = subprocess.run([str(exe), "--dry-run", "--only", "wide,small,mma", "--shapes",
                          "1x32Kx256,16x4Kx16"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "6 runs planned" in dry.stdout, dry.stdout[-500:]
    bad = subprocess.run([str(exe), "--nonsense"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown option" in bad.stderr
