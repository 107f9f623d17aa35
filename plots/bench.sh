#!/bin/sh
# plots/bench.sh: the measurements behind every plot and README table (`make bench`).
#
# Runs on the GPU machine, from the repository root, after `make`. Needs only a POSIX sh,
# coreutils and awk; python3 with a CUDA build of torch is optional (the PyTorch anchors).
#
#   1. The sweep (the FlashAttention papers' protocol): 16384 tokens in total
#      (B = 16384/N), hidden 2048 (H = H_kv = 2048/d), bf16, N = 512 ... 16384,
#      d = 64 and 128, causal and not, forward and backward, for every built stage
#      program build/NN_* in order, then build/cublas. A stage whose next N would take more
#      than SWEEP_MAX_CALL_S seconds a call (2x the last: the tokens are fixed, so the work
#      grows as N) is not tried at that N or larger ones of the series (stage, direction, d,
#      causal): that N gets a row with status "skipped" and the prediction, as in the long
#      context.                                             -> plots/results/<gpu>.csv
#   2. The long-context wall: B = 1, H = 16, d = 128, N = 8192 ... 1048576, non-causal and
#      causal (LONG_CAUSALS), every stage, forward and backward; a stage that refuses an N
#      (stage 1: S does not fit) is not tried at larger N, nor is one whose next N would take
#      more than LONG_MAX_CALL_S seconds a call (4x the last: the work grows as N^2); that N
#      gets a row with status "skipped" and the prediction. Plus the sliding-window series of
#      every stage with masks: --causal --window LONG_WINDOW (4096), the same N, whose work
#      grows as N W (2x the last; note "window=4096; ").
#                                                       -> plots/results/<gpu>-long.csv
#      (A separate file because the sweep's N = 16384, d = 128 point is also B=1 H=16.)
#   3. The anchors: PyTorch's FLASH and cuDNN attention on the same shapes (plots/anchors.py;
#      the long ones up to N = LONG_ANCHOR_MAX_N, 131072), plus one bf16 GEMM ceiling row,
#      appended to both files.
#   4. The masks: B = 2, H = 16, d = 128, N = 8192 (MASKS_N), bf16, forward and backward, one
#      pattern after the other (MASK_PATTERNS): dense, dense causal, --mask random:0.5, 0.25,
#      0.1, and --causal --window 4096 and 1024; the dense ones for MASKS_REF (06_fa2 and
#      10_fa3_backward, the dense parents of stages 12 and 13) and the programs with masks,
#      the masked ones for the programs with masks (a dense stage refuses them: see
#      accepts_masks), and PyTorch's FlexAttention (torch_flex, plots/anchors.py) on the
#      identical masks: the block mask a stage ran with is saved by its run (--save:
#      block_mask.npy) and handed to the anchor, every pattern to one python process (torch is
#      imported and set up once; --pattern).
#                                                       -> plots/results/<gpu>-masks.csv
#   5. The Hopper part (PART=hopper, which make bench runs after the others): the sweep's
#      protocol on the Hopper stages, stage 6 and the anchors at d = 64, 128 and 256,
#      N = 2048 ... 16384, plus the e4m3 forward (FP8=1, the default there): every program
#      that runs --dtype e4m3 (asked with one tiny call: runs_e4m3), forward only, on the same
#      shapes, rows with dtype e4m3 (a head dim the stage lacks gets its refused rows, as any
#      refusal), and cuDNN's fp8 attention (the anchor cudnn_fp8, plots/anchors.py; forward,
#      e4m3) on the same shapes. A program that runs e4m3 only (an fp8 stage) gets no bf16
#      points in any part.                             -> plots/results/<gpu>-hopper.csv
# Correctness is the tests' job: no --check here.
#
# Usage:
#   sh plots/bench.sh                      everything above, into fresh files
#   PART=sweep|long|masks sh plots/bench.sh
#                                          one part alone (make bench PART=...): its CSV is
#                                          replaced whole, one run at one commit
#   PART=hopper STAGES="07_wgmma 08_fa3 09_fa3_persistent 11_fp8 torch" sh plots/bench.sh
#                                          the Hopper stages' part alone (make bench PART=hopper),
#                                          11_fp8's points e4m3 (FP8=0: bf16 points only)
#   STAGES="06_fa2 torch" DIMS=128 RESULTS_DIR=/tmp/x sh plots/bench.sh
#                                          a subset, for a look (a committed CSV holds one
#                                          whole run: never merge rows of runs into it)
#   sh plots/bench.sh --summary [CSV]      print the summary tables of a CSV, run nothing
#
# Environment (all optional):
#   STAGES     programs under build/ to run, e.g. "03_tiled 06_fa2 cublas"; "torch" adds the
#              four anchors, "torch_flash" / "torch_cudnn" / "torch_flex" / "cudnn_fp8" one
#              (torch_flex is measured in the masks part only, cudnn_fp8 in the sweep with
#              FP8=1 only, the other two in the sweep and the long context only).
#                                                                  default: all built + torch
#   NS DIMS CAUSALS    sweep subset            default: "512 ... 16384", "64 128", "0 1"
#   DIRS       "forward backward" or one of them (every part)      default: both
#   SWEEP=0    skip the sweep;  LONG=0  skip the long-context wall;  MASKS=0  skip the masks
#   FP8=0|1    1: the sweep also times the e4m3 forward of the programs that run it, and
#              cudnn_fp8 on its shapes (only plots/hopper_tables.sh has e4m3 tables: outside
#              the Hopper part it is for a look)     default: 1 with PART=hopper, else 0
#   LONG_NS    the long context's N list                 default: "8192 16384 ... 1048576"
#   LONG_CAUSALS  its dense series: 0 non-causal, 1 causal            default: "0 1"
#   LONG_WINDOW   W of its sliding-window series (--causal --window W; stages with masks);
#              0: none                                             default: 4096
#   LONG_WINDOW_NS  that series' N list                            default: LONG_NS
#   LONG_ANCHOR_MAX_N  the anchors' long shapes stop there           default: 131072
#   MASK_PATTERNS  the masks part's patterns, in order: dense, causal, window:W (causal
#              sliding window), or a --mask PATTERN (random:D, local:W, ...)
#                          default: "dense causal random:0.5 random:0.25 random:0.1 window:4096 window:1024"
#   MASKS_N    the masks part's N (B = 2, H = 16, d = 128)         default: 8192
#   ANCHORS=0|1  skip / force the torch anchors            default: 1 unless STAGES omits torch
#   MERGE=0|1  1: replace only the rows this run measured (same stage, direction, shape and
#              mask: the note's window=, mask=, block-mask= fields, plots/masks.awk) and keep
#              the rest, for files that are not committed; 0: fresh files.   default: 0
#   RESULTS_DIR  where the CSVs go (plots/results); BENCH_CSV, BENCH_LONG_CSV, BENCH_MASKS_CSV
#              exact paths
#   POINTS=0|1 1: a stage's points of one part go to one process of it (--points -, fed a
#              line at a time, so that what a point measured still decides the next one: the
#              budgets below), which pays the CUDA context's start once; its rows are those of
#              a process per point. If that process ends mid-point (a crash, the timeout) or
#              loses its CUDA context, the stage's remaining points of the part run one
#              process each, as with 0.                                        default: 1
#   SEED (1), POINT_TIMEOUT seconds per point, a whole number (300), BUILD_DIR (build),
#   SWEEP_MAX_CALL_S  the sweep's time budget of one call, in seconds (2: what it stops is
#              stages 1 and 2 at their largest N, calls of 2.5 to 7 s, each made twice: the
#              settling run, then the timed one),
#   LONG_MAX_CALL_S  the long-context time budget of one call, in seconds (2: the fastest
#              stages, ~600 TFLOP/s, reach N = 262144 non-causal, 5.6e14 FLOP in ~0.94 s,
#              and 524288 causal in ~1.9 s; past that a dense call is 4x longer, while the
#              window series reaches 1M; it keeps the whole make bench near 20 minutes),
#   GPU_NAME   overrides nvidia-smi's name (the file name is the name with spaces -> '-')
#
# Rows are collected in <csv>.part and moved onto <csv> only when the run finishes, so an
# interrupted sweep never leaves a half-filled results file behind to be committed; the
# .part file stays for inspection (delete it; never commit it).

