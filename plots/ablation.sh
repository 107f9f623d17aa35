#!/bin/sh
# plots/ablation.sh: what each idea of the warp-specialised Hopper stages buys (`make ablation`;
# docs/08_fa3.md and docs/09_fa3_persistent.md, "What the numbers show").
#
# Runs on the GPU machine, from the repository root, after `make`. Needs a POSIX sh, awk and
# make (with nvcc: the builds below are made here unless they are already up to date).
#
# Each stage is built once more for each of its ideas, with that idea built out
# (make BUILD=build/ablation/<stage>-<idea> OFF=<idea>; the stage's header names its knobs):
#   08_fa3             ws (a consumer thread loads, as in 07), pingpong, overlap
#   09_fa3_persistent  persistent (one tile a block), tma_store (O stored as in 08), lazy
#   10_fa3_backward    its backward (--backward): dq_atomics (a writer warp adds dQ by bulk
#                      reduce), and +deterministic: not a build but the stage run with
#                      --deterministic (an idea named +flag is the run-time flag --flag)
#   11_fp8             its e4m3 forward (--dtype e4m3): pretranspose (V_j transposed in shared
#                      memory by the producer, as FA-3, instead of once in HBM)
# Every build is checked against the float64 oracle first (three odd shapes, one per d); a
# build that fails its check is not timed. Then, shape by shape, the stage as it is and its
# builds run back to back (so that the columns of a row share the GPU's clock), at the sweep's
# protocol: 16384 tokens (B = 16384/N), hidden 2048 (H = 2048/d), bf16, forward, at N = 8192
# for d = 64, 128, 256, causal and not, and N = 2048 at d = 128, `--bench` (the median of the timed runs after the
# clock has settled, L2 flushed before each: common/runner.c).
#
#   sh plots/ablation.sh            -> plots/results/<gpu>-ablation.csv and its .runs line
#
# CSV: gpu,stage,off,d,causal,N,median_ms,tflops,status ("off" empty: the stage as it is).
# The file is written when the last run is done (an interrupted run leaves it as it was).
# Environment: BUILD_DIR (build), RESULTS_DIR (plots/results), GPU_NAME (nvidia-smi's),
# BENCH_COMMIT (the commit measured, for the .runs line; default: git's HEAD, if any).
set -u
cd "$(dirname "$0")/.." || exit 2

ABLATIONS="08_fa3:ws 08_fa3:pingpong 08_fa3:overlap
09_fa3_persistent:persistent 09_fa3_persistent:tma_store 09_fa3_persistent:lazy
10_fa3_backward:dq_atomics 10_fa3_backward:+deterministic
11_fp8:pretranspose"
# per shape, each stage as it is ("stage:") and then its builds
ORDER="08_fa3: 08_fa3:ws 08_fa3:pingpong 08_fa3:overlap
09_fa3_persistent: 09_fa3_persistent:persistent 09_fa3_persistent:tma_store 09_fa3_persistent:lazy
10_fa3_backward: 10_fa3_backward:dq_atomics 10_fa3_backward:+deterministic
11_fp8: 11_fp8:pretranspose"
# the shapes, d:causal:N: where ping-pong pays and where it does not
SHAPES="128:0:2048 128:1:2048 128:0:8192 128:1:8192 64:0:8192 64:1:8192 256:0:8192 256:1:8192"
TOKENS=16384        # the papers' protocol: B * N = 16384 tokens ...
HIDDEN=2048         # ... and H * d = 2048
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-plots/results}

GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
[ -n "$GPU_NAME" ] || { echo "ablation: no GPU (nvidia-smi names none)" >&2; exit 2; }
GPU_TAG=$(printf '%s' "$GPU_NAME" | tr ' ' '-')
OUT=$RESULTS_DIR/$GPU_TAG-ablation.csv
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ablation.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT

# the builds, side by side
pids=
for a in $ABLATIONS; do
    s=${a%%:*} o=${a#*:}
    case $o in +*) continue ;; esac   # a run-time flag: the stage's own build
    make -s BUILD="$BUILD_DIR/ablation/$s-$o" OFF="$o" "$BUILD_DIR/ablation/$s-$o/$s" \
        > "$WORK/build-$s-$o.log" 2>&1 &
    pids="$pids $!"
