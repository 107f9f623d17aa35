#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every stage program, forward
# and backward, at small odd shapes: the 300-token ones big enough that tiled stages also run tiles
# that need no mask; the 700-token and 600-token ones more query tiles than an H200 has SMs, so that
# a persistent grid's blocks walk several (at d = 128 and 64); the head dim 256 one only the Hopper
# stages run; two deterministic backwards (the semaphores' turns: GQA without a mask, causal at an
# odd N); the next eight, three windows (in one, N_q > N_k + W: the last rows see no key) and
# five block masks (one with such rows), only the stages with masks (at head dims 64 and 128,
# with and without GQA; at 256 forward only, which 13_hopper_masks alone runs; one with a window
# AND a mask, deterministic: the semaphores' turns counted over the mask); the last four, e4m3,
# only the stages with an fp8 forward (two of them with more query tiles than SMs). Any
# finding fails; a shape a stage refuses (exit 2, e.g. a stage without a backward pass) is reported
# as skipped.
# Usage: tests/sanitize.sh SANITIZER BUILD_DIR STAGE...   (the Makefile's `sanitize` target)
set -u
san=$1 build=$2; shift 2
tools="memcheck racecheck initcheck synccheck"
shapes=("--batch 1 --heads 2 --kv-heads 1 --seqlen 67 --dim 64 --causal"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 33 --dim 128"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 353 --dim 128"
        "--batch 1 --heads 2 --seqlen-q 17 --seqlen-k 45 --dim 64 --causal"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 300 --dim 128 --causal"
        "--batch 1 --heads 1 --seqlen 4100 --dim 128 --causal"
        "--batch 1 --heads 24 --kv-heads 8 --seqlen 700 --dim 128 --causal"
        "--batch 1 --heads 40 --seqlen 600 --dim 64 --causal"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 150 --dim 256 --causal --dtype fp16"
        "--batch 1 --heads 4 --kv-heads 2 --seqlen 700 --dim 64 --deterministic"
        "--batch 1 --heads 2 --seqlen 353 --dim 128 --causal --deterministic"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 300 --dim 64 --causal --window 70"
        "--batch 1 --heads 2 --seqlen 300 --dim 128 --causal --window 100"
        "--batch 1 --heads 2 --seqlen-q 5000 --seqlen-k 1000 --dim 64 --window 100"
        "--batch 1 --heads 4 --kv-heads 2 --seqlen 300 --dim 128 --mask random:0.5"
        "--batch 1 --heads 60 --kv-heads 15 --seqlen 600 --dim 64 --mask random:0.3"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 300 --dim 256 --mask random:0.5"
        "--batch 1 --heads 2 --seqlen-q 4500 --seqlen-k 300 --dim 128 --causal --window 50 --mask random:0.5"
        "--batch 1 --heads 2 --seqlen 1000 --dim 128 --causal --window 300 --mask random:0.6 --deterministic"
        "--batch 1 --heads 4 --kv-heads 2 --seqlen 300 --dim 128 --causal --dtype e4m3"
        "--batch 1 --heads 24 --kv-heads 8 --seqlen 700 --dim 128 --causal --dtype e4m3"
        "--batch 1 --heads 2 --kv-heads 1 --seqlen 150 --dim 256 --dtype e4m3"
        "--batch 1 --heads 40 --seqlen 600 --dim 64 --causal --dtype e4m3")
command -v "$san" >/dev/null 2>&1 || { echo "sanitize: $san not found"; exit 2; }
# refuses STAGE ARGS...: STAGE, run without the sanitizer, refuses ARGS (exit 2)
refuses() { local s=$1; shift; "$build/$s" "$@" > /dev/null 2>&1; [ $? = 2 ]; }
logdir=$build/sanitize
mkdir -p "$logdir"
# one background job per stage: the runs of a stage are serial, the stages run side by side
for s in "$@"; do
    (
        for tool in $tools; do for i in "${!shapes[@]}"; do for dir in forward backward; do
            args="${shapes[$i]} --check"; [ "$dir" = backward ] && args="$args --backward"
            log="$logdir/$s.$tool.$i.$dir.log"
            # shellcheck disable=SC2086
            "$san" --tool "$tool" --error-exitcode 1 "$build/$s" $args > "$log" 2>&1
            rc=$?
            if [ $rc = 0 ]; then echo "ok      $tool $s $args"
            elif { [ $rc = 2 ] && refuses "$s" $args; } || { grep -q "^$s:" "$log" &&
                                  { grep -q "terminated before first instrumented API call" "$log" ||
                                    { grep -q "ERROR SUMMARY: 0 errors" "$log" && refuses "$s" $args; }; }; }; then
                # refused (exit 2, also without the sanitizer: an exit 2 the sanitizer's own
                # memory or start-up caused is a failure); a refusal before any CUDA call ends under the sanitizer
                # with its own error instead, the program's one line still in the log; and
                # the sanitizer has been seen to end a refusal with an error of its own and
                # no finding: the same command without it must then exit 2 (refuses)
                echo "skipped $tool $s $args: $(grep "^$s:" "$log" | tail -1)"
            else echo "FAILED  $tool $s $args (exit $rc), log $log"; fi
        done; done; done > "$logdir/$s.summary"
    ) &
done
wait
fail=0
for s in "$@"; do
    cat "$logdir/$s.summary"
    if grep -q '^FAILED' "$logdir/$s.summary"; then
        fail=1
        for log in $(grep '^FAILED' "$logdir/$s.summary" | sed 's/.*, log //'); do tail -n 30 "$log"; done
    fi
done
# a stage that no run of a tool passed was not checked by it (every stage runs some shape)
for s in "$@"; do for tool in $tools; do
    grep -q "^ok      $tool $s " "$logdir/$s.summary" || { echo "sanitize: $s: no run passed $tool"; fail=1; }
done; done
all=$(cat "$logdir"/*.summary)
echo "sanitize: $(grep -c '^ok' <<< "$all") ok, $(grep -c '^skipped' <<< "$all") skipped," \
     "$(grep -c '^FAILED' <<< "$all") failed"
exit $fail
