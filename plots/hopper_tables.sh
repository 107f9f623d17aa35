#!/bin/sh
# plots/hopper_tables.sh: the tables of the Hopper stages (README.md, docs/08_fa3.md,
# docs/09_fa3_persistent.md, docs/10_fa3_backward.md), generated from two CSVs of one run each
# and the pipeline traces:
#   plots/results/<gpu>-hopper.csv    make bench PART=hopper (plots/bench.sh with the Hopper
#                                     stages and the anchors, d = 64, 128, 256, N = 2048 .. 16384)
#   plots/results/<gpu>-ablation.csv  make ablation (plots/ablation.sh)
#   plots/results/trace/<gpu>-<stage>-default.csv   make build/<stage> TRACE=1, ATTN_TRACE=FILE
#
#   sh plots/hopper_tables.sh 'SPEC'             print the table for SPEC
#   sh plots/hopper_tables.sh --update FILE...   regenerate every block of each FILE between a
#                                                line `<!-- hopper: SPEC -->` and `<!-- hopper:end -->`
# SPEC is one of (the first two with " backward" at the end: the backward's rows)
#   STAGE vs OTHER     TFLOP/s of STAGE per N (rows) and head dim, causal or not (columns), each
#                      cell followed by STAGE / OTHER on that shape: "620 (1.19×)". Where
#                      OTHER has no timed row at all (an anchor that did not run), the caption
#                      gives the reason its first row has. Either side may name a dtype,
#                      "STAGE e4m3 vs OTHER bf16" (default bf16): the rows of that dtype only
#   N=n                TFLOP/s of every stage and anchor of the CSV at N = n (rows), columns as
#                      above; "N=n e4m3": the e4m3 rows (default bf16)
#   step N=n           the training step (forward + backward) of every stage and anchor with both
#                      at N = n (bf16): milliseconds and TFLOP/s (both directions' FLOPs over the summed
#                      time), per head dim, causal or not, and the ratio of the time to OTHER's
#                      ("step N=n vs OTHER")
#   ablation STAGE     TFLOP/s of STAGE as it is and of each build with one idea out (rows), per
#                      shape of the ablation (columns), each build's cell followed by its ratio
#                      to the stage as it is
#   rmse STAGE         the e4m3 forward's RMSE against the float64 attention of the unquantized
#                      inputs (plots/fp8_rmse.sh's CSV, <gpu>-fp8-rmse.csv): per input kind and
#                      head dim (rows), without and with --hadamard (columns)
#   trace STAGE        the phases of a consumer's step in STAGE's pipeline trace (plots/results/
#                      trace/<gpu>-STAGE-default.csv, as plots/timeline.sh draws it): cycles a step
#                      and share of the step, per consumer (plots/timeline.sh --shares)
# Each table is followed by its caption, two italic lines with a blank line between them: what
# the cells are, then the run's date, GPU and commit (the CSV's .runs line; a trace's: the
# .runs of its stage's traces), the file and this script. A `STAGE vs OTHER` or `N=n` spec with
# no rows to show (the e4m3 tables before an e4m3 run) prints one line instead, "No measurements
# yet: ...". Environment: GPU (the <gpu> tag; default: the one with a hopper CSV);
# RESULTS_HOPPER_CSV, RESULTS_ABLATION_CSV: other files (default plots/results/<gpu>-hopper.csv
# and -ablation.csv; plots/plots.sh passes the first).
set -u
HERE=$(pwd)
cd "$(dirname "$0")/.." || exit 2
R=plots/results
if [ -z "${GPU:-}" ]; then
    GPU=$(ls $R/*-hopper.csv 2>/dev/null | head -n 1 | sed 's|.*/||; s|-hopper.csv$||')
fi
HOPPER=${RESULTS_HOPPER_CSV:-$R/$GPU-hopper.csv}
ABLATION=${RESULTS_ABLATION_CSV:-$R/$GPU-ablation.csv}
RMSE=${RESULTS_RMSE_CSV:-$R/$GPU-fp8-rmse.csv}

# the words a caption gives a dtype: what is e4m3 in an e4m3 row is Q, K and V (common/cli.c)
DTYPE_AWK='function dtn(t) { return t == "e4m3" ? "e4m3 Q, K, V" : t }'

# dtype_of SIDE, stage_of SIDE: "STAGE [DTYPE]" of a spec, the dtype bf16 unless named
dtype_of() { case $1 in *" "*) echo "${1#* }" ;; *) echo bf16 ;; esac; }
stage_of() { echo "${1%% *}"; }

# run_of CSV: "date, GPU, commit" of the CSV's one run (its .runs line up to the first ':'
# after the time), or nothing
run_of() {
    [ -f "$1.runs" ] || return 0
    awk 'NR == 1 { i = index($0, ": "); s = i ? substr($0, 1, i - 1) : $0; gsub(/;/, ",", s); print s }' "$1.runs"
}

