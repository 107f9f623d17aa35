#!/bin/sh
# plots/readme_table.sh: the README's generated blocks, from the measured CSVs: the ladder
# table and the papers' headline ratios.
#
#   sh plots/readme_table.sh                    print the Markdown table
#   sh plots/readme_table.sh --headline         print the headline block
#   sh plots/readme_table.sh --update README.md replace what lies between the lines
#                                               <!-- table:begin --> and <!-- table:end -->
#                                               (required), and between <!-- headline:begin -->
#                                               and <!-- headline:end --> (where present)
#
# One row per stage (then cuBLAS and the PyTorch anchors), at head dim TABLE_D (128) and
# N = TABLE_N (8192) of the bench protocol (16384 tokens, hidden 2048): forward and backward
# TFLOP/s, non-causal and causal; the percentage of the GEMM ceiling, forward / backward
# non-causal (TFLOP/s over the ceiling_gemm row's: a bf16 8192^3 GEMM through torch.matmul,
# timed in the same bench run; the column is left out, and the caption says so, when the
# sweep CSV has no ok ceiling_gemm row); the workspace (L + scratch) forward / backward; the
# longest N that ran in the long-context runs (B = 1, H = 16, d = 128, non-causal); and the TFLOP/s
# ratio to PyTorch's FLASH backend (FA-2) on the same shape; and a training step, forward +
# backward milliseconds, non-causal, with torch_cudnn's over it. The caption, above the table, is
# two italic lines with a blank line between them: what the cells are; then the GPU, the CSVs
# and the date of their rows, and whether they are one make bench run (plots/plots.sh
# --sources: SOURCES in plots/plots.sh). When the sweep CSV holds rows of
# several runs (its .runs file), the caption names the run the GEMM ceiling was timed in, and
# says for which stages the two ratio columns (% of GEMM ceiling, vs torch_flash) divide rows
# of one run and for which of two (plots/plots.sh --runs).
#
# The headline block: the ratios the FlashAttention papers lead with, as this GPU reproduces
# them, per N of the sweep, head dim 128 and 64, non-causal: FA-1 over standard attention
# (time of HEADLINE_STD, cublas, over time of HEADLINE_FA1, 05_tensor_cores: both on the
# tensor cores) and FA-2 over FA-1 (time of HEADLINE_FA1 over time of HEADLINE_FA2, 06_fa2),
# forward, backward and forward + backward (the ratio of the summed times), and, where the
# CSV has forward rows of HEADLINE_HOP (07_wgmma: FA-2's forward on wgmma), the forward of
# HEADLINE_FA2 over it (the stage has no backward). Its caption, two lines as the table's: what
# each ratio divides; the GPU, the CSV and the date of its rows as plots/plots.sh --sources
# gives them, and, for a CSV of several runs, whether each ratio divides rows of one run or
# two. Then the papers' own figures, cited, in a note of their own.
# The CSVs are the ones plots/plots.sh draws: one GPU's (make plots GPU=NVIDIA-H200 to choose
# it; RESULTS_CSV / RESULTS_LONG_CSV for other paths).
set -u
cd "$(dirname "$0")/.." || exit 2
TABLE_D=${TABLE_D:-128}
TABLE_N=${TABLE_N:-8192}
BEGIN_MARK='<!-- table:begin -->'
END_MARK='<!-- table:end -->'
HL_BEGIN='<!-- headline:begin -->'
HL_END='<!-- headline:end -->'
HEADLINE_STD=${HEADLINE_STD:-cublas}
HEADLINE_FA1=${HEADLINE_FA1:-05_tensor_cores}
HEADLINE_FA2=${HEADLINE_FA2:-06_fa2}
HEADLINE_HOP=${HEADLINE_HOP:-07_wgmma}

csvs=$(sh plots/plots.sh --which) || exit 2
MAIN=$(echo "$csvs" | sed -n 1p)
LONG=$(echo "$csvs" | sed -n 2p)
[ -s "$LONG" ] || LONG=
# with rows of several runs in the sweep CSV: which run each stage's rows come from
RUNS=$(sh plots/plots.sh --runs "$MAIN") || exit 2

