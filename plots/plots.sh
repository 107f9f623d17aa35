#!/bin/sh
# plots/plots.sh: draws the figures in plots/*.png from the measured CSVs (`make plots`).
# Runs anywhere with a POSIX sh, awk, sort and gnuplot (gnuplot-nox is enough); the data
# are cut out of the CSVs with awk, and every figure is drawn by plots/figure.gp.
#
#   sh plots/plots.sh            draw every figure
#   sh plots/plots.sh --which    print the two CSV paths it would read (sweep, long), draw nothing
#
# Environment (optional):
#   RESULTS_CSV        the sweep CSV (default: the plots/results/*.csv that is not *-long.csv,
#                      the first in name order if there are several GPUs' files)
#   RESULTS_LONG_CSV   the long-context CSV (default: the sweep CSV's name + -long.csv)
#   PLOTS_DIR          where the PNGs go (default: plots)
#   PLOTS_TERM         pngcairo or png (default: pngcairo if this gnuplot has it)
#
# Figures (only rows with status ok are drawn, except the crosses in long_context.png):
#   tflops_{forward,backward}_d{64,128}.png  TFLOP/s vs N, one line per stage, cuBLAS and the
#       two PyTorch anchors (dashed); left non-causal, right causal; dotted: the GEMM ceiling
#   workspace.png      forward workspace bytes vs N, d = 128: the sweep (16384 tokens, so S
#       grows like N) and the long-context runs (B = 1, so S grows like N^2)
#   speedup.png        each stage over the stage before it, d = 128, non-causal
#   long_context.png   time vs N up to 131072 (B = 1, H = 16, d = 128); a cross marks where a
#       stage stopped (refused or failed), labelled with the reason
# Then the generated tables: README.md (plots/readme_table.sh) and docs/*.md (docs_tables.sh).
set -u
cd "$(dirname "$0")/.." || exit 2
PLOTS_DIR=${PLOTS_DIR:-plots}

