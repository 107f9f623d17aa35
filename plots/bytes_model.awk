# plots/bytes_model.awk: the HBM byte models of one forward call, written down once.
# plots/docs_tables.sh (SPECs `STAGE io`, `STAGE bytes`, `bytes`) and plots/plots.sh
# (bytes.png) put this file in front of their awk programs; nothing else models bytes.
#
# What each model counts is what the code asks of memory, every load and store that leaves
# the SM, as if no cache held anything between kernels or between blocks: a lower bound
# where the code reads a thing once, an upper bound where the L2 (60 MiB on an H200) can
# return a re-read. Per head: the forward of one (batch, head), N_q = N_k = n, head dim d,
# non-causal, H_kv = H (the bench's shapes), 16-bit elements (E = 2 bytes), fp32 F = 4.
# The totals are B * H times the per-head bytes.
#
#   01_naive (stages/01_naive/attention.cu, three kernels)
#     read:  Q, K, V once (3 n d E); S (fp32) 3 times by softmax_kernel (its max, sum and
#            normalise passes: 3 n² F); P (fp32) once by output_kernel (n² F)
#     write: S (n² F) and P (n² F) once; O (n d E) and L (n F) once
#   cublas (common/cublas_baseline.cu, GEMM, softmax kernel, GEMM; rows padded to
#   ld = n rounded up to 8)
#     read:  Q, K, V once (3 n d E); S (fp32) twice by softmax_kernel (its max/sum pass and
#            its store pass: 2 n ld F); P (16-bit) once by the second GEMM (n ld E)
#     write: S (n ld F), P (n ld E), O (n d E), L (n F) once
#   02_fused (one block per Br = 2 query rows, no tile loop over keys)
#     read:  Q once (n d E); K and V in full by every block (2 n d E ceil(n / 2))
#     write: O (n d E) and L (n F) once
#     (requested bytes: blocks in flight share one head's K and V, which the L2 holds; no
#     measured row to compare with)
#   03_tiled, and 04_backward's forward (the same code): K/V tiles of Bc = 64 keys outer,
#   Tc = ceil(n / 64) of them
#     read:  K and V once (2 n d E); Q once per K/V tile (Tc n d E); O (fp32), l and m on
#            every tile but the first ((Tc - 1)(n d F + 2 n F))
#     write: O (fp32), l and m on every tile but the last ((Tc - 1)(n d F + 2 n F)); the
#            final O (n d E) and L (n F)
#   05_tensor_cores: the same as 03_tiled with Bc = 16384 / d keys a tile (128 at d = 128)
#   06_fa2: query tiles of 128 rows outer
#     read:  Q once (n d E); K and V once per query tile (2 n d E ceil(n / 128))
#     write: O (n d E) and L (n F) once
#     (a model without a cache: the blocks of one head run together and the L2 returns
#     nearly every K/V re-read, so the DRAM counts fall to about bm_once's)
# Against Nsight Compute's DRAM counts (plots/results/*-bytes.csv: d = 128, N = 1024, 4096,
# 16384): 03_tiled and 05_tensor_cores within 1%; cublas within 1% at N >= 4096; 01_naive's
# writes within 3%, its reads 2% under the model at N = 4096 and 54% above it at N = 16384
# (not traced: most likely output_kernel's re-reads of V, whose blocks in flight span all H
# heads of a batch row, 64 MiB of V at N = 16384, more than the L2 holds). At N = 1024,
# 01_naive and cublas read 34-44% less than modelled: a 4 KiB row of S is still in the L2
# when the softmax passes over it again. 06_fa2 moves about bm_once's bytes, 1.6-21% of
# its model.
#
# Functions (the names start with bm_; locals are the extra parameters):
#   bm_has(s)                     1 when stage s has a model
#   bm_read(s, b, h, n, d)        bytes read, or -1 without a model
#   bm_write(s, b, h, n, d)       bytes written, or -1
#   bm_total(s, b, h, n, d)       read + written, or -1
#   bm_once(b, h, n, d, with_l)   Q, K, V read and O written once (4 n d E a head), + L if with_l
#   bm_terms(s, d)                the model in words, for a table's caption
#   bm_extra(s, d)                short name of the traffic beyond bm_once (a column header)

