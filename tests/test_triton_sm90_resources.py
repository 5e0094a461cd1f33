"""Every Triton kernel compiles for sm_90a as the backend launches it on a GPU (bf16 included,
which the interpreter cannot run), without register spills and within the shared memory an sm_90
block may use. bench/triton_resources.py does the compiling, offline; no GPU is needed."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every @triton.jit kernel a backend op launches.
KERNELS = {
    "_tree_attention_fwd", "_merge_splits", "_logits_partial_kernel", "_merge_kernel",
    "_hidden_partial_kernel", "_tree_kernel", "_pack_mask_kernel", "_target_partial_kernel",
    "_walk_kernel", "_filter_kernel", "_qk_norm_rope_append_kernel", "_commit_kv_kernel",
    "_gather_hidden_kernel", "_rms_norm_one_pass", "_rms_norm_two_pass", "_silu_mul",
    "_exact_fwd", "_exact_combine", "_fixed_tile_matmul", "_grouped_fixed_tile_matmul",
    "_gated_delta_rows", "_gated_delta_solve", "_sum_parts_pairwise",
    "_walk", "_prep", "_zc_norm_rows", "_gated_norm_rows", "_sigmoid_gate", "_route_rows",
}
# float64 sin/cos (python_ref's RoPE convention) keeps libdevice's argument-reduction buffer on
# the stack: a frame, not a spill (ptxas reports 0 spill bytes for it).
STACK_ALLOWED = {"_qk_norm_rope_append_kernel": 48}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its CUDA backend")
    tmp = tmp_path_factory.mktemp("sm90")
    out = tmp / "resources.csv"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "triton_resources.py"),
                           "--csv", str(out), "--ptx-dir", str(tmp / "ptx")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out) as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows):
        r["ptx"] = (tmp / "ptx" / f"{i}_{r['kernel']}.ptx").read_text()
    return rows


def test_every_kernel_compiled(rows):
    assert {r["kernel"] for r in rows} == KERNELS


def test_no_spills_and_shared_memory_fits(rows):
    bad = [r for r in rows
           if int(r["spill_stores"]) or int(r["spill_loads"])
           or int(r["stack"]) > STACK_ALLOWED.get(r["kernel"], 0)
           or int(r["shared"]) > 227 * 1024 or int(r["registers"]) > 255]
    assert not bad, "\n".join(f"{r['case']}: {r['kernel']} regs {r['registers']} stack "
                              f"{r['stack']} spills {r['spill_stores']}/{r['spill_loads']} "
                              f"shared {r['shared']}" for r in bad)


def test_correctly_rounded_division_where_the_contract_needs_it(rows):
    """silu_mul's contract window (DESIGN.md section 4) needs silu's division correctly rounded:
    its kernel's PTX divides with div.rn.f32 (tl.math.div_rn) and has no approximate division,
    which the interpreter (numpy's exact division) could never show."""
    ptx = [r["ptx"] for r in rows if r["kernel"] == "_silu_mul"]
    assert ptx
    for text in ptx:
        assert "div.rn.f32" in text
        assert "div.full.f32" not in text and "div.approx" not in text


def test_every_narrowing_conversion_rounds_to_nearest(rows):
    """Each conversion to a narrower float in every kernel (f32 -> bf16 / fp16, f64 -> f32, and
    any other float target) is plain round-to-nearest-even, one of the five forms in ``ok``: no
    truncation (rz), no saturation (sat, satfinite: inf would become the max), no relu, no
    flush to zero. The contracts round that way, and the Triton interpreter, which truncates
    float32 -> bfloat16 itself, cannot check it on the CPU."""
    import re
    # a cvt whose destination is a float type and whose source is a wider float
    narrowing = re.compile(r"cvt((?:\.[a-z0-9]+)*)\.(bf16x2|f16x2|bf16|f16|tf32|e4m3x2|e5m2x2|"
                           r"e4m3|e5m2|f32)\.(f32|f64)\b")
    ok = {"cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "cvt.rn.bf16.f32", "cvt.rn.f16.f32",
          "cvt.rn.f32.f64"}
    bad = []
    for r in rows:
        for m in narrowing.finditer(r["ptx"]):
            text = m.group(0)
            if m.group(2) == "f32" and m.group(3) == "f32":
                continue                          # f32 -> f32: a rounding to an integer value
            if text not in ok:
                bad.append(f"{r['case']}: {r['kernel']}: {text}")
    assert not bad, "\n".join(sorted(set(bad)))
    assert any("cvt.rn.bf16x2.f32" in r["ptx"] for r in rows)
    for planted in ("cvt.rz.bf16.f32", "cvt.rn.satfinite.bf16x2.f32", "cvt.rn.relu.bf16x2.f32",
                    "cvt.rn.sat.f16.f32", "cvt.rn.ftz.f32.f64", "cvt.rz.f16x2.f32"):
        m = narrowing.search(planted + " %r1, %f1;")
        assert m is not None and m.group(0) not in ok, planted


def test_rms_norm_contracts_no_multiply_into_an_add(rows):
    """The norm's two compiled forms (with and without the residual add) must do one row's
    arithmetic alike (the exact mode meets both): compiled without FMA contraction, so no
    fma.rn in their PTX (the interpreter cannot show it)."""
    ptx = [r["ptx"] for r in rows if r["kernel"] in ("_rms_norm_one_pass", "_rms_norm_two_pass")]
    assert ptx
    for text in ptx:
        assert "fma.rn.f32" not in text
