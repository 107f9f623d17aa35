#!/bin/sh
# plots/ab.sh: an A/B log of interleaved rounds, the input of a lesson's `ab FILE` table
# (plots/docs_tables.sh). Each round runs every shape through every variant, one `--bench`
# call each, so that the variants of a shape share the GPU's clock; a line a call:
#   round R | ARGS | NAME | MS ms TFLOP/s
# The first lines say what ran (the date, the GPU, the commit, each variant's program).
#
# Usage: sh plots/ab.sh ROUNDS "ARGS" ["ARGS" ...] -- NAME=PROGRAM [NAME=PROGRAM ...] > LOG
#   e.g. sh plots/ab.sh 3 "--batch 2 --heads 32 --seqlen 8192 --dim 64 --mask random:0.1" -- \
#          13_hopper_masks=build/13_hopper_masks "OFF=skip=build/noskip/13_hopper_masks"
# NAME is everything before the last '='. A call that prints no time stops the log (exit 2).
# BENCH_COMMIT: the commit measured (default: git's HEAD, if any).
set -u
[ $# -ge 4 ] || { echo "usage: sh plots/ab.sh ROUNDS \"ARGS\" ... -- NAME=PROGRAM ..." >&2; exit 2; }
rounds=$1; shift
case $rounds in ''|*[!0-9]*) echo "ab: ROUNDS must be a number, not '$rounds'" >&2; exit 2 ;; esac
nsh=0
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    nsh=$((nsh + 1)); eval "shape_$nsh=\$1"; shift
done
[ "${1:-}" = -- ] && shift
[ "$nsh" -gt 0 ] && [ $# -gt 0 ] || { echo "ab: no shapes or no variants" >&2; exit 2; }
nv=0
for v in "$@"; do
    prog=${v##*=} name=${v%=*}
    [ -x "$prog" ] || { echo "ab: $prog: no such program (make it first)" >&2; exit 2; }
    nv=$((nv + 1)); eval "name_$nv=\$name; prog_$nv=\$prog"
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $gpu; commit ${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
i=1; while [ $i -le $nv ]; do eval "echo \"# \$name_$i: \$prog_$i\""; i=$((i + 1)); done
r=1
while [ $r -le "$rounds" ]; do
    s=1
    while [ $s -le "$nsh" ]; do
        eval "args=\$shape_$s"
        i=1
        while [ $i -le $nv ]; do
            eval "name=\$name_$i prog=\$prog_$i"
            # shellcheck disable=SC2086
            t=$("$prog" --bench $args 2>&1 | grep -o '[0-9.]* ms [0-9.]* TFLOP/s' | tail -n 1)
            [ -n "$t" ] || { echo "ab: $prog --bench $args printed no time" >&2; exit 2; }
            echo "round $r | $args | $name | $t"
            i=$((i + 1))
        done
        s=$((s + 1))
    done
    r=$((r + 1))
done
