#!/bin/sh
# plots/plots.sh: draws the figures in plots/*.png from the measured CSVs (`make plots`).
# Runs anywhere with a POSIX sh, awk, sort and gnuplot (gnuplot-nox is enough); the data
# are cut out of the CSVs with awk, and every figure is drawn by plots/figure.gp.
#
#   sh plots/plots.sh            draw every figure, then regenerate the README's and the
#                                lessons' tables (plots/readme_table.sh, plots/docs_tables.sh)
#   sh plots/plots.sh --which    print the four CSV paths it would read (sweep, long, bytes,
#                                masks), one a line
#   sh plots/plots.sh --gpu      print the GPU it reads (the file name's, see GPU below)
#   sh plots/plots.sh --date [CSV]   print the date of a CSV's rows (default: the sweep's;
#                                see ROWS DATE below)
#   sh plots/plots.sh --sources [--md] CSV...   print the line that names where a figure's or
#                                a table's numbers come from (see SOURCES below); --md: the
#                                paths and `make bench` in backticks, for Markdown
#   sh plots/plots.sh --runs CSV   when CSV holds rows of several runs (its .runs file, see
#                                SOURCES): one line per stage, "STAGE RUN DATE WHOLE" (tabs)
#                                naming the run its rows come from; nothing for one run
#
# Which GPU (never picked silently): the CSVs of one GPU are read,
#   plots/results/<GPU>.csv (the sweep), <GPU>-long.csv, <GPU>-bytes.csv and <GPU>-masks.csv
#   (any but the sweep may be missing: its figures are skipped, with a line), where <GPU> is
#   the name plots/bench.sh gives the files (nvidia-smi's name, spaces -> '-': NVIDIA-H200).
#   make plots GPU=NVIDIA-H200   (or GPU=NVIDIA-H200 sh plots/plots.sh) chooses it. Without
#   GPU= the default is the committed GPU: with the CSVs of exactly one GPU under
#   plots/results/, that one; with CSVs of several GPUs there, plots.sh stops with one line
#   that lists them, and draws nothing.
#
# Environment (optional):
#   GPU                the GPU whose CSVs are read (above); ignored when RESULTS_CSV is set
#   RESULTS_CSV        the sweep CSV, any path (instead of plots/results/<GPU>.csv)
#   RESULTS_LONG_CSV   the long-context CSV (default: the sweep CSV's name + -long.csv)
#   RESULTS_BYTES_CSV  the Nsight Compute DRAM bytes (default: the sweep CSV's name + -bytes.csv)
#   RESULTS_MASKS_CSV  the masked runs (default: the sweep CSV's name + -masks.csv)
#   RESULTS_HOPPER_CSV, RESULTS_ABLATION_CSV  the Hopper part's and the ablation's, for the
#                      tables of plots/hopper_tables.sh (default: the sweep CSV's name +
#                      -hopper.csv, -ablation.csv)
#   PLOTS_DIR          where the PNGs go (default: plots)
#   PLOTS_TERM         pngcairo or png (default: pngcairo if this gnuplot has it)
#   PLOTS_NO_TABLES    when set and not empty: draw the figures only, leave README.md and
#                      docs/*.md alone
#
# Figures (only rows with status ok are drawn as lines; each stage has one colour and point
# in every figure; a line equal to one drawn before it in a panel, within 1% at every N, is
# drawn over it dashed, with smaller points, and its key entry says "(= the other stage)"):
#   tflops_{forward,backward}_d{64,128}.png  TFLOP/s vs N, one line per stage, cuBLAS and the
#       two PyTorch anchors (dashed); left non-causal, right causal; dotted: the GEMM ceiling,
#       labelled with its source (see CEILINGS); below, the same on a linear axis for the
#       stages whose rate at their largest N is at least 40% of the panel's highest point
#   speedup.png        each step of the ladder, time of the parent / time of the stage, in the
#       colour of the stage the step introduces (forward and backward, d = 128, non-causal; the
#       parent is the stage the header names, plots/stage_diff.sh --parents, or where it has no
#       rows in that direction its nearest ancestor with some, so the backward of 04_backward
#       is over 01_naive's and 12_block_sparse is over 06_fa2); dashed: the tensor-core stages over
#       cuBLAS (TC_STAGES). A stage without rows in a direction has no step there (07_wgmma
#       is forward only: its step is 06_fa2 -> 07_wgmma forward, and the backward panel ends
#       at 06_fa2). A step whose ratio is within 1% of 1 at every N (04_backward's forward,
#       which is 03_tiled's) is not drawn over the "no change" line: a note in the panel says so.
#   io_same_hardware.png  the IO lesson on equal hardware: cuBLAS (standard attention on the
#       tensor cores, S and P in HBM) against the tensor-core stages (TC_STAGES):
#       05_tensor_cores (FA-1), 06_fa2 (FA-2) and 07_wgmma (FA-2's forward on wgmma; forward
#       panel only), TFLOP/s vs N, d = 128, forward and backward; solid non-causal, dashed
#       causal; dotted: the GEMM ceiling, labelled with its source
#   bytes.png          DRAM bytes of one forward call vs N (d = 128, H = 16, B = 16384/N):
#       Nsight Compute's counts, read + written (points), against each stage's byte model
#       (lines; plots/bytes_model.awk) and Q, K, V, O once (dotted); right: measured / model
#   workspace.png      forward workspace bytes vs N, d = 128: the sweep (16384 tokens, so S
#       grows like N) and the long-context runs (B = 1, so S grows like N^2; x: refused)
#   long_context.png   time vs N up to 1048576 (B = 1, H = 16, d = 128), one colour per stage:
#       solid non-causal, dashed with open points causal, dotted with squares the causal
#       sliding window (--window W, the stages with masks: its work grows as N W); where a
#       stage stopped, on the continuation of its line (N^2, or N for a window): a cross if
#       it was refused or failed (labelled with the reason on the non-causal lines), a circle
#       if the bench skipped it because the call would pass its time cap (the key says
#       "stopped: > 4 s a call", the cap of the row's note). At N = 1048576, in place of a
#       point, 01_naive's mark: the bytes its S and P would need there (its workspace,
#       8 B H N^2 + L, from the B and H of its rows), which no GPU has.
#   masks.png          the masked runs (the masks CSV: B = 2, H = 16, d = 128, N = 8192):
#       time per call against the fraction of (query, key) pairs the mask leaves visible,
#       forward and backward, for the stages with masked rows, the anchor torch_flex and
#       MASKS_REF (06_fa2 and 10_fa3_backward, dense only); a line through each one's
#       non-causal masks (dense, then the random block masks), open points for its causal ones
#       (dense causal, the sliding window), each mask named once; dotted, in each MASKS_REF
#       stage's colour: its dense time x the fraction, what a block-sparse kernel at that dense
#       stage's speed would take. Skipped, with a line, while there is no masks CSV.
# Every heading ends with the SOURCES line of the CSVs the figure reads.
#
# ROWS DATE: the CSVs have no date column. The date of a CSV's rows is the date of the last
# commit that wrote the file (git log -1 --format=%cs -- CSV). Fallback, when the file is not
# committed as it is (outside a git work tree, untracked, or changed since its last commit):
# the file's modification time, "YYYY-MM-DD (file time; not from a git commit)", or "date
# unknown" where `date -r` cannot read it.
#
# SOURCES: a make bench run writes whole files (plots/bench.sh: the sweep and the long CSV;
# plots/bytes.sh: the bytes CSV), committed together, and plots/bench.sh writes next to each
# CSV a file <csv>.runs with one line per run whose rows the CSV holds ("DATE: programs ...;
# anchors ...; dirs ...; sweep d ..., causal ..."): a fresh run writes its line alone, a
# partial re-run merged into the file (MERGE=1) appends its line. A CSV without a .runs file,
# or with one line in it, is taken to be one run: the commit that last wrote it names that
# run, and files last written by the same commit are one run. The line (--sources) reads,
# for files of one run whose .runs line names its commit (what plots/bench.sh writes):
#   "NVIDIA-H200, one make bench run, 2026-12-03 18:39 UTC at commit 47205cf: plots/results/..."
# for other files of one run:
#   "NVIDIA-H200, rows of 2026-11-30, one make bench run: plots/results/NVIDIA-H200.csv"
# and for files of different commits (or not committed) it names each file with its GPU,
# date and commit: "rows of several make bench runs: A (GPU, rows of D, commit C); B (...)".
# A CSV whose .runs file has several lines holds rows of several runs, and the line names
# them, oldest first, each by its date (a "(commit C)" after it dropped) and what it ran:
# the programs ("first ... last" when more than three) and "torch anchors" (or the one):
#   "NVIDIA-H200, rows of 2 make bench runs merged in plots/results/NVIDIA-H200.csv:
#    2026-11-30 (01_naive ... cublas, torch anchors), 2026-11-30 10:52 UTC (06_fa2 07_wgmma,
#    torch anchors)"   (one line)
# Files with the same GPU and the same runs share that line ("merged in A and B"); otherwise
# each file is named with its own, "rows of several make bench runs: A (GPU, 2 runs merged:
# ...); B (GPU, rows of D, commit C)". The rows of a stage are taken to come from the last run
# whose line names it (the ceiling_* rows: the last run with anchors, see CEILINGS), and
# --runs says so only where that run covered the directions, head dims and masks of the
# file's first run (WHOLE = 1): its line then replaced all of the stage's rows. The numbers
# that divide two stages' rows use it: the lessons' "STAGE vs OTHER" captions and the
# README's ratio columns say whether both come from one run or from two, and the GEMM
# ceiling's label and the io tables' copy clause name the run they were timed in instead of
# "same run". The .runs lines do not record N (bench.sh's NS): a merge over fewer N than the
# first run leaves older rows of its stages that no caption can tell apart.
# CEILINGS: rows of the sweep CSV that are not stages (plots/anchors.py --gemm writes them in
# the same bench run; no figure or table takes them for a stage):
#   ceiling_gemm   a bf16 GEMM (N_q = its size, 8192^3) through torch.matmul: its tflops is
#                  the dotted line of the TFLOP/s figures, labelled "bf16 GEMM 8192^3,
#                  torch.matmul, same run" ("run of DATE" instead when the CSV holds rows of
#                  several runs: SOURCES), and the README table's "% of GEMM ceiling"
#   ceiling_copy   a device-to-device copy through torch: GB/s = B / median_ms, with B, the
#                  bytes read + written, in its note ("bytes read + written = B"); no figure
#                  draws it (none has a bandwidth axis); the lessons' io tables quote it when
#                  the row is there (plots/docs_tables.sh), and say nothing of it when it is
#                  not.
set -u
cd "$(dirname "$0")/.." || exit 2
# The GPU whose CSVs are read (see "Which GPU" above): empty is the default, the one GPU
# with CSVs under plots/results/.
GPU=${GPU:-}
PLOTS_DIR=${PLOTS_DIR:-plots}
TAB=$(printf '\t')
# The ladder's tensor-core stages: compared with cuBLAS on the same hardware (speedup.png's
# dashed lines, io_same_hardware.png). 07_wgmma has forward rows only: it adds a forward line.
TC_STAGES="05_tensor_cores 06_fa2 07_wgmma"