set -u
cd "$(dirname "$0")/.." || exit 2

HEADER='gpu,stage,direction,dtype,B,H,H_kv,N_q,N_k,d,causal,median_ms,tflops,workspace_bytes,status,note'
TOKENS=16384        # the papers' protocol: B * N = 16384 tokens ...
HIDDEN=2048         # ... and H * d = 2048
LONG_B=1
LONG_H=16
LONG_D=128
MASKS_B=2           # the masks part: B = 2, H = 16, d = 128 (and MASKS_N)
MASKS_H=16
MASKS_D=128
SUMMARY_N=8192      # the sequence length the summary tables quote
# which mask a row was measured with, from its note (mask_key and friends)
MASKS_AWK=$(cat plots/masks.awk) || exit 2

# --------------------------------------------------------------------------------------
# Summary tables (also the --summary mode).

# summary CSV [LONG_CSV [MASKS_CSV]]: TFLOP/s at N = SUMMARY_N per stage, the ratio of 06_fa2
# (or $RATIO_STAGE) to torch_flash per shape, the longest N each stage ran in each series of
# the long context, and the masks' times (of the CSVs that exist).
summary() {
    if [ -s "$1" ]; then summary_sweep "$1"; else echo "summary: no rows in $1"; fi
    summary_more "${2:-}" "${3:-}"
}

# summary_sweep CSV: the sweep's tables
summary_sweep() {
    echo
    echo "TFLOP/s at N=$SUMMARY_N (bf16; \"STAGE e4m3\": its e4m3 rows; '-' none or skipped; R refused; F failed): $1"
    # the columns: d = 64 and 128, and 256 where the file has it (the Hopper part)
    cols="fwd d64,fwd d64 c,fwd d128,fwd d128 c"
    awk -F, 'FNR > 1 && $10 == 256 { f = 1; exit } END { exit !f }' "$1" && cols="$cols,fwd d256,fwd d256 c"
    cols="$cols,$(echo "$cols" | sed 's/fwd/bwd/g')"
    awk -F, -v n="$SUMMARY_N" -v cols="$cols" '
        FNR == 1 || $10 == 0 { next }                     # header; the GEMM ceiling row
        $8 == n && $15 != "skipped" {                     # skipped: past the time budget
            c = $3 == "forward" ? "fwd" : "bwd"
            col = c " d" $10 ($11 == 1 ? " c" : "")
            v = $15 == "ok" ? sprintf("%.1f", $13) : ($15 == "refused" ? "R" : "F")
            s = $2 ($4 == "bf16" ? "" : " " $4)           # a stage may run both dtypes
            cell[s, col] = v; stages[s] = 1
        }
        END {
            ncol = split(cols, cl, ",")
            for (s in stages) {
                line = sprintf("%-18s", s)
                for (i = 1; i <= ncol; i++)
                    line = line sprintf(" %10s", ((s, cl[i]) in cell) ? cell[s, cl[i]] : "-")
                print line
            }
        }' "$1" > "$WORK/summary.txt"
    printf '%-18s' stage
    echo "$cols" | tr ',' '\n' | while IFS= read -r c; do printf ' %10s' "$c"; done
    echo "   (c = causal)"
    sort "$WORK/summary.txt"

    rs=${RATIO_STAGE:-06_fa2}
    if grep -q ",$rs," "$1" && grep -q ',torch_flash,' "$1"; then
        echo
        echo "$rs / torch_flash (TFLOP/s ratio, bf16) per shape:"
        awk -F, -v rs="$rs" '
            FNR == 1 || $15 != "ok" || $10 == 0 || $4 != "bf16" { next }
            $2 == rs || $2 == "torch_flash" {
                k = sprintf("%-8s d=%-3s causal=%s", $3, $10, $11)
                t[$2, k, $8] = $13; shapes[k] = 1; ns[$8] = 1
            }
            END {
                nn = 0; for (n in ns) nlist[++nn] = n + 0
                for (i = 2; i <= nn; i++)             # insertion sort: mawk has no asort
                    for (j = i; j > 1 && nlist[j - 1] > nlist[j]; j--) {
                        x = nlist[j]; nlist[j] = nlist[j - 1]; nlist[j - 1] = x
                    }
                head = sprintf("%-26s", "")
                for (i = 1; i <= nn; i++) head = head sprintf(" %7s", nlist[i])
                print head
                fflush()                          # before sort writes its lines
                for (k in shapes) {
                    line = sprintf("%-26s", k)
                    for (i = 1; i <= nn; i++) {
                        a = t[rs, k, nlist[i]]; b = t["torch_flash", k, nlist[i]]
                        line = line ((a != "" && b > 0) ? sprintf(" %7.2f", a / b) : sprintf(" %7s", "-"))
                    }
                    print line | "sort"
                }
            }' "$1"
    fi

}

