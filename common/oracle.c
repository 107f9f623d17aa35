/* common/oracle.c: the reference. Plain float64 attention on the CPU, row by row, from
 * the same rounded 16-bit inputs the GPU sees (e4m3: the values its inputs stand for, each
 * e4m3 value times its scale):
 *   forward   S = scale Q K^T (masked: causal, window), L_i = log sum_j exp(S_ij), O = P V
 *             with P_ij = exp(S_ij - L_i)
 *   backward  D_i = dO_i . O_i (float64 O of the oracle), dP_ij = dO_i . V_j,
 *             dS_ij = P_ij (dP_ij - D_i), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO,
 *             dK and dV summed over the query heads that share a key/value head (GQA).
 * Alongside each element it computes the size of the terms summed into it,
 * m = sqrt(sum of term^2) (terms P_ij V_jc for O, scale dS_ij K_jc for dQ, ...): the scale of
 * the rounding error a kernel makes in that sum, used by the tolerance (check.c); for dQ
 * and dK it includes the error of D computed from a 16-bit O, as kernels do. For e4m3 it also
 * computes, per query row, the size of the addends of its scores (attn_ref.lse_m), the scale of
 * the fp8 tensor cores' error in L, and from it a bound on that error's share in O
 * (attn_ref.o_acc, a second pass over the row's keys once O is known).
 * Work is split by rows over a few pthreads. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

int attn_oracle_threads = 0;

/* Beyond this many multiply-adds of one S (B*H*N_q*N_k*d), check a sample of rows. */
#define FULL_CHECK_COST 2e9
/* Sampled backward: the full forward of the chosen heads may cost at most this much. */
#define SAMPLED_BWD_COST 8e9
#define SAMPLE_ROWS 64       /* rows per head in a sample */
#define SAMPLE_UNITS 2       /* kv heads (with their query heads) in a sampled backward */
/* an assisted backward (D from the run's O) costs the oracle G N_q N_k d for L of every row of
 * its one chosen kv head, plus G N_q d per sampled key row and N_k d per sampled query row;
 * beyond this many multiply-adds (about a minute and a half on 16 cores) it is skipped */
#define ASSISTED_BWD_COST 3e12

void attn_sample_all(attn_sample *s)
{
    memset(s, 0, sizeof *s);
}

void attn_sample_free(attn_sample *s)
{
    free(s->mask_q); free(s->mask_kv); free(s->mask_unit);
    memset(s, 0, sizeof *s);
}

static double cost_of(const attn_problem *p)
{
    return (double)p->B * p->H * (double)p->N_q * p->N_k * p->d;
}

/* Mark up to SAMPLE_ROWS rows of one head: first and last row always (edge tiles), the rest
 * uniformly at random. mask[(b*N + i)*heads + h]. Returns the number marked. */
static size_t sample_head(unsigned char *mask, int b, int h, int N, int heads, attn_rng *r)
{
    size_t base = (size_t)b * N;
    if (N <= SAMPLE_ROWS) {
        for (int i = 0; i < N; i++) mask[(base + i) * heads + h] = 1;
        return (size_t)N;
    }
    size_t n = 0;
    int first = 0, last = N - 1;
    mask[(base + first) * heads + h] = 1;
    mask[(base + last) * heads + h] = 1;
    n = 2;
    while (n < SAMPLE_ROWS) {
        int i = (int)(attn_rng_u64(r) % (uint64_t)N);
        unsigned char *m = &mask[(base + i) * heads + h];
        if (!*m) { *m = 1; n++; }
    }
    return n;
}

