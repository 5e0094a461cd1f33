#!/usr/bin/env bash
# The one script a GPU session runs (DESIGN.md section 6; bench/README.md, "The device call"), from
# the repository root:
#
#   bash bench/device_check.sh                     # on the GPU machine; results under $OUT
#   bash bench/device_check.sh --device-left 320   # a rerun sized to the device time left
#                                                  # (status's budget_left_s): budget = left - 60
#   bash bench/device_check.sh --steps setup,decode,moe  # only these (a rerun on the same machine;
#                                                  # DEVICE_CHECK_BUDGET_S sets its budget)
#   bash bench/device_check.sh --dry-run           # anywhere: prints the plan, runs no step
#   bash bench/device_check.sh --source-hash       # hash of _C's sources (make device-bundle)
#
# Without --dry-run it needs a python3 with torch that sees a GPU (DEVICE_CHECK_PYTHON): else it
# says so in one line and exits 2, having written nothing.
# Steps in priority order, each under its own limit (seconds), the required ones summing to at
# most BUDGET_S - RESERVE_S = 460 s; "when time allows" steps get what is left:
#   smi            nvidia-smi, clocks                                                  10
#   setup          _C from the carried bundle (.device-bundle, built here by
#                  `make device-bundle` for sm_90a and Python 3.12; used when its
#                  SOURCES.sha256 matches csrc/), jetspec info                          15
#   build          only when setup failed: `make ext`, _C alone for sm_90a (CMake, ninja)
#   gpu_tests_triton  the triton parity tests on the GPU (pytest --gpu-step triton), first
#                  and in a call of their own: 14 workers, a per-test timeout           95
#                  (JETSPEC_EXACT_UNVERIFIED=1: the exact mode's tests run, test_exact_triton.py,
#                  test_exact_gated_delta_triton.py, test_exact_hybrid.py's triton cases)
#   gpu_tests      the other GPU tests but the Hopper family's (--gpu-step cuda: the cuda
#                  backend, graph capture of every op, the engine-layout matrix)        50
#   gpu_tests_hopper  the Hopper attention family's tests (--gpu-step hopper), in
#                  processes of their own: a TMA fault there breaks the CUDA context    25
#                  (the three share tests/conftest.py's split; the offline sm_90a
#                  compiles and the simulator cases, which need no GPU, are in none)
#   attention      tree_attention at the three headline shapes: every kernel auto may
#                  pick, triton, SDPA (dense mask), flex_attention (block mask), side
#                  by side in TFLOP/s and time / floor (bench_tree_attention --headline) 50
#   decode         bench_decode: the round and the AR step at Qwen3-8B shapes, configs in
#                  priority order until its deadline (--resume: a rerun finishes them)  125
#   sanitizers     compute-sanitizer memcheck, racecheck, synccheck, initcheck on one
#                  launch per op (bench/sanitize_ops.py), cuda and triton, in parallel  35
#   small_ops      host time per eager call of the hot ops (bench/host_overhead.py --gpu:
#                  host, kernel, wall - kernel), then the draft_tree (from logits and
#                  top-K) and verify benches replayed from CUDA graphs                  40
#   attn_sweep     the Hopper attention sweep (bench/attn_sweep.sh; carry the bundle),
#                  shapes in priority order until the limit                             15
#   hidden_topk    when time allows (at most 60 s): draft_tree_from_hidden fused (triton)
#                  against method="gemm" (cuda and triton) at B 1, 4, 16, graph-replayed
#   draft_head     when time allows (at most 60 s): the draft head's forward and the fused
#                  tree at B 1 and 16, graph-replayed, fused layer ops against torch ops
#   gated_delta    when time allows (at most 60 s): one Gated DeltaNet layer's tree verify and
#                  commit at Qwen3.6-35B-A3B's sizes, B 1/16, budgets 16/64/256, triton
#                  against the reference (auto's pick until triton passes), graph-replayed
#   decode_fused   when time allows (at most 70 s): the B1/p512/n64 round and AR step with the
#                  models' fused layer ops on the cuda kernels
#   decode_exact   when time allows (at most 90 s): bench_decode --exact at B1 and B16,
#                  p512, n64, the target on the exact mode's triton path (unverified)
#   decode_exact_wide  when time allows (at most 70 s): the same at B16 with the wide GEMM
#                  tile (--exact-tile wide), the large-batch engine's choice
#   decode_exact_kparts  when time allows (at most 60 s): the same at B1 with K of o_proj and
#                  down in 8 parts (--exact-k-parts 8, the tp-invariant mode)
#   moe            when time allows: bench_decode --model moe at B 1 and 16 (configs that do
#                  not fit the card's memory, e.g. on an H100, are rows saying so)
#   gpu_tests_nopdl  when time allows and gpu_tests failed: the cuda ops without PDL
#   ncu            when time allows: Nsight Compute, one launch of each kernel
# Every process a step starts ends with it (its process group is killed; inner limits are
# `timeout --foreground`, inside that group). After every step the step table, the hardware
# record, the CSVs and a tarball of every log reach $OUT, so a call cut short still returns what
# it measured. Output ($OUT, default bench/results/device_check; the device tool returns at most
# 8 files): summary.txt (the table printed last), steps.tsv, device_check.tar.gz (every log, CSV,
# junit XML), decode.csv, decode_moe.csv, attention.csv, hw_record.jsonl, nvidia-smi.txt. Kept on
# the machine between calls (same machine only): /tmp/jetspec-device (Triton cache, decode CSVs
# for --resume).
# No network and no pip: the machine's python3 (torch, triton, pytest, xdist, pytest-timeout) runs
# the checkout with PYTHONPATH set (and jetspec_kernels/python_ref linked for the run).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

