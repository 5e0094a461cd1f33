"""Mutation check of the TMA attention kernel, run by hand (not by pytest; about 10 minutes):

    python tests/cuda_sim/mutations_tma.py [NAME ...]

Each mutation edits csrc/include/jetspec/attention_tma.cuh (restored afterwards), rebuilds the
simulated _C and runs the kernel's simulator tests; every one must fail them (a wrong result, a
simulator rule, or a deadlock), and the line printed per mutation says how. bench/NOTES.md lists
the outcome. A mutation whose text no longer occurs in the kernel is reported as stale.
"""
import sys

from mutate import ROOT, run
F = ROOT / "csrc" / "include" / "jetspec" / "attention_tma.cuh"
# The K stage of block i + 1, computed without waiting for its copies.
STAGE = "kr.tiles + ((i + 1) % S) * kWgmmaBlockN * HD * 2"
# name: (text in the kernel, what replaces its first occurrence)
MUTS = {
 "no_v_full_wait": ("    unsigned char* tV = tma_wait_stage<HD, S>(vr, i);", "    unsigned char* tV = vr.tiles + (i % S) * kWgmmaBlockN * HD * 2;"),
 "no_k_full_wait": ("wgmma_issue_qk<T, HD>(s_next, sQ, tma_wait_stage<HD, S>(kr, i + 1));", f"wgmma_issue_qk<T, HD>(s_next, sQ, {STAGE});"),
 "no_empty_wait": ("  mbar_wait(&r.empty[stage], ((i / S) & 1) ^ 1);\n", ""),
 "parity_swapped": ("  mbar_wait(&r.full[i % S], (i / S) & 1);", "  mbar_wait(&r.full[i % S], ((i / S) & 1) ^ 1);"),
 "no_v_release": ("    wgmma_fence_output<HD>(o);\n    tma_release_stage<S>(vr, i);\n", "    wgmma_fence_output<HD>(o);\n"),
 "no_k_release": ("    tma_release_stage<S>(kr, i);  // K_blk is read by S_blk only\n", ""),
 "release_k_of_next": ("    tma_release_stage<S>(kr, i);  // K_blk is read by S_blk only", "    tma_release_stage<S>(kr, i + 1);"),
 "v_release_before_pv_wait": ("    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n    wgmma_wait<0>();\n    wgmma_fence_output<HD>(o);\n    tma_release_stage<S>(vr, i);\n", "    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n    tma_release_stage<S>(vr, i);\n    wgmma_wait<0>();\n    wgmma_fence_output<HD>(o);\n"),
 "pv_wait_1": ("    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n    wgmma_wait<0>();", "    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n    wgmma_wait<1>();"),
 "no_prologue_wait": ("    wgmma_issue_qk<T, HD>(sa, sQ, tma_wait_stage<HD, S>(kr, 0));\n    wgmma_wait<0>();", "    wgmma_issue_qk<T, HD>(sa, sQ, tma_wait_stage<HD, S>(kr, 0));"),
 "no_pv_wait": ("    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n    wgmma_wait<0>();\n", "    wgmma_issue_pv<T, HD>(o, s_cur, tV);\n"),
 "buffers_not_swapped": ("tma_consume_block<T, HD, WGS>(p, t, blk + 1, i + 1, sQ, kr, vr, sb, sa,", "tma_consume_block<T, HD, WGS>(p, t, blk + 1, i + 1, sQ, kr, vr, sa, sb,"),
 "half_tx": ("static_cast<unsigned>(chunks * chunk * 128 * KB)", "static_cast<unsigned>(chunks * chunk * 64 * KB)"),
 "double_tx": ("static_cast<unsigned>(chunks * chunk * 128 * KB)", "static_cast<unsigned>(chunks * chunk * 256 * KB)"),
 "no_v_tail_zero": ("    if (t.len - blk * BN < BN) attn_zero_v_tail<HD, WGS>(tV, t.len - blk * BN);\n", ""),
 "no_tail_barrier": ("  fence_proxy_async();\n  named_barrier_sync(kTailBarrier<WGS>, WGS * kAttnThreads);\n}\n\n// One consumer", "  fence_proxy_async();\n}\n\n// One consumer"),
 "no_tail_fence": ("  fence_proxy_async();\n  named_barrier_sync(kTailBarrier<WGS>, WGS * kAttnThreads);\n}\n\n// One consumer", "  named_barrier_sync(kTailBarrier<WGS>, WGS * kAttnThreads);\n}\n\n// One consumer"),
 "no_q_fence": ("  fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it\n  if (wg", "  if (wg"),
 "no_q_barrier": ("    named_barrier_sync(1, kAttnThreads);\n  } else {\n    named_barrier_sync(2, kAttnThreads);\n", "  } else {\n"),
 "chunk_64_paged": ("  if (p.block_table == nullptr) return block_n;", "  return block_n;"),
 "empty_count_one_warpgroup": ("      mbar_init(&kr.empty[s], kConsumers);", "      mbar_init(&kr.empty[s], kAttnThreads);"),
 "tail_barrier_one_warpgroup": ("  named_barrier_sync(kTailBarrier<WGS>, WGS * kAttnThreads);", "  named_barrier_sync(kTailBarrier<WGS>, kAttnThreads);"),
 "shared_q_slab": ("  unsigned char* sQ = sQs + wg * kQBytes;", "  unsigned char* sQ = sQs;"),
 "no_init_sync": ("    mbar_init_fence();\n  }\n  __syncthreads();\n", "    mbar_init_fence();\n  }\n"),
}


def main(names) -> int:
    muts = {name: (F, a, b) for name, (a, b) in MUTS.items()}
    return run(muts, ["tests/ops/test_tree_attention.py", "-k", "sim and tma"], names, 900)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