void attn_sample_choose(attn_sample *s, const attn_problem *p, attn_dir dir, uint64_t seed)
{
    attn_sample_all(s);
    size_t nrow_q = (size_t)p->B * p->N_q * p->H, nrow_kv = (size_t)p->B * p->N_k * p->H_kv;
    s->rows_q = nrow_q;
    s->rows_kv = dir == ATTN_BACKWARD ? nrow_kv : 0;
    if (cost_of(p) <= FULL_CHECK_COST) {
        snprintf(s->note, sizeof s->note, "checked all %d rows per head", p->N_q);
        return;
    }
    attn_rng r;
    attn_rng_init(&r, seed ^ 0x5A5A5A5A12345678ull);
    s->sampled = 1;
    s->mask_q = calloc(nrow_q, 1);
    if (!s->mask_q) goto oom;
    if (dir == ATTN_FORWARD) {
        s->rows_q = 0;
        for (int b = 0; b < p->B; b++)
            for (int h = 0; h < p->H; h++) s->rows_q += sample_head(s->mask_q, b, h, p->N_q, p->H, &r);
        snprintf(s->note, sizeof s->note, "checked %d of %d rows per head (sampled)",
                 p->N_q < SAMPLE_ROWS ? p->N_q : SAMPLE_ROWS, p->N_q);
        return;
    }
    /* backward: dK_j, dV_j need P and dS of every query row, hence L and D of every row of
     * the heads involved: restrict the check to a few kv heads and their query heads */
    int G = p->H / p->H_kv, units = p->B * p->H_kv;
    double unit_cost = (double)G * p->N_q * (double)p->N_k * p->d;
    int nu = (int)(SAMPLED_BWD_COST / unit_cost);
    if (nu > SAMPLE_UNITS) nu = SAMPLE_UNITS;
    if (nu > units) nu = units;
    if (nu < 1) {   /* one kv head; D of its unsampled rows from the run's O (attn_oracle) */
        nu = 1;
        const double cost = unit_cost +
                            (double)SAMPLE_ROWS * ((double)G * p->N_q + (double)G * p->N_k) * p->d;
        if (cost > ASSISTED_BWD_COST) {
            s->skipped = 1;
            s->rows_q = s->rows_kv = 0;
            snprintf(s->note, sizeof s->note,
                     "backward check skipped for size: even with D from the run, one kv head's L and "
                     "its sampled rows need %.1e multiply-adds in the float64 oracle (limit %.0e)", cost,
                     ASSISTED_BWD_COST);
            return;
        }
        s->assisted = 1;
    }
    s->mask_kv = calloc(nrow_kv, 1);
    s->mask_unit = calloc((size_t)units, 1);
    if (!s->mask_kv || !s->mask_unit) goto oom;
    int chosen = 0;
    while (chosen < nu) {
        int u = (int)(attn_rng_u64(&r) % (uint64_t)units);
        if (s->mask_unit[u]) continue;
        s->mask_unit[u] = 1;
        chosen++;
    }
    s->rows_q = s->rows_kv = 0;
    for (int u = 0; u < units; u++) {
        if (!s->mask_unit[u]) continue;
        int b = u / p->H_kv, g = u % p->H_kv;
        s->rows_kv += sample_head(s->mask_kv, b, g, p->N_k, p->H_kv, &r);
        for (int h = g * G; h < (g + 1) * G; h++)
            s->rows_q += sample_head(s->mask_q, b, h, p->N_q, p->H, &r);
    }
    snprintf(s->note, sizeof s->note,
             "checked %d of %d kv heads; %d of %d query rows and %d of %d key rows per head "
             "(sampled)%s", nu, units, p->N_q < SAMPLE_ROWS ? p->N_q : SAMPLE_ROWS, p->N_q,
             p->N_k < SAMPLE_ROWS ? p->N_k : SAMPLE_ROWS, p->N_k,
             s->assisted ? "; the gradients take D = rowsum(dO O) from this run's O (one head's "
                           "float64 forward is too big; O is checked on the sampled rows) and L "
                           "from the oracle" : "");
    return;
oom:
    attn_sample_free(s);
    s->skipped = 1;
    snprintf(s->note, sizeof s->note, "check skipped: out of host memory for the sample masks");
}

void attn_ref_free(attn_ref *r)
{
    free(r->o); free(r->lse); free(r->lse_m); free(r->dq); free(r->dk); free(r->dv);
    free(r->o_m); free(r->o_acc); free(r->dq_m); free(r->dk_m); free(r->dv_m);
    memset(r, 0, sizeof *r);
}

/* ---- the computation --------------------------------------------------------------- */

typedef struct {
    const attn_problem *p;
    const attn_sample *s;
    int G;                              /* query heads per kv head */
    const float *q, *k, *v, *d_o;       /* inputs as float (exact) */
    attn_ref *r;
    double *D;                          /* [B*N_q*H] row index space */
    double *mD;                         /* term magnitude of D: sqrt(sum_c (dO_c O_c)^2) */
    unsigned char *need_fwd;            /* [B*N_q*H] rows whose forward is computed */
    double *own_lse;                    /* assisted: L of every row of the chosen heads (lse_row) */
    const unsigned char *bmask;         /* the block mask (p->block_mask), or NULL */
} octx;

/* whether the block mask lets query i of (b, h) see key j (the interval of causal and window
 * is the loops' bounds) */
static int tile_on(const octx *c, int b, int h, int i, int j)
{
    return !c->bmask || attn_mask_at(c->p, c->bmask, b, h, i / ATTN_MASK_TILE, j / ATTN_MASK_TILE);
}

/* L of query row (b, h, i) for the gradients: from the forward, or (assisted) from lse_row */
static double lse_of(const octx *c, size_t idx)
{
    return c->own_lse ? c->own_lse[idx] : c->r->lse[idx];
}

