#!/usr/bin/env bash
# The one script a device session runs (DESIGN.md section 6), from the repository root:
#
#   bash bench/device_check.sh              # on the GPU machine; results under $OUT
#   bash bench/device_check.sh --dry-run    # anywhere: prints the GPU steps, runs the CPU parts
#
# Steps, each under `timeout`, all inside a total budget (default 500 s, under 9 minutes):
#   nvidia-smi; a venv with --system-site-packages (the machine's CUDA torch and triton); _C built
#   for sm_90a only; `python -m jetspec_kernels info`; the gpu tests (--gpu-only; the TMA attention kernel's
#   tests in a process of their own); compute-sanitizer memcheck
#   and racecheck on bench/sanitize_ops.py (cuda backend; memcheck of the triton backend when time
#   allows); the quick GPU sweep of every bench (draft_tree and verify also in CUDA graphs);
#   ncu (SpeedOfLight, Occupancy, LaunchStats) on one launch of each kernel at the headline shapes (bench/profile_kernels.py). A step that would not
#   fit is skipped and says so.
# Output ($OUT, default bench/results/device_check): summary.txt (the table printed last),
# device_check.tar.gz (every log, CSV and PNG, steps.tsv), nvidia-smi.txt. No network is needed:
# pip runs with PIP_NO_INDEX=1 against what the machine has installed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
OUT=${OUT:-$ROOT/bench/results/device_check}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-500}
RESERVE_S=15                                   # summary + tar at the end
VENV=${DEVICE_CHECK_VENV:-/tmp/jetspec-device-venv}
SYS_PY=${DEVICE_CHECK_PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jetspec_dc.XXXXXX")
LOGS=$WORK/logs
RES=$WORK/results
STEPS=$WORK/steps.tsv
mkdir -p "$OUT" "$LOGS" "$RES"
: >"$STEPS"
START=$(date +%s)
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 JETSPEC_CUDA_ARCHS=90a

if ((DRY)); then
  PY=${DEVICE_CHECK_DRY_PYTHON:-$ROOT/.venv/bin/python}
  BENCH_FLAGS="--quick --device cpu"
else
  PY=$VENV/bin/python
  BENCH_FLAGS="--quick"
fi

remaining() { echo $((START + BUDGET_S - RESERVE_S - $(date +%s))); }

# run_step NAME LIMIT_S KEEP_S COMMAND
#   Runs COMMAND (a bash string) with a limit of min(LIMIT_S, time left - KEEP_S), logging to
#   $LOGS/NAME.log; KEEP_S is time held back for the steps after this one.
run_step() {
  local name=$1 limit=$2 keep=$3 cmd=$4
  local left=$(($(remaining) - keep))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    printf '%s\tSKIP\t0\tno time left in the %ss budget\n' "$name" "$BUDGET_S" >>"$STEPS"
    echo "[device_check] $name: skipped (no time left)"
    return 0
  fi
  echo "[device_check] $name (limit ${limit}s): $cmd"
  local t0 rc status
  t0=$(date +%s)
  timeout -k 5 "$limit" bash -c "$cmd" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=PASS ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
  esac
  local detail
  detail=$(grep -E '(passed|failed|ERROR SUMMARY|sanitize_ops:|_C built|wrote .*\.csv|Error)' \
    "$LOGS/$name.log" | tail -n 1 | tail -c 150 | tr '\t' ' ')
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "$detail" >>"$STEPS"
  echo "[device_check] $name: $status"
  return 0
}

dry_step() { # record what a GPU step would run
  printf '%s\tDRY\t0\t%s\n' "$1" "$(echo "$2" | tr '\n\t' '  ' | tr -s ' ' | tail -c 150)" >>"$STEPS"
  echo "[device_check] (dry run) $1: $2"
}

step() { # step NAME LIMIT KEEP CMD [gpu]: GPU steps are only printed in a dry run
  if ((DRY)) && [[ "${5:-}" == gpu ]]; then dry_step "$1" "$4"; else run_step "$@"; fi
}

SAN="compute-sanitizer --error-exitcode 9 --target-processes all"
SAN_ENV="PYTORCH_NO_CUDA_MEMORY_CACHING=1"   # every tensor its own allocation: OOB reads are seen

# 1. The machine.
step nvidia_smi 20 0 "nvidia-smi && nvidia-smi -q -d CLOCK,PERFORMANCE,POWER" gpu

# 2. Environment and build. The machine's python3 is itself a venv (/opt/torch/.venv): a nested
#    --system-site-packages venv sees the base interpreter's packages only, so a .pth file adds
#    the outer site-packages (torch, triton) when the new venv cannot import torch.
step venv 60 0 "test -x '$PY' || $SYS_PY -m venv --system-site-packages '$VENV' || exit 1
  if ! '$PY' -c 'import torch' 2>/dev/null; then
    $SYS_PY -c 'import site; print(\"\\n\".join(site.getsitepackages()))' \
      >\"\$('$PY' -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/_device_site.pth\"
  fi
  '$PY' -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.is_available())'" gpu
