#!/bin/sh
# plots/hopper_tables.sh: the tables of the Hopper stages' forward (README.md, docs/08_fa3.md,
# docs/09_fa3_persistent.md), generated from two CSVs of one run each:
#   plots/results/<gpu>-hopper.csv    make bench PART=hopper (plots/bench.sh with the Hopper
#                                     stages and the anchors, d = 64, 128, 256, N = 2048 .. 16384)
#   plots/results/<gpu>-ablation.csv  make ablation (plots/ablation.sh)
#
#   sh plots/hopper_tables.sh 'SPEC'             print the table for SPEC
#   sh plots/hopper_tables.sh --update FILE...   regenerate every block of each FILE between a
#                                                line `<!-- hopper: SPEC -->` and `<!-- hopper:end -->`
# SPEC is one of
#   STAGE vs OTHER     TFLOP/s of STAGE per N (rows) and head dim, causal or not (columns), each
#                      cell followed by STAGE / OTHER on that shape: "620 (1.19×)"
#   N=n                TFLOP/s of every stage and anchor of the CSV at N = n (rows), columns as above
#   ablation STAGE     TFLOP/s of STAGE as it is and of each build with one idea out (rows), per
#                      shape of the ablation (columns), each build's cell followed by its ratio
#                      to the stage as it is
# Each table is followed by one caption line: the GPU, the run's date and commit (the CSV's
# .runs line) and the file. Environment: GPU (the <gpu> tag; default: the one with a hopper CSV).
set -u
HERE=$(pwd)
cd "$(dirname "$0")/.." || exit 2
R=plots/results
if [ -z "${GPU:-}" ]; then
    GPU=$(ls $R/*-hopper.csv 2>/dev/null | head -n 1 | sed 's|.*/||; s|-hopper.csv$||')
fi
HOPPER=$R/$GPU-hopper.csv
ABLATION=$R/$GPU-ablation.csv

# run_of CSV: "date, GPU, commit" of the CSV's one run (its .runs line up to the first ':'
# after the time), or nothing
run_of() {
    [ -f "$1.runs" ] || return 0
    awk 'NR == 1 { i = index($0, ": "); s = i ? substr($0, 1, i - 1) : $0; gsub(/;/, ",", s); print s }' "$1.runs"
}

table() {
    spec=$1
    case $spec in
        ablation\ *) csv=$ABLATION ;;
        *) csv=$HOPPER ;;
    esac
    if [ ! -s "$csv" ]; then echo "*No measurements yet: \`$csv\` does not exist (\`make bench\` or \`make ablation\` on an H100 or H200).*"; return 0; fi
    run=$(run_of "$csv")
    case $spec in
        *" vs "*)
            awk -F, -v a="${spec%% vs *}" -v b="${spec#* vs }" -v run="$run" -v csv="$csv" '
                NR == 1 || $15 != "ok" || $3 != "forward" { next }
                { k = $8 SUBSEP $10 SUBSEP $11; t[$2, k] = $13; ns[$8] = 1 }
                END {
                    printf "| N | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |\n|--:|--:|--:|--:|--:|--:|--:|\n"
                    n = 0; for (x in ns) if (x + 0 >= 512) list[++n] = x + 0
                    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (list[j] < list[i]) { z = list[i]; list[i] = list[j]; list[j] = z }
                    for (i = 1; i <= n; i++) {
                        line = "| " list[i]
                        for (d = 64; d <= 256; d *= 2) for (c = 0; c <= 1; c++) {
                            k = list[i] SUBSEP d SUBSEP c
                            if (!((a, k) in t)) { line = line " | -"; continue }
                            cell = sprintf("%.0f", t[a, k])
                            if ((b, k) in t && t[b, k] > 0) cell = cell sprintf(" (%.2f×)", t[a, k] / t[b, k])
                            line = line " | " cell
                        }
                        print line " |"
                    }
                    printf "\n*TFLOP/s of %s (in brackets: over %s on the same shape), forward, bf16, B = 16384/N, H = 2048/d, causal counting the visible half; one run: %s (`%s`).*\n", a, b, run, csv
                }' "$csv" ;;
        N=*)
            awk -F, -v n="${spec#N=}" -v run="$run" -v csv="$csv" '
                NR == 1 || $15 != "ok" || $3 != "forward" || $8 != n || $10 == 0 { next }
                { if (!($2 in seen)) { seen[$2] = 1; order[++m] = $2 }; t[$2, $10, $11] = $13 }
                END {
                    printf "| stage | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |\n|---|--:|--:|--:|--:|--:|--:|\n"
                    for (i = 1; i <= m; i++) {
                        line = "| `" order[i] "`"
                        for (d = 64; d <= 256; d *= 2) for (c = 0; c <= 1; c++)
                            line = line " | " (((order[i], d, c) in t) ? sprintf("%.0f", t[order[i], d, c]) : "-")
                        print line " |"
                    }
                    printf "\n*TFLOP/s at N = %s, forward, bf16, B = 16384/N, H = 2048/d, causal counting the visible half; one run: %s (`%s`).*\n", n, run, csv
                }' "$csv" ;;
        ablation\ *)
            awk -F, -v s="${spec#ablation }" -v run="$run" -v csv="$csv" '
                NR == 1 || $2 != s { next }
                {
                    k = $4 SUBSEP $5 SUBSEP $6
                    if (!(k in sk)) { sk[k] = 1; shp[++ns] = k }
                    if (!($3 in so)) { so[$3] = 1; off[++no] = $3 }
                    t[$3, k] = $9 == "ok" ? $8 : $9
                }
                END {
                    head = "| build"; rule = "|---"
                    for (i = 1; i <= ns; i++) {
                        split(shp[i], x, SUBSEP)
                        head = head " | d = " x[1] (x[2] ? " causal" : "") ", N = " x[3]; rule = rule "|--:"
                    }
                    print head " |"; print rule "|"
                    for (o = 1; o <= no; o++) {
                        line = "| " (off[o] == "" ? "as it is" : "`OFF=" off[o] "`")
                        for (i = 1; i <= ns; i++) {
                            v = t[off[o], shp[i]]; base = t["", shp[i]]
                            if (v + 0 > 0 && off[o] != "" && base + 0 > 0) cell = sprintf("%.0f (%.3f)", v, v / base)
                            else if (v + 0 > 0) cell = sprintf("%.0f", v)
                            else cell = (v == "" ? "-" : v)
                            line = line " | " cell
                        }
                        print line " |"
                    }
                    printf "\n*TFLOP/s of %s as it is and with one idea built out (`make build/%s OFF=...`; in brackets: over the stage as it is), forward, bf16, B = 16384/N, H = 2048/d; the builds of a shape run back to back; one run: %s (`%s`).*\n", s, s, run, csv
                }' "$csv" ;;
        *) echo "hopper_tables: unknown SPEC '$spec' (STAGE vs OTHER, N=n, ablation STAGE)" >&2; return 2 ;;
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