# summary_more [LONG_CSV] [MASKS_CSV]: the long context's and the masks' tables
summary_more() {
    if [ -n "${1:-}" ] && [ -s "$1" ]; then
        echo
        echo "Longest N per stage and series (B=$LONG_B H=$LONG_H d=$LONG_D): $1"
        awk -F, "$MASKS_AWK"'
            FNR == 1 { next }
            {
                k = sprintf("%-14s %-8s %-20s", $2, $3, mask_label($11, mask_key($16)))
                if ($15 == "ok" && $8 + 0 > best[k]) best[k] = $8 + 0
                if ($15 != "ok" && !(k in stop)) stop[k] = $15 " at N=" $8 ": " $16
                seen[k] = 1
            }
            END { for (k in seen) printf "%s %7s  %s\n", k, (k in best) ? best[k] : "-", stop[k] }' "$1" | sort
    fi
    if [ -n "${2:-}" ] && [ -s "$2" ]; then
        echo
        echo "Masks (B=$MASKS_B H=$MASKS_H d=$MASKS_D): ms per call, TFLOP/s of the visible pairs: $2"
        awk -F, "$MASKS_AWK"'
            FNR == 1 || $10 == 0 { next }
            {
                k = mask_key($16)
                v = $15 == "ok" ? sprintf("%.3f ms %6.1f", $12, $13) : $15
                r = mask_rank($11, k, mask_fraction($8, $11, $16))
                printf "%08.4f\t%-24s N=%-6s %-16s %-8s %s\n", r, mask_label($11, k), $8, $2, $3, v
            }' "$2" | sort -t "$(printf '\t')" -k1,1 -s | cut -f2
    fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench.XXXXXX") || exit 2
# the stage whose points process is open (POINTS=1, cp_open), and its pid
cp_stage= cp_pid=
cp_kill() { [ -z "$cp_pid" ] || kill "$cp_pid" 2>/dev/null; cp_stage= cp_pid=; }
trap 'cp_kill; rm -rf "$WORK"' EXIT
# Interrupted (e.g. by `timeout`): with MERGE=1 the rows measured so far are merged in, since
# each one is complete; otherwise they stay in the .part file.
ACTIVE_CSV= ACTIVE_RUN=
on_interrupt() {
    cp_kill
    echo
    if [ "$MERGE" = 1 ] && [ -n "$ACTIVE_CSV" ]; then
        echo "bench: interrupted; merging the rows measured so far"
        finish_csv "$ACTIVE_CSV" "$ACTIVE_RUN"
    else
        echo "bench: interrupted; the rows so far are in the .part file(s)"
    fi
    exit 130
}
trap on_interrupt INT TERM

if [ "${1:-}" = --summary ]; then
    csv=${2:-}
    if [ -z "$csv" ]; then
        for f in plots/results/*.csv; do
            case $f in *-long.csv | *-masks.csv | *-bytes.csv | *-hopper.csv | *-ablation.csv) ;; *) [ -f "$f" ] && csv=$f && break ;; esac
        done
    fi
    if [ -z "$csv" ] || [ ! -f "$csv" ]; then echo "bench: no CSV to summarise" >&2; exit 2; fi
    summary "$csv" "${csv%.csv}-long.csv" "${csv%.csv}-masks.csv"
    exit 0
fi

# --------------------------------------------------------------------------------------
# Settings.

# PART=hopper: the Hopper stages beside the anchors and stage 6 (the fastest mma.sync backward)
# at d = 64, 128 and 256, forward and backward (STAGES: the Makefile passes them and torch), one run into <gpu>-hopper.csv (plots/hopper_tables.sh reads
# it), with the e4m3 forward (FP8=1); the sweep's, long-context and masks files are left as they are.
case ${PART:-} in
    ""|hopper) ;;
    sweep) SWEEP=1 LONG=0 MASKS=0 ;;
    long)  SWEEP=0 LONG=1 MASKS=0 ;;
    masks) SWEEP=0 LONG=0 MASKS=1 ;;
    *) echo "bench: PART=$PART: one of sweep, long, masks, hopper" >&2; exit 2 ;;
esac
if [ "${PART:-}" = hopper ]; then
    DIMS=${DIMS:-"64 128 256"} NS=${NS:-"2048 4096 8192 16384"} DIRS=${DIRS:-"forward backward"}
    SWEEP=1 LONG=0 MASKS=0 MERGE=0 FP8=${FP8:-1}
    BENCH_CSV=${BENCH_CSV:-}
    PART_SUFFIX=-hopper PART_NAME=hopper
fi
filtered=0
for v in "${STAGES:-}" "${NS:-}" "${DIMS:-}" "${CAUSALS:-}" "${DIRS:-}" "${LONG_NS:-}" \
         "${LONG_CAUSALS:-}" "${LONG_WINDOW:-}" "${LONG_WINDOW_NS:-}" "${MASK_PATTERNS:-}" \
         "${MASKS_N:-}"; do
    [ -n "$v" ] && filtered=1
done
MERGE=${MERGE:-0}   # a committed CSV is one whole run ($filtered: a subset was asked for)
NS=${NS:-"512 1024 2048 4096 8192 16384"}
DIMS=${DIMS:-"64 128"}
CAUSALS=${CAUSALS:-"0 1"}
DIRS=${DIRS:-"forward backward"}
LONG_NS=${LONG_NS:-"8192 16384 32768 65536 131072 262144 524288 1048576"}
LONG_CAUSALS=${LONG_CAUSALS:-"0 1"}
LONG_WINDOW=${LONG_WINDOW:-4096}
LONG_WINDOW_NS=${LONG_WINDOW_NS:-$LONG_NS}
LONG_ANCHOR_MAX_N=${LONG_ANCHOR_MAX_N:-131072}
MASK_PATTERNS=${MASK_PATTERNS:-"dense causal random:0.5 random:0.25 random:0.1 window:4096 window:1024"}
MASKS_REF=${MASKS_REF:-"06_fa2 10_fa3_backward"}   # the dense stages the masks part also runs (unmasked patterns)
MASKS_N=${MASKS_N:-8192}
SWEEP=${SWEEP:-1}
LONG=${LONG:-1}
MASKS=${MASKS:-1}
FP8=${FP8:-0}
SEED=${SEED:-1}
POINT_TIMEOUT=${POINT_TIMEOUT:-300}
POINTS=${POINTS:-1}
TAB=$(printf '\t')
if [ "$POINTS" = 1 ]; then   # the points processes' timeout is the program's --timeout
    case $POINT_TIMEOUT in
        "" | *[!0-9]* | 0) echo "bench: POINT_TIMEOUT=$POINT_TIMEOUT is not a whole number of seconds: one process a point (POINTS=0)"
                           POINTS=0 ;;
    esac
    command -v mkfifo >/dev/null || { echo "bench: no mkfifo: one process a point (POINTS=0)"; POINTS=0; }
fi
SWEEP_MAX_CALL_S=${SWEEP_MAX_CALL_S:-2}
LONG_MAX_CALL_S=${LONG_MAX_CALL_S:-2}
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-plots/results}

if [ -z "${GPU_NAME:-}" ]; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
fi
if [ -z "$GPU_NAME" ]; then   # rows of "no CUDA GPU" would only bury real results
    echo "bench: no NVIDIA GPU visible (nvidia-smi); nothing measured (GPU_NAME=... to force)" >&2
    exit 2
fi
GPU_NAME=$(printf '%s' "$GPU_NAME" | tr -d ',')
GPU_TAG=$(printf '%s' "$GPU_NAME" | tr ' /' '--' | tr -cd 'A-Za-z0-9._-')
CSV=${BENCH_CSV:-$RESULTS_DIR/$GPU_TAG${PART_SUFFIX:-}.csv}
LONG_CSV=${BENCH_LONG_CSV:-$RESULTS_DIR/$GPU_TAG-long.csv}
MASKS_CSV=${BENCH_MASKS_CSV:-$RESULTS_DIR/$GPU_TAG-masks.csv}
mkdir -p "$(dirname "$CSV")" "$(dirname "$LONG_CSV")" "$(dirname "$MASKS_CSV")" || exit 2

# in_words W WORD...: whether W is one of the WORDs
in_words() { iw=$1; shift; for w in "$@"; do [ "$w" = "$iw" ] && return 0; done; return 1; }

# The programs to run, in ladder order, and which anchors.
programs=
anchors=
if [ -z "${STAGES:-}" ]; then
    for f in "$BUILD_DIR"/[0-9][0-9]_*; do
        case $f in *.*) continue ;; esac          # build/01_naive.ptxas.log and the like
        [ -f "$f" ] && [ -x "$f" ] && programs="$programs ${f##*/}"
    done
    [ -x "$BUILD_DIR/cublas" ] && programs="$programs cublas"
    anchors="flash cudnn flex cudnn_fp8"