# run_pair A B: whether the rows of stages A and B come from one run of the sweep CSV,
# "same<tab>DATE", or from two, "apart<tab>LATER<tab>ITS DATE<tab>EARLIER"; nothing when the
# CSV is one run or its .runs lines cannot tell (plots/plots.sh --runs)
run_pair() {
    printf '%s\n' "$RUNS" | awk -F '\t' -v a="$1" -v b="$2" '
        NF == 4 { r[$1] = $2 + 0; d[$1] = $3; w[$1] = $4 }
        END {
            if (!(a in r) || !(b in r)) exit
            late = r[a] > r[b] ? a : b; early = late == a ? b : a
            if (!w[late]) exit
            if (r[a] == r[b]) printf "same\t%s\n", d[a]
            else printf "apart\t%s\t%s\t%s\n", late, d[late], early
        }'
}
# pair_words A B: run_pair in words, for a caption
pair_words() {
    run_pair "$1" "$2" | awk -F '\t' '
        $1 == "same" { print "both from the run of " $2 }
        $1 == "apart" { print "from two runs (`" $2 "` from the run of " $3 ", `" $4 "` from an earlier one)" }'
}

table() {
    b=$((16384 / TABLE_N)) h=$((2048 / TABLE_D))
    # the GEMM ceiling: "TFLOP/s size dtype" of the ok ceiling_gemm row (the last one wins)
    ceil=$(awk -F, '$2 == "ceiling_gemm" && $15 == "ok" && $13 > 0 { c = $13 " " $8 " " $4 } END { print c }' "$MAIN")
    src=$(sh plots/plots.sh --sources --md "$MAIN" ${LONG:+"$LONG"}) || return 1
    # the run the ceiling was timed in: "the same run", or, with several, its date
    when="the same run"
    [ -z "$RUNS" ] || when=$(printf '%s\n' "$RUNS" | awk -F '\t' '$1 == "ceiling_gemm" { print "the run of " $3 }')
    # the caption: two italic lines, a blank line between them: what the cells are, then where
    # they come from
    printf '%s' "*bf16, head dim $TABLE_D, N = $TABLE_N (B = $b, H = $h), TFLOP/s (median); step: fwd + bwd ms, non-causal (torch_cudnn's over it); longest N: long-context runs (B = 1, H = 16) and what stopped them (time: past the bench's budget a call; memory; cap: the last N the bench asks of it, 1048576 for a stage and 131072 for an anchor); "
    if [ -n "$ceil" ]; then
        echo "$ceil" | awk -v when="${when:-a run the CSV does not name}" '{ printf "%% of GEMM ceiling: over the %.0f TFLOP/s of a %s %d³ torch.matmul in %s (`ceiling_gemm`)", $1, $3, $2, when }'
    else
        printf '%s' "no % of GEMM ceiling: \`$MAIN\` has no ok \`ceiling_gemm\` row"
    fi
    [ -z "$RUNS" ] || runs_note "$ceil"
    echo ".*"
    echo
    echo "*$src; generated by \`plots/readme_table.sh\`: do not edit by hand.*"
    echo
    if [ -n "$ceil" ]; then
        echo "| stage | forward | forward causal | backward | backward causal | % of GEMM ceiling fwd / bwd | workspace fwd / bwd | longest N fwd / bwd | vs torch_flash fwd / bwd | step fwd + bwd (vs torch_cudnn) |"
        echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    else
        echo "| stage | forward | forward causal | backward | backward causal | workspace fwd / bwd | longest N fwd / bwd | vs torch_flash fwd / bwd | step fwd + bwd (vs torch_cudnn) |"
        echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|"
    fi
    awk -F, -v d="$TABLE_D" -v n="$TABLE_N" -v main="$MAIN" -v ceil="${ceil%% *}" '
        function tf(s, dir, c,   k) {
            k = s SUBSEP dir SUBSEP c
            if (!(k in st) || st[k] == "skipped") return "-"   # skipped: past the time budget
            if (st[k] != "ok") return st[k] == "refused" ? "n/a" : "failed"
            return t[k] >= 100 ? sprintf("%.0f", t[k]) : sprintf("%.1f", t[k])
        }
        function bytes(s, dir,   k, x) {
            k = s SUBSEP dir SUBSEP 0
            if (!(k in st) || st[k] != "ok") return "-"
            x = ws[k]
            return x >= 2^30 ? sprintf("%.1f GiB", x / 2^30) : x >= 2^20 ? sprintf("%.1f MiB", x / 2^20) : sprintf("%.0f KiB", x / 2^10)
        }
        # a training step, non-causal: forward + backward milliseconds, and torch_cudnn over it
        function step(s,   f, b, cf, cb, x, y) {
            f = s SUBSEP "forward" SUBSEP 0; b = s SUBSEP "backward" SUBSEP 0
            if (st[f] != "ok" || st[b] != "ok") return "-"
            x = ms[f] + ms[b]
            cf = "torch_cudnn" SUBSEP "forward" SUBSEP 0; cb = "torch_cudnn" SUBSEP "backward" SUBSEP 0
            y = (st[cf] == "ok" && st[cb] == "ok" && x > 0) ? sprintf(" (%.2f×)", (ms[cf] + ms[cb]) / x) : ""
            return (x >= 100 ? sprintf("%.0f", x) : x >= 10 ? sprintf("%.1f", x) : sprintf("%.2f", x)) " ms" y
        }
        function ratio(s, dir,   a, b) {
            a = s SUBSEP dir SUBSEP 0; b = "torch_flash" SUBSEP dir SUBSEP 0
            if (st[a] != "ok" || st[b] != "ok" || t[b] <= 0) return "-"
            return sprintf("%.2f×", t[a] / t[b])
        }
        # the longest N and what stopped the series there: the next N would pass the time budget
        # of a call of the bench ("time"), did not fit in memory ("memory"), failed, or the bench
        # asks for no larger N of it ("cap": the anchors stop at 131072, the stages at 1048576)
        function longest(s, dir,   k, why) {
            k = s SUBSEP dir
            if (!(k in maxn)) return "-"
            if (!(k in nextst)) why = maxn[k] == (s ~ /^torch_/ ? 131072 : 1048576) ? "cap" : "no row past it"
            else why = nextst[k] == "skipped" ? "time" : nextnote[k] ~ /needs .*GiB|memory/ ? "memory" : nextst[k]
            return maxn[k] " (" why ")"
        }
        # non-causal TFLOP/s over the GEMM ceiling, in percent: two significant digits
        function pct(s, dir,   k, x) {
            k = s SUBSEP dir SUBSEP 0
            if (!(k in st) || st[k] != "ok") return tf(s, dir, 0)   # "-", "n/a" or "failed"
            x = 100 * t[k] / ceil
            return (x >= 10 ? sprintf("%.0f", x) : x >= 1 ? sprintf("%.1f", x) : sprintf("%.2f", x)) "%"
        }
        FNR == 1 || $2 ~ /^ceiling_/ || $4 != "bf16" { next }   # the table is bf16 (FP8=1 adds e4m3 rows)
        FILENAME != main {                     # the long-context CSV: its non-causal rows
            # (the causal and the sliding-window series, whose notes start "window=", reach
            # further: they are not this column)
            if ($11 != 0 || $16 ~ /^(window|mask|block-mask)=/) next
            if ($15 == "ok" && $8 + 0 > maxn[$2, $3]) maxn[$2, $3] = $8 + 0
            if ($15 != "ok") { lr[++nlr] = $2 SUBSEP $3; ln[nlr] = $8 + 0; ls[nlr] = $15; lt[nlr] = $16 }
            next
        }
        $10 == d && $8 == n {
            k = $2 SUBSEP $3 SUBSEP $11
            st[k] = $15; t[k] = $13; ws[k] = $14; ms[k] = $12; seen[$2] = 1
        }
        END {
            # the first N past the longest that did not run, per series
            for (i = 1; i <= nlr; i++)
                if ((lr[i] in maxn) && ln[i] > maxn[lr[i]] && (!(lr[i] in nextn) || ln[i] < nextn[lr[i]])) {
                    nextn[lr[i]] = ln[i]; nextst[lr[i]] = ls[i]; nextnote[lr[i]] = lt[i]
                }
            for (s in seen) {
                rank = s ~ /^[0-9]/ ? 0 : s == "cublas" ? 1 : s == "torch_flash" ? 2 : s == "torch_cudnn" ? 3 : 4
                printf "%d %s\t| %s | %s | %s | %s | %s |%s %s / %s | %s / %s | %s / %s | %s |\n", rank, s, s,
                    tf(s, "forward", 0), tf(s, "forward", 1), tf(s, "backward", 0), tf(s, "backward", 1),
                    (ceil > 0 ? " " pct(s, "forward") " / " pct(s, "backward") " |" : ""),
                    bytes(s, "forward"), bytes(s, "backward"), longest(s, "forward"), longest(s, "backward"),
                    ratio(s, "forward"), ratio(s, "backward"), step(s)
            }
        }' ${LONG:+"$LONG"} "$MAIN" | sort -k1,1n -k2,2 | cut -f2
}

