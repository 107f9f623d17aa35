/* tests/test_oracle.c: the float64 oracle against hand computations, identities of softmax
 * attention, and finite differences (CPU only). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "test_util.h"

/* host tensors from float values (exactly representable ones in these tests) */
static void set_all(uint16_t *x, const float *v, size_t n, attn_dtype t)
{
    for (size_t i = 0; i < n; i++) test_set(x, i, v[i], t);
}

Test(oracle, hand_computed_2x2)
{
    /* N=2, d=2, scale 1: S = Q K^T = [[1, 0], [0, 1]] */
    attn_problem p = test_problem(1, 1, 1, 2, 2, 2, 0);
    p.scale = 1.0f;
    attn_host t;
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    float q[] = { 1, 0, 0, 1 }, k[] = { 1, 0, 0, 1 }, v[] = { 1, 2, 3, 4 };
    set_all(t.q, q, 4, p.dtype); set_all(t.k, k, 4, p.dtype); set_all(t.v, v, 4, p.dtype);
    attn_ref r;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    double e = exp(1.0), p0 = e / (e + 1), p1 = 1 / (e + 1);
    /* row 0: P = [e, 1] / (e + 1); row 1: P = [1, e] / (e + 1) */
    cr_assert_float_eq(r.o[0], p0 * 1 + p1 * 3, 1e-12);
    cr_assert_float_eq(r.o[1], p0 * 2 + p1 * 4, 1e-12);
    cr_assert_float_eq(r.o[2], p1 * 1 + p0 * 3, 1e-12);
    cr_assert_float_eq(r.o[3], p1 * 2 + p0 * 4, 1e-12);
    cr_assert_float_eq(r.lse[0], log(e + 1), 1e-12);
    cr_assert_float_eq(r.lse[1], log(e + 1), 1e-12);
    attn_ref_free(&r);

    /* causal: row 0 sees key 0 only, so O_0 = V_0 and L_0 = S_00 = 1 */
    t.p.causal = 1;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    cr_assert_float_eq(r.o[0], 1.0, 1e-12);
    cr_assert_float_eq(r.o[1], 2.0, 1e-12);
    cr_assert_float_eq(r.lse[0], 1.0, 1e-12);
    cr_assert_float_eq(r.o[2], p1 * 1 + p0 * 3, 1e-12); /* row 1 sees both */
    attn_ref_free(&r);
    attn_host_free(&t);
}

Test(oracle, causal_first_row_is_v0)
{
    /* N_q > N_k too: every row still sees key 0; row 0 sees only key 0 */
    attn_problem p = test_problem(2, 3, 1, 9, 5, 8, 1);
    attn_host t;
    attn_ref r;
    cr_assert_eq(test_inputs_and_ref(&t, &r, &p, 7, ATTN_FORWARD), 0);
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++)
            for (int c = 0; c < p.d; c++) {
                size_t oi = (((size_t)b * p.N_q + 0) * p.H + h) * p.d + c;
                size_t vi = (((size_t)b * p.N_k + 0) * p.H_kv + 0) * p.d + c;
                cr_assert_float_eq(r.o[oi], attn_to_f32(t.v[vi], p.dtype), 1e-12);
            }
    /* rows i >= N_k - 1 see every key: same as the non-causal result */
    attn_ref r2;
    t.p.causal = 0;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r2), 0);
    for (int b = 0; b < p.B; b++)
        for (int i = p.N_k - 1; i < p.N_q; i++)
            for (int h = 0; h < p.H; h++) {
                size_t li = ((size_t)b * p.H + h) * p.N_q + i;
                cr_assert_float_eq(r.lse[li], r2.lse[li], 1e-12);
            }
    attn_ref_free(&r); attn_ref_free(&r2);
    attn_host_free(&t);
}

