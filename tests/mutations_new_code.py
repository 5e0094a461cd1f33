"""The planted-bug campaign on the exact mode, the hybrid-target ops and the compile path, run by
hand (not by pytest):

    PYTHONPATH=. python tests/mutations_new_code.py [NAME ...] [--list] [--timeout 1800]

Each mutation is (file, exact old text, new text, the tests to run): applied alone, the tests run
with ``pytest -x -q`` in one process (tests/fuzz/mutate.py's ``run_one``), the file restored
whatever happens (try/finally, Ctrl-C included). One line per mutation: caught or SURVIVED, wall
and CPU seconds (this process's children), then the caught / total count. A mutation whose old
text is no longer in its file is reported as BAD-PATCH (stale). A file with uncommitted changes
is refused before anything is planted, so a restored file is the committed one.

The tests of a mutation are those a developer runs for the file it changes (CONTRIBUTING.md,
"Tests by file"; tests/MUTATIONS_NEW_CODE.md says how each selection was chosen and which test
caught each mutation before and after the campaign).
"""
from __future__ import annotations

import argparse
import resource
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
from mutate import ROOT, run_one  # noqa: E402

# ---------------------------------------------------------------- test selections, per file

EXACT = ["tests/test_exact_ops.py", "tests/test_exact_triton.py", "tests/test_exact_decode.py"]
EXACT_MATMUL = ["tests/test_exact_triton.py"]
# ops/tree_attention.py's row (generated table); no test there passed exact=True before this
# campaign, so -k exact drops no test that reaches the exact path
TREE_ATTENTION_EXACT = ["tests/ops/test_tree_attention.py", "tests/ops/test_graph_capture.py",
                        "tests/ops/test_int_dtypes.py", "-k", "exact"]
# python_ref/tree_attention.py's row (run-first table); in the op and fuzz files only the exact tests
# reach tree_attention_logical
REF_ATTENTION_LOGICAL = ["tests/test_ref_tree_attention.py", "tests/ops/test_tree_attention.py",
                         "tests/fuzz/test_fuzz.py", "-k", "test_ref_tree_attention or exact"]
QWEN3_EXACT = ["tests/test_exact_decode.py", "tests/test_models_qwen3.py"]
DECODE_EXACT = ["tests/test_exact_decode.py", "tests/test_decode.py"]
GD_TREE = ["tests/ops/test_gated_delta_tree.py"]
GD_COMMIT = ["tests/ops/test_gated_delta_commit.py"]
GD_OPS = ["tests/ops/test_gated_delta_tree.py", "tests/ops/test_gated_delta_commit.py"]
CONV_TREE = ["tests/ops/test_causal_conv1d_tree.py"]
CONV_COMMIT = ["tests/ops/test_causal_conv1d_commit.py"]
HYBRID_MODEL = ["tests/test_models_qwen3_5.py", "tests/test_decode_hybrid.py"]
CUSTOM_OP = ["tests/test_host_overhead.py", "tests/ops/test_every_op.py", "tests/test_op_dispatch.py"]
# The fakes: test_compile.py (the compile path's scope) and the opcheck of test_every_op.py; the
# jetspec_ref ops run in the tests that are not on the cuda backend, the jetspec ops (cuda) in
# those that are, or that opcheck
REFERENCE_FAKES = ["tests/test_compile.py", "-k", "not cuda"]
CUDA_FAKES = ["tests/ops/test_every_op.py", "tests/test_compile.py", "-k", "opcheck or cuda"]

# The second round (triton/exact_attention.py, attention_steps.py, exact_matmul.py's grouped
# GEMM, models/moe.py's exact MoE, ops/exact.py's forward_scope and sum_in_order): CONTRIBUTING's
# rows for them less test_exact_decode.py (its triton tests take 8.5 min here; each of its exact
# properties is also asked by a faster test of the files kept), test_triton_sm90_resources.py
# (register counts, not values) and test_tp.py (ranks in subprocesses). -k "exact" keeps every
# test of test_exact_*.py and fuzz/test_fuzz.py's exact properties; ops/test_tree_attention.py's
# triton tests (attention_steps) are kept by "triton and not test_fuzz".
EXACT_TRITON = ["tests/test_exact_triton.py", "tests/test_exact_ops.py", "tests/fuzz/test_fuzz.py",
                "-k", "exact"]
ATTN_TRITON = ["tests/test_exact_triton.py", "tests/test_exact_ops.py", "tests/ops/test_tree_attention.py",
               "tests/fuzz/test_fuzz.py", "-k", "exact or (triton and not test_fuzz)"]
# models/moe.py: the models/** row's MoE file (route_logits is the normal block's too) and row 360
MOE = ["tests/test_exact_triton.py", "tests/test_exact_ops.py", "tests/fuzz/test_fuzz.py",
       "tests/test_models_qwen3_moe.py", "-k", "exact or moe"]
