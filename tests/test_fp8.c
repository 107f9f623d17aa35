/* tests/test_fp8.c: the e4m3 side of the harness (CPU only): the e4m3 encoding. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "test_util.h"

/* Every code decodes to the value its bits say and encodes back to itself; the finite values
 * increase with the code; NaN, saturation and ties to even. */
Test(fp8, e4m3_codes)
{
    float prev = -1.0f;
    for (int c = 0; c < 128; c++) {
        const float x = attn_e4m3_to_f32((uint8_t)c), y = attn_e4m3_to_f32((uint8_t)(c | 0x80));
        if (c == 0x7F) {
            cr_assert(isnan(x) && isnan(y), "0x7F and 0xFF are NaN");
            continue;
        }
        const int e = c >> 3, m = c & 7;
        const double want = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
        cr_assert(x == (float)want && y == -x, "code 0x%02x: %g, want %g", c, x, want);
        cr_assert(c == 0 || x > prev, "code 0x%02x does not increase", c);
        prev = x;
        cr_assert_eq(attn_f32_to_e4m3(x), c, "0x%02x does not encode back", c);
        cr_assert_eq(attn_f32_to_e4m3(y), c | 0x80, "0x%02x does not encode back", c | 0x80);
    }
    cr_assert_eq(attn_e4m3_to_f32(0x7E), 448.0f);
    cr_assert_eq(attn_e4m3_to_f32(0x01), 0x1p-9f);
    cr_assert_eq(attn_f32_to_e4m3(NAN), 0x7F);
    cr_assert_eq(attn_f32_to_e4m3(-NAN) & 0x7F, 0x7F);
    cr_assert_eq(attn_f32_to_e4m3(INFINITY), 0x7E, "saturates");
    cr_assert_eq(attn_f32_to_e4m3(-INFINITY), 0xFE);
    cr_assert_eq(attn_f32_to_e4m3(1e6f), 0x7E);
    cr_assert_eq(attn_f32_to_e4m3(464.0f), 0x7E);
    /* ties to even: 1 + 1/16 between 1 and 1.125 goes to 1 (mantissa 0), 1 + 3/16 to 1.25 */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.0625f)), 1.0f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.1875f)), 1.25f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.0626f)), 1.125f);
    /* the top binade: 432 between 416 and 448 goes to 448 (mantissa 6) */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(432.0f)), 448.0f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(431.0f)), 416.0f);
    /* subnormals: half the smallest goes to 0, one and a half to 2 steps (even) */
    cr_assert_eq(attn_f32_to_e4m3(0x1p-10f), 0x00);
    cr_assert_eq(attn_f32_to_e4m3(0x1.8p-9f), 0x02);
    cr_assert_eq(attn_f32_to_e4m3(-0x1p-11f), 0x80);
    /* rounding up out of the subnormals and out of a binade */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(0x1.fp-7f)), 0x1p-6f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.97f)), 2.0f);
}

/* The relative error of a rounding is at most 2^-4 in the normal range (3 mantissa bits) and
 * the absolute error at most 2^-10 below it, over a sweep of values. */
Test(fp8, e4m3_rounding_error)
{
    for (double x = 1e-4; x < 448.0; x *= 1.0007) {
        const double y = attn_e4m3_to_f32(attn_f32_to_e4m3((float)x));
        if (x >= 0x1p-6)
            cr_assert(fabs(y - x) <= 0x1p-4 * x, "%g -> %g", x, y);
        else
            cr_assert(fabs(y - x) <= 0x1p-10, "%g -> %g", x, y);
    }
}

/* ---- quantization ------------------------------------------------------------------ */

/* The scale index (b * H_kv + kv head) of element e of Q (q = 1) or of K, V. */
static size_t scale_index(const attn_problem *p, size_t e, int q)
{
    const size_t row = e / (size_t)p->d;
    const int heads = q ? p->H : p->H_kv, N = q ? p->N_q : p->N_k;
    const size_t b = row / (size_t)heads / (size_t)N;
    const int h = (int)(row % (size_t)heads);
    return b * (size_t)p->H_kv + (size_t)(q ? h / (p->H / p->H_kv) : h);
}

