/* tests/test_check.c: the tolerance check passes what a correct 16-bit kernel produces and
 * fails a perturbed element, a NaN, and an output never written (CPU only). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "test_util.h"

/* forward + backward oracle for p with fresh inputs, and a host copy to mutate */
typedef struct { attn_host t; attn_ref r; } fixture;

static void setup(fixture *f, attn_problem p, uint64_t seed)
{
    cr_assert_eq(attn_host_alloc(&f->t, &p, 1), 0);
    attn_host_fill(&f->t, seed, ATTN_INPUT_NORMAL);
    cr_assert_eq(attn_oracle(&f->t, ATTN_BACKWARD, NULL, &f->r), 0);
    test_round_ref(&f->t, &f->r, 1);
}

static void teardown(fixture *f) { attn_ref_free(&f->r); attn_host_free(&f->t); }

static int fails_of(const fixture *f, attn_cmp *c, int *nc)
{
    return attn_compare_all(c, nc, &f->t, ATTN_BACKWARD, &f->r, NULL);
}

/* index of the element of largest |reference| */
static size_t argmax_abs(const double *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (fabs(x[i]) > fabs(x[best])) best = i;
    return best;
}

Test(check, exact_reference_rounded_passes)
{
    for (int dt = 0; dt < 2; dt++) {
        attn_problem p = test_problem(2, 4, 2, 37, 53, 64, dt);
        p.dtype = dt ? ATTN_FP16 : ATTN_BF16;
        fixture f;
        setup(&f, p, 10 + dt);
        attn_cmp c[5];
        int nc;
        cr_assert_eq(fails_of(&f, c, &nc), 0);
        cr_assert_eq(nc, 5);
        for (int i = 0; i < nc; i++) {
            cr_assert(c[i].checked > 0);
            cr_assert(c[i].worst <= 0.25, "%s: rounding alone uses %.2f of the tolerance",
                      attn_tensor_name(c[i].kind), c[i].worst);
        }
        teardown(&f);
    }
}

static void perturb16(uint16_t *x, size_t i, double factor, attn_dtype t)
{
    x[i] = attn_from_f32((float)(attn_to_f32(x[i], t) * factor), t);
}

Test(check, one_element_a_few_percent_off_fails)
{
    for (int dt = 0; dt < 2; dt++) {
        attn_problem p = test_problem(1, 2, 2, 64, 64, 64, 0);
        p.dtype = dt ? ATTN_FP16 : ATTN_BF16;
        fixture f;
        setup(&f, p, 20 + dt);
        attn_cmp c[5];
        int nc;
        /* O: 5% off on its largest element */
        size_t i = argmax_abs(f.r.o, attn_numel_q(&p));
        perturb16(f.t.o, i, 1.05, p.dtype);
        cr_assert_eq(fails_of(&f, c, &nc), 1);
        cr_assert_eq(c[0].mismatches, 1);
        size_t row = i / p.d;
        cr_assert_eq(c[0].first[0].c, (int)(i % p.d));
        cr_assert_eq(c[0].first[0].h, (int)(row % p.H));
        cr_assert_eq(c[0].first[0].n, (int)(row / p.H % p.N_q));
        test_round_ref(&f.t, &f.r, 1);
        /* L: off by 5% of (|L| + 1) */
        f.t.lse[7] += 0.05f * (fabsf(f.t.lse[7]) + 1.0f);
        cr_assert_eq(fails_of(&f, c, &nc), 1);
        cr_assert_eq(c[1].mismatches, 1);
        cr_assert_eq(c[1].first[0].n, 7);
        test_round_ref(&f.t, &f.r, 1);
        /* gradients: the tolerance is 4x wider (c = 16), so 20% in bf16, 5% in fp16 */
        double g = dt ? 1.05 : 1.2;
        i = argmax_abs(f.r.dq, attn_numel_q(&p));
        perturb16(f.t.dq, i, g, p.dtype);
        i = argmax_abs(f.r.dk, attn_numel_kv(&p));
        perturb16(f.t.dk, i, g, p.dtype);
        i = argmax_abs(f.r.dv, attn_numel_kv(&p));
        perturb16(f.t.dv, i, g, p.dtype);
        cr_assert_eq(fails_of(&f, c, &nc), 3);
        cr_assert(c[2].mismatches == 1 && c[3].mismatches == 1 && c[4].mismatches == 1);
        teardown(&f);
    }
}

