#!/bin/sh
# plots/ablation.sh: stage 8's ablation (docs/08_fa3.md, "The ablation"): its forward timed under
# each set of its ATTN_FA3 switches, on shapes of the sweep.
#
# Runs on the GPU machine, from the repository root, after `make build/08_fa3`. Needs only a
# POSIX sh and awk.
#
#   sh plots/ablation.sh [CSV]      measure; CSV default docs/logs/ablation-08-<UTC date>.csv
#                                   (with a letter after the date, b, c, ..., when that exists)
#   sh plots/ablation.sh --sets     print the switch sets, one a line (plots/docs_tables.sh
#                                   reads them from here)
#
# For each switch set of SETS, in that order ("default": ATTN_FA3 unset; the names are the ones
# parse_opts in stages/08_fa3/attention.cu reads), each head dim d of 128 64 256, causal 0 and 1,
# and N of 2048 8192, the sweep's protocol: 16384 tokens (B = 16384/N), hidden 2048
# (H = 2048/d), bf16 (the program's default):
#   ATTN_FA3=SET build/08_fa3 --batch B --heads H --seqlen N --dim d [--causal] --bench
# One CSV row a run, "switches",d,causal,N,median_ms,tflops, the two numbers as the program
# prints them (median of the timed runs, L2 flushed before each). A run that is refused or
# fails gets a row with both empty, and its reason on stderr; the others still run. The rows
# are written to CSV when the last run is done (an interrupted run writes nothing).
# Exit 2, with nothing measured, when build/08_fa3 is not built or cannot run here (no GPU,
# or not compute capability 9.0: the program's own refusal is printed).
# Environment: BUILD_DIR (build).
set -u
HERE=$(pwd)   # a relative CSV argument is relative to where the script was called from
cd "$(dirname "$0")/.." || exit 2

SETS='default
nopersistent
nopingpong
nooverlap
nows
stages=1
nopingpong,nooverlap
nopingpong,nooverlap,nows'
DIMS="128 64 256"
CAUSALS="0 1"
NS="2048 8192"
TOKENS=16384        # the papers' protocol: B * N = 16384 tokens ...
HIDDEN=2048         # ... and H * d = 2048

if [ "${1:-}" = --sets ]; then echo "$SETS"; exit 0; fi
case ${1:-} in
    -*) echo "usage: sh plots/ablation.sh [CSV | --sets]" >&2; exit 2 ;;
    "") out=docs/logs/ablation-08-$(date -u +%F)
        for s in "" b c d e f g h i j k l m n o p q r s t u v w x y z; do
            [ -e "$out$s.csv" ] || break
        done
        [ ! -e "$out$s.csv" ] || { echo "ablation: $out.csv ... ${out}z.csv all exist: name one" >&2; exit 2; }
        out=$out$s.csv ;;
    /*) out=$1 ;;
    *) out=$HERE/$1 ;;
esac
BIN=${BUILD_DIR:-build}/08_fa3
[ -x "$BIN" ] || { echo "ablation: no program $BIN (make build/08_fa3 first)" >&2; exit 2; }
unset ATTN_FA3 ATTN_TRACE   # "default" is the stage without switches

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ablation.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
# one small call first: without a GPU the program refuses it, and says why
if ! "$BIN" --batch 1 --heads 1 --seqlen 128 --dim 128 > /dev/null 2> "$WORK/err"; then
    echo "ablation: $BIN cannot run here: $(tail -n 1 "$WORK/err")" >&2
    exit 2
fi

echo "switches,d,causal,N,median_ms,tflops" > "$WORK/rows.csv"
runs=0 bad=0
for sw in $SETS; do
    for d in $DIMS; do
        for causal in $CAUSALS; do
            for n in $NS; do
                set -- --batch $((TOKENS / n)) --heads $((HIDDEN / d)) --seqlen "$n" --dim "$d" --bench
                [ "$causal" = 1 ] && set -- "$@" --causal
                if [ "$sw" = default ]; then "$BIN" "$@"; else ATTN_FA3=$sw "$BIN" "$@"; fi \
                    > "$WORK/out" 2> "$WORK/err"
                rc=$?
                # the last line: "... | 1.910 ms 575.7 TFLOP/s (median of N) | workspace ..."
                t=$(sed -n 's/.*| \([0-9.]*\) ms \([0-9.]*\) TFLOP\/s (median.*/\1,\2/p' "$WORK/out" | tail -n 1)
                runs=$((runs + 1))
                if [ "$rc" != 0 ] || [ -z "$t" ]; then
                    t=,
                    bad=$((bad + 1))
                    echo "ablation: ATTN_FA3=$sw d=$d causal=$causal N=$n: exit code $rc: $(tail -n 1 "$WORK/err")" >&2
                fi
                echo "\"$sw\",$d,$causal,$n,$t" >> "$WORK/rows.csv"
            done
        done
    done
done
cp "$WORK/rows.csv" "$out" || exit 2
echo "ablation: $runs runs of $BIN, $((runs - bad)) timed, $bad refused or failed: $out"
