#!/bin/sh
# plots/bench.sh: the measurements behind every plot and README table (`make bench`).
#
# Runs on the GPU machine, from the repository root, after `make`. Needs only a POSIX sh,
# coreutils and awk; python3 with a CUDA build of torch is optional (the PyTorch anchors).
#
#   1. The sweep (the FlashAttention papers' protocol): 16384 tokens in total
#      (B = 16384/N), hidden 2048 (H = H_kv = 2048/d), bf16, N = 512 ... 16384,
#      d = 64 and 128, causal and not, forward and backward, for every built stage
#      program build/NN_* in order, then build/cublas.      -> plots/results/<gpu>.csv
#   2. The long-context wall: B = 1, H = 16, d = 128, non-causal, N = 8192 ... 131072,
#      every stage, forward and backward; a stage that refuses an N (stage 1: S does not
#      fit) is not tried at larger N, nor is one whose next N would take more than
#      LONG_MAX_CALL_S seconds a call (4x the last: the work grows as N^2); that N gets a
#      row with status "skipped" and the prediction.    -> plots/results/<gpu>-long.csv
#      (A separate file because the sweep's N = 16384, d = 128 point is also B=1 H=16.)
#   3. The anchors: PyTorch's FLASH and cuDNN attention on the same shapes (plots/anchors.py),
#      plus one bf16 GEMM ceiling row, appended to both files.
# Correctness is the tests' job: no --check here.
#
# Usage:
#   sh plots/bench.sh                      everything above, into fresh files
#   STAGES="06_fa2 torch" DIMS=128 sh plots/bench.sh
#                                          a subset, merged into the existing files
#   sh plots/bench.sh --summary [CSV]      print the summary tables of a CSV, run nothing
#
# Environment (all optional):
#   STAGES     programs under build/ to run, e.g. "03_tiled 06_fa2 cublas"; "torch" adds both
#              anchors, "torch_flash" / "torch_cudnn" one.         default: all built + torch
#   NS DIMS CAUSALS    sweep subset            default: "512 ... 16384", "64 128", "0 1"
#   DIRS       "forward backward" or one of them (sweep and long)  default: both
#   SWEEP=0    skip the sweep;  LONG=0  skip the long-context wall;  LONG_NS  its N list
#   ANCHORS=0|1  skip / force the torch anchors            default: 1 unless STAGES omits torch
#   MERGE=0|1  1: replace only the rows this run measured (same stage, direction and shape)
#              and keep the rest; 0: fresh files.   default: 1 if any filter above is set
#   RESULTS_DIR  where the CSVs go (plots/results); BENCH_CSV, BENCH_LONG_CSV  exact paths
#   SEED (1), POINT_TIMEOUT seconds per program run (300), BUILD_DIR (build),
#   LONG_MAX_CALL_S  the long-context time budget of one call, in seconds (10),
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
SUMMARY_N=8192      # the sequence length the summary tables quote

# --------------------------------------------------------------------------------------
# Summary tables (also the --summary mode).