Test(check, nan_and_inf_fail)
{
    attn_problem p = test_problem(1, 2, 1, 16, 16, 64, 1);
    fixture f;
    setup(&f, p, 30);
    attn_cmp c[5];
    int nc;
    f.t.o[5] = 0x7FC0;           /* bf16 NaN */
    f.t.dv[9] = 0x7F80;          /* bf16 +inf */
    f.t.lse[3] = NAN;
    cr_assert_eq(fails_of(&f, c, &nc), 3);
    cr_assert(c[0].mismatches == 1 && c[1].mismatches == 1 && c[4].mismatches == 1);
    cr_assert(isinf(c[0].max_abs) && isinf(c[0].normwise));
    teardown(&f);
}

Test(check, unwritten_poisoned_output_fails)
{
    attn_problem p = test_problem(1, 2, 2, 10, 10, 64, 0);
    fixture f;
    setup(&f, p, 40);
    attn_host_poison_outputs(&f.t);     /* what the harness does before every run */
    attn_cmp c[5];
    int nc;
    cr_assert_eq(fails_of(&f, c, &nc), 5);
    for (int i = 0; i < nc; i++) cr_assert_eq(c[i].mismatches, c[i].checked);
    /* one row left unwritten is enough */
    test_round_ref(&f.t, &f.r, 1);
    memset(f.t.o + 3 * p.d, 0xFF, 2 * p.d);
    cr_assert_eq(fails_of(&f, c, &nc), 1);
    cr_assert_eq(c[0].mismatches, (size_t)p.d);
    teardown(&f);
}

/* ---- biases: errors that lean one way, too small for any one element to stand out ---- */

/* Every element of a 16-bit tensor times factor (rounded to the dtype again). */
static void scale16(uint16_t *x, size_t n, double factor, attn_dtype t)
{
    for (size_t i = 0; i < n; i++) perturb16(x, i, factor, t);
}

/* The oracle's own outputs, rounded, pass; each one biased fails: O, dQ, dK, dV by +-2%, L by
 * +0.01, and L by +0.02 with the gradients that L gives (P = exp(S - L) scaled by e^-0.02:
 * dV, and the P of dS, 2% low). In bf16 and fp16, at N = 1000 and 4000 (B = 1, H = 2, d = 64,
 * normal inputs). */
Test(check, a_uniform_bias_fails, .timeout = 300)
{
    for (int dt = 0; dt < 2; dt++)
        for (int N = 1000; N <= 4000; N *= 4) {
            attn_problem p = test_problem(1, 2, 2, N, N, 64, 0);
            p.dtype = dt ? ATTN_FP16 : ATTN_BF16;
            fixture f;
            setup(&f, p, 70 + N + dt);
            attn_cmp c[5];
            int nc;
            cr_assert_eq(fails_of(&f, c, &nc), 0, "the rounded reference must pass");
            for (int i = 0; i < nc; i++)
                if (c[i].nw_bound > 0)
                    cr_assert(c[i].normwise <= 0.25 * c[i].nw_bound, "%s: rounding alone uses %.2f of the "
                              "norm-wise bound", attn_tensor_name(c[i].kind), c[i].normwise / c[i].nw_bound);
            const size_t nq = attn_numel_q(&p), nkv = attn_numel_kv(&p);
            uint16_t *const tensors[4] = { f.t.o, f.t.dq, f.t.dk, f.t.dv };
            const size_t sizes[4] = { nq, nq, nkv, nkv };
            const int index[4] = { 0, 2, 3, 4 };   /* in c[]: O, L, dQ, dK, dV */
            for (int k = 0; k < 4; k++)
                for (int sign = -1; sign <= 1; sign += 2) {
                    test_round_ref(&f.t, &f.r, 1);
                    scale16(tensors[k], sizes[k], 1.0 + sign * 0.02, p.dtype);
                    cr_assert_eq(fails_of(&f, c, &nc), 1, "%s x%.2f at N = %d (%s) passed",
                                 attn_tensor_name(c[index[k]].kind), 1.0 + sign * 0.02, N,
                                 dt ? "fp16" : "bf16");
                    cr_assert(c[index[k]].nw_fail, "%s x%.2f: not caught by the norm-wise bound",
                              attn_tensor_name(c[index[k]].kind), 1.0 + sign * 0.02);
                }
            /* L + 0.01 */
            test_round_ref(&f.t, &f.r, 1);
            for (size_t i = 0; i < attn_numel_lse(&p); i++) f.t.lse[i] += 0.01f;
            cr_assert_eq(fails_of(&f, c, &nc), 1, "L + 0.01 at N = %d passed", N);
            cr_assert_eq(c[1].mismatches, c[1].checked);
            /* L + 0.02, and the gradients a backward computes from it */
            test_round_ref(&f.t, &f.r, 1);
            for (size_t i = 0; i < attn_numel_lse(&p); i++) f.t.lse[i] += 0.02f;
            scale16(f.t.dv, nkv, exp(-0.02), p.dtype);
            scale16(f.t.dq, nq, exp(-0.02), p.dtype);
            scale16(f.t.dk, nkv, exp(-0.02), p.dtype);
            cr_assert_eq(fails_of(&f, c, &nc), 4, "L + 0.02 with its gradients at N = %d: %d of L, "
                         "dQ, dK, dV failed", N, fails_of(&f, c, &nc));
            teardown(&f);
        }
}