# gpus_here: the GPUs that have CSVs under plots/results/, one a line, in name order
gpus_here() {
    for f in plots/results/*.csv; do
        [ -f "$f" ] || continue
        f=${f##*/}; f=${f%.csv}; f=${f%-long}; f=${f%-bytes}; f=${f%-masks}; f=${f%-hopper}; f=${f%-ablation}; f=${f%-fp8-rmse}
        echo "$f"
    done | sort -u
}
MAIN=${RESULTS_CSV:-}
if [ -z "$MAIN" ]; then
    here=$(gpus_here)
    if [ -z "$GPU" ]; then
        case $(printf '%s\n' "$here" | grep -c .) in
            0) echo "plots: no CSVs under plots/results/: run 'make bench' on the GPU machine and commit plots/results/, or set RESULTS_CSV" >&2
               exit 2 ;;
            1) GPU=$here ;;
            *) echo "plots: CSVs of several GPUs under plots/results/ ($(echo $here | sed 's/ /, /g')): choose one, make plots GPU=<one of them>" >&2
               exit 2 ;;
        esac
    fi
    MAIN=plots/results/$GPU.csv
    if [ ! -s "$MAIN" ]; then
        echo "plots: no sweep CSV $MAIN for GPU=$GPU (CSVs under plots/results/ for: $(echo ${here:-none} | sed 's/ /, /g'))" >&2
        exit 2
    fi
    export GPU   # the table scripts ask plots.sh --which again: the same GPU
elif [ ! -s "$MAIN" ]; then
    echo "plots: RESULTS_CSV=$MAIN: no such file, or empty" >&2
    exit 2
fi
LONG=${RESULTS_LONG_CSV:-${MAIN%.csv}-long.csv}
BYTES=${RESULTS_BYTES_CSV:-${MAIN%.csv}-bytes.csv}
MASKS=${RESULTS_MASKS_CSV:-${MAIN%.csv}-masks.csv}
# the dense references of masks.png: stages 12's and 13's parents (their dense rows in the
# masks CSV)
MASKS_REF=${MASKS_REF:-"06_fa2 10_fa3_backward"}
# long_context.png: the N where 01_naive's memory is marked (the bench's longest N)
NAIVE_MARK_N=1048576

