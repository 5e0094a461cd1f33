"""CPU checks of the CUDA extension: it imports without a GPU, reports the missing device cleanly,
and its main kernels compile for sm_90a and sm_80 without register spills or local memory.

Each test skips only on what it needs: the built ``_C`` (the ``_C`` fixture), nvcc
(``needs_nvcc``), or nothing (the split heuristic and the ptxas log parser).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def find_nvcc():
    """nvcc on PATH, else CUDA's default install, else None."""
    default = Path("/usr/local/cuda/bin/nvcc")
    return shutil.which("nvcc") or (str(default) if default.exists() else None)


NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")


@pytest.fixture
def _C():
    """The built extension; the test skips where it is not built."""
    return pytest.importorskip("jetspec_kernels._C", reason="the CUDA extension is not built")

# Kernels whose ptxas report must show no spills and no stack frame.
MAIN_KERNELS = (
    "tree_attention_kernel", "tree_attention_wgmma_kernel", "tree_attention_hopper_kernel",
    "attention_combine_kernel", "topk_partial_kernel",
    "topk_merge_kernel", "build_tree_topn_kernel",
    "build_tree_accum_kernel",
    "sample_filter_kernel", "target_partial_kernel", "verify_walk_kernel",
    "commit_kv_kernel", "gather_hidden_kernel", "qk_norm_rope_append_kernel", "pack_mask_kernel",
    "rms_norm_kernel", "silu_mul_kernel",
)
# Double-precision sincos (python_ref's RoPE convention) keeps its argument-reduction table in
# local memory; that stack frame is libdevice's, not a spill.
STACK_ALLOWED = ("qk_norm_rope_append_kernel",)


def test_import_and_archs(_C):
    archs = _C.built_archs().split(",")
    # the architectures it was built for (device_check.sh builds "90a" alone; the default is 90a;80)
    assert archs == os.environ.get("JETSPEC_CUDA_ARCHS", "90a;80").replace(";", ",").split(",")
    assert _C.supports_arch(90) and not _C.supports_arch(75)
    if "80" in archs:
        assert _C.supports_arch(80) and _C.supports_arch(86)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_device_reported_cleanly(_C):
    assert _C.device_count() == 0
    # A launch without a device raises RuntimeError carrying the CUDA error name and string.
    with pytest.raises(RuntimeError, match=r"jetspec_kernels\._C\.build_tree: CUDA error \d+ \(cuda"):
        _C.build_tree(0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 4, 1, 0, 0)
    from jetspec_kernels import available_backends
    reason = available_backends("cpu")["cuda"]
    assert reason is not None and "CUDA tensors" in reason


def test_split_heuristic_with_empty_shapes():
    """B = 0 or N = 0 is valid input: one split, and no device query (the launch is a no-op)."""
    from jetspec_kernels.cuda.tree_attention import choose_splits
    assert choose_splits(1, 0, 32, 8, 4096, "cpu") == 1
    assert choose_splits(0, 16, 32, 8, 4096, "cpu") == 1