static double dot(const float *a, const float *b, int d)
{
    /* four independent partial sums: the loop runs at several multiply-adds per cycle */
    double acc[4] = { 0.0, 0.0, 0.0, 0.0 };
    int c = 0;
    for (; c + 4 <= d; c += 4)
        for (int k = 0; k < 4; k++) acc[k] += (double)a[c + k] * (double)b[c + k];
    for (; c < d; c++) acc[0] += (double)a[c] * (double)b[c];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* The size of the addends of a . b as an fp8 wgmma sums them: the largest addend of each
 * k-step (the partial sum of the steps before, or one of its ATTN_E4M3_KSTEP products),
 * summed over the steps. A step truncates its addends to 13 fraction bits of its largest. */
static double kstep_addends(const float *a, const float *b, int d)
{
    double acc = 0.0, t = 0.0;
    for (int c0 = 0; c0 < d; c0 += ATTN_E4M3_KSTEP) {
        double big = fabs(acc);
        for (int c = c0; c < c0 + ATTN_E4M3_KSTEP && c < d; c++) {
            const double x = (double)a[c] * (double)b[c];
            if (fabs(x) > big) big = fabs(x);
            acc += x;
        }
        t += big;
    }
    return t;
}

static const float *qrow(const octx *c, const float *x, int b, int i, int h)
{
    const attn_problem *p = c->p;
    return x + (((size_t)b * p->N_q + i) * p->H + h) * p->d;
}

static const float *kvrow(const octx *c, const float *x, int b, int j, int g)
{
    const attn_problem *p = c->p;
    return x + (((size_t)b * p->N_k + j) * p->H_kv + g) * p->d;
}

/* e4m3: the fp8 accumulator's share in O (attn_ref.o_acc). Score j of row i is off by at most
 * e_j = c_acc u_acc scale sum_s a_ijs (L's rule, check.c; acc_err), in the units of S. With
 * the kernel's P~_j = P_j e^{dS_j} / Z, Z = sum_k P_k e^{dS_k} >= Z_lo = sum_k P_k e^{-e_k}:
 *     O~_i - O_i = sum_j (P~_j - P_j) (V_j - O_i) = sum_j P_j (e^{dS_j} - 1) (V_j - O_i) / Z
 * (sum_j P_j (V_j - O_i) = 0), so |O~_ic - O_ic| is at most each of
 *     x1 = sum_j P_j (e^{e_j} - 1) |V_jc - O_ic| / Z_lo     (to first order c_acc u_acc scale
 *                                                           sum_j P_j (sum_s a_ijs) |V_jc - O_ic|)
 *     x2 = sum_j min(1, P_j e^{e_j} / Z_lo) |V_jc - O_ic|   (|P~_j - P_j| <= max(P~_j, P_j))
 *     max_j V_jc - min_j V_jc                               (O~_i and O_i are means of the V_j)
 * and the least of them is the bound. On normal inputs e_j is about 10^-3 and x1 is its first
 * order; with large logits (scores of order 10^4) e_j is tens, two keys whose scores lie a few
 * units apart can swap (tests/test_fp8.c), and x2 keeps to the keys within reach of the
 * largest score. */
#define ACC_EXP_MAX 300.0   /* past it V's range only: below, P_j e^{e_j} / Z_lo <= N e^{2 e_max} */

static double acc_err(const attn_problem *p, double addends)
{
    return ATTN_TOL_C_ACC * ATTN_U_ACC * (double)p->scale * addends;
}

/* x: 4 d doubles, x1, x2, min and max of V_jc over the keys (acc_row reads them) */
static void acc_begin(double *x, int d)
{
    for (int e = 0; e < 2 * d; e++) x[e] = 0.0;
    for (int e = 0; e < d; e++) {
        x[2 * d + e] = INFINITY;
        x[3 * d + e] = -INFINITY;
    }
}

/* key j (probability pj, error bound ej) of a row with Z_lo = zlo, the largest e_j emax */
static void acc_key(double *x, const double *o, const float *vj, double pj, double ej, double zlo,
                    double emax, int d)
{
    const int big = emax > ACC_EXP_MAX;
    const double w1 = big ? 0.0 : pj * expm1(ej) / zlo, w2 = big ? 0.0 : fmin(1.0, pj * exp(ej) / zlo);
    for (int e = 0; e < d; e++) {
        const double dv = fabs(vj[e] - o[e]);
        x[e] += w1 * dv;
        x[d + e] += w2 * dv;
        if (vj[e] < x[2 * d + e]) x[2 * d + e] = vj[e];
        if (vj[e] > x[3 * d + e]) x[3 * d + e] = vj[e];
    }
}

/* the bound into oa, over c_acc u_acc: check.c multiplies O's term back as it does L's t */
static void acc_row(double *oa, const double *x, double emax, int d)
{
    for (int e = 0; e < d; e++) {
        const double lo = x[2 * d + e], hi = x[3 * d + e], range = hi >= lo ? hi - lo : 0.0;
        const double bound = emax > ACC_EXP_MAX ? range : fmin(fmin(x[e], x[d + e]), range);
        oa[e] = bound / (ATTN_TOL_C_ACC * ATTN_U_ACC);
    }
}

/* forward of query row r = (b*N_q + i)*H + h; scratch holds N_k + 4 d doubles */
static void fwd_row(octx *c, size_t r, double *s)
{
    const attn_problem *p = c->p;
    int h = (int)(r % p->H), i = (int)((r / p->H) % p->N_q), b = (int)(r / p->H / p->N_q);
    int g = h / c->G, d = p->d, lo, hi;
    attn_visible_keys(p, i, &lo, &hi);   /* none: m = -inf, l = 0: O = 0, L = -inf */
    const float *qi = qrow(c, c->q, b, i, h);
    double m = -INFINITY;
    for (int j = lo; j < hi; j++) {
        if (!tile_on(c, b, h, i, j)) continue;
        s[j] = (double)p->scale * dot(qi, kvrow(c, c->k, b, j, g), d);
        if (s[j] > m) m = s[j];
    }
    double l = 0.0;
    for (int j = lo; j < hi; j++)
        if (tile_on(c, b, h, i, j)) { s[j] = exp(s[j] - m); l += s[j]; }
    double *o = c->r->o + r * d, *om = c->r->o_m + r * d, t = 0.0, zlo = 0.0, emax = 0.0;
    for (int e = 0; e < d; e++) o[e] = om[e] = 0.0;
    for (int j = lo; j < hi; j++) {
        if (!tile_on(c, b, h, i, j)) continue;
        const float *vj = kvrow(c, c->v, b, j, g);
        double pj = s[j] / l;
        for (int e = 0; e < d; e++) {
            o[e] += pj * vj[e];
            om[e] += (pj * vj[e]) * (pj * vj[e]);
        }
        if (c->r->lse_m) {
            const double a = kstep_addends(qi, kvrow(c, c->k, b, j, g), d), ej = acc_err(p, a);
            t += pj * a;
            zlo += pj * exp(-ej);
            emax = fmax(emax, ej);
        }
    }
    for (int e = 0; e < d; e++) om[e] = sqrt(om[e]);
    if (c->r->o_acc) {   /* a second pass, O_i known; the addends again (cheaper than storing them) */
        double *x = s + p->N_k;
        acc_begin(x, d);
        for (int j = lo; j < hi; j++) {
            if (!tile_on(c, b, h, i, j)) continue;
            const float *kj = kvrow(c, c->k, b, j, g), *vj = kvrow(c, c->v, b, j, g);
            acc_key(x, o, vj, s[j] / l, acc_err(p, kstep_addends(qi, kj, d)), zlo, emax, d);
        }
        acc_row(c->r->o_acc + r * d, x, emax, d);
    }
    c->r->lse[((size_t)b * p->H + h) * p->N_q + i] = m + log(l);
    if (c->r->lse_m) c->r->lse_m[((size_t)b * p->H + h) * p->N_q + i] = (double)p->scale * t;
    if (c->D) {
        const float *doi = qrow(c, c->d_o, b, i, h);
        double D = 0.0, mD = 0.0;
        for (int e = 0; e < d; e++) {
            D += (double)doi[e] * o[e];
            mD += ((double)doi[e] * o[e]) * ((double)doi[e] * o[e]);
        }
        c->D[r] = D;
        c->mD[r] = sqrt(mD);
    }
}

/* The forward of the sampled rows of head (b, h), `rows` of them (row indices in rs[]), with
 * K and V read once for all of them instead of once per row: a loop interchange of fwd_row,
 * which keeps each row's own order of operations, so every result is bitwise fwd_row's. At
 * N = 10^6 a row-by-row pass streams a head's K and V (1 GiB) once per sampled row.
 * s holds rows x (N_k + 4 d) doubles. */
static void fwd_rows(octx *c, const size_t *rs, int rows, double *s)
{
    const attn_problem *p = c->p;
    const int d = p->d, Nk = p->N_k;
    const int h = (int)(rs[0] % p->H), b = (int)(rs[0] / p->H / p->N_q), g = h / c->G;
    double m[SAMPLE_ROWS], l[SAMPLE_ROWS], tm[SAMPLE_ROWS], zlo[SAMPLE_ROWS], emax[SAMPLE_ROWS];
    int lo[SAMPLE_ROWS], hi[SAMPLE_ROWS], row[SAMPLE_ROWS];
    const float *qi[SAMPLE_ROWS];
    for (int t = 0; t < rows; t++) {
        const int i = (int)((rs[t] / p->H) % p->N_q);
        attn_visible_keys(p, i, &lo[t], &hi[t]);
        row[t] = i;
        qi[t] = qrow(c, c->q, b, i, h);
        m[t] = -INFINITY;
        l[t] = tm[t] = zlo[t] = emax[t] = 0.0;
    }
    for (int j = 0; j < Nk; j++) {
        const float *kj = kvrow(c, c->k, b, j, g);
        for (int t = 0; t < rows; t++) {
            if (j < lo[t] || j >= hi[t] || !tile_on(c, b, h, row[t], j)) continue;
            double *st = s + (size_t)t * Nk;
            st[j] = (double)p->scale * dot(qi[t], kj, d);
            if (st[j] > m[t]) m[t] = st[j];
        }
    }
    for (int t = 0; t < rows; t++) {
        double *st = s + (size_t)t * Nk;
        for (int j = lo[t]; j < hi[t]; j++)
            if (tile_on(c, b, h, row[t], j)) { st[j] = exp(st[j] - m[t]); l[t] += st[j]; }
        double *o = c->r->o + rs[t] * d, *om = c->r->o_m + rs[t] * d;
        for (int e = 0; e < d; e++) o[e] = om[e] = 0.0;
    }
    for (int j = 0; j < Nk; j++) {
        const float *vj = kvrow(c, c->v, b, j, g), *kj = kvrow(c, c->k, b, j, g);
        for (int t = 0; t < rows; t++) {
            if (j < lo[t] || j >= hi[t] || !tile_on(c, b, h, row[t], j)) continue;
            double *o = c->r->o + rs[t] * d, *om = c->r->o_m + rs[t] * d;
            double pj = s[(size_t)t * Nk + j] / l[t];
            for (int e = 0; e < d; e++) {
                o[e] += pj * vj[e];
                om[e] += (pj * vj[e]) * (pj * vj[e]);
            }
            if (c->r->lse_m) {
                const double a = kstep_addends(qi[t], kj, d), ej = acc_err(p, a);
                tm[t] += pj * a;
                zlo[t] += pj * exp(-ej);
                emax[t] = fmax(emax[t], ej);
            }
        }
    }
    double *x = s + (size_t)rows * Nk;   /* rows x 4 d: acc_key's sums */
    if (c->r->o_acc) {   /* fwd_row's second pass, K and V read once for all rows */
        for (int t = 0; t < rows; t++) acc_begin(x + (size_t)t * 4 * d, d);
        for (int j = 0; j < Nk; j++) {
            const float *vj = kvrow(c, c->v, b, j, g), *kj = kvrow(c, c->k, b, j, g);
            for (int t = 0; t < rows; t++)
                if (j >= lo[t] && j < hi[t] && tile_on(c, b, h, row[t], j))
                    acc_key(x + (size_t)t * 4 * d, c->r->o + rs[t] * d, vj, s[(size_t)t * Nk + j] / l[t],
                            acc_err(p, kstep_addends(qi[t], kj, d)), zlo[t], emax[t], d);
        }
    }
    for (int t = 0; t < rows; t++) {
        const int i = (int)((rs[t] / p->H) % p->N_q);
        double *om = c->r->o_m + rs[t] * d;
        for (int e = 0; e < d; e++) om[e] = sqrt(om[e]);
        if (c->r->o_acc) acc_row(c->r->o_acc + rs[t] * d, x + (size_t)t * 4 * d, emax[t], d);
        c->r->lse[((size_t)b * p->H + h) * p->N_q + i] = m[t] + log(l[t]);
        if (c->r->lse_m) c->r->lse_m[((size_t)b * p->H + h) * p->N_q + i] = (double)p->scale * tm[t];
    }
}

/* L alone of query row r (an assisted backward: every row of a chosen head needs it, and the
 * whole forward would cost twice as much), online: m and l updated key by key */
static void lse_row(octx *c, size_t r)
{
    const attn_problem *p = c->p;
    int h = (int)(r % p->H), i = (int)((r / p->H) % p->N_q), b = (int)(r / p->H / p->N_q);
    int g = h / c->G, lo, hi;
    attn_visible_keys(p, i, &lo, &hi);
    const float *qi = qrow(c, c->q, b, i, h);
    double m = -INFINITY, l = 0.0;
    for (int j = lo; j < hi; j++) {
        if (!tile_on(c, b, h, i, j)) continue;
        const double s = (double)p->scale * dot(qi, kvrow(c, c->k, b, j, g), p->d);
        if (s > m) { l = l * exp(m - s) + 1.0; m = s; }
        else l += exp(s - m);
    }
    c->own_lse[((size_t)b * p->H + h) * p->N_q + i] = m + log(l);   /* -inf if none visible */
}

/* dQ of query row r */
static void dq_row(octx *c, size_t r)
{
    const attn_problem *p = c->p;
    int h = (int)(r % p->H), i = (int)((r / p->H) % p->N_q), b = (int)(r / p->H / p->N_q);
    int g = h / c->G, d = p->d, lo, hi;
    attn_visible_keys(p, i, &lo, &hi);
    const float *qi = qrow(c, c->q, b, i, h), *doi = qrow(c, c->d_o, b, i, h);
    double L = lse_of(c, ((size_t)b * p->H + h) * p->N_q + i), D = c->D[r];
    double *dq = c->r->dq + r * d, *dqm = c->r->dq_m + r * d;
    double *acc_pk = malloc(sizeof(double) * (size_t)d);
    for (int e = 0; e < d; e++) dq[e] = dqm[e] = 0.0;
    if (acc_pk)
        for (int e = 0; e < d; e++) acc_pk[e] = 0.0;
    for (int j = lo; j < hi; j++) {
        if (!tile_on(c, b, h, i, j)) continue;
        const float *kj = kvrow(c, c->k, b, j, g);
        double P = exp((double)p->scale * dot(qi, kj, d) - L);
        double dS = P * (dot(doi, kvrow(c, c->v, b, j, g), d) - D);
        for (int e = 0; e < d; e++) {
            dq[e] += dS * kj[e];
            dqm[e] += (dS * kj[e]) * (dS * kj[e]);
        }
        if (acc_pk)
            for (int e = 0; e < d; e++) acc_pk[e] += P * kj[e];
    }
    /* a kernel computes D from its 16-bit O: its error (of size mD) enters dQ as
     * scale * dD * sum_j P_ij K_j */
    for (int e = 0; e < d; e++) {
        double dterm = acc_pk ? c->mD[r] * acc_pk[e] : 0.0;
        dq[e] *= p->scale;
        dqm[e] = p->scale * sqrt(dqm[e] + dterm * dterm);
    }
    free(acc_pk);
}

/* dK and dV of key row r = (b*N_k + j)*H_kv + g, summed over the G query heads of g */
static void dkv_row(octx *c, size_t r)
{
    const attn_problem *p = c->p;
    int g = (int)(r % p->H_kv), j = (int)((r / p->H_kv) % p->N_k), b = (int)(r / p->H_kv / p->N_k);
    int d = p->d;
    const float *kj = kvrow(c, c->k, b, j, g), *vj = kvrow(c, c->v, b, j, g);
    double *dk = c->r->dk + r * d, *dv = c->r->dv + r * d;
    double *dkm = c->r->dk_m + r * d, *dvm = c->r->dv_m + r * d;
    for (int e = 0; e < d; e++) dk[e] = dv[e] = dkm[e] = dvm[e] = 0.0;
    int i0 = p->causal ? j : 0; /* causal: only queries i >= j see key j */
    for (int h = g * c->G; h < (g + 1) * c->G; h++)
        for (int i = i0; i < p->N_q; i++) {
            int lo, hi;
            attn_visible_keys(p, i, &lo, &hi);
            if (j < lo || j >= hi || !tile_on(c, b, h, i, j)) continue;   /* masked out */
            size_t qr = ((size_t)b * p->N_q + i) * p->H + h;
            const float *qi = qrow(c, c->q, b, i, h), *doi = qrow(c, c->d_o, b, i, h);
            double L = lse_of(c, ((size_t)b * p->H + h) * p->N_q + i);
            double P = exp((double)p->scale * dot(qi, kj, d) - L);
            double dS = P * (dot(doi, vj, d) - c->D[qr]), PmD = P * c->mD[qr];
            for (int e = 0; e < d; e++) {
                dv[e] += P * doi[e];
                dk[e] += dS * qi[e];
                dvm[e] += (P * doi[e]) * (P * doi[e]);
                /* the dS term, and the error of a 16-bit-O D entering through P_ij dD_i Q_i */
                dkm[e] += (dS * qi[e]) * (dS * qi[e]) + (PmD * qi[e]) * (PmD * qi[e]);
            }
        }
    for (int e = 0; e < d; e++) {
        dk[e] *= p->scale;
        dkm[e] = p->scale * sqrt(dkm[e]);
        dvm[e] = sqrt(dvm[e]);
    }
}

enum { PH_FWD, PH_LSE, PH_DQ, PH_DKV };
typedef struct { octx *c; int phase, tid, nt; int oom; } ojob;

static void *worker(void *arg)
{
    ojob *jb = arg;
    octx *c = jb->c;
    const attn_problem *p = c->p;
    const attn_sample *s = c->s;
    if (jb->phase == PH_LSE) {
        size_t n = (size_t)p->B * p->N_q * p->H;
        for (size_t r = (size_t)jb->tid; r < n; r += (size_t)jb->nt) {
            const int h = (int)(r % p->H), b = (int)(r / p->H / p->N_q);
            if (s->mask_unit[b * p->H_kv + h / c->G]) lse_row(c, r);
        }
    } else if (jb->phase == PH_FWD && c->need_fwd && (!c->D || c->own_lse)) {
        /* a sampled forward: at most SAMPLE_ROWS rows per head, one head at a time */
        double *scratch = malloc(sizeof(double) * SAMPLE_ROWS * ((size_t)p->N_k + 4 * (size_t)p->d));
        if (!scratch) { jb->oom = 1; return NULL; }
        size_t rs[SAMPLE_ROWS];
        for (int bh = jb->tid; bh < p->B * p->H; bh += jb->nt) {
            const int b = bh / p->H, h = bh % p->H;
            int rows = 0;
            for (int i = 0; i < p->N_q && rows < SAMPLE_ROWS; i++) {
                const size_t r = ((size_t)b * p->N_q + i) * p->H + h;
                if (c->need_fwd[r]) rs[rows++] = r;
            }
            if (rows) fwd_rows(c, rs, rows, scratch);
        }
        free(scratch);
    } else if (jb->phase == PH_FWD) {
        double *scratch = malloc(sizeof(double) * ((size_t)p->N_k + 4 * (size_t)p->d));
        if (!scratch) { jb->oom = 1; return NULL; }
        size_t n = (size_t)p->B * p->N_q * p->H;
        for (size_t r = (size_t)jb->tid; r < n; r += (size_t)jb->nt)
            if (!c->need_fwd || c->need_fwd[r]) fwd_row(c, r, scratch);
        free(scratch);
    } else if (jb->phase == PH_DQ) {
        size_t n = (size_t)p->B * p->N_q * p->H;
        for (size_t r = (size_t)jb->tid; r < n; r += (size_t)jb->nt)
            if (!s || !s->mask_q || s->mask_q[r]) dq_row(c, r);
    } else {
        size_t n = (size_t)p->B * p->N_k * p->H_kv;
        for (size_t r = (size_t)jb->tid; r < n; r += (size_t)jb->nt)
            if (!s || !s->mask_kv || s->mask_kv[r]) dkv_row(c, r);
    }
    return NULL;
}

static int nthreads(void)
{
    if (attn_oracle_threads > 0) return attn_oracle_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 16) n = 16;
    return (int)n;
}