# commit_of CSV: the commit that last wrote CSV (10 hex digits), empty when CSV is not
# committed as it is (outside git, untracked, or changed since)
commit_of() {
    git diff --quiet HEAD -- "$1" 2>/dev/null || return 0
    git log -1 --format=%H -- "$1" 2>/dev/null | cut -c1-10
}
# rows_date CSV: the date of CSV's rows (see ROWS DATE)
rows_date() {
    if [ -n "$(commit_of "$1")" ]; then
        git log -1 --format=%cs -- "$1"
        return
    fi
    fd=$(date -r "$1" +%Y-%m-%d 2>/dev/null)
    if [ -n "$fd" ]; then echo "$fd (file time; not from a git commit)"
    else echo "date unknown"; fi
}
# runs_commit CSV: "DATE|COMMIT" of CSV's one run when its .runs file holds one line naming
# a commit ("DATE; GPU; commit C: ..."), else nothing
runs_commit() {
    [ -f "$1.runs" ] || return 0
    awk 'NF > 0 { n++; line = $0 }
         END {
             if (n != 1 || !match(line, /; commit [0-9a-f]+:/)) exit
             c = substr(line, RSTART + 9, RLENGTH - 10)
             d = line; sub(/;.*/, "", d)
             printf "%s|%s\n", d, c
         }' "$1.runs"
}
# gpu_of CSV: the GPU its rows name (the gpu column of the first row)
gpu_of() { awk -F, 'NR == 2 { print $1; exit }' "$1"; }
# runs_of CSV: the runs in CSV.runs (see SOURCES), oldest first, one a line, tab-separated:
# DATE, WHAT (its programs, "first ... last" when more than three, its anchors, and "clock
# settled" for a run timed by the settling protocol: common/runner.c), COVER
# (its directions, head dims and masks) and NAMES (the stages it wrote rows of: the
# programs, torch_<anchor>, and with anchors the ceiling_* rows). Nothing without CSV.runs.
runs_of() {
    [ -f "$1.runs" ] || return 0
    awk 'NF > 0 {
        i = index($0, ": programs")
        date = i ? substr($0, 1, i - 1) : $0
        sub(/ \(commit [0-9a-f]+\)$/, "", date); sub(/; [^;]*; commit [0-9a-f]+$/, "", date)   # the date alone
        np = na = settled = 0; cover = names = what = ""
        nf = split(i ? substr($0, i + 2) : "", f, "; ")
        for (j = 1; j <= nf; j++) {
            if (f[j] ~ /^programs /) np = split(substr(f[j], 10), p, " ")
            else if (f[j] ~ /^anchors /) na = split(substr(f[j], 9), a, " ")
            else if (f[j] ~ /^(dirs|sweep|masks) /) cover = cover (cover == "" ? "" : "; ") f[j]
            else if (f[j] == "clock settled") settled = 1
        }
        if (np == 1 && p[1] == "none") np = 0
        if (na == 1 && a[1] == "none") na = 0
        for (j = 1; j <= np; j++) {
            names = names " " p[j]
            if (np <= 3 || j == 1) what = what (j > 1 ? " " : "") p[j]
            else if (j == np) what = what " ... " p[j]
        }
        for (j = 1; j <= na; j++) names = names " torch_" a[j]
        if (na > 0) names = names " ceiling_gemm ceiling_copy"
        if (na > 0) what = what (np > 0 ? ", " : "") (na == 1 ? "torch_" a[1] : "torch anchors")
        if (settled) what = what (what == "" ? "" : ", ") "clock settled"
        printf "%s\t%s\t%s\t%s\n", date, (what == "" ? "nothing" : what), cover, substr(names, 2)
    }' "$1.runs"
}
# runs_by_stage CSV: for a CSV of several runs, one line per stage named in its .runs file:
# STAGE, RUN (1 = the oldest), DATE of that run, WHOLE (1: that run covered what the first
# did, so all the stage's rows are from it); see SOURCES. Nothing for one run.
runs_by_stage() {
    runs_of "$1" | awk -F '\t' '
        { d[NR] = $1; c[NR] = $3; n = split($4, s, " "); for (j = 1; j <= n; j++) last[s[j]] = NR }
        END { if (NR > 1) for (x in last) printf "%s\t%d\t%s\t%d\n", x, last[x], d[last[x]], c[last[x]] == c[1] }' | sort
}
# sources [--md] CSV...: where the numbers of a figure or table come from (see SOURCES)
sources() {
    q= mb="make bench"
    if [ "${1:-}" = --md ]; then q='`' mb='`make bench`'; shift; fi
    # files of several runs (their .runs files): "K<tab>date (what), date (what)" of each
    several=0
    for f in "$@"; do
        [ -z "$(runs_of "$f" | sed -n 2p)" ] || several=1
    done
    if [ "$several" = 1 ]; then
        same=1 first= files= each=
        for f in "$@"; do
            g=$(gpu_of "$f")
            # the first and the last run's date; the .runs file lists them all
            r=$(runs_of "$f" | awk -F '\t' 'NR == 1 { a = $1 } { b = $1 } END { if (NR > 1) printf "%s to %s\t%d", a, b, NR; else printf "%s", a }')
            k=; case $r in *"$TAB"*) k=${r##*"$TAB"} r=${r%"$TAB"*} ;; esac
            if [ -z "$first" ]; then first="$g|$k|$r"
            elif [ "$first" != "$g|$k|$r" ]; then same=0; fi
            [ -n "$k" ] || same=0
            files="$files${files:+ and }$q$f$q"
            if [ -n "$k" ]; then each="$each${each:+; }$q$f$q ($k runs, $r)"
            else
                c=$(commit_of "$f") d=$(rows_date "$f")
                each="$each${each:+; }$q$f$q ($g, rows of $d${c:+, commit $c})"
            fi
        done
        if [ "$same" = 1 ]; then echo "$g, rows of $k $mb runs merged in $files, $r (each run: $q$f.runs$q)"
        else echo "$g, rows of several $mb runs: $each"; fi
        return
    fi
    # files of one run each whose .runs line names its commit (plots/bench.sh writes "DATE;
    # GPU; commit C: programs ..."): that date and commit, whatever git holds of the file now
    named=1 first= one=1 samec=1 files= each= dated=
    for f in "$@"; do
        rc=$(runs_commit "$f")
        [ -n "$rc" ] || { named=0; break; }
        g=$(gpu_of "$f")
        if [ -z "$first" ]; then first="$g|$rc" firstc="$g|${rc#*|}"
        else
            [ "$first" = "$g|$rc" ] || one=0
            [ "$firstc" = "$g|${rc#*|}" ] || samec=0
        fi
        files="$files${files:+ and }$q$f$q"
        dated="$dated${dated:+, }$q$f$q (${rc%|*})"
        each="$each${each:+; }$q$f$q ($g, one $mb run, ${rc%|*} at commit ${rc#*|})"
    done
    if [ "$named" = 1 ]; then
        if [ "$one" = 1 ]; then echo "$g, one $mb run, ${rc%|*} at commit ${rc#*|}: $files"
        elif [ "$samec" = 1 ]; then echo "$g, commit ${rc#*|}, one $mb run a file: $dated"
        else echo "$each"; fi
        return
    fi
    one=1 first= files= each= n=0
    for f in "$@"; do
        c=$(commit_of "$f") g=$(gpu_of "$f") d=$(rows_date "$f")
        n=$((n + 1))
        if [ -z "$first" ]; then first="$c|$g|$d"
        elif [ "$first" != "$c|$g|$d" ]; then one=0; fi
        [ -n "$c" ] || [ "$n" -eq 1 ] || one=0   # files not committed: their runs are unknown
        files="$files${files:+ and }$q$f$q"
        each="$each${each:+; }$q$f$q ($g, rows of $d${c:+, commit $c})"
    done
    if [ "$one" = 1 ]; then
        all=; [ -z "$q" ] || all="all from "
        echo "$g, rows of $d, ${all}one $mb run: $files"
    else
        echo "rows of several $mb runs: $each"
    fi
}
case ${1:-} in
    --which) printf '%s\n%s\n%s\n%s\n' "$MAIN" "$LONG" "$BYTES" "$MASKS"; exit 0 ;;
    --gpu) if [ -n "$GPU" ]; then echo "$GPU"; else gpu_of "$MAIN"; fi; exit 0 ;;
    --date) rows_date "${2:-$MAIN}"; exit 0 ;;
    --sources) shift; sources "$@"; exit 0 ;;
    --runs) runs_by_stage "${2:?usage: plots.sh --runs CSV}"; exit 0 ;;
esac
if [ ! -s "$LONG" ]; then
    echo "plots: no $LONG: long_context.png skipped, workspace.png without its long-context panel"
    LONG=
fi
if [ ! -s "$BYTES" ]; then
    echo "plots: no $BYTES: bytes.png skipped"
    BYTES=
fi
if [ ! -s "$MASKS" ]; then
    echo "plots: no $MASKS (no masked runs measured yet): masks.png skipped"
    MASKS=
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
GPU_NAME=$(gpu_of "$MAIN")
DATE=$(rows_date "$MAIN")
# the SOURCES line closing each figure's heading: the sweep; the sweep and the long-context
# runs (workspace.png); the long-context runs; the bytes. A heading line of several files is
# broken between them ("\n").
fig_sources() {
    case $1 in
        *"rows of several"*) printf '%s\n' "$1" | sed 's/runs: /runs:\\n/; s/); /);\\n/g' ;;
        *) printf '%s\n' "$1" | sed 's/ (each run: [^)]*)$//' ;;   # the tables' captions name the .runs file
    esac
}
SRC_MAIN=$(fig_sources "$(sources "$MAIN")")
SRC_WS=$(fig_sources "$(sources "$MAIN" ${LONG:+"$LONG"})")
[ -z "$LONG" ] || SRC_LONG=$(fig_sources "$(sources "$LONG")")
[ -z "$BYTES" ] || SRC_BYTES=$(fig_sources "$(sources "$BYTES")")
[ -z "$MASKS" ] || SRC_MASKS=$(fig_sources "$(sources "$MASKS")")
MASKS_AWK=$(cat plots/masks.awk) || exit 2
MODELS=$(cat plots/bytes_model.awk) || exit 2
echo "plots: $MAIN${LONG:+, $LONG}${BYTES:+, $BYTES}${MASKS:+, $MASKS} ($GPU_NAME, rows of $DATE), $term terminal"

# Every stage gets one linetype (colour, dash, point), the same in every figure: numbered
# stages in order, then cuBLAS, then the PyTorch anchors. DAT/lts: "stage linetype point".
ORDER=$(awk -F, 'FNR > 1 && $2 !~ /^ceiling_/ { print $2 }' "$MAIN" ${LONG:+"$LONG"} ${BYTES:+"$BYTES"} ${MASKS:+"$MASKS"} |
    sort -u |
    awk '{ print (/^[0-9]/ ? 0 : $0 == "cublas" ? 1 : $0 == "torch_flash" ? 2 : $0 == "torch_cudnn" ? 3 : $0 == "torch_flex" ? 4 : 5), $0 }' |
    sort -k1,1n -k2,2 | cut -d' ' -f2 | tr '\n' ' ')