# runs_note CEIL: for a sweep CSV of several runs, a clause of the caption's first line ("; ...",
# no newline) that says which stages' ratio columns divide rows of one run and which of two (the
# anchors' and the ceiling's run against the stage's); nothing when .runs cannot tell for any stage
runs_note() {
    cols="the vs torch_flash column divides"; [ -z "$1" ] || cols="the % of GEMM ceiling and vs torch_flash columns divide"
    one= two= unk=
    for s in $(awk -F, -v d="$TABLE_D" -v n="$TABLE_N" 'FNR > 1 && $4 == "bf16" && $10 == d && $8 == n && $2 !~ /^ceiling_/ && $2 != "torch_flash" {
                   print ($2 ~ /^[0-9]/ ? 0 : $2 == "cublas" ? 1 : $2 == "torch_cudnn" ? 3 : 4), $2 }' "$MAIN" | sort -u -k1,1n -k2,2 | cut -d' ' -f2); do
        p=$(run_pair "$s" torch_flash | cut -f1)
        [ -z "$1" ] || [ "$p" = "$(run_pair "$s" ceiling_gemm | cut -f1)" ] || p=
        case $p in
            same) one="$one${one:+, }\`$s\`" ;;
            apart) two="$two${two:+, }\`$s\`" ;;
            *) unk="$unk${unk:+, }\`$s\`" ;;
        esac
    done
    [ -n "$one$two" ] || return 0
    if [ -z "$unk" ] && [ -n "$one" ] && [ -n "$two" ]; then two="the other stages"; fi
    printf '%s' "; $cols rows of one run for ${one:-no stage}"
    [ -z "$two" ] || printf '%s' ", of two runs for $two"
    [ -z "$unk" ] || printf '%s' " (the runs' lines cannot tell for $unk)"
}