Test(oracle, rows_of_p_sum_to_one)
{
    /* V = 1 everywhere: O = sum_j P_ij = 1 */
    attn_problem p = test_problem(1, 2, 2, 13, 29, 16, 0);
    for (int causal = 0; causal < 2; causal++) {
        p.causal = causal;
        attn_host t;
        cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
        attn_host_fill(&t, 3, ATTN_INPUT_NORMAL);
        for (size_t i = 0; i < attn_numel_kv(&p); i++) test_set(t.v, i, 1.0f, p.dtype);
        attn_ref r;
        cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
        for (size_t i = 0; i < attn_numel_q(&p); i++) cr_assert_float_eq(r.o[i], 1.0, 1e-12);
        attn_ref_free(&r);
        attn_host_free(&t);
    }
}

Test(oracle, shift_invariance)
{
    /* K_j -> K_j + w adds scale * (Q_i . w) to every score of row i: P and O unchanged,
     * L shifted by that constant. Small integers keep every input exact in bf16. */
    attn_problem p = test_problem(1, 1, 1, 6, 7, 4, 0);
    p.scale = 0.5f;
    attn_host t, t2;
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    cr_assert_eq(attn_host_alloc(&t2, &p, 0), 0);
    attn_rng g;
    attn_rng_init(&g, 11);
    const float w[4] = { 1, -2, 3, 0 };
    for (size_t i = 0; i < attn_numel_q(&p); i++) test_set(t.q, i, (float)((int)(attn_rng_u64(&g) % 5) - 2), p.dtype);
    for (size_t i = 0; i < attn_numel_kv(&p); i++) {
        float kv = (float)((int)(attn_rng_u64(&g) % 5) - 2), vv = (float)((int)(attn_rng_u64(&g) % 9) - 4);
        test_set(t.k, i, kv, p.dtype);
        test_set(t2.k, i, kv + w[i % 4], p.dtype);
        test_set(t.v, i, vv, p.dtype);
    }
    memcpy(t2.q, t.q, attn_numel_q(&p) * 2);
    memcpy(t2.v, t.v, attn_numel_kv(&p) * 2);
    attn_ref r, r2;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    cr_assert_eq(attn_oracle(&t2, ATTN_FORWARD, NULL, &r2), 0);
    for (size_t i = 0; i < attn_numel_q(&p); i++) cr_assert_float_eq(r.o[i], r2.o[i], 1e-12);
    for (int i = 0; i < p.N_q; i++) {
        double shift = 0;
        for (int c = 0; c < 4; c++) shift += attn_to_f32(t.q[i * 4 + c], p.dtype) * w[c];
        cr_assert_float_eq(r2.lse[i], r.lse[i] + p.scale * shift, 1e-10);
    }
    attn_ref_free(&r); attn_ref_free(&r2);
    attn_host_free(&t); attn_host_free(&t2);
}

Test(oracle, gqa_equals_repeated_kv)
{
    /* H_kv = 1 (MQA) and H_kv = 2 against H_kv = H with K, V repeated; dK, dV of a shared
     * head are the sums over its query heads */
    for (int hkv = 1; hkv <= 2; hkv++)
        for (int causal = 0; causal < 2; causal++) {
            attn_problem p = test_problem(2, 4, hkv, 11, 9, 8, causal), pr = p;
            pr.H_kv = p.H;
            int G = p.H / p.H_kv;
            attn_host t, tr;
            cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
            cr_assert_eq(attn_host_alloc(&tr, &pr, 1), 0);
            attn_host_fill(&t, 5 + hkv, ATTN_INPUT_NORMAL);
            memcpy(tr.q, t.q, attn_numel_q(&p) * 2);
            memcpy(tr.d_o, t.d_o, attn_numel_q(&p) * 2);
            for (int b = 0; b < p.B; b++)
                for (int j = 0; j < p.N_k; j++)
                    for (int h = 0; h < p.H; h++)
                        for (int c = 0; c < p.d; c++) {
                            size_t src = (((size_t)b * p.N_k + j) * p.H_kv + h / G) * p.d + c;
                            size_t dst = (((size_t)b * p.N_k + j) * p.H + h) * p.d + c;
                            tr.k[dst] = t.k[src];
                            tr.v[dst] = t.v[src];
                        }
            attn_ref r, rr;
            cr_assert_eq(attn_oracle(&t, ATTN_BACKWARD, NULL, &r), 0);
            cr_assert_eq(attn_oracle(&tr, ATTN_BACKWARD, NULL, &rr), 0);
            for (size_t i = 0; i < attn_numel_q(&p); i++) {
                cr_assert_float_eq(r.o[i], rr.o[i], 1e-12);
                cr_assert_float_eq(r.dq[i], rr.dq[i], 1e-12);
            }
            for (size_t i = 0; i < attn_numel_lse(&p); i++) cr_assert_float_eq(r.lse[i], rr.lse[i], 1e-12);
            for (int b = 0; b < p.B; b++)
                for (int j = 0; j < p.N_k; j++)
                    for (int g = 0; g < p.H_kv; g++)
                        for (int c = 0; c < p.d; c++) {
                            double sk = 0, sv = 0;
                            for (int h = g * G; h < (g + 1) * G; h++) {
                                size_t ri = (((size_t)b * p.N_k + j) * p.H + h) * p.d + c;
                                sk += rr.dk[ri]; sv += rr.dv[ri];
                            }
                            size_t i = (((size_t)b * p.N_k + j) * p.H_kv + g) * p.d + c;
                            cr_assert_float_eq(r.dk[i], sk, 1e-12);
                            cr_assert_float_eq(r.dv[i], sv, 1e-12);
                        }
            attn_ref_free(&r); attn_ref_free(&rr);
            attn_host_free(&t); attn_host_free(&tr);
        }
}