awk -v order="$ORDER" -v lts="$DAT/lts" 'BEGIN {
    npal = split("#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #17becf #393b79 #e6ab02 #1b9e77 #7f0000", pal, " ")
    m = split(order, stage, " ")
    k = 0
    for (i = 1; i <= m; i++) {
        if (stage[i] == "cublas")           { st = "lc rgb \"#7f7f7f\" dt 1"; pt = 5 }
        else if (stage[i] == "torch_flash") { st = "lc rgb \"#000000\" dt 2"; pt = 9 }
        else if (stage[i] == "torch_cudnn") { st = "lc rgb \"#bcbd22\" dt 2"; pt = 11 }
        else if (stage[i] == "torch_flex")  { st = "lc rgb \"#7570b3\" dt 2"; pt = 13 }
        else                                { st = "lc rgb \"" pal[k++ % npal + 1] "\" dt 1"; pt = 7 }
        printf "set linetype %d %s pt %d lw 2 ps 0.9\n", i, st, pt
        print stage[i], i, pt > lts
    }
}' > "$DAT/styles.gp"
lt_of() { awk -v s="$1" '$1 == s { print $2 }' "$DAT/lts"; }
pt_of() { awk -v s="$1" '$1 == s { print $3 }' "$DAT/lts"; }

# Cut the CSVs into DAT/<prefix>__<name>.dat files of "N y" lines ("N y \"label\"" for the
# marks where a stage stopped). The awks emit "file N value" (the last row of a shape wins),
# sort orders by file then N, the last awk writes the files; "title", "same" and "ceiling"
# lines go to DAT/titles, DAT/same and DAT/ceiling.
{
    awk -F, -v order="$ORDER" -v tc="$TC_STAGES" -v parents="$(sh plots/stage_diff.sh --parents | tr "\n" " ")" '
        function put(prefix, stage, n, y) { val[prefix "__" stage, n] = y }
        # the step from stage p to stage s in direction dir: time_p / time_s at every N where
        # both ran; kind su (the ladder) or suc (over cuBLAS)
        function step(dir, s, p, kind,   k, a, r, same, any, tmp, n) {
            same = 1; any = 0; split("", tmp)
            for (k in ms) {
                split(k, a, SUBSEP)
                if (a[1] != dir || a[2] != s || !((dir, p, a[3]) in ms) || ms[k] <= 0) continue
                r = ms[dir, p, a[3]] / ms[k]; tmp[a[3]] = r; any = 1
                if (r > 1.01 || r < 1 / 1.01) same = 0
            }
            if (!any) return
            if (kind == "su" && same) { print "same", "su_" dir, s, p; return }
            for (n in tmp) put(kind "_" dir, s, n, tmp[n])
            print "title", kind "_" dir, s, s " / " p
        }
        FNR == 1 { next }
        # the GEMM ceiling (CEILINGS above): "TFLOP/s size dtype"; other ceilings: not here
        $2 == "ceiling_gemm" { if ($15 == "ok" && $13 > 0) ceiling = $13 " " $8 " " $4; next }
        $2 ~ /^ceiling_/ { next }
        $15 != "ok" || $4 != "bf16" { next }   # the figures are bf16 (FP8=1 adds e4m3 rows)
        {
            put("tf_" $3 "_d" $10 "_c" $11, $2, $8, $13)
            if ($3 == "forward" && $10 == 128 && $11 == 0 && $14 > 0) put("ws_sweep", $2, $8, $14)
            if ($10 == 128 && $11 == 0) { ms[$3, $2, $8] = $12; has[$3, $2] = 1 }
        }
        END {
            m = split(order, stage, " ")
            nt = split(tc, tcs, " ")
            np = split(parents, pl, " ")
            for (i = 1; i + 1 <= np; i += 2) if (pl[i + 1] != "-") parent[pl[i]] = pl[i + 1]
            for (di = 1; di <= 2; di++) {
                dir = di == 1 ? "forward" : "backward"
                for (i = 1; i <= m; i++) {
                    s = stage[i]
                    if (s !~ /^[0-9][0-9]_/ || !((dir, s) in has)) continue
                    # the stage over its parent (the stage its header names), or over the
                    # nearest ancestor with rows in this direction (04_backward over 01_naive)
                    p = (s in parent) ? parent[s] : ""
                    while (p != "" && !((dir, p) in has)) p = (p in parent) ? parent[p] : ""
                    if (p != "") step(dir, s, p, "su")
                }
                for (i = 1; i <= nt; i++)
                    if ((dir, tcs[i]) in has && (dir, "cublas") in has) step(dir, tcs[i], "cublas", "suc")
            }
            if (ceiling != "") print "ceiling", ceiling
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$MAIN"
    [ -z "$LONG" ] || awk -F, -v order="$ORDER" -v naive_n="$NAIVE_MARK_N" "$MASKS_AWK"'
        function human(b) {
            # binary units, as the workspace axis
            return b >= 2^40 ? sprintf("%.1f TiB", b / 2^40) : b >= 2^30 ? sprintf("%.1f GiB", b / 2^30) : sprintf("%.0f MiB", b / 2^20)
        }
        FNR == 1 || $2 ~ /^ceiling_/ { next }
        {
            # the series of the row: c0 non-causal, c1 causal, c1w4096 causal with a window
            # of 4096 (rows with a block mask are not drawn here)
            key = mask_key($16)
            if (key ~ /(^|; )(mask|block-mask)=/) next
            w = mask_window(key)
            ser = "c" $11 (w > 0 ? "w" w : "")
            sers[ser] = 1
            k = $3 SUBSEP $2 SUBSEP ser
            if ($2 == "01_naive") { nb = $5; nh = $6 }
        }
        $15 == "ok" {
            val["long_" $3 "_" ser "__" $2, $8] = $12
            if (ser == "c0" && $3 == "forward" && $14 > 0) val["ws_long__" $2, $8] = $14
            if ($8 + 0 > lastn[k]) { lastn[k] = $8 + 0; lastms[k] = $12 }
            next
        }
        !(k in badn) || $8 + 0 < badn[k] { badn[k] = $8 + 0; bad[k] = $15; note[k] = $16; ws[k] = $14 }
        END {
            # A mark where each stage stopped, on the continuation of its line (N^2; N for a
            # window: the work of a row is W keys), none for a stage that never ran in that
            # direction (no backward pass, say): _s (a circle; its label goes to the key)
            # when the bench skipped it for its time cap, _x (a cross, labelled on the
            # non-causal lines only: the others would repeat it) when it was refused or
            # failed. A mark at the place of an earlier stage mark is drawn smaller inside it
            # (_s2, _x2), without a label.
            m = split(order, stage, " ")
            for (ser in sers) for (di = 1; di <= 2; di++) for (i = 1; i <= m; i++) {
                dir = di == 1 ? "forward" : "backward"
                k = dir SUBSEP stage[i] SUBSEP ser
                if (!(k in badn) || !(k in lastn)) continue
                n = badn[k]
                y = lastms[k] * (n / lastn[k]) ^ (ser ~ /w/ ? 1 : 2)
                if (bad[k] == "skipped") {
                    kind = "_s"
                    if (match(note[k], /= *[0-9.]+ *s$/)) {
                        cap = substr(note[k], RSTART + 1); gsub(/^ +| *s$/, "", cap)
                        label = "stopped: > " cap " s a call"
                    } else label = "stopped: time cap"
                } else {
                    kind = "_x"
                    if (bad[k] == "refused" && ws[k] > 0) label = "refused: needs " human(ws[k])
                    else {   # the last clause of the reason ("...; so stage X caps N_k at M")
                        nc = split(note[k], clause, "; ")
                        c = clause[nc]; sub(/^so stage [^ ]+ /, "", c)
                        label = bad[k] ": " c
                    }
                    if (ser != "c0") label = ""
                }
                gsub(/"/, "", label)
                if (length(label) > 48) label = substr(label, 1, 45) "..."
                place = dir SUBSEP n SUBSEP kind SUBSEP int(log(y) * 20 + 0.5)
                if (place in taken) { kind = kind "2"; label = "" }
                taken[place] = 1
                if (kind ~ /^_s/) { print "skipnote", label; label = "" }
                val["long_" dir "_" ser kind "__" stage[i], n] = y " \"" label "\""
                if (ser == "c0" && dir == "forward" && bad[k] == "refused" && ws[k] > 0)
                    val["ws_long_x__" stage[i], n] = ws[k] " \"needs " human(ws[k]) "\""
            }
            # 01_naive at N = naive_n: the workspace it would need there, from its formula
            # (stages/01_naive/attention.cu workspace(): S and P in fp32, 8 B H N^2 bytes, and
            # D, 4 B H N, in the backward; plus L, 4 B H N, as every stage) with the B and H
            # of its rows; "naivemem forward-bytes backward-bytes N"
            if (nb > 0) {
                f = 8 * nb * nh * naive_n * naive_n + 4 * nb * nh * naive_n
                printf "naivemem %.0f %.0f %d\n", f, f + 4 * nb * nh * naive_n, naive_n
            }
            for (ser in sers) print "series", ser
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$LONG"
    # bytes: by_meas (GB measured, read + written), by_model (GB the model gives, at every
    # power of 2 between the stage's smallest and largest N, B = its tokens / N), by_ratio
    # (measured / model), by_once__all (Q, K, V, O once).
    [ -z "$BYTES" ] || awk -F, "$MODELS"'
        FNR == 1 || $3 != "forward" || $9 != 0 || $13 != "ok" { next }
        {
            s = $2; b = $5; h = $6; n = $7 + 0; d = $8
            val["by_meas__" s, n] = ($11 + $12) / 1e9
            mo = bm_total(s, b, h, n, d)
            if (mo > 0) val["by_ratio__" s, n] = ($11 + $12) / mo
            if (!(s in lo) || n < lo[s]) lo[s] = n
            if (!(s in hi) || n > hi[s]) hi[s] = n
            tok[s] = b * n; hh[s] = h; dd[s] = d
        }
        END {
            for (s in lo) {
                if (!bm_has(s)) continue
                for (n = lo[s]; n <= hi[s]; n *= 2) {
                    val["by_model__" s, n] = bm_total(s, tok[s] / n, hh[s], n, dd[s]) / 1e9
                    val["by_once__all", n] = bm_once(tok[s] / n, hh[s], n, dd[s], 0) / 1e9
                }
            }
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$BYTES"
    # masks: for each stage drawn (MASKS_REF, torch_flex, and every stage with a masked row),
    # mk_<dir>_line__<stage> (x the visible fraction, y ms: the non-causal masks, dense and
    # block masks), mk_<dir>_open__<stage> (the causal ones: dense causal, windows),
    # mk_<dir>_ideal__<ref> (each MASKS_REF stage's dense ms x the fraction, at the smallest
    # fraction and at 1), mk_<dir>_up / mk_<dir>_down (each mask's name, over its highest
    # point or under its lowest), and mkticks (the x tics: the fractions to 2 digits, none closer than 1.3x).
    [ -z "$MASKS" ] || awk -F, -v refs="$MASKS_REF" "$MASKS_AWK"'
        BEGIN { nref = split(refs, rl, " "); for (i = 1; i <= nref; i++) isref[rl[i]] = 1 }
        FNR == 1 || $10 == 0 || $15 != "ok" { next }
        {
            key = mask_key($16); f = mask_fraction($8, $11, $16)
            pat = $11 SUBSEP key
            if (key != "") want[$2] = 1
            row[++nr] = $2 SUBSEP $3 SUBSEP pat; x[nr] = f; y[nr] = $12 + 0
            name[pat] = mask_label($11, key); up[pat] = $11 == 0 && mask_window(key) == 0
            if (($2 in isref) && key == "" && $11 == 0) dense[$2, $3] = $12
        }
        END {
            for (s in isref) want[s] = 1
            want["torch_flex"] = 1
            lo = 1
            for (r = 1; r <= nr; r++) {
                split(row[r], a, SUBSEP); s = a[1]; dir = a[2]; pat = a[3] SUBSEP a[4]
                if (!(s in want)) continue
                val["mk_" dir "_" (up[pat] ? "line" : "open") "__" s, x[r]] = y[r]
                k = dir SUBSEP pat
                if (!(k in hi) || y[r] > hi[k]) hi[k] = y[r]
                if (!(k in lw) || y[r] < lw[k]) lw[k] = y[r]
                at[k] = x[r]
                if (x[r] < lo) lo = x[r]
                t = sprintf("%.2g", x[r]) + 0; tick[t] = 1
            }
            for (k in hi) {
                split(k, a, SUBSEP); pat = a[2] SUBSEP a[3]
                if (up[pat]) val["mk_" a[1] "_up", at[k]] = hi[k] " \"" name[pat] "\""
                else val["mk_" a[1] "_down", at[k]] = lw[k] " \"" name[pat] "\""
            }
            for (k in dense) {
                split(k, a, SUBSEP)
                val["mk_" a[2] "_ideal__" a[1], lo] = dense[k] * lo
                val["mk_" a[2] "_ideal__" a[1], 1] = dense[k]
            }
            nt = 0; for (t in tick) tl[++nt] = t + 0
            for (i = 2; i <= nt; i++) for (j = i; j > 1 && tl[j - 1] > tl[j]; j--) { t = tl[j]; tl[j] = tl[j - 1]; tl[j - 1] = t }
            last = 0
            for (i = 1; i <= nt; i++) if (last == 0 || tl[i] >= 1.3 * last) { print "mkticks", tl[i], 0; last = tl[i] }
            for (k in val) { split(k, a, SUBSEP); print a[1], a[2], val[k] }
        }' "$MASKS"
} | LC_ALL=C sort -k1,1 -k2,2n | awk -v dat="$DAT" '
    $1 == "title" { t = $0; sub(/^title /, "", t); print t > (dat "/titles"); next }
    $1 == "naivemem" { print $2, $3, $4 > (dat "/naivemem"); next }
    $1 == "series" { print $2 > (dat "/series"); next }
    $1 == "mkticks" { print $2 > (dat "/mkticks"); next }
    $1 == "same" { print $2, $3, $4 > (dat "/same"); next }
    $1 == "skipnote" { t = $0; sub(/^skipnote /, "", t); if (t != "") print t > (dat "/skipnotes"); next }
    $1 == "ceiling" { print $2, $3, $4 > (dat "/ceiling"); next }
    $1 != cur { if (cur != "") close(path); cur = $1; path = dat "/" cur ".dat" }
    { $1 = ""; sub(/^ /, ""); print > path }'
: >> "$DAT/titles"; : >> "$DAT/same"; : >> "$DAT/skipnotes"
# the GEMM ceiling: TFLOP/s (0: none), its GEMM's size and dtype
ceiling=0 ceil_n= ceil_t=
[ ! -s "$DAT/ceiling" ] || read -r ceiling ceil_n ceil_t < "$DAT/ceiling"

# ---- building a figure: panels of series, a key, then plots/figure.gp draws it ----------
# panel P TITLE YLABEL YFORMAT YFACTOR: starts panel P (0 or 1); figure.gp explains the
# y settings. Everything added to it goes to DAT/p<P>.{items,pre,files,nfiles,vars}.
panel() {
    for x in items pre files nfiles; do : > "$DAT/p$1.$x"; done
    printf 'ptitle%s = "%s"\nylabel%s = "%s"\nyformat%s = "%s"\nyfactor%s = %s\n' \
        "$1" "$2" "$1" "$3" "$1" "$4" "$1" "$5" > "$DAT/p$1.vars"
    NPANELS=$(($1 + 1))
}
# key SORT ELEMENT: a key entry (a gnuplot plot element drawing NaN), ordered by SORT, an
# integer, or SORT.M for a series drawn over M others (see `series`). The key drops repeated
# entries, and an entry SORT.M (M > 0) when one of the same SORT is drawn plainly: a stage
# drawn plainly somewhere in the figure has its plain entry only.
key() { printf '%s\t%s\n' "$1" "$2" >> "$DAT/key.items"; }
# same F G: whether the series F and G have the same N and values within 1% at each
same() {
    awk 'NR == FNR { a[$1] = $2; na++; next }
         !($1 in a) || $2 == 0 || a[$1] / $2 > 1.01 || a[$1] / $2 < 1 / 1.01 { bad = 1; exit }
         { nb++ }
         END { exit (bad || na != nb || na == 0) ? 1 : 0 }' "$1" "$2"
}
# series P FILE LT TITLE SORT [STYLE]: a line of panel P from FILE, drawn only when FILE
# has rows; STYLE defaults to "linespoints lt LT". Equal to a series drawn before it in the
# panel (see `same`): drawn over that one dashed, with smaller points, titled "(= that one)".
series() {
    [ -s "$2" ] || return 0
    st=${6:-"linespoints lt $3"} t=$4 m=0
    while IFS=$TAB read -r g gt; do
        if same "$2" "$g"; then
            m=$((m + 1))
            [ "$m" -gt 1 ] || t="$4 (= $gt)"
        fi
    done < "$DAT/p$1.files"
    # a repeated series takes its own dash pattern in place of the one it was given
    [ "$m" = 0 ] || st=$(printf '%s' "$st" | sed 's/ dt ([0-9,]*)//')
    case $m in
        0) ;;
        1) st="$st dt (14,14) ps 0.6" ;;
        *) st="$st dt (4,16) ps 0.4" ;;
    esac
    printf '%s\t%s\n' "$2" "$4" >> "$DAT/p$1.files"
    echo "$2" >> "$DAT/p$1.nfiles"
    echo "'$2' using 1:2 with $st notitle" >> "$DAT/p$1.items"
    [ -n "${SERIES_NOKEY:-}" ] || key "$5.$m" "NaN with $st title \"$t\""
}
# points P FILE STYLE: points of panel P, no key entry (the caller adds what it needs)
points() {
    [ -s "$2" ] || return 1
    echo "$2" >> "$DAT/p$1.nfiles"
    echo "'$2' using 1:2 with $3 notitle" >> "$DAT/p$1.items"
}
# marks P FILE LT PT PS LABELS: the places where a stage stopped (N y "label"), as points of
# type PT and size PS, with their labels when LABELS is 1
marks() {
    [ -s "$2" ] || return 1
    echo "$2" >> "$DAT/p$1.nfiles"
    echo "'$2' using 1:2 with points lt $3 pt $4 ps $5 lw 2 notitle" >> "$DAT/p$1.items"
    [ "$6" = 0 ] || echo "'$2' using 1:2:3 with labels right offset -1.2, 0.9 tc lt $3 notitle" >> "$DAT/p$1.items"
}
# hline P VALUE TITLE [LABEL]: a dotted horizontal reference line (nothing when VALUE is 0),
# with LABEL written just above it at the left of the panel
hline() {
    awk -v v="$2" 'BEGIN { exit !(v > 0) }' || return 0
    echo "$2 with lines dt 3 lw 1.5 lc rgb '#666666' notitle" >> "$DAT/p$1.items"
    key 990 "NaN with lines dt 3 lw 1.5 lc rgb '#666666' title \"$3\""
    [ -z "${4:-}" ] ||
        echo "set label 4 \"$4\" at graph 0.02, first $2 offset 0, 0.6 left font ',9' tc rgb '#444444'" >> "$DAT/p$1.pre"
}
# note P TEXT: a line of text at the bottom left of panel P
note() { echo "set label 3 \"$2\" at graph 0.02, graph 0.03 left font ',9' tc rgb '#444444'" >> "$DAT/p$1.pre"; }
begin() { NPANELS=0; : > "$DAT/key.items"; rm -f "$DAT"/p[0-9].*; }

# draw OUT HEADING: writes DAT/vars.gp, DAT/p<P>.gp (each panel's plot) and DAT/key.gp, and
# runs plots/figure.gp on them.
status=0
draw() {
    filled=0 p=0
    {
        printf 'out = "%s"\nheading = "%s"\npanels = %d\nxkind = "%s"\n' "$1" "$2" "$NPANELS" "${XKIND:-N}"
        while [ "$p" -lt "$NPANELS" ]; do
            cat "$DAT/p$p.vars"
            # the x tics: every x of the panel's series, or the list a figure gave (p<P>.nlist)
            [ -s "$DAT/p$p.nlist" ] && printf 'nlist%s = "%s"\n' "$p" "$(tr '\n' ' ' < "$DAT/p$p.nlist")" ||
            printf 'nlist%s = "%s"\n' "$p" "$(sort -u "$DAT/p$p.nfiles" | while read -r f; do cat "$f"; done |
                awk '{ print $1 }' | sort -nu | tr '\n' ' ')"
            p=$((p + 1))
        done
    } > "$DAT/vars.gp"
    p=0
    while [ "$p" -lt "$NPANELS" ]; do
        {
            cat "$DAT/p$p.pre"
            if [ -s "$DAT/p$p.items" ]; then
                filled=1
                awk 'BEGIN { printf "plot " } NR > 1 { printf ", \\\n     " } { printf "%s", $0 } END { print "" }' "$DAT/p$p.items"
            else
                echo "set label 2 'no rows for this panel' at graph 0.5, graph 0.5 center"
                echo "set yrange [1 : 10]"
                echo "plot NaN notitle"
            fi
        } > "$DAT/p$p.gp"
        p=$((p + 1))
    done
    sort -s -t "$TAB" -k1,1n "$DAT/key.items" |
        awk -F "$TAB" '{ k = int($1); m = $1 - k } seen[$2]++ || (m > 0 && k in kept) { next } { kept[k] = 1; print $2 }' |
        awk 'BEGIN { printf "plot " } NR > 1 { printf ", \\\n     " } { printf "%s", $0 } END { if (NR == 0) printf "NaN notitle"; print "" }' \
        > "$DAT/key.gp"
    # the longest title of the key, for its width (figure.gp widens the key to fit it)
    grep -o 'title "[^"]*"' "$DAT/key.gp" |
        awk '{ n = length($0) - 8; if (n > m) m = n } END { printf "keychars = %d\n", m }' >> "$DAT/vars.gp"
    if [ "$filled" = 0 ]; then
        echo "plots: no rows for $1; not drawn"
    elif gnuplot -e "term='$term'; dat='$DAT'" plots/figure.gp; then
        echo "plots: wrote $1"
    else
        echo "plots: gnuplot failed on $1" >&2
        status=1
    fi
}