static int run_phase(octx *c, int phase)
{
    enum { MAX_THREADS = 64 };
    int nt = nthreads(), oom = 0;
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = { 0 };
    ojob jb[MAX_THREADS];
    for (int t = 0; t < nt; t++) jb[t] = (ojob){ c, phase, t, nt, 0 };
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&th[t], NULL, worker, &jb[t]) == 0;
    worker(&jb[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else worker(&jb[t]); /* thread could not start: do its share here */
    }
    for (int t = 0; t < nt; t++) oom |= jb[t].oom;
    return oom ? -1 : 0;
}

/* D_i = rowsum(dO_i ∘ O_i) and its term magnitude for every row of the chosen heads, from the
 * run's 16-bit O (an assisted backward). */
static void run_D(octx *c, const uint16_t *run_o)
{
    const attn_problem *p = c->p;
    const size_t nrow_q = (size_t)p->B * p->N_q * p->H;
    for (size_t row = 0; row < nrow_q; row++) {
        const int h = (int)(row % p->H), b = (int)(row / p->H / p->N_q);
        if (!c->s->mask_unit[b * p->H_kv + h / c->G]) continue;
        const float *doi = c->d_o + row * p->d;
        const uint16_t *oi = run_o + row * p->d;
        double D = 0.0, mD = 0.0;
        for (int e = 0; e < p->d; e++) {
            const double t = (double)doi[e] * attn_to_f32(oi[e], p->dtype);
            D += t;
            mD += t * t;
        }
        c->D[row] = D;
        c->mD[row] = sqrt(mD);
    }
}

