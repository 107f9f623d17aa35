#!/bin/sh
# plots/timeline.sh OUT.png TERM CSV...: a stage's pipeline timeline, one panel per CSV (written
# by `make build/08_fa3 TRACE=1` and ATTN_TRACE=FILE, see stages/08_fa3/attention.cu; the same for
# 10_fa3_backward with --backward): for block 0, one row per warpgroup (the producer, then the
# consumers), the phases of each step as bars along the SM's clock. The consumers' steps FIRST ..
# LAST (environment, default 4 .. 7: past the start, where the pipeline runs steady) and the
# producer's loads for them (stage 10's run a ring of two steps ahead: its steps FIRST + 2 ..).
# The CSVs are named <gpu>-<stage>-<build>.csv, all of one stage. Called by plots/plots.sh when
# plots/results/trace/ holds CSVs.
# plots/timeline.sh --shares CSV: each consumer's phases in that trace as a Markdown table, the
# cycles of a step and their share of it, over block 0's steps FIRST to the last one whose next
# step is recorded (plots/hopper_tables.sh's "trace STAGE").
set -u
if [ "${1:-}" = --shares ]; then shares=1; shift; set -- - - "$@"; else shares=0; fi
out=$1 term=$2; shift 2
FIRST=${FIRST:-4} LAST=${LAST:-7}
stage=$(basename "$1" .csv | sed 's/^.*-\([0-9][0-9]_[a-z0-9_]*\)-[a-z_]*$/\1/')
# Per stage: a label and a colour for each consumer phase k = 1 .. nseg + 1 (its event k - 1 to
# event k; phase nseg + 1 from event nseg to the next step's event 0), then for the producer's
# two (its event 0 to 1 and 1 to 2); ahead: how many steps the producer's loads run ahead.
case $stage in
    10_*) what="the backward's pipeline, block 0 (key tile 0 of head 0)"
          # stages/10_fa3_backward, the consumers' loop (events 0, 1) and bwd_step (2 .. 7): wait
          # for the tiles; issue S and dP, wait for S; P, wait for dP, dS, pack both; issue dV,
          # store dSᵀ, meet the other consumer; issue dQ and dK, wait for dQ and dV; release dO_i,
          # the atomics; wait for dK; release Q_i (to the next step). The producer's loop (0 .. 2):
          # wait for a free stage, Q_i and L_i issued; wait for dO_i's stage, dO_i and D_i issued.
          labels="'wait for Q_i, dO_i' 'issue Sᵀ, dPᵀ; wait for Sᵀ' 'Pᵀ; wait for dPᵀ; dSᵀ' 'issue dV; store dSᵀ; barrier' 'issue dQ, dK; wait for dQ, dV' 'dQ_i atomics' 'wait for dK' 'release Q_i; next step' 'producer: wait for a stage; Q_i, L_i' 'producer: dO_i, D_i'"
          colors="'#bbbbbb' '#1f77b4' '#d62728' '#ffcc66' '#6baed6' '#2ca02c' '#dddddd' '#98df8a' '#9467bd' '#8c564b'"
          nseg=7 ahead=2 ;;
    *)    what="stage 8's pipeline, block 0 (query tile 0 of head 0)"
          # stages/08_fa3: wait for tiles, wait for the turn, issue S and P V, wait for S,
          # softmax, wait for P V; rescale O and pack P (to the next step). The producer: K, V.
          labels="'wait for tiles' 'wait for the turn' 'issue S, P V' 'wait for S' 'softmax' 'wait for P V' 'rescale O, pack P' 'producer: K' 'producer: V'"
          colors="'#bbbbbb' '#ffcc66' '#1f77b4' '#dddddd' '#d62728' '#999999' '#2ca02c' '#9467bd' '#8c564b'"
          nseg=6 ahead=0 ;;
esac