/* Check one tensor of an e4m3 host against the rule: per (batch, kv head) scale = amax / 448
 * over the first n elements (1 for a slice with no nonzero element there), every element
 * e4m3(x / scale), the slice's amax stored as 448. */
static void check_quantized(const attn_problem *p, const float *x32, const unsigned char *x8,
                            const float *scale, size_t n, int q, const char *name)
{
    const size_t ns = (size_t)p->B * p->H_kv;
    double amax[64] = { 0 };
    cr_assert(ns <= 64);
    for (size_t e = 0; e < n; e++) {
        const size_t s = scale_index(p, e, q);
        if (fabs(x32[e]) > amax[s]) amax[s] = fabs(x32[e]);
    }
    for (size_t s = 0; s < ns; s++)
        cr_assert(scale[s] == (amax[s] > 0 ? (float)amax[s] / 448.0f : 1.0f), "%s scale %zu: %g for amax %g",
                  name, s, scale[s], amax[s]);
    for (size_t e = 0; e < n; e++) {
        const size_t s = scale_index(p, e, q);
        cr_assert_eq(x8[e], attn_f32_to_e4m3(x32[e] / scale[s]), "%s[%zu]", name, e);
        if (fabs(x32[e]) == amax[s] && amax[s] > 0)
            cr_assert_eq(x8[e] & 0x7F, 0x7E, "%s[%zu]: the slice's amax is not stored as 448", name, e);
    }
}

/* Q, K, V scaled per (batch, kv head), Q's scale shared by the query heads of a group (GQA:
 * H = 4, H_kv = 2); a slice of zeros gets scale 1; dequantized values are e4m3 times scale. */
Test(fp8, quantize_per_batch_and_kv_head)
{
    attn_problem p = test_problem(2, 4, 2, 37, 53, 64, 0);
    p.dtype = ATTN_E4M3;
    attn_host t;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    cr_assert(!t.q && !t.k && !t.v && t.q8 && t.q32 && t.o);
    attn_host_fill(&t, 5, ATTN_INPUT_NORMAL);
    /* the slice (b = 1, kv head 0) of K all zero; V of (b = 0, kv head 1) 1000 times larger */
    for (int j = 0; j < p.N_k; j++)
        for (int c = 0; c < p.d; c++) {
            t.k32[(((size_t)1 * p.N_k + j) * p.H_kv + 0) * p.d + c] = 0.0f;
            t.v32[(((size_t)0 * p.N_k + j) * p.H_kv + 1) * p.d + c] *= 1000.0f;
        }
    cr_assert_eq(attn_host_quantize(&t, err), 0, "%s", err);
    check_quantized(&p, t.q32, t.q8, t.q_descale, attn_numel_q(&p), 1, "Q");
    check_quantized(&p, t.k32, t.k8, t.k_descale, attn_numel_kv(&p), 0, "K");
    check_quantized(&p, t.v32, t.v8, t.v_descale, attn_numel_kv(&p), 0, "V");
    cr_assert_eq(t.k_descale[1 * p.H_kv + 0], 1.0f);
    cr_assert(t.v_descale[1] > 500.0f * t.v_descale[0]);
    float *q, *k, *v;
    cr_assert_eq(attn_host_dequantize(&t, &q, &k, &v), 0);
    for (size_t e = 0; e < attn_numel_q(&p); e++) {
        cr_assert(q[e] == attn_e4m3_to_f32(t.q8[e]) * t.q_descale[scale_index(&p, e, 1)]);
        /* within 2^-4 of the value drawn, or 2^-10 scales below e4m3's normal range */
        const double sc = t.q_descale[scale_index(&p, e, 1)];
        cr_assert(fabs(q[e] - t.q32[e]) <= fmax(0x1p-4 * fabs(t.q32[e]), 0x1p-10 * sc), "Q[%zu]", e);
    }
    for (size_t e = 0; e < attn_numel_kv(&p); e++) {
        cr_assert(k[e] == attn_e4m3_to_f32(t.k8[e]) * t.k_descale[scale_index(&p, e, 0)]);
        cr_assert(v[e] == attn_e4m3_to_f32(t.v8[e]) * t.v_descale[scale_index(&p, e, 0)]);
    }
    free(q); free(k); free(v);
    /* a value that is not finite: one line, no scale */
    t.v32[7] = INFINITY;
    cr_assert_eq(attn_host_quantize(&t, err), -1);
    cr_assert(strstr(err, "V") && strstr(err, "finite") && !strchr(err, '\n'), "%s", err);
    attn_host_free(&t);
}

