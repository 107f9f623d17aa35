#!/bin/sh
# plots/profile.sh STAGE [ARGS...]: Nsight Compute on one stage program, a fixed metric set,
# summarised in one table per kernel (`make profile STAGE=n [ARGS="..."]`). GPU machine, after make.
#
#   sh plots/profile.sh 06_fa2 --batch 2 --heads 16 --seqlen 8192 --dim 128 [--backward]
#
# One call of the program (no --bench: the harness runs the stage once; with --backward, the
# forward and then the backward) under `ncu --clock-control none` (clocks left as the GPU
# has them), with these metrics for every kernel of the call:
#   time        gpu__time_duration.sum
#   DRAM bytes  dram__bytes_read.sum, dram__bytes_write.sum
#   occupancy   sm__warps_active.avg.pct_of_peak_sustained_active (achieved, % of the SM's warps)
#   tensor pipe regex:sm__pipe_tensor_op_.*_cycles_active.avg.pct_of_peak_sustained_active
#   stalls      regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio: cycles a warp
#               waits per issued instruction, by reason; the five largest are listed
# The raw CSV goes to PROFILE_OUT (default build/profile-<stage>.csv); the table to stdout.
# Environment: NCU (ncu on the PATH, else the toolkit's), BUILD_DIR (build).
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] || { echo "usage: sh plots/profile.sh STAGE [ARGS...]   (make profile STAGE=n ARGS=...)" >&2; exit 2; }
stage=$1; shift
BUILD_DIR=${BUILD_DIR:-build}
case $stage in
    [0-9]) stage=$(cd stages && ls -d 0"$stage"_* 2>/dev/null | head -n 1) ;;
    [0-9][0-9]) stage=$(cd stages && ls -d "$stage"_* 2>/dev/null | head -n 1) ;;
esac
[ -n "$stage" ] && [ -x "$BUILD_DIR/$stage" ] || { echo "profile: no program $BUILD_DIR/${stage:-?} (make first; STAGE=n or a name)" >&2; exit 2; }
NCU=${NCU:-$(command -v ncu 2>/dev/null || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
[ -n "$NCU" ] && [ -x "$NCU" ] || { echo "profile: Nsight Compute (ncu) not found (NCU=... to point at it)" >&2; exit 2; }
OUTF=${PROFILE_OUT:-$BUILD_DIR/profile-$stage.csv}
"$NCU" --clock-control none --csv --print-units base --log-file "$OUTF" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,regex:sm__pipe_tensor_op_.*_cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    "$BUILD_DIR/$stage" "$@" > "$BUILD_DIR/profile-$stage.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
    echo "profile: ncu or $stage exited $rc; its output: $BUILD_DIR/profile-$stage.log" >&2
    tail -n 5 "$BUILD_DIR/profile-$stage.log" >&2
    exit 1
fi
echo "$stage $* (ncu --clock-control none; raw: $OUTF)"
# ncu's CSV: one quoted line per (kernel launch, metric); fields joined by ",".
awk '
    /^"/ {
        sub(/^"/, ""); sub(/"[ \r]*$/, "")
        nf = split($0, f, /","/)
        if (f[1] == "ID") { for (i = 1; i <= nf; i++) col[f[i]] = i; next }
        if (!("Metric Name" in col)) next
        id = f[col["ID"]]; name = f[col["Kernel Name"]]; sub(/\(.*/, "", name)
        if (!(id in kname)) { kname[id] = name; order[++nk] = id }
        v = f[col["Metric Value"]]; gsub(/,/, "", v)
        val[id, f[col["Metric Name"]]] = v
        mets[f[col["Metric Name"]]] = 1
    }
    END {
        printf "| kernel | time ms | DRAM read GB | DRAM written GB | achieved occupancy %% | tensor pipe %% | largest stall reasons (cycles per issue) |\n"
        printf "|---|--:|--:|--:|--:|--:|---|\n"
        for (k = 1; k <= nk; k++) {
            id = order[k]
            tp = "-"
            for (m in mets) if (m ~ /^sm__pipe_tensor_op_.*_cycles_active/ && (id, m) in val)
                if (tp == "-" || val[id, m] + 0 > tp + 0) tp = val[id, m]
            n = 0
            for (m in mets) if (m ~ /^smsp__average_warps_issue_stalled_/ && (id, m) in val) {
                r = m; sub(/^smsp__average_warps_issue_stalled_/, "", r); sub(/_per_issue_active.ratio$/, "", r)
                n++; sname[n] = r; sval[n] = val[id, m] + 0
            }
            for (i = 2; i <= n; i++)    # insertion sort, largest first (mawk has no asort)
                for (j = i; j > 1 && sval[j - 1] < sval[j]; j--) {
                    t = sval[j]; sval[j] = sval[j - 1]; sval[j - 1] = t
                    t = sname[j]; sname[j] = sname[j - 1]; sname[j - 1] = t
                }
            st = ""
            for (i = 1; i <= n && i <= 5; i++) st = st (i > 1 ? ", " : "") sprintf("%s %.2f", sname[i], sval[i])
            printf "| %s | %.3f | %.3f | %.3f | %.1f | %s | %s |\n", kname[id],
                val[id, "gpu__time_duration.sum"] / 1e6, val[id, "dram__bytes_read.sum"] / 1e9,
                val[id, "dram__bytes_write.sum"] / 1e9, val[id, "sm__warps_active.avg.pct_of_peak_sustained_active"],
                tp == "-" ? "-" : sprintf("%.1f", tp), st == "" ? "-" : st
        }
    }' "$OUTF"