# summary CSV [LONG_CSV]: TFLOP/s at N = SUMMARY_N per stage, the ratio of 06_fa2 (or
# $RATIO_STAGE) to torch_flash per shape, and the longest N each stage ran.
summary() {
    [ -s "$1" ] || { echo "summary: no rows in $1"; return 0; }
    echo
    echo "TFLOP/s at N=$SUMMARY_N (bf16; '-' none; R refused; F failed): $1"
    awk -F, -v n="$SUMMARY_N" '
        FNR == 1 || $10 == 0 { next }                     # header; the GEMM ceiling row
        $8 == n {
            c = $3 == "forward" ? "fwd" : "bwd"
            col = c " d" $10 ($11 == 1 ? " c" : "")
            v = $15 == "ok" ? sprintf("%.1f", $13) : ($15 == "refused" ? "R" : "F")
            cell[$2, col] = v; stages[$2] = 1
        }
        END {
            ncol = split("fwd d64,fwd d64 c,fwd d128,fwd d128 c,bwd d64,bwd d64 c,bwd d128,bwd d128 c", cols, ",")
            for (s in stages) {
                line = sprintf("%-14s", s)
                for (i = 1; i <= ncol; i++)
                    line = line sprintf(" %10s", ((s, cols[i]) in cell) ? cell[s, cols[i]] : "-")
                print line
            }
        }' "$1" > "$WORK/summary.txt"
    printf '%-14s' stage
    for c in "fwd d64" "fwd d64 c" "fwd d128" "fwd d128 c" "bwd d64" "bwd d64 c" "bwd d128" "bwd d128 c"; do
        printf ' %10s' "$c"
    done
    echo "   (c = causal)"
    sort "$WORK/summary.txt"

    rs=${RATIO_STAGE:-06_fa2}
    if grep -q ",$rs," "$1" && grep -q ',torch_flash,' "$1"; then
        echo
        echo "$rs / torch_flash (TFLOP/s ratio) per shape:"
        awk -F, -v rs="$rs" '
            FNR == 1 || $15 != "ok" || $10 == 0 { next }
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

    if [ -n "${2:-}" ] && [ -s "$2" ]; then
        echo
        echo "Longest N per stage (B=$LONG_B H=$LONG_H d=$LONG_D): $2"
        awk -F, '
            FNR == 1 { next }
            {
                k = sprintf("%-14s %-8s", $2, $3)
                if ($15 == "ok" && $8 + 0 > best[k]) best[k] = $8 + 0
                if ($15 != "ok" && !(k in stop)) stop[k] = $15 " at N=" $8 ": " $16
                seen[k] = 1
            }
            END { for (k in seen) printf "%s %7s  %s\n", k, (k in best) ? best[k] : "-", stop[k] }' "$2" | sort
    fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
# Interrupted (e.g. by `timeout` at the end of a device lease): with MERGE=1 the rows measured
# so far are merged in, since each one is complete; otherwise they stay in the .part file.
ACTIVE_CSV=
on_interrupt() {
    echo
    if [ "$MERGE" = 1 ] && [ -n "$ACTIVE_CSV" ]; then
        echo "bench: interrupted; merging the rows measured so far"
        finish_csv "$ACTIVE_CSV"
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
            case $f in *-long.csv) ;; *) [ -f "$f" ] && csv=$f && break ;; esac
        done
    fi
    if [ -z "$csv" ] || [ ! -f "$csv" ]; then echo "bench: no CSV to summarise" >&2; exit 2; fi
    summary "$csv" "${csv%.csv}-long.csv"
    exit 0
fi

# --------------------------------------------------------------------------------------
# Settings.

filtered=0
for v in "${STAGES:-}" "${NS:-}" "${DIMS:-}" "${CAUSALS:-}" "${DIRS:-}" "${LONG_NS:-}"; do
    [ -n "$v" ] && filtered=1
done
MERGE=${MERGE:-$filtered}
NS=${NS:-"512 1024 2048 4096 8192 16384"}
DIMS=${DIMS:-"64 128"}
CAUSALS=${CAUSALS:-"0 1"}
DIRS=${DIRS:-"forward backward"}
LONG_NS=${LONG_NS:-"8192 16384 32768 65536 131072"}
SWEEP=${SWEEP:-1}
LONG=${LONG:-1}
SEED=${SEED:-1}
POINT_TIMEOUT=${POINT_TIMEOUT:-300}
LONG_MAX_CALL_S=${LONG_MAX_CALL_S:-10}
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
CSV=${BENCH_CSV:-$RESULTS_DIR/$GPU_TAG.csv}
LONG_CSV=${BENCH_LONG_CSV:-$RESULTS_DIR/$GPU_TAG-long.csv}
mkdir -p "$(dirname "$CSV")" "$(dirname "$LONG_CSV")" || exit 2

