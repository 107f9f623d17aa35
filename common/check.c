/* common/check.c: element-wise comparison against a float64 reference.
 *
 * The rule (also in harness.h). u = unit roundoff of the dtype: bf16 2^-8, fp16 2^-11, e4m3
 * 2^-4.
 *   O, dQ, dK, dV: pass iff |x - r| <= c * u * (|r| + max(s, m)), m = the element's term
 *                  magnitude sqrt(sum of the squared terms summed into it) from the
 *                  oracle, s = max(RMS r, RMS m) over the checked elements of the tensor;
 *                  c = 4 for O, 16 for dQ, dK, dV.
 *   L            : pass iff |x - r| <= c * u32 * (|r| + 1), c = 256, u32 = 2^-24 (L is float32).
 *   O, dQ, dK, dV as a whole: ||x - r||_2 <= 3 u max(||r||_2, ||m||_2) (harness.h says why).
 *   e4m3 (O): the same with u = 2^-4 (that of P, which the kernel rounds to e4m3) and
 *                  1 u max(||r||_2, ||m||_2) for the norm (harness.h says why), each element
 *                  plus c_acc * u_acc * t' (the accumulator's term, next item; t' from the
 *                  oracle, attn_ref.o_acc, bounds what the scores' errors move O) and the
 *                  norm plus the norm of those terms.
 *   e4m3 (L): L's rule plus c_acc * u_acc * t, u_acc = 2^-13, c_acc = 8, t the size of the
 *                  addends of the row's scores (attn_ref.lse_m): the fp8 tensor cores keep 13
 *                  fraction bits when they sum Q K^T (harness.h says why).
 * x must be finite. Why this shape: storing the result in 16 bits alone costs u*|r|; the
 * products inside the kernel (P rounded to 16 bits before P V, dS before dS K, ...) add
 * errors of about u times the size of the terms of each sum, hence the s floor, which
 * also keeps near-zero elements from demanding impossible relative accuracy. For random
 * inputs RMS m ~ RMS r; where a sum cancels (dQ = scale sum_j dS_ij K_j with all K_j nearly
 * equal: sum_j dS_ij = 0) the result is far smaller than its terms and so is RMS r, while
 * the kernel's error (dS rounded to 16 bits) stays of the size of the terms: m covers it. The
 * gradients go through two such rounded products, hence the larger c. A correct kernel
 * sits well inside; an element a few percent off (O), a NaN, or an element never written
 * (the harness poisons outputs with NaN) fails.
 * Reported: max abs error, max relative error |x - r| / max(|r|, s), norm-wise error
 * ||x - r||_2 / ||r||_2 over the checked elements, the count of mismatches and the first
 * ATTN_NFIRST of them with their (b, n, h, c) index. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"

double attn_tol_c(attn_tensor k)
{
    switch (k) {
    case ATTN_T_O: return ATTN_TOL_C_O;
    case ATTN_T_LSE: return ATTN_TOL_C_LSE;
    default: return ATTN_TOL_C_GRAD;
    }
}

const char *attn_tensor_name(attn_tensor k)
{
    static const char *names[] = { "O", "L", "dQ", "dK", "dV" };
    return (unsigned)k < 5 ? names[k] : "?";
}

/* Where element e of tensor kind lives: its (b, n, h, c) and its row in the sample masks. */
typedef struct { int N, heads, d; const unsigned char *mask; int lse; } layout;

static layout layout_of(attn_tensor kind, const attn_problem *p, const attn_sample *s)
{
    layout l;
    l.lse = kind == ATTN_T_LSE;
    if (kind == ATTN_T_DK || kind == ATTN_T_DV) {
        l.N = p->N_k; l.heads = p->H_kv; l.d = p->d; l.mask = s ? s->mask_kv : NULL;
    } else {
        l.N = p->N_q; l.heads = p->H; l.d = l.lse ? 1 : p->d; l.mask = s ? s->mask_q : NULL;
    }
    return l;
}

static size_t numel_of(attn_tensor kind, const attn_problem *p)
{
    if (kind == ATTN_T_LSE) return attn_numel_lse(p);
    if (kind == ATTN_T_DK || kind == ATTN_T_DV) return attn_numel_kv(p);
    return attn_numel_q(p);
}

/* Row `row` of the mask row space ((b N + n) heads + h): its (b, n, h) and where its elements
 * start in the tensor (one element for L, d consecutive ones otherwise). */
static size_t row_start(const layout *l, size_t row, int *b, int *n, int *h)
{
    *h = (int)(row % l->heads);
    *n = (int)(row / l->heads % l->N);
    *b = (int)(row / l->heads / l->N);
    return l->lse ? ((size_t)*b * l->heads + *h) * l->N + *n : row * l->d;
}