else
    for s in $STAGES; do
        case $s in
            torch) anchors="flash cudnn flex cudnn_fp8" ;;
            torch_flash | torch_cudnn | torch_flex) anchors="$anchors ${s#torch_}" ;;
            cudnn_fp8) anchors="$anchors cudnn_fp8" ;;
            *)  if [ -x "$BUILD_DIR/$s" ]; then programs="$programs $s"
                else echo "bench: $BUILD_DIR/$s is not built; skipped (make $BUILD_DIR/$s)"; fi ;;
        esac
    done
fi
case ${ANCHORS:-} in
    0) anchors= ;;
    1) [ -n "$anchors" ] || anchors="flash cudnn flex cudnn_fp8" ;;
esac
# cudnn_fp8 is the anchor of the e4m3 rows: without them (FP8=0, or no forward) it has nothing
# to stand beside
case " $anchors " in
    *" cudnn_fp8 "*)
        if [ "$FP8" != 1 ] || [ "$SWEEP" = 0 ] || ! in_words forward $DIRS; then
            case " ${STAGES:-} " in
                *" cudnn_fp8 "*) echo "bench: cudnn_fp8 not run: it times the e4m3 forward of the sweep (FP8=1, SWEEP=1, DIRS with forward; PART=hopper has them)" ;;
            esac
            anchors=$(for a in $anchors; do [ "$a" = cudnn_fp8 ] || printf '%s ' "$a"; done)
            anchors=${anchors% }
        fi ;;
esac
[ -n "$programs$anchors" ] || { echo "bench: nothing to run (no build/NN_* programs: run make)" >&2; exit 2; }
# SDPA's backends time the sweep and the long context; FlexAttention the masks; cuDNN's fp8
# attention the sweep's e4m3 forward
sdpa_anchors= flex_anchor= fp8_anchor=
for a in $anchors; do
    case $a in flex) flex_anchor=flex ;; cudnn_fp8) fp8_anchor=cudnn_fp8 ;; *) sdpa_anchors="$sdpa_anchors $a" ;; esac