/* loss = sum(O * dO) from float inputs */
static double loss_of(const attn_problem *p, const float *q, const float *k, const float *v,
                      const float *d_o, const unsigned char *mask)
{
    attn_ref r;
    cr_assert_eq(attn_oracle_f32(p, q, k, v, NULL, mask, ATTN_FORWARD, NULL, &r), 0);
    double l = 0;
    for (size_t i = 0; i < attn_numel_q(p); i++) l += r.o[i] * d_o[i];
    attn_ref_free(&r);
    return l;
}

/* Central differences of loss_of against the oracle's dQ, dK, dV, element by element; mask: the
 * block mask when p.block_mask. */
static void fd_check_masked(attn_problem p, const unsigned char *mask)
{
    size_t nq = attn_numel_q(&p), nkv = attn_numel_kv(&p);
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *d_o = malloc(nq * 4);
    attn_rng g;
    attn_rng_init(&g, 99 + (uint64_t)p.causal);
    for (size_t i = 0; i < nq; i++) { q[i] = (float)attn_rng_normal(&g); d_o[i] = (float)attn_rng_normal(&g); }
    for (size_t i = 0; i < nkv; i++) { k[i] = (float)attn_rng_normal(&g); v[i] = (float)attn_rng_normal(&g); }
    attn_ref r;
    cr_assert_eq(attn_oracle_f32(&p, q, k, v, d_o, mask, ATTN_BACKWARD, NULL, &r), 0);
    const float h = 1e-3f;
    struct { float *x; size_t n; const double *grad; const char *name; } ts[] = {
        { q, nq, r.dq, "dQ" }, { k, nkv, r.dk, "dK" }, { v, nkv, r.dv, "dV" } };
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < ts[t].n; i++) {
            float x0 = ts[t].x[i];
            ts[t].x[i] = x0 + h;
            double hp = (double)ts[t].x[i] - x0; /* the step actually taken in float */
            double lp = loss_of(&p, q, k, v, d_o, mask);
            ts[t].x[i] = x0 - h;
            double hm = x0 - (double)ts[t].x[i];
            double lm = loss_of(&p, q, k, v, d_o, mask);
            ts[t].x[i] = x0;
            double fd = (lp - lm) / (hp + hm);
            cr_assert(fabs(fd - ts[t].grad[i]) <= 1e-5 * (1 + fabs(fd)),
                      "%s[%zu]: finite difference %.9f, oracle %.9f (causal=%d, window=%d, "
                      "mask=%d)", ts[t].name, i, fd, ts[t].grad[i], p.causal, p.window,
                      p.block_mask);
        }
    attn_ref_free(&r);
    free(q); free(k); free(v); free(d_o);
}

static void fd_check(attn_problem p) { fd_check_masked(p, NULL); }