done
fail=0
for p in $pids; do wait "$p" || fail=1; done
[ $fail = 0 ] || { cat "$WORK"/build-*.log >&2; echo "ablation: a build failed" >&2; exit 2; }

# program STAGE [IDEA]: the path of the stage's build (the stage's own for a run-time flag);
# run_args STAGE [IDEA]: the flags it runs with (the backward's stage: --backward; the fp8 stage:
# --dtype e4m3; +flag: --flag)
program() { case ${2:-} in ""|+*) echo "$BUILD_DIR/$1" ;; *) echo "$BUILD_DIR/ablation/$1-$2/$1" ;; esac; }
run_args() {
    case $1 in *_backward) printf ' --backward' ;; *_fp8) printf ' --dtype e4m3' ;; esac
    case ${2:-} in +*) printf ' --%s' "${2#+}" ;; esac
}

# one small call first: without a Hopper GPU the stage refuses it, and says why
if ! "$(program 08_fa3)" --batch 1 --heads 1 --seqlen 128 --dim 128 > /dev/null 2> "$WORK/err"; then
    echo "ablation: $(program 08_fa3) cannot run here: $(tail -n 1 "$WORK/err")" >&2
    exit 2
fi

# the checks: every build at two odd shapes
bad=
for a in $ABLATIONS; do
    s=${a%%:*} o=${a#*:}
    for shape in "--batch 1 --heads 24 --kv-heads 8 --seqlen 1100 --dim 128 --causal" \
                 "--batch 2 --heads 6 --kv-heads 2 --seqlen 1000 --dim 64 --causal --dtype fp16" \
                 "--batch 1 --heads 140 --seqlen 300 --dim 256"; do
        "$(program "$s" "$o")" $shape $(run_args "$s" "$o") --check > "$WORK/out" 2>&1
        rc=$?
        if [ $rc = 0 ]; then
            echo "ablation: check $s OFF=$o $shape: pass"
        elif [ $rc = 2 ]; then
            echo "ablation: check $s OFF=$o $shape: refused ($(tail -n 1 "$WORK/out"))"
        else
            echo "ablation: check $s OFF=$o $shape: FAIL"; tail -n 5 "$WORK/out" | sed 's/^/    | /'
            bad="$bad $a"
        fi
    done
done

echo "gpu,stage,off,d,causal,N,median_ms,tflops,status" > "$WORK/rows.csv"
RUN_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
for shp in $SHAPES; do
    d=${shp%%:*} n=${shp##*:} causal=${shp#*:}; causal=${causal%:*}
    {
            set -- --batch $((TOKENS / n)) --heads $((HIDDEN / d)) --seqlen "$n" --dim "$d" --bench
            [ "$causal" = 1 ] && set -- "$@" --causal
            for x in $ORDER; do
                s=${x%%:*} o=${x#*:}
                case " $bad " in
                    *" $x "*) st=failed-check ms= tf= ;;
                    *) "$(program "$s" "$o")" "$@" $(run_args "$s" "$o") > "$WORK/out" 2> "$WORK/err"
                       rc=$?
                       # the last line: "... | 1.910 ms 575.7 TFLOP/s (median of N) | workspace ..."
                       t=$(sed -n 's/.*| \([0-9.]*\) ms \([0-9.]*\) TFLOP\/s (median.*/\1 \2/p' "$WORK/out" | tail -n 1)
                       if [ "$rc" = 0 ] && [ -n "$t" ]; then st=ok ms=${t% *} tf=${t#* }
                       elif [ "$rc" = 2 ]; then st=refused ms= tf=
                       else st=failed ms= tf=; echo "ablation: $s OFF=$o $*: exit $rc: $(tail -n 1 "$WORK/err")" >&2; fi ;;
                esac
                printf '%-18s %-10s d=%-3s causal=%s N=%-5s %s %s\n' "$s" "${o:-(as is)}" "$d" "$causal" "$n" "${ms:--}" "${tf:-$st}"
                echo "$GPU_TAG,$s,$o,$d,$causal,$n,$ms,$tf,$st" >> "$WORK/rows.csv"
            done
    }
done
mkdir -p "$RESULTS_DIR" && cp "$WORK/rows.csv" "$OUT" || exit 2
echo "$RUN_DATE; $GPU_NAME; commit ${COMMIT:-unknown}: plots/ablation.sh; clock settled (common/runner.c)" > "$OUT.runs"
echo "ablation: wrote $OUT"