source_hash() { # _C's sources: what the carried bundle must have been built from
  find csrc CMakeLists.txt -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}

DRY=0
ONLY=""
DEVICE_LEFT=""
while (($#)); do
  case $1 in
    --dry-run) DRY=1 ;;
    --steps) ONLY=",${2:?--steps needs a comma list},"; shift ;;
    --device-left) DEVICE_LEFT=${2:-}; shift ;;
    --source-hash) source_hash; exit 0 ;;
    *) echo "device_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
RESERVE_S=10                                   # summary + tar at the end
TRANSFER_S=60                                  # --device-left: the call's start, transfers, give-back
if [[ -n "$DEVICE_LEFT" ]]; then
  [[ "$DEVICE_LEFT" =~ ^[0-9]+$ ]] || { echo "device_check: --device-left takes seconds, got '$DEVICE_LEFT'" >&2; exit 2; }
  ((DEVICE_LEFT - TRANSFER_S < BUDGET_S)) && BUDGET_S=$((DEVICE_LEFT - TRANSFER_S))
  if ((BUDGET_S < 60)); then
    echo "device_check: ${DEVICE_LEFT}s of device time left leaves ${BUDGET_S}s for steps (under 60): not run" >&2
    exit 2
  fi
fi
PY=${DEVICE_CHECK_PYTHON:-python3}
if ((DRY)); then
  PY=${DEVICE_CHECK_DRY_PYTHON:-$ROOT/.venv/bin/python}
  [[ -x "$PY" ]] || PY=python3
else
  # The GPU machine or nothing: refuse before writing any file.
  why=$("$PY" -c 'import torch; print("" if torch.cuda.is_available() else "torch sees no CUDA device")' 2>&1)
  if (($?)); then
    why="$PY cannot import torch ($(echo "$why" | tail -n 1))"
  fi
  if [[ -n "$why" ]]; then
    echo "device_check: $why; run it on the GPU machine (DEVICE_CHECK_PYTHON names its python), or --dry-run here" >&2
    exit 2
  fi
fi

OUT=${OUT:-$ROOT/bench/results/device_check}
PERSIST=${DEVICE_CHECK_PERSIST:-/tmp/jetspec-device}
BUNDLE=${DEVICE_BUNDLE:-$ROOT/.device-bundle}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jetspec_dc.XXXXXX")
LOGS=$WORK/logs
RES=$WORK/results
STEPS=$WORK/steps.tsv
LINK=$ROOT/jetspec_kernels/python_ref
MADE_LINK=0
STEP_PID=""                                    # the running step's process group, if any
cleanup() {
  [[ -n "$STEP_PID" ]] && kill -KILL -- "-$STEP_PID" 2>/dev/null
  ((MADE_LINK)) && rm -f "$LINK"
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
mkdir -p "$OUT" "$LOGS" "$RES"
: >"$STEPS"
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export JETSPEC_CUDA_ARCHS=90a
if ((!DRY)); then
  mkdir -p "$PERSIST"
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PERSIST/triton-cache}
  # An uninstalled checkout (the GPU machine's) imports python_ref/ as jetspec_kernels.python_ref
  # through a link that lives as long as this run.
  if [[ ! -e "$LINK" ]] && ! "$PY" -c 'import jetspec_kernels.python_ref' >/dev/null 2>&1; then
    ln -s ../python_ref "$LINK" && MADE_LINK=1
  fi
