"""Mutation check of the Hopper attention family, run by hand (not by pytest; about 30 minutes):

    python tests/cuda_sim/mutations_hopper.py [NAME ...]

Each mutation edits one csrc header (restored afterwards), rebuilds the simulated _C and runs the
family's simulator tests (tests/ops/test_tree_attention_hopper.py and the hopper cases of
tests/ops/test_tree_attention.py); every one must fail them (a wrong result, a simulator rule or
a deadlock), and the line printed per mutation says how. docs/kernels.md ("Hopper attention
family") lists the outcome. A mutation whose text no longer occurs is reported as stale.
"""
import sys

from mutate import ROOT, run
INC = ROOT / "csrc" / "include" / "jetspec"
H = INC / "attention_hopper.cuh"
A = INC / "attention.cuh"
# name: (file, text in it, what replaces its first occurrence)
MUTS = {
    # too-shallow waits: S read while its QK still runs; O rescaled while P V still writes it
    "qk_wait_too_shallow": (H, "wgmma_wait<1>();  // S_i;", "wgmma_wait<2>();  // S_i;"),
    "pv_wait_too_shallow": (H, "        wgmma_fence_acc(s);\n        wgmma_wait<0>();\n        wgmma_fence_acc(o);\n        wgmma_fence_acc(s);",
                            "        wgmma_fence_acc(s);\n        wgmma_wait<1>();\n        wgmma_fence_acc(o);\n        wgmma_fence_acc(s);"),
    "no_prologue_wait": (H, "        pp_arrive(nblk == 1);\n        wgmma_wait<0>();", "        pp_arrive(nblk == 1);"),
    "no_epilogue_wait": (H, "        if constexpr (!kNoPv) issue_pv(tV);\n        wgmma_wait<0>();\n        wgmma_fence_acc(o);\n        mbar_arrive(&v_empty[(nblk - 1) % S]);",
                         "        if constexpr (!kNoPv) issue_pv(tV);\n        wgmma_fence_acc(o);\n        mbar_arrive(&v_empty[(nblk - 1) % S]);"),
    # missing barriers
    "no_q_barrier": (H, "    if (wg == 0) {\n      named_barrier_sync(1, kAttnThreads);\n    } else {\n      named_barrier_sync(2, kAttnThreads);\n    }\n", ""),
    "no_tail_barrier": (H, "  fence_proxy_async();\n  named_barrier_sync(kHopperTailBarrier, Cfg::kConsumers);", "  fence_proxy_async();"),
    "no_k_full_wait": (H, "        const unsigned char* tK = stage_of(sK, k_full, i);", "        const unsigned char* tK = sK + (i % S) * kTileBytes;"),
    "no_empty_wait": (H, "      if (lane == 0) mbar_wait(&empty[stage], ((i / S) & 1) ^ 1);\n", ""),
    "no_v_release": (H, "        mbar_arrive(&v_empty[(i - 1) % S]);\n", ""),
    "no_k_release": (H, "        wgmma_fence_acc(s);\n        mbar_arrive(&k_empty[i % S]);\n        float a[2];\n        softmax(masked",
                     "        wgmma_fence_acc(s);\n        float a[2];\n        softmax(masked"),
    "k_release_before_qk_wait": (H, "          wgmma_wait<1>();  // S_i; P_{i-1} V_{i-1} may still run\n        }\n        wgmma_fence_acc(s);\n        mbar_arrive(&k_empty[i % S]);\n",
                                 "          mbar_arrive(&k_empty[i % S]);\n          wgmma_wait<1>();  // S_i; P_{i-1} V_{i-1} may still run\n        }\n        wgmma_fence_acc(s);\n"),
    "no_pingpong_start": (H, "        if (wg == 1) named_barrier_arrive(4, 2 * kAttnThreads);  // warpgroup 0 goes first\n", ""),
    "pingpong_unbalanced": (H, "        } else if (!last) {", "        } else {"),
    "no_q_fence": (H, "    fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it\n    if (wg == 0) {",
                   "    if (wg == 0) {"),
    "setmaxnreg_one_warp": (H, "    if constexpr (Cfg::kRegSplit) warpgroup_reg_dealloc<Cfg::kProducerRegs>();\n    if (threadIdx.x >= kConsumers + 32) return;",
                            "    if (threadIdx.x >= kConsumers + 32) return;\n    if constexpr (Cfg::kRegSplit) warpgroup_reg_dealloc<Cfg::kProducerRegs>();"),
    "half_tx": (H, "static_cast<unsigned>(chunks * KB * chunk * 128)", "static_cast<unsigned>(chunks * KB * chunk * 64)"),
    # wrong mask bits
    "mask_bit_shifted": (H, "__funnelshift_r(w[q], w[q + 1], jbase & 31)", "__funnelshift_r(w[q], w[q + 1], (jbase + 1) & 31)"),
    "causal_off_by_one": (H, "i + 1 : p.n", "i + 2 : p.n"),
    "prefix_off_by_one": (H, "    const int pre = -jbase;", "    const int pre = -jbase + 1;"),
    "no_v_tail_zero": (H, "        if (rows < BN) hopper_zero_v_tail<HD, Cfg>(tV, rows);\n", ""),
    "first_block_never_masked": (H, "        if (t.blk_begin >= t.prefix / BN) {", "        if (false) {"),
    # a skipped final block, a wrong V layout, a wrong split merge
    "skip_final_block": (H, "  const int nblk = t.blk_end - t.blk_begin;", "  const int nblk = max(0, t.blk_end - t.blk_begin - 1);"),
    "v_lbo_wrong": (H, "sw128_desc(tV, BN * 128, kSw128Bytes)", "sw128_desc(tV, kSw128Bytes, kSw128Bytes)"),
    "merge_unweighted": (A, "acc += expf(ls - m) * p.partial_o[(s * rows + row) * hd + d];", "acc += p.partial_o[(s * rows + row) * hd + d];"),
}


def main(names) -> int:
    return run(MUTS, ["tests/ops/test_tree_attention_hopper.py", "tests/ops/test_tree_attention.py",
                      "-k", "sim and hopper"], names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