done
sdpa_anchors=${sdpa_anchors# }

# --------------------------------------------------------------------------------------
# One measurement.

count_lines() { if [ -f "$1" ]; then wc -l < "$1"; else echo 0; fi; }

# --foreground keeps the program in our process group, so Ctrl-C reaches it too.
if timeout --foreground 1 true >/dev/null 2>&1; then
    with_timeout() { wt=$1; shift; timeout --foreground "$wt" "$@"; }
else
    with_timeout() { shift; "$@"; }
fi

# The dtype of the points run_point and over_budget write: bf16 but for the sweep's e4m3 ones.
point_dtype=bf16

# run_point CSV STAGE DIRECTION B H N D CAUSAL PREFIX [FLAG...]: runs one program on one
# shape (dtype point_dtype), with the extra FLAGs (--window W, --mask P, --save DIR), makes sure the CSV got its
# row (a crash or a timeout writes none, so we add a failed one whose note starts with
# PREFIX, the mask fields the program would have written: "window=W; "), prints the outcome
# and sets POINT_STATUS to ok, refused or failed.
run_point() {
    rp_csv=$1 rp_stage=$2 rp_dir=$3 rp_b=$4 rp_h=$5 rp_n=$6 rp_d=$7 rp_causal=$8 rp_prefix=$9
    shift 9
    set -- --batch "$rp_b" --heads "$rp_h" --kv-heads "$rp_h" \
        --seqlen "$rp_n" --dim "$rp_d" --dtype "$point_dtype" --bench --seed "$SEED" --csv "$rp_csv" "$@"
    [ "$rp_causal" = 1 ] && set -- "$@" --causal
    [ "$rp_dir" = backward ] && set -- "$@" --backward
    rp_before=$(count_lines "$rp_csv")
    cp_ended=
    if ! points_mode "$rp_stage" "$@" || ! cp_point "$rp_stage" "$@"; then
        with_timeout "$POINT_TIMEOUT" "$BUILD_DIR/$rp_stage" "$@" > "$WORK/point.log" 2>&1
        rp_rc=$?
    fi
    if [ "$(count_lines "$rp_csv")" -le "$rp_before" ]; then
        if [ "$rp_rc" = 124 ]; then rp_note="timed out after $POINT_TIMEOUT s"
        else rp_note="exit code $rp_rc without a row"; fi
        [ -s "$rp_csv" ] || echo "$HEADER" > "$rp_csv"
        echo "$GPU_TAG,$rp_stage,$rp_dir,$point_dtype,$rp_b,$rp_h,$rp_h,$rp_n,$rp_n,$rp_d,$rp_causal,,,,failed,$rp_prefix$rp_note" >> "$rp_csv"
    fi
    POINT_STATUS=$(tail -n 1 "$rp_csv" | awk -F, '{ print $15 }')
    tail -n 1 "$rp_csv" | awk -F, '
        $15 == "ok" { printf "%.3f ms  %.1f TFLOP/s\n", $12, $13; next }
        { printf "%s: %s\n", $15, $16 }'
    if [ "$POINT_STATUS" = failed ] || [ -n "$cp_ended" ]; then
        tail -n 5 "$WORK/point.log" | sed 's/^/    | /'
    fi
    if [ -n "$cp_ended" ]; then
        cp_broken=$rp_stage
        echo "    ($rp_stage's points process $cp_ended: its other points of this part run one process each)"
    fi
}

# ---- A stage's points in one process (POINTS=1): build/STAGE --points -, whose standard input
# is a FIFO the bench writes each point's flags to (fd 3), as one line, when the point before
# it is done, and whose output (stdout and stderr) another FIFO it reads (fd 4), up to the
# point's last line, "STAGE: point I (line L): exit E, S s" (common/cli.c). The program checks,
# runs and writes each row as a process of its own would; the bench decides the next point
# from the row, as before. One process a stage and part: it is closed when the next point is
# another stage's, and at the part's end (finish_csv), before the anchors.
cp_broken=   # the stage whose process ended in this part (cp_ended): one process a point
# points_mode STAGE FLAG...: whether this point goes to STAGE's points process
points_mode() {
    [ "$POINTS" = 1 ] && [ "$1" != "$cp_broken" ] || return 1
    shift
    for pm_a in "$@"; do   # a points line is split at blanks: a path with one goes alone
        case $pm_a in *" "* | *"$TAB"*) return 1 ;; esac
    done
    return 0
}
# cp_open STAGE: starts STAGE's points process (the FIFOs open in the same order on both sides)
cp_open() {
    rm -f "$WORK/cp.in" "$WORK/cp.out"
    mkfifo "$WORK/cp.in" "$WORK/cp.out" || return 1
    "$BUILD_DIR/$1" --points - --timeout "$POINT_TIMEOUT" < "$WORK/cp.in" > "$WORK/cp.out" 2>&1 &
    cp_pid=$! cp_stage=$1
    exec 3> "$WORK/cp.in" 4< "$WORK/cp.out"
}
# cp_close: closing its input ends the open process (what it still says goes to the point's
# log); cp_rc its exit status
cp_close() {
    [ -n "$cp_pid" ] || return 0
    exec 3>&-
    cat <&4 >> "$WORK/point.log"
    exec 4<&-
    wait "$cp_pid"
    cp_rc=$?
    cp_stage= cp_pid=
}
# cp_point STAGE FLAG...: one point by STAGE's points process (started first if another
# stage's or none is open), its output into the point's log. 1 if no process could start (the
# point did not run); else 0, rp_rc the point's exit status, and cp_ended empty, or why the
# process ended: with the point's row written ("lost its CUDA context"), or during the point
# (rp_rc then the process's status: 124 for the timeout, as timeout(1)).
cp_point() {
    cp_want=$1
    shift
    if [ "$cp_stage" != "$cp_want" ]; then cp_close; cp_open "$cp_want" || return 1; fi
    : > "$WORK/point.log"
    trap '' PIPE   # a process already gone: the write fails, and the read sees its end
    printf '%s\n' "$*" >&3
    trap - PIPE
    while IFS= read -r cp_line <&4; do
        case $cp_line in
            "$cp_want: point "*"): exit "*)
                cp_e=${cp_line##*): exit }
                rp_rc=${cp_e%%,*}
                case $cp_line in *"no more points") cp_close; cp_ended="lost its CUDA context" ;; esac
                return 0 ;;
        esac
        printf '%s\n' "$cp_line" >> "$WORK/point.log"
    done
    [ -z "$cp_line" ] || printf '%s\n' "$cp_line" >> "$WORK/point.log"
    cp_close
    rp_rc=$cp_rc cp_ended="ended during the point (exit $cp_rc)"
    return 0
}

# over_budget CSV STAGE DIRECTION B H N D CAUSAL PREFIX LAST_MS GROWTH NAME CAP: whether the
# call of this point, predicted as GROWTH times the median LAST_MS (ms) of the series' last N
# (empty: none measured, nothing predicted), would take more than CAP seconds, the budget NAME
# (SWEEP_MAX_CALL_S, LONG_MAX_CALL_S). If so, the point is not run: the CSV gets its row with
# status skipped and the prediction (the note starting with PREFIX, as run_point's), the
# outcome is printed, and the status is 0.
over_budget() {
    ob_ms=${10} ob_growth=${11} ob_name=${12} ob_cap=${13}
    [ -n "$ob_ms" ] && awk -v ms="$ob_ms" -v g="$ob_growth" -v cap="$ob_cap" \
        'BEGIN { exit !(g * ms / 1000 > cap) }' || return 1
    # seconds: whole ones from 10 s, tenths below (a prediction just past a cap of a few s)
    ob_pred=$(awk -v ms="$ob_ms" -v g="$ob_growth" 'BEGIN { p = g * ms / 1000; printf (p < 10 ? "%.1f" : "%.0f"), p }')
    echo "skipped: predicted $ob_pred s a call > $ob_name = $ob_cap s"
    echo "$GPU_TAG,$2,$3,$point_dtype,$4,$5,$5,$6,$6,$7,$8,,,,skipped,$9predicted $ob_pred s a call (${ob_growth}x N/2's) > the bench's $ob_name = $ob_cap s" >> "$1"
}

# start_csv FILE [RUN]: the .part file this run collects its rows in; RUN: the line its
# finish_csv will write (for an interrupted run's merge)
start_csv() {
    if [ -e "$1.part" ]; then echo "bench: discarding $1.part left by an earlier run"; fi
    rm -f "$1.part"
    ACTIVE_CSV=$1 ACTIVE_RUN=${2:-}
}

# finish_csv FILE [RUN]: moves the collected rows into place; with MERGE=1, rows of FILE that
# this run did not re-measure (key: stage, direction, dtype, shape and mask: the note's
# window=, mask= and block-mask= fields, mask_key in plots/masks.awk) are kept.
# FILE.runs gets one line per run whose rows FILE holds (a fresh file: this run's line only;
# a merge: the line appended), which plots/plots.sh --sources reads to say when a file mixes
# runs; RUN is the line (default RUN_LINE).
finish_csv() {
    cp_close
    part=$1.part
    run_line=${2:-$RUN_LINE}
    ACTIVE_CSV= ACTIVE_RUN=
    # keep only whole rows (16 fields): a program killed mid-write leaves none behind
    awk -F, 'NF == 16' "$part" > "$part.whole" 2>/dev/null && mv "$part.whole" "$part"
    if [ ! -s "$part" ]; then echo "bench: no rows collected for $1; left as it was"; return; fi
    if [ "$MERGE" = 1 ] && [ -s "$1" ]; then
        awk -F, "$MASKS_AWK"'
            { key = $2 FS $3 FS $4 FS $5 FS $6 FS $7 FS $8 FS $9 FS $10 FS $11 FS mask_key($16) }
            NR == FNR { if (FNR > 1) { fresh[key] = 1; rows[++n] = $0 } next }
            FNR == 1 { print; next }
            !(key in fresh) { print }
            END { for (i = 1; i <= n; i++) print rows[i] }' "$part" "$1" > "$1.merged" &&
            mv "$1.merged" "$1" && rm -f "$part"
        echo "$run_line; merged into the rows of the runs above" >> "$1.runs"
        echo "bench: merged into $1"
    else
        mv "$part" "$1"
        echo "$run_line" > "$1.runs"
        echo "bench: wrote $1"
    fi
}