function bm_ceil(x, y) { return int((x + y - 1) / y) }

function bm_has(s) {
    return s == "01_naive" || s == "02_fused" || s == "03_tiled" || s == "04_backward" ||
           s == "05_tensor_cores" || s == "06_fa2" || s == "cublas"
}

# K/V tile of the FA-1 stages (keys per outer step)
function bm_bc(s, d) { return s == "05_tensor_cores" ? int(16384 / d) : 64 }

# bytes one head reads ("read") or writes ("write"); -1 without a model
function bm_head(s, n, d, what,   E, F, nd, tc, trip, ld, r, w) {
    E = 2; F = 4; nd = n * d
    if (s == "03_tiled" || s == "04_backward" || s == "05_tensor_cores") {
        tc = bm_ceil(n, bm_bc(s, d))
        trip = (tc - 1) * (nd * F + 2 * n * F)
        r = 2 * nd * E + tc * nd * E + trip
        w = trip + nd * E + n * F
    } else if (s == "06_fa2") {
        r = nd * E + 2 * nd * E * bm_ceil(n, 128)
        w = nd * E + n * F
    } else if (s == "02_fused") {
        r = nd * E + 2 * nd * E * bm_ceil(n, 2)
        w = nd * E + n * F
    } else if (s == "01_naive") {
        r = 3 * nd * E + 3 * n * n * F + n * n * F
        w = 2 * n * n * F + nd * E + n * F
    } else if (s == "cublas") {
        ld = bm_ceil(n, 8) * 8
        r = 3 * nd * E + 2 * n * ld * F + n * ld * E
        w = n * ld * F + n * ld * E + nd * E + n * F
    } else return -1
    return what == "read" ? r : w
}

function bm_read(s, b, h, n, d,   v) { v = bm_head(s, n, d, "read"); return v < 0 ? -1 : b * h * v }
function bm_write(s, b, h, n, d,   v) { v = bm_head(s, n, d, "write"); return v < 0 ? -1 : b * h * v }
function bm_total(s, b, h, n, d) {
    return bm_has(s) ? bm_read(s, b, h, n, d) + bm_write(s, b, h, n, d) : -1
}
function bm_once(b, h, n, d, with_l) { return b * h * (4 * n * d * 2 + (with_l ? 4 * n : 0)) }

function bm_terms(s, d) {
    if (s == "01_naive")
        return "Q, K, V read once; S (fp32) written once and read 3 times (softmax's max, sum, normalise); P (fp32) written once and read once; O and L written once"
    if (s == "cublas")
        return "Q, K, V read once; S (fp32) written once and read twice (the softmax's two passes); P (16-bit) written once and read once; O and L written once"
    if (s == "02_fused")
        return "Q read once; K and V read in full by every block of Br = 2 query rows (requested bytes: mostly L2 hits); O and L written once"
    if (s == "03_tiled" || s == "04_backward" || s == "05_tensor_cores")
        return "K/V tiles of Bc = " bm_bc(s, d) " keys outer (Tc = ⌈N/" bm_bc(s, d) "⌉): K, V read once; Q read once per K/V tile; O (fp32), l, m read on every tile but the first and written on every tile but the last; O and L written once" (s == "04_backward" ? " (03_tiled's forward)" : "")
    if (s == "06_fa2")
        return "query tiles of 128 rows outer: Q read once; K and V read once per query tile (no cache); O and L written once"
    return "no model"
}

function bm_extra(s, d) {
    if (s == "01_naive") return "S, P (fp32)"
    if (s == "cublas") return "S (fp32), P (16-bit)"
    if (s == "02_fused") return "K, V re-read per Q tile (Br = 2)"
    if (s == "03_tiled" || s == "04_backward" || s == "05_tensor_cores")
        return "Q re-read per K/V tile, O, l, m round trips (Bc = " bm_bc(s, d) ")"
    if (s == "06_fa2") return "K, V re-read per Q tile (Br = 128)"
    return "-"
}
