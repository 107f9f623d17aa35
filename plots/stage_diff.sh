#!/bin/sh
# plots/stage_diff.sh: a stage's lesson as a diff against its parent (`make diff STAGE=n`), and
# the README's table of what every diff costs (`make plots`).
#
#   sh plots/stage_diff.sh N        the unified diff of stage N's attention.cu against its parent's,
#                                   then the definitions of common/ (functions, macros, the wgmma
#                                   shapes) that stage N uses and its parent does not, as added lines
#   sh plots/stage_diff.sh --table  the Markdown table: stage, parent, lines added / removed in
#                                   that diff, lines of common/ it adds, the idea (the stage's
#                                   one-line summary, the second field of its attn_stage)
#   sh plots/stage_diff.sh --parents  "STAGE PARENT" of every stage, one a line
#   sh plots/stage_diff.sh --update FILE   regenerate FILE's block between `<!-- diffs:begin -->`
#                                   and `<!-- diffs:end -->` with the table
# The parent is the stage the header names after "Changed from" in its first lines, else the
# stage numbered one less. When the parent has a backward pass ("/* ---- Backward" up to
# check(), and its backward()) and the stage has none, that part of the parent is left out of
# the diff and counted apart: a forward-only stage's diff shows its forward's change.
set -u
HERE=$(pwd)
cd "$(dirname "$0")/.." || exit 2
S=${STAGES_DIR:-stages}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/stage_diff.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT

stage_dir() { ls -d "$S"/"$(printf %02d "$1")"_*/ 2>/dev/null | head -n 1 | sed 's|/$||'; }

# parent DIR: the parent stage's directory
parent() {
    p=$(sed -n '1,12s/.*Changed from \([0-9][0-9]_[a-z0-9_]*\).*/\1/p' "$1/attention.cu" | head -n 1)
    if [ -n "$p" ]; then echo "$S/$p"; return; fi
    pn=$(basename "$1" | cut -c1-2 | sed 's/^0//')
    stage_dir $((pn - 1))
}

has_backward() { grep -q '^/\* ---- Backward' "$1/attention.cu"; }

# parent_source CHILD PARENT: the parent's source as the child's diff reads it (see above)
parent_source() {
    if has_backward "$2" && ! has_backward "$1"; then
        awk '/^\/\* ---- Backward/ { skip = 1 } /^static int check\(/ { skip = 0 }
             /^static cudaError_t backward\(/ { fn = 1 }
             !skip && !fn { print } fn && /^}/ { fn = 0 }' "$2/attention.cu"
    else
        cat "$2/attention.cu"
    fi
}