# run_anchors CSV BACKENDS ARGS...: plots/anchors.py for BACKENDS (flash cudnn flex cudnn_fp8,
# any of them; none: nothing) if torch sees a GPU, else says why not.
torch_why=
run_anchors() {
    cp_close   # the GPU to the anchors alone
    out=$1 backends=$(echo $2 | tr ' ' ',')
    shift 2
    [ -n "$backends" ] || return 0
    if [ -z "$torch_why" ]; then    # asked once a run
        torch_why=$(python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")' 2>&1)
        [ $? -eq 0 ] && torch_why=ok || torch_why=${torch_why:-python3 not found}
    fi
    if [ "$torch_why" != ok ]; then
        echo "bench: anchors skipped ($backends): $(printf '%s' "$torch_why" | tail -n 1)"
        return 0
    fi
    PYTHONUNBUFFERED=1 python3 plots/anchors.py --csv "$out" --backends "$backends" \
        --dirs "$DIRS" --seed "$SEED" "$@" ||
        echo "bench: plots/anchors.py exited with $? (its rows so far are kept)"
}

# accepts_masks STAGE: whether the program runs windows and block masks. A dense stage (and
# cuBLAS) refuses them before any GPU work, with one line ending "a dense stage" and exit 2
# (common/cli.c); a stage with masks runs the tiny windowed call.
accepts_masks() {
    am_out=$("$BUILD_DIR/$1" --batch 1 --heads 1 --seqlen 256 --dim 128 --causal --window 128 2>&1 >/dev/null)
    [ $? = 2 ] || return 0
    case $am_out in *"a dense stage"*) return 1 ;; esac
    return 0
}
mask_programs=   # the programs with masks, once asked (mask_programs_probe)
mask_programs_probe() {
    [ -z "$mask_programs" ] || return 0
    mask_programs=" "
    for s in $programs16; do
        if accepts_masks "$s"; then mask_programs="$mask_programs$s "
        else echo "bench: $s has no masks (a dense stage): no windowed or block-masked runs of it"; fi
    done
}
has_masks() { mask_programs_probe; case $mask_programs in *" $1 "*) return 0 ;; esac; return 1; }

# runs_e4m3 STAGE: whether the program runs --dtype e4m3. A stage without an fp8 forward (and
# cuBLAS) refuses it before any GPU work, with one line ending "a 16-bit stage" and exit 2
# (common/cli.c; a program older than e4m3: "unknown dtype"); one with it runs the tiny call.
# Anything else counts as yes: a call that fails is the bench's to record, not to hide.
runs_e4m3() {
    re_out=$(with_timeout "$POINT_TIMEOUT" "$BUILD_DIR/$1" --batch 1 --heads 1 --seqlen 128 --dim 128 \
        --dtype e4m3 2>&1 >/dev/null)
    [ $? = 2 ] || return 0
    case $re_out in *"a 16-bit stage"* | *"unknown dtype"*) return 1 ;; esac
    return 0
}
# runs_bf16 STAGE: whether a program that runs e4m3 also runs bf16; an fp8 stage refuses it
# before any GPU work, with one line ending "an fp8 stage" and exit 2 (common/cli.c)
runs_bf16() {
    re_out=$(with_timeout "$POINT_TIMEOUT" "$BUILD_DIR/$1" --batch 1 --heads 1 --seqlen 128 --dim 128 \
        --dtype bf16 2>&1 >/dev/null)
    [ $? = 2 ] || return 0
    case $re_out in *"an fp8 stage"*) return 1 ;; esac
    return 0
}
# dtype_probe: the programs by dtype, in ladder order: programs16, those that run bf16 (every
# part's points), and fp8_programs, those that run e4m3 (the sweep's e4m3 forward, FP8=1). An
# fp8 stage in programs16 would only add a refused row for each bf16 point.
dtype_probe() {
    programs16= fp8_programs=
    for s in $programs; do
        if ! runs_e4m3 "$s"; then programs16="$programs16 $s"; continue; fi
        fp8_programs="$fp8_programs $s"
        if runs_bf16 "$s"; then programs16="$programs16 $s"
        else echo "bench: $s runs e4m3 only (an fp8 stage): no bf16 points of it$([ "$FP8" = 1 ] || echo "; its e4m3 forward: FP8=1")"; fi
    done
    programs16=${programs16# } fp8_programs=${fp8_programs# }
}

# pattern_args PATTERN: a pattern of MASK_PATTERNS as the program's flags. Sets PA_CAUSAL (0 or
# 1), PA_FLAGS (--window W or --mask P), PA_PREFIX (the note's mask fields, as common/cli.c
# writes them) and PA_SPEC (the --mask pattern, or empty).
#   dense         no mask                     causal      --causal
#   window:W      --causal --window W         P           --mask P (random:D, local:W, ...)
pattern_args() {
    PA_CAUSAL=0 PA_FLAGS= PA_PREFIX= PA_SPEC=
    case $1 in
        dense) ;;
        causal) PA_CAUSAL=1 ;;
        window:*) PA_CAUSAL=1 PA_FLAGS="--window ${1#window:}"
                  PA_PREFIX="window=${1#window:}; " ;;
        *:*) PA_SPEC=$1 PA_FLAGS="--mask $1" PA_PREFIX="mask=$(printf '%s' "$1" | tr ',' '+'); " ;;
        *) echo "bench: MASK_PATTERNS: unknown pattern '$1' (dense, causal, window:W, or a --mask pattern such as random:0.1)"
           return 1 ;;
    esac
}

count_words() { echo $# ; }
is_ref() { case " $MASKS_REF " in *" $1 "*) return 0 ;; esac; return 1; }   # one of MASKS_REF
# progress PART I TOTAL: "[PART I/TOTAL, 1m05s, ~3m20s left]": the part's elapsed time since
# part_start and its estimate of the rest (elapsed / (I - 1) a point so far)
part_start() { PART_T0=$(date +%s) cp_broken=; }
progress() {
    now=$(date +%s); el=$((now - PART_T0))
    left=; [ "$2" -gt 1 ] && left=", ~$(fmt_s $((el * ($3 - $2 + 1) / ($2 - 1)))) left"
    printf '[%s %d/%d, %s%s]' "$1" "$2" "$3" "$(fmt_s "$el")" "$left"
}
fmt_s() { if [ "$1" -ge 60 ]; then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi; }
# reverse_words W...: the words in reverse order
reverse_words() { r=; for w in "$@"; do r="$w${r:+ $r}"; done; echo "$r"; }

