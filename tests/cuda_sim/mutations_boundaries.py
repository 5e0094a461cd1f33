"""Mutation check of the elementwise kernels' loop boundaries and of the sampling filter's mass
budget, against each op's own test file (run by hand, not by pytest):

    python tests/cuda_sim/mutations_boundaries.py [NAME ...]

Each mutation edits one header (restored afterwards), rebuilds the simulated _C and runs the
simulator cases of the file a developer runs first for that kernel (CONTRIBUTING's "Tests by
file"); every one must fail it: a carry into the next row off by one at exactly the row's end, a
loop that stops a unit short or runs one past, a budget rounded the wrong way.
"""
import sys

from mutate import ROOT, run

H = ROOT / "csrc" / "include" / "jetspec"
SILU, NORM, COMMIT, ROPE, VERIFY = (H / f for f in ("silu_mul.cuh", "rms_norm.cuh", "commit_kv.cuh",
                                                    "qk_norm_rope_append.cuh", "verify_tree.cuh"))
# name: (file, text in it, what replaces its first occurrence, the test file that must fail)
MUTS = {
    # silu_mul: the carry of a thread's next unit into the next row
    "silu_carry_late": (SILU, "if (col >= n) {", "if (col > n) {", "tests/ops/test_silu_mul.py"),
    "silu_no_row_step": (SILU, "    row += dr;\n", "", "tests/ops/test_silu_mul.py"),
    "silu_store_past_end": (SILU, "if (fi < total) *as_units", "if (fi <= total) *as_units",
                            "tests/ops/test_silu_mul.py"),
    # rms_norm: the last row of a block, the units past a row's registers, the register guard
    "norm_row_past_end": (NORM, "if (row >= p.rows) return;", "if (row > p.rows) return;",
                          "tests/ops/test_rms_norm.py"),
    "norm_tail_recounts_a_pass": (NORM, "for (int u = lane + kItems * RowThreads; u < units; "
                                        "u += RowThreads)\n    ss +=",
                                  "for (int u = lane + (kItems - 1) * RowThreads; u < units; "
                                  "u += RowThreads)\n    ss +=", "tests/ops/test_rms_norm.py"),
    "norm_tail_store_past_row": (NORM, "for (int u = lane + kItems * RowThreads; u < units; "
                                       "u += RowThreads) {",
                                 "for (int u = lane + kItems * RowThreads; u <= units; "
                                 "u += RowThreads) {", "tests/ops/test_rms_norm.py"),
    "norm_register_guard": (NORM, "if (u < units) {\n      hv[i] = sum_unit",
                            "if (u <= units) {\n      hv[i] = sum_unit", "tests/ops/test_rms_norm.py"),
    # commit_kv: a slot row's units past the 64 blocks' threads, the gather's units past a block
    "commit_row_one_past": (COMMIT, "e < row; e += gridDim.y", "e <= row; e += gridDim.y",
                            "tests/ops/test_commit_kv.py"),
    "commit_stride_skips": (COMMIT, "e += gridDim.y * blockDim.x", "e += (gridDim.y + 1) * blockDim.x",
                            "tests/ops/test_commit_kv.py"),
    "gather_stride_skips": (COMMIT, "e < units; e += blockDim.x", "e < units; e += 2 * blockDim.x",
                            "tests/ops/test_commit_kv.py"),
    # qk_norm_rope_append: a warp's head group, the pairs of a head, the block's spare warps
    "rope_group_short": (ROPE, "min(heads, (group + 1) * kRopeHeadsPerWarp)",
                         "min(heads, (group + 1) * kRopeHeadsPerWarp - 1)",
                         "tests/ops/test_qk_norm_rope_append.py"),
    "rope_groups_rounded_down": (ROPE, "(heads + kRopeHeadsPerWarp - 1) / kRopeHeadsPerWarp",
                                 "(heads + kRopeHeadsPerWarp - 2) / kRopeHeadsPerWarp",
                                 "tests/ops/test_qk_norm_rope_append.py"),
    "rope_pair_past_half": (ROPE, "if (i >= rhalf) break;", "if (i > rhalf) break;",
                            "tests/ops/test_qk_norm_rope_append.py"),
    "rope_spare_warp": (ROPE, "if (wid >= total) return;", "if (wid > total) return;",
                        "tests/ops/test_qk_norm_rope_append.py"),
    # the top-p budget rounded down, or up where it is an integer; the tie count at the budget
    "budget_floor": (VERIFY, "  if (static_cast<double>(need) < budget) ++need;\n", "",
                     "tests/test_sampling_filters.py"),
    "budget_up_when_exact": (VERIFY, "if (static_cast<double>(need) < budget) ++need;",
                             "if (static_cast<double>(need) <= budget) ++need;",
                             "tests/test_sampling_filters.py"),
    "ties_kept_one_more": (VERIFY, "(s.target - s.above_mass - 1) / q + 1",
                           "(s.target - s.above_mass) / q + 1", "tests/test_sampling_filters.py"),
}


def main(names) -> int:
    failed = 0
    for name in names or list(MUTS):
        path, a, b, tests = MUTS[name]
        failed |= run({name: (path, a, b)}, [tests, "-k", "sim"])
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