fi
echo "[device_check] budget ${BUDGET_S}s${DEVICE_LEFT:+ (${DEVICE_LEFT}s of device time left)}"

remaining() { echo $((START + BUDGET_S - RESERVE_S - $(date +%s))); }
wanted() { [[ -z "$ONLY" || "$ONLY" == *",$1,"* || ($1 == build && "$ONLY" == *",setup,"*) ]]; }
passed() { grep -q "^$1$(printf '\t')PASS" "$STEPS"; }
# An inner limit that stays in its step's process group (plain `timeout` makes a group of its
# own, which the step's end would not reach): the command gets TERM at the limit, KILL 5 s later.
TO="timeout --foreground -k 5"

# publish: what a call cut short still returns; runs after every step.
publish() {
  cp "$STEPS" "$OUT/steps.tsv"
  [[ -f "$LOGS/smi.log" ]] && cp "$LOGS/smi.log" "$OUT/nvidia-smi.txt"
  [[ -f "$RES/hw_record.jsonl" ]] && cp "$RES/hw_record.jsonl" "$OUT/hw_record.jsonl"
  [[ -f "$RES/decode.csv" ]] && cp "$RES/decode.csv" "$OUT/decode.csv"
  [[ -f "$RES/moe/decode.csv" ]] && cp "$RES/moe/decode.csv" "$OUT/decode_moe.csv"
  [[ -f "$RES/attention/tree_attention.csv" ]] && cp "$RES/attention/tree_attention.csv" "$OUT/attention.csv"
  local extra=(); [[ -f "$WORK/summary.txt" ]] && extra=(summary.txt)
  tar -czf "$WORK/pack.tar.gz" -C "$WORK" logs results steps.tsv "${extra[@]}" &&
    mv -f "$WORK/pack.tar.gz" "$OUT/device_check.tar.gz"
  return 0
}

# step NAME LIMIT_S KEEP_S COMMAND [KIND]
#   Runs COMMAND (a bash string; $LIMIT holds its limit) under min(LIMIT_S, time left - KEEP_S),
#   logging to $LOGS/NAME.log; KEEP_S is the time the required steps after this one hold back.
#   KIND: required (default), optional (LIMIT_S 0: "when time allows", limited by the time left
#   alone) or conditional (runs only when an earlier step failed). A dry run prints the plan line
#   "[device_check] plan NAME LIMIT_S KEEP_S KIND: COMMAND" and runs nothing. The step's process
#   group is killed when it ends: nothing it started outlives it.
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
    publish
    return 0
  fi
  echo "[device_check] $name (limit ${limit}s): $cmd"
  local t0 rc pid status detail
  t0=$(date +%s)
  LIMIT=$limit timeout -k 5 "$limit" bash -c "$cmd" >"$LOGS/$name.log" 2>&1 &
  pid=$!
  STEP_PID=$pid
  wait "$pid"
  rc=$?
  kill -KILL -- "-$pid" 2>/dev/null        # timeout leads its own process group: end stragglers
  STEP_PID=""
  case $rc in
    0) status=PASS ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
  esac
  detail=$(grep -E '(passed|failed|ERROR SUMMARY|sanitize_ops:|_C (built|loaded)|wrote .*\.csv|Error|SKIP)' \
    "$LOGS/$name.log" | tail -n 1 | tail -c 150 | tr '\t' ' ')
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "$detail" >>"$STEPS"
  echo "[device_check] $name: $status"
  publish
  return 0
}

# 1. The machine.
step smi 10 450 "nvidia-smi && nvidia-smi -q -d CLOCK,PERFORMANCE,POWER"

# 2. _C: the carried sm_90a build when its sources match, else built here (the build step).
HASH=$(source_hash)
step setup 15 435 "if [[ -f '$BUNDLE/SOURCES.sha256' && \"\$(cat '$BUNDLE/SOURCES.sha256')\" == '$HASH' ]]; then
    cp '$BUNDLE'/_C*.so jetspec_kernels/ || exit 3
  else
    echo 'no bundle for these sources at $BUNDLE (make device-bundle)'; exit 3
  fi
  '$PY' -c 'import jetspec_kernels._C as C; print(\"_C loaded, built for\", C.built_archs())' &&
  '$PY' -m jetspec_kernels info"
if ((DRY)) || { wanted setup && ! passed setup; }; then
  step build 150 0 "make ext EXT_PYTHON='$PY' EXT_ARCHS=90a CMAKE=cmake NINJA=\$(command -v ninja) &&
    '$PY' -c 'import jetspec_kernels._C as C; print(\"_C built for\", C.built_archs())' &&
    '$PY' -m jetspec_kernels info" conditional