static int oracle(const attn_problem *p, const float *q, const float *k, const float *v,
                  const float *d_o, attn_dir dir, const attn_sample *s, attn_ref *r,
                  const uint16_t *run_o, const unsigned char *bmask, int with_acc)
{
    memset(r, 0, sizeof *r);
    if (dir == ATTN_BACKWARD && s && s->assisted && !run_o) return -1;
    if (p->block_mask && !bmask) return -1;
    octx c = { 0 };
    c.bmask = p->block_mask ? bmask : NULL;
    c.p = p; c.s = s; c.G = p->H / p->H_kv; c.r = r;
    c.q = q; c.k = k; c.v = v; c.d_o = d_o;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p), nrow_q = (size_t)p->B * p->N_q * p->H;
    int rc = -1;
    r->o = malloc(nq * sizeof(double));
    r->o_m = malloc(nq * sizeof(double));
    r->lse = malloc(attn_numel_lse(p) * sizeof(double));
    if (with_acc) {
        r->lse_m = malloc(attn_numel_lse(p) * sizeof(double));
        r->o_acc = malloc(nq * sizeof(double));
    }
    if (!r->o || !r->o_m || !r->lse || (with_acc && (!r->lse_m || !r->o_acc))) goto out;
    /* unset rows stay NaN (all-ones bits), so a bug in the sampling shows up as a mismatch */
    memset(r->o, 0xFF, nq * sizeof(double));
    memset(r->lse, 0xFF, attn_numel_lse(p) * sizeof(double));
    if (with_acc) {
        memset(r->lse_m, 0xFF, attn_numel_lse(p) * sizeof(double));
        memset(r->o_acc, 0xFF, nq * sizeof(double));
    }
    if (s && s->skipped) { rc = 0; goto out; }   /* nothing to check (its masks may be missing) */
    if (dir == ATTN_FORWARD) {
        c.need_fwd = s ? s->mask_q : NULL;
    } else {
        c.D = malloc(nrow_q * sizeof(double));
        c.mD = malloc(nrow_q * sizeof(double));
        r->dq = malloc(nq * sizeof(double));
        r->dk = malloc(nkv * sizeof(double));
        r->dv = malloc(nkv * sizeof(double));
        r->dq_m = malloc(nq * sizeof(double));
        r->dk_m = malloc(nkv * sizeof(double));
        r->dv_m = malloc(nkv * sizeof(double));
        if (!d_o || !c.D || !c.mD || !r->dq || !r->dk || !r->dv || !r->dq_m || !r->dk_m || !r->dv_m) goto out;
        memset(r->dq, 0xFF, nq * sizeof(double));
        memset(r->dk, 0xFF, nkv * sizeof(double));
        memset(r->dv, 0xFF, nkv * sizeof(double));
        if (s && s->assisted) {
            /* the oracle's forward of the sampled rows only, L of every row of the chosen heads
             * (PH_LSE); D of the others from the run's O */
            c.need_fwd = s->mask_q;
            c.own_lse = malloc(attn_numel_lse(p) * sizeof(double));
            if (!c.own_lse) goto out;
            run_D(&c, run_o);
        } else if (s && s->mask_unit) {
            /* every row of every query head of a chosen kv head */
            c.need_fwd = calloc(nrow_q, 1);
            if (!c.need_fwd) goto out;
            for (size_t row = 0; row < nrow_q; row++) {
                int h = (int)(row % p->H), b = (int)(row / p->H / p->N_q);
                c.need_fwd[row] = s->mask_unit[b * p->H_kv + h / c.G];
            }
        }
    }
    if (run_phase(&c, PH_FWD)) goto out;
    if (c.own_lse && run_phase(&c, PH_LSE)) goto out;
    if (dir == ATTN_BACKWARD) {
        if (run_phase(&c, PH_DQ) || run_phase(&c, PH_DKV)) goto out;
    }
    rc = 0;
