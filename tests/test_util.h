/* tests/test_util.h: small helpers shared by the Criterion tests. */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include <stdlib.h>
#include <criterion/criterion.h>
#include "harness.h"

/* A problem with the given sizes, scale 1/sqrt(d), bf16 unless changed by the caller. */
static inline attn_problem test_problem(int B, int H, int H_kv, int N_q, int N_k, int d, int causal)
{
    attn_problem p;
    attn_problem_default(&p);
    p.B = B; p.H = H; p.H_kv = H_kv; p.N_q = N_q; p.N_k = N_k; p.d = d; p.causal = causal;
    p.scale = (float)(1.0 / __builtin_sqrt((double)d));
    return p;
}

/* Set element i of a 16-bit host tensor from a float (rounded to the dtype). */
static inline void test_set(uint16_t *x, size_t i, float v, attn_dtype t) { x[i] = attn_from_f32(v, t); }

/* Host tensors of p with fresh inputs from seed, and the oracle's reference of every row in
 * direction dir. 0, or -1 when out of host memory. */
static inline int test_inputs_and_ref(attn_host *t, attn_ref *r, const attn_problem *p, uint64_t seed,
                                      attn_dir dir)
{
    if (attn_host_alloc(t, p, dir == ATTN_BACKWARD)) return -1;
    attn_host_fill(t, seed, ATTN_INPUT_NORMAL);
    return attn_oracle(t, dir, NULL, r);
}

/* The oracle's forward again for t (whose problem or mask the caller changed) into *r, and its O
 * bitwise equal to ref's: a change that must change nothing. */
static inline void test_same_forward(attn_host *t, const attn_ref *ref, attn_ref *r, const char *what)
{
    cr_assert_eq(attn_oracle(t, ATTN_FORWARD, NULL, r), 0, "%s: the oracle failed", what);
    for (size_t e = 0; e < attn_numel_q(&t->p); e++)
        cr_assert(r->o[e] == ref->o[e], "%s: o[%zu] differs", what, e);
}

/* Round the oracle's float64 results to what a perfect kernel would store. */
static inline void test_round_ref(attn_host *t, const attn_ref *r, int backward)
{
    const attn_problem *p = &t->p;
    for (size_t i = 0; i < attn_numel_q(p); i++) t->o[i] = attn_from_f32((float)r->o[i], p->dtype);
    for (size_t i = 0; i < attn_numel_lse(p); i++) t->lse[i] = (float)r->lse[i];
    if (backward) {
        for (size_t i = 0; i < attn_numel_q(p); i++) t->dq[i] = attn_from_f32((float)r->dq[i], p->dtype);
        for (size_t i = 0; i < attn_numel_kv(p); i++) {
            t->dk[i] = attn_from_f32((float)r->dk[i], p->dtype);
            t->dv[i] = attn_from_f32((float)r->dv[i], p->dtype);
        }
    }
}

#endif
