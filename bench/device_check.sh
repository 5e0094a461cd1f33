#!/usr/bin/env bash
# The one script a GPU session runs (DESIGN.md section 6; issue 31), from the repository root:
#
#   bash bench/device_check.sh                     # on the GPU machine; results under $OUT
#   bash bench/device_check.sh --steps setup,decode,moe  # only these (a rerun on the same machine;
#                                                  # DEVICE_CHECK_BUDGET_S sets its budget)
#   bash bench/device_check.sh --dry-run           # anywhere: prints the plan, runs no step
#   bash bench/device_check.sh --source-hash       # hash of _C's sources (make device-bundle)
#
# Steps in issue 31's priority order, each under its own limit (seconds), the required ones
# summing to at most BUDGET_S - RESERVE_S = 460 s; "when time allows" steps get what is left:
#   smi            nvidia-smi, clocks                                                  10
#   setup          _C from the carried bundle (.device-bundle, built here by
#                  `make device-bundle` for sm_90a and Python 3.12; used when its
#                  SOURCES.sha256 matches csrc/), jetspec info                          20
#   build          only when setup failed: _C built on the machine (make device-bundle)
#   gpu_tests      both backends: pytest --on-gpu (gpu-marked tests, every triton case,
#                  the engine-layout matrix, graph capture of every op), TMA kernel apart 135
#   gpu_tests_tma  the TMA attention kernel's tests, in a process of their own          25
#   decode         bench_decode: the round and the AR step at Qwen3-8B shapes, configs in
#                  priority order until its deadline (--resume: a rerun finishes them)  135
#   sanitizers     compute-sanitizer memcheck, racecheck, synccheck, initcheck on one
#                  launch per op (bench/sanitize_ops.py), cuda and triton, in parallel  45
#   small_ops      host time per eager call of the four hot ops (bench/host_overhead.py
#                  --gpu: host, kernel, wall - kernel), then the draft_tree (from logits
#                  and top-K; from hidden states is hidden_topk's) and verify benches
#                  replayed from CUDA graphs and eager                                  60
#   attn_sweep     the Hopper attention sweep (bench/attn_sweep.sh; carry build/attn_sweep),
#                  shapes in priority order until the limit                             25
#   hidden_topk    when time allows (at most 60 s): draft_tree_from_hidden fused (triton)
#                  against method="gemm" (cuda and triton) at B 1, 4, 16, graph-replayed
#                  (issue 27; sets launch_plan.HIDDEN_TOPK_GEMM_MIN_ROWS, bench/NOTES.md)
#   draft_head     when time allows (at most 60 s): the draft head's forward and the fused
#                  tree at B 1 and 16, graph-replayed, fused layer ops (rms_norm, silu_mul)
#                  against torch ops
#                  (issue 27 problem 3; rows written as they finish)
#   decode_fused   when time allows (at most 70 s): the B1/p512/n64 round and AR step with the
#                  models' fused layer ops on the cuda kernels (decode's rows run them as torch
#                  ops until they are hardware-verified): their end-to-end effect
#   moe            when time allows: bench_decode --model moe at B 1 and 16 (H200 only: it
#                  needs about 65-85 GB)
#   gpu_tests_nopdl  when time allows and gpu_tests failed: the cuda ops without PDL
#   ncu            when time allows: Nsight Compute, one launch of each kernel
# Output ($OUT, default bench/results/device_check; at most 8 files come back): summary.txt (the
# table printed last), device_check.tar.gz (every log, CSV, junit XML), decode.csv,
# decode_moe.csv, hw_record.jsonl, nvidia-smi.txt. Kept on the machine between calls (same
# machine only): /tmp/jetspec-device (Triton cache, decode CSVs for --resume).
# No network and no pip: the machine's python3 (torch, triton, pytest, xdist) runs the checkout
# with PYTHONPATH set.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

source_hash() { # _C's sources: what the carried bundle must have been built from
  find csrc CMakeLists.txt -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}

DRY=0
ONLY=""
while (($#)); do
  case $1 in
    --dry-run) DRY=1 ;;
    --steps) ONLY=",$2,"; shift ;;
    --source-hash) source_hash; exit 0 ;;
    *) echo "device_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

