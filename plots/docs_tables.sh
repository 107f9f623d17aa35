#!/bin/sh
# plots/docs_tables.sh: the tables of numbers in the lessons (docs/*.md), generated from the
# measured CSVs, so that no number in a lesson is typed by hand.
#
#   sh plots/docs_tables.sh 'SPEC'               print the table for one marker SPEC
#   sh plots/docs_tables.sh --update FILE...     regenerate every marked block of each FILE
#
# A marked block is a line `<!-- numbers: SPEC -->` and everything up to the next line
# `<!-- numbers:end -->`; --update keeps both marker lines and replaces what lies between
# with the table. Files without markers are not touched. SPEC is one of
#   STAGE              TFLOP/s of STAGE vs N (the sweep's N: 512 .. 16384), one column per
#                      direction (forward, then backward if STAGE has ok rows in it), head dim
#                      (64, 128) and masking (non-causal, causal)
#   STAGE vs OTHER     the same, each cell followed by STAGE / OTHER on that shape, "30.1 (17.7×)";
#                      OTHER is any stage of the CSV (02_fused, cublas, torch_flash, ...)
#   STAGE ms           the same table in milliseconds per call (median)
#   STAGE workspace    workspace bytes (L + the stage's scratch) forward and backward vs N, d = 128
#   STAGE long         the long-context runs (B = 1, H = 16, d = 128), non-causal: status, ms,
#                      TFLOP/s, workspace per N
#   STAGE long causal  the same of its causal runs
#   STAGE long window  the same of its sliding-window runs (--window W, causal: a table per W;
#                      TFLOP/s of the visible pairs); without such rows, one line says there
#                      are no measurements yet (as for "long causal")
#   STAGE masks        the masked runs (the masks CSV: B = 2, H = 16, d = 128, N = 8192), one
#                      row per mask (dense, dense causal, the block masks from the densest down,
#                      the windows) and direction: the fraction of (query, key) pairs visible,
#                      ms, TFLOP/s of the visible pairs, the ratio to MASKS_REF's (06_fa2) dense
#                      non-causal TFLOP/s in the same direction, and to torch_flex's on the same
#                      mask (FlexAttention on the identical block mask); without a masks CSV,
#                      one line says there are no measurements yet
#   STAGE masks vs REF the same with the ratio to REF's dense rate (REF: one of the bench's
#                      MASKS_REF stages, e.g. 10_fa3_backward)
#   STAGE io           forward, d = 128, non-causal, the sweep's N: measured ms next to the
#                      modelled bytes (Q, K, V, O, L once; the stage's traffic beyond that; the
#                      total) and modelled bytes / measured time; "-" for a stage without a model
#   STAGE tile cost vs OTHER  what a tile costs beyond its keys, from the sweep at d = 128,
#                      non-causal: per N below 8192, each program's TFLOP/s over its own at
#                      N = 8192, forward and backward, and in brackets c, the fixed cost of a
#                      tile in keys or query rows if a tile takes time in proportion to N + c
#   STAGE bytes        one forward call's DRAM bytes as Nsight Compute counted them (the bytes
#                      CSV: d = 128, non-causal, B = 16384/N, H = 16): N, B, measured read,
#                      measured written, modelled read + written, measured / modelled
#   bytes              every stage of the bytes CSV side by side: measured read + written per
#                      N, and in brackets measured / modelled
# and tables of the logs the lessons quote (the files are set below the header; each caption
# names its files):
#   ab FILE            an A/B log of interleaved rounds (FILE from the repository root; lines
#                      "round R | ARGS | VARIANT | MS ms ...", other lines ignored): ms per call
#                      per ARGS (rows) and VARIANT (columns), the median over the rounds, and
#                      in brackets the ratio to the first column; its caption names the run of
#                      the first "# ... commit ..." line (plots/ab.sh writes one)
#   STAGE sass         static SASS counts of STAGE's kernels, a kernel a row and a column per
#                      instruction (or the other way round), from SASS_TABLES's logs, kernels and
#                      columns for STAGE (06_fa2: its forward and backward at d = 128; 07_wgmma:
#                      the bf16 forward kernels: HGMMA per shape, TMA loads, mbarrier operations,
#                      ex2, mma.sync and ldmatrix)
#   STAGE ncu          Nsight Compute (plots/profile.sh's tables in PROFILE_MD, under docs/logs/)
#                      of the stage before STAGE (its number less one) and of STAGE at PROFILE_ARGS:
#                      kernel time, occupancy, tensor pipe, the largest stall reasons
#   STAGE ncu vs OTHER Nsight Compute's reports (NCU_REPORTS, under docs/logs/ncu/) of the forward
#                      and backward kernels of STAGE and OTHER: duration, SM clock, instructions per
#                      cycle, theoretical occupancy
#   STAGE deterministic  the backward with atomic dQ beside --deterministic (DETERMINISTIC_CSV, the
#                      sweep's columns, a note "deterministic" on the --deterministic rows): ms (2
#                      decimals) and workspace per head dim and masking
# The byte models (per stage: which terms) are in plots/bytes_model.awk, the one place they
# are written, shared with plots/plots.sh (bytes.png).
# A shape without a row prints "-", a refused, failed or skipped one (past the bench's time
# budget of a call) "refused" / "failed" / "skipped".
# TFLOP/s and ratios have 3 significant digits. The CSVs are the ones plots/plots.sh draws:
# one GPU's (make plots GPU=NVIDIA-H200 to choose it; RESULTS_CSV / RESULTS_LONG_CSV /
# RESULTS_BYTES_CSV for other paths). Every table of them reads one CSV. Its caption is two
# italic lines, a blank line between them, each kept under ~300 characters: what the cells are
# (units, shape; a byte model is named by its file, plots/bytes_model.awk, not spelled out),
# then where they come from: the GPU, the CSV and the date of its rows, one make bench run or
# which runs were merged into the CSV (plots/plots.sh --sources; SOURCES in plots/plots.sh
# says when files count as one run), and this script. When they were several, the first line
# of a "STAGE vs OTHER" caption also says whether the two stages' rows come from one run (its
# date) or from two (plots/plots.sh --runs; where the .runs lines cannot tell, it says nothing).
# The tables of logs name their files on the second line.
# The rows named ceiling_* are not stages: the io tables quote the device-to-device copy of
# the ceiling_copy row (bytes read + written, from its note, over its median time; see
# plots/anchors.py) where the sweep CSV has one, "in the same run", or "in the run of DATE"
# when the CSV holds several runs and the stage's rows are not from the copy's; nothing else
# reads them.
# A stage renamed since a lesson was written (05_fa2, now 06_fa2) is read under its new
# name, with a note on stderr. Which mask a row of the long or the masks CSV was measured with
# is read from its note (plots/masks.awk).
set -u
HERE=$(pwd)   # FILE arguments are relative to where the script was called from
cd "$(dirname "$0")/.." || exit 2
BEGIN_MARK='<!-- numbers:'
END_MARK='<!-- numbers:end -->'