Test(oracle, backward_matches_finite_differences)
{
    fd_check(test_problem(1, 2, 1, 3, 4, 3, 0));
    fd_check(test_problem(1, 2, 1, 5, 3, 3, 1));
    fd_check(test_problem(2, 2, 2, 3, 3, 2, 1));
    attn_problem p = test_problem(1, 2, 1, 6, 5, 3, 1);
    p.window = 2;   /* a causal sliding window */
    fd_check(p);
    p.causal = 0;   /* and a band, rows 5 past the keys seeing none */
    p.N_q = 8;
    fd_check(p);
}

/* The same through a block mask, per head: 2 x 3 tiles of 128 (the last ones ragged), where
 * head 1's first tile row is all 0 (its rows 0 .. 127 see no key: zero gradients), alone and
 * ANDed with causal and a window that cuts tiles in part. */
Test(oracle, masked_backward_matches_finite_differences, .timeout = 120)
{
    attn_problem p = test_problem(1, 2, 1, 150, 260, 2, 0);
    p.block_mask = 1; p.bm_b = 1; p.bm_h = 2;
    const unsigned char mask[2 * 2 * 3] = { 1, 0, 1,  0, 1, 1,     /* head 0 */
                                            0, 0, 0,  1, 0, 1 };   /* head 1 */
    cr_assert_eq(attn_mask_tiles_q(&p) * attn_mask_tiles_k(&p), 6);
    fd_check_masked(p, mask);
    p.causal = 1; p.window = 100;
    fd_check_masked(p, mask);
}

/* A sliding window: as wide as the sequence, it changes nothing (bitwise); of width 1 with
 * causal, row i sees key i alone (O_i = V_i, L_i = S_ii); rows that see no key get O = 0 and
 * L = -inf, which the check accepts only as -inf. */
Test(oracle, sliding_window)
{
    attn_problem p = test_problem(1, 2, 1, 40, 30, 8, 1);
    attn_host t;
    attn_ref a, b;
    cr_assert_eq(test_inputs_and_ref(&t, &a, &p, 5, ATTN_FORWARD), 0);
    t.p.window = 40;
    test_same_forward(&t, &a, &b, "a window as wide as the sequence");
    attn_ref_free(&b);
    t.p.window = 1;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &b), 0);
    for (int i = 0; i < p.N_k; i++)
        for (int c = 0; c < p.d; c++) {
            const size_t oi = ((size_t)i * p.H + 1) * p.d + c, vi = ((size_t)i * p.H_kv + 0) * p.d + c;
            cr_assert_float_eq(b.o[oi], attn_to_f32(t.v[vi], p.dtype), 1e-12);
        }
    attn_ref_free(&a); attn_ref_free(&b);
    t.p.causal = 0; t.p.window = 5;   /* rows 34 .. 39 are 5 or more past the last key */
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &b), 0);
    for (int i = 0; i < p.N_q; i++) {
        const double L = b.lse[(size_t)1 * p.N_q + i];
        if (i >= 34) {
            cr_assert(L == -INFINITY, "row %d: L = %g", i, L);
            for (int c = 0; c < p.d; c++) cr_assert(b.o[((size_t)i * p.H + 1) * p.d + c] == 0.0);
        } else {
            cr_assert(isfinite(L), "row %d", i);
        }
    }
    test_round_ref(&t, &b, 0);
    attn_cmp c;
    cr_assert_eq(attn_compare(&c, ATTN_T_LSE, &t.p, NULL, t.lse, b.lse, NULL, NULL, NULL), 0,
                 "-inf against -inf passes");
    t.lse[(size_t)1 * p.N_q + 36] = 0.0f;
    cr_assert_neq(attn_compare(&c, ATTN_T_LSE, &t.p, NULL, t.lse, b.lse, NULL, NULL, NULL), 0,
                  "a finite L where no key is visible fails");
    t.lse[(size_t)1 * p.N_q + 36] = -INFINITY;
    t.lse[(size_t)1 * p.N_q + 3] = -INFINITY;
    cr_assert_neq(attn_compare(&c, ATTN_T_LSE, &t.p, NULL, t.lse, b.lse, NULL, NULL, NULL), 0,
                  "-inf where keys are visible fails");
    attn_ref_free(&b);
    attn_host_free(&t);
}