/* ---- calibration: what a correct tensor-core kernel does to the numbers -------------- */

static float rnd(float x, attn_dtype t) { return attn_to_f32(attn_from_f32(x, t), t); }

/* Emulates a FlashAttention-2 style kernel: fp32 scores and accumulators, P rounded to 16
 * bits before P V, D from the kernel's own 16-bit O, dS rounded before dS K and dS^T Q. */
static void emulate(attn_host *t)
{
    const attn_problem *p = &t->p;
    attn_dtype dt = p->dtype;
    int G = p->H / p->H_kv, d = p->d;
    float *q = attn_host_to_f32(t->q, attn_numel_q(p), dt), *k = attn_host_to_f32(t->k, attn_numel_kv(p), dt);
    float *v = attn_host_to_f32(t->v, attn_numel_kv(p), dt), *d_o = attn_host_to_f32(t->d_o, attn_numel_q(p), dt);
    float *s = malloc(sizeof(float) * p->N_k), *acc = malloc(sizeof(float) * d);
    float *dq = calloc(attn_numel_q(p), 4), *dk = calloc(attn_numel_kv(p), 4), *dv = calloc(attn_numel_kv(p), 4);
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < p->H; h++)
            for (int i = 0; i < p->N_q; i++) {
                int n = p->causal ? (i + 1 < p->N_k ? i + 1 : p->N_k) : p->N_k;
                const float *qi = q + (((size_t)b * p->N_q + i) * p->H + h) * d;
                float m = -INFINITY, l = 0;
                for (int j = 0; j < n; j++) {
                    const float *kj = k + (((size_t)b * p->N_k + j) * p->H_kv + h / G) * d;
                    float dot = 0;
                    for (int c = 0; c < d; c++) dot += qi[c] * kj[c];
                    s[j] = dot * p->scale;
                    m = fmaxf(m, s[j]);
                }
                for (int c = 0; c < d; c++) acc[c] = 0;
                for (int j = 0; j < n; j++) {
                    float pj = expf(s[j] - m);
                    l += pj;
                    float p16 = rnd(pj, dt);
                    const float *vj = v + (((size_t)b * p->N_k + j) * p->H_kv + h / G) * d;
                    for (int c = 0; c < d; c++) acc[c] += p16 * vj[c];
                }
                size_t oi = (((size_t)b * p->N_q + i) * p->H + h) * d;
                float L = m + logf(l), D = 0;
                for (int c = 0; c < d; c++) {
                    t->o[oi + c] = attn_from_f32(acc[c] / l, dt);
                    D += d_o[oi + c] * attn_to_f32(t->o[oi + c], dt);
                }
                t->lse[((size_t)b * p->H + h) * p->N_q + i] = L;
                for (int j = 0; j < n; j++) {
                    size_t kj = (((size_t)b * p->N_k + j) * p->H_kv + h / G) * d;
                    float P = expf(s[j] - L), dP = 0;
                    for (int c = 0; c < d; c++) dP += d_o[oi + c] * v[kj + c];
                    float P16 = rnd(P, dt), dS16 = rnd(P * (dP - D), dt);
                    for (int c = 0; c < d; c++) {
                        dv[kj + c] += P16 * d_o[oi + c];
                        dk[kj + c] += dS16 * qi[c] * p->scale;
                        dq[oi + c] += dS16 * k[kj + c] * p->scale;
                    }
                }
            }
    for (size_t i = 0; i < attn_numel_q(p); i++) t->dq[i] = attn_from_f32(dq[i], dt);
    for (size_t i = 0; i < attn_numel_kv(p); i++) {
        t->dk[i] = attn_from_f32(dk[i], dt);
        t->dv[i] = attn_from_f32(dv[i], dt);
    }
    free(q); free(k); free(v); free(d_o); free(s); free(acc); free(dq); free(dk); free(dv);
}