EXACT_FAST = ["tests/test_exact_triton.py", "tests/test_exact_ops.py", "tests/fuzz/test_fuzz.py",
              "-k", "exact"]

EXACT_PY = "jetspec_kernels/ops/exact.py"
GDT = "jetspec_kernels/triton/gated_delta_tree.py"
GDC = "jetspec_kernels/triton/gated_delta_commit.py"
CCT = "jetspec_kernels/triton/causal_conv1d_tree.py"
CCC = "jetspec_kernels/triton/causal_conv1d_commit.py"
CUSTOM_OP_PY = "jetspec_kernels/cuda/custom_op.py"
REFERENCE_PY = "jetspec_kernels/ops/_reference.py"
EXACT_ATT = "jetspec_kernels/triton/exact_attention.py"
STEPS = "jetspec_kernels/triton/attention_steps.py"
EXACT_MM = "jetspec_kernels/triton/exact_matmul.py"
MOE_PY = "jetspec_kernels/models/moe.py"
QWEN3_PY = "jetspec_kernels/models/qwen3.py"
TP_PY = "jetspec_kernels/tp.py"
# The third round (exact_k_parts: tp t == tp 1): the files' rows, narrowed to the tests that
# reach the new code (-k), since each row's full selection takes minutes here
K_PARTS_TRITON = ["tests/test_exact_triton.py", "-k", "k_parts or tree_kernel"]
K_PARTS_OPS = ["tests/test_exact_ops.py", "-k", "pairwise or parts"]
K_PARTS_OPS_MOE = ["tests/test_exact_ops.py", "-k", "moe_in_k_parts"]
K_PARTS_MODEL = ["tests/test_exact_decode.py", "-k", "k_parts"]
K_PARTS_TP = ["tests/test_tp.py", "-k", "k_parts"]
# The fourth round (the hybrids' exact mode): the new test files, narrowed (-k) to the engine a
# mutation touches (the triton model tests take minutes under the interpreter)
HYB = "jetspec_kernels/models/hybrid_exact.py"
EGD = "jetspec_kernels/triton/exact_gated_delta.py"
Q35 = "jetspec_kernels/models/qwen3_5.py"
HYB_REF = ["tests/test_exact_hybrid.py", "-k", "not triton"]
HYB_TP = ["tests/test_tp_hybrid.py", "-k", "exact"]
EGD_TESTS = ["tests/test_exact_gated_delta_triton.py"]
# The fifth round (the walk depth first from a plan): the plan's own test file and the kernel's
PLAN = "jetspec_kernels/models/walk_plan.py"
PLAN_TESTS = ["tests/test_walk_plan.py", "tests/test_exact_gated_delta_triton.py"]
HYB_TRITON = ["tests/test_exact_hybrid.py", "-k", "triton"]
# The exact MoE routing kernel: its own tests, then the MoE block's on triton
ROUTE = "jetspec_kernels/triton/exact_route.py"
ROUTE_TESTS = ["tests/test_exact_triton.py", "-k", "routing or routes or moe"]