table() {
    spec=$1 dir=forward
    case $spec in *" backward") dir=backward spec=${spec% backward} ;; esac
    case $spec in
        trace\ *)
            s=${spec#trace }
            csv=$R/trace/$GPU-$s-default.csv
            if [ ! -s "$csv" ]; then echo "*No trace of $s yet: \`$csv\` does not exist (\`make build/$s TRACE=1\` and \`ATTN_TRACE=FILE\` on an H100 or H200).*"; return 0; fi
            # the run's line, and the shape from its command (what follows the last ", --")
            run=$(run_of "$R/trace/$GPU-$s")
            shape=$(sed -n '1s/^.*, \(--.*\)$/\1/p' "$R/trace/$GPU-$s.runs" 2>/dev/null)
            out=$(sh plots/timeline.sh --shares "$csv") || return 2
            printf '%s\n' "$out" | grep -v '^#'
            printf "\n*Cycles of each phase of a consumer's step (in brackets: its share of the step), the mean over steps %s of block 0 in the trace drawn above (%s%s).*\n\n*One run: %s (\`%s\`); generated by \`plots/hopper_tables.sh\` (\`plots/timeline.sh --shares\`); do not edit.*\n" \
                "$(printf '%s\n' "$out" | sed -n 's/^# steps //p')" "$s" "${shape:+, \`$shape\`}" "$run" "$csv"
            return 0 ;;
        ablation\ *) csv=$ABLATION ;;
        rmse\ *) csv=$RMSE ;;
        *) csv=$HOPPER ;;
    esac
    if [ ! -s "$csv" ]; then echo "*No measurements yet: \`$csv\` does not exist (\`make bench\`, \`make bench PART=hopper\` or \`make ablation\` on an H100 or H200).*"; return 0; fi
    run=$(run_of "$csv")
    # the caption's second line, where the cells come from
    src="One run: $run (\`$csv\`); generated by \`plots/hopper_tables.sh\`; do not edit."
    case $spec in
        step\ N=*)
            rest=${spec#step N=}
            awk -F, -v n="${rest%% vs *}" -v ref="$(case $rest in *" vs "*) echo "${rest#* vs }" ;; esac)" -v src="$src" '
                NR == 1 || $15 != "ok" || $8 != n || $10 == 0 || $4 != "bf16" { next }
                {
                    if (!($2 in seen)) { seen[$2] = 1; order[++m] = $2 }
                    k = $2 SUBSEP $10 SUBSEP $11
                    ms[k, $3] = $12; fl[k, $3] = $13 * $12 * 1e9   # FLOPs = TFLOP/s x ms x 1e9
                }
                END {
                    printf "| stage | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |\n|---|--:|--:|--:|--:|--:|--:|\n"
                    for (i = 1; i <= m; i++) {
                        line = "| `" order[i] "`"; any = 0
                        for (d = 64; d <= 256; d *= 2) for (c = 0; c <= 1; c++) {
                            k = order[i] SUBSEP d SUBSEP c; r = ref SUBSEP d SUBSEP c
                            if (!((k, "forward") in ms) || !((k, "backward") in ms)) { line = line " | -"; continue }
                            t = ms[k, "forward"] + ms[k, "backward"]; any = 1
                            cell = sprintf("%.3g ms, %.0f", t, (fl[k, "forward"] + fl[k, "backward"]) / (t * 1e9))
                            if (ref != "" && (r, "forward") in ms && (r, "backward") in ms)
                                cell = cell sprintf(" (%.2f×)", (ms[r, "forward"] + ms[r, "backward"]) / t)
                            line = line " | " cell
                        }
                        if (any) print line " |"
                    }
                    printf "\n*The training step at N = %s: forward + backward milliseconds, and TFLOP/s of both directions%s; bf16, B = 16384/N, H = 2048/d, causal counting the visible half.*\n\n*%s*\n", n, ref != "" ? " (in brackets: " ref "'"'"'s time over the stage'"'"'s)" : "", src
                }' "$csv" ;;
        *" vs "*)
            sa=${spec%% vs *} sb=${spec#* vs }
            awk -F, -v a="$(stage_of "$sa")" -v adt="$(dtype_of "$sa")" -v b="$(stage_of "$sb")" \
                -v bdt="$(dtype_of "$sb")" -v src="$src" -v dir="$dir" -v csv="$csv" "$DTYPE_AWK"'
                NR == 1 || $3 != dir { next }
                { s = ($2 == a && $4 == adt) ? "a" : ($2 == b && $4 == bdt) ? "b" : ""; if (s == "") next }
                s == "a" { rows = 1 }
                $15 != "ok" {                      # why a side has no number: its first reason, and that of each shape
                    r = $15 ": " $16; gsub(/`/, "'"'"'", r)
                    if (!(s in why)) why[s] = r
                    why[s, $8, $10, $11] = r
                    next
                }
                { k = $8 SUBSEP $10 SUBSEP $11; t[s, k] = $13; ns[$8] = 1; ok[s] = 1 }
                END {
                    if (!rows) {
                        printf "*No measurements yet: `%s` has no %s %s rows of %s (`make bench PART=hopper` on an H100 or H200).*\n", csv, adt, dir, a
                        exit
                    }
                    printf "| N | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |\n|--:|--:|--:|--:|--:|--:|--:|\n"
                    more = ""
                    if (!("b" in ok))
                        more = sprintf("; no ratios: %s has no timed %s %s row in this run%s", b, bdt, dir,
                                       ("b" in why) ? " (`" why["b"] "`)" : "")
                    n = 0; for (x in ns) if (x + 0 >= 512) list[++n] = x + 0
                    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (list[j] < list[i]) { z = list[i]; list[i] = list[j]; list[j] = z }
                    for (i = 1; i <= n; i++) {
                        line = "| " list[i]
                        for (d = 64; d <= 256; d *= 2) for (c = 0; c <= 1; c++) {
                            k = list[i] SUBSEP d SUBSEP c
                            if (!(("a", k) in t)) { line = line " | -"; continue }
                            cell = sprintf("%.0f", t["a", k])
                            if (("b", k) in t && t["b", k] > 0) cell = cell sprintf(" (%.2f×)", t["a", k] / t["b", k])
                            else if (("b" in ok) && ("b", k) in why && gap == "") gap = why["b", k]
                            line = line " | " cell
                        }
                        print line " |"
                    }
                    if (adt == bdt)
                        what = sprintf("TFLOP/s of %s (in brackets: over %s on the same shape), %s, %s", a, b, dir, dtn(adt))
                    else
                        what = sprintf("TFLOP/s of %s, %s (in brackets: over %s, %s, on the same shape), %s", a, dtn(adt), b, dtn(bdt), dir)
                    # a cell without a ratio where the other ran but not on that shape: its first reason
                    if (gap != "") more = more sprintf("; no ratio where %s has no timed row (`%s`)", b, gap)
                    printf "\n*%s, B = 16384/N, H = 2048/d, causal counting the visible half%s.*\n\n*%s*\n", what, more, src
                }' "$csv" ;;
        N=*)
            rest=${spec#N=}
            awk -F, -v n="$(stage_of "$rest")" -v dt="$(dtype_of "$rest")" -v src="$src" -v dir="$dir" \
                -v csv="$csv" "$DTYPE_AWK"'
                NR == 1 || $15 != "ok" || $3 != dir || $8 != n || $10 == 0 || $4 != dt { next }
                { if (!($2 in seen)) { seen[$2] = 1; order[++m] = $2 }; t[$2, $10, $11] = $13 }
                END {
                    if (m == 0) {
                        printf "*No measurements yet: `%s` has no timed %s %s rows at N = %s (`make bench PART=hopper` on an H100 or H200).*\n", csv, dt, dir, n
                        exit
                    }
                    printf "| stage | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |\n|---|--:|--:|--:|--:|--:|--:|\n"
                    for (i = 1; i <= m; i++) {
                        line = "| `" order[i] "`"
                        for (d = 64; d <= 256; d *= 2) for (c = 0; c <= 1; c++)
                            line = line " | " (((order[i], d, c) in t) ? sprintf("%.0f", t[order[i], d, c]) : "-")
                        print line " |"
                    }
                    printf "\n*TFLOP/s at N = %s, %s, %s, B = 16384/N, H = 2048/d, causal counting the visible half.*\n\n*%s*\n", n, dir, dtn(dt), src
                }' "$csv" ;;
        ablation\ *)
            awk -F, -v s="${spec#ablation }" -v src="$src" '
                NR == 1 || $2 != s { next }
                {
                    k = $4 SUBSEP $5 SUBSEP $6
                    if (!(k in sk)) { sk[k] = 1; shp[++ns] = k }
                    if (!($3 in so)) { so[$3] = 1; off[++no] = $3 }
                    t[$3, k] = $9 == "ok" ? $8 : $9
                }
                END {
                    if (ns == 0) {
                        printf "*No measurements of %s in this file yet (`make ablation` on an H100 or H200 adds them).*\n\n*%s*\n", s, src
                        exit
                    }
                    # a shape every build refuses (a head dim the stage does not take) gets no column
                    nk = 0; gone = ""
                    for (i = 1; i <= ns; i++) {
                        r = 1; for (o = 1; o <= no; o++) if (t[off[o], shp[i]] != "refused") r = 0
                        split(shp[i], x, SUBSEP)
                        if (!r) kept[++nk] = shp[i]
                        else if (index(gone, "d = " x[1]) == 0) gone = gone (gone == "" ? "" : ", ") "d = " x[1]
                    }
                    ns = nk; for (i = 1; i <= ns; i++) shp[i] = kept[i]
                    head = "| build"; rule = "|---"
                    for (i = 1; i <= ns; i++) {
                        split(shp[i], x, SUBSEP)
                        head = head " | d = " x[1] (x[2] ? " causal" : "") ", N = " x[3]; rule = rule "|--:"
                    }
                    print head " |"; print rule "|"
                    for (o = 1; o <= no; o++) {
                        line = "| " (off[o] == "" ? "as it is" : off[o] ~ /^\+/ ? "`--" substr(off[o], 2) "`" : "`OFF=" off[o] "`")
                        for (i = 1; i <= ns; i++) {
                            v = t[off[o], shp[i]]; base = t["", shp[i]]
                            if (v + 0 > 0 && off[o] != "" && base + 0 > 0) cell = sprintf("%.0f (%.3f)", v, v / base)
                            else if (v + 0 > 0) cell = sprintf("%.0f", v)
                            else cell = (v == "" ? "-" : v)
                            line = line " | " cell
                        }
                        print line " |"
                    }
                    printf "\n*TFLOP/s of %s as it is and with one idea built out (`make build/%s OFF=...`; in brackets: over the stage as it is), %s, %s, B = 16384/N, H = 2048/d; the builds of a shape run back to back%s.*\n\n*%s*\n", s, s, s ~ /_backward$/ ? "backward" : "forward", s ~ /_fp8$/ ? "e4m3 Q, K, V" : "bf16", gone == "" ? "" : "; " gone ": refused by the stage", src
                }' "$csv" ;;
        rmse\ *)
            # gpu,stage,d,N,inputs,hadamard,rmse,rms_o,check,status
            awk -F, -v s="${spec#rmse }" -v src="$src" '
                NR == 1 || $2 != s { next }
                {
                    k = $5 SUBSEP $3
                    if (!(k in sk)) { sk[k] = 1; row[++nr] = k }
                    v[k, $6] = $10 == "ok" ? sprintf("%.1e", $7) : $10
                    if ($10 == "ok" && $9 != "PASS") bad = bad (bad == "" ? "" : ", ") $5 " d = " $3 ($6 ? " with --hadamard" : "")
                    n = $4
                }
                END {
                    if (nr == 0) { printf "*No measurements of %s in this file yet (`make bench PART=hopper` on an H100 or H200 adds them).*\n\n*%s*\n", s, src; exit }
                    print "| inputs | d | RMSE | RMSE, `--hadamard` |"
                    print "|---|--:|--:|--:|"
                    for (i = 1; i <= nr; i++) {
                        split(row[i], x, SUBSEP)
                        printf "| %s | %s | %s | %s |\n", x[1], x[2], (row[i], 0) in v ? v[row[i], 0] : "-", (row[i], 1) in v ? v[row[i], 1] : "-"
                    }
                    printf "\n*RMSE of %s'"'"'s O against the float64 attention of the inputs before quantization, e4m3 Q, K, V with one scale per (batch, KV head) and tensor, B = 1, H = 8, N = %s; every run %s.*\n\n*%s*\n", s, n, bad == "" ? "also passed its check against the dequantized inputs" : "but " bad " passed its check against the dequantized inputs", src
                }' "$csv" ;;
        *) echo "hopper_tables: unknown SPEC '$spec' (STAGE vs OTHER, N=n, step N=n, ablation STAGE, rmse STAGE, trace STAGE)" >&2; return 2 ;;
    esac
}

if [ "${1:-}" = --update ]; then
    shift
    status=0
    for f in "$@"; do
        case $f in /*) ;; *) f=$HERE/$f ;; esac
        grep -q '^<!-- hopper: ' "$f" || continue
        tmp=$(mktemp) || exit 2
        {
            skip=0
            while IFS= read -r line || [ -n "$line" ]; do
                case $line in
                    '<!-- hopper:end -->') skip=0; printf '%s\n' "$line" ;;
                    '<!-- hopper: '*' -->')
                        printf '%s\n\n' "$line"
                        spec=${line#<!-- hopper: }; spec=${spec% -->}
                        table "$spec" || status=2
                        echo
                        skip=1 ;;
                    *) [ "$skip" = 1 ] || printf '%s\n' "$line" ;;
                esac
            done < "$f"
        } > "$tmp"
        if cmp -s "$tmp" "$f"; then rm -f "$tmp"; else cat "$tmp" > "$f" && rm -f "$tmp"; fi
    done
    exit $status
fi
[ $# = 1 ] || { echo "usage: sh plots/hopper_tables.sh 'SPEC' | --update FILE..." >&2; exit 2; }
table "$1"