Test(oracle, sampling_covers_big_shapes)
{
    attn_problem p = test_problem(1, 2, 1, 16384, 16384, 128, 1);
    attn_sample s;
    attn_sample_choose(&s, &p, ATTN_FORWARD, 1);
    cr_assert(s.sampled);
    cr_assert_eq(s.rows_q, (size_t)64 * p.H * p.B);
    cr_assert(strstr(s.note, "64 of 16384") != NULL, "%s", s.note);
    attn_sample_free(&s);
    attn_sample_choose(&s, &p, ATTN_BACKWARD, 1);
    cr_assert(s.sampled && s.assisted && !s.skipped,
              "a 16384^2 x 128 head is too big for the oracle's own forward, not for an assisted check: %s", s.note);
    cr_assert(strstr(s.note, "L from the oracle") != NULL, "%s", s.note);
    attn_sample_free(&s);
    p.N_q = p.N_k = 1 << 26;   /* 67M tokens: even the assisted sampled rows are too many */
    attn_sample_choose(&s, &p, ATTN_BACKWARD, 1);
    cr_assert(s.skipped && strstr(s.note, "skipped for size") != NULL, "%s", s.note);
    attn_sample_free(&s);
    p.N_q = p.N_k = 16384;
    p.N_q = p.N_k = 4096; p.d = 64; p.B = 4; p.H = 8; p.H_kv = 2;
    attn_sample_choose(&s, &p, ATTN_BACKWARD, 1);
    cr_assert(s.sampled && !s.skipped, "%s", s.note);
    cr_assert(s.rows_kv > 0 && s.rows_q > 0);
    attn_sample_free(&s);
    p.N_q = p.N_k = 100;
    attn_sample_choose(&s, &p, ATTN_BACKWARD, 1);
    cr_assert(!s.sampled && !s.skipped && s.mask_q == NULL, "%s", s.note);
    attn_sample_free(&s);
}

Test(oracle, sampled_rows_match_full)
{
    /* a sampled forward computes exactly the full forward's values on its rows */
    attn_problem p = test_problem(1, 2, 2, 300, 200, 16, 1);
    attn_host t;
    attn_ref full, part;
    cr_assert_eq(test_inputs_and_ref(&t, &full, &p, 2, ATTN_BACKWARD), 0);
    attn_sample s = { 0 };
    s.mask_q = calloc((size_t)p.B * p.N_q * p.H, 1);
    s.mask_kv = calloc((size_t)p.B * p.N_k * p.H_kv, 1);
    s.mask_unit = calloc((size_t)p.B * p.H_kv, 1);
    s.mask_unit[1] = 1;
    s.mask_q[(size_t)17 * p.H + 1] = 1;
    s.mask_kv[(size_t)150 * p.H_kv + 1] = 1;
    s.sampled = 1;
    cr_assert_eq(attn_oracle(&t, ATTN_BACKWARD, &s, &part), 0);
    for (int c = 0; c < p.d; c++) {
        size_t qi = ((size_t)17 * p.H + 1) * p.d + c, ki = ((size_t)150 * p.H_kv + 1) * p.d + c;
        cr_assert_float_eq(part.dq[qi], full.dq[qi], 1e-12);
        cr_assert_float_eq(part.dk[ki], full.dk[ki], 1e-12);
        cr_assert_float_eq(part.dv[ki], full.dv[ki], 1e-12);
    }
    attn_sample_free(&s);
    attn_ref_free(&full); attn_ref_free(&part);
    attn_host_free(&t);
}

/* An assisted backward (its own L, D from the run's O) gives the full oracle's gradients when the
 * run's O is the oracle's own, rounded as a stage stores it: the only difference is that
 * rounding, entering through D; the run's L is never read. Its own O and L of the
 * sampled rows are the full oracle's, bit for bit; an assisted sample without the run's outputs
 * is refused. */
