#!/bin/sh
# plots/fp8_rmse.sh: what e4m3 costs a user of the fp8 forward (docs/11_fp8.md, "What a user
# loses"), as FA-3's Table 3 measures it: the RMSE of O against the float64 attention of the
# inputs before quantization (the harness's "rmse vs the unquantized inputs" line).
#
# Runs on the GPU machine, from the repository root, after `make` (make bench PART=hopper runs
# it after the Hopper part). For every program under build/ that runs --dtype e4m3 (asked with
# one tiny call), at head dims 128 and 256: normal inputs and FA-3's outlier inputs (--inputs
# outliers), each without and with incoherent processing (--hadamard), B = 1, H = 8, N = 2048,
# one --check run each (the check against the dequantized inputs; its verdict is recorded beside
# the RMSE). The scales are the harness's, one per (batch, KV head) and tensor.
#
#   sh plots/fp8_rmse.sh      -> plots/results/<gpu>-fp8-rmse.csv and its .runs line
#
# CSV: gpu,stage,d,N,inputs,hadamard,rmse,rms_o,check,status ("ok", or "refused" / "failed"
# with the rmse empty). The file is written when the last run is done.
# Environment: BUILD_DIR (build), RESULTS_DIR (plots/results), GPU_NAME (nvidia-smi's),
# BENCH_COMMIT (the commit measured; default: git's HEAD, if any), RMSE_DIMS ("64 128 256").
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-plots/results}
DIMS=${RMSE_DIMS:-"64 128 256"}
SHAPE="--batch 1 --heads 8 --seqlen 2048"
GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
[ -n "$GPU_NAME" ] || { echo "fp8_rmse: no GPU (nvidia-smi names none)" >&2; exit 2; }
GPU_TAG=$(printf '%s' "$GPU_NAME" | tr ' ' '-')
OUT=$RESULTS_DIR/$GPU_TAG-fp8-rmse.csv
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fp8rmse.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT

progs=
for p in "$BUILD_DIR"/[0-9][0-9]_*; do
    [ -x "$p" ] || continue
    "$p" --dtype e4m3 --seqlen 128 --dim 128 > /dev/null 2>&1 && progs="$progs ${p##*/}"
done
# (none on a GPU without the fp8 stage's instructions: nothing to measure, and no file written)
[ -n "$progs" ] || { echo "fp8_rmse: no program under $BUILD_DIR runs --dtype e4m3 on this GPU: no RMSE rows"; exit 0; }

echo "gpu,stage,d,N,inputs,hadamard,rmse,rms_o,check,status" > "$WORK/csv"
for s in $progs; do
    for d in $DIMS; do
        for inputs in normal outliers; do
            for had in 0 1; do
                args="--dtype e4m3 --check $SHAPE --dim $d"
                [ $inputs = outliers ] && args="$args --inputs outliers"
                [ $had = 1 ] && args="$args --hadamard"
                printf 'fp8_rmse: %s %s ... ' "$s" "$args"
                # shellcheck disable=SC2086
                timeout 300 "$BUILD_DIR/$s" $args > "$WORK/out" 2>&1
                rc=$?
                # "  O  rmse vs the unquantized inputs X (...; RMS of O Y; ...)"
                line=$(grep 'rmse vs the unquantized inputs' "$WORK/out" | head -n 1)
                rmse=$(printf '%s' "$line" | sed -n 's/.*unquantized inputs \([0-9.e+-]*\).*/\1/p')
                rms=$(printf '%s' "$line" | sed -n 's/.*RMS of O \([0-9.e+-]*\).*/\1/p')
                check=$(grep -o 'check \(PASS\|FAIL\)' "$WORK/out" | tail -n 1 | cut -d' ' -f2)
                if [ $rc = 2 ]; then status=refused rmse= rms=
                elif [ -z "$rmse" ]; then status=failed
                else status=ok; fi
                echo "$rmse ${check:-} ($status)"
                echo "$GPU_TAG,$s,$d,2048,$inputs,$had,$rmse,$rms,${check:-},$status" >> "$WORK/csv"
            done
        done
    done
done
mkdir -p "$RESULTS_DIR" || exit 2
cp "$WORK/csv" "$OUT" || exit 2
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $GPU_NAME; commit ${COMMIT:-unknown}: plots/fp8_rmse.sh, programs$progs; B 1, H 8, N 2048, d $DIMS" > "$OUT.runs"
echo "fp8_rmse: $OUT"