int attn_compare(attn_cmp *out, attn_tensor kind, const attn_problem *p,
                 const uint16_t *x16, const float *x32, const double *ref, const double *mag,
                 const double *acc, const attn_sample *s)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->u = kind == ATTN_T_LSE ? ATTN_U_F32 : attn_unit_roundoff(p->dtype);
    out->c = attn_tol_c(kind);
    layout l = layout_of(kind, p, s);
    /* e4m3's O and L: the accumulator's term, c_acc u_acc t with t = acc (never part of s) */
    const double *t_acc = p->dtype == ATTN_E4M3 && (kind == ATTN_T_O || l.lse) ? acc : NULL;
    out->c_acc = t_acc ? ATTN_TOL_C_ACC : 0.0;
    /* rows, not elements: a sampled check visits only its rows (at N = 10^6 the tensors hold
     * 2^31 elements, and a pass over them all costs more than the oracle) */
    const size_t nrows = numel_of(kind, p) / l.d;
    int b, nn, h;
    double sum_r2 = 0.0, sum_m2 = 0.0;
    for (size_t row = 0; row < nrows; row++) {
        if (l.mask && !l.mask[row]) continue;
        const size_t e0 = row_start(&l, row, &b, &nn, &h);
        for (size_t e = e0; e < e0 + (size_t)l.d; e++) {
            if (isfinite(ref[e])) sum_r2 += ref[e] * ref[e];
            if (mag && isfinite(mag[e])) sum_m2 += mag[e] * mag[e];
            out->checked++;
        }
    }
    out->rms_ref = out->checked ? sqrt(sum_r2 / (double)out->checked) : 0.0;
    double rms_m = out->checked ? sqrt(sum_m2 / (double)out->checked) : 0.0;
    double s_rms = out->rms_ref > rms_m ? out->rms_ref : rms_m;
    out->s = s_rms;
    double sum_e2 = 0.0, sum_a2 = 0.0;   /* sum_a2: the accumulator terms' squares */
    double sum_er = 0.0;                 /* e4m3's O: sum (x - r) r (the lean) */
    const int lean = kind == ATTN_T_O && p->dtype == ATTN_E4M3;
    for (size_t row = 0; row < nrows; row++) {
        if (l.mask && !l.mask[row]) continue;
        const size_t e0 = row_start(&l, row, &b, &nn, &h);
        for (size_t e = e0; e < e0 + (size_t)l.d; e++) {
            const int c = (int)(e - e0);
            double x = x32 ? (double)x32[e] : (double)attn_to_f32(x16[e], p->dtype);
            double r = ref[e];
            /* a row that sees no key (a window): L = -inf, the one infinity that is right */
            const int both_empty = l.lse && x == -INFINITY && r == -INFINITY;
            double err = both_empty ? 0.0 : fabs(x - r);
            double floor = mag && isfinite(mag[e]) && mag[e] > s_rms ? mag[e] : s_rms;
            double tol = l.lse ? out->c * out->u * (fabs(r) + 1.0) : out->c * out->u * (fabs(r) + floor);
            if (t_acc) {   /* NaN (a row left unset) fails, here and in the norm */
                const double a = out->c_acc * ATTN_U_ACC * t_acc[e];
                tol += a;
                sum_a2 += a * a;
            }
            if (lean && isfinite(r)) sum_er += (x - r) * r;   /* NaN x: the lean fails too */
            int ok = both_empty || (isfinite(x) && isfinite(r) && err <= tol);
            if (tol > 0 && err / tol > out->worst) out->worst = err / tol;
            if (!(tol > 0) && err > 0) out->worst = INFINITY;
            if (!both_empty && (!isfinite(x) || !isfinite(r))) err = INFINITY;
            double denom = fabs(r) > s_rms ? fabs(r) : s_rms;
            double rel = denom > 0 ? err / denom : (err > 0 ? INFINITY : 0.0);
            if (l.lse && denom < 1.0) rel = err / (fabs(r) + 1.0);
            if (err > out->max_abs) out->max_abs = err;
            if (rel > out->max_rel) out->max_rel = rel;
            sum_e2 += err * err;
            if (!ok) {
                if (out->nfirst < ATTN_NFIRST) {
                    int k = out->nfirst++;
                    out->first[k].b = b; out->first[k].n = nn; out->first[k].h = h; out->first[k].c = c;
                    out->first[k].got = x; out->first[k].want = r; out->first[k].tol = tol;
                }
                out->mismatches++;
            }
        }
    }
    out->normwise = sum_r2 > 0 ? sqrt(sum_e2 / sum_r2) : (sum_e2 > 0 ? INFINITY : 0.0);
    /* the norm-wise bound, relative to ||r||: c_nw u max(1, ||m|| / ||r||), plus for e4m3's O
     * the norm of the accumulator's terms (the element-wise ones, so the norm admits them) */
    if (!l.lse && sum_r2 > 0) {
        const double rho = sum_m2 > sum_r2 ? sqrt(sum_m2 / sum_r2) : 1.0;
        const double c_nw = p->dtype == ATTN_E4M3 ? ATTN_TOL_C_NW_E4M3 : ATTN_TOL_C_NW;
        out->nw_bound = c_nw * out->u * rho + sqrt(sum_a2 / sum_r2);
        out->nw_fail = !(out->normwise <= out->nw_bound);
    }
    if (lean && sum_r2 > 0) {
        out->lean = sum_er / sum_r2;
        out->lean_bound = ATTN_TOL_C_LEAN_E4M3 * out->u;
        out->lean_fail = !(fabs(out->lean) <= out->lean_bound);
    }
    return out->mismatches || out->nw_fail || out->lean_fail ? 1 : 0;
}