# name: (class, file, old, new, tests)
MUTATIONS = {
    # ------------------------------------------------------------ the exact mode
    "exact_backend_lets_cuda_through": (
        "exact mode silently on a path not shown invariant", EXACT_PY,
        "if gpu not in shown and os.environ.get(UNVERIFIED_ENV) != \"1\":",
        "if not shown and os.environ.get(UNVERIFIED_ENV) != \"1\":",
        EXACT),
    "per_row_other_rows_from_row_0": (
        "a row reads its neighbour", EXACT_PY,
        "*(o[r:r + 1].clone() for o in split)", "*(o[:1].clone() for o in split)", EXACT),
    "exact_append_pages_of_sequence_0": (
        "cache slot of the wrong sequence (paged)", EXACT_PY,
        "table = None if block_table is None else block_table[s:s + 1]",
        "table = None if block_table is None else block_table[:1]", EXACT),
    "sample_key_root_position_for_every_node": (
        "sampling key missing a component (the node's position)", EXACT_PY,
        "seed, positions[:, i].to(torch.int64)", "seed, positions[:, 0].to(torch.int64)", EXACT),
    "sample_key_first_sequence_seed": (
        "sampling key missing a component (the sequence's seed)", EXACT_PY,
        "temperature, seed, positions[:, i]", "temperature, seed[:1].expand_as(seed), positions[:, i]",
        EXACT),
    "exact_matmul_grid_one_short": (
        "off-by-one at a limit (grid)", "jetspec_kernels/triton/exact_matmul.py",
        "grid = (cdiv(rows.shape[0], bm), cdiv(n, bn), parts)",
        "grid = (cdiv(rows.shape[0] - 1, bm), cdiv(n, bn), parts)", EXACT_MATMUL),
    "exact_matmul_tile_chosen_by_rows": (
        "a launch choice made from M (the GEMM tile)", "jetspec_kernels/triton/exact_matmul.py",
        "bm, bn, bk, warps, stages = tiles(x.dtype, tile)",
        "bm, bn, bk, warps, stages = tiles(x.dtype, \"wide\" if x.numel() > 8 * x.shape[-1] else tile)",
        EXACT_MATMUL),
    "exact_attention_lse_not_written": (
        "an output not written back on one path", "jetspec_kernels/ops/tree_attention.py",
        '    name = exact_backend("tree_attention", q.device, backend)\n'
        "    return_lse = return_lse or lse is not None\n",
        '    name = exact_backend("tree_attention", q.device, backend)\n', TREE_ATTENTION_EXACT),
    "exact_triton_rows_values_from_keys": (
        "swapped operand (V gathered from the K cache)", "jetspec_kernels/triton/exact_attention.py",
        "acc2, m2, l2 = attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off,",
        "acc2, m2, l2 = attend_block(acc, m_i, l_i, q, k_ptr, k_ptr, k_off, k_off,", ATTN_TRITON),
    "logical_rows_ignore_the_tree_mask": (
        "wrong mask/ancestor condition", "python_ref/tree_attention.py",
        "yield (b, i, keys[slots].reshape(1, length, Hkv, Dh)",
        "yield (b, i, keys[:length].reshape(1, length, Hkv, Dh)",
        REF_ATTENTION_LOGICAL),
    "qwen3_exact_attention_not_exact": (
        "exact mode silently falling back to the non-exact path", "jetspec_kernels/models/qwen3.py",
        "block_table=cache.block_table, exact=True, backend=be)",
        "block_table=cache.block_table, backend=be)", QWEN3_EXACT),
    "generate_ar_exact_key_one_position_late": (
        "off-by-one (sampling key position)", "jetspec_kernels/decode/loop.py",
        "token = sample_at_positions(logits[:, None], prefix[:, None], seed_t,",
        "token = sample_at_positions(logits[:, None], prefix[:, None] + 1, seed_t,", DECODE_EXACT),
    # ------------------------------------------------------------ hybrid ops: Triton kernels
    "gd_tree_one_jacobi_sweep_short": (
        "off-by-one at a limit (triangular solve sweeps)", GDT,
        "for _ in range(1, depth):", "for _ in range(2, depth):", GD_TREE),
    "gd_tree_interleaved_gqa_heads": (
        "wrong head mapping (GQA)", GDT,
        "    h = hv // H_PER\n    num = tl.load(num_ptr + b)\n    q_b",
        "    h = hv % H_PER\n    num = tl.load(num_ptr + b)\n    q_b", GD_TREE),
    "gd_tree_state_slot_ignored": (
        "cache/state slot ignored", GDT,
        "state_ptr + slot * state_slot_stride", "state_ptr + b * state_slot_stride",
        GD_TREE),
    "gd_tree_padding_row_valid": (
        "a check comparing the wrong side of a limit (num_nodes)", GDT,
        "        rvalid = rows < num\n", "        rvalid = rows <= num\n", GD_TREE),
    "gd_commit_last_node_not_applied": (
        "off-by-one at a limit (accept_len)", GDC,
        "steps = tl.minimum(tl.load(accept_ptr + b), P - 1) + 1",
        "steps = tl.minimum(tl.load(accept_ptr + b), P - 1)", GD_COMMIT),
    "gd_commit_decay_after_read": (
        "wrong order of a recurrence step", GDC,
        "        s = s * tl.exp(g)\n        delta = (v - tl.sum(s * k[:, None], 0)) * beta\n"
        "        s = s + k[:, None] * delta[None, :]",
        "        delta = (v - tl.sum(s * k[:, None], 0)) * beta\n"
        "        s = s * tl.exp(g) + k[:, None] * delta[None, :]", GD_COMMIT),
    # (planted first: ``up <= 0`` for ``up < 0`` in the step past the tree, an equivalent
    # mutation: the step into node 0 stays inside the tree and recomputes the count; see
    # tests/MUTATIONS_NEW_CODE.md)
    "conv_tree_state_column_off_by_one": (
        "cache slot off by one (conv state column)", CCT,
        "sv = tl.load(state_row + tl.maximum(W - 1 - beyond, 0)",
        "sv = tl.load(state_row + tl.maximum(W - 2 - beyond, 0)", CONV_TREE),
    "conv_commit_state_boundary": (
        "a check comparing the wrong side of a limit", CCC,
        "from_state = (cols * 0 + src) < W - 1", "from_state = (cols * 0 + src) <= W - 1", CONV_COMMIT),
    # ------------------------------------------------------------ hybrid ops: argument checks
    "gd_tree_checks_a_padding_row_parent": (
        "a check comparing the wrong side of a limit (num_nodes)", "jetspec_kernels/checks.py",
        "valid = idx[None, :] < (n if num_nodes is None else num_nodes[:, None])",
        "valid = idx[None, :] <= (n if num_nodes is None else num_nodes[:, None])", GD_OPS),
    "gd_commit_last_path_entry_unchecked": (
        "off-by-one at a limit (accept_len)", "jetspec_kernels/ops/gated_delta_commit.py",
        "live = torch.arange(p, device=path.device)[None, :] <= accept_len[:, None]",
        "live = torch.arange(p, device=path.device)[None, :] < accept_len[:, None]", GD_OPS),
    # ------------------------------------------------------------ hybrid model and cache
    "hybrid_verify_kv_at_positions": (
        "cache slot off (siblings share a slot)", "jetspec_kernels/models/qwen3_5.py",
        "write_start=prefix_lens, tree_mask=tree.mask,", "write_start=None, tree_mask=tree.mask,",
        HYBRID_MODEL),
    "hybrid_prefill_conv_state_one_early": (
        "cache slot off by one (conv state)", "jetspec_kernels/models/gated_delta.py",
        "keep = lens.long()[:, None] + torch.arange(width - 1, device=dev)",
        "keep = lens.long()[:, None] - 1 + torch.arange(width - 1, device=dev)", HYBRID_MODEL),
    "hybrid_commit_conv_state_not_written": (
        "a state not written back on one path", "jetspec_kernels/models/gated_delta.py",
        "    causal_conv1d_commit(kept.mixed, path, accept_len, conv_pool, state_slots=slots)\n", "",
        HYBRID_MODEL),
    # ------------------------------------------------------------ the compile path
    "fast_path_while_compiling": (
        "eager fast path taken while tracing", CUSTOM_OP_PY,
        "if not _FAST or torch.compiler.is_compiling():", "if not _FAST:", CUSTOM_OP),
    "fast_path_skips_version_bump": (
        "a state not written back (version counter)", CUSTOM_OP_PY,
        "if args[i] is not None and not args[i].is_inference():",
        "if args[i] is not None and args[i].is_inference():", CUSTOM_OP),
    "fast_path_under_torch_function_mode": (
        "a check missing one case (torch-function modes)", CUSTOM_OP_PY,
        "if (_C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()",
        "if (_C._len_torch_dispatch_stack()", CUSTOM_OP),
    "build_tree_fake_mask_one_word_short": (
        "fake returning the wrong shape (off by one)", REFERENCE_PY,
        "topk_tokens.new_empty(b, budget, mask_words(budget), dtype=_I32)",
        "topk_tokens.new_empty(b, budget, mask_words(budget - 1), dtype=_I32)", REFERENCE_FAKES),
    "commit_kv_fake_rows_int32": (
        "fake returning the wrong dtype", REFERENCE_PY,
        "rows = path.new_empty(0) if hidden is None else hidden.new_empty(",
        "rows = path.new_empty(0) if hidden is None else path.new_empty(", REFERENCE_FAKES),
    "append_fake_keeps_q_strides": (
        "fake returning the wrong strides", "jetspec_kernels/cuda/qk_norm_rope_append.py",
        "return torch.empty_like(q, memory_format=torch.contiguous_format)",
        "return torch.empty_like(q)", CUDA_FAKES),
    # ------------------------------------------------------------ exact mode on triton (second round)
    "ea_tree_shared_blocks_one_past_the_prefix": (
        "the shared-block bound off by one (tree mask)", EXACT_ATT,
        "    if TAIL_MODE == 0:\n        same = prefix\n",
        "    if TAIL_MODE == 0:\n        same = prefix + 1\n", ATTN_TRITON),
    "ea_order_without_the_batch_stride": (
        "wrong stride (a row's tail order of sequence 0's rows)", EXACT_ATT,
        "node = tl.load(order_ptr + (b.to(tl.int64) * N + rr) * N + (t - prefix),",
        "node = tl.load(order_ptr + (b.to(tl.int64) + rr) * N + (t - prefix),", ATTN_TRITON),
    "ea_tree_row_length_causal": (
        "wrong mask condition (a tree row's length as a causal row's)", EXACT_ATT,
        "row_len = prefix + _depths(depth_ptr, b, rr, True, N, TAIL_MODE)",
        "row_len = prefix + rr + 1", ATTN_TRITON),
    "ea_combine_splits_one_short": (
        "off-by-one at a split boundary (combine)", EXACT_ATT,
        "    splits = tl.cdiv(length, SPLIT_KEYS)\n    merge_splits(",
        "    splits = tl.cdiv(length - 1, SPLIT_KEYS)\n    merge_splits(", ATTN_TRITON),
    "ea_no_key_row_not_written": (
        "a value not written on one path (a row with no key)", EXACT_ATT,
        "splits = tl.maximum(tl.cdiv(length, SPLIT_KEYS), 1)",
        "splits = tl.cdiv(length, SPLIT_KEYS)", ATTN_TRITON),
    "ea_memo_keyed_by_shape": (
        "a memo keyed wrongly (a second mask reuses the first's tables)", EXACT_ATT,
        "    hit = memo.get(id(tree_mask))\n    if hit is None or hit[0] is not tree_mask:\n"
        "        hit = memo[id(tree_mask)] = ",
        "    hit = memo.get(tree_mask.shape)\n    if hit is None:\n"
        "        hit = memo[tree_mask.shape] = ", ATTN_TRITON),
    "ea_memo_outlives_its_scope": (
        "a state not restored (the memo kept after the forward)", EXACT_ATT,
        "    finally:\n        _SCOPE.memo = before\n",
        "    finally:\n        _SCOPE.memo = _SCOPE.memo if before is None else before\n", ATTN_TRITON),
    "steps_merge_partials_row_major": (
        "wrong stride (split partials read [rows, S] for [S, rows])", STEPS,
        "row = r.to(tl.int64) + s * rows", "row = r.to(tl.int64) * max_splits + s", ATTN_TRITON),
    "steps_v_head_stride_from_k": (
        "wrong stride (V's head offset from K's strides)", STEPS,
        "v_off = c0 * v_batch_stride + c1 * v_row_stride + kv_head * v_head_stride",
        "v_off = c0 * v_batch_stride + c1 * v_row_stride + kv_head * k_head_stride", ATTN_TRITON),
    # ------------------------------------------------------------ the grouped GEMM and the MoE block
    "expert_tiles_expert_of_a_tile_left": (
        "off-by-one at a limit (a tile at an expert's first tile)", EXACT_MM,
        "expert = torch.searchsorted(tile_end, t, right=True)",
        "expert = torch.searchsorted(tile_end, t)", EXACT_TRITON),
    "grouped_tile_one_row_past_its_count": (
        "a grouped tile's row count off by one", EXACT_MM,
        "        ok = i < count\n", "        ok = i <= count\n", EXACT_TRITON),
    "exact_experts_tiles_of_block_n": (
        "wrong tile size for the plan (BLOCK_N for BLOCK_M)", MOE_PY,
        "plan = expert_tiles(experts, gate_up.shape[0], tiles(x.dtype)[0])",
        "plan = expert_tiles(experts, gate_up.shape[0], tiles(x.dtype)[1])", MOE),
    "exact_moe_triton_ignores_norm_topk_prob": (
        "a flag not passed on one path (renormalised top-k)", MOE_PY,
        "        weights, experts = route_rows(ex.linear(x, router_weight, backend=be), top_k,\n"
        "                                      norm_topk_prob)",
        "        weights, experts = route_rows(ex.linear(x, router_weight, backend=be), top_k,\n"
        "                                      False)", MOE),
    "route_logits_topk_of_the_logits": (
        "swapped operand (top-k weights from the logits, not the probabilities)", MOE_PY,
        "weights, experts = torch.topk(probs, top_k, dim=-1)",
        "weights, experts = torch.topk(logits.float(), top_k, dim=-1)", MOE),
    "sum_in_order_drops_the_last_part": (
        "off-by-one at a limit (the last choice / rank not summed)", EXACT_PY,
        "    for part in parts[1:]:\n", "    for part in parts[1:-1]:\n", EXACT_FAST),
    "forward_scope_inverted": (
        "a check on the wrong side (the memo scope on the reference, not triton)", EXACT_PY,
        '    if backend != "triton":\n        return contextlib.nullcontext()',
        '    if backend == "triton":\n        return contextlib.nullcontext()', EXACT_FAST),
    # ------------------------------------------------------------ exact_k_parts (tp t == tp 1)
    "k_part_starts_at_zero": (
        "wrong offset (every K part reads the first slice)", EXACT_MM,
        "    k_lo = part * K_PART\n    acc = _k_loop(x_ptr, rows * stride_xm",
        "    k_lo = part * 0\n    acc = _k_loop(x_ptr, rows * stride_xm", K_PARTS_TRITON),
    "grouped_k_part_starts_at_zero": (
        "wrong offset (every K part of the grouped GEMM reads the first slice)", EXACT_MM,
        "        k_lo = part * K_PART\n", "        k_lo = part * 0\n", K_PARTS_TRITON),
    "tree_kernel_last_element_unwritten": (
        "off-by-one at a limit (the tree kernel's last element)", EXACT_MM,
        "    ok = offs < numel\n    p = tl.arange(0, PARTS)",
        "    ok = offs < numel - 1\n    p = tl.arange(0, PARTS)", K_PARTS_TRITON),
    "sum_pairwise_left_to_right": (
        "another association (a left-to-right sum for the pairwise tree)", EXACT_PY,
        "        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i]\n"
        "                 for i in range(0, len(level), 2)]",
        "        level = [level[0] + level[1]] + level[2:]", K_PARTS_OPS),
    "reference_parts_all_the_first_slice": (
        "wrong offset (the reference's row slices)", EXACT_PY,
        "F.linear(_fresh(r[:, p * step:(p + 1) * step], torch.float32), w_parts[p])",
        "F.linear(_fresh(r[:, :step], torch.float32), w_parts[p])", K_PARTS_OPS),
    "rank_share_rounded": (
        "a rounding too early (a rank's share rounded before the ranks' sum)", QWEN3_PY,
        "return share_sum(linear(x, w, parts=local, partial=True))",
        "return share_sum(linear(x, w, parts=local, partial=False))", K_PARTS_TP),
    "moe_shares_rounded_before_the_ranks_sum": (
        "a rounding too early (a rank's expert down shares rounded)", MOE_PY,
        "    y = shares.to(x.dtype) if reduce is None else reduce(shares)\n    return ex.sum_in_order(",
        "    y = shares.to(x.dtype) if reduce is None else reduce(shares.to(x.dtype).float())\n"
        "    return ex.sum_in_order(", K_PARTS_OPS_MOE),
    "down_projection_not_in_parts": (
        "a setting not passed on one path (the MLP's down)", QWEN3_PY,
        "return row_linear(act(linear(a, w[\"mlp.gate_up_proj.weight\"])), w[\"mlp.down_proj.weight\"])",
        "return linear(act(linear(a, w[\"mlp.gate_up_proj.weight\"])), w[\"mlp.down_proj.weight\"])",
        K_PARTS_MODEL),
    "k_parts_tp_check_inverted": (
        "a check on the wrong side (tp must divide the parts)", QWEN3_PY,
        "        if parts % size:\n", "        if size % parts:\n", K_PARTS_TP),
    "ranks_summed_left_to_right": (
        "another association (the ranks summed left to right)", TP_PY,
        "    return sum_pairwise(parts, out)",
        "    return torch.stack([p.float() for p in parts]).cumsum(0)[-1].to(out)", K_PARTS_TP),
    # ------------------------------------------------------------ the split gated_delta_tree kernels
    "gd_rows_skips_the_block_before_the_diagonal": (
        "off-by-one at a block boundary (pairs of the previous row block)", GDT,
        "for bj in range(j_lo, tl.minimum(j_lo + JC, bi)):",
        "for bj in range(j_lo, tl.minimum(j_lo + JC, bi - 1)):", GD_TREE),
    "gd_path_sums_strict_ancestors": (
        "wrong ancestor condition (C summed without the node's own g)", GDT,
        "c += tl.sum(tl.where(anc, g_j[None, :], 0.0), 1)",
        "c += tl.sum(tl.where(anc & (cols[None, :] != rows[:, None]), g_j[None, :], 0.0), 1)",
        GD_TREE),
    "gd_diagonal_beta_of_the_column": (
        "swapped operand (beta_j for beta_i in A_II)", GDT,
        "a = tl.where(anc & ~eye, beta_i[:, None] * decay * kk, 0.0)",
        "a = tl.where(anc & ~eye, beta_i[None, :] * decay * kk, 0.0)", GD_TREE),
    "gd_p_ii_without_the_diagonal": (
        "wrong mask (P_II on strict ancestors)", GDT,
        "return t, tl.where(anc, decay * qk, 0.0)", "return t, tl.where(anc & ~eye, decay * qk, 0.0)",
        GD_TREE),
    "gd_rows_pairs_scratch_per_sequence": (
        "scratch layout (pairs per sequence, not per sequence and v-head)", GDT,
        "blk = (bh * NPAIR + bi * (bi + 1) // 2) * (BT * BT)",
        "blk = (b * NPAIR + bi * (bi + 1) // 2) * (BT * BT)", GD_TREE),
    "gd_one_block_qk_transposed": (
        "swapped operands on the one-launch path (K Q^T for Q K^T)", GDT,
        "qk = tl.dot(q_i, tl.trans(k_i), input_precision=PRECISION)",
        "qk = tl.dot(k_i, tl.trans(q_i), input_precision=PRECISION)", GD_TREE),
    # ------------------------------------------------------------ the hybrids' exact mode
    "hyb_node_steps_from_the_committed_state": (
        "wrong parent (a tree node stepped from the root's state)", HYB,
        "S, o[s, i] = _step(root if p < 0 else states[p],", "S, o[s, i] = _step(root,", HYB_REF),
    "hyb_commit_one_step_short": (
        "off-by-one at a limit (the commit replays accept_len steps)", HYB,
        "_reference_walk(k, k, v, g, beta, chain, accept_len + 1,",
        "_reference_walk(k, k, v, g, beta, chain, accept_len,", HYB_REF),
    "hyb_prompt_conv_state_one_back": (
        "off-by-one (the prompt's conv state one input too early)", HYB,
        "keep = lens.long()[:, None] + torch.arange(width - 1, device=dev)",
        "keep = lens.long()[:, None] - 1 + torch.arange(width - 1, device=dev)", HYB_REF),
    "hyb_gates_unpadded": (
        "a row op whose bits follow the row's length (tp)", HYB,
        "    g = lanes(lambda a, a_log, dt:", "    g = (lambda f, *xs: f(*xs))(lambda a, a_log, dt:",
        HYB_TP),
    "hyb_attention_not_exact": (
        "an op of the forward on its normal path", Q35,
        "block_table=cache.block_table, exact=True, backend=be)",
        "block_table=cache.block_table, exact=False, backend=be)", HYB_REF),
    "hyb_row_linear_without_parts": (
        "an engine setting that does not reach a GEMM (exact_k_parts)", Q35,
        "return exact_ops.linear(x, weight, backend=be, parts=local)",
        "return exact_ops.linear(x, weight, backend=be)", HYB_REF),
    "hyb_gated_norm_without_weight": (
        "a dropped operand (the gated norm's weight): a function the exact form agrees with itself on",
        HYB, "return ((weight * normed) * F.silu(z_row.float())).to(dtype)",
        "return (normed * F.silu(z_row.float())).to(dtype)", HYB_REF),
    "hyb_walk_state_of_the_batch_index": (
        "slot of the wrong sequence (the batch index for the slot)", HYB,
        "root = rec_pool[int(slots[s])].clone()[None]", "root = rec_pool[s].clone()[None]", HYB_REF),
    "hyb_commit_operands_of_sequence_0": (
        "a row of the wrong sequence (the commit's gather)", HYB,
        "    rows = torch.arange(b, device=path.device)[:, None]",
        "    rows = torch.zeros(b, 1, dtype=torch.long, device=path.device)", HYB_REF),
    "egd_walk_heads_by_h": (
        "a head map by the wrong count (q/k head hv // H for hv // (Hv / H))", EGD,
        "    h = hv // REP", "    h = hv // H", EGD_TESTS),
    "egd_walk_mode_specialised": (
        "the walk's modes compiled apart (other instructions for a commit than for a tree)", EGD,
        '@triton.jit(do_not_specialize=["N", "HV", "H", "REP", "NSLOTS", "write_out", "store_last"])',
        '@triton.jit(do_not_specialize=["N", "HV", "H", "REP", "NSLOTS"])', EGD_TESTS),
    "egd_walk_parent_is_the_previous_node": (
        "wrong parent (the kept state never read)", EGD,
        "S = tl.where(src == -1, s0, tl.where(src >= 0, other, S))", "S = tl.where(src == -1, s0, S)",
        EGD_TESTS),
    "egd_prep_k_scaled": (
        "a scale on the wrong operand (k scaled as q)", EGD,
        "tl.store(k_ptr + (t * H + hv) * DK + kc, x, mask=kok)",
        "tl.store(k_ptr + (t * H + hv) * DK + kc, x * scale, mask=kok)", EGD_TESTS),
    "egd_row_gate_read_as_a_row_of_gates": (
        "broadcast read as an elementwise operand", EGD,
        "tl.where(G_COLS == 1, 0, c)", "c", EGD_TESTS),
    "egd_walk_store_last_skipped": (
        "an output not written back on one path (the chain's last state)", EGD,
        "    if store_last:\n", "    if store_last and n > 1000:\n", EGD_TESTS),
    # ------------------------------------------------------------ fifth round: the walk plan
    "plan_slot_counts_its_own_branch": (
        "an off-by-one slot (a branch point counted among those above it)", PLAN,
        "slot = torch.where(branch, _sum_where(anc, branch.long()) - branch.long(), -1)",
        "slot = torch.where(branch, _sum_where(anc, branch.long()), -1)", PLAN_TESTS),
    "plan_keeps_every_parent": (
        "every parent kept, not only branch points (the traffic the plan removes)", PLAN,
        "branch = kids[:, 1:] >= 2", "branch = kids[:, 1:] >= 1", PLAN_TESTS),
    "plan_previous_step_never_used": (
        "a child of a single-child node reads a slot its parent never stored", PLAN,
        "src = torch.where(p < 0, -1, torch.where(p == prev, -2, slot.gather(1, p.clamp(min=0))))",
        "src = torch.where(p < 0, -1, slot.gather(1, p.clamp(min=0)))", PLAN_TESTS),
    "egd_walk_prefetches_two_ahead": (
        "the next step's node read one step too far", EGD,
        "nxt = tl.load(order_ptr + b * N + tl.minimum(i + 1, N - 1))",
        "nxt = tl.load(order_ptr + b * N + tl.minimum(i + 2, N - 1))", EGD_TESTS),
    "egd_walk_slot_unbounded": (
        "a slot past the scratch read (out of range) instead of poisoned", EGD,
        "((src >= 0) & (src < NSLOTS)).to(tl.int32)", "(src >= 0).to(tl.int32)", EGD_TESTS),
    "q35_plan_counts_padding": (
        "padding nodes walked as tree nodes (the plan built without num_nodes)", Q35,
        "plan = functools.cache(lambda: tree_plan(parents, num_nodes, max_depth))",
        "plan = functools.cache(lambda: tree_plan(parents, None, max_depth))", HYB_TRITON),
    # from the review of the fifth round
    "egd_walk_scratch_shared_by_heads": (
        "programs of one sequence's v-heads sharing a scratch region (a race on a GPU)", EGD,
        "kept = keep_ptr + (b * HV + hv) * NSLOTS * DK * DV", "kept = keep_ptr + b * NSLOTS * DK * DV",
        EGD_TESTS),
    "plan_reads_the_host": (
        "a host read in the plan (a sync; no graph capture)", PLAN,
        "    jump = par\n", "    jump = torch.tensor(par.tolist(), device=dev)\n", PLAN_TESTS),
    "plan_bound_not_capped_by_n": (
        "the scratch sized by the depth bound past N's", PLAN,
        "bound = min(checks.integer(\"max_depth\", max_depth, lo=0), bound)",
        "bound = checks.integer(\"max_depth\", max_depth, lo=0)", PLAN_TESTS),
    "q35_verify_without_max_depth": (
        "the tree's depth bound not passed (the scratch N's)", Q35,
        "max_depth=tree.max_depth, taps=taps)", "max_depth=None, taps=taps)",
        ["tests/test_exact_hybrid.py", "-k", "depth_bound"]),
    # ------------------------------------------------------------ the exact MoE routing kernel
    "route_rows_ties_to_the_higher_id": (
        "a tie broken the other way (the higher expert id)", ROUTE,
        "pick = tl.min(tl.where(key == best, c, BLOCK), axis=0)",
        "pick = tl.max(tl.where(key == best, c, -1), axis=0)", ROUTE_TESTS),
    "route_rows_choice_not_removed": (
        "a chosen expert left in the running (chosen again)", ROUTE,
        "key = tl.where(c == pick, -2.0, key)", "key = tl.where(c == pick, key, key)", ROUTE_TESTS),
    "route_rows_norm_skips_the_first_choice": (
        "off-by-one in the renormalising sum (the first choice left out)", ROUTE,
        "        total = total + w\n", "        total = total + tl.where(j == 0, 0.0, w)\n",
        ROUTE_TESTS),
    "route_rows_nan_ranked_last": (
        "NaN not propagated as the spec does it (a NaN row routed to ids past E, finite weights)",
        ROUTE, 'key = tl.where(c < E, tl.where(p != p, float("inf"), p), -1.0)',
        "key = tl.where(c < E, p, -1.0)", ROUTE_TESTS),
}