# defs FILE: "name<TAB>first line<TAB>last line" of every definition in a common/ header
defs() {
    awk '
        function out(n, a, b) { printf "%s\t%d\t%d\n", n, a, b }
        /^\/\*/ && !open { cstart = NR }
        /^WGMMA_(SS|RS)_FN\(/ {
            split($0, f, /[(,]/); k = ($0 ~ /^WGMMA_SS/) ? "ss" : "rs"
            out("wgmma_" k "_n" f[2], NR, NR); if (k == "ss") out("wgmma_ss_first_n" f[2], NR, NR); next
        }
        /^#define [A-Za-z_][A-Za-z0-9_]*/ {
            n = $2; sub(/\(.*/, "", n); a = NR; while ($0 ~ /\\$/) { getline; }
            out(n, a, NR); next
        }
        /^static .*[A-Za-z_][A-Za-z0-9_]*\(/ && !open {
            n = $0; sub(/\(.*/, "", n); sub(/.*[ *]/, "", n)
            start = (cstart && cend == NR - 1) ? cstart : NR; open = 1
        }
        /^\*\/|\*\/$/ && !open { cend = NR }
        open && /^}/ { out(n, start, NR); open = 0 }
    ' "$1"
}

# used NAME FILE: whether FILE uses NAME as a word
used() { grep -q "\\b$1\\b" "$2"; }

# own NAME FILE: whether FILE defines a function or macro NAME of its own (then a common/
# definition of that name is not what it uses)
own() { grep -q -E "^(static .*[ *]$1\\(|#define $1\\b)" "$2"; }

# common_added CHILD PARENT: the common/ definitions CHILD's source uses and PARENT's does not,
# as "+"-lines under a "+++ file: names" heading; lines counted into $TMP/common_n
common_added() {
    : > "$TMP/common_n"
    for h in common/*.cuh common/*.h; do
        [ -f "$h" ] || continue
        defs "$h" > "$TMP/defs"
        names= body=
        while IFS="$(printf '\t')" read -r dname a b; do
            used "$dname" "$1/attention.cu" || continue
            own "$dname" "$1/attention.cu" && continue
            used "$dname" "$2/attention.cu" && continue
            names="$names $dname"
            sed -n "${a},${b}p" "$h" | sed 's/^/+/' >> "$TMP/body.$$"
        done < "$TMP/defs"
        if [ -n "$names" ]; then
            echo "+++ $h: used by $(basename "$1"), not by $(basename "$2"):$names"
            cat "$TMP/body.$$"
            grep -c '' "$TMP/body.$$" >> "$TMP/common_n"
        fi
        rm -f "$TMP/body.$$"
    done
}

diff_of() {
    d=$(stage_dir "$1")
    [ -n "$d" ] || { echo "no stage $(printf %02d "$1") under $S/" >&2; return 2; }
    p=$(parent "$d")
    [ -n "$p" ] && [ -f "$p/attention.cu" ] || { echo "no parent stage of $d under $S/" >&2; return 2; }
    parent_source "$d" "$p" > "$TMP/parent.cu"
    if has_backward "$p" && ! has_backward "$d"; then
        echo "# $(basename "$p")'s backward pass is left out of this diff: $(basename "$d") has none"
    fi
    diff -u --label "$p/attention.cu" --label "$d/attention.cu" "$TMP/parent.cu" "$d/attention.cu"
    [ $? -le 1 ] || return 2
    c=$(common_added "$d" "$p")
    if [ -n "$c" ]; then
        echo
        echo "# common/: what $(basename "$d") uses that $(basename "$p") does not"
        printf '%s\n' "$c"
    fi
    return 0
}

table() {
    echo "| stage | parent | diff: added / removed | common/ added | the idea (the stage's summary) |"
    echo "|---|---|--:|--:|---|"
    for d in "$S"/[0-9][0-9]_*/; do
        d=${d%/}
        n=$(basename "$d" | cut -c1-2)
        name=$(basename "$d")
        idea=$(awk -v n="\"$name\"," 'f { sub(/^ */, ""); sub(/",?$/, ""); sub(/^"/, ""); print; exit } { t = $0; sub(/^ */, "", t) } t == n { f = 1 }' "$d/attention.cu")
        if [ "$n" = 01 ]; then
            echo "| \`$name\` | - | $(grep -c '' "$d/attention.cu") / 0 | - | $idea |"
            continue
        fi
        p=$(parent "$d")
        parent_source "$d" "$p" > "$TMP/parent.cu"
        set -- $(diff "$TMP/parent.cu" "$d/attention.cu" | awk '/^>/ { a++ } /^</ { r++ } END { print a + 0, r + 0 }')
        extra=
        if has_backward "$p" && ! has_backward "$d"; then
            extra=" (+ $(( $(grep -c '' "$p/attention.cu") - $(grep -c '' "$TMP/parent.cu") )) of the parent's backward, removed)"
        fi
        common_added "$d" "$p" > /dev/null
        cl=$(awk '{ s += $1 } END { print s + 0 }' "$TMP/common_n")
        echo "| \`$name\` | \`$(basename "$p")\` | +$1 / -$2$extra | $([ "$cl" = 0 ] && echo - || echo "+$cl") | $idea |"
    done
    echo
    echo "*Generated by \`plots/stage_diff.sh\` (\`make plots\`) from the sources; \`make diff STAGE=n\` prints each diff.*"
}

case ${1:-} in
    --table) table ;;
    --parents)   # "STAGE PARENT", one a line (plots/plots.sh: speedup.png's steps)
        for d in "$S"/[0-9][0-9]_*/; do
            d=${d%/}
            p=$(parent "$d")
            echo "$(basename "$d") $([ -n "$p" ] && basename "$p" || echo -)"
        done ;;
    --update)
        shift
        for f in "$@"; do
            case $f in /*) ;; *) f=$HERE/$f ;; esac
            grep -q '^<!-- diffs:begin -->' "$f" || continue
            table > "$TMP/table"
            awk -v t="$TMP/table" '
                /^<!-- diffs:begin -->/ { print; print ""; while ((getline l < t) > 0) print l; print ""; skip = 1; next }
                /^<!-- diffs:end -->/ { skip = 0 }
                !skip' "$f" > "$TMP/out" && { cmp -s "$TMP/out" "$f" || cat "$TMP/out" > "$f"; }
        done ;;
    [0-9]*) diff_of "$(echo "$1" | sed 's/^0*//')" ;;
    *) echo "usage: sh plots/stage_diff.sh N | --table | --update FILE" >&2; exit 2 ;;
esac