# The programs to run, in ladder order, and which anchors.
programs=
anchors=
if [ -z "${STAGES:-}" ]; then
    for f in "$BUILD_DIR"/[0-9][0-9]_*; do
        case $f in *.*) continue ;; esac          # build/01_naive.ptxas.log and the like
        [ -f "$f" ] && [ -x "$f" ] && programs="$programs ${f##*/}"
    done
    [ -x "$BUILD_DIR/cublas" ] && programs="$programs cublas"
    anchors="flash cudnn"
else
    for s in $STAGES; do
        case $s in
            torch) anchors="flash cudnn" ;;
            torch_flash | torch_cudnn) anchors="$anchors ${s#torch_}" ;;
            *)  if [ -x "$BUILD_DIR/$s" ]; then programs="$programs $s"
                else echo "bench: $BUILD_DIR/$s is not built; skipped (make $BUILD_DIR/$s)"; fi ;;
        esac
    done
fi
case ${ANCHORS:-} in
    0) anchors= ;;
    1) [ -n "$anchors" ] || anchors="flash cudnn" ;;
esac
[ -n "$programs$anchors" ] || { echo "bench: nothing to run (no build/NN_* programs: run make)" >&2; exit 2; }

# --------------------------------------------------------------------------------------
# One measurement.

count_lines() { if [ -f "$1" ]; then wc -l < "$1"; else echo 0; fi; }

# --foreground keeps the program in our process group, so Ctrl-C reaches it too.
if timeout --foreground 1 true >/dev/null 2>&1; then
    with_timeout() { wt=$1; shift; timeout --foreground "$wt" "$@"; }
else
    with_timeout() { shift; "$@"; }
fi

# run_point CSV STAGE DIRECTION B H N D CAUSAL: runs one program on one shape, makes sure
# the CSV got its row (a crash or a timeout writes none, so we add a failed one), prints
# the outcome and sets POINT_STATUS to ok, refused or failed.
run_point() {
    rp_csv=$1 rp_stage=$2 rp_dir=$3 rp_b=$4 rp_h=$5 rp_n=$6 rp_d=$7 rp_causal=$8
    set -- "$BUILD_DIR/$rp_stage" --batch "$rp_b" --heads "$rp_h" --kv-heads "$rp_h" \
        --seqlen "$rp_n" --dim "$rp_d" --dtype bf16 --bench --seed "$SEED" --csv "$rp_csv"
    [ "$rp_causal" = 1 ] && set -- "$@" --causal
    [ "$rp_dir" = backward ] && set -- "$@" --backward
    rp_before=$(count_lines "$rp_csv")
    with_timeout "$POINT_TIMEOUT" "$@" > "$WORK/point.log" 2>&1
    rp_rc=$?
    if [ "$(count_lines "$rp_csv")" -le "$rp_before" ]; then
        if [ "$rp_rc" = 124 ]; then rp_note="timed out after $POINT_TIMEOUT s"
        else rp_note="exit code $rp_rc without a row"; fi
        [ -s "$rp_csv" ] || echo "$HEADER" > "$rp_csv"
        echo "$GPU_TAG,$rp_stage,$rp_dir,bf16,$rp_b,$rp_h,$rp_h,$rp_n,$rp_n,$rp_d,$rp_causal,,,,failed,$rp_note" >> "$rp_csv"
    fi
    POINT_STATUS=$(tail -n 1 "$rp_csv" | awk -F, '{ print $15 }')
    tail -n 1 "$rp_csv" | awk -F, '
        $15 == "ok" { printf "%.3f ms  %.1f TFLOP/s\n", $12, $13; next }
        { printf "%s: %s\n", $15, $16 }'
    if [ "$POINT_STATUS" = failed ]; then
        tail -n 5 "$WORK/point.log" | sed 's/^/    | /'
    fi
}