csvs=$(sh plots/plots.sh --which) || exit 2
MAIN=$(echo "$csvs" | sed -n 1p)
LONG=$(echo "$csvs" | sed -n 2p)
BYTES=$(echo "$csvs" | sed -n 3p)
MASKS=$(echo "$csvs" | sed -n 4p)
MASKS_PATH=$MASKS   # named in the line that says there are no masked runs yet
[ -s "$LONG" ] || LONG=/dev/null
[ -s "$BYTES" ] || BYTES=/dev/null
[ -s "$MASKS" ] || MASKS=/dev/null
# the caption line of each CSV's tables: GPU, file, date of the rows, the run
SRC_MAIN=$(sh plots/plots.sh --sources --md "$MAIN") || exit 2
SRC_LONG= SRC_BYTES=
[ "$LONG" = /dev/null ] || SRC_LONG=$(sh plots/plots.sh --sources --md "$LONG") || exit 2
[ "$BYTES" = /dev/null ] || SRC_BYTES=$(sh plots/plots.sh --sources --md "$BYTES") || exit 2
SRC_MASKS= MRUNS=
[ "$MASKS" = /dev/null ] || SRC_MASKS=$(sh plots/plots.sh --sources --md "$MASKS") || exit 2
# with rows of several runs in the sweep CSV: which run each stage's rows come from (and the
# same for the masks CSV)
RUNS=$(sh plots/plots.sh --runs "$MAIN") || exit 2
[ "$MASKS" = /dev/null ] || MRUNS=$(sh plots/plots.sh --runs "$MASKS") || exit 2
MODELS=$(cat plots/bytes_model.awk) || exit 2
MODELS="$MODELS
$(cat plots/masks.awk)" || exit 2
MASKS_REF=${MASKS_REF:-06_fa2}
# Stages renamed since the lessons' markers were written: old=new, space-separated.
RENAMED="05_fa2=06_fa2"
# The logs behind the tables of logs (see above). The Hopper stages' tables (08_fa3,
# 09_fa3_persistent) are plots/hopper_tables.sh's; none here.
# The "STAGE sass" tables, a line "STAGE KEY VALUE" per setting. logs: the files (a kernel's
# counts come from the last file that has it); kernels: an awk regex on the kernels' names, then
# " | " and what the caption calls them; then a line "col" per column (a kernel a row) or "row"
# per row (an instruction a row, a kernel a column): "[HEADER = ]INSTRUCTIONS | X". INSTRUCTIONS
# are joined by " / " (a count each) or " + " (their sum); each counts the instructions of that
# name or of a name that begins with it and a dot (BAR.SYNC: BAR.SYNC.DEFER_BLOCKING); PREFIX.*
# lists PREFIX's by the next part of their name ("COUNT × SHAPE" for HGMMA, "PART COUNT" else).
# HEADER is INSTRUCTIONS where left out. X is a column's alignment (l, r), or a row's "what it is".
SASS_TABLES=$(cat <<'EOF'
06_fa2 logs docs/logs/sass-05-2026-11-29f.txt
06_fa2 kernels ^(attention_128|backward_128_64)_bf16$ | the bf16 kernels of head dim 128, forward and backward, sm_90
06_fa2 row HMMA.16816.F32.BF16 | `mma.sync.m16n8k16`
06_fa2 row LDSM.16.M88.4 | `ldmatrix.x4`
06_fa2 row LDSM.16.MT88.4 | `ldmatrix.x4.trans`
06_fa2 row LDGSTS.E.BYPASS.128 | 16-byte `cp.async.cg`
06_fa2 row MUFU.EX2 | `ex2.approx`
06_fa2 row SHFL.BFLY | the quad's max and sum
06_fa2 row REDG.E.ADD.F32.FTZ.RN.STRONG.GPU | the dQ `atomicAdd`s
06_fa2 row BAR.SYNC.DEFER_BLOCKING | barriers
07_wgmma logs docs/logs/sass-07-2026-11-30.txt
07_wgmma kernels ^attention_[0-9]+(_[a-z0-9]+)*_bf16$ | the bf16 forward kernels
07_wgmma col HGMMA = HGMMA.* | l
07_wgmma col UTMALDG.4D | r
07_wgmma col SYNCS EXCH / ARRIVE / PHASECHK (mbarrier) = SYNCS.EXCH / SYNCS.ARRIVE / SYNCS.PHASECHK | l
07_wgmma col MUFU.EX2 | r
07_wgmma col HMMA, LDSM = HMMA + LDSM | r
EOF
)
PROFILE_MD=docs/logs/profile-2026-11-30.md
PROFILE_ARGS="--batch 2 --heads 16 --seqlen 8192 --dim 128"
# The "STAGE ncu vs OTHER" tables: ncu's reports, a line "STAGE DIRECTION FILE" each
NCU_REPORTS="06_fa2 forward docs/logs/ncu/06_fa2-forward-d128-N8192.txt
torch_flash forward docs/logs/ncu/torch_flash-forward-d128-N8192.txt
06_fa2 backward docs/logs/ncu/06_fa2-backward-d128-N8192.txt
torch_flash backward docs/logs/ncu/torch_flash-backward-d128-N8192.txt"
DETERMINISTIC_CSV=docs/logs/deterministic-05-2026-11-29g.csv