step build 180 0 "make install VENV='$VENV' PYTHON=$SYS_PY VENV_FLAGS=--system-site-packages TORCH_SPEC= \
  || '$PY' -m pip install --no-deps --no-build-isolation -e .
  '$PY' -c 'import jetspec_kernels._C as C; print(\"_C built for\", C.built_archs())'" gpu
step info 30 0 "'$PY' -m jetspec_kernels info" gpu

# 3. Correctness on the GPU; then the sanitizers (the benches keep at least 210 s). The TMA
#    attention kernel is tested in its own process: a fault in it (an mbarrier wait past its
#    timeout) breaks the CUDA context, and must not fail every other test. Unless its tests pass,
#    the sanitizer, bench and ncu steps leave it out (JETSPEC_SKIP_TMA, read by bench/common.py).
#    A failing cuda-op run is repeated without programmatic dependent launch (JETSPEC_PDL=0): if
#    that passes, PDL (pdl.cuh) is the suspect.
export JETSPEC_HW_RECORD=$RES/hw_record.jsonl   # per-test outcomes: the hardware record
# Triton compiles dominate the GPU tests: spread them over the CPU cores when pytest-xdist is there.
XDIST=""
((DRY)) || ! "$PY" -c 'import xdist' 2>/dev/null || XDIST="-n 8"
step gpu_tests 150 260 "'$PY' -m pytest --gpu-only --tma skip -q -p no:cacheprovider -rs tests $XDIST \
  --junitxml='$RES/gpu_tests.xml'" gpu
if ((DRY)) || ! grep -q "^gpu_tests$(printf '\t')PASS" "$STEPS"; then
  step gpu_tests_nopdl 60 270 "JETSPEC_HW_RECORD= JETSPEC_PDL=0 '$PY' -m pytest --gpu-only --tma skip -q -p no:cacheprovider -rs \
    tests/ops -k cuda --junitxml='$RES/gpu_tests_nopdl.xml'" gpu
fi
step gpu_tests_tma 40 250 "'$PY' -m pytest --gpu-only --tma only -q -p no:cacheprovider -rs tests \
  --junitxml='$RES/gpu_tests_tma.xml'" gpu
grep -q "^gpu_tests_tma$(printf '\t')PASS" "$STEPS" || export JETSPEC_SKIP_TMA=1
unset JETSPEC_HW_RECORD
if command -v compute-sanitizer >/dev/null 2>&1 || ((DRY)); then
  step memcheck_cuda 60 210 "$SAN_ENV $SAN --tool memcheck '$PY' bench/sanitize_ops.py --backend cuda" gpu
  step racecheck_cuda 40 210 "$SAN --tool racecheck '$PY' bench/sanitize_ops.py --backend cuda" gpu
  step memcheck_triton 40 210 "$SAN_ENV $SAN --tool memcheck '$PY' bench/sanitize_ops.py --backend triton" gpu
else
  printf 'sanitizers\tSKIP\t0\tcompute-sanitizer is not on PATH\n' >>"$STEPS"
fi

# ---- Issue 26: the Hopper attention sweep (bench/attn_sweep; this block is self-contained) ----
# After the hardware-proof steps: the torch-free sweep of every Hopper attention variant and of
# today's kernels at the headline shapes (CUDA events + graph replay, each checked against
# mma.sync), with its own time limit, then ncu on the fastest passing kernel and on today's
# (wgmma) at one compute- and one memory-bound shape. The binary is the one carried in
# build/attn_sweep when it starts here, else it is built here (make -j16, about a minute).
# Results: attn_sweep.csv, attn_sweep_best.txt, attn_ncu_*.csv in the results tarball; the
# table is in logs/attn_sweep.log (bench/NOTES.md, "Hopper attention family", says what to do
# with it). A dry run prints the sweep's plan (--dry-run needs no GPU).
SWEEP_BIN=$ROOT/build/attn_sweep/attn_sweep
step attn_sweep_plan 20 200 "if test -x '$SWEEP_BIN' && '$SWEEP_BIN' --list >/dev/null 2>&1; then
    '$SWEEP_BIN' --dry-run | tail -n 3; else echo 'attn_sweep: no runnable binary (make -C bench/attn_sweep)'; fi"
