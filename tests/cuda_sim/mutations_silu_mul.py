"""Mutation check of the cuda silu_mul kernel, run by hand (not by pytest; about 8 minutes):

    python tests/cuda_sim/mutations_silu_mul.py [NAME ...]

Each mutation edits silu_mul.cuh (restored afterwards), rebuilds the simulated _C and runs
tests/test_cuda_silu_mul.py; every one must fail it (a wrong result, a write outside out, a
simulator rule such as a misaligned 16-byte access or a missing PDL wait).
"""
import sys

from mutate import ROOT, run
K = ROOT / "csrc" / "include" / "jetspec" / "silu_mul.cuh"
# name: (file, text in it, what replaces its first occurrence)
MUTS = {
    # up read from the wrong place: units for elements (same on the scalar path), half the row
    # stride (same for contiguous rows)
    "up_offset_in_units": (K, "gate + p.inner);", "gate + n);"),
    "up_offset_half_stride": (K, "gate + p.inner);", "gate + p.x_row_stride / 2);"),
    # s used before its rounding to the dtype
    "s_not_rounded": (K, "to_float(from_float<T>(s))", "s"),
    # the tail: a unit past the end stored; I's tail elements never covered by 16-byte units
    "store_mask_past_end": (K, "if (fi < total) *as_units", "if (fi <= total) *as_units"),
    "vector_ignores_I": (K, "rows_aligned16(p.x, eb, p.inner, {p.x_row_stride}) &&\n"
                            "                   rows_aligned16(p.out, eb, p.inner, {});",
                         "rows_aligned16(p.x, eb, 8, {p.x_row_stride}) &&\n"
                         "                   rows_aligned16(p.out, eb, 8, {});"),
    # the 16-byte path taken for rows off 16 bytes: the row stride, x's start, out's start
    "vector_ignores_stride": (K, "rows_aligned16(p.x, eb, p.inner, {p.x_row_stride})",
                              "rows_aligned16(p.x, eb, p.inner, {})"),
    "vector_ignores_x_start": (K, "rows_aligned16(p.x, eb, p.inner, {p.x_row_stride})",
                               "rows_aligned16(p.out, eb, p.inner, {p.x_row_stride})"),
    "vector_ignores_out": (K, " &&\n                   rows_aligned16(p.out, eb, p.inner, {});", ";"),
    # a thread's later units: the carry into the next row
    "column_carry_late": (K, "if (col >= n) {", "if (col > n) {"),
    "no_row_step": (K, "    row += dr;\n", ""),
    # no griddepcontrol.wait: reads before the previous kernel finished
    "no_pdl_wait": (K, "  pdl_begin();\n  constexpr int E", "  constexpr int E"),
}


def main(names) -> int:
    return run(MUTS, ["tests/test_cuda_silu_mul.py"], names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