fi

# 3. Correctness on the GPU, in three pytest calls that split the GPU tests between them
#    (tests/conftest.py, --gpu-step): the triton parity tests first, then the cuda backend's,
#    then the Hopper family's (a fault there breaks the CUDA context: unless they pass, later
#    steps leave the kernel out, JETSPEC_SKIP_HOPPER, read by bench/common.py). Each test has a limit
#    (pytest-timeout; its thread method ends the worker, which xdist replaces, the other tests
#    rescheduled); the outcomes make the hardware record.
export JETSPEC_HW_RECORD=$RES/hw_record.jsonl
PYTEST="'$PY' -m pytest -q -p no:cacheprovider -rs --timeout-method thread --max-worker-restart 32"
step gpu_tests_triton 95 340 "JETSPEC_EXACT_UNVERIFIED=1 $PYTEST --gpu-step triton -n 14 --dist load --timeout 60 tests \
  --junitxml='$RES/gpu_tests_triton.xml'"
step gpu_tests 50 290 "$PYTEST --gpu-step cuda -n 8 --dist load --timeout 45 tests \
  --junitxml='$RES/gpu_tests.xml'"
step gpu_tests_hopper 25 265 "$PYTEST --gpu-step hopper -n 2 --dist load --timeout 15 tests \
  --junitxml='$RES/gpu_tests_hopper.xml'"
((DRY)) || passed gpu_tests_hopper || export JETSPEC_SKIP_HOPPER=1
unset JETSPEC_HW_RECORD

# 4. Attention against SDPA and flex_attention at the headline shapes (rows as they finish).
step attention 50 215 "'$PY' bench/bench_tree_attention.py --headline --no-plot --out '$RES/attention'"

# 5. The decoding round (its deadline leaves 10 s for the model's teardown and the CSV).
step decode 125 90 "'$PY' bench/bench_decode.py --out '$RES' --no-plot --deadline \$((LIMIT - 10)) \
  --resume '$PERSIST/decode.csv'; rc=\$?; cp '$RES/decode.csv' '$PERSIST/decode.csv'; exit \$rc"