OUT=${OUT:-$ROOT/bench/results/device_check}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
RESERVE_S=10                                   # summary + tar at the end
PERSIST=${DEVICE_CHECK_PERSIST:-/tmp/jetspec-device}
BUNDLE=${DEVICE_BUNDLE:-$ROOT/.device-bundle}
PY=${DEVICE_CHECK_PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jetspec_dc.XXXXXX")
LOGS=$WORK/logs
RES=$WORK/results
STEPS=$WORK/steps.tsv
mkdir -p "$OUT" "$LOGS" "$RES" "$PERSIST"
: >"$STEPS"
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PERSIST/triton-cache}
export JETSPEC_CUDA_ARCHS=90a
((DRY)) && PY=${DEVICE_CHECK_DRY_PYTHON:-$ROOT/.venv/bin/python}

remaining() { echo $((START + BUDGET_S - RESERVE_S - $(date +%s))); }
wanted() { [[ -z "$ONLY" || "$ONLY" == *",$1,"* || ($1 == build && "$ONLY" == *",setup,"*) ]]; }
passed() { grep -q "^$1$(printf '\t')PASS" "$STEPS"; }

# step NAME LIMIT_S KEEP_S COMMAND [KIND]
#   Runs COMMAND (a bash string; $LIMIT holds its limit) under min(LIMIT_S, time left - KEEP_S),
#   logging to $LOGS/NAME.log; KEEP_S is the time the required steps after this one hold back.
#   KIND: required (default), optional (LIMIT_S 0: "when time allows", limited by the time left
#   alone) or conditional (runs only when an earlier step failed). A dry run prints the plan line
#   "[device_check] plan NAME LIMIT_S KEEP_S KIND: COMMAND" and runs nothing.
step() {
  local name=$1 limit=$2 keep=$3 cmd=$4 kind=${5:-required}
  ((limit == 0)) && kind=optional
  wanted "$name" || return 0
  [[ -n "$ONLY" ]] && keep=0               # a rerun of chosen steps holds nothing back
  if ((DRY)); then
    printf '%s\tDRY\t%s\t%s\n' "$name" "$limit" "$(echo "$cmd" | tr '\n\t' '  ' | tr -s ' ' | tail -c 150)" >>"$STEPS"
    echo "[device_check] plan $name $limit $keep $kind: $(echo "$cmd" | tr '\n' ' ' | tr -s ' ')"
    return 0
  fi
  local left=$(($(remaining) - keep))
  ((limit == 0 || left < limit)) && limit=$left
  if ((limit < 10)); then
    printf '%s\tSKIP\t0\tno time left in the %ss budget\n' "$name" "$BUDGET_S" >>"$STEPS"
    echo "[device_check] $name: skipped (no time left)"
    return 0
  fi
  echo "[device_check] $name (limit ${limit}s): $cmd"
  local t0 rc status detail
  t0=$(date +%s)
  LIMIT=$limit timeout -k 5 "$limit" bash -c "$cmd" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=PASS ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
  esac
  detail=$(grep -E '(passed|failed|ERROR SUMMARY|sanitize_ops:|_C (built|loaded)|wrote .*\.csv|Error|SKIP)' \
    "$LOGS/$name.log" | tail -n 1 | tail -c 150 | tr '\t' ' ')
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "$detail" >>"$STEPS"
  echo "[device_check] $name: $status"
  return 0
}

# 1. The machine.
step smi 10 445 "nvidia-smi && nvidia-smi -q -d CLOCK,PERFORMANCE,POWER"