CUBLAS_LIB=$("$PY" -c 'import glob, os, torch
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib", "libcublas.so*"))
print(sorted(libs)[0] if libs else "")' 2>/dev/null)
step attn_sweep 150 200 "( '$SWEEP_BIN' --list >/dev/null 2>&1 || make -C bench/attn_sweep -j16 NVCC=\$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) ) &&
  '$SWEEP_BIN' --csv '$RES/attn_sweep.csv' --best '$RES/attn_sweep_best.txt' ${CUBLAS_LIB:+--cublas '$CUBLAS_LIB'}" gpu
if command -v ncu >/dev/null 2>&1 || ((DRY)); then
  ATTN_NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section SourceCounters --section ComputeWorkloadAnalysis"
  step attn_sweep_ncu 120 200 "for shape in 1x32Kx256 16x4Kx16; do
      best=\$(awk -v s=\$shape '\$1 == s {print \$2}' '$RES/attn_sweep_best.txt' 2>/dev/null); best=\${best:-wide}
      for k in \$best wgmma; do
        $ATTN_NCU -f -o '$RES/attn_ncu_'\$k'_'\$shape '$SWEEP_BIN' --profile \$k --shape \$shape &&
        ncu --import '$RES/attn_ncu_'\$k'_'\$shape'.ncu-rep' --csv --page details >'$RES/attn_ncu_'\$k'_'\$shape'.csv' &&
        ncu --import '$RES/attn_ncu_'\$k'_'\$shape'.ncu-rep' --csv --page raw | grep -i -E 'pipe_tensor|Metric Name' >'$RES/attn_ncu_'\$k'_'\$shape'_tensor.csv'
      done
    done" gpu
else
  printf 'attn_sweep_ncu\tSKIP\t0\tncu is not on PATH\n' >>"$STEPS"
fi
# ---- end of issue 26's block ----

# 4. The quick sweep of every bench (CPU in a dry run). The small ops (tree, verify, commit,
#    rope) are timed twice: eagerly (what a caller without graphs pays, host overhead included)
#    and replayed from CUDA graphs (--graphs: their kernels, as the decode loop runs them).
step bench_tree_attention 75 200 "'$PY' bench/bench_tree_attention.py $BENCH_FLAGS --out '$RES'"
step bench_draft_tree 50 160 "'$PY' bench/bench_draft_tree.py $BENCH_FLAGS --out '$RES'"
step bench_draft_tree_graphs 40 120 "'$PY' bench/bench_draft_tree.py $BENCH_FLAGS --graphs --no-plot --out '$RES'" gpu
step bench_verify 40 80 "'$PY' bench/bench_verify.py $BENCH_FLAGS --out '$RES'"
step bench_verify_graphs 30 60 "'$PY' bench/bench_verify.py $BENCH_FLAGS --graphs --no-plot --out '$RES'" gpu
step bench_draft_head 40 30 "'$PY' bench/bench_draft_head.py $BENCH_FLAGS --out '$RES'"
step bench_decode 60 0 "'$PY' bench/bench_decode.py $BENCH_FLAGS --out '$RES'"

# 5. Nsight Compute on one launch of each kernel at the headline shapes (whatever time is left;
#    the KINDS.md note says ncu reads counters on Firecracker machines only).
NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats"
if command -v ncu >/dev/null 2>&1 || ((DRY)); then
  step ncu_profile 120 0 "$NCU -f -o '$RES/ncu_profile' '$PY' bench/profile_kernels.py &&
    ncu --import '$RES/ncu_profile.ncu-rep' --csv --page details >'$RES/ncu_profile.csv' &&
    '$PY' bench/profile_kernels.py --summarize '$RES/ncu_profile.csv' | tee '$RES/ncu_summary.txt'" gpu
else
  printf 'ncu_profile\tSKIP\t0\tncu is not on PATH\n' >>"$STEPS"
fi

# 6. Summary (printed last) and the results, packed into few files for the trip back.
SUMPY=$PY
"$SUMPY" -c 'import sys' 2>/dev/null || SUMPY=$SYS_PY
"$SUMPY" bench/summarize.py --steps "$STEPS" --results "$RES" >"$WORK/summary.txt" 2>&1 ||
  { echo "(summarize.py failed)"; cat "$STEPS"; } >>"$WORK/summary.txt"
echo "total $(($(date +%s) - START)) s of a ${BUDGET_S} s budget" >>"$WORK/summary.txt"
cp "$WORK/summary.txt" "$OUT/summary.txt"
[[ -f "$LOGS/nvidia_smi.log" ]] && cp "$LOGS/nvidia_smi.log" "$OUT/nvidia-smi.txt"
tar -czf "$OUT/device_check.tar.gz" -C "$WORK" logs results steps.tsv summary.txt
rm -rf "$WORK"
echo
echo "[device_check] logs, CSV and PNG: $OUT/device_check.tar.gz"
cat "$OUT/summary.txt"