# gen DOC: copies DOC to stdout with every marked block regenerated. With PRINT_ONLY=1 only
# the generated lines are printed. Exit status 2 on an unknown SPEC or a block without end.
gen() {
    awk -F, -v main="$MAIN" -v long="$LONG" -v bytesf="$BYTES" -v bm="$BEGIN_MARK" \
        -v em="$END_MARK" -v print_only="${PRINT_ONLY:-0}" -v renamed="$RENAMED" \
        -v label="${LABEL:-$1}" -v src_main="$SRC_MAIN" -v src_long="$SRC_LONG" \
        -v src_bytes="$SRC_BYTES" -v runs="$RUNS" -v masksf="$MASKS" -v masks_path="$MASKS_PATH" \
        -v src_masks="$SRC_MASKS" -v mruns="$MRUNS" -v mref="$MASKS_REF" \
        -v sass_tables="$SASS_TABLES" -v prof_md="$PROFILE_MD" -v prof_args="$PROFILE_ARGS" \
        -v ncu_reports="$NCU_REPORTS" -v det_csv="$DETERMINISTIC_CSV" "$MODELS"'
        # 3 significant digits, no exponent: 0.903, 30.1, 335, 1234
        function sig3(x,   r, e) {
            if (x == 0) return "0"
            r = sprintf("%.3g", x) + 0
            for (e = 0; r >= 10 ^ (e + 1); e++) ;
            for (; r < 10 ^ e; e--) ;
            return e >= 2 ? sprintf("%.0f", r) : sprintf("%." (2 - e) "f", r)
        }
        function bytes(x) {
            if (x >= 2^40) return sig3(x / 2^40) " TiB"
            if (x >= 2^30) return sig3(x / 2^30) " GiB"
            if (x >= 2^20) return sig3(x / 2^20) " MiB"
            return sig3(x / 2^10) " KiB"
        }
        function cell(s, dir, d, c, n, what,   k) {
            k = s SUBSEP dir SUBSEP d SUBSEP c SUBSEP n
            if (!(k in st)) return "-"
            return st[k] != "ok" ? st[k] : what == "ms" ? sig3(ms[k]) : sig3(tf[k])
        }
        function ratio(s, o, dir, d, c, n,   a, b) {
            a = s SUBSEP dir SUBSEP d SUBSEP c SUBSEP n; b = o SUBSEP dir SUBSEP d SUBSEP c SUBSEP n
            if (!(a in st) || !(b in st) || st[a] != "ok" || st[b] != "ok" || tf[b] <= 0) return ""   # "in" first: a lookup would add the key
            return " (" sig3(tf[a] / tf[b]) "×)"
        }
        # which run the rows of stages a and b come from (plots/plots.sh --runs): "same" (one
        # run), "apart" (two), "" (the sweep CSV is one run, or its .runs lines cannot tell)
        function runpair(a, b,   i, n, l, f, k) {
            if (!loaded) {
                loaded = 1; n = split(runs, l, "\n")
                for (i = 1; i <= n; i++) if (split(l[i], f, "\t") == 4) { rrun[f[1]] = f[2]; rdate[f[1]] = f[3]; rwhole[f[1]] = f[4] }
            }
            if (!(a in rrun) || !(b in rrun)) return ""
            k = rrun[a] + 0 > rrun[b] + 0 ? a : b
            if (!rwhole[k]) return ""
            return rrun[a] == rrun[b] ? "same" : "apart"
        }
        # the clause of the caption of a ratio table that says so
        function runs_clause(a, b,   r, late, early) {
            r = runpair(a, b)
            if (r == "same") return "; both from the run of " rdate[a]
            if (r != "apart") return ""
            late = rrun[a] + 0 > rrun[b] + 0 ? a : b; early = late == a ? b : a
            return "; from two runs: " late " from the run of " rdate[late] ", " early " from an earlier one"
        }
        # the caption under a table: two italic lines, a blank line between them (two
        # paragraphs): what the cells are, then where they come from (src: the GPU, the date of
        # the rows and the CSV as plots/plots.sh --sources gives them, or the log files)
        function caption(what, src) {
            out("*" what ".*"); out(""); out("*" src "; generated by `plots/docs_tables.sh`; do not edit.*")
        }
        # the caption under a table of the sweep CSV
        function source(what) { caption(what, src_main) }
        function out(line) { print line }
        function fail(msg) { printf "docs_tables: %s: %s\n", label, msg > "/dev/stderr"; bad = 1 }
        # what: "tflops" (with o: the ratio per cell) or "ms"
        function table_tflops(s, o, what,   dir, di, d, c, n, hdr, sep, line, i, ncols, cd, cc, cdir) {
            hdr = "| N |"; sep = "|--:|"; ncols = 0
            for (di = 1; di <= 2; di++) {
                dir = di == 1 ? "forward" : "backward"
                if (!((s, dir) in hasdir)) continue
                for (d = 64; d <= 128; d *= 2)
                    for (c = 0; c <= 1; c++) {
                        ncols++; cdir[ncols] = dir; cd[ncols] = d; cc[ncols] = c
                        hdr = hdr " " (dir == "forward" ? "fwd" : "bwd") " d=" d (c ? " causal" : "") " |"
                        sep = sep "--:|"
                    }
            }
            if (ncols == 0) { fail(s " has no ok rows in " main); return }
            out(""); out(hdr); out(sep)
            for (i = 1; i <= nn; i++) {
                n = ns[i]; line = "| " n " |"
                for (c = 1; c <= ncols; c++) {
                    line = line " " cell(s, cdir[c], cd[c], cc[c], n, what)
                    if (o != "") line = line ratio(s, o, cdir[c], cd[c], cc[c], n)
                    line = line " |"
                }
                out(line)
            }
            out("")
            if (what == "ms")
                source("milliseconds per call of " s ", median of the timed runs; bf16, 16384 tokens (B = 16384/N), hidden 2048 (H = 2048/d)")
            else
                source("TFLOP/s of " s (o != "" ? " (in brackets: " s " / " o " on the same shape, where both ran" runs_clause(s, o) ")" : "") \
                    ", median of the timed runs; bf16, 16384 tokens (B = 16384/N), hidden 2048 (H = 2048/d); causal counts the visible half")
        }
        function table_workspace(s,   i, n, k, line, di, dir, v) {
            out(""); out("| N | B | forward | backward |"); out("|--:|--:|--:|--:|")
            for (i = 1; i <= nn; i++) {
                n = ns[i]; line = "| " n " | " (n in bat ? bat[n] : "-") " |"
                for (di = 1; di <= 2; di++) {
                    dir = di == 1 ? "forward" : "backward"
                    k = s SUBSEP dir SUBSEP 128 SUBSEP 0 SUBSEP n
                    v = !(k in st) ? "-" : st[k] != "ok" ? st[k] : ws[k] > 0 ? bytes(ws[k]) : "0"
                    line = line " " v " |"
                }
                out(line)
            }
            out("")
            source("workspace of " s " (bytes the harness allocated beyond Q, K, V, O and dO, dQ, dK, dV: L + the stage scratch), bf16, head dim 128, non-causal, H = 16")
        }
        # ser: the series, c0 (non-causal), c1 (causal), c1w4096 (causal, a window of 4096)
        function table_long(s, ser,   i, n, k, line, di, dir, any, w, what) {
            out(""); out("| N | forward ms | forward TFLOP/s | forward workspace | backward ms | backward TFLOP/s | backward workspace |")
            out("|--:|--:|--:|--:|--:|--:|--:|")
            for (i = 1; i <= nl[ser]; i++) {
                n = nsl[ser, i]; line = "| " n " |"
                for (di = 1; di <= 2; di++) {
                    dir = di == 1 ? "forward" : "backward"
                    k = s SUBSEP dir SUBSEP n SUBSEP ser
                    if (!(k in lst)) line = line " - | - | - |"
                    else if (lst[k] != "ok")
                        line = line " " lst[k] " | - | " (lws[k] > 0 ? "needs " bytes(lws[k]) : "-") " |"
                    else { line = line " " sig3(lms[k]) " | " sig3(ltf[k]) " | " bytes(lws[k]) " |"; any = 1 }
                }
                out(line)
            }
            out("")
            w = ser; sub(/^c[01]w?/, "", w)
            what = ser == "c0" ? "non-causal" : ser == "c1" ? "causal" : (ser ~ /^c1/ ? "causal, " : "") "a sliding window of " w " keys (TFLOP/s of the visible pairs)"
            caption("long context of " s ": B = 1, H = 16, head dim 128, " what ", bf16", src_long)
        }
        # STAGE long causal, STAGE long window: the series of s that match re (every window:
        # a table each), or one line when there is none
        function table_long_series(s, re, what,   ser, n, i, j, x, l) {
            n = 0
            for (ser in lsers) if (ser ~ re && (s, ser) in lhas) l[++n] = ser
            for (i = 2; i <= n; i++) for (j = i; j > 1 && l[j - 1] > l[j]; j--) { x = l[j]; l[j] = l[j - 1]; l[j - 1] = x }
            if (n == 0) {
                out(""); out("*No " what " long-context rows of " s " in `" (long == "/dev/null" ? "the long-context CSV" : long) "` yet: `STAGES=\"" s "\" SWEEP=0 MASKS=0 sh plots/bench.sh` on a GPU measures them; generated by `plots/docs_tables.sh`; do not edit.*")
                return
            }
            for (i = 1; i <= n; i++) table_long(s, l[i])
        }
        # the masks CSV of several runs (plots/plots.sh --runs): the run the rows of each of
        # the stages (space-separated) come from, "; all from the run of D" or "; S from the
        # run of D1, T from the run of D2"; "" for one run, or where the .runs lines cannot tell
        function mruns_clause(stages,   i, n, ln, f, r, d, w, st, ns, one, c) {
            n = split(mruns, ln, "\n")
            for (i = 1; i <= n; i++) if (split(ln[i], f, "\t") == 4) { r[f[1]] = f[2]; d[f[1]] = f[3]; w[f[1]] = f[4] }
            ns = split(stages, st, " ")
            one = 1
            for (i = 1; i <= ns; i++) {
                if (!(st[i] in r) || !w[st[i]]) return ""
                if (r[st[i]] != r[st[1]]) one = 0
            }
            if (one) return "; " (ns > 1 ? "all" : st[1]) " from the run of " d[st[1]]
            c = ""
            for (i = 1; i <= ns; i++) c = c (i > 1 ? ", " : "; ") st[i] " from the run of " d[st[i]]
            return c
        }
        # STAGE masks: one row per mask and direction of the masks CSV
        function table_masks(s, mref,   i, j, n, x, l, pat, di, dir, k, r, f, line, refk, fk, cnt) {
            if (masksf == "/dev/null") {
                out(""); out("*No masked runs measured yet: `" masks_path "` does not exist (`STAGES=\"06_fa2 12_block_sparse torch_flex\" SWEEP=0 LONG=0 sh plots/bench.sh` on a GPU measures them); generated by `plots/docs_tables.sh`; do not edit.*")
                return
            }
            if (!(s in mseen)) { fail("stage " s " has no rows in " masksf); return }
            if (!(mref in mseen)) { fail("stage " mref " has no rows in " masksf); return }
            n = 0
            for (pat in mpat) l[++n] = pat
            for (i = 2; i <= n; i++) for (j = i; j > 1 && mrank[l[j - 1]] > mrank[l[j]]; j--) { x = l[j]; l[j] = l[j - 1]; l[j - 1] = x }
            out(""); out("| mask | direction | visible fraction | ms | TFLOP/s | vs dense " mref " | vs torch_flex |")
            out("|---|---|--:|--:|--:|--:|--:|")
            for (i = 1; i <= n; i++) {
                pat = l[i]
                for (di = 1; di <= 2; di++) {
                    dir = di == 1 ? "forward" : "backward"
                    k = s SUBSEP dir SUBSEP pat
                    if (!(k in mst)) continue
                    refk = mref SUBSEP dir SUBSEP "0" SUBSEP ""
                    fk = "torch_flex" SUBSEP dir SUBSEP pat
                    f = (k in mfrac) ? mfrac[k] : mpfrac[pat]
                    line = "| " mname[pat] " | " dir " | " (f != "" ? sig3(f) : "-") " | "
                    if (mst[k] != "ok") line = line mst[k] " | - | - | - |"
                    else {
                        line = line sig3(mms[k]) " | " sig3(mtf[k]) " | "
                        line = line (mst[refk] == "ok" && mtf[refk] > 0 ? sig3(mtf[k] / mtf[refk]) "×" : "-") " | "
                        line = line (mst[fk] == "ok" && mtf[fk] > 0 ? sig3(mtf[k] / mtf[fk]) "×" : "-") " |"
                    }
                    out(line); cnt++
                }
            }
            out("")
            caption(s " per mask, " mshape "; TFLOP/s of the visible (query, key) pairs; vs dense " mref ": over its dense non-causal TFLOP/s, same direction; vs torch_flex: over FlexAttention'"'"'s on the identical mask", \
                src_masks mruns_clause(s (s != mref ? " " mref : "") (s != "torch_flex" ? " torch_flex" : "")))
        }
        # GB (10^9 bytes), 3 significant digits
        function gb(x) { return sig3(x / 1e9) " GB" }
        # STAGE tile cost vs OTHER: what a tile costs beyond its keys, from the sweep at head dim
        # 128 (non-causal): per N below M = 8192, the TFLOP/s of each program over its own at M, and
        # c, the fixed cost of a tile (a query tile forward, a key tile backward) in keys or
        # query rows, if a tile takes a time proportional to N + c: the ratio is then
        # N (M + c) / (M (N + c)), so c = N M (1 - ratio) / (ratio M - N)
        function table_tilecost(s, o,   M, i, n, di, dir, pi, p, a, r, c, line, hdr, sep) {
            M = 8192
            hdr = "| N |"; sep = "|--:|"
            for (di = 1; di <= 2; di++)
                for (pi = 1; pi <= 2; pi++) {
                    hdr = hdr " " (di == 1 ? "forward" : "backward") ": " (pi == 1 ? s : o) " |"
                    sep = sep "--:|"
                }
            out(""); out(hdr); out(sep)
            for (i = 1; i <= nn; i++) {
                n = ns[i]
                if (n >= M) continue
                line = "| " n " |"
                for (di = 1; di <= 2; di++)
                    for (pi = 1; pi <= 2; pi++) {
                        dir = di == 1 ? "forward" : "backward"; p = pi == 1 ? s : o
                        a = p SUBSEP dir SUBSEP 128 SUBSEP 0
                        if (!((a, n) in st) || !((a, M) in st) || st[a, n] != "ok" || st[a, M] != "ok" || tf[a, M] <= 0) { line = line " - |"; continue }
                        r = tf[a, n] / tf[a, M]
                        c = r < 1 && r * M > n ? sprintf("%.0f", n * M * (1 - r) / (r * M - n)) : "-"
                        line = line " " sig3(r) " (" c ") |"
                    }
                out(line)
            }
            out("")
            source("TFLOP/s at N over the same program'"'"'s at N = " M "; in brackets c, a tile'"'"'s fixed cost in keys (forward: a query tile'"'"'s) or query rows (backward: a key tile'"'"'s), if a tile takes time in proportion to N + c; head dim 128, non-causal, bf16, B = 16384/N, H = 16" runs_clause(s, o))
        }
        # forward, d = 128, non-causal: measured ms next to the model of plots/bytes_model.awk
        function table_io(s,   i, n, k, b, h, once, tot, has) {
            has = bm_has(s)
            out(""); out("| N | B | measured ms | Q, K, V, O, L once | " (has ? bm_extra(s, 128) : "beyond that (no model)") " | modelled total | total / measured time |")
            out("|--:|--:|--:|--:|--:|--:|--:|")
            for (i = 1; i <= nn; i++) {
                n = ns[i]; k = s SUBSEP "forward" SUBSEP 128 SUBSEP 0 SUBSEP n
                if (!(k in st) || st[k] != "ok") { out("| " n " | - | " ((k in st) ? st[k] : "-") " | - | - | - | - |"); continue }
                b = B[k]; h = H[k]
                once = bm_once(b, h, n, 128, 1)
                if (!has) { out("| " n " | " b " | " sig3(ms[k]) " | " gb(once) " | - | - | - |"); continue }
                tot = bm_total(s, b, h, n, 128)
                out("| " n " | " b " | " sig3(ms[k]) " | " gb(once) " | " gb(tot - once) " | " gb(tot) " | " sig3(tot / (ms[k] / 1e3) / 1e12) " TB/s |")
            }
            out("")
            if (has) source(s " forward, bf16, head dim 128, non-causal: ms measured, bytes modelled (plots/bytes_model.awk, not profiled; GB = 10^9 bytes); last column: modelled bytes / measured time" copy_note(s))
            else source(s " forward, bf16, head dim 128, non-causal: ms measured; plots/bytes_model.awk has no byte model of " s ", only the bytes every stage moves at least (GB = 10^9 bytes)" copy_note(s))
        }
        # the copy ceiling, where the sweep CSV has a ceiling_copy row: a clause for the io
        # tables of stage s (timed in the same run as the rows of s, or in the run it names);
        # nothing when it has none
        function copy_note(s,   when) {
            if (copy_tbs == "") return ""
            when = runpair(s, "ceiling_copy") == "same" || !("ceiling_copy" in rrun) ? "the same run" : "the run of " rdate["ceiling_copy"]
            return "; a device-to-device copy (`ceiling_copy`) reached " sig3(copy_tbs) " TB/s in " when
        }
        function bytes_source(what) { caption(what "; GB = 10^9 bytes", src_bytes) }
        function bytes_shape() {
            return "DRAM bytes of one forward call as Nsight Compute counts them (the stage'"'"'s kernels summed), " bdtype ", H = " bh ", head dim " bd ", non-causal, B = " btok "/N"
        }
        # The bytes CSV, one stage: measured read, written; model; measured / model.
        function table_bytes(s,   i, n, k, m, line) {
            out(""); out("| N | B | measured read | measured written | model | measured / model |")
            out("|--:|--:|--:|--:|--:|--:|")
            for (i = 1; i <= nb; i++) {
                n = nsb[i]; k = s SUBSEP n
                if (!(k in bst)) { out("| " n " | - | - | - | - | - |"); continue }
                if (bst[k] != "ok") { out("| " n " | " bb[k] " | " bst[k] " | - | - | - |"); continue }
                m = bm_total(s, bb[k], bhh[k], n, bdd[k])
                line = "| " n " | " bb[k] " | " gb(brd[k]) " | " gb(bwr[k]) " | "
                line = line (m > 0 ? gb(m) " | " sig3((brd[k] + bwr[k]) / m) "×" : "- | -") " |"
                out(line)
            }
            out("")
            bytes_source(s ": " bytes_shape() "; model: plots/bytes_model.awk")
        }
        # The bytes CSV, every stage: measured read + written (measured / model).
        function table_bytes_all(   i, j, n, k, m, hdr, sep, line, ord, no, x) {
            no = 0
            for (x in bseen) ord[++no] = x
            for (i = 2; i <= no; i++)
                for (j = i; j > 1 && rank(ord[j - 1]) > rank(ord[j]); j--) { x = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = x }
            if (no == 0) { fail("no rows in the bytes CSV (" bytesf ")"); return }
            hdr = "| N | B |"; sep = "|--:|--:|"
            for (j = 1; j <= no; j++) { hdr = hdr " " ord[j] " |"; sep = sep "--:|" }
            out(""); out(hdr); out(sep)
            for (i = 1; i <= nb; i++) {
                n = nsb[i]; line = "| " n " | " (n in bbat ? bbat[n] : "-") " |"
                for (j = 1; j <= no; j++) {
                    k = ord[j] SUBSEP n
                    if (!(k in bst)) line = line " - |"
                    else if (bst[k] != "ok") line = line " " bst[k] " |"
                    else {
                        m = bm_total(ord[j], bb[k], bhh[k], n, bdd[k])
                        line = line " " gb(brd[k] + bwr[k]) (m > 0 ? " (" sig3((brd[k] + bwr[k]) / m) "×)" : "") " |"
                    }
                }
                out(line)
            }
            out("")
            bytes_source("read + written: " bytes_shape() "; in brackets: measured / modelled (plots/bytes_model.awk)")
        }
        # ---- the tables of logs (the lessons of stages 6 and 7): files outside the sweep, read when asked
        # the caption under such a table: what its cells are, then the files they come from
        function logs_source(what, files) { caption(what, files) }
        # a[1..n] sorted by key[a[i]] (insertion sort, a few items)
        function sort_by(a, n, key,   i, j, x) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && key[a[j - 1]] > key[a[j]]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
        }
        # the median of the numbers f[from..to]
        function median(f, from, to,   v, n, i, j, x) {
            n = 0
            for (i = from; i <= to; i++) v[++n] = f[i] + 0
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { x = v[j]; v[j] = v[j - 1]; v[j - 1] = x }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        # ab FILE: an A/B log of interleaved rounds, a line "round R | ARGS | VARIANT | MS ms ..."
        # per run: a row per ARGS, a column per VARIANT (both in the order they first appear),
        # the median ms over the rounds, and the ratio to the first column in brackets
        function table_ab(file,   line, f, k, a, na, v, nv, seenr, seenv, t, cnt, x, i, j, rounds, row, m0, m, hdr) {
            na = nv = 0; hdr = ""
            while ((getline line < file) > 0) {
                if (hdr == "" && line ~ /^# .*commit /) hdr = substr(line, 3)   # plots/ab.sh: date; GPU; commit
                if (split(line, f, " [|] ") < 4 || f[1] !~ /^round [0-9]+$/ || !match(f[4], /^[0-9.]+ ms/)) continue
                if (!(f[2] in seenr)) { seenr[f[2]] = 1; a[++na] = f[2] }
                if (!(f[3] in seenv)) { seenv[f[3]] = 1; v[++nv] = f[3] }
                k = f[2] SUBSEP f[3]
                t[k, ++cnt[k]] = substr(f[4], 1, RLENGTH - 3) + 0
                rounds[cnt[k]] = 1
            }
            close(file)
            if (na == 0) { fail("no \"round R | ARGS | VARIANT | MS ms\" lines in " file); return }
            row = "| arguments |"; for (j = 1; j <= nv; j++) row = row " " v[j] " |"
            out(""); out(row)
            row = "|---|"; for (j = 1; j <= nv; j++) row = row "--:|"
            out(row)
            for (i = 1; i <= na; i++) {
                row = "| `" a[i] "` |"; m0 = 0
                for (j = 1; j <= nv; j++) {
                    k = a[i] SUBSEP v[j]
                    if (!(k in cnt)) { row = row " - |"; continue }
                    split("", x); for (m = 1; m <= cnt[k]; m++) x[m] = t[k, m]
                    m = median(x, 1, cnt[k])
                    if (j == 1) m0 = m
                    row = row " " sprintf("%.3f", m) (j > 1 && m0 > 0 ? " (" sprintf("%.3f", m / m0) ")" : "") " |"
                }
                out(row)
            }
            m = 0; for (k in rounds) if (k + 0 > m) m = k + 0
            out("")
            logs_source("ms per call, the median of " m " interleaved rounds (each a `--bench` median); in brackets, the ratio to the first column", "`" file "`" (hdr != "" ? " (" hdr ")" : ""))
        }
        # a setting of the tables of logs: the values of the lines "S KEY VALUE" of text into
        # v[1..n] (in their order); returns n
        function conf(text, s, key, v,   l, n, i, m) {
            n = split(text, l, "\n"); m = 0; split("", v)
            for (i = 1; i <= n; i++) if (index(l[i], s " " key " ") == 1) v[++m] = substr(l[i], length(s " " key " ") + 1)
            return m
        }
        # a kernel'"'"'s name from its mangled one (_Z18attention_128_bf1612attn_problem...)
        function demangle(m) {
            if (!match(m, /^_Z[0-9]+/)) return ""
            return substr(m, RLENGTH + 1, substr(m, 3, RLENGTH - 2))
        }
        # one count of a SASS log: kernel k (if it matches re), instruction ins (its whole name); a
        # kernel'"'"'s counts come from the last file that has it (a later file replaces the earlier file'"'"'s)
        function sass_count(k, ins, c, file, re,   x, y, z, nz) {
            if (k !~ re) return
            if ((k in sfile) && sfile[k] != file) {
                nz = 0; for (x in scnt) { split(x, y, SUBSEP); if (y[1] == k) z[++nz] = x }
                for (x = 1; x <= nz; x++) delete scnt[z[x]]
            }
            sfile[k] = file
            scnt[k, ins] += c
        }
        # whether instruction ins is pre or begins with pre and a dot (BAR.SYNC: BAR.SYNC.DEFER_BLOCKING)
        function sass_is(ins, pre) { return ins == pre || index(ins, pre ".") == 1 }
        # kernel k'"'"'s count of the instructions pre (sass_is)
        function sass_n(k, pre,   x, y, n) {
            n = 0
            for (x in scnt) { split(x, y, SUBSEP); if (y[1] == k && sass_is(y[2], pre)) n += scnt[x] }
            return n
        }
        # kernel k'"'"'s instructions pre.PART..., summed per PART: "COUNT × PART" (HGMMA: PART is the
        # shape, in the order of its N) or "PART COUNT", joined by ", "
        function sass_list(k, pre,   x, y, p, a, key, cnt, n, i, mnk, s, hg) {
            n = 0; hg = pre == "HGMMA"
            for (x in scnt) {
                split(x, y, SUBSEP)
                if (y[1] != k || index(y[2], pre ".") != 1) continue
                split(substr(y[2], length(pre) + 2), p, ".")
                if (!(p[1] in cnt)) { a[++n] = p[1]; split(p[1], mnk, "x"); key[p[1]] = hg ? mnk[2] + 0 : p[1] }
                cnt[p[1]] += scnt[x]
            }
            sort_by(a, n, key)
            s = ""
            for (i = 1; i <= n; i++) s = s (i > 1 ? ", " : "") (hg ? cnt[a[i]] " × " a[i] : a[i] " " cnt[a[i]])
            return s == "" ? "-" : s
        }
        # a cell of a SASS table: instructions joined by " / " (a count each) or " + " (their sum),
        # or PREFIX.* (sass_list)
        function sass_cell(k, what,   t, n, i, s) {
            if (what ~ /\.\*$/) return sass_list(k, substr(what, 1, length(what) - 2))
            n = split(what, t, " [+/] ")
            if (index(what, " + ")) { s = 0; for (i = 1; i <= n; i++) s += sass_n(k, t[i]); return s }
            s = sass_n(k, t[1]); for (i = 2; i <= n; i++) s = s " / " sass_n(k, t[i])
            return s
        }
        # the files logs[1..nl] into scnt, the kernels matching re; two forms: "<mangled name>
        # <instruction> <count>" a line (the name decoded from its length prefix); a line "sm_NN
        # <mangled name>" and under it "<instruction>:<count> ..." (sm_90'"'"'s only, the H200'"'"'s
        # code). Returns 0 on a file it cannot read
        function sass_read(logs, nl, re,   i, line, f, nf, j, cur) {
            split("", scnt); split("", sfile)
            for (i = 1; i <= nl; i++) {
                if ((getline line < logs[i]) <= 0) { fail("cannot read " logs[i]); return 0 }
                cur = ""
                do {
                    nf = split(line, f, " ")
                    if (nf == 3 && f[1] ~ /^_Z[0-9]/) sass_count(demangle(f[1]), f[2], f[3], logs[i], re)
                    else if (nf == 2 && f[1] ~ /^sm_[0-9]+$/) cur = f[1] == "sm_90" ? demangle(f[2]) : ""
                    else if (cur != "" && f[1] ~ /:[0-9]+$/)
                        for (j = 1; j <= nf; j++) if (match(f[j], /:[0-9]+$/))
                            sass_count(cur, substr(f[j], 1, RSTART - 1), substr(f[j], RSTART + 1), logs[i], re)
                } while ((getline line < logs[i]) > 0)
                close(logs[i])
            }
            return 1
        }
        # STAGE sass: the SASS counts of the settings of stage s in sass_tables (see SASS_TABLES)
        function table_sass(s,   v, files, logs, nl, re, what, cols, nc, byrow, c, x, p, h, it, tail, k, ks, nk, kkey, i, j, line, row, cap) {
            files = conf(sass_tables, s, "logs", v) ? v[1] : ""
            nl = split(files, logs, " ")
            if (nl == 0 || !conf(sass_tables, s, "kernels", v)) { fail("no SASS logs of " s " in SASS_TABLES"); return }
            split(v[1], x, " [|] "); re = x[1]; what = x[2]
            byrow = (nc = conf(sass_tables, s, "col", cols)) == 0
            if (byrow) nc = conf(sass_tables, s, "row", cols)
            for (c = 1; c <= nc; c++) {
                split(cols[c], x, " [|] "); tail[c] = x[2]
                p = index(x[1], " = ")
                h[c] = p ? substr(x[1], 1, p - 1) : x[1]; it[c] = p ? substr(x[1], p + 3) : x[1]
            }
            if (!sass_read(logs, nl, re)) return
            for (k in sfile) {
                ks[++nk] = k; split(k, x, "_")
                kkey[k] = sprintf("%04d %s", x[2], k)
            }
            if (nk == 0) { fail("no kernel matching " re " in " files); return }
            sort_by(ks, nk, kkey)
            out("")
            if (!byrow) {
                # a kernel a row, the columns of the settings
                line = "| kernel |"; row = "|---|"
                for (c = 1; c <= nc; c++) { line = line " " h[c] " |"; row = row (tail[c] == "r" ? "--:|" : "---|") }
                out(line); out(row)
                for (j = 1; j <= nk; j++) {
                    line = "| `" ks[j] "` |"
                    for (c = 1; c <= nc; c++) line = line " " sass_cell(ks[j], it[c]) " |"
                    out(line)
                }
            } else {
                # an instruction a row, a kernel a column, and what the instruction is
                line = "| instruction |"; row = "|---|"
                for (j = 1; j <= nk; j++) { line = line " `" ks[j] "` |"; row = row "--:|" }
                out(line " what it is |"); out(row "---|")
                for (c = 1; c <= nc; c++) {
                    line = "| `" h[c] "` |"
                    for (j = 1; j <= nk; j++) line = line " " sass_cell(ks[j], it[c]) " |"
                    out(line " " tail[c] " |")
                }
            }
            cap = ""
            for (i = 1; i <= nl; i++) {
                line = ""
                for (j = 1; j <= nk; j++) if (sfile[ks[j]] == logs[i]) line = line (line == "" ? "" : ", ") ks[j]
                if (line != "") cap = cap (cap == "" ? "" : "; ") "`" logs[i] "` (" line ")"
            }
            out("")
            logs_source("static instruction counts in the SASS of " what " (`cuobjdump --dump-sass` on the H200)" (nl > 1 ? ", each kernel from the last file that has it" : ""), cap)
        }
        # STAGE ncu: the tables of plots/profile.sh in prof_md ("STAGE ARGS (ncu ...)", then a row
        # per kernel) of the stage before s (its number less one) and of s, run with prof_args (the
        # last such table of each)
        function table_ncu(s,   line, cur, p, c, i, j, st, rows, nrow, stage, prev) {
            prev = sprintf("%02d_", substr(s, 1, 2) - 1); st[1] = ""; st[2] = s
            while ((getline line < prof_md) > 0) {
                if (line ~ /^[0-9][0-9]_[a-z0-9_]+ .*\(ncu /) {
                    stage = substr(line, 1, index(line, " ") - 1); p = index(line, " (ncu ")
                    cur = substr(line, length(stage) + 2, p - length(stage) - 2) == prof_args ? stage : ""
                    if (cur != "") nrow[cur] = 0
                    if (index(cur, prev) == 1) st[1] = cur
                    continue
                }
                if (cur == "" || line !~ /^\| / || line ~ /^\| kernel \|/) continue
                split(line, c, "|")
                for (i = 2; i <= 8; i++) gsub(/^ +| +$/, "", c[i])
                rows[cur, ++nrow[cur]] = c[2] SUBSEP c[3] " | " c[6] " | " c[7] " | " c[8]
            }
            close(prof_md)
            for (i = 1; i <= 2; i++)
                if (!nrow[st[i]]) { fail("no table of " (i == 1 ? prev "* (the stage before " s ")" : s) " " prof_args " in " prof_md); return }
            out(""); out("| stage | kernel time ms | achieved occupancy % | tensor pipe active % | largest stall reasons (cycles per issued instruction) |")
            out("|---|--:|--:|--:|---|")
            for (i = 1; i <= 2; i++) {
                for (j = 1; j <= nrow[st[i]]; j++) {
                    split(rows[st[i], j], c, SUBSEP)
                    out("| " st[i] (nrow[st[i]] > 1 ? ", `" c[1] "`" : "") " | " c[2] " |")
                }
            }
            out("")
            logs_source("Nsight Compute (`plots/profile.sh`: `ncu --clock-control none`), one call of `STAGE " prof_args "`, bf16, forward, non-causal; stall reasons: the five largest", "`" prof_md "`")
        }
        # a report of ncu'"'"'s sections (its text output): the first kernel'"'"'s name into m["kernel"],
        # its metrics (lines "  NAME  [UNIT]  VALUE", split at runs of two or more spaces) into
        # m[NAME] and their units into m[NAME, "unit"], and the harness'"'"'s line of the problem
        # ("... bf16 B=2 H=16 ... causal=0 on ...") into m["shape"]; 0 without a kernel
        function ncu_report(file, m,   line, f, n, k) {
            split("", m)
            while ((getline line < file) > 0) {
                if (line ~ /^  [^ ].*, Context [0-9]+, Stream /) {
                    if ("kernel" in m) break
                    k = line; sub(/^ +(void )?/, "", k); sub(/[<(].*/, "", k); m["kernel"] = k
                }
                else if (!("shape" in m) && match(line, /[a-z0-9]+ B=[0-9]+ H=.* causal=[01]/)) m["shape"] = substr(line, RSTART, RLENGTH)
                else if ("kernel" in m && (n = split(line, f, "  +")) >= 3 && f[1] == "" && f[n] ~ /^[0-9.,]+$/) {
                    m[f[2]] = f[n]; m[f[2], "unit"] = n > 3 ? f[3] : ""
                }
            }
            close(file)
            return "kernel" in m
        }
        # STAGE ncu vs OTHER: ncu'"'"'s reports of the two stages'"'"' forward and backward kernels (the
        # files of ncu_reports): duration, SM clock, instructions per cycle, theoretical occupancy
        function table_ncu_vs(s, o,   di, dir, i, x, v, m, files, shape, rows, n) {
            for (di = 1; di <= 2; di++) {
                dir = di == 1 ? "forward" : "backward"
                for (i = 1; i <= 2; i++) {
                    x = i == 1 ? s : o
                    if (!conf(ncu_reports, x, dir, v)) { fail("no " dir " report of " x " in NCU_REPORTS"); return }
                    if (!ncu_report(v[1], m)) { fail("no kernel in " v[1]); return }
                    rows[++n] = "| " x ", " dir ": `" m["kernel"] "` | " m["Duration"] " " m["Duration", "unit"] " | " m["SM Frequency"] " | " \
                        m["Executed Ipc Active"] " | " m["Theoretical Occupancy"] " |"
                    files = files (files == "" ? "" : ", ") "`" v[1] "`"
                    if (shape == "" && "shape" in m) shape = m["shape"]
                }
            }
            out(""); out("| kernel | duration | SM clock GHz | instructions per cycle | theoretical occupancy % |")
            out("|---|--:|--:|--:|--:|")
            for (i = 1; i <= n; i++) out(rows[i])
            out("")
            logs_source("Nsight Compute (`ncu` with the sections SpeedOfLight, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis, SchedulerStats, WarpStateStats, LaunchStats, Occupancy), one call each" (shape != "" ? ", `" shape "` (the harness'"'"'s line in " s "'"'"'s report)" : "") \
                "; SM clock: `SM Frequency`; instructions per cycle: `Executed Ipc Active`", files)
        }
        # STAGE deterministic: the backward rows of s (or of its old name) in det_csv (the sweep'"'"'s
        # columns; the note "deterministic" on a --deterministic row), per head dim and masking in
        # the order of the file: ms with atomic dQ and with --deterministic, and their workspaces
        function table_deterministic(s,   line, f, r, nr, seen_r, k, kind, t, w, name, shape, i, c) {
            while ((getline line < det_csv) > 0) {
                if (split(line, f, ",") < 15 || f[3] != "backward" || new_name(f[2]) != s) continue
                k = f[10] SUBSEP f[11]; kind = f[16] ~ /deterministic/ ? "det" : "atomic"
                if (!(k in seen_r)) { seen_r[k] = 1; r[++nr] = k }
                t[k, kind] = f[15] == "ok" ? sprintf("%.2f ms", f[12]) : f[15]
                w[k, kind] = f[15] == "ok" ? bytes(f[14]) : "-"
                if (shape == "") { name = f[2]; shape = f[4] ", B = " f[5] ", N = " f[8] ", H = " f[6] * f[10] "/d" }
            }
            close(det_csv)
            if (nr == 0) { fail("no backward rows of " s " in " det_csv); return }
            out(""); out("| head dim, causal | atomic dQ | deterministic | workspace atomic / deterministic |")
            out("|---|--:|--:|--:|")
            for (i = 1; i <= nr; i++) {
                split(r[i], c, SUBSEP)
                k = r[i]
                out("| " c[1] ", " (c[2] + 0 ? "yes" : "no") " | " ((k, "atomic") in t ? t[k, "atomic"] : "-") " | " ((k, "det") in t ? t[k, "det"] : "-") " | " \
                    ((k, "atomic") in w ? w[k, "atomic"] : "-") " / " ((k, "det") in w ? w[k, "det"] : "-") " |")
            }
            out("")
            logs_source("the backward of " s (name != s ? " (named " name " then)" : "") " with dQ accumulated by atomics and with `--deterministic`, ms per call, median of the timed runs; " shape, \
                "`" det_csv "`")
        }
        # numbered stages first, then cuBLAS, then the rest by name
        function rank(x) { return (x ~ /^[0-9]/ ? "0" : x == "cublas" ? "1" : "2") x }
        # a stage renamed since the lesson was written: its new name (noted on stderr)
        function resolve(x,   n) {
            if (x in seen || x in bseen) return x
            n = new_name(x)
            if (n != x && (n in seen || n in bseen)) {
                printf "docs_tables: %s: %s is now %s (renamed): its rows are read\n", label, x, n > "/dev/stderr"
                return n
            }
            return x
        }
        # the name of stage x now (renamed: old=new), or x
        function new_name(x,   i, nr, r, pair) {
            nr = split(renamed, r, " ")
            for (i = 1; i <= nr; i++) { split(r[i], pair, "="); if (pair[1] == x) return pair[2] }
            return x
        }
        function spec(text,   w, nw) {
            nw = split(text, w, " ")
            if (nw < 1) { fail("empty numbers spec"); return }
            if (nw == 1 && w[1] == "bytes") { table_bytes_all(); return }
            if (nw == 2 && w[1] == "ab") { table_ab(w[2]); return }
            w[1] = resolve(w[1])
            # the tables of the logs a lesson quotes
            if (nw == 2 && w[2] == "sass") { table_sass(w[1]); return }
            if (nw == 2 && w[2] == "ncu") { table_ncu(w[1]); return }
            if (nw == 4 && w[2] == "ncu" && w[3] == "vs") { table_ncu_vs(w[1], resolve(w[4])); return }
            if (nw == 2 && w[2] == "deterministic") { table_deterministic(w[1]); return }
            if (nw == 2 && w[2] == "bytes") {
                if (!(w[1] in bseen)) { fail("stage " w[1] " has no rows in the bytes CSV (" bytesf ")"); return }
                table_bytes(w[1]); return
            }
            # the long series and the masks: one line, no failure, while nothing is measured
            if (nw == 3 && w[2] == "long" && w[3] == "causal") { table_long_series(w[1], "^c1$", "causal"); return }
            if (nw == 3 && w[2] == "long" && w[3] == "window") { table_long_series(w[1], "w", "sliding-window"); return }
            if (nw == 2 && w[2] == "masks") { table_masks(w[1], mref); return }
            if (nw == 4 && w[2] == "masks" && w[3] == "vs") { table_masks(w[1], w[4]); return }
            if (!(w[1] in seen)) { fail("stage " w[1] " has no rows in " main); return }
            if (nw == 1) table_tflops(w[1], "", "tflops")
            else if (nw == 3 && w[2] == "vs") {
                w[3] = resolve(w[3])
                if (!(w[3] in seen)) { fail("stage " w[3] " has no rows in " main); return }
                table_tflops(w[1], w[3], "tflops")
            }
            else if (nw == 2 && w[2] == "ms") table_tflops(w[1], "", "ms")
            else if (nw == 2 && w[2] == "workspace") table_workspace(w[1])
            else if (nw == 2 && w[2] == "long") table_long(w[1], "c0")
            else if (nw == 2 && w[2] == "io") table_io(w[1])
            else if (nw == 5 && w[2] == "tile" && w[3] == "cost" && w[4] == "vs") {
                w[5] = resolve(w[5])
                if (!(w[5] in seen)) { fail("stage " w[5] " has no rows in " main); return }
                table_tilecost(w[1], w[5])
            }
            else fail("unknown numbers spec \"" text "\" (STAGE, STAGE vs OTHER, STAGE ms, STAGE workspace, STAGE long, STAGE long causal, STAGE long window, STAGE masks, STAGE io, STAGE tile cost vs OTHER, STAGE bytes, bytes, ab FILE, STAGE sass, STAGE ncu, STAGE ncu vs OTHER, STAGE deterministic)")
        }
        # the bytes CSV: gpu,stage,direction,dtype,B,H,N,d,causal,kernels,dram_read_bytes,
        # dram_write_bytes,status,note; forward, non-causal rows (the last row of a shape wins)
        FILENAME == bytesf {
            if (FNR == 1 || $3 != "forward" || $9 != 0) next
            if (bgpu == "") { bgpu = $1; bdtype = $4; bh = $6; bd = $8; btok = $5 * $7 }
            k = $2 SUBSEP $7
            bst[k] = $13; bb[k] = $5; bhh[k] = $6; bdd[k] = $8; brd[k] = $11; bwr[k] = $12
            bseen[$2] = 1; bbat[$7] = $5
            if (!($7 in nbseen)) { nbseen[$7] = 1; nsb[++nb] = $7 + 0 }
            next
        }
        # the masks CSV: per stage, direction and mask (causal and the note'"'"'s mask key)
        FILENAME == masksf {
            if (FNR == 1 || $10 == 0) next
            key = mask_key($16); pat = $11 SUBSEP key
            k = $2 SUBSEP $3 SUBSEP pat
            mst[k] = $15; mms[k] = $12; mtf[k] = $13; mseen[$2] = 1
            mpat[pat] = 1; mname[pat] = mask_label($11, key)
            mfrac[k] = mask_fraction($8, $11, $16)
            if (!(pat in mpfrac) || mask_density($16) != "") mpfrac[pat] = mfrac[k]
            mrank[pat] = mask_rank($11, key, mpfrac[pat])
            if (mshape == "") mshape = "B = " $5 ", H = " $6 ", head dim " $10 ", N = " $8 ", " $4
            next
        }
        FILENAME == main || FILENAME == long {
            if (FILENAME == main && $2 == "ceiling_copy") {
                # GB/s = (bytes read + written) / time: the bytes from the note (anchors.py)
                if ($15 == "ok" && $12 > 0 && match($16, /bytes read \+ written = [0-9]+/))
                    copy_tbs = substr($16, RSTART + 23, RLENGTH - 23) / ($12 * 1e-3) / 1e12
                next
            }
            if (FNR == 1 || $2 ~ /^ceiling_/ || $4 != "bf16") next   # the protocol is bf16
            if (FILENAME == long) {
                # its series: c0 non-causal, c1 causal, c1w4096 causal with a window of 4096
                # (a block-masked row is no series of the long context)
                key = mask_key($16)
                if (key ~ /(^|; )(mask|block-mask)=/) next
                ser = "c" $11 (mask_window(key) > 0 ? "w" mask_window(key) : "")
                k = $2 SUBSEP $3 SUBSEP $8 SUBSEP ser
                lst[k] = $15; lms[k] = $12; ltf[k] = $13; lws[k] = $14
                lsers[ser] = 1; lhas[$2, ser] = 1
                if (!((ser, $8) in lseen)) { lseen[ser, $8] = 1; nsl[ser, ++nl[ser]] = $8 + 0 }
                next
            }
            k = $2 SUBSEP $3 SUBSEP $10 SUBSEP $11 SUBSEP $8   # the last row of a shape wins
            st[k] = $15; tf[k] = $13; ms[k] = $12; ws[k] = $14; B[k] = $5; H[k] = $6; Hkv[k] = $7
            seen[$2] = 1
            if ($15 == "ok") hasdir[$2, $3] = 1
            if ($10 == 128) bat[$8] = $5
            if (!($8 in nseen)) { nseen[$8] = 1; ns[++nn] = $8 + 0 }
            next
        }
        FNR == 1 {
            # sort the N values once, the sweep and the long runs (insertion sort, a few items)
            for (i = 2; i <= nn; i++) for (j = i; j > 1 && ns[j - 1] > ns[j]; j--) { x = ns[j]; ns[j] = ns[j - 1]; ns[j - 1] = x }
            for (ser in lsers)
                for (i = 2; i <= nl[ser]; i++) for (j = i; j > 1 && nsl[ser, j - 1] > nsl[ser, j]; j--) { x = nsl[ser, j]; nsl[ser, j] = nsl[ser, j - 1]; nsl[ser, j - 1] = x }
            for (i = 2; i <= nb; i++) for (j = i; j > 1 && nsb[j - 1] > nsb[j]; j--) { x = nsb[j]; nsb[j] = nsb[j - 1]; nsb[j - 1] = x }
        }
        inside && index($0, em) == 1 { inside = 0; if (!print_only) print; next }
        inside { next }
        index($0, bm) == 1 && index($0, em) != 1 {
            if (!print_only) print
            text = substr($0, length(bm) + 1)
            sub(/-->[ \t]*$/, "", text); gsub(/^[ \t]+|[ \t]+$/, "", text)
            spec(text)
            inside = 1; opened = FNR
            next
        }
        !print_only { print }
        END {
            if (inside) { printf "docs_tables: %s: the block opened on line %d has no %s\n", label, opened, em > "/dev/stderr"; bad = 1 }
            exit bad ? 2 : 0
        }' "$BYTES" "$MAIN" "$LONG" "$MASKS" "$1"
}

TMP=$(mktemp "${TMPDIR:-/tmp}/docs_tables.XXXXXX") || exit 2
trap 'rm -f "$TMP" "$TMP.out"' EXIT

case ${1:-} in
    ""|-h|--help)
        sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        [ -n "${1:-}" ] || exit 2 ;;
    --update)
        shift
        [ $# -gt 0 ] || { echo "usage: sh plots/docs_tables.sh --update FILE..." >&2; exit 2; }
        status=0
        for arg in "$@"; do
            case $arg in /*) doc=$arg ;; *) doc=$HERE/$arg ;; esac
            case $arg in *'*'*) [ -e "$doc" ] || continue ;; esac   # a glob that matched nothing
            [ -f "$doc" ] || { echo "docs_tables: no file $arg" >&2; status=2; continue; }
            grep -q "^$BEGIN_MARK" "$doc" || continue   # no markers: leave the file alone
            if ! LABEL=$arg gen "$doc" > "$TMP.out"; then
                echo "docs_tables: $arg left unchanged" >&2
                status=2
                continue
            fi
            if cmp -s "$TMP.out" "$doc"; then
                echo "docs_tables: $arg up to date"
            else
                cat "$TMP.out" > "$doc" && echo "docs_tables: updated $arg"
            fi
        done
        exit $status ;;
    -*)
        echo "usage: sh plots/docs_tables.sh [--update FILE... | 'SPEC']" >&2
        exit 2 ;;
    *)
        printf '%s %s -->\n%s\n' "$BEGIN_MARK" "$*" "$END_MARK" > "$TMP"
        PRINT_ONLY=1 LABEL="spec '$*'" gen "$TMP" ;;
esac
