#!/bin/sh
# tests/static_check.sh BUILD STAGE...: checks that need no GPU, over every built stage.
#  1. ptxas reported no register spill for any function (BUILD/<stage>.ptxas.log, written by
#     the Makefile from nvcc -Xptxas -v): every "spill" line must read
#     "0 bytes spill stores, 0 bytes spill loads".
#  2. the stage object exports exactly one symbol, stage_<stage> (everything else static);
#     weak symbols nvcc/g++ emit themselves (V/W, e.g. DW.ref.__gxx_personality_v0) are allowed.
set -u
build=$1; shift
fail=0
n=0
for s in "$@"; do
    n=$((n + 1))
    log="$build/$s.ptxas.log"
    obj="$build/obj/$s.stage.o"
    if [ ! -f "$log" ] || [ ! -f "$obj" ]; then
        echo "static check: $s: not built ($log / $obj missing)"; fail=1; continue
    fi
    spills=$(awk '
        /Compiling entry function/ { arch = $NF }
        /Function properties for/ { fn = $NF }
        /bytes spill stores/ {
            if ($5 != 0 || $9 != 0) printf "%s %s: %s\n", fn, arch, $0
        }' "$log")
    if [ -n "$spills" ]; then
        echo "static check: $s: register spill reported by ptxas:"
        echo "$spills" | sed 's/^/    /'
        fail=1
    fi
    syms=$(nm -g --defined-only "$obj" | awk '$2 !~ /^[VWvwu]$/ { print $3 }' | sort | tr '\n' ' ' | sed 's/ $//')
    want="stage_$s"
    if [ "$syms" != "$want" ]; then
        echo "static check: $s: exported symbols are '$syms', want exactly 'stage_$s' (make the rest static)"
        fail=1
    fi
done
if [ $fail = 0 ]; then
    echo "static check: $n programs built, no spills, one exported symbol each"
fi
exit $fail