def test_split_heuristic_one_wave(monkeypatch):
    """Splits fill at most one wave of two CTAs per SM (132 SMs here), never round up into a
    second one, and respect the capacity floor of 256 keys per split."""
    from jetspec_kernels import launch_plan
    from jetspec_kernels.cuda.tree_attention import choose_splits
    monkeypatch.setattr(launch_plan, "sm_count", lambda device: 132)
    assert choose_splits(1, 64, 32, 8, 4160, "cpu") == 8      # 32 base CTAs: 256 <= 264
    assert choose_splits(1, 16, 32, 8, 32784, "cpu") == 32    # 8 base CTAs: capped at MAX_SPLITS
    assert choose_splits(1, 16, 32, 8, 1040, "cpu") == 4      # short cache: 4 x 256 keys
    assert choose_splits(3, 37, 32, 8, 4096, "cpu") == 3      # 72 base CTAs: 216 <= 264
    assert choose_splits(16, 64, 32, 8, 4096, "cpu") == 1     # 512 base CTAs fill the GPU
    for b, n in ((1, 1), (1, 40), (2, 100), (5, 13)):
        tiles = -(-n * 4 // 64)
        s = choose_splits(b, n, 32, 8, 1 << 20, "cpu")
        assert s == 1 or tiles * b * 8 * s <= 2 * 132


CU_FILES = ("attention", "draft_tree", "verify_tree", "commit_kv", "pack_mask",
            "qk_norm_rope_append", "rms_norm", "silu_mul")


def kernel_ptx(cu: str, arch: str, tmp_path) -> dict:
    """PTX of csrc/<cu>.cu for `arch` -> {entry name: body}."""
    out = tmp_path / f"{cu}_{arch}.ptx"
    subprocess.run([NVCC, "-std=c++17", "--expt-relaxed-constexpr", f"-arch={arch}", "-ptx",
                    f"-I{ROOT / 'csrc' / 'include'}", '-DJETSPEC_CUDA_ARCHS="90a,80"',
                    str(ROOT / "csrc" / f"{cu}.cu"), "-o", str(out)],
                   check=True, capture_output=True, timeout=600)
    parts = re.split(r"(?:\.visible\s+)?\.entry\s+", out.read_text())[1:]
    return {part.split("(", 1)[0]: part for part in parts}


@needs_nvcc
def test_every_kernel_waits_for_its_predecessor(tmp_path):
    """Every kernel is launched with programmatic dependent launch on sm_90+ (pdl.cuh), so on
    sm_90a each entry must run griddepcontrol.wait before its first global-memory access, and
    then release the next grid; the sm_80 code has neither instruction."""
    first_access = re.compile(r"\b(ld|st|atom|red|cp\.async)\.[\w.]*global|cp\.async\.bulk|"
                              r"ld\.global|cvta\.to\.global[^\n]*\n[^\n]*\bld\b")
    seen = 0
    for cu in CU_FILES:
        for name, body in kernel_ptx(cu, "sm_90a", tmp_path).items():
            seen += 1
            wait = body.find("griddepcontrol.wait")
            assert wait >= 0, f"{name} ({cu}.cu) does not start with pdl_begin()"
            assert "griddepcontrol.launch_dependents" in body, name
            access = first_access.search(body)
            assert access is None or access.start() > wait, (name, access.group(0))
    assert seen >= len(MAIN_KERNELS)
    for name, body in kernel_ptx("pack_mask", "sm_80", tmp_path).items():
        assert "griddepcontrol" not in body, name


def parse_ptxas(log: str):
    """ptxas -v output -> {(mangled name, arch): dict(registers, stack, spill_stores, spill_loads)}."""
    out = {}
    current = None
    props_for = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m:
            current = (m.group(1), m.group(2))
            out[current] = {}
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props_for = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and current and props_for == current[0]:
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current]["registers"] = int(m.group(1))
    return out


def test_parse_ptxas_sample():
    log = """ptxas info    : Compiling entry function '_ZN7jetspec17build_tree_kernelE' for 'sm_80'
ptxas info    : Function properties for _ZN7jetspec17build_tree_kernelE
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers"""
    got = parse_ptxas(log)
    assert got == {("_ZN7jetspec17build_tree_kernelE", "sm_80"):
                   dict(stack=8, spill_stores=4, spill_loads=4, registers=64)}


@needs_nvcc
def test_ptxas_no_spills(tmp_path):
    """Fresh build of _C for 90a and 80 with -Xptxas -v (a few minutes on 2 cores)."""
    import pybind11

    env_bin = Path(sys.executable).parent
    cmake = shutil.which("cmake", path=str(env_bin)) or shutil.which("cmake")
    ninja = shutil.which("ninja", path=str(env_bin)) or shutil.which("ninja")
    if cmake is None or ninja is None:
        pytest.skip("needs cmake and ninja")
    build = tmp_path / "build"
    subprocess.run([cmake, f"-S{ROOT}", f"-B{build}", "-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                    "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_COMPILER={NVCC}",
                    f"-DPython_EXECUTABLE={sys.executable}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", "-DJETSPEC_CUDA_ARCHS=90a;80",
                    "-DJETSPEC_PTXAS_VERBOSE=ON", f"-DJETSPEC_OUTPUT_DIR={tmp_path / 'out'}"],
                   check=True, capture_output=True, timeout=300)
    res = subprocess.run([cmake, "--build", str(build), "--parallel", str(os.cpu_count() or 2)],
                         capture_output=True, text=True, timeout=1500)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    # C7515 / C7517: ptxas serialised a kernel's wgmma (e.g. a group in flight across a branch);
    # the results stay right but every overlap the wgmma kernels are built for is lost.
    serialised = [line for line in log.splitlines() if "C7515" in line or "C7517" in line]
    assert not serialised, "\n".join(serialised[:4])
    stats = parse_ptxas(log)
    for kernel in MAIN_KERNELS:
        for arch in ("sm_90a", "sm_80"):
            found = {k: v for k, v in stats.items() if kernel in k[0] and k[1] == arch}
            assert found, f"no ptxas report for {kernel} on {arch}"
            for (name, _), s in found.items():
                assert s["spill_stores"] == 0 and s["spill_loads"] == 0, (name, arch, s)
                if kernel not in STACK_ALLOWED:
                    assert s["stack"] == 0, (name, arch, s)
    report = sorted((k[1], k[0], v.get("registers")) for k, v in stats.items()
                    if "tree_attention" in k[0] and "_kernel" in k[0])
    print("\n".join(f"{a} {n} {r} registers" for a, n, r in report))