out:
    if (dir == ATTN_BACKWARD && !(s && s->assisted)) free(c.need_fwd);
    free(c.D);
    free(c.mD);
    free(c.own_lse);
    if (rc) attn_ref_free(r);
    return rc;
}

int attn_oracle_f32(const attn_problem *p, const float *q, const float *k, const float *v,
                    const float *d_o, const unsigned char *block_mask, attn_dir dir,
                    const attn_sample *s, attn_ref *r)
{
    return oracle(p, q, k, v, d_o, dir, s, r, NULL, block_mask, p->dtype == ATTN_E4M3);
}

int attn_oracle_unquantized(const attn_host *t, const attn_sample *s, attn_ref *r)
{
    memset(r, 0, sizeof *r);
    if (t->p.dtype != ATTN_E4M3 || t->period) return -1;
    /* the RMSE's reference: no check, so no accumulator terms (lse_m, o_acc) */
    return oracle(&t->p, t->q32, t->k32, t->v32, NULL, ATTN_FORWARD, s, r, NULL, t->block_mask, 0);
}

int attn_oracle(const attn_host *t, attn_dir dir, const attn_sample *s, attn_ref *r)
{
    const attn_problem *p = &t->p;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p);
    float *q = NULL, *k = NULL, *v = NULL;
    memset(r, 0, sizeof *r);
    if (p->dtype == ATTN_E4M3) {
        if (attn_host_dequantize(t, &q, &k, &v)) return -1;
    } else {
        q = attn_host_to_f32(t->q, nq, p->dtype);
        k = attn_host_to_f32(t->k, nkv, p->dtype);
        v = attn_host_to_f32(t->v, nkv, p->dtype);
    }
    float *d_o = dir == ATTN_BACKWARD && t->d_o ? attn_host_to_f32(t->d_o, nq, p->dtype) : NULL;
    int rc = -1;
    if (q && k && v && (dir == ATTN_FORWARD || d_o))
        rc = oracle(p, q, k, v, d_o, dir, s, r, t->o, t->block_mask, p->dtype == ATTN_E4M3);
    free(q); free(k); free(v); free(d_o);
    return rc;
}