headline() {
    src=$(sh plots/plots.sh --sources --md "$MAIN") || return 1
    # the wgmma column: where the CSV has ok forward rows of HEADLINE_HOP
    hop=$(awk -F, -v s="$HEADLINE_HOP" '$2 == s && $3 == "forward" && $15 == "ok" { print s; exit }' "$MAIN")
    awk -F, -v std="$HEADLINE_STD" -v fa1="$HEADLINE_FA1" -v fa2="$HEADLINE_FA2" -v hop="$hop" '
        function x(r) { return r >= 10 ? sprintf("%.1f×", r) : sprintf("%.2f×", r) }
        # time of a / time of b on one shape, directions "forward", "backward" or "both"
        function ratio(a, b, dir, d, n,   ta, tb, k) {
            if (dir == "both") {
                ta = t(a, "forward", d, n); tb = t(b, "forward", d, n)
                if (ta < 0 || tb < 0 || t(a, "backward", d, n) < 0 || t(b, "backward", d, n) < 0) return "-"
                ta += t(a, "backward", d, n); tb += t(b, "backward", d, n)
            } else {
                ta = t(a, dir, d, n); tb = t(b, dir, d, n)
                if (ta < 0 || tb < 0) return "-"
            }
            return x(ta / tb)
        }
        function t(s, dir, d, n,   k) {
            k = s SUBSEP dir SUBSEP d SUBSEP n
            return (k in ms) ? ms[k] : -1
        }
        FNR == 1 || $11 != 0 || $2 ~ /^ceiling_/ || $4 != "bf16" { next }
        $15 == "ok" && $12 > 0 { ms[$2, $3, $10, $8] = $12 }
        !($8 in nseen) { nseen[$8] = 1; ns[++nn] = $8 + 0 }
        END {
            for (i = 2; i <= nn; i++) for (j = i; j > 1 && ns[j - 1] > ns[j]; j--) { y = ns[j]; ns[j] = ns[j - 1]; ns[j - 1] = y }
            for (d = 128; d >= 64; d /= 2) {
                print ""
                print "| N, head dim " d " | FA-1 / standard fwd | bwd | fwd + bwd | FA-2 / FA-1 fwd | bwd | fwd + bwd |" (hop != "" ? " wgmma / FA-2 fwd |" : "")
                print "|--:|--:|--:|--:|--:|--:|--:|" (hop != "" ? "--:|" : "")
                for (i = 1; i <= nn; i++) {
                    n = ns[i]
                    printf "| %d | %s | %s | %s | %s | %s | %s |%s\n", n,
                        ratio(std, fa1, "forward", d, n), ratio(std, fa1, "backward", d, n), ratio(std, fa1, "both", d, n),
                        ratio(fa1, fa2, "forward", d, n), ratio(fa1, fa2, "backward", d, n), ratio(fa1, fa2, "both", d, n),
                        (hop != "" ? " " ratio(fa2, hop, "forward", d, n) " |" : "")
                }
            }
        }' "$MAIN" || return 1
    echo
    # the caption, two lines: what the ratios divide, then where the times come from (with
    # several runs, which ratios divide rows of one run, which of two)
    printf '%s' "*Ratios of median times, non-causal, bf16, B = 16384/N, H = 2048/d: FA-1 / standard: \`$HEADLINE_STD\` (standard attention on the tensor cores, S and P in HBM) over \`$HEADLINE_FA1\`; FA-2 / FA-1: \`$HEADLINE_FA1\` over \`$HEADLINE_FA2\`"
    [ -z "$hop" ] || printf '%s' "; wgmma / FA-2: \`$HEADLINE_FA2\` over \`$hop\` (forward)"
    echo "; fwd + bwd: summed times.*"
    echo
    w=
    if [ -n "$RUNS" ]; then
        r=$(pair_words "$HEADLINE_STD" "$HEADLINE_FA1"); w="${r:+FA-1 / standard: $r}"
        r=$(pair_words "$HEADLINE_FA1" "$HEADLINE_FA2"); w="$w${r:+${w:+; }FA-2 / FA-1: $r}"
        [ -z "$hop" ] || { r=$(pair_words "$HEADLINE_FA2" "$hop"); w="$w${r:+${w:+; }wgmma / FA-2: $r}"; }
    fi
    echo "*All ratios: $src${w:+; $w}; generated by \`plots/readme_table.sh\`: do not edit by hand.*"
    echo
    # then the papers' own figures, cited: a note of its own, not the caption
    if [ -n "$hop" ]; then
        echo "*The papers' figures, cited (not measured here): FlashAttention (Dao et al., 2022, A100): 2-4× faster attention, forward + backward,"
        echo "than PyTorch's standard attention at N ≤ 4K (its Tables 11 and 20: 2.0-3.3× with dropout and masking, 1.6-2.3× without);"
        echo "FlashAttention-2 (Dao, 2023, A100): 1.7-3.0× faster than FlashAttention, up to 225-230 TFLOP/s forward;"
        echo "FlashAttention-3 (Shah et al., 2024, H100): 1.5-2.0× faster than FlashAttention-2 with FP16, up to 740 TFLOP/s, from warp"
        echo "specialization and softmax overlapped with the GEMMs, which \`$hop\` does not have (it has FA-3's building blocks: TMA, mbarriers, wgmma).*"
    else
        echo "*The papers' figures, cited (A100, not measured here): FlashAttention (Dao et al., 2022): 2-4× faster attention, forward + backward,"
        echo "than PyTorch's standard attention at N ≤ 4K (its Tables 11 and 20: 2.0-3.3× with dropout and masking, 1.6-2.3× without);"
        echo "FlashAttention-2 (Dao, 2023): 1.7-3.0× faster than FlashAttention, up to 225-230 TFLOP/s forward.*"
    fi
}