# --------------------------------------------------------------------------------------
# 1. The sweep.

echo "bench: $GPU_NAME; programs:${programs:- none}; anchors: ${anchors:-none}; merge=$MERGE"
dtype_probe
# the sweep's e4m3 forward: the programs that run e4m3, with FP8=1 and the forward asked for
sweep_fp8=
if [ "$FP8" = 1 ] && in_words forward $DIRS; then sweep_fp8=$fp8_programs; fi
[ "$FP8" != 1 ] || [ -n "$sweep_fp8" ] || echo "bench: FP8=1, but no e4m3 points: no program runs e4m3 (or DIRS has no forward)"
# what this run measures, for the .runs file of each CSV it writes (see finish_csv): the sweep's
# and the long context's line (their anchors: SDPA's), and the masks' (its anchor: flex);
# "clock settled": timed by the settling protocol (common/runner.c)
RUN_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
RUN_DATE="$RUN_DATE; $GPU_NAME; commit ${BENCH_COMMIT:-unknown}"
e4m3_line=
[ -z "$sweep_fp8$fp8_anchor" ] || e4m3_line="; e4m3 forward ${sweep_fp8:-none}, anchor ${fp8_anchor:-none}"
RUN_LINE="$RUN_DATE: programs${programs:- none}; anchors ${sdpa_anchors:-none}; dirs $DIRS; sweep d $DIMS, causal $CAUSALS; N $NS$e4m3_line; clock settled"
long_causals=$(echo $LONG_CAUSALS)   # words only; blank: the window series alone
LONG_RUN_LINE="$RUN_LINE; long causal ${long_causals:-none (the window series only)}, window $LONG_WINDOW; long N $LONG_NS"
MASKS_RUN_LINE="$RUN_DATE: programs${programs:- none}; anchors ${flex_anchor:-none}; dirs $DIRS; masks $MASK_PATTERNS; N $MASKS_N, B $MASKS_B, H $MASKS_H, d $MASKS_D; clock settled"
if [ "$SWEEP" != 0 ]; then
    start_csv "$CSV"; part_start
    # the series, "stage:dtype" in ladder order: each program's bf16 points (every direction),
    # then its e4m3 ones (the forward only: common/cli.c refuses --backward with e4m3)
    series=
    for stage in $programs; do
        in_words "$stage" $programs16 && series="$series $stage:bf16"
        in_words "$stage" $sweep_fp8 && series="$series $stage:e4m3"
    done
    total=$(( ($(count_words $programs16) * $(count_words $DIRS) + $(count_words $sweep_fp8)) *
              $(count_words $DIMS) * $(count_words $CAUSALS) * $(count_words $NS) ))
    i=0
    for ser in $series; do
        stage=${ser%:*} point_dtype=${ser#*:}
        dirs=$DIRS what=$stage
        [ "$point_dtype" = bf16 ] || dirs=forward what="$stage $point_dtype"
        no_backward=
        for dir in $dirs; do
            for dim in $DIMS; do
                for causal in $CAUSALS; do
                    stopped=
                    last_ms=
                    for n in $NS; do
                        i=$((i + 1))
                        if [ -n "$stopped" ]; then continue; fi
                        b=$((TOKENS / n)) h=$((HIDDEN / dim))
                        printf '%s %s %s d=%s N=%s causal=%s ... ' \
                            "$(progress "${PART_NAME:-sweep}" "$i" "$total")" "$what" "$dir" "$dim" "$n" "$causal"
                        # A stage without a backward pass says so once; its other backward
                        # points get the same refused row without paying for a run each.
                        if [ "$dir" = backward ] && [ -n "$no_backward" ]; then
                            echo "$GPU_TAG,$stage,$dir,bf16,$b,$h,$h,$n,$n,$dim,$causal,,,0,refused,has no backward pass" >> "$CSV.part"
                            echo "refused: has no backward pass"
                            continue
                        fi
                        # The time a call of this N would take: twice the last N's (B N is
                        # fixed, so the work grows as N).
                        if over_budget "$CSV.part" "$stage" "$dir" "$b" "$h" "$n" "$dim" "$causal" "" \
                                "$last_ms" 2 SWEEP_MAX_CALL_S "$SWEEP_MAX_CALL_S"; then
                            stopped=1
                            echo "    (larger N skipped for $what $dir d=$dim causal=$causal)"
                            continue
                        fi
                        run_point "$CSV.part" "$stage" "$dir" "$b" "$h" "$n" "$dim" "$causal" ""
                        last_ms=$(tail -n 1 "$CSV.part" | awk -F, '$15 == "ok" { print $12 }')
                        if [ "$dir" = backward ] && [ "$POINT_STATUS" = refused ] &&
                            tail -n 1 "$CSV.part" | grep -q 'has no backward pass'; then
                            no_backward=1
                        fi
                    done
                done
            done
        done
    done
    point_dtype=bf16
    run_anchors "$CSV.part" "$sdpa_anchors" --shapes sweep --ns "$NS" --dims "$DIMS" --causal "$CAUSALS" --gemm
    # cuDNN's fp8 attention on the e4m3 points' shapes, forward only (a process of its own:
    # anchors.py refuses cudnn_fp8 with a backward; the later --dirs wins over run_anchors')
    [ -z "$fp8_anchor" ] ||
        run_anchors "$CSV.part" "$fp8_anchor" --shapes sweep --ns "$NS" --dims "$DIMS" --causal "$CAUSALS" --dirs forward
    finish_csv "$CSV"
fi

# --------------------------------------------------------------------------------------
# 2. The long-context wall: per stage, its series (non-causal, causal, and for a stage with
# masks the causal sliding window), each forward and backward, N up while the calls fit.

if [ "$LONG" != 0 ]; then
    start_csv "$LONG_CSV" "$LONG_RUN_LINE"; part_start
    # the series, "causal:window" each: LONG_CAUSALS without a window, then the window's
    series=
    for c in $LONG_CAUSALS; do series="$series $c:0"; done
    [ "${LONG_WINDOW:-0}" -gt 0 ] 2>/dev/null && series="$series 1:$LONG_WINDOW" && mask_programs_probe
    nwin=0
    for s in $programs16; do case $mask_programs in *" $s "*) nwin=$((nwin + 1)) ;; esac; done
    total=$(( $(count_words $programs16) * $(count_words $LONG_CAUSALS) * $(count_words $DIRS) *
              $(count_words $LONG_NS) ))
    [ "${LONG_WINDOW:-0}" -gt 0 ] 2>/dev/null &&
        total=$((total + nwin * $(count_words $DIRS) * $(count_words $LONG_WINDOW_NS)))
    i=0
    # Latest stages first: they are the fast ones, so a command cut short by a time limit
    # loses the slow naive points, not the linear-memory ones the wall is about.
    for stage in $(reverse_words $programs16); do
        for ser in $series; do
            causal=${ser%%:*} win=${ser#*:}
            if [ "$win" -gt 0 ]; then
                has_masks "$stage" || continue
                # the work grows as N W: a call twice the last one's
                ns=$LONG_WINDOW_NS growth=2 prefix="window=$win; " what="causal window $win"
                set -- --window "$win"
            else
                # the work grows as N^2: four times
                ns=$LONG_NS growth=4 prefix= what=$([ "$causal" = 1 ] && echo causal || echo non-causal)
                set --
            fi
            for dir in $DIRS; do
                stopped=
                last_ms=
                for n in $ns; do
                    i=$((i + 1))
                    if [ -n "$stopped" ]; then continue; fi
                    printf '%s %s %s %s B=%s H=%s d=%s N=%s ... ' \
                        "$(progress long "$i" "$total")" "$stage" "$dir" "$what" "$LONG_B" "$LONG_H" "$LONG_D" "$n"
                    # The time a call of this N would take, from the last N's (x growth).
                    if over_budget "$LONG_CSV.part" "$stage" "$dir" "$LONG_B" "$LONG_H" "$n" "$LONG_D" \
                            "$causal" "$prefix" "$last_ms" "$growth" LONG_MAX_CALL_S "$LONG_MAX_CALL_S"; then
                        stopped=1
                        echo "    (larger N skipped for $stage $dir $what)"
                        continue
                    fi
                    run_point "$LONG_CSV.part" "$stage" "$dir" "$LONG_B" "$LONG_H" "$n" "$LONG_D" \
                        "$causal" "$prefix" "$@"
                    last_ms=$(tail -n 1 "$LONG_CSV.part" | awk -F, '$15 == "ok" { print $12 }')
                    # A refusal (too big, or no backward) or a timeout only gets worse with N.
                    case $POINT_STATUS in
                        refused) stopped=1 ;;
                        failed) tail -n 1 "$LONG_CSV.part" | grep -q 'timed out' && stopped=1 ;;
                    esac
                    [ -n "$stopped" ] && echo "    (larger N skipped for $stage $dir $what)"
                done
            done
        done
    done
    # the anchors' long shapes: non-causal and causal (LONG_CAUSALS), up to LONG_ANCHOR_MAX_N
    anchor_ns=
    for n in $LONG_NS; do [ "$n" -le "$LONG_ANCHOR_MAX_N" ] && anchor_ns="${anchor_ns:+$anchor_ns }$n"; done
    [ -z "$anchor_ns" ] ||
        run_anchors "$LONG_CSV.part" "$sdpa_anchors" --shapes long --ns "$anchor_ns" --causal "$LONG_CAUSALS"
    finish_csv "$LONG_CSV" "$LONG_RUN_LINE"