double attn_rmse(const attn_problem *p, const uint16_t *x, const double *ref, const attn_sample *s)
{
    const layout l = layout_of(ATTN_T_O, p, s);
    const size_t nrows = attn_numel_q(p) / (size_t)l.d;
    double sum = 0.0;
    size_t n = 0;
    int b, nn, h;
    for (size_t row = 0; row < nrows; row++) {
        if (l.mask && !l.mask[row]) continue;
        const size_t e0 = row_start(&l, row, &b, &nn, &h);
        for (size_t e = e0; e < e0 + (size_t)l.d; e++, n++) {
            const double err = attn_to_f32(x[e], p->dtype) - ref[e];
            sum += err * err;
        }
    }
    return n ? sqrt(sum / (double)n) : 0.0;
}

int attn_compare_all(attn_cmp *cmp, int *ncmp, const attn_host *a, attn_dir dir,
                     const attn_ref *r, const attn_sample *s)
{
    int fails = 0, k = 0;
    fails += attn_compare(&cmp[k++], ATTN_T_O, &a->p, a->o, NULL, r->o, r->o_m, r->o_acc, s);
    fails += attn_compare(&cmp[k++], ATTN_T_LSE, &a->p, NULL, a->lse, r->lse, NULL, r->lse_m, s);
    if (dir == ATTN_BACKWARD && r->dq) {
        fails += attn_compare(&cmp[k++], ATTN_T_DQ, &a->p, a->dq, NULL, r->dq, r->dq_m, NULL, s);
        fails += attn_compare(&cmp[k++], ATTN_T_DK, &a->p, a->dk, NULL, r->dk, r->dk_m, NULL, s);
        fails += attn_compare(&cmp[k++], ATTN_T_DV, &a->p, a->dv, NULL, r->dv, r->dv_m, NULL, s);
    }
    *ncmp = k;
    return fails;
}


void attn_cmp_print(FILE *f, const attn_cmp *c)
{
    const int lse = c->kind == ATTN_T_LSE;
    fprintf(f, "  %-2s %s  max abs %.2e  max rel %.2e  norm-wise %.2e", attn_tensor_name(c->kind),
            c->mismatches || c->nw_fail || c->lean_fail ? "FAIL" : "PASS", c->max_abs, c->max_rel,
            c->normwise);
    if (c->nw_bound > 0)
        fprintf(f, " (bound %.2e%s)", c->nw_bound, c->nw_fail ? ": EXCEEDED" : "");
    if (c->lean_bound > 0)
        fprintf(f, "  lean %+.2e (bound %.2e%s)", c->lean, c->lean_bound, c->lean_fail ? ": EXCEEDED" : "");
    fprintf(f, "  worst err/tol %.2f  %zu of %zu mismatch%s  (tol %g*u*(|r|+%s)", c->worst,
            c->mismatches, c->checked, c->mismatches == 1 ? "" : "es", c->c, lse ? "1" : "s");
    if (c->c_acc > 0) fprintf(f, " + %g*u_acc*%s", c->c_acc, lse ? "t" : "t'");
    if (lse) fprintf(f, ", u=%.3g", c->u);
    else fprintf(f, ", u=%.3g, s=%.3g", c->u, c->s);
    fputs(c->c_acc > 0 ? ", u_acc=2^-13)\n" : ")\n", f);
    for (int k = 0; k < c->nfirst; k++) {
        const double r = c->first[k].want, tol = c->first[k].tol;
        if (lse)
            fprintf(f, "     at (b=%d, n=%d, h=%d): got %.6g want %.6g (|err| %.3g > tol %.3g)\n",
                    c->first[k].b, c->first[k].n, c->first[k].h, c->first[k].got, r,
                    fabs(c->first[k].got - r), tol);
        else
            fprintf(f, "     at (b=%d, n=%d, h=%d, c=%d): got %.6g want %.6g (|err| %.3g > tol %.3g)\n",
                    c->first[k].b, c->first[k].n, c->first[k].h, c->first[k].c, c->first[k].got, r,
                    fabs(c->first[k].got - r), tol);
    }
}

void attn_cmp_short(char *buf, size_t n, const attn_cmp *c, int nc)
{
    size_t used = 0;
    buf[0] = 0;
    for (int k = 0; k < nc && used < n; k++) {
        int w = snprintf(buf + used, n - used, "%s%s max abs %.1e rel %.1e nw %.1e%s",
                         k ? ", " : "", attn_tensor_name(c[k].kind), c[k].max_abs, c[k].max_rel,
                         c[k].normwise, c[k].mismatches || c[k].nw_fail || c[k].lean_fail ? " FAIL" : "");
        if (w < 0) break;
        used += (size_t)w;
    }
}