# stage_lines P PREFIX [FLOOR]: one series per stage that has DAT/PREFIX__<stage>.dat, in
# ORDER, titled with the stage name; with FLOOR, only the stages whose point at their largest
# N is at least FLOOR times the highest point of all of them (the zoom on the fastest)
stage_lines() {
    [ -z "${3:-}" ] || floor=$(for s in $ORDER; do [ ! -s "$DAT/${2}__$s.dat" ] || cat "$DAT/${2}__$s.dat"; done |
        awk -v b="$3" '$2 > m { m = $2 } END { print m * b }')
    for s in $ORDER; do
        f=$DAT/${2}__$s.dat
        # with FLOOR: the stage's point at its largest N, against the floor
        [ -z "${3:-}" ] || [ ! -s "$f" ] ||
            awk -v t="$floor" '$1 + 0 >= n { n = $1 + 0; y = $2 } END { exit y < t }' "$f" || continue
        i=$(lt_of "$s")
        series "$1" "$f" "$i" "$s" "$((i * 10))"
    done
}

shape="bf16, 16384 tokens (B = 16384/N), hidden 2048 (H = 2048/d)"
# The GEMM ceiling's key entry and its label on the line: its source (CEILINGS above)
cube=³; [ "$term" = pngcairo ] || cube=^3   # libgd's png terminal: no UTF-8
ceiling_title="GEMM ceiling ($(printf '%.0f' "$ceiling") TFLOP/s)"
# "same run" for a CSV of one run; else the run the ceiling_gemm row is from (SOURCES)
ceil_run=$(runs_by_stage "$MAIN" | awk -F "$TAB" '$1 == "ceiling_gemm" { r = "run of " $3 } END { print (NR ? r : "same run") }')
ceiling_label="$ceil_t GEMM $ceil_n$cube, torch.matmul${ceil_run:+, $ceil_run}"
for dir in forward backward; do
    for d in 64 128; do
        begin
        panel 0 "non-causal" "TFLOP/s" "%g" 0
        stage_lines 0 "tf_${dir}_d${d}_c0"
        hline 0 "$ceiling" "$ceiling_title" "$ceiling_label"
        panel 1 "causal (TFLOP/s of the visible half)" "TFLOP/s" "%g" 0
        stage_lines 1 "tf_${dir}_d${d}_c1"
        hline 1 "$ceiling" "$ceiling_title" "$ceiling_label"
        # below, the same on a linear axis: the stages that end above 40% of the fastest
        panel 2 "non-causal, the fastest (linear axis)" "TFLOP/s" "%g" -1
        stage_lines 2 "tf_${dir}_d${d}_c0" 0.4
        hline 2 "$ceiling" "$ceiling_title" "$ceiling_label"
        panel 3 "causal, the fastest (linear axis)" "TFLOP/s" "%g" -1
        stage_lines 3 "tf_${dir}_d${d}_c1" 0.4
        hline 3 "$ceiling" "$ceiling_title" "$ceiling_label"
        draw "$PLOTS_DIR/tflops_${dir}_d$d.png" "$dir, head dim $d: $shape\n$SRC_MAIN"
    done