# start_csv FILE: the .part file this run collects its rows in.
start_csv() {
    if [ -e "$1.part" ]; then echo "bench: discarding $1.part left by an earlier run"; fi
    rm -f "$1.part"
    ACTIVE_CSV=$1
}

# finish_csv FILE: moves the collected rows into place; with MERGE=1, rows of FILE that
# this run did not re-measure (key: stage, direction, dtype and shape) are kept.
# FILE.runs gets one line per run whose rows FILE holds (a fresh file: this run's line only;
# a merge: the line appended), which plots/plots.sh --sources reads to say when a file mixes runs.
finish_csv() {
    part=$1.part
    ACTIVE_CSV=
    # keep only whole rows (16 fields): a program killed mid-write leaves none behind
    awk -F, 'NF == 16' "$part" > "$part.whole" 2>/dev/null && mv "$part.whole" "$part"
    if [ ! -s "$part" ]; then echo "bench: no rows collected for $1; left as it was"; return; fi
    if [ "$MERGE" = 1 ] && [ -s "$1" ]; then
        awk -F, '
            { key = $2 FS $3 FS $4 FS $5 FS $6 FS $7 FS $8 FS $9 FS $10 FS $11 }
            NR == FNR { if (FNR > 1) { fresh[key] = 1; rows[++n] = $0 } next }
            FNR == 1 { print; next }
            !(key in fresh) { print }
            END { for (i = 1; i <= n; i++) print rows[i] }' "$part" "$1" > "$1.merged" &&
            mv "$1.merged" "$1" && rm -f "$part"
        echo "$RUN_LINE; merged into the rows of the runs above" >> "$1.runs"
        echo "bench: merged into $1"
    else
        mv "$part" "$1"
        echo "$RUN_LINE" > "$1.runs"
        echo "bench: wrote $1"
    fi
}

