#!/bin/sh
# tests/static_check.sh BUILD STAGE...: checks that need no GPU, over every built stage.
#  1. ptxas reported no register spill and no stack frame (local memory) for any function
#     (BUILD/<stage>.ptxas.log, written by the Makefile from nvcc -Xptxas -v): every such line
#     must read "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads".
#  2. the stage object exports exactly one symbol, stage_<stage> (everything else static);
#     weak symbols nvcc/g++ emit themselves (V/W, e.g. DW.ref.__gxx_personality_v0) are allowed.
#  3. a Hopper stage (its source includes hopper.cuh) is on the asynchronous path: its PTX
#     (BUILD/<stage>.ptx) has wgmma.mma_async and cp.async.bulk.tensor; ptxas printed no
#     performance warning C75xx (C7508 setmaxnreg ignored, C7510 wgmma serialised at a function
#     call, C7511 too few registers, C7515 wgmma serialised by accumulator use, C7519 warpgroup
#     arrive inserted); with cuobjdump (the toolkit's, or on PATH) its SASS has HGMMA (QGMMA for
#     an fp8 stage's) and UTMALDG (without one, that part is reported as not checked). A warp-specialised one (it uses
#     SETMAXNREG_*) also has setmaxnreg, bar.sync and bar.arrive in its PTX.
set -u
build=$1; shift
stages_dir=${STAGES_DIR:-stages}
cuda_bin=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
cuobjdump=$(command -v cuobjdump 2>/dev/null || { [ -x "$cuda_bin/cuobjdump" ] && echo "$cuda_bin/cuobjdump"; })
fail=0
n=0
hopper=0
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
            if ($1 != 0 || $5 != 0 || $9 != 0) printf "%s %s: %s\n", fn, arch, $0   # stack frame: local memory
        }' "$log")
    if [ -n "$spills" ]; then
        echo "static check: $s: register spill or stack frame (local memory) reported by ptxas:"
        echo "$spills" | sed 's/^/    /'
        fail=1
    fi
    syms=$(nm -g --defined-only "$obj" | awk '$2 !~ /^[VWvwu]$/ { print $3 }' | sort | tr '\n' ' ' | sed 's/ $//')
    want="stage_$s"
    if [ "$syms" != "$want" ]; then
        echo "static check: $s: exported symbols are '$syms', want exactly 'stage_$s' (make the rest static)"
        fail=1
    fi
    grep -q '^#include "hopper.cuh"' "$stages_dir/$s/attention.cu" 2>/dev/null || continue
    hopper=$((hopper + 1))
    ptx="$build/$s.ptx"
    for insn in wgmma.mma_async cp.async.bulk.tensor; do
        if ! grep -q "$insn" "$ptx" 2>/dev/null; then
            echo "static check: $s: no $insn in its PTX ($ptx): not on Hopper's asynchronous path"; fail=1
        fi
    done
    # a warp-specialised stage (it calls SETMAXNREG_*) moves registers between its roles and
    # hands turns over by named barriers: both must be in its PTX
    if grep -q 'SETMAXNREG_' "$stages_dir/$s/attention.cu"; then
        for insn in setmaxnreg bar.sync bar.arrive; do
            if ! grep -q "$insn" "$ptx" 2>/dev/null; then
                echo "static check: $s: no $insn in its PTX ($ptx), though the stage is warp-specialised"; fail=1
            fi
        done
    fi
    if grep -q '(C75[0-9][0-9])' "$log"; then
        echo "static check: $s: ptxas performance warnings:"
        grep '(C75[0-9][0-9])' "$log" | sed 's/^/    /'; fail=1
    fi
    if [ -n "$cuobjdump" ]; then
        sass=$("$cuobjdump" --dump-sass "$obj" 2>&1)
        for insn in 'HGMMA\|QGMMA' UTMALDG; do
            if ! printf '%s' "$sass" | grep -q "$insn"; then
                echo "static check: $s: no $insn in its SASS ($cuobjdump --dump-sass $obj)"; fail=1
            fi
        done
    else
        echo "static check: $s: SASS not read (no cuobjdump here): HGMMA and UTMALDG not checked"
    fi
done
if [ $fail = 0 ]; then
    echo "static check: $n programs built, no spills or stack frames, one exported symbol each;" \
         "$hopper Hopper stage(s) with wgmma and TMA in their PTX and no C75xx warning"
fi
exit $fail
