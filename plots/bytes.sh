#!/bin/sh
# plots/bytes.sh: HBM bytes each stage moves, as Nsight Compute counts them (`make bytes`,
# and the last part of `make bench`). Runs on the GPU machine after `make`.
#
# For each program of BYTES_STAGES and each N of BYTES_NS (16384 tokens: B = 16384 / N,
# H = 16, d = 128, bf16, non-causal, forward), one call under
#   ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum
# and one row per shape with the DRAM bytes read and written, summed over the stage's
# kernels (every kernel of the call; the harness's own copies and fills are not kernels):
#   gpu,stage,direction,dtype,B,H,N,d,causal,kernels,dram_read_bytes,dram_write_bytes,status,note
# into plots/results/<gpu>-bytes.csv (BYTES_CSV to choose). The byte models the lessons
# derive are set beside these rows by plots/docs_tables.sh and plots/plots.sh.
#
# Environment: BYTES_STAGES ("01_naive 03_tiled 05_tensor_cores 06_fa2 cublas"),
# BYTES_NS ("1024 4096 16384"), NCU (ncu on the PATH, else the toolkit's), BUILD_DIR (build),
# RESULTS_DIR (plots/results), GPU_NAME (nvidia-smi's), BENCH_COMMIT (the commit measured, for
# the CSV's .runs line; default: git's HEAD, if any).
set -u
cd "$(dirname "$0")/.." || exit 2
STAGES=${BYTES_STAGES:-"01_naive 03_tiled 05_tensor_cores 06_fa2 cublas"}
NS=${BYTES_NS:-"1024 4096 16384"}
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-plots/results}
H=16 D=128 TOKENS=16384
NCU=${NCU:-$(command -v ncu 2>/dev/null || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
    echo "bytes: Nsight Compute (ncu) not found; no DRAM byte counts (NCU=... to point at it)" >&2
    exit 2
fi
if [ -z "${GPU_NAME:-}" ]; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
fi
[ -n "$GPU_NAME" ] || { echo "bytes: no NVIDIA GPU visible (nvidia-smi)" >&2; exit 2; }
GPU_TAG=$(printf '%s' "$GPU_NAME" | tr ' /' '--' | tr -cd 'A-Za-z0-9._-')
CSV=${BYTES_CSV:-$RESULTS_DIR/$GPU_TAG-bytes.csv}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bytes.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$CSV")"
echo 'gpu,stage,direction,dtype,B,H,N,d,causal,kernels,dram_read_bytes,dram_write_bytes,status,note' > "$CSV.part"
for s in $STAGES; do
    [ -x "$BUILD_DIR/$s" ] || { echo "bytes: $BUILD_DIR/$s not built; skipped"; continue; }
    for n in $NS; do
        b=$((TOKENS / n))
        printf 'bytes: %s forward B=%s H=%s N=%s d=%s ... ' "$s" "$b" "$H" "$n" "$D"
        rm -f "$WORK/ncu.csv"
        "$NCU" --clock-control none --csv --print-units base --log-file "$WORK/ncu.csv" \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum \
            "$BUILD_DIR/$s" --batch "$b" --heads "$H" --seqlen "$n" --dim "$D" --dtype bf16 \
            > "$WORK/app.log" 2>&1
        rc=$?
        # ncu's CSV: one quoted line per (kernel, metric); fields joined by ",". Sum the
        # values of each metric over the kernels.
        line=$(awk -v gpu="$GPU_TAG" -v s="$s" -v b="$b" -v h="$H" -v n="$n" -v d="$D" -v rc="$rc" '
            /^"/ {
                sub(/^"/, ""); sub(/"[ \r]*$/, "")
                nf = split($0, f, /","/)
                if (f[1] == "ID") { for (i = 1; i <= nf; i++) col[f[i]] = i; next }
                if (!("Metric Name" in col)) next
                v = f[col["Metric Value"]]; gsub(/,/, "", v)
                id[f[col["ID"]]] = 1
                if (f[col["Metric Name"]] == "dram__bytes_read.sum") rd += v
                if (f[col["Metric Name"]] == "dram__bytes_write.sum") wr += v
            }
            END {
                k = 0; for (x in id) k++
                st = (rc == 0 && k > 0) ? "ok" : "failed"
                note = st == "ok" ? "ncu --clock-control none" : "exit code " rc ", " k " kernels profiled"
                printf "%s,%s,forward,bf16,%d,%d,%d,%d,0,%d,%.0f,%.0f,%s,%s\n", gpu, s, b, h, n, d, k, rd, wr, st, note
            }' "$WORK/ncu.csv" 2>/dev/null)
        echo "$line" >> "$CSV.part"
        echo "$line" | awk -F, '{ printf "%s kernels, read %.3g GB, written %.3g GB (%s)\n", $10, $11 / 1e9, $12 / 1e9, $13 }'
        [ "$rc" = 0 ] || tail -n 3 "$WORK/app.log" | sed 's/^/    | /'
    done
done
mv "$CSV.part" "$CSV" && echo "bytes: wrote $CSV"
# the run, for the captions (plots/plots.sh): one run at one commit
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $GPU_NAME; commit ${COMMIT:-unknown}: plots/bytes.sh, programs $STAGES; N $NS; ncu --clock-control none" > "$CSV.runs"