done

# speedup.png: the ladder's steps (solid) and the tensor-core stages over cuBLAS (dashed)
begin
p=0
for dir in forward backward; do
    panel "$p" "$dir" "speedup (x): parent's time / stage's time" "%g" 2
    for s in $ORDER; do
        i=$(lt_of "$s")
        t=$(awk -v p="su_$dir" -v s="$s" '$1 == p && $2 == s { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' "$DAT/titles")
        [ -z "$t" ] || series "$p" "$DAT/su_${dir}__$s.dat" "$i" "$t" "$((i * 10))"
    done
    for s in $ORDER; do
        i=$(lt_of "$s")
        t=$(awk -v p="suc_$dir" -v s="$s" '$1 == p && $2 == s { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' "$DAT/titles")
        [ -z "$t" ] || series "$p" "$DAT/suc_${dir}__$s.dat" "$i" "$t" "$((500 + i))" "linespoints lt $i dt (20,12) pt $(($(pt_of "$s") - 1))"
    done
    hline "$p" 1 "no change"
    same_note=$(awk -v p="su_$dir" '$1 == p { printf "%s%s / %s", (n++ ? "; " : ""), $2, $3 }' "$DAT/same")
    [ -z "$same_note" ] || note "$p" "not drawn, within 1% of 1 at every N: $same_note"
    p=$((p + 1))