# 2. _C: the carried sm_90a build when its sources match, else built here (the build step).
HASH=$(source_hash)
step setup 20 425 "ln -sfn ../python_ref jetspec_kernels/python_ref
  if [[ -f '$BUNDLE/SOURCES.sha256' && \"\$(cat '$BUNDLE/SOURCES.sha256')\" == '$HASH' ]]; then
    cp '$BUNDLE'/_C*.so jetspec_kernels/ || exit 3
  else
    echo 'no bundle for these sources at $BUNDLE (make device-bundle)'; exit 3
  fi
  '$PY' -c 'import jetspec_kernels._C as C; print(\"_C loaded, built for\", C.built_archs())' &&
  '$PY' -m jetspec_kernels info"
if ((DRY)) || { wanted setup && ! passed setup; }; then
  step build 150 0 "ln -sfn ../python_ref jetspec_kernels/python_ref
    make device-bundle DEVICE_PYTHON='$PY' PYBIND11_PY='$PY' DEVICE_BUNDLE='$PERSIST/bundle' CMAKE=cmake NINJA=\$(command -v ninja) &&
    cp '$PERSIST'/bundle/_C*.so jetspec_kernels/ &&
    '$PY' -c 'import jetspec_kernels._C as C; print(\"_C built for\", C.built_archs())' &&
    '$PY' -m jetspec_kernels info" conditional
fi

# 3. Correctness of both backends on the GPU. The TMA attention kernel is tested in its own
#    process: a fault in it breaks the CUDA context, and must not fail every other test. Unless
#    its tests pass, later steps leave it out (JETSPEC_SKIP_TMA, read by bench/common.py).
export JETSPEC_HW_RECORD=$RES/hw_record.jsonl   # per-test outcomes: the hardware record
XDIST=""
((DRY)) || ! "$PY" -c 'import xdist' 2>/dev/null || XDIST="-n 8"
step gpu_tests 135 290 "'$PY' -m pytest --on-gpu --tma skip -q -p no:cacheprovider -rs tests $XDIST \
  --junitxml='$RES/gpu_tests.xml'"
step gpu_tests_tma 25 265 "'$PY' -m pytest --gpu-only --tma only -q -p no:cacheprovider -rs tests \
  --junitxml='$RES/gpu_tests_tma.xml'"
passed gpu_tests_tma || export JETSPEC_SKIP_TMA=1
unset JETSPEC_HW_RECORD

# 4. The decoding round (its deadline leaves 10 s for the model's teardown and the CSV).
step decode 135 130 "'$PY' bench/bench_decode.py --out '$RES' --no-plot --deadline \$((LIMIT - 10)) \
  --resume '$PERSIST/decode.csv'; rc=\$?; cp '$RES/decode.csv' '$PERSIST/decode.csv'; exit \$rc"

# 5. compute-sanitizer, four tools x two backends, one process each, in parallel.
SAN="compute-sanitizer --error-exitcode 9 --target-processes all"
step sanitizers 45 85 "for be in cuda triton; do for tool in memcheck racecheck synccheck initcheck; do
    env=''; [[ \$tool == memcheck || \$tool == initcheck ]] && env='PYTORCH_NO_CUDA_MEMORY_CACHING=1'
    (env \$env timeout \$((LIMIT - 5)) $SAN --tool \$tool '$PY' bench/sanitize_ops.py --backend \$be \
      >'$RES/sanitize_'\$tool'_'\$be'.log' 2>&1; echo \"\$tool \$be exit \$?\") &
  done; done; wait
  grep -H -E 'ERROR SUMMARY|sanitize_ops:' '$RES'/sanitize_*.log
  ! grep -L 'ERROR SUMMARY: 0 errors' '$RES'/sanitize_*.log | grep -q . &&
  ! grep -h 'sanitize_ops:' '$RES'/sanitize_*.log | grep -vq ': 0 failed'"

# 6. Host time per eager call (issue 27: <= 25 us; cuda first, triton next, then auto: what a
#    caller gets, the backend choice included; each op's row printed as it completes), then the
#    small ops replayed from CUDA graphs (kernel time) and eagerly (plus the host's per-call
#    work), draft_tree then verify (tree build, verify_tree, commit_kv, rope append).
step small_ops 60 25 "rc=0; set -o pipefail; timeout 20 '$PY' bench/host_overhead.py --gpu --seconds 12 \
    --backends cuda,triton,auto \
    | tee '$RES/host_overhead.txt' || rc=1
  for run in 'draft_tree --graphs --groups logits,from_topk' 'verify --graphs' \
             'draft_tree --groups logits,from_topk' 'verify'; do
    set -- \$run; timeout 25 '$PY' bench/bench_\$1.py --quick --no-plot \${@:2} --out '$RES' || rc=1
  done; exit \$rc"

# 7. The Hopper attention sweep (issue 26): bench/attn_sweep.sh runs the carried sweep binary
#    (build/attn_sweep: carry it) over the headline shapes in priority order, rows into
#    attn_sweep.csv as they finish; ncu on its best kernels only by hand (attn_sweep.sh --ncu).
step attn_sweep 25 0 "if [[ -x bench/attn_sweep.sh ]]; then bench/attn_sweep.sh '$RES'; else
    echo 'SKIP: no bench/attn_sweep.sh in this checkout (branch attn-hopper adds it)'; fi"

# 7b. When time allows: the hidden top-K's two methods side by side at B 1, 4, 16 (bench/NOTES.md,
#     "Hidden top-K: fused or GEMM"), kernels replayed from CUDA graphs, rows kept as they finish.
step hidden_topk 0 0 "timeout 60 '$PY' bench/bench_draft_tree.py --quick --graphs --no-plot \
  --groups from_hidden --batches 1,4,16 --algorithms topn --out '$RES/hidden_topk'"

# 7c. When time allows: the draft stage (issue 27 problem 3: the draft head's cached forward, then
#     the fused tree, B 1 and 16 over 1024 context rows, Qwen3-8B shapes, random weights), each
#     call replayed from a CUDA graph; bench_draft_head has not run on a GPU since its crash fix.
step draft_head 0 0 "timeout 60 '$PY' bench/bench_draft_head.py --quick --graphs --no-plot \
  --out '$RES/draft_head'"

# 7d. When time allows: decode's headline config with fused layer ops (against decode's own row).
step decode_fused 0 0 "timeout 70 '$PY' bench/bench_decode.py --batches 1 --prompts 512 --budgets 64 \
  --fused-ops-backend cuda --deadline 60 --no-plot --out '$RES/decode_fused'"

# 8. When time allows: the MoE round table (an H200's memory), a no-PDL rerun of failing cuda
#    ops, Nsight Compute.
step moe 0 0 "mkdir -p '$RES/moe' && '$PY' bench/bench_decode.py --model moe --out '$RES/moe' --no-plot \
  --deadline \$((LIMIT - 10)) --resume '$PERSIST/decode_moe.csv'; rc=\$?
  cp '$RES/moe/decode.csv' '$PERSIST/decode_moe.csv'; exit \$rc"
if ((DRY)) || ! passed gpu_tests; then
  step gpu_tests_nopdl 0 0 "JETSPEC_PDL=0 '$PY' -m pytest --gpu-only --tma skip -q -p no:cacheprovider -rs \
    tests/ops -k cuda --junitxml='$RES/gpu_tests_nopdl.xml'"
fi
NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats"
step ncu 0 0 "$NCU -f -o '$RES/ncu_profile' '$PY' bench/profile_kernels.py &&
  ncu --import '$RES/ncu_profile.ncu-rep' --csv --page details >'$RES/ncu_profile.csv' &&
  rm -f '$RES/ncu_profile.ncu-rep' &&
  '$PY' bench/profile_kernels.py --summarize '$RES/ncu_profile.csv' | tee '$RES/ncu_summary.txt'"

# 9. Summary (printed last) and the results, in few files for the trip back.
"$PY" bench/summarize.py --steps "$STEPS" --results "$RES" >"$WORK/summary.txt" 2>&1 ||
  { echo "(summarize.py failed)"; cat "$STEPS"; } >>"$WORK/summary.txt"
echo "total $(($(date +%s) - START)) s of a ${BUDGET_S} s budget" >>"$WORK/summary.txt"
cp "$WORK/summary.txt" "$OUT/summary.txt"
[[ -f "$LOGS/smi.log" ]] && cp "$LOGS/smi.log" "$OUT/nvidia-smi.txt"
[[ -f "$RES/decode.csv" ]] && cp "$RES/decode.csv" "$OUT/decode.csv"
[[ -f "$RES/moe/decode.csv" ]] && cp "$RES/moe/decode.csv" "$OUT/decode_moe.csv"
[[ -f "$RES/hw_record.jsonl" ]] && cp "$RES/hw_record.jsonl" "$OUT/hw_record.jsonl"
tar -czf "$OUT/device_check.tar.gz" -C "$WORK" logs results steps.tsv summary.txt
rm -rf "$WORK"
echo
echo "[device_check] logs, CSVs: $OUT/device_check.tar.gz"
cat "$OUT/summary.txt"