Test(oracle, assisted_backward_matches_full)
{
    attn_problem p = test_problem(2, 4, 2, 300, 200, 16, 1);
    p.dtype = ATTN_FP16;
    attn_host t;
    attn_ref full, part;
    cr_assert_eq(test_inputs_and_ref(&t, &full, &p, 3, ATTN_BACKWARD), 0);
    test_round_ref(&t, &full, 0);   /* the run's O and L: the oracle's, rounded as a stage stores them */
    attn_sample s = { 0 };
    s.mask_q = calloc((size_t)p.B * p.N_q * p.H, 1);
    s.mask_kv = calloc((size_t)p.B * p.N_k * p.H_kv, 1);
    s.mask_unit = calloc((size_t)p.B * p.H_kv, 1);
    s.mask_unit[1 * p.H_kv + 1] = 1;                    /* batch 1, kv head 1: query heads 2, 3 */
    const int qrows[] = { 0, 17, 299 }, krows[] = { 0, 150, 199 };
    for (int k = 0; k < 3; k++) {
        s.mask_q[((size_t)1 * p.N_q + qrows[k]) * p.H + 3] = 1;
        s.mask_kv[((size_t)1 * p.N_k + krows[k]) * p.H_kv + 1] = 1;
    }
    s.sampled = s.assisted = 1;
    float *q = attn_host_to_f32(t.q, attn_numel_q(&p), p.dtype);
    float *kk = attn_host_to_f32(t.k, attn_numel_kv(&p), p.dtype);
    float *v = attn_host_to_f32(t.v, attn_numel_kv(&p), p.dtype);
    float *d_o = attn_host_to_f32(t.d_o, attn_numel_q(&p), p.dtype);
    cr_assert_eq(attn_oracle_f32(&p, q, kk, v, d_o, NULL, ATTN_BACKWARD, &s, &part), -1,
                 "an assisted sample without the run's outputs must be refused");
    free(q); free(kk); free(v); free(d_o);
    cr_assert_eq(attn_oracle(&t, ATTN_BACKWARD, &s, &part), 0);
    double worst = 0.0;
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < p.d; c++) {
            const size_t qi = (((size_t)1 * p.N_q + qrows[k]) * p.H + 3) * p.d + c;
            const size_t ki = (((size_t)1 * p.N_k + krows[k]) * p.H_kv + 1) * p.d + c;
            cr_assert_float_eq(part.o[qi], full.o[qi], 1e-12);
            const double pairs[3][2] = { { part.dq[qi], full.dq[qi] }, { part.dk[ki], full.dk[ki] },
                                         { part.dv[ki], full.dv[ki] } };
            for (int w = 0; w < 3; w++) {
                const double err = fabs(pairs[w][0] - pairs[w][1]) / (fabs(pairs[w][1]) + 1.0);
                if (err > worst) worst = err;
            }
        }
    cr_assert(worst < 4 * attn_unit_roundoff(p.dtype), "assisted vs full: %g", worst);
    cr_assert(worst > 0.0, "the run's rounded O must make some difference (the check can fail)");
    /* the reference never reads the run's L: a run whose L is off by 0.02 everywhere gets the
     * same gradients to check against, so its own L (and the gradients it computed from it) fail */
    for (size_t i = 0; i < attn_numel_lse(&p); i++) t.lse[i] += 0.02f;
    attn_ref again;
    cr_assert_eq(attn_oracle(&t, ATTN_BACKWARD, &s, &again), 0);
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < p.d; c++) {
            const size_t qi = (((size_t)1 * p.N_q + qrows[k]) * p.H + 3) * p.d + c;
            const size_t ki = (((size_t)1 * p.N_k + krows[k]) * p.H_kv + 1) * p.d + c;
            cr_assert(again.dq[qi] == part.dq[qi] && again.dk[ki] == part.dk[ki] &&
                      again.dv[ki] == part.dv[ki], "the assisted reference read the run's L");
        }
    attn_ref_free(&again);
    attn_sample_free(&s);
    attn_ref_free(&full); attn_ref_free(&part);
    attn_host_free(&t);
}

/* Block masks. Generators: a random mask has about its density, local and global and strided
 * the tiles they name, bad patterns are refused. The oracle: an all-ones mask is bitwise no mask;
 * all zeros gives O = 0 and L = -inf; a mask of tile (1, 1) alone gives rows 128-255 exactly the
 * dense attention of those rows over keys 128-255; the FLOP count's visible pairs equal a count
 * pair by pair. */
