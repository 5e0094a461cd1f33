#!/usr/bin/env bash
# The Hopper attention sweep on the GPU machine (bench/attn_sweep/sweep.cu says what it
# measures): device_check.sh's attn_sweep step runs it, and so can a session by hand.
#
#   bash bench/attn_sweep.sh RESULTS_DIR          # the sweep, under $LIMIT seconds (default 25)
#   LIMIT=300 bash bench/attn_sweep.sh RESULTS_DIR --ncu   # then Nsight Compute on the fastest
#                                                  # passing kernel and on wgmma at two shapes
#
# The binary: $ATTN_SWEEP_BIN, else the carried one (.device-bundle/attn_sweep or
# build/attn_sweep/attn_sweep; build it here with `make -C bench/attn_sweep -j2` and carry it),
# else built on the machine when $LIMIT leaves 90 s for it. Shapes run in priority order (the
# compute-bound headline shapes, then the memory-bound ones, then pages and Dh 64: --shapes sets
# the order) and each row reaches attn_sweep.csv as it is measured, so a run cut by the limit
# keeps what it finished.
# Writes RESULTS_DIR/attn_sweep.csv, attn_sweep_best.txt (a complete run), attn_ncu_* (--ncu).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RES=${1:?usage: bench/attn_sweep.sh RESULTS_DIR [--ncu]}
NCU_TOO=$([[ "${2:-}" == --ncu ]] && echo 1 || echo 0)
LIMIT=${LIMIT:-25}
START=$(date +%s)
left() { echo $((START + LIMIT - $(date +%s))); }
mkdir -p "$RES"

BIN=${ATTN_SWEEP_BIN:-}
for cand in "${DEVICE_BUNDLE:-$ROOT/.device-bundle}/attn_sweep" "$ROOT/build/attn_sweep/attn_sweep"; do
  [[ -z "$BIN" && -x "$cand" ]] && "$cand" --list >/dev/null 2>&1 && BIN=$cand
done
if [[ -z "$BIN" ]]; then
  if (($(left) < 90)); then
    echo "SKIP: no attn_sweep binary carried and ${LIMIT}s is too short to build it" \
      "(make -C bench/attn_sweep -j2 here, carry build/attn_sweep)"
    exit 0
  fi
  make -C "$ROOT/bench/attn_sweep" -j16 NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" ||
    exit 3
  BIN=$ROOT/build/attn_sweep/attn_sweep
fi

# cuBLAS for the GEMM peak: torch's bundled library when torch is installed (else 790 TFLOP/s).
CUBLAS=$("${DEVICE_CHECK_PYTHON:-python3}" -c 'import glob, os, torch
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib", "libcublas.so*"))
print(sorted(libs)[0] if libs else "")' 2>/dev/null)
SHAPES=1x32Kx256,4x16Kx128,16x4Kx16,1x32Kx16,1x8Kx256,4x8Kx32,4x16Kx128_p16,16x4Kx16_p16,4x16Kx128_p64,16x4Kx16_p64,1x8Kx256_d64,16x4Kx16_d64
"$BIN" --dry-run --shapes "$SHAPES" | tail -n 1
timeout --foreground -k 2 "$(($(left) - 3))" "$BIN" --shapes "$SHAPES" --csv "$RES/attn_sweep.csv" \
  ${CUBLAS:+--cublas "$CUBLAS"}
rc=$?
((rc == 124 || rc == 137)) && echo "attn_sweep: stopped by the ${LIMIT}s limit; the CSV holds the rows it finished"
# Per shape, the fastest kernel whose output passed the check (the sweep's --best format).
awk -F, 'NR > 1 && $3 == "pass" { t = ($7 != "nan" && $7 < $6) ? $7 : $6
  if (!($2 in best) || t < best[$2]) { best[$2] = t; kernel[$2] = $1 } }
  END { for (s in kernel) print s, kernel[s] }' "$RES/attn_sweep.csv" 2>/dev/null |
  sort >"$RES/attn_sweep_best.txt"
rows=0
[[ -f "$RES/attn_sweep.csv" ]] && rows=$(($(wc -l <"$RES/attn_sweep.csv") - 1))
echo "wrote $RES/attn_sweep.csv ($rows rows)"

if ((NCU_TOO)) && command -v ncu >/dev/null 2>&1; then
  NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
--section WarpStateStats --section SchedulerStats --section SourceCounters --section ComputeWorkloadAnalysis"
  for shape in 1x32Kx256 16x4Kx16; do
    best=$(awk -v s=$shape '$1 == s {print $2}' "$RES/attn_sweep_best.txt")
    for k in ${best:-wide} wgmma; do
      (($(left) < 30)) && { echo "attn_sweep: no time left for ncu"; break 2; }
      out=$RES/attn_ncu_${k}_$shape
      timeout --foreground -k 2 "$(($(left) - 5))" $NCU -f -o "$out" "$BIN" --profile "$k" --shape "$shape" &&
        ncu --import "$out.ncu-rep" --csv --page details >"$out.csv" &&
        ncu --import "$out.ncu-rep" --csv --page raw | grep -i -E 'pipe_tensor|Metric Name' >"${out}_tensor.csv"
      rm -f "$out.ncu-rep"
    done
  done
fi
exit $rc