MAIN=${RESULTS_CSV:-}
if [ -z "$MAIN" ]; then
    for f in plots/results/*.csv; do
        case $f in *-long.csv|*-bytes.csv) continue ;; esac
        [ -f "$f" ] || continue
        if [ -z "$MAIN" ]; then MAIN=$f
        else echo "plots: also found $f (RESULTS_CSV=$f to use it)" >&2; fi
    done
fi
if [ -z "$MAIN" ] || [ ! -s "$MAIN" ]; then
    echo "plots: no results CSV (${MAIN:-plots/results/*.csv}): run 'make bench' on the GPU machine and commit plots/results/, or set RESULTS_CSV" >&2
    exit 2
fi
LONG=${RESULTS_LONG_CSV:-${MAIN%.csv}-long.csv}
BYTES=${RESULTS_BYTES_CSV:-${MAIN%.csv}-bytes.csv}
if [ "${1:-}" = --which ]; then
    printf '%s\n%s\n%s\n' "$MAIN" "$LONG" "$BYTES"
    exit 0
fi
if [ ! -s "$LONG" ]; then
    echo "plots: no $LONG: long_context.png skipped, workspace.png without its long-context panel"
    LONG=
fi
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "plots: gnuplot not found (apt-get install gnuplot-nox)" >&2
    exit 2
fi
term=${PLOTS_TERM:-}
if [ -z "$term" ]; then
    if gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1; then term=pngcairo; else term=png; fi
fi
DAT=$(mktemp -d "${TMPDIR:-/tmp}/plots.XXXXXX") || exit 2
trap 'rm -rf "$DAT"' EXIT
mkdir -p "$PLOTS_DIR" || exit 2
GPU=$(awk -F, 'NR == 2 { print $1; exit }' "$MAIN")
echo "plots: $MAIN${LONG:+ and $LONG} ($GPU), $term terminal"

# Every stage gets one linetype (colour, dash, point), the same in every figure: numbered
# stages in order, then cuBLAS, then the PyTorch anchors.
ORDER=$(awk -F, 'FNR > 1 && $2 != "ceiling_gemm" { print $2 }' "$MAIN" ${LONG:+"$LONG"} |
    sort -u |
    awk '{ print (/^[0-9]/ ? 0 : $0 == "cublas" ? 1 : $0 == "torch_flash" ? 2 : $0 == "torch_cudnn" ? 3 : 4), $0 }' |
    sort -k1,1n -k2,2 | cut -d' ' -f2 | tr '\n' ' ')
awk -v order="$ORDER" 'BEGIN {
    npal = split("#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #17becf", pal, " ")
    m = split(order, stage, " ")
    k = 0
    for (i = 1; i <= m; i++) {
        if (stage[i] == "cublas")           st = "lc rgb \"#7f7f7f\" dt 1 pt 5"
        else if (stage[i] == "torch_flash") st = "lc rgb \"#000000\" dt 2 pt 9"
        else if (stage[i] == "torch_cudnn") st = "lc rgb \"#bcbd22\" dt 2 pt 11"
        else                                st = "lc rgb \"" pal[k++ % npal + 1] "\" dt 1 pt 7"
        printf "set linetype %d %s lw 2 ps 0.9\n", i, st
    }
}' > "$DAT/styles.gp"

# Cut the CSVs into DAT/<prefix>__<stage>.dat files of "N y" lines (y: TFLOP/s, bytes, ms
# or a ratio; "N y \"label\"" for the *_x__ crosses). The first awk emits "file N value"
# (the last row of a shape wins), sort orders by file then N, the second awk writes them.
{
    awk -F, -v order="$ORDER" '
        function put(prefix, stage, n, y) { val[prefix "__" stage, n] = y }
        FNR == 1 { next }
        $2 == "ceiling_gemm" { if ($15 == "ok") ceiling = $13; next }
        $15 != "ok" { next }
        {
            put("tf_" $3 "_d" $10 "_c" $11, $2, $8, $13)
            if ($3 == "forward" && $10 == 128 && $11 == 0 && $14 > 0) put("ws_sweep", $2, $8, $14)
            if ($10 == 128 && $11 == 0 && $2 ~ /^[0-9][0-9]_/) { ms[$3, $2, $8] = $12; has[$3, $2] = 1 }
        }
        END {
            # speedup: each numbered stage over the previous one that has rows in that direction
            m = split(order, stage, " ")
            for (di = 1; di <= 2; di++) {
                dir = di == 1 ? "forward" : "backward"
                prev = ""
                for (i = 1; i <= m; i++) {
                    s = stage[i]
                    if (!((dir, s) in has)) continue
                    if (prev != "") {
                        for (k in ms) {
                            split(k, a, SUBSEP)
                            if (a[1] == dir && a[2] == s && ((dir, prev, a[3]) in ms) && ms[k] > 0)
                                put("su_" dir, s, a[3], ms[dir, prev, a[3]] / ms[k])
                        }
                        print "title", "su_" dir, s, s "/" prev
                    }
                    prev = s
                }
            }
            if (ceiling != "") print "ceiling", ceiling
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$MAIN"
    [ -z "$LONG" ] || awk -F, '
        function human(b) {
            # binary units, as the workspace axis
            return b >= 2^40 ? sprintf("%.1f TiB", b / 2^40) : b >= 2^30 ? sprintf("%.1f GiB", b / 2^30) : sprintf("%.0f MiB", b / 2^20)
        }
        FNR == 1 || $2 == "ceiling_gemm" { next }
        { k = $3 SUBSEP $2 }
        $15 == "ok" {
            val["long_" $3 "__" $2, $8] = $12
            if ($3 == "forward" && $14 > 0) val["ws_long__" $2, $8] = $14
            if ($8 + 0 > lastn[k]) { lastn[k] = $8 + 0; lastms[k] = $12 }
            next
        }
        !(k in badn) || $8 + 0 < badn[k] { badn[k] = $8 + 0; bad[k] = $15; note[k] = $16; ws[k] = $14 }
        END {
            # A cross where each stage stopped, on the quadratic continuation of its line
            # (none for a stage that never ran in that direction: no backward pass, say).
            for (k in badn) {
                if (!(k in lastn)) continue
                split(k, a, SUBSEP); n = badn[k]
                y = lastms[k] * (n / lastn[k]) ^ 2
                if (bad[k] == "refused" && ws[k] > 0) label = "refused: needs " human(ws[k])
                else {   # the last clause of the reason ("...; so stage X caps N_k at M")
                    nc = split(note[k], clause, "; ")
                    c = clause[nc]; sub(/^so stage [^ ]+ /, "", c)
                    label = bad[k] ": " c
                }
                gsub(/"/, "", label)
                if (length(label) > 48) label = substr(label, 1, 45) "..."
                val["long_" a[1] "_x__" a[2], n] = y " \"" label "\""
                if (a[1] == "forward" && bad[k] == "refused" && ws[k] > 0)
                    val["ws_long_x__" a[2], n] = ws[k] " \"needs " human(ws[k]) "\""
            }
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$LONG"
} | sort -k1,1 -k2,2n | awk -v dat="$DAT" '
    $1 == "title" { print $2, $3, $4 > (dat "/titles"); next }
    $1 == "ceiling" { print $2 > (dat "/ceiling"); next }
    $1 != cur { if (cur != "") close(path); cur = $1; path = dat "/" cur ".dat" }
    { $1 = ""; sub(/^ /, ""); print > path }'
ceiling=$(cat "$DAT/ceiling" 2>/dev/null || echo 0)

# panel P PREFIX TITLE: adds panel P's gnuplot variables to $PV: the stages (in ORDER)
# that have DAT/PREFIX__<stage>.dat and their linetypes, the stages with crosses
# (DAT/PREFIX_x__<stage>.dat), and the N values found; and the lines' key entries
# (linetype and title: the stage name, or "stage/previous" in the speedup figure) to DAT/key.
panel() {
    names='' lts='' marks='' mlts='' i=0
    for s in $ORDER; do
        i=$((i + 1))
        if [ -s "$DAT/${2}__$s.dat" ]; then
            t=$(awk -v p="$2" -v s="$s" '$1 == p && $2 == s { print $3 }' "$DAT/titles" 2>/dev/null)
            names="$names $s" lts="$lts $i"
            echo "$i ${t:-$s}" >> "$DAT/key"
        fi
        if [ -s "$DAT/${2}_x__$s.dat" ]; then marks="$marks $s" mlts="$mlts $i"; fi
    done
    nlist=$(cat "$DAT/${2}__"*.dat "$DAT/${2}_x__"*.dat 2>/dev/null | awk '{ print $1 }' | sort -nu | tr '\n' ' ')
    PV="$PV prefix$1='$2'; ptitle$1='$3'; names$1='$names'; lts$1='$lts';"
    PV="$PV marks$1='$marks'; mlts$1='$mlts'; nlist$1='$nlist';"
    [ -n "$names$marks" ] && FILLED=$((FILLED + 1))
    NPANELS=$(($1 + 1))
}

# draw OUT HEADING YLABEL YFORMAT YFACTOR HLINE HLABEL: draws the panels gathered so far
# (see plots/figure.gp for what each means).
status=0
draw() {
    if [ "$FILLED" = 0 ]; then
        echo "plots: no rows for $1; not drawn"
    elif key=$(sort -u "$DAT/key" | sort -k1,1n -s) &&
        klts=$(echo "$key" | cut -d' ' -f1 | tr '\n' ' ') &&
        ktitles=$(echo "$key" | cut -d' ' -f2 | tr '\n' ' ') &&
        gnuplot -e "term='$term'; dat='$DAT'; out='$1'; heading='$2'; ylabel='$3'; yformat='$4'; yfactor=$5; hline=$6; hlabel='$7'; panels=$NPANELS; klts='$klts'; ktitles='$ktitles'; $PV" plots/figure.gp; then
        echo "plots: wrote $1"
    else
        echo "plots: gnuplot failed on $1" >&2
        status=1
    fi
    reset_panels
}
reset_panels() {
    PV="prefix1=''; ptitle1=''; names1=''; lts1=''; marks1=''; mlts1=''; nlist1='';"
    NPANELS=0 FILLED=0
    : > "$DAT/key"
}
reset_panels

shape="bf16, 16384 tokens (B = 16384/N), hidden 2048 (H = 2048/d), $GPU"
for dir in forward backward; do
    for d in 64 128; do
        panel 0 "tf_${dir}_d${d}_c0" "non-causal"
        panel 1 "tf_${dir}_d${d}_c1" "causal (TFLOP/s of the visible half)"
        draw "$PLOTS_DIR/tflops_${dir}_d$d.png" "$dir, head dim $d: $shape" "TFLOP/s" "%g" 0 \
            "$ceiling" "GEMM ceiling ($(printf '%.0f' "$ceiling"))"
    done
done

panel 0 ws_sweep "16384 tokens, H = 16: S (B*H*N*N) grows like N"
[ -z "$LONG" ] || panel 1 ws_long "B = 1, H = 16: S grows like N^2 (x: refused)"
draw "$PLOTS_DIR/workspace.png" "forward workspace (L + scratch) at head dim 128, $GPU" \
    "bytes beyond Q, K, V, O" "%.0b %BB" 32 0 ""

panel 0 su_forward "forward"
panel 1 su_backward "backward"
draw "$PLOTS_DIR/speedup.png" "each stage over the one before it: head dim 128, non-causal, $shape" \
    "speedup (x)" "%g" 2 1 "no change"

if [ -n "$LONG" ]; then
    panel 0 long_forward "forward"
    panel 1 long_backward "backward"
    draw "$PLOTS_DIR/long_context.png" "long context: B = 1, H = 16, head dim 128, non-causal, bf16, $GPU; x = where a stage stopped" \
        "time per call (ms)" "%g" 0 0 ""
fi
sh plots/readme_table.sh --update README.md || status=1
sh plots/docs_tables.sh --update docs/*.md || status=1
exit $status