# 6. compute-sanitizer, four tools x two backends, one process each, in parallel.
SAN="compute-sanitizer --error-exitcode 9 --target-processes all"
step sanitizers 35 55 "for be in cuda triton; do for tool in memcheck racecheck synccheck initcheck; do
    env=''; [[ \$tool == memcheck || \$tool == initcheck ]] && env='PYTORCH_NO_CUDA_MEMORY_CACHING=1'
    (env \$env $TO \$((LIMIT - 5)) $SAN --tool \$tool '$PY' bench/sanitize_ops.py --backend \$be \
      >'$RES/sanitize_'\$tool'_'\$be'.log' 2>&1; echo \"\$tool \$be exit \$?\") &
  done; done; wait
  grep -H -E 'ERROR SUMMARY|sanitize_ops:' '$RES'/sanitize_*.log
  ! grep -L 'ERROR SUMMARY: 0 errors' '$RES'/sanitize_*.log | grep -q . &&
  ! grep -h 'sanitize_ops:' '$RES'/sanitize_*.log | grep -vq ': 0 failed'"

# 7. Host time per eager call (<= 25 us; cuda first, triton next, then auto: what a caller gets,
#    the backend choice included; each op's row printed as it completes), then the small ops
#    replayed from CUDA graphs (kernel time): draft_tree, then verify (tree build, verify_tree,
#    commit_kv, rope append). host_overhead --gpu already times the eager calls.
step small_ops 40 15 "rc=0; set -o pipefail; $TO 16 '$PY' bench/host_overhead.py --gpu --seconds 10 \
    --backends cuda,triton,auto \
    | tee '$RES/host_overhead.txt' || rc=1
  $TO 12 '$PY' bench/bench_draft_tree.py --quick --no-plot --graphs --groups logits,from_topk \
    --out '$RES' || rc=1
  $TO 10 '$PY' bench/bench_verify.py --quick --no-plot --graphs --out '$RES' || rc=1
  exit \$rc"

# 8. The Hopper attention sweep: bench/attn_sweep.sh runs the carried sweep binary over the
#    headline shapes in priority order, rows into attn_sweep.csv as they finish; ncu on its best
#    kernels only by hand (attn_sweep.sh --ncu).
step attn_sweep 15 0 "if [[ -x bench/attn_sweep.sh ]]; then bench/attn_sweep.sh '$RES'; else
    echo 'SKIP: no bench/attn_sweep.sh in this checkout'; fi"

# 8b. When time allows: the hidden top-K's two methods side by side at B 1, 4, 16 (docs/perf/
#     hidden_topk.md), kernels replayed from CUDA graphs, rows kept as they finish.
step hidden_topk 0 0 "$TO 60 '$PY' bench/bench_draft_tree.py --quick --graphs --no-plot \
  --groups from_hidden --batches 1,4,16 --algorithms topn --out '$RES/hidden_topk'"

# 8c. When time allows: the draft stage (the draft head's cached forward, then the fused tree, B 1
#     and 16 over 1024 context rows, Qwen3-8B shapes, random weights), replayed from CUDA graphs.
step draft_head 0 0 "$TO 60 '$PY' bench/bench_draft_head.py --quick --graphs --no-plot \
  --out '$RES/draft_head'"

# 8c'. When time allows: the hybrid target's tree verify, one Gated DeltaNet layer
#      (docs/perf/gated_delta_tree.md predicts each shape), replayed from CUDA graphs.
step gated_delta 0 0 "$TO 60 '$PY' bench/bench_gated_delta.py --graphs --no-plot \
  --out '$RES/gated_delta'"

# 8d. When time allows: decode's headline config with fused layer ops (against decode's own row).
step decode_fused 0 0 "$TO 70 '$PY' bench/bench_decode.py --batches 1 --prompts 512 --budgets 64 \
  --fused-ops-backend cuda --deadline 60 --no-plot --out '$RES/decode_fused'"

# The exact mode's round against the normal one (the decode step's rows at the same configs): the
# target on the triton exact path, unverified on this GPU until the exact tests pass (step 3).
step decode_exact 0 0 "$TO 90 env JETSPEC_EXACT_UNVERIFIED=1 '$PY' bench/bench_decode.py --exact \
  --fused-ops-backend triton --batches 1,16 --prompts 512 --budgets 64 --deadline 80 --no-plot \
  --out '$RES/decode_exact'"
step decode_exact_wide 0 0 "$TO 70 env JETSPEC_EXACT_UNVERIFIED=1 '$PY' bench/bench_decode.py --exact \
  --exact-tile wide --fused-ops-backend triton --batches 16 --prompts 512 --budgets 64 --deadline 60 \
  --no-plot --out '$RES/decode_exact_wide'"
step decode_exact_kparts 0 0 "$TO 60 env JETSPEC_EXACT_UNVERIFIED=1 '$PY' bench/bench_decode.py --exact \
  --exact-k-parts 8 --fused-ops-backend triton --batches 1 --prompts 512 --budgets 64 --deadline 50 \
  --no-plot --out '$RES/decode_exact_kparts'"

# 9. When time allows: the MoE round table (configs the card's memory cannot hold are rows saying
#    so), a no-PDL rerun of failing cuda ops, Nsight Compute.
step moe 0 0 "mkdir -p '$RES/moe' && '$PY' bench/bench_decode.py --model moe --out '$RES/moe' --no-plot \
  --deadline \$((LIMIT - 10)) --resume '$PERSIST/decode_moe.csv'; rc=\$?
  cp '$RES/moe/decode.csv' '$PERSIST/decode_moe.csv'; exit \$rc"
if ((DRY)) || ! passed gpu_tests; then
  step gpu_tests_nopdl 0 0 "JETSPEC_PDL=0 $PYTEST --gpu-step cuda -n 8 --timeout 45 tests/ops -k cuda \
    --junitxml='$RES/gpu_tests_nopdl.xml'"
fi
NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats"
step ncu 0 0 "$NCU -f -o '$RES/ncu_profile' '$PY' bench/profile_kernels.py &&
  ncu --import '$RES/ncu_profile.ncu-rep' --csv --page details >'$RES/ncu_profile.csv' &&
  rm -f '$RES/ncu_profile.ncu-rep' &&
  '$PY' bench/profile_kernels.py --summarize '$RES/ncu_profile.csv' | tee '$RES/ncu_summary.txt'"

# 10. Summary (printed last) and the results, in few files for the trip back.
"$PY" bench/summarize.py --steps "$STEPS" --results "$RES" >"$WORK/summary.txt" 2>&1 ||
  { echo "(summarize.py failed)"; cat "$STEPS"; } >>"$WORK/summary.txt"
echo "total $(($(date +%s) - START)) s of a ${BUDGET_S} s budget" >>"$WORK/summary.txt"
cp "$WORK/summary.txt" "$OUT/summary.txt"
publish
echo
echo "[device_check] logs, CSVs: $OUT/device_check.tar.gz"
cat "$OUT/summary.txt"
