#!/bin/sh
# plots/timeline.sh OUT.png TERM CSV...: a stage's pipeline timeline, one panel per CSV (written
# by `make build/08_fa3 TRACE=1` and ATTN_TRACE=FILE, see stages/08_fa3/attention.cu; the same for
# 10_fa3_backward with --backward): for block 0, one row per warpgroup (the producer, then the
# consumers), the phases of each step as bars along the SM's clock. Steps FIRST .. LAST
# (environment, default 4 .. 7: past the start, where the pipeline runs steady). The CSVs are
# named <gpu>-<stage>-<build>.csv, all of one stage. Called by plots/plots.sh when
# plots/results/trace/ holds CSVs.
set -u
out=$1 term=$2; shift 2
FIRST=${FIRST:-4} LAST=${LAST:-7}
stage=$(basename "$1" .csv | sed 's/^.*-\([0-9][0-9]_[a-z0-9_]*\)-[a-z_]*$/\1/')
case $stage in
    10_*) what="the backward's pipeline, block 0 (key tile 0 of head 0)"
          # consumer events 0..7 of a step (stages/10_fa3_backward: TRACE_AT), producer 0..2
          labels="'wait for Q_i, dO_i' 'Sᵀ, dPᵀ: wait for S' 'P; wait for dP; dS' 'issue dV; store dSᵀ; both consumers' 'dQ (and dV) products' 'hand dQ_i on' 'wait for dK' 'producer: Q_i, L_i' 'producer: dO_i, D_i'"
          nseg=7 ;;
    *)    what="stage 8's pipeline, block 0 (query tile 0 of head 0)"
          labels="'wait for tiles' 'wait for the turn' 'issue S, P V' 'wait for S' 'softmax' 'wait for P V' 'rescale O, pack P' 'producer: K' 'producer: V'"
          nseg=6 ;;
esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/timeline.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
n=0
for csv in "$@"; do
    n=$((n + 1))
    # segments "row x0 x1 kind", x in cycles from the first stamp of block 0 at step FIRST;
    # kinds 1 .. nseg: a consumer's event e to e + 1 (stage 8: 1 wait for tiles, 2 wait for the
    # turn, 3 issue S and P V, 4 wait for S, 5 softmax, 6 wait for P V; 7 rescale O and pack P,
    # to the next step; stage 10: 1-7 its seven), then 8, 9 the producer's two (K, V; Q_i, dO_i)
    awk -F, -v first="$FIRST" -v last="$LAST" -v nseg="$nseg" '
        NR > 1 && $1 == 0 { t[$2, $3, $4] = $5; if ($2 > maxwg) maxwg = $2 }
        END {
            t0 = -1
            for (k in t) { split(k, a, SUBSEP); if (a[2] == first && (t0 < 0 || t[k] < t0)) t0 = t[k] }
            for (w = 0; w <= maxwg; w++) for (s = first; s <= last; s++) {
                if (w == 0) {   # the producer
                    if ((0, s, 1) in t) printf "%d %d %d %d\n", w, t[0, s, 0] - t0, t[0, s, 1] - t0, 8
                    if ((0, s, 2) in t) printf "%d %d %d %d\n", w, t[0, s, 1] - t0, t[0, s, 2] - t0, 9
                    continue
                }
                for (e = 0; e < nseg; e++)
                    if ((w, s, e) in t && (w, s, e + 1) in t)
                        printf "%d %d %d %d\n", w, t[w, s, e] - t0, t[w, s, e + 1] - t0, e + 1
                if (nseg == 6 && (w, s, 6) in t && (w, s + 1, 0) in t && s < last)
                    printf "%d %d %d 7\n", w, t[w, s, 6] - t0, t[w, s + 1, 0] - t0
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
    # the source line: the traces' .runs file (date, GPU, commit: what was built and run)
    runs=$(dirname "$1")/$(basename "$1" .csv | sed 's/-[a-z]*$//').runs
    src=$(sed -n '1s/: .*//p' "$runs" 2>/dev/null)
    printf '%s\n' "set multiplot layout $n,1 title \"$what, steps $FIRST-$LAST, d = 128, N = 8192: clock64 stamps of thread 0 of each warpgroup\\n${src:-traces of an unrecorded run} (plots/results/trace/)\" font ',11'"
    echo "set termoption noenhanced"
    echo "set style fill solid 0.9 noborder"
    echo "set xlabel 'SM clock cycles'"
    echo "set grid xtics"
    echo "set key outside right top vertical"
    i=0
    for c in '#bbbbbb' '#ffcc66' '#1f77b4' '#dddddd' '#d62728' '#999999' '#2ca02c' '#9467bd' '#8c564b'; do
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