Test(mask, generators)
{
    char err[ATTN_MSG_LEN];
    attn_problem p = test_problem(2, 4, 4, 128 * 40, 128 * 40, 16, 0);
    unsigned char *m = NULL;
    cr_assert_eq(attn_mask_generate(&p, &m, "random:0.25", 7, err), 0, "%s", err);
    cr_assert(p.block_mask && p.bm_b == 2 && p.bm_h == 4, "random: one mask per (b, h)");
    const double density = p.pairs / (4.0 * 2 * p.N_q * (double)p.N_k);
    cr_assert(fabs(density - 0.25) < 0.02, "density %g", density);
    cr_assert_eq(attn_mask_generate(&p, &m, "local:256,global:128", 7, err), 0, "%s", err);
    cr_assert(p.bm_b == 1 && p.bm_h == 1);
    cr_assert(attn_mask_at(&p, m, 0, 0, 10, 9) && attn_mask_at(&p, m, 0, 0, 10, 11) &&
              !attn_mask_at(&p, m, 0, 0, 10, 8) && attn_mask_at(&p, m, 0, 0, 10, 0) &&
              attn_mask_at(&p, m, 0, 0, 0, 30), "local within 256 tokens (1 tile), global the first tile");
    cr_assert_eq(attn_mask_generate(&p, &m, "strided:3", 7, err), 0, "%s", err);
    cr_assert(attn_mask_at(&p, m, 0, 0, 10, 4) && !attn_mask_at(&p, m, 0, 0, 10, 5));
    const char *bad[] = { "random:1.5", "random:0", "random:0.1,local:128", "local:x", "wide:3",
                          "local:1.5", "local", "" };
    for (int k = 0; k < 8; k++) {
        err[0] = 0;
        cr_assert_eq(attn_mask_generate(&p, &m, bad[k], 7, err), -1, "'%s' accepted", bad[k]);
        cr_assert(err[0] && !strchr(err, '\n'), "%s", err);
    }
    free(m);
}

Test(mask, oracle_and_flops)
{
    attn_problem p = test_problem(1, 2, 1, 300, 300, 8, 0);
    attn_host t;
    attn_ref dense, r;
    cr_assert_eq(test_inputs_and_ref(&t, &dense, &p, 9, ATTN_FORWARD), 0);
    const int T = attn_mask_tiles_q(&p);   /* 3 x 3 tiles */
    t.p.block_mask = 1; t.p.bm_b = 1; t.p.bm_h = 1;
    t.block_mask = malloc((size_t)T * T);
    memset(t.block_mask, 1, (size_t)T * T);
    test_same_forward(&t, &dense, &r, "an all-ones mask");
    t.p.pairs = attn_mask_pairs(&t.p, t.block_mask);
    cr_assert_float_eq(attn_flops(&t.p, ATTN_FORWARD), attn_flops(&p, ATTN_FORWARD), 1e-6);
    attn_ref_free(&r);
    memset(t.block_mask, 0, (size_t)T * T);
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    for (size_t e = 0; e < attn_numel_lse(&p); e++) cr_assert(r.lse[e] == -INFINITY);
    for (size_t e = 0; e < attn_numel_q(&p); e++) cr_assert(r.o[e] == 0.0);
    cr_assert(attn_mask_pairs(&t.p, t.block_mask) == 0.0);
    attn_ref_free(&r);
    t.block_mask[1 * T + 1] = 1;   /* tile (1, 1): rows and keys 128 .. 255 */
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    attn_problem ps = test_problem(1, 2, 1, 128, 128, 8, 0);
    attn_host sub;
    cr_assert_eq(attn_host_alloc(&sub, &ps, 0), 0);
    memcpy(sub.q, t.q + (size_t)128 * p.H * p.d, attn_numel_q(&ps) * 2);
    memcpy(sub.k, t.k + (size_t)128 * p.H_kv * p.d, attn_numel_kv(&ps) * 2);
    memcpy(sub.v, t.v + (size_t)128 * p.H_kv * p.d, attn_numel_kv(&ps) * 2);
    attn_ref rs;
    cr_assert_eq(attn_oracle(&sub, ATTN_FORWARD, NULL, &rs), 0);
    for (size_t e = 0; e < attn_numel_q(&ps); e++)
        cr_assert_float_eq(r.o[(size_t)128 * p.H * p.d + e], rs.o[e], 1e-12, "o of row %zu", e / (p.H * p.d));
    cr_assert(r.lse[0] == -INFINITY && isfinite(r.lse[128]) && r.lse[256] == -INFINITY);
    attn_ref_free(&rs); attn_host_free(&sub);
    /* visible pairs with causal, a window and a random mask: against a count pair by pair */
    t.p.causal = 1; t.p.window = 100;
    for (int k = 0; k < T * T; k++) t.block_mask[k] = (unsigned char)(k % 2);
    double brute = 0.0;
    for (int i = 0; i < p.N_q; i++)
        for (int j = 0; j < p.N_k; j++)
            if (j <= i && i - 100 < j && t.block_mask[(i / 128) * T + j / 128]) brute += 1.0;
    cr_assert_float_eq(attn_mask_pairs(&t.p, t.block_mask), brute * p.B * p.H, 1e-9);
    attn_ref_free(&r); attn_ref_free(&dense);
    attn_host_free(&t);
}