done
draw "$PLOTS_DIR/speedup.png" "each stage over its parent (dashed: over cuBLAS), head dim 128, non-causal, $shape\n$SRC_MAIN"

# io_same_hardware.png: standard attention on the tensor cores against FA-1 and FA-2
begin
p=0
for dir in forward backward; do
    panel "$p" "$dir" "TFLOP/s" "%g" 0
    k=0
    for s in cublas $TC_STAGES; do
        i=$(lt_of "$s") k=$((k + 10))
        [ -n "$i" ] || continue
        series "$p" "$DAT/tf_${dir}_d128_c0__$s.dat" "$i" "$s" "$k"
        series "$p" "$DAT/tf_${dir}_d128_c1__$s.dat" "$i" "$s causal" "$((k + 1))" \
            "linespoints lt $i dt (20,12) pt $(($(pt_of "$s") - 1))"
    done
    hline "$p" "$ceiling" "$ceiling_title" "$ceiling_label"
    p=$((p + 1))
done
draw "$PLOTS_DIR/io_same_hardware.png" "the IO lesson on equal hardware: standard attention (cuBLAS, S and P in HBM) vs FA-1 (05), FA-2 (06), FA-2 on wgmma (07); d = 128, bf16, B = 16384/N, H = 16; causal dashed\n$SRC_MAIN"

# bytes.png: measured DRAM bytes against the models
if [ -n "$BYTES" ]; then
    begin
    bshape=$(awk -F, 'NR == 2 { printf "head dim %s, H = %s, B = %s/N, non-causal, %s", $8, $6, $5 * $7, $4; exit }' "$BYTES")
    panel 0 "read + written: measured (points), modelled (lines)" "GB (10^9 bytes) per forward call" "%g" 0
    panel 1 "measured / modelled" "measured / model" "%g" 0
    for s in $ORDER; do
        i=$(lt_of "$s")
        [ -s "$DAT/by_meas__$s.dat" ] || continue
        points 0 "$DAT/by_meas__$s.dat" "points lt $i ps 1.8"
        [ ! -s "$DAT/by_model__$s.dat" ] || points 0 "$DAT/by_model__$s.dat" "lines lt $i"
        key "$((i * 10))" "NaN with linespoints lt $i title \"$s\""
        SERIES_NOKEY=1 series 1 "$DAT/by_ratio__$s.dat" "$i" "$s" "$((i * 10))"
    done
    if [ -s "$DAT/key.items" ]; then
        key 900 "NaN with points lc rgb '#000000' pt 7 ps 1.8 title \"measured: Nsight Compute\""
        key 901 "NaN with lines lc rgb '#000000' lw 2 title \"model: plots/bytes_model.awk\""
    fi
    if points 0 "$DAT/by_once__all.dat" "lines dt 3 lw 2 lc rgb '#666666'"; then
        key 902 "NaN with lines dt 3 lw 2 lc rgb '#666666' title \"Q, K, V, O once\""
    fi
    hline 1 1 "measured = model"
    draw "$PLOTS_DIR/bytes.png" "HBM (DRAM) bytes of one forward call: Nsight Compute's counts vs the byte models; $bshape\n$SRC_BYTES"
fi

begin
panel 0 "16384 tokens, H = 16: S (B*H*N*N) grows like N" "bytes beyond Q, K, V, O" "%.0b %BB" 32
stage_lines 0 ws_sweep
if [ -n "$LONG" ]; then
    panel 1 "B = 1, H = 16: S grows like N^2 (x: refused)" "bytes beyond Q, K, V, O" "%.0b %BB" 32
    stage_lines 1 ws_long
    for s in $ORDER; do marks 1 "$DAT/ws_long_x__$s.dat" "$(lt_of "$s")" 2 2.5 1 || :; done
fi
draw "$PLOTS_DIR/workspace.png" "forward workspace (L + scratch) at head dim 128, bf16\n$SRC_WS"

