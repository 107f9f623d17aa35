# plots/masks.awk: which mask a CSV row was measured with, in awk functions shared by
# plots/bench.sh (the merge key, the summary), plots/plots.sh (masks.png, long_context.png),
# plots/docs_tables.sh and plots/readme_table.sh; each of them prepends this file to its awk
# program (MASKS_AWK=$(cat plots/masks.awk)), as it does with plots/bytes_model.awk.
#
# The CSV has no mask columns. A row of a masked run says which mask first thing in its note
# (common/cli.c writes a stage's, plots/anchors.py torch_flex's), in this order:
#   "window=W; "             a sliding window of W keys (--window W)
#   "mask=PATTERN; "         a block mask made from --mask PATTERN (its commas written '+')
#   "block-mask=FILE; "      or read from --block-mask FILE (its name, without the directory)
#   "block-mask density=X; " the fraction of (query, key) pairs visible, which the TFLOP/s count
# and then the rest of the note (a refusal's reason, the torch version, ...). A dense row has
# none of them. The mask of a row is its causal flag (column 11) with its mask key below.

# mask_key(note): the note's leading window=, mask= and block-mask= fields, as written, each
# with its "; " ("window=1024; ", "mask=random:0.1; "); "" for a dense row. The density field
# is skipped: it is what the mask gives, not which mask it is (a row the bench writes for a
# crash has no density), so the rows of one mask share one key with or without it.
function mask_key(note,   f, n, i, k) {
    n = split(note, f, "; ")
    k = ""
    for (i = 1; i < n; i++) {
        if (f[i] ~ /^(window|mask|block-mask)=/) k = k f[i] "; "
        else if (f[i] !~ /^block-mask density=/) break
    }
    return k
}

# mask_density(note): X of the note's "block-mask density=X; ", or "" when it has none
function mask_density(note,   f, n, i) {
    n = split(note, f, "; ")
    for (i = 1; i < n; i++) {
        if (f[i] ~ /^block-mask density=/) return substr(f[i], 20) + 0
        if (f[i] !~ /^(window|mask|block-mask)=/) break
    }
    return ""
}

# mask_window(key): W of a key's "window=W; ", 0 without one
function mask_window(key) {
    return match(key, /window=[0-9]+/) ? substr(key, RSTART + 7, RLENGTH - 7) + 0 : 0
}

# mask_label(causal, key): the mask in words: "dense", "dense causal", "random 0.5",
# "causal window 1024", "causal window 1024 random 0.1", "block_mask.npy"
function mask_label(causal, key,   f, n, i, l) {
    if (key == "") return causal ? "dense causal" : "dense"
    n = split(key, f, "; ")
    l = causal ? "causal" : ""
    for (i = 1; i < n; i++) {
        sub(/^(window|mask|block-mask)=/, (f[i] ~ /^window=/ ? "window " : ""), f[i])
        gsub(/:/, " ", f[i])
        l = l (l == "" ? "" : " ") f[i]
    }
    return l
}

# mask_pairs(n, causal, w): the visible (query, key) pairs of one head of N = n queries and
# keys as the harness counts them (common/problem.c attn_flops): with a window w > 0 exactly,
# causal alone n^2 / 2, else n^2
function mask_pairs(n, causal, w,   i, lo, hi, s) {
    if (w <= 0) return causal ? n * n / 2 : n * n
    s = 0
    for (i = 0; i < n; i++) {
        lo = i - w + 1 > 0 ? i - w + 1 : 0
        hi = causal ? i + 1 : (i + w < n ? i + w : n)
        if (hi > lo) s += hi - lo
    }
    return s
}

# mask_fraction(n, causal, note): the fraction of pairs a row's mask leaves visible: the
# note's density with a block mask, else mask_pairs over n^2
function mask_fraction(n, causal, note,   x) {
    x = mask_density(note)
    if (x != "") return x
    return mask_pairs(n, causal, mask_window(mask_key(note))) / (n * n)
}

# mask_rank(causal, key, fraction): the order of the masks in tables and figures: dense, dense
# causal, the block masks from the densest down, then the windows alone, the widest first
function mask_rank(causal, key, fraction) {
    if (key == "") return causal
    if (key ~ /(^|; )(mask|block-mask)=/) return 2 + (1 - fraction)
    return 4 + (1 - fraction)
}