Test(dtype, conversions_round_to_nearest_even)
{
    cr_assert_eq(attn_f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(attn_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);           /* tie -> even */
    cr_assert_eq(attn_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);       /* tie -> even (up) */
    cr_assert_eq(attn_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    cr_assert_eq(attn_f32_to_f16(1.0f), 0x3C00);
    cr_assert_eq(attn_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);           /* tie -> even */
    cr_assert_eq(attn_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
    cr_assert_eq(attn_f32_to_f16(65504.0f), 0x7BFF);
    cr_assert_eq(attn_f32_to_f16(65519.0f), 0x7BFF);
    cr_assert_eq(attn_f32_to_f16(65520.0f), 0x7C00);                  /* overflow -> inf */
    cr_assert_eq(attn_f32_to_f16(0x1p-24f), 0x0001);                  /* smallest subnormal */
    cr_assert_eq(attn_f32_to_f16(0x1p-25f), 0x0000);                  /* tie -> even (0) */
    cr_assert_eq(attn_f32_to_f16(0x1.8p-25f), 0x0001);
    cr_assert_eq(attn_f32_to_f16(-2.0f), 0xC000);
    cr_assert(isnan(attn_f16_to_f32(attn_f32_to_f16(NAN))));
    cr_assert(isnan(attn_bf16_to_f32(attn_f32_to_bf16(NAN))));
    cr_assert(isnan(attn_bf16_to_f32(0xFFFF)) && isnan(attn_f16_to_f32(0xFFFF)), "poison is NaN");
    /* every finite 16-bit value survives f32 and back */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) != 0x7C00) cr_assert_eq(attn_f32_to_f16(attn_f16_to_f32((uint16_t)h)), h);
        if ((h & 0x7F80) != 0x7F80) cr_assert_eq(attn_f32_to_bf16(attn_bf16_to_f32((uint16_t)h)), h);
    }
}

Test(dtype, normal_inputs_look_normal)
{
    attn_rng g;
    attn_rng_init(&g, 1);
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) { double x = attn_rng_normal(&g); s += x; s2 += x * x; }
    cr_assert(fabs(s / n) < 0.01 && fabs(s2 / n - 1) < 0.02, "mean %f var %f", s / n, s2 / n);
    /* inputs are never all zeros or ones, and differ by seed */
    attn_problem p = test_problem(1, 1, 1, 8, 8, 8, 0);
    attn_host a, b;
    attn_host_alloc(&a, &p, 1); attn_host_alloc(&b, &p, 1);
    attn_host_fill(&a, 1, ATTN_INPUT_NORMAL); attn_host_fill(&b, 2, ATTN_INPUT_NORMAL);
    cr_assert(memcmp(a.q, b.q, 128) != 0 && memcmp(a.q, a.k, 128) != 0 && memcmp(a.d_o, a.q, 128) != 0);
    attn_host_free(&a); attn_host_free(&b);
}