def dirty(files) -> list[str]:
    """The files among ``files`` with uncommitted changes."""
    out = subprocess.run(["git", "status", "--porcelain", "--", *files], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line[3:] for line in out.splitlines()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="mutations to run (default: all)")
    p.add_argument("--list", action="store_true", help="print the mutations and exit")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args(argv)
    names = args.names or list(MUTATIONS)
    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        p.error(f"unknown mutations: {', '.join(unknown)}")
    if args.list:
        for n in names:
            cls, file, _, _, tests = MUTATIONS[n]
            print(f"{n}: {file} ({cls}) -> {' '.join(tests)}")
        return 0
    # Ctrl-C, and a kill, end the run through run_one's finally (which restores the file), also
    # when the shell started this in the background with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    bad = dirty(sorted({MUTATIONS[n][1] for n in names}))
    if bad:
        print(f"refusing: uncommitted changes in {', '.join(bad)}", file=sys.stderr)
        return 2
    caught = 0
    for n in names:
        cls, file, old, new, tests = MUTATIONS[n]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        status, wall, tail = run_one(dict(file=file, old=old, new=new, tests=tests), args.timeout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        caught += status.startswith("caught")
        print(f"{status:9s} {wall:5.0f} s wall {cpu:5.0f} s cpu  {n}: {file}  [{tail}]", flush=True)
    print(f"{caught}/{len(names)} caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