if [ "$shares" = 1 ]; then
    csv=$1
    eval "set -- $labels"
    awk -F, -v first="$FIRST" -v nseg="$nseg" -v labels="$(printf '%s\n' "$@")" '
        NR > 1 && $1 == 0 { t[$2, $3, $4] = $5; if ($2 > maxwg) maxwg = $2; if ($3 > maxs) maxs = $3 }
        END {
            split(labels, lab, "\n")
            last = maxs - 1; n = last - first + 1
            for (w = 1; w <= maxwg; w++) for (s = first; s <= last; s++) {
                for (e = 0; e < nseg; e++) c[w, e + 1] += t[w, s, e + 1] - t[w, s, e]
                c[w, nseg + 1] += t[w, s + 1, 0] - t[w, s, nseg]
                step[w] += t[w, s + 1, 0] - t[w, s, 0]
            }
            head = "| phase"; rule = "|---"
            for (w = 1; w <= maxwg; w++) { head = head " | consumer " w - 1; rule = rule "|--:" }
            print head " |"; print rule "|"
            for (k = 1; k <= nseg + 1; k++) {
                line = "| " lab[k]
                for (w = 1; w <= maxwg; w++) line = line sprintf(" | %.0f (%.0f%%)", c[w, k] / n, 100 * c[w, k] / step[w])
                print line " |"
            }
            line = "| the step"
            for (w = 1; w <= maxwg; w++) line = line sprintf(" | %.0f", step[w] / n)
            print line " |"
            printf "# steps %d-%d\n", first, last
        }' "$csv"
    exit
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/timeline.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
n=0
for csv in "$@"; do
    n=$((n + 1))
    # segments "row x0 x1 kind", x in cycles from the first stamp of block 0 at step FIRST (the
    # producer's at FIRST + ahead); kinds 1 .. nseg + 1 a consumer's phases, then nseg + 2 and
    # nseg + 3 the producer's two
    awk -F, -v first="$FIRST" -v last="$LAST" -v nseg="$nseg" -v ahead="$ahead" '
        NR > 1 && $1 == 0 { t[$2, $3, $4] = $5; if ($2 > maxwg) maxwg = $2 }
        END {
            t0 = -1
            for (k in t) { split(k, a, SUBSEP); if (a[2] == first + (a[1] == 0 ? ahead : 0) && (t0 < 0 || t[k] < t0)) t0 = t[k] }
            for (w = 0; w <= maxwg; w++) for (s = first; s <= last; s++) {
                if (w == 0) {   # the producer
                    p = s + ahead
                    if ((0, p, 1) in t) printf "%d %d %d %d\n", w, t[0, p, 0] - t0, t[0, p, 1] - t0, nseg + 2
                    if ((0, p, 2) in t) printf "%d %d %d %d\n", w, t[0, p, 1] - t0, t[0, p, 2] - t0, nseg + 3
                    continue
                }
                for (e = 0; e < nseg; e++)
                    if ((w, s, e) in t && (w, s, e + 1) in t)
                        printf "%d %d %d %d\n", w, t[w, s, e] - t0, t[w, s, e + 1] - t0, e + 1
                if ((w, s, nseg) in t && (w, s + 1, 0) in t && s < last)
                    printf "%d %d %d %d\n", w, t[w, s, nseg] - t0, t[w, s + 1, 0] - t0, nseg + 1
            }
            printf "# rows %d\n", maxwg + 1
        }' "$csv" > "$tmp/p$n.dat"
    # the title: the build the trace was recorded with, from the file name <gpu>-<stage>-<build>.csv
    # (default: the stage as it is; noIDEA: make build/<stage> TRACE=1 OFF=IDEA)
    name=$(basename "$csv" .csv); name=${name##*"$stage"-}
    case $name in default) name="$stage as it is" ;; no*) name="$stage OFF=${name#no}" ;; esac
    printf '%s\n' "$name" > "$tmp/p$n.name"
done
{
    echo "set terminal $term size 1400,$((260 * n + 80)) font ',10'"
    echo "set output '$out'"
    # the source line: the traces' .runs file (date, GPU, commit: what was built and run), and
    # the trace (its folder where there are several)
    runs=$(dirname "$1")/$(basename "$1" .csv | sed 's/-[a-z]*$//').runs
    src=$(sed -n '1s/: .*//p' "$runs" 2>/dev/null)
    [ "$n" = 1 ] && where=$1 || where=$(dirname "$1")/
    printf '%s\n' "set multiplot layout $n,1 title \"$what, steps $FIRST-$LAST, d = 128, N = 8192: clock64 stamps of thread 0 of each warpgroup\\n${src:-traces of an unrecorded run} ($where)\" font ',11' noenhanced"
    echo "set termoption noenhanced"
    echo "set style fill solid 0.9 noborder"
    echo "set xlabel 'SM clock cycles'"
    echo "set grid xtics"
    echo "set key outside right top vertical"
    i=0
    eval "set -- $colors"
    for c in "$@"; do
        i=$((i + 1)); echo "set linetype $i lc rgb '$c'"
    done
    k=0
    while [ "$k" -lt "$n" ]; do
        k=$((k + 1))
        rows=$(awk '/^# rows/ { print $3 }' "$tmp/p$k.dat")
        echo "set title '$(cat "$tmp/p$k.name")'"
        echo "set yrange [-0.6 : $rows - 0.4] reverse"
        ytics="\"producer\" 0"; r=1
        while [ "$r" -lt "$rows" ]; do ytics="$ytics, \"consumer $((r - 1))\" $r"; r=$((r + 1)); done
        echo "set ytics ($ytics)"
        echo "plot '$tmp/p$k.dat' using (\$2 + \$3) / 2.0 : 1 : (\$3 - \$2) / 2.0 : (0.35) : 4 with boxxyerror lc variable notitle, \\"
        j=0
        eval "set -- $labels"
        for t in "$@"; do
            j=$((j + 1))
            echo "     NaN with boxes lt $j title '$t'$( [ $j -lt $# ] && echo ', \')"
        done
    done
    echo "unset multiplot"
} > "$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