# run_anchors CSV ARGS...: plots/anchors.py if torch sees a GPU, else says why not.
run_anchors() {
    [ -n "$anchors" ] || return 0
    out=$1; shift
    why=$(python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")' 2>&1)
    if [ $? -ne 0 ]; then
        echo "bench: anchors skipped: $(printf '%s' "${why:-python3 not found}" | tail -n 1)"
        return 0
    fi
    backends=$(echo $anchors | tr ' ' ',')
    PYTHONUNBUFFERED=1 python3 plots/anchors.py --csv "$out" --backends "$backends" \
        --dirs "$DIRS" --seed "$SEED" "$@" ||
        echo "bench: plots/anchors.py exited with $? (its rows so far are kept)"
}

count_words() { echo $# ; }
# reverse_words W...: the words in reverse order
reverse_words() { r=; for w in "$@"; do r="$w${r:+ $r}"; done; echo "$r"; }

# --------------------------------------------------------------------------------------
# 1. The sweep.

echo "bench: $GPU_NAME; programs:${programs:- none}; anchors: ${anchors:-none}; merge=$MERGE"
# what this run measures, for the .runs file of each CSV it writes (see finish_csv)
RUN_LINE="$(date -u '+%Y-%m-%d %H:%M UTC'): programs${programs:- none}; anchors ${anchors:-none}; dirs $DIRS; sweep d $DIMS, causal $CAUSALS; N $NS"
if [ "$SWEEP" != 0 ]; then
    start_csv "$CSV"
    total=$(( $(count_words $programs) * $(count_words $DIRS) * $(count_words $DIMS) *
              $(count_words $CAUSALS) * $(count_words $NS) ))
    i=0
    for stage in $programs; do
        no_backward=
        for dir in $DIRS; do
            for dim in $DIMS; do
                for causal in $CAUSALS; do
                    for n in $NS; do
                        i=$((i + 1))
                        b=$((TOKENS / n)) h=$((HIDDEN / dim))
                        printf '[%d/%d] %s %s d=%s N=%s causal=%s ... ' \
                            "$i" "$total" "$stage" "$dir" "$dim" "$n" "$causal"
                        # A stage without a backward pass says so once; its other backward
                        # points get the same refused row without paying for a run each.
                        if [ "$dir" = backward ] && [ -n "$no_backward" ]; then
                            echo "$GPU_TAG,$stage,$dir,bf16,$b,$h,$h,$n,$n,$dim,$causal,,,0,refused,has no backward pass" >> "$CSV.part"
                            echo "refused: has no backward pass"
                            continue
                        fi
                        run_point "$CSV.part" "$stage" "$dir" "$b" "$h" "$n" "$dim" "$causal"
                        if [ "$dir" = backward ] && [ "$POINT_STATUS" = refused ] &&
                            tail -n 1 "$CSV.part" | grep -q 'has no backward pass'; then
                            no_backward=1
                        fi
                    done
                done
            done
        done
    done
    run_anchors "$CSV.part" --shapes sweep --ns "$NS" --dims "$DIMS" --causal "$CAUSALS" --gemm
    finish_csv "$CSV"
fi

# --------------------------------------------------------------------------------------
# 2. The long-context wall.

if [ "$LONG" != 0 ]; then
    start_csv "$LONG_CSV"
    total=$(( $(count_words $programs) * $(count_words $DIRS) * $(count_words $LONG_NS) ))
    i=0
    # Latest stages first: they are the fast ones, so a command cut short by a time limit
    # loses the slow naive points, not the linear-memory ones the wall is about.
    for stage in $(reverse_words $programs); do
        for dir in $DIRS; do
            stopped=
            last_ms=
            for n in $LONG_NS; do
                i=$((i + 1))
                if [ -n "$stopped" ]; then continue; fi
                printf '[long %d/%d] %s %s B=%s H=%s d=%s N=%s ... ' \
                    "$i" "$total" "$stage" "$dir" "$LONG_B" "$LONG_H" "$LONG_D" "$n"
                # The time a call of this N would take, from the last N's (x4: N^2 work).
                if [ -n "${last_ms:-}" ] && awk -v ms="$last_ms" -v cap="$LONG_MAX_CALL_S" \
                        'BEGIN { exit !(4 * ms / 1000 > cap) }'; then
                    predicted=$(awk -v ms="$last_ms" 'BEGIN { printf "%.0f", 4 * ms / 1000 }')
                    echo "skipped: predicted ${predicted} s a call > LONG_MAX_CALL_S = $LONG_MAX_CALL_S s"
                    echo "$GPU_TAG,$stage,$dir,bf16,$LONG_B,$LONG_H,$LONG_H,$n,$n,$LONG_D,0,,,,skipped,predicted ${predicted} s a call (4x N/2's) > the bench's LONG_MAX_CALL_S = $LONG_MAX_CALL_S s" >> "$LONG_CSV.part"
                    stopped=1
                    echo "    (larger N skipped for $stage $dir)"
                    continue
                fi
                run_point "$LONG_CSV.part" "$stage" "$dir" "$LONG_B" "$LONG_H" "$n" "$LONG_D" 0
                last_ms=$(tail -n 1 "$LONG_CSV.part" | awk -F, '$15 == "ok" { print $12 }')
                # A refusal (too big, or no backward) or a timeout only gets worse with N.
                case $POINT_STATUS in
                    refused) stopped=1 ;;
                    failed) tail -n 1 "$LONG_CSV.part" | grep -q 'timed out' && stopped=1 ;;
                esac
                [ -n "$stopped" ] && echo "    (larger N skipped for $stage $dir)"
            done
        done
    done
    run_anchors "$LONG_CSV.part" --shapes long --ns "$LONG_NS"
    finish_csv "$LONG_CSV"
fi

# --------------------------------------------------------------------------------------
# 3. Summary.

summary "$CSV" "$LONG_CSV"