/* A timed host (period) holds the first elements only: its scales are those of the part it
 * holds, 1 for slices with nothing there. */
Test(fp8, quantize_the_part_a_timed_host_holds)
{
    attn_problem p = test_problem(2, 4, 2, 40, 40, 64, 0);
    p.dtype = ATTN_E4M3;
    attn_host t;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    attn_host_fill(&t, 6, ATTN_INPUT_NORMAL);
    t.period = 3000;   /* Q: the first 11.7 tokens of batch 0; K, V: the first 23.4 */
    cr_assert_eq(attn_host_quantize(&t, err), 0, "%s", err);
    check_quantized(&p, t.q32, t.q8, t.q_descale, t.period, 1, "Q");
    check_quantized(&p, t.k32, t.k8, t.k_descale, t.period, 0, "K");
    cr_assert(t.q_descale[2] == 1.0f && t.q_descale[3] == 1.0f && t.k_descale[2] == 1.0f);
    cr_assert(t.q_descale[0] != 1.0f && t.q_descale[1] != 1.0f);
    attn_host_free(&t);
}

/* The oracle of an e4m3 host is that of its dequantized inputs, and the draws are those of
 * the 16-bit dtypes (before rounding): O within a few e4m3 roundings of bf16's. */
Test(fp8, oracle_of_the_dequantized_inputs)
{
    attn_problem p = test_problem(1, 4, 2, 50, 70, 64, 1), pb = p;
    p.dtype = ATTN_E4M3;
    attn_host t, tb;
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    cr_assert_eq(attn_host_alloc(&tb, &pb, 0), 0);
    attn_host_fill(&t, 8, ATTN_INPUT_NORMAL);
    attn_host_fill(&tb, 8, ATTN_INPUT_NORMAL);
    for (size_t e = 0; e < attn_numel_q(&p); e++)
        cr_assert_eq(attn_f32_to_bf16(t.q32[e]), tb.q[e], "the same draws, Q[%zu]", e);
    attn_ref r, rf, rb;
    cr_assert_eq(attn_oracle(&t, ATTN_FORWARD, NULL, &r), 0);
    float *q, *k, *v;
    cr_assert_eq(attn_host_dequantize(&t, &q, &k, &v), 0);
    cr_assert_eq(attn_oracle_f32(&p, q, k, v, NULL, ATTN_FORWARD, NULL, &rf), 0);
    cr_assert_eq(attn_oracle(&tb, ATTN_FORWARD, NULL, &rb), 0);
    double e2 = 0, r2 = 0;
    for (size_t e = 0; e < attn_numel_q(&p); e++) {
        cr_assert(r.o[e] == rf.o[e], "O[%zu]", e);
        e2 += (r.o[e] - rb.o[e]) * (r.o[e] - rb.o[e]);
        r2 += rb.o[e] * rb.o[e];
    }
    cr_assert(sqrt(e2 / r2) < 0.1 && sqrt(e2 / r2) > 1e-3, "e4m3 vs bf16 inputs: %g", sqrt(e2 / r2));
    free(q); free(k); free(v);
    attn_ref_free(&r); attn_ref_free(&rf); attn_ref_free(&rb);
    attn_host_free(&t); attn_host_free(&tb);
}