if [ -n "$LONG" ]; then
    begin
    # the series of the long CSV: non-causal (c0), causal (c1), then each window (c1w4096)
    sers=$(sort -u "$DAT/series" | awk '{ print ($0 == "c0" ? 0 : $0 == "c1" ? 1 : 2), $0 }' | sort -k1,1n -k2,2 | cut -d' ' -f2)
    # 01_naive at N = NAIVE_MARK_N: "forward-bytes backward-bytes N" (its workspace formula)
    naive_lt=$(lt_of 01_naive)
    naive=; [ -z "$naive_lt" ] || [ ! -s "$DAT/naivemem" ] || naive=$(cat "$DAT/naivemem")
    p=0
    for dir in forward backward; do
        panel "$p" "$dir" "time per call (ms)" "%g" 0
        for ser in $sers; do
            w=${ser#c?}; w=${w#w}
            for s in $ORDER; do
                i=$(lt_of "$s") pt=$(pt_of "$s")
                # the key names each stage once (its colour) and each kind of line once
                case $ser in
                    c0) series "$p" "$DAT/long_${dir}_c0__$s.dat" "$i" "$s" "$((i * 10))" ;;
                    c1) SERIES_NOKEY=1 series "$p" "$DAT/long_${dir}_c1__$s.dat" "$i" "$s causal" 0 \
                            "linespoints lt $i dt (20,12) pt $((pt - 1))" ;;
                    *) SERIES_NOKEY=1 series "$p" "$DAT/long_${dir}_${ser}__$s.dat" "$i" "$s window $w" 0 \
                            "linespoints lt $i dt (3,5) pt 4 ps 1.2" ;;
                esac
                [ ! -s "$DAT/long_${dir}_${ser}__$s.dat" ] || echo "$s" >> "$DAT/long_drawn"
                # where it stopped: labelled crosses on the non-causal lines only
                big=2.5 small=1.5 lab=1
                [ "$ser" = c0 ] || big=1.8 small=1.2 lab=0
                marks "$p" "$DAT/long_${dir}_${ser}_x__$s.dat" "$i" 2 "$big" "$lab" && echo x >> "$DAT/has_x"
                marks "$p" "$DAT/long_${dir}_${ser}_x2__$s.dat" "$i" 2 "$small" 0 && echo x >> "$DAT/has_x"
                marks "$p" "$DAT/long_${dir}_${ser}_s__$s.dat" "$i" 6 "$big" 0
                marks "$p" "$DAT/long_${dir}_${ser}_s2__$s.dat" "$i" 6 "$small" 0
            done
        done
        if [ -n "$naive" ]; then
            # no point: the bytes its workspace would take, a mark and a label at the bottom
            set -- $naive
            [ "$dir" = forward ] && b=$1 || b=$2
            nm=$(awk -v b="$b" -v n="$3" 'BEGIN {
                u = b >= 2^40 ? sprintf("%.0f TiB", b / 2^40) : sprintf("%.0f GiB", b / 2^30)
                printf "01_naive at N = %s: S and P alone would need %s", (n >= 2^20 ? n / 2^20 "M" : n), u }')
            echo "set label 5 \"$nm\" at first $3, graph 0.06 right offset -2.4, 0 font ',9' tc lt $naive_lt point lt $naive_lt pt 3 ps 2.5 lw 2" >> "$DAT/p$p.pre"
            echo "$3 1" > "$DAT/naive_x.dat"
            echo "$DAT/naive_x.dat" >> "$DAT/p$p.nfiles"      # the N axis reaches it
        fi
        p=$((p + 1))
    done
    # a stage drawn with no non-causal line still gets its key entry (its colour)
    for s in $(sort -u "$DAT/long_drawn" 2>/dev/null); do
        [ -s "$DAT/long_forward_c0__$s.dat" ] || [ -s "$DAT/long_backward_c0__$s.dat" ] ||
            key "$(($(lt_of "$s") * 10))" "NaN with linespoints lt $(lt_of "$s") title \"$s\""
    done
    for ser in $sers; do
        w=${ser#c?}; w=${w#w}
        case $ser in
            c0) ;;
            c1) key 970 "NaN with linespoints lc rgb '#000000' dt (20,12) pt 6 title \"causal (dashed, open points)\"" ;;
            c1*) key 971 "NaN with linespoints lc rgb '#000000' dt (3,5) pt 4 ps 1.2 title \"causal, window $w (dotted)\"" ;;
            *) key 971 "NaN with linespoints lc rgb '#000000' dt (3,5) pt 4 ps 1.2 title \"window $w (dotted)\"" ;;
        esac
    done
    [ ! -s "$DAT/has_x" ] || key 980 "NaN with points lc rgb '#000000' pt 2 ps 2 lw 2 title \"refused or failed (labelled)\""
    sort -u "$DAT/skipnotes" | while read -r t; do
        key 981 "NaN with points lc rgb '#000000' pt 6 ps 2 lw 2 title \"$t\""
    done
    # the heading says which series there are (non-causal alone: as it read before them)
    case " $(echo $sers) " in
        " c0 ") head="long context: B = 1, H = 16, head dim 128, non-causal, bf16" ;;
        *) how="solid non-causal"
           case " $(echo $sers) " in *" c1 "*) how="$how, dashed causal" ;; esac
           case " $(echo $sers) " in *" c"[01]w*) how="$how, dotted a sliding window" ;; esac
           head="long context, B = 1, H = 16, d = 128, bf16: $how" ;;
    esac
    draw "$PLOTS_DIR/long_context.png" "$head; on a line's continuation: x refused, o over the time cap\n$SRC_LONG"
fi
# masks.png: time per call against the visible fraction of the pairs (see the top)
if [ -n "$MASKS" ]; then
    begin
    p=0
    for dir in forward backward; do
        panel "$p" "$dir" "time per call (ms)" "%g" 0
        for s in $ORDER; do
            i=$(lt_of "$s") pt=$(pt_of "$s")
            series "$p" "$DAT/mk_${dir}_line__$s.dat" "$i" "$s" "$((i * 10))"
            if points "$p" "$DAT/mk_${dir}_open__$s.dat" "points lt $i pt $((pt - 1)) ps 1.6 lw 2"; then
                [ -s "$DAT/mk_${dir}_line__$s.dat" ] || key "$((i * 10))" "NaN with linespoints lt $i title \"$s\""
                key 970 "NaN with points lc rgb '#000000' pt 6 ps 1.6 lw 2 title \"causal masks (open points)\""
            fi
        done
        for s in $MASKS_REF; do
            i=$(lt_of "$s")
            if points "$p" "$DAT/mk_${dir}_ideal__$s.dat" "lines dt 3 lw 1.5 lt $i"; then
                key "$((990 + i))" "NaN with lines dt 3 lw 1.5 lt $i title \"$s dense time x the fraction\""
            fi
        done
        for ud in up down; do
            f=$DAT/mk_${dir}_$ud.dat
            [ -s "$f" ] || continue
            # the non-causal masks' names to the left of their points, the causal ones' to the
            # right of theirs, so that two masks of about one fraction do not collide
            [ "$ud" = up ] && pos="right offset -1.2, 0.4" || pos="left offset 1.2, -0.4"
            echo "'$f' using 1:2:3 with labels $pos font ',9' tc rgb '#444444' notitle" >> "$DAT/p$p.items"
        done
        [ ! -s "$DAT/mkticks" ] || cp "$DAT/mkticks" "$DAT/p$p.nlist"
        p=$((p + 1))
    done
    mshape=$(awk -F, 'NR > 1 && $10 > 0 { printf "B = %s, H = %s, head dim %s, N = %s, %s", $5, $6, $10, $8, $4; exit }' "$MASKS")
    XKIND=fraction draw "$PLOTS_DIR/masks.png" "block-sparse masks, $mshape: time per call vs the visible fraction of (query, key) pairs\n$SRC_MASKS"
fi
# the pipeline timelines (stage 8's forward, stage 10's backward), one figure per stage, from the
# traces of this GPU, <gpu>-<stage>-<build>.csv (plots/timeline.sh; no trace: no figure)
gpu=$(basename "$MAIN" .csv)
for st in $(ls plots/results/trace/"$gpu"-*.csv 2>/dev/null | sed 's/^.*-\([0-9][0-9]_[a-z0-9_]*\)-[a-z_]*\.csv$/\1/' | sort -u); do
    traces=$(ls plots/results/trace/"$gpu-$st"-*.csv)
    fig="$PLOTS_DIR/timeline_$(echo "$st" | cut -c1-2).png"
    # shellcheck disable=SC2086
    if sh plots/timeline.sh "$fig" "$term" $traces; then echo "plots: wrote $fig"
    else echo "plots: gnuplot failed on the timeline of $st" >&2; status=1; fi
done
[ -n "${PLOTS_NO_TABLES:-}" ] || sh plots/readme_table.sh --update README.md || status=1
[ -n "${PLOTS_NO_TABLES:-}" ] || sh plots/stage_diff.sh --update README.md || status=1
[ -n "${PLOTS_NO_TABLES:-}" ] || sh plots/docs_tables.sh --update docs/*.md || status=1
[ -n "${PLOTS_NO_TABLES:-}" ] || GPU=$(basename "$MAIN" .csv) RESULTS_HOPPER_CSV=${RESULTS_HOPPER_CSV:-${MAIN%.csv}-hopper.csv} \
    RESULTS_ABLATION_CSV=${RESULTS_ABLATION_CSV:-${MAIN%.csv}-ablation.csv} sh plots/hopper_tables.sh --update README.md docs/*.md || status=1
exit $status