fi

# --------------------------------------------------------------------------------------
# 4. The masks: every pattern for the programs with masks, the dense ones for every program,
# and torch_flex on the same masks (the block masks the stages' runs saved).

if [ "$MASKS" != 0 ]; then
    start_csv "$MASKS_CSV" "$MASKS_RUN_LINE"; part_start
    mask_programs_probe
    npat=0 nmasked=0
    for pat in $MASK_PATTERNS; do
        pattern_args "$pat" || continue
        npat=$((npat + 1))
        [ -z "$PA_FLAGS" ] || nmasked=$((nmasked + 1))
    done
    # the stages with masks, and MASKS_REF (the dense stages they are compared with): the
    # masks part measures nothing of the other dense stages
    nwin=0 ndense=0
    for s in $programs16; do
        case $mask_programs in *" $s "*) nwin=$((nwin + 1)) ;; *) ! is_ref "$s" || ndense=$((ndense + 1)) ;; esac
    done
    total=$(( ((nwin + ndense) * (npat - nmasked) + nwin * nmasked) * $(count_words $DIRS) ))
    i=0
    for stage in $programs16; do
        has_masks "$stage" || is_ref "$stage" || continue
        for dir in $DIRS; do
            for pat in $MASK_PATTERNS; do
                pattern_args "$pat" >/dev/null || continue
                if [ -n "$PA_FLAGS" ] && ! has_masks "$stage"; then continue; fi
                i=$((i + 1))
                printf '%s %s %s %s B=%s H=%s d=%s N=%s ... ' \
                    "$(progress masks "$i" "$total")" "$stage" "$dir" "$pat" "$MASKS_B" "$MASKS_H" "$MASKS_D" "$MASKS_N"
                # The first run of a block mask saves it, for torch_flex (--save writes the
                # mask the run used as block_mask.npy, with the tensors, which go at once).
                file=$WORK/mask-$(printf '%s' "$pat" | tr -c 'A-Za-z0-9._-' '_').npy
                set -- $PA_FLAGS
                if [ -n "$PA_SPEC" ] && [ ! -f "$file" ]; then
                    rm -rf "$WORK/save"
                    set -- "$@" --save "$WORK/save"
                fi
                run_point "$MASKS_CSV.part" "$stage" "$dir" "$MASKS_B" "$MASKS_H" "$MASKS_N" \
                    "$MASKS_D" "$PA_CAUSAL" "$PA_PREFIX" "$@"
                if [ -f "$WORK/save/block_mask.npy" ] && [ "$POINT_STATUS" = ok ]; then
                    mv "$WORK/save/block_mask.npy" "$file"
                fi
                rm -rf "$WORK/save"
            done
        done
    done
    # torch_flex: one process for all the patterns, which prints "bench: torch_flex on PATTERN"
    # before each pattern's rows (a process per pattern paid torch's import and torch.compile's
    # start-up each time, far more than its points took); a block mask goes as PATTERN=FILE.
    if [ -n "$flex_anchor" ]; then
        set --
        for pat in $MASK_PATTERNS; do
            pattern_args "$pat" >/dev/null || continue
            if [ -n "$PA_SPEC" ]; then
                file=$WORK/mask-$(printf '%s' "$pat" | tr -c 'A-Za-z0-9._-' '_').npy
                if [ ! -f "$file" ]; then
                    echo "bench: torch_flex not run on $pat: no stage with masks ran it, so there is no mask file to hand it"
                    continue
                fi
                set -- "$@" --pattern "$PA_SPEC=$file"
            else
                set -- "$@" --pattern "$pat"
            fi
        done
        [ $# = 0 ] || run_anchors "$MASKS_CSV.part" flex --shapes masks --ns "$MASKS_N" --dims "$MASKS_D" "$@"
    fi
    finish_csv "$MASKS_CSV" "$MASKS_RUN_LINE"
fi

# --------------------------------------------------------------------------------------
# Summary.

summary "$CSV" "$LONG_CSV" "$MASKS_CSV"