# replace FILE BEGIN END CONTENT: what lies between the lines BEGIN and END of FILE becomes
# the file CONTENT (the marker lines and everything outside them are kept)
replace() {
    awk -v b="$2" -v e="$3" -v tf="$4" '
        index($0, b) { print; while ((getline line < tf) > 0) print line; skip = 1; next }
        index($0, e) { skip = 0 }
        !skip' "$1" > "$1.new" && cat "$1.new" > "$1"
    rm -f "$1.new"
}

case ${1:-} in
    "")
        table ;;
    --headline)
        headline ;;
    --update)
        file=${2:?usage: plots/readme_table.sh --update README.md}
        if ! grep -qF "$BEGIN_MARK" "$file" || ! grep -qF "$END_MARK" "$file"; then
            echo "readme_table: $file lacks the lines $BEGIN_MARK and $END_MARK" >&2
            exit 2
        fi
        table > "$file.table" || { rm -f "$file.table"; exit 1; }
        cp "$file" "$file.old"
        replace "$file" "$BEGIN_MARK" "$END_MARK" "$file.table"
        if grep -qF "$HL_BEGIN" "$file" && grep -qF "$HL_END" "$file"; then
            headline > "$file.table" || { rm -f "$file.table" "$file.old"; exit 1; }
            replace "$file" "$HL_BEGIN" "$HL_END" "$file.table"
        fi
        if cmp -s "$file" "$file.old"; then echo "readme_table: $file up to date"
        else echo "readme_table: updated $file"; fi
        rm -f "$file.table" "$file.old" ;;
    *)
        echo "usage: sh plots/readme_table.sh [--headline | --update README.md]" >&2
        exit 2 ;;
esac