Test(check, emulated_tensor_core_kernel_passes, .timeout = 120)
{
    const struct { int N_q, N_k, d, causal, dt, H_kv; attn_input_kind kind; } cases[] = {
        { 255, 255, 64, 0, 0, 2, ATTN_INPUT_NORMAL }, { 1000, 1000, 64, 1, 0, 1, ATTN_INPUT_NORMAL },
        { 600, 600, 128, 0, 1, 2, ATTN_INPUT_NORMAL }, { 17, 255, 128, 1, 1, 2, ATTN_INPUT_NORMAL },
        { 255, 255, 64, 0, 0, 2, ATTN_INPUT_FLAT_ROWS }, { 255, 255, 64, 1, 1, 2, ATTN_INPUT_FLAT_ROWS },
        { 255, 255, 64, 1, 1, 2, ATTN_INPUT_LARGE_LOGITS }, { 1000, 1000, 128, 0, 0, 1, ATTN_INPUT_LARGE_LOGITS }, { 255, 255, 64, 1, 0, 2, ATTN_INPUT_MEDIUM_LOGITS }, { 1000, 1000, 128, 0, 1, 1, ATTN_INPUT_MEDIUM_LOGITS },
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        attn_problem p = test_problem(1, 2, cases[ci].H_kv, cases[ci].N_q, cases[ci].N_k, cases[ci].d,
                                      cases[ci].causal);
        p.dtype = cases[ci].dt ? ATTN_FP16 : ATTN_BF16;
        attn_host t;
        cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
        attn_host_fill(&t, 50 + ci, cases[ci].kind);
        attn_ref r;
        cr_assert_eq(attn_oracle(&t, ATTN_BACKWARD, NULL, &r), 0);
        emulate(&t);
        attn_cmp c[5];
        int nc, fails = attn_compare_all(c, &nc, &t, ATTN_BACKWARD, &r, NULL);
        if (cases[ci].kind == ATTN_INPUT_LARGE_LOGITS) /* forward only, see harness.h */
            fails = attn_compare_all(c, &nc, &t, ATTN_FORWARD, &r, NULL);
        char desc[200];
        attn_problem_str(&p, "emulated", ATTN_BACKWARD, desc, sizeof desc);
        cr_log_info("%s input %d: worst err/tol O %.2f L %.2f dQ %.2f dK %.2f dV %.2f; norm-wise / "
                    "bound O %.2f dQ %.2f dK %.2f dV %.2f", desc, (int)cases[ci].kind, c[0].worst,
                    c[1].worst, nc > 2 ? c[2].worst : 0.0, nc > 2 ? c[3].worst : 0.0,
                    nc > 2 ? c[4].worst : 0.0, c[0].normwise / c[0].nw_bound,
                    nc > 2 ? c[2].normwise / c[2].nw_bound : 0.0, nc > 2 ? c[3].normwise / c[3].nw_bound : 0.0,
                    nc > 2 ? c[4].normwise / c[4].nw_bound : 0.0);
        for (int i = 0; i < nc; i++)   /* a correct kernel keeps well inside both bounds */
            cr_assert(c[i].worst <= 0.7 && (c[i].nw_bound == 0 || c[i].normwise <= 0.7 * c[i].nw_bound),
                      "%s input %d: %s uses %.2f of the element-wise and %.2f of the norm-wise bound",
                      desc, (int)cases[ci].kind, attn_tensor_name(c[i].kind), c[i].worst,
                      c[i].nw_bound > 0 ? c[i].normwise / c[i].nw_bound : 0.0);
        if (fails)
            for (int i = 0; i < nc; i++) attn_cmp_print(stderr, &c[i]);
        cr_assert_eq(fails, 0, "%s: a correct 16-bit kernel must pass", desc);
        attn_ref_free(&r);
        attn_host_free(&t);
    }
}

