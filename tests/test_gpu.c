/* tests/test_gpu.c: every stage (and the cuBLAS baseline) on the GPU against the float64
 * oracle, over many shapes, dtypes and hard inputs; deterministic backwards; the sampled --check of a stage program; stage 6 on a GPU with less
 * shared memory (emulated). Each test skips with the
 * reason when there is no CUDA device. A stage refusing a shape (its check()) is logged and
 * skipped for that shape, not a failure. Seeds: each case has its own (set ATTN_TEST_SEED
 * to draw another set). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test_util.h"

extern const attn_stage *const attn_stages[];
extern const int attn_nstages;
extern const attn_stage *const attn_baseline;

static void need_gpu(void)
{
    int n;
    char why[ATTN_MSG_LEN];
    if (attn_gpu_available(&n, why) != 0) cr_skip_test("no CUDA GPU (%s): GPU test skipped", why);
}

static uint64_t test_seed(uint64_t k)
{
    const char *s = getenv("ATTN_TEST_SEED");
    return (s ? strtoull(s, NULL, 10) * 1000003ull : 0) + 7919ull * k + 1;
}

/* One line on stderr saying whether the GPU tests run, and on what (the other GPU tests
 * skip silently without a device; criterion --verbose shows each skip). */
Test(gpu, device)
{
    int n;
    char why[ATTN_MSG_LEN];
    if (attn_gpu_available(&n, why) != 0) {
        fprintf(stderr, "[SKIP] gpu tests: no CUDA GPU (%s): every gpu:: test is skipped\n", why);
        cr_skip_test("no CUDA GPU (%s)", why);
    }
    struct cudaDeviceProp prop;
    cr_assert_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    fprintf(stderr, "[INFO] gpu tests on %s (sm_%d%d), %d stages%s\n", prop.name, prop.major, prop.minor,
            attn_nstages, attn_baseline ? " + cublas" : "");
}

typedef struct {
    int B, H, H_kv, N_q, N_k, d, causal, fp16;
    attn_input_kind kind;
    int fwd_only;
    uint64_t seed;
} gcase;

#define C(B, H, Hkv, Nq, Nk, d, causal, fp16, kind, fwd_only) \
    { B, H, Hkv, Nq, Nk, d, causal, fp16, kind, fwd_only, 0 }
#define N_ ATTN_INPUT_NORMAL
#define LL ATTN_INPUT_LARGE_LOGITS
#define FR ATTN_INPUT_FLAT_ROWS
#define ML ATTN_INPUT_MEDIUM_LOGITS
#define OU ATTN_INPUT_OUTLIERS

static const gcase fixed_cases[] = {
    /* fp16 subset */
    C(2, 2, 2, 17, 17, 64, 1, 1, N_, 0), C(2, 2, 2, 255, 255, 128, 0, 1, N_, 0),
    C(2, 2, 2, 1000, 1000, 64, 1, 1, N_, 0), C(2, 2, 2, 1000, 1000, 128, 0, 1, N_, 0),
    /* GQA and MQA */
    C(2, 4, 2, 255, 255, 64, 1, 0, N_, 0), C(1, 4, 1, 1000, 1000, 128, 0, 0, N_, 0),
    C(2, 4, 1, 17, 17, 128, 1, 1, N_, 0), C(1, 4, 2, 1000, 1000, 64, 1, 1, N_, 0),
    /* N_q != N_k; a causal query that sees a single key (N_q = 1) */
    C(2, 2, 2, 17, 255, 64, 0, 0, N_, 0), C(2, 2, 2, 17, 255, 64, 1, 0, N_, 0),
    C(2, 2, 2, 255, 17, 64, 0, 0, N_, 0), C(2, 2, 2, 255, 17, 64, 1, 0, N_, 0),
    C(2, 2, 1, 1, 255, 128, 1, 0, N_, 0), C(1, 4, 2, 255, 1000, 128, 0, 1, N_, 0),
    C(2, 2, 2, 1000, 255, 64, 1, 0, N_, 0),
    /* numerically hard inputs: scores of order +-1e4 (forward only, see harness.h) and
     * +-1e2 (P nearly one-hot), near-constant rows */
    C(2, 2, 2, 255, 255, 64, 0, 0, LL, 1), C(1, 2, 2, 1000, 1000, 128, 1, 0, LL, 1),
    C(2, 2, 1, 255, 255, 64, 1, 1, LL, 1),
    C(2, 2, 2, 255, 255, 64, 1, 0, ML, 0), C(1, 2, 1, 1000, 1000, 128, 0, 1, ML, 0),
    C(2, 2, 2, 1000, 1000, 64, 0, 0, FR, 0), C(2, 2, 2, 255, 255, 128, 1, 1, FR, 0),
    /* a sequence one past a multiple of every tile size: 4097 at d = 128, 3841 (20 x 192 + 1) at
     * d = 64, where the Hopper stages take 192 rows (forward only: the backward oracle at this
     * size costs more than the test is worth; the program check covers the backward) */
    C(1, 2, 1, 4097, 4097, 128, 1, 0, N_, 1), C(1, 2, 2, 3841, 3841, 64, 0, 1, N_, 1),
    /* head dim 256 (stages that refuse it are skipped): odd N, causal, GQA, N_q != N_k, fp16,
     * hard inputs */
    C(2, 2, 2, 17, 17, 256, 1, 0, N_, 1), C(2, 2, 1, 255, 255, 256, 0, 1, N_, 1),
    C(1, 4, 2, 1000, 1000, 256, 1, 0, N_, 1), C(2, 2, 2, 17, 1000, 256, 1, 1, N_, 1),
    C(2, 2, 2, 1000, 255, 256, 0, 0, N_, 1), C(1, 2, 2, 255, 255, 256, 0, 0, LL, 1),
    C(2, 2, 2, 255, 255, 256, 1, 0, FR, 1),
};

ParameterizedTestParameters(gpu, against_oracle)
{
    static gcase cases[96];
    int n = 0;
    /* bf16: the full grid N x d x causal */
    const int Ns[] = { 1, 17, 255, 1000 };
    for (int i = 0; i < 4; i++)
        for (int d = 64; d <= 128; d += 64)
            for (int causal = 0; causal < 2; causal++)
                cases[n++] = (gcase)C(2, 2, 2, Ns[i], Ns[i], d, causal, 0, N_, 0);
    for (size_t i = 0; i < sizeof fixed_cases / sizeof fixed_cases[0]; i++) cases[n++] = fixed_cases[i];
    for (int i = 0; i < n; i++) cases[i].seed = test_seed((uint64_t)i);
    return cr_make_param_array(gcase, cases, (size_t)n);
}

static void copy_inputs(attn_host *dst, const attn_host *src)
{
    if (src->p.dtype == ATTN_E4M3) {   /* the bytes and their scales (forward only: no dO) */
        const size_t ns = (size_t)src->p.B * src->p.H_kv * sizeof(float);
        memcpy(dst->q8, src->q8, attn_numel_q(&src->p));
        memcpy(dst->k8, src->k8, attn_numel_kv(&src->p));
        memcpy(dst->v8, src->v8, attn_numel_kv(&src->p));
        memcpy(dst->q_descale, src->q_descale, ns);
        memcpy(dst->k_descale, src->k_descale, ns);
        memcpy(dst->v_descale, src->v_descale, ns);
        return;
    }
    memcpy(dst->q, src->q, attn_numel_q(&src->p) * 2);
    memcpy(dst->k, src->k, attn_numel_kv(&src->p) * 2);
    memcpy(dst->v, src->v, attn_numel_kv(&src->p) * 2);
    if (src->d_o && dst->d_o) memcpy(dst->d_o, src->d_o, attn_numel_q(&src->p) * 2);
}

/* 1 iff the n 16-bit values of x are all finite: the runner poisons outputs with NaN, so a
 * comparison of two runs' bits says nothing of a kernel that writes none of them. */
static int all_finite(const uint16_t *x, size_t n, attn_dtype t)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(attn_to_f32(x[i], t))) return 0;
    return 1;
}

static void print_cmp(const char *what, const attn_cmp *c, int nc)
{
    fprintf(stderr, "%s\n", what);
    for (int i = 0; i < nc; i++) attn_cmp_print(stderr, &c[i]);
}

/* How much of the bound correct results use: per tensor, the largest element-wise err/tol and
 * norm-wise error / bound met so far in this test's process. Each oracle comparison goes
 * through compare_all, which prints a "margin:" line whenever one of them grows, so that a GPU
 * run's log shows how close the passing stages come to the bounds (the check's design aims at
 * 0.7 at most). */
static double margin_ew[5], margin_nw[5];

static int compare_all(attn_cmp *c, int *nc, const attn_host *t, attn_dir dir,
                       const attn_ref *r, const char *what)
{
    const int fails = attn_compare_all(c, nc, t, dir, r, NULL);
    for (int i = 0; i < *nc; i++) {
        const int k = (int)c[i].kind;
        const double nw = c[i].nw_bound > 0 ? c[i].normwise / c[i].nw_bound : 0.0;
        if (c[i].worst > margin_ew[k] || nw > margin_nw[k]) {
            if (c[i].worst > margin_ew[k]) margin_ew[k] = c[i].worst;
            if (nw > margin_nw[k]) margin_nw[k] = nw;
            fprintf(stderr, "margin: %-3s element-wise %.3f norm-wise %.3f  (%s%s)\n",
                    attn_tensor_name(c[i].kind), margin_ew[k], margin_nw[k], what,
                    fails ? ", FAILED" : "");
        }
    }
    return fails;
}

/* Whether a stage may refuse p in direction dir on this GPU (its compute capability sm): the
 * refusals of the oracle shapes on an H200 are the head dim 256 of the stages that stop at 128
 * (the mma.sync ones, and the Hopper backwards) and any 16-bit input to an e4m3-only stage. On
 * another GPU, code for another architecture and a smaller shared memory may refuse more. Any
 * other refusal is a failure: a check() that refused too much would otherwise pass unseen. */
static int refusal_expected(const attn_stage *st, const attn_problem *p, attn_dir dir, int sm)
{
    int smem = 0;
    if (sm < st->min_sm || (st->min_sm >= 90 && sm != 90)) return 1;
    if (attn_smem_per_block(&smem) != 0 || smem < 227 * 1024) return 1;
    if (st->fp8 == ATTN_FP8_ONLY && p->dtype != ATTN_E4M3) return 1;
    return p->d == 256 && (st->min_sm < 90 || dir == ATTN_BACKWARD);
}

/* Every stage this GPU (compute capability sm) can run, and the cuBLAS baseline, forward and
 * (where it has one) backward on a copy of in's inputs, against the oracle's r; a refusal counts
 * as a failure unless may_refuse and refusal_expected. The number of failed runs; what names
 * the inputs in the messages. */
static int every_stage_against(const attn_host *in, const attn_ref *r, int sm, const char *what,
                               int may_refuse)
{
    int failures = 0;
    const int nall = attn_nstages + (attn_baseline ? 1 : 0);
    for (int si = 0; si < nall; si++) {
        const attn_stage *st = si < attn_nstages ? attn_stages[si] : attn_baseline;
        /* sm_90a code runs on compute capability 9.0 only (the stages' check says so) */
        if (sm < st->min_sm || (st->min_sm >= 90 && sm != 90) || st->fp8 == ATTN_FP8_ONLY) continue;
        for (int dir = 0; dir <= (st->backward ? 1 : 0); dir++) {
            attn_host t;
            cr_assert_eq(attn_host_alloc(&t, &in->p, 1), 0);
            copy_inputs(&t, in);
            attn_run_info info;
            attn_run_opts opts = { .quiet = 1 };
            const attn_run_status rs = attn_run(st, &t, (attn_dir)dir, &opts, &info);
            attn_cmp c[5];
            int nc;
            if (rs == ATTN_RUN_REFUSED && may_refuse && refusal_expected(st, &in->p, (attn_dir)dir, info.sm)) {
                fprintf(stderr, "[INFO] %s %s, %s: refused: %s\n", st->name, dir ? "backward" : "forward",
                        what, info.why);
            } else if (rs != ATTN_RUN_OK) {
                fprintf(stderr, "%s %s, %s: did not run: %s\n", st->name, dir ? "backward" : "forward",
                        what, info.why);
                failures++;
            } else if (compare_all(c, &nc, &t, (attn_dir)dir, r, st->name)) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s %s, %s: FAIL against the oracle", st->name,
                         dir ? "backward" : "forward", what);
                print_cmp(msg, c, nc);
                failures++;
            }
            attn_host_free(&t);
        }
    }
    return failures;
}

/* A stage that refused every shape would pass every test that skips refusals: each stage the
 * GPU can run (its min_sm) must run a plain shape, forward and (if it has one) backward, and
 * pass it against the oracle. A stage of e4m3 only (ATTN_FP8_ONLY) is held to that by
 * fp8_stages_against_oracle. */
Test(gpu, every_stage_runs_a_plain_shape, .timeout = 300)
{
    need_gpu();
    struct cudaDeviceProp prop;
    cr_assert_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    const int sm = prop.major * 10 + prop.minor;
    attn_problem p = test_problem(1, 2, 2, 255, 255, 64, 1);
    attn_host in;
    cr_assert_eq(attn_host_alloc(&in, &p, 1), 0);
    attn_host_fill(&in, test_seed(4000), ATTN_INPUT_NORMAL);
    attn_ref r;
    cr_assert_eq(attn_oracle(&in, ATTN_BACKWARD, NULL, &r), 0);
    const int failures = every_stage_against(&in, &r, sm, "a plain shape", 0);
    attn_ref_free(&r);
    attn_host_free(&in);
    cr_assert_eq(failures, 0, "%d stage runs of the plain shape refused or failed", failures);
}

/* Scores far below 0 where N_k ends inside a key tile: Q all 1 and K all -(1 + u), u in [0, 1)
 * drawn per element, scale 2, so that every score lies in -4d .. -2d and each row's L near its
 * largest (about -3d). A zero-padded key past N_k that scored 0 instead of -inf would get P =
 * exp(0 - L), which overflows, and dS times its zero K row would be NaN in dQ. Every stage,
 * forward and backward, at d = 64 and 128, N = 255. */
Test(gpu, very_negative_scores_at_a_ragged_key_tile, .timeout = 300)
{
    need_gpu();
    attn_oracle_threads = 2;
    struct cudaDeviceProp prop;
    cr_assert_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    const int sm = prop.major * 10 + prop.minor;
    int failures = 0;
    for (int d = 64; d <= 128; d += 64) {
        attn_problem p = test_problem(1, 2, 2, 255, 255, d, 0);
        p.scale = 2.0f;
        attn_host in;
        cr_assert_eq(attn_host_alloc(&in, &p, 1), 0);
        attn_host_fill(&in, test_seed(4100 + d), ATTN_INPUT_NORMAL);
        attn_rng g;
        attn_rng_init(&g, test_seed(4200 + d));
        for (size_t e = 0; e < attn_numel_q(&p); e++) test_set(in.q, e, 1.0f, p.dtype);
        for (size_t e = 0; e < attn_numel_kv(&p); e++)
            test_set(in.k, e, -(1.0f + (float)attn_rng_uniform(&g)), p.dtype);
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_BACKWARD, NULL, &r), 0);
        char what[64];
        snprintf(what, sizeof what, "very negative scores at d = %d", d);
        failures += every_stage_against(&in, &r, sm, what, 1);
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    cr_assert_eq(failures, 0, "%d stage runs with very negative scores failed", failures);
}

ParameterizedTest(gcase *gc, gpu, against_oracle, .timeout = 600)
{
    need_gpu();
    attn_oracle_threads = 2; /* Criterion runs several tests at once */
    attn_problem p = test_problem(gc->B, gc->H, gc->H_kv, gc->N_q, gc->N_k, gc->d, gc->causal);
    p.dtype = gc->fp16 ? ATTN_FP16 : ATTN_BF16;
    char shape[256];
    attn_problem_str(&p, "", ATTN_FORWARD, shape, sizeof shape);
    int any_bwd = 0;
    for (int i = 0; i < attn_nstages; i++) any_bwd |= attn_stages[i]->backward != NULL;
    if (attn_baseline) any_bwd |= attn_baseline->backward != NULL;
    int bwd = any_bwd && !gc->fwd_only;

    attn_host in;
    cr_assert_eq(attn_host_alloc(&in, &p, 1), 0);
    attn_host_fill(&in, gc->seed, gc->kind);
    attn_ref r;
    cr_assert_eq(attn_oracle(&in, bwd ? ATTN_BACKWARD : ATTN_FORWARD, NULL, &r), 0);

    int failures = 0, ran = 0;
    char failed[1024] = "";
    int nall = attn_nstages + (attn_baseline ? 1 : 0);
    for (int si = 0; si < nall; si++) {
        const attn_stage *st = si < attn_nstages ? attn_stages[si] : attn_baseline;
        for (int dir = 0; dir <= (bwd && st->backward ? 1 : 0); dir++) {
            attn_host t;
            cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
            copy_inputs(&t, &in);
            attn_run_info info;
            attn_run_opts opts = { .quiet = 1 };
            attn_run_status rs = attn_run(st, &t, (attn_dir)dir, &opts, &info);
            const char *dn = dir ? "backward" : "forward";
            if (rs == ATTN_RUN_REFUSED || rs == ATTN_RUN_NO_MEMORY) {
                const int expected = rs == ATTN_RUN_NO_MEMORY || refusal_expected(st, &p, (attn_dir)dir, info.sm);
                fprintf(stderr, "[INFO] %s %s%s kind=%d: refused%s: %s\n", st->name, dn, shape,
                        (int)gc->kind, expected ? ", skipped" : " (unexpected: a failure)", info.why);
                if (!expected) {
                    failures++;
                    snprintf(failed + strlen(failed), sizeof failed - strlen(failed), " %s/%s(refused)", st->name, dn);
                }
                attn_host_free(&t);
                continue;
            }
            if (rs != ATTN_RUN_OK) {
                fprintf(stderr, "%s %s%s seed %llu: %s\n", st->name, dn, shape,
                        (unsigned long long)gc->seed, info.why);
                failures++;
                snprintf(failed + strlen(failed), sizeof failed - strlen(failed), " %s/%s(cuda)", st->name, dn);
                attn_host_free(&t);
                continue;
            }
            ran++;
            attn_cmp c[5];
            int nc;
            if (compare_all(c, &nc, &t, (attn_dir)dir, &r, st->name)) {
                char what[512];
                snprintf(what, sizeof what, "%s %s%s kind=%d seed %llu: FAIL against the oracle",
                         st->name, dn, shape, (int)gc->kind, (unsigned long long)gc->seed);
                print_cmp(what, c, nc);
                failures++;
                snprintf(failed + strlen(failed), sizeof failed - strlen(failed), " %s/%s", st->name, dn);
            }
            attn_host_free(&t);
        }
    }
    attn_ref_free(&r);
    attn_host_free(&in);
    if (ran == 0 && nall > 0) fprintf(stderr, "[INFO]%s: every stage refused this shape\n", shape);
    cr_assert_eq(failures, 0, "%s kind=%d seed %llu: failed:%s", shape, (int)gc->kind,
                 (unsigned long long)gc->seed, failed);
}

/* Backwards whose dQ is summed in a fixed order give the same bits twice: 06_fa2 with
 * --deterministic (a Q-outer dQ kernel), and 04_backward and 05_tensor_cores always (one block
 * per head adds to dQ, one K_j after the other). */
Test(gpu, deterministic_backward_is_bitwise_repeatable, .timeout = 300)
{
    need_gpu();
    static const struct { const char *name; int flag, d, causal; } cases[] = {
        { "04_backward", 0, 64, 1 }, { "05_tensor_cores", 0, 64, 1 }, { "06_fa2", 1, 64, 1 },
        { "10_fa3_backward", 1, 64, 1 }, { "10_fa3_backward", 1, 128, 0 }, { "10_fa3_backward", 1, 128, 1 },
        { "13_hopper_masks", 1, 64, 1 }, { "13_hopper_masks", 1, 128, 0 } };
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const attn_stage *st = NULL;
        for (int i = 0; i < attn_nstages; i++)
            if (!strcmp(attn_stages[i]->name, cases[c].name)) st = attn_stages[i];
        if (!st || !st->backward) continue;
        attn_problem p = test_problem(2, 4, 2, 1000, 1000, cases[c].d, cases[c].causal);
        p.deterministic = cases[c].flag;
        attn_host a, b;
        cr_assert_eq(attn_host_alloc(&a, &p, 1), 0);
        cr_assert_eq(attn_host_alloc(&b, &p, 1), 0);
        attn_host_fill(&a, test_seed(1000 + c), ATTN_INPUT_NORMAL);
        copy_inputs(&b, &a);
        attn_run_info info;
        attn_run_opts opts = { .quiet = 1 };
        attn_run_status rs = attn_run(st, &a, ATTN_BACKWARD, &opts, &info);
        if (rs == ATTN_RUN_REFUSED && refusal_expected(st, &p, ATTN_BACKWARD, info.sm)) {
            fprintf(stderr, "[INFO] %s refused: %s\n", st->name, info.why);
        } else {
            cr_assert_eq(rs, ATTN_RUN_OK, "%s: %s", st->name, info.why);
            cr_assert_eq(attn_run(st, &b, ATTN_BACKWARD, &opts, &info), ATTN_RUN_OK, "%s", info.why);
            cr_assert_eq(memcmp(a.dq, b.dq, attn_numel_q(&p) * 2), 0, "%s: dQ differs between two runs", st->name);
            cr_assert_eq(memcmp(a.dk, b.dk, attn_numel_kv(&p) * 2), 0, "%s: dK differs between two runs", st->name);
            cr_assert_eq(memcmp(a.dv, b.dv, attn_numel_kv(&p) * 2), 0, "%s: dV differs between two runs", st->name);
            cr_assert(all_finite(a.dq, attn_numel_q(&p), p.dtype) && all_finite(a.dk, attn_numel_kv(&p), p.dtype) &&
                      all_finite(a.dv, attn_numel_kv(&p), p.dtype), "%s: a gradient holds NaN or Inf (unwritten?)", st->name);
            ran++;
        }
        attn_host_free(&a);
        attn_host_free(&b);
    }
    if (!ran) cr_skip_test("no deterministic backward built or accepted");
}

/* Run a shell command, its output (stdout and stderr) into buf; returns its exit status, -1
 * if it did not exit. */
static int run_capture(const char *cmd, char *buf, size_t n)
{
    char out[] = "/tmp/attn_gpu_out_XXXXXX", full[2048];
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(full, sizeof full, "%s > %s 2>&1", cmd, out);
    int rc = system(full);
    FILE *f = fopen(out, "r");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    buf[got] = 0;
    if (f) fclose(f);
    unlink(out);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Run a program's --check (cmd): it must exit 0, print PASS, and print marker (NULL: nothing
 * more), which says how it checked. A refusal (exit 2) skips the test where may_refuse. */
static void expect_program_pass(const char *cmd, const char *marker, int may_refuse)
{
    char buf[8192];
    const int rc = run_capture(cmd, buf, sizeof buf);
    cr_assert(strstr(buf, "compared nothing") == NULL, "%s checked nothing:\n%s", cmd, buf);
    if (rc == 2 && may_refuse) cr_skip_test("refused: %s", buf);
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", cmd, rc, buf);
    if (marker) cr_assert(strstr(buf, marker) != NULL, "expected \"%s\" in:\n%s", marker, buf);
    cr_assert(strstr(buf, "check PASS") != NULL, "%s", buf);
}

/* More key tiles than the GPU holds at once (N = 17000: 133 blocks of 128 keys a head, one an SM
 * on 132 SMs): the deterministic turns of stages 10 and 13 fall back to the launch order, dense
 * and causal, and pass the program's sampled check. */
Test(gpu, deterministic_backward_past_one_wave, .timeout = 300)
{
    need_gpu();
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    static const char *const stages[] = { "10_fa3_backward", "13_hopper_masks" };
    for (int s = 0; s < 2; s++)
        for (int causal = 0; causal <= 1; causal++) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "%s/%s --batch 1 --heads 1 --seqlen 17000 --dim 128 "
                     "--backward --deterministic --check %s --seed %llu", build, stages[s],
                     causal ? "--causal" : "", (unsigned long long)test_seed(3600 + causal));
            expect_program_pass(cmd, "L from the oracle", 1);
        }
}

/* A Hopper pipeline that deadlocks (an mbarrier nothing arrives on) ends in an error within
 * twice MBAR_TIMEOUT_NS instead of hanging: tests/hopper_deadlock.cu. */
Test(gpu, a_deadlock_ends_in_an_error, .timeout = 120)
{
    need_gpu();
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char cmd[1024], buf[4096];
    snprintf(cmd, sizeof cmd, "%s/hopper_deadlock", build);
    const int rc = run_capture(cmd, buf, sizeof buf);
    if (rc == 2) cr_skip_test("%s", buf);
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", cmd, rc, buf);
    cr_assert(strstr(buf, "no error") == NULL, "%s", buf);
}

/* The layouts stage 11_fp8 assumes (the 8-bit A fragment, the V transpose's key order, e4m3
 * descriptors, the TMA of bytes, the conversion's byte order) hold on this GPU, bit for bit on
 * small integers: tests/fp8_layout.cu. */
Test(gpu, fp8_layouts_hold, .timeout = 120)
{
    need_gpu();
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char cmd[1024], buf[4096];
    snprintf(cmd, sizeof cmd, "%s/fp8_layout", build);
    if (access(cmd, X_OK) != 0) cr_skip_test("%s not built (no fp8 stage)", cmd);
    const int rc = run_capture(cmd, buf, sizeof buf);
    if (rc == 2) cr_skip_test("%s", buf);
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", cmd, rc, buf);
}

/* the program's --check on a shape big enough that rows are sampled */
Test(gpu, program_sampled_check, .timeout = 300)
{
    need_gpu();
    if (attn_nstages == 0) cr_skip_test("no stage built");
    const attn_stage *st = attn_stages[attn_nstages - 1];
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    for (int dir = 0; dir <= (st->backward ? 1 : 0); dir++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s/%s --batch 1 --heads 2 --seqlen 4096 --causal --check %s --seed %llu",
                 build, st->name, dir ? "--backward" : "", (unsigned long long)test_seed(2000));
        expect_program_pass(cmd, "(sampled)", 1);
    }
}

/* A run that is only timed draws ATTN_TIMED_PERIOD elements of each input and repeats them on
 * the device (attn_host_alloc_timed, the runner's put_input). At a shape just past the period
 * (36M elements a tensor), 06_fa2's O and L from such inputs match the oracle's on the full
 * tensors built by repeating the host's part, on rows sampled all over the tensor: a fault in
 * the repetition would show in every row past the period. */
Test(gpu, timed_inputs_repeat_on_the_device, .timeout = 300)
{
    need_gpu();
    const attn_stage *st = NULL;
    for (int i = 0; i < attn_nstages; i++)
        if (!strcmp(attn_stages[i]->name, "06_fa2")) st = attn_stages[i];
    if (!st) cr_skip_test("06_fa2 not built");
    attn_problem p = test_problem(1100, 1, 1, 256, 256, 128, 0);
    const size_t n = attn_numel_q(&p), period = ATTN_TIMED_PERIOD;
    cr_assert(n > period && n < 2 * period);
    attn_host t, f;
    cr_assert_eq(attn_host_alloc_timed(&t, &p, 0), 0);
    attn_host_fill(&t, test_seed(2200), ATTN_INPUT_NORMAL);
    cr_assert_eq(attn_host_alloc(&f, &p, 0), 0);
    for (size_t i = 0; i < n; i++) {
        f.q[i] = t.q[i % period];
        f.k[i] = t.k[i % period];
        f.v[i] = t.v[i % period];
    }
    t.o = malloc(n * 2);                        /* so that the runner copies O and L back */
    t.lse = malloc(attn_numel_lse(&p) * sizeof(float));
    cr_assert(t.o && t.lse);
    attn_run_info info;
    attn_run_opts opts = { .quiet = 1 };
    cr_assert_eq(attn_run(st, &t, ATTN_FORWARD, &opts, &info), ATTN_RUN_OK, "%s", info.why);
    memcpy(f.o, t.o, n * 2);
    memcpy(f.lse, t.lse, attn_numel_lse(&p) * sizeof(float));
    attn_sample s;
    attn_ref r;
    attn_sample_choose(&s, &p, ATTN_FORWARD, test_seed(2201));
    cr_assert(s.sampled, "%s", s.note);
    cr_assert_eq(attn_oracle(&f, ATTN_FORWARD, &s, &r), 0);
    attn_cmp c[5];
    int nc;
    const int fails = attn_compare_all(c, &nc, &f, ATTN_FORWARD, &r, &s);
    if (fails) print_cmp("06_fa2 on repeated inputs", c, nc);
    cr_assert_eq(fails, 0, "the inputs repeated on the device differ from the host's repetition");
    attn_ref_free(&r);
    attn_sample_free(&s);
    attn_host_free(&t);
    attn_host_free(&f);
}

/* A stage without masks refuses a sliding window with the reason, forward and backward,
 * instead of computing dense attention for it. */
Test(gpu, dense_stages_refuse_a_window, .timeout = 120)
{
    need_gpu();
    attn_problem p = test_problem(1, 2, 2, 100, 100, 64, 1);
    p.window = 16;
    for (int si = 0; si <= attn_nstages; si++) {
        const attn_stage *st = si < attn_nstages ? attn_stages[si] : attn_baseline;
        if (!st || st->masks) continue;
        for (int dir = 0; dir <= 1; dir++) {
            attn_host t;
            cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
            attn_host_fill(&t, 7, ATTN_INPUT_NORMAL);
            attn_run_info info;
            attn_run_opts opts = { .quiet = 1 };
            const attn_run_status rs = attn_run(st, &t, (attn_dir)dir, &opts, &info);
            attn_host_free(&t);
            cr_assert_eq(rs, ATTN_RUN_REFUSED, "%s %s ran a window", st->name, dir ? "backward" : "forward");
            cr_assert(strstr(info.why, "window") || strstr(info.why, "backward") || strstr(info.why, "capability"),
                      "%s: refused without the reason: %s", st->name, info.why);
        }
    }
}

/* A stage without an fp8 forward refuses e4m3 inputs in the runner too (attn_main refuses them
 * first), with the reason, instead of reading e4m3 bytes as 16-bit values. */
Test(gpu, stages_without_fp8_refuse_e4m3, .timeout = 120)
{
    need_gpu();
    attn_problem p = test_problem(1, 2, 2, 100, 100, 64, 0);
    p.dtype = ATTN_E4M3;
    for (int si = 0; si <= attn_nstages; si++) {
        const attn_stage *st = si < attn_nstages ? attn_stages[si] : attn_baseline;
        if (!st || st->fp8) continue;
        attn_host t;
        cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
        attn_host_fill(&t, 7, ATTN_INPUT_NORMAL);
        attn_run_info info;
        attn_run_opts opts = { .quiet = 1 };
        const attn_run_status rs = attn_run(st, &t, ATTN_FORWARD, &opts, &info);
        attn_host_free(&t);
        cr_assert_eq(rs, ATTN_RUN_REFUSED, "%s ran e4m3 inputs", st->name);
        cr_assert(strstr(info.why, "e4m3") || strstr(info.why, "capability"),
                  "%s: refused without the reason: %s", st->name, info.why);
    }
    /* and a stage of e4m3 only refuses 16-bit inputs, instead of reading them as e4m3 bytes */
    p.dtype = ATTN_BF16;
    p.d = 128;
    for (int si = 0; si < attn_nstages; si++) {
        const attn_stage *st = attn_stages[si];
        if (st->fp8 != ATTN_FP8_ONLY) continue;
        attn_host t;
        cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
        attn_host_fill(&t, 7, ATTN_INPUT_NORMAL);
        attn_run_info info;
        attn_run_opts opts = { .quiet = 1 };
        const attn_run_status rs = attn_run(st, &t, ATTN_FORWARD, &opts, &info);
        attn_host_free(&t);
        cr_assert_eq(rs, ATTN_RUN_REFUSED, "%s ran bf16 inputs", st->name);
        cr_assert(strstr(info.why, "e4m3") || strstr(info.why, "capability"),
                  "%s: refused without the reason: %s", st->name, info.why);
    }
}

/* Every stage with an fp8 forward (attn_stage.fp8) on e4m3 inputs against the oracle of the
 * dequantized inputs, at odd shapes, causal and not, GQA and MQA, the hard input kinds and
 * FlashAttention-3's outliers (with and without --hadamard). Each stage the GPU can run must run
 * some of them (a stage refusing every shape would pass otherwise). */
Test(gpu, fp8_stages_against_oracle, .timeout = 600)
{
    need_gpu();
    const attn_stage *st[8];
    int ns = 0;
    for (int i = 0; i < attn_nstages && ns < 8; i++)
        if (attn_stages[i]->fp8) st[ns++] = attn_stages[i];
    if (!ns) cr_skip_test("no stage with an fp8 forward built");
    static const gcase cases[] = {
        C(2, 2, 2, 17, 17, 64, 1, 0, N_, 1), C(2, 2, 2, 255, 255, 128, 0, 0, N_, 1),
        C(1, 4, 2, 1000, 1000, 128, 1, 0, N_, 1), C(2, 4, 1, 1000, 1000, 64, 0, 0, N_, 1),
        C(2, 2, 2, 17, 1000, 128, 1, 0, N_, 1), C(1, 2, 2, 1000, 255, 256, 0, 0, N_, 1),
        C(1, 2, 2, 4097, 4097, 128, 1, 0, N_, 1), C(2, 2, 2, 255, 255, 64, 1, 0, ML, 1),
        C(2, 2, 2, 1000, 1000, 128, 0, 0, FR, 1), C(1, 2, 1, 255, 255, 128, 1, 0, LL, 1),
        C(1, 2, 2, 1000, 1000, 128, 0, 0, OU, 1), C(2, 4, 2, 255, 255, 64, 1, 0, OU, 1),
    };
    int failures = 0, ran = 0, ran_by[8] = { 0 };
    for (size_t kh = 0; kh < 2 * (sizeof cases / sizeof cases[0]); kh++) {
        const size_t k = kh / 2;
        const gcase *gc = &cases[k];
        const int had = (int)(kh % 2);   /* with --hadamard: the outlier cases */
        if (had && gc->kind != OU) continue;
        attn_problem p = test_problem(gc->B, gc->H, gc->H_kv, gc->N_q, gc->N_k, gc->d, gc->causal);
        p.dtype = ATTN_E4M3;
        attn_host in;
        char err[ATTN_MSG_LEN];
        cr_assert_eq(attn_host_alloc(&in, &p, 0), 0);
        attn_host_fill(&in, test_seed(5000 + k), gc->kind);
        cr_assert_eq(attn_host_quantize(&in, had, test_seed(5000 + k), err), 0, "%s", err);
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_FORWARD, NULL, &r), 0);
        for (int si = 0; si < ns; si++) {
            attn_host t;
            cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
            copy_inputs(&t, &in);
            attn_run_info info;
            attn_run_opts opts = { .quiet = 1 };
            const attn_run_status rs = attn_run(st[si], &t, ATTN_FORWARD, &opts, &info);
            char shape[256];
            attn_problem_str(&p, st[si]->name, ATTN_FORWARD, shape, sizeof shape);
            if (rs == ATTN_RUN_NO_MEMORY ||
                (rs == ATTN_RUN_REFUSED && refusal_expected(st[si], &p, ATTN_FORWARD, info.sm))) {
                fprintf(stderr, "[INFO] %s kind=%d hadamard=%d: refused, skipped: %s\n", shape,
                        (int)gc->kind, had, info.why);
            } else if (rs != ATTN_RUN_OK) {
                fprintf(stderr, "%s kind=%d hadamard=%d: %s\n", shape, (int)gc->kind, had, info.why);
                failures++;
            } else {
                ran++;
                ran_by[si]++;
                attn_cmp c[5];
                int nc;
                /* O's lean, sum (x - r) r / sum r^2, printed for every run (the check bounds it
                 * at 2.5%; a correct simulated kernel leans up to 1.1%, on flat rows) */
                double num = 0.0, den = 0.0;
                for (size_t e = 0; e < attn_numel_q(&p); e++) {
                    num += (attn_bf16_to_f32(t.o[e]) - r.o[e]) * r.o[e];
                    den += r.o[e] * r.o[e];
                }
                fprintf(stderr, "[INFO] %s kind=%d hadamard=%d: O leans %+.3f%%\n", shape, (int)gc->kind,
                        had, den > 0 ? 100.0 * num / den : 0.0);
                if (compare_all(c, &nc, &t, ATTN_FORWARD, &r, st[si]->name)) {
                    char what[512];
                    snprintf(what, sizeof what, "%s kind=%d hadamard=%d: FAIL against the oracle", shape,
                             (int)gc->kind, had);
                    print_cmp(what, c, nc);
                    failures++;
                }
            }
            attn_host_free(&t);
        }
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    struct cudaDeviceProp prop;
    cr_assert_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    const int sm = prop.major * 10 + prop.minor;
    for (int si = 0; si < ns; si++)
        if (!ran_by[si] && sm >= st[si]->min_sm && !(st[si]->min_sm >= 90 && sm != 90)) {
            fprintf(stderr, "%s: refused every e4m3 shape\n", st[si]->name);
            failures++;
        }
    if (!ran && !failures) cr_skip_test("the fp8 stages refused every shape (not a compute capability 9.0 GPU?)");
    cr_assert_eq(failures, 0, "%d fp8 runs failed", failures);
}

/* A backward too big for the oracle's own forward of one head (N = 16384, d = 128: 3.4e10
 * multiply-adds a head) is checked with its own L and the run's O (an assisted sample), not skipped:
 * the last ladder stage with a backward, on sampled rows. */
Test(gpu, program_assisted_backward_check, .timeout = 300)
{
    need_gpu();
    const attn_stage *st = NULL;
    for (int i = 0; i < attn_nstages; i++)
        if (attn_stages[i]->backward) st = attn_stages[i];
    if (!st) cr_skip_test("no stage with a backward built");
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/%s --batch 1 --heads 2 --seqlen 16384 --dim 128 --backward --check --seed %llu",
             build, st->name, (unsigned long long)test_seed(2100));
    expect_program_pass(cmd, "L from the oracle", 1);
}

/* 06_fa2 on a GPU with 99 KiB of shared memory per block (an RTX 4090's 101376 bytes,
 * emulated with ATTN_SMEM_PER_BLOCK): the d = 64 backward takes 64 query rows per step and
 * passes its check, the d = 128 backward is refused with the reason. */
Test(gpu, small_shared_memory, .timeout = 300)
{
    need_gpu();
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char cmd[1024], buf[8192];
    snprintf(cmd, sizeof cmd, "test -x %s/06_fa2", build);
    if (system(cmd) != 0) cr_skip_test("%s/06_fa2 not built", build);
    for (int fp16 = 0; fp16 <= 1; fp16++) {
        snprintf(cmd, sizeof cmd,
                 "ATTN_SMEM_PER_BLOCK=101376 %s/06_fa2 --batch 2 --heads 4 --kv-heads 2 --seqlen 300 "
                 "--dim 64 --causal --backward --check --dtype %s --seed %llu",
                 build, fp16 ? "fp16" : "bf16", (unsigned long long)test_seed(3000 + fp16));
        expect_program_pass(cmd, NULL, 0);
    }
    snprintf(cmd, sizeof cmd,
             "ATTN_SMEM_PER_BLOCK=101376 %s/06_fa2 --batch 1 --heads 2 --seqlen 300 --dim 128 --backward",
             build);
    const int rc = run_capture(cmd, buf, sizeof buf);
    cr_assert_eq(rc, 2, "%s exited %d, expected 2 (refused):\n%s", cmd, rc, buf);
    cr_assert(strstr(buf, "shared memory") != NULL, "expected the reason:\n%s", buf);
}

/* The Hopper stages (compute capability 9.0 only) at the shapes where their schedules differ,
 * against the oracle: every head dim, causal and not, GQA, fp16, N a multiple of no tile. The
 * shapes with more query tiles than an H200 has SMs make the blocks of a persistent grid walk
 * several (from the counter when causal: tiles of unequal lengths); the causal d = 256 one has 40
 * heads where a section of the causal order holds 32, so a shorter one ends it; 1000 = 5 x 192
 * + 40 leaves the last two consumers of a head's last d = 64 tile without a row (pass_step); the
 * last two walk long rows with a partial last key tile. The ablation builds are checked by
 * make ablation. */
Test(gpu, hopper_stages_against_oracle, .timeout = 900)
{
    need_gpu();
    static const struct { int B, H, H_kv, N, d, causal, fp16; } shapes[] = {
        { 2, 4, 2, 1000, 128, 1, 0 }, { 1, 2, 2, 255, 64, 0, 1 }, { 2, 2, 1, 17, 256, 1, 0 },
        { 1, 2, 2, 4097, 64, 1, 0 }, { 1, 2, 1, 300, 256, 0, 1 },
        { 2, 4, 2, 1000, 128, 0, 0 }, { 1, 2, 2, 353, 128, 0, 1 }, { 1, 2, 1, 4100, 128, 1, 1 },
        { 1, 24, 8, 1200, 128, 0, 1 }, { 1, 32, 8, 700, 128, 1, 0 }, { 1, 40, 40, 500, 256, 1, 0 },
        { 1, 24, 8, 1100, 64, 1, 1 }, { 1, 24, 8, 1000, 64, 1, 0 }, { 1, 136, 136, 300, 256, 0, 0 },
        { 1, 2, 1, 8300, 128, 0, 1 }, { 1, 1, 1, 16500, 128, 1, 0 } };
    int failures = 0, ran = 0, hopper = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        attn_problem p = test_problem(shapes[k].B, shapes[k].H, shapes[k].H_kv, shapes[k].N,
                                      shapes[k].N, shapes[k].d, shapes[k].causal);
        p.dtype = shapes[k].fp16 ? ATTN_FP16 : ATTN_BF16;
        attn_host in;
        cr_assert_eq(attn_host_alloc(&in, &p, 0), 0);
        attn_host_fill(&in, test_seed(3000 + k), ATTN_INPUT_NORMAL);
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_FORWARD, NULL, &r), 0);
        for (int i = 0; i < attn_nstages; i++) {
            const attn_stage *st = attn_stages[i];
            if (st->min_sm < 90) continue;
            hopper += k == 0;
            attn_host t;
            cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
            copy_inputs(&t, &in);
            attn_run_info info;
            attn_run_opts opts = { .quiet = 1 };
            const attn_run_status rs = attn_run(st, &t, ATTN_FORWARD, &opts, &info);
            char shape[256];
            attn_problem_str(&p, st->name, ATTN_FORWARD, shape, sizeof shape);
            if (rs == ATTN_RUN_REFUSED && refusal_expected(st, &p, ATTN_FORWARD, info.sm)) {
                fprintf(stderr, "[INFO] %s: refused: %s\n", shape, info.why);
            } else if (rs != ATTN_RUN_OK) {
                fprintf(stderr, "%s: %s\n", shape, info.why);
                failures++;
            } else {
                attn_cmp c[5];
                int nc;
                ran++;
                if (compare_all(c, &nc, &t, ATTN_FORWARD, &r, st->name)) {
                    char what[512];
                    snprintf(what, sizeof what, "%s: FAIL against the oracle", shape);
                    print_cmp(what, c, nc);
                    failures++;
                }
            }
            attn_host_free(&t);
        }
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    if (!hopper) cr_skip_test("no Hopper stage built");
    if (!ran) cr_skip_test("the Hopper stages refused every run (not a compute capability 9.0 GPU?)");
    cr_assert_eq(failures, 0, "%d Hopper stage runs failed", failures);
}

/* ---- masks: the stages that run them (descriptor masks = 1) -------------------------------- */

/* The stages with masks that this GPU runs (a Hopper stage needs compute capability 9.0), in
 * ladder order; their number. */
static int masked_stages(const attn_stage **out, int max)
{
    int n = 0, dev = 0, major = 0, minor = 0;
    cr_assert_eq(cudaGetDevice(&dev), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
    for (int i = 0; i < attn_nstages && n < max; i++)
        if (attn_stages[i]->masks && (attn_stages[i]->min_sm < 90 || 10 * major + minor == 90))
            out[n++] = attn_stages[i];
    return n;
}

/* The dense stage a stage with masks is made from: the same tiles in the same order without a
 * mask, so an all-ones mask gives its bits. */
static const char *dense_parent(const char *name)
{
    if (!strcmp(name, "12_block_sparse")) return "06_fa2";
    if (!strcmp(name, "13_hopper_masks")) return "10_fa3_backward";
    return NULL;
}

/* Host tensors of p with fresh inputs from seed and, when spec is given, the block mask it
 * names (attn_mask_generate: sets t->p's mask fields). */
static void masked_inputs(attn_host *t, const attn_problem *p, const char *spec, uint64_t seed)
{
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_host_alloc(t, p, 1), 0);
    attn_host_fill(t, seed, ATTN_INPUT_NORMAL);
    if (spec) cr_assert_eq(attn_mask_generate(&t->p, &t->block_mask, spec, seed, err), 0, "%s", err);
}

/* Run st on a copy of in (inputs and mask), direction dir, into *t, with opts (NULL: a quiet
 * checked run); the run's status. */
static attn_run_status run_copy_opts(const attn_stage *st, const attn_host *in, attn_dir dir,
                                     attn_host *t, attn_run_info *info, const attn_run_opts *opts)
{
    cr_assert_eq(attn_host_alloc(t, &in->p, 1), 0);
    copy_inputs(t, in);
    if (in->block_mask) {
        t->block_mask = malloc(attn_mask_bytes(&in->p));
        cr_assert(t->block_mask != NULL);
        memcpy(t->block_mask, in->block_mask, attn_mask_bytes(&in->p));
    }
    const attn_run_opts quiet = { .quiet = 1 };
    return attn_run(st, t, dir, opts ? opts : &quiet, info);
}

static attn_run_status run_copy(const attn_stage *st, const attn_host *in, attn_dir dir, attn_host *t,
                                attn_run_info *info)
{
    return run_copy_opts(st, in, dir, t, info, NULL);
}

typedef struct {
    int B, H, H_kv, N_q, N_k, d, causal, window, fp16, deterministic;
    const char *mask;   /* attn_mask_generate's pattern, or NULL */
} mcase;

/* Host tensors of case mc with fresh inputs from seed, and its mask (masked_inputs). */
static void mcase_inputs(attn_host *in, const mcase *mc, uint64_t seed)
{
    attn_problem p = test_problem(mc->B, mc->H, mc->H_kv, mc->N_q, mc->N_k, mc->d, mc->causal);
    p.window = mc->window;
    p.dtype = mc->fp16 ? ATTN_FP16 : ATTN_BF16;
    p.deterministic = mc->deterministic;
    masked_inputs(in, &p, mc->mask, seed);
}

/* Stage st on a copy of in, direction dir, against the oracle's r; mask names the block mask in
 * the messages. A failure to run or a mismatch counts one in *failures; a refusal too, unless
 * may_refuse (then one [INFO] line). 1 if the run was compared, else 0. */
static int masked_run(const attn_stage *st, const attn_host *in, attn_dir dir, const attn_ref *r,
                      const char *mask, int may_refuse, int *failures)
{
    attn_host t;
    attn_run_info info;
    const attn_run_status rs = run_copy(st, in, dir, &t, &info);
    char shape[256];
    int ran = 0;
    attn_problem_str(&in->p, st->name, dir, shape, sizeof shape);
    if (rs == ATTN_RUN_REFUSED && may_refuse && refusal_expected(st, &in->p, dir, info.sm)) {
        fprintf(stderr, "[INFO] %s: refused: %s\n", shape, info.why);
    } else if (rs != ATTN_RUN_OK) {
        fprintf(stderr, "%s mask %s: %s\n", shape, mask ? mask : "-", info.why);
        (*failures)++;
    } else {
        attn_cmp c[5];
        int nc;
        ran = 1;
        if (compare_all(c, &nc, &t, dir, r, st->name)) {
            char what[512];
            snprintf(what, sizeof what, "%s mask %s: FAIL against the oracle", shape, mask ? mask : "-");
            print_cmp(what, c, nc);
            (*failures)++;
        }
    }
    attn_host_free(&t);
    return ran;
}

/* What a stage leaves in its workspace: every stage, both directions, (a) on a workspace poisoned
 * with 0x7F bytes instead of 0xFF (a tile counter or a semaphore that is not reset then reads
 * 2139062143, far past any tile or turn, where 0xFF's -1 may pass unseen), (b) called twice, the
 * second time on the workspace the first left, as timed runs call it. The shapes: more query
 * tiles than an H200 has SMs, so that persistent grids take tiles from their counter; the
 * deterministic backward's semaphores, with and without a mask; the e4m3 forwards. */
Test(gpu, workspace_left_behind_changes_nothing, .timeout = 600)
{
    need_gpu();
    attn_oracle_threads = 2;
    static const mcase cases[] = {
        { 1, 24, 8, 700, 700, 128, 1, 0, 0, 0, NULL },
        { 1, 4, 2, 700, 700, 64, 0, 0, 1, 1, NULL },
        { 1, 24, 8, 1100, 1100, 128, 0, 0, 0, 1, "random:0.3" },
    };
    static const attn_run_opts variants[] = { { .quiet = 1, .ws_poison = 0x7F }, { .quiet = 1, .twice = 1 } };
    static const char *variant_name[] = { "workspace poisoned 0x7F", "called twice" };
    int failures = 0, ran = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mcase *mc = &cases[k];
        attn_host in;
        mcase_inputs(&in, mc, test_seed(4300 + k));
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_BACKWARD, NULL, &r), 0);
        for (int si = 0; si < attn_nstages; si++) {
            const attn_stage *st = attn_stages[si];
            if (mc->mask && !st->masks) continue;
            for (int dir = 0; dir <= (st->backward ? 1 : 0); dir++)
                for (int v = 0; v < 2; v++) {
                    attn_host t;
                    attn_run_info info;
                    const attn_run_status rs = run_copy_opts(st, &in, (attn_dir)dir, &t, &info, &variants[v]);
                    char shape[256];
                    attn_problem_str(&in.p, st->name, (attn_dir)dir, shape, sizeof shape);
                    attn_cmp c[5];
                    int nc;
                    if (rs == ATTN_RUN_REFUSED && refusal_expected(st, &in.p, (attn_dir)dir, info.sm)) {
                        fprintf(stderr, "[INFO] %s: refused: %s\n", shape, info.why);
                    } else if (rs != ATTN_RUN_OK) {
                        fprintf(stderr, "%s, %s: %s\n", shape, variant_name[v], info.why);
                        failures++;
                    } else if (ran++, compare_all(c, &nc, &t, (attn_dir)dir, &r, st->name)) {
                        char what[512];
                        snprintf(what, sizeof what, "%s, %s: FAIL against the oracle", shape, variant_name[v]);
                        print_cmp(what, c, nc);
                        failures++;
                    }
                    attn_host_free(&t);
                }
        }
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    /* the e4m3 forwards (the persistent counter, and Vt transposed into the workspace) */
    attn_problem p = test_problem(1, 24, 8, 700, 700, 128, 1);
    p.dtype = ATTN_E4M3;
    attn_host in;
    attn_ref r;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_host_alloc(&in, &p, 0), 0);
    attn_host_fill(&in, test_seed(4310), ATTN_INPUT_NORMAL);
    cr_assert_eq(attn_host_quantize(&in, 0, 0, err), 0, "%s", err);
    cr_assert_eq(attn_oracle(&in, ATTN_FORWARD, NULL, &r), 0);
    for (int si = 0; si < attn_nstages; si++)
        for (int v = 0; v < 2 && attn_stages[si]->fp8; v++) {
            const attn_stage *st = attn_stages[si];
            attn_host t;
            attn_run_info info;
            cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
            copy_inputs(&t, &in);
            const attn_run_status rs = attn_run(st, &t, ATTN_FORWARD, &variants[v], &info);
            attn_cmp c[5];
            int nc;
            if (rs == ATTN_RUN_REFUSED && refusal_expected(st, &p, ATTN_FORWARD, info.sm)) {
                fprintf(stderr, "[INFO] %s e4m3: refused: %s\n", st->name, info.why);
            } else if (rs != ATTN_RUN_OK) {
                fprintf(stderr, "%s e4m3, %s: %s\n", st->name, variant_name[v], info.why);
                failures++;
            } else if (ran++, compare_all(c, &nc, &t, ATTN_FORWARD, &r, st->name)) {
                char what[512];
                snprintf(what, sizeof what, "%s e4m3, %s: FAIL against the oracle", st->name, variant_name[v]);
                print_cmp(what, c, nc);
                failures++;
            }
            attn_host_free(&t);
        }
    attn_ref_free(&r);
    attn_host_free(&in);
    cr_assert(ran > 0, "no stage ran");
    cr_assert_eq(failures, 0, "%d runs on a workspace left behind failed", failures);
}

/* --deterministic against the oracle: the semaphores' order (stage 10's walk rotated per key
 * tile, causal shortest first) at odd shapes, GQA, N_q != N_k, fp16. */
Test(gpu, deterministic_backward_against_oracle, .timeout = 600)
{
    need_gpu();
    attn_oracle_threads = 2;
    static const struct { int B, H, H_kv, N_q, N_k, d, causal, fp16; } shapes[] = {
        { 2, 4, 2, 1000, 1000, 128, 0, 0 }, { 1, 2, 2, 4097, 4097, 64, 1, 0 },
        { 1, 4, 2, 1000, 900, 128, 1, 1 }, { 1, 6, 2, 700, 1300, 64, 0, 1 } };
    static const char *names[] = { "06_fa2", "10_fa3_backward", "13_hopper_masks" };
    int failures = 0, ran = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        attn_problem p = test_problem(shapes[k].B, shapes[k].H, shapes[k].H_kv, shapes[k].N_q,
                                      shapes[k].N_k, shapes[k].d, shapes[k].causal);
        p.dtype = shapes[k].fp16 ? ATTN_FP16 : ATTN_BF16;
        p.deterministic = 1;
        attn_host in;
        cr_assert_eq(attn_host_alloc(&in, &p, 1), 0);
        attn_host_fill(&in, test_seed(3500 + k), ATTN_INPUT_NORMAL);
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_BACKWARD, NULL, &r), 0);
        for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
            for (int i = 0; i < attn_nstages; i++)
                if (!strcmp(attn_stages[i]->name, names[n]) && attn_stages[i]->backward)
                    ran += masked_run(attn_stages[i], &in, ATTN_BACKWARD, &r, NULL, 1, &failures);
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    if (!ran) cr_skip_test("no deterministic backward built or accepted");
    cr_assert_eq(failures, 0, "%d deterministic backward runs failed", failures);
}

/* Every kind of mask at odd shapes, forward and backward, against the float64 oracle (which
 * masks element by element). Rows that see nothing: a window without causal where N_q > N_k
 * (rows from N_k + W - 1 on, which begin inside a tile), and an all-zero mask. */
Test(gpu, masks_against_oracle, .timeout = 600)
{
    need_gpu();
    const attn_stage *st[8];
    const int ns = masked_stages(st, 8);
    if (!ns) cr_skip_test("no stage with masks built");
    static const mcase cases[] = {
        { 2, 2, 2, 1000, 1000, 64, 1, 100, 0, 0, NULL },            /* causal sliding window */
        { 2, 2, 1, 255, 255, 128, 0, 50, 1, 0, NULL },              /* two-sided window, fp16, MQA */
        { 1, 2, 2, 1100, 1100, 128, 1, 129, 0, 0, NULL },           /* both folds; rows 0..63
                                                                         of a forward block see
                                                                         all of its first tile */
        { 1, 2, 2, 333, 333, 128, 1, 1, 1, 0, NULL },               /* window 1: folds with no
                                                                         step between, fp16 */
        { 1, 2, 2, 300, 100, 64, 0, 50, 0, 0, NULL },               /* rows 149.. see nothing */
        { 1, 2, 2, 5000, 1000, 64, 0, 100, 0, 0, NULL },            /* rows 1099.. see nothing:
                                                                         the window starts up to
                                                                         31 mask tiles past N_k
                                                                         (sanitize.sh runs both
                                                                         under memcheck) */
        { 1, 2, 2, 4500, 300, 128, 1, 50, 0, 0, "random:0.5" },     /* the same with a mask */
        { 1, 2, 2, 300, 300, 64, 0, INT_MAX, 0, 0, NULL },          /* i + W past INT_MAX: the
                                                                         stages get W = N_q + N_k */
        { 1, 4, 2, 1000, 1000, 128, 0, 0, 0, 0, "random:0.3" },     /* per-head random, GQA */
        { 2, 4, 2, 1100, 900, 64, 0, 0, 0, 0, "random:0.4" },       /* per (batch, head): the
                                                                         backward's tile order */
        { 2, 2, 2, 700, 1000, 64, 1, 0, 0, 0, "local:256,global:128" },
        { 1, 2, 2, 1500, 1500, 64, 0, 0, 1, 0, "strided:3" },
        { 1, 4, 2, 1000, 1000, 64, 1, 200, 0, 0, "random:0.5" },    /* window AND mask */
        { 1, 2, 2, 1000, 1000, 128, 1, 300, 0, 1, "random:0.6" },   /* deterministic dQ */
        { 1, 4, 2, 1000, 900, 64, 0, 0, 0, 1, "random:0.5" },      /* deterministic, GQA, not
                                                                         causal: the turns in
                                                                         key order */
        { 1, 24, 8, 1100, 1100, 128, 0, 0, 1, 0, "random:0.3" },   /* 216 query tiles: on 132
                                                                         SMs a persistent grid
                                                                         takes them longest list
                                                                         first from the counter */
        { 1, 2, 1, 17, 1000, 128, 0, 0, 0, 0, "local:128" },
        { 1, 2, 2, 300, 300, 64, 0, 0, 0, 0, "random:0.001" },      /* (almost) all zero */
        { 3, 20, 5, 600, 600, 64, 1, 300, 0, 0, "random:0.6" },     /* 60 heads, window AND
                                                                         mask */
        { 1, 60, 15, 600, 600, 128, 1, 300, 0, 0, "random:0.6" },   /* two sections of the
                                                                         forward's order (54 + 6
                                                                         heads at d = 128), 300
                                                                         query tiles on 132 SMs */
    };
    int failures = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mcase *mc = &cases[k];
        attn_host in;
        mcase_inputs(&in, mc, test_seed(4000 + k));
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_BACKWARD, NULL, &r), 0);
        for (int si = 0; si < ns; si++)
            for (int dir = 0; dir <= 1; dir++)
                masked_run(st[si], &in, (attn_dir)dir, &r, mc->mask, 0, &failures);
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    cr_assert_eq(failures, 0, "%d masked runs failed", failures);
}

/* The forward at head dim 256 with masks, where a stage runs it (13_hopper_masks: 80-key tiles,
 * which straddle two mask columns, so the block mask cuts some tiles in part), against the
 * oracle; stages that refuse the head dim are skipped. */
Test(gpu, masks_head_dim_256_forward, .timeout = 300)
{
    need_gpu();
    const attn_stage *st[8];
    const int ns = masked_stages(st, 8);
    if (!ns) cr_skip_test("no stage with masks built");
    static const mcase cases[] = {
        { 1, 4, 2, 1000, 1000, 256, 0, 0, 0, 0, "random:0.5" },     /* partial tiles, GQA */
        { 2, 2, 2, 700, 1000, 256, 1, 300, 1, 0, "local:256,global:128" },
        { 1, 2, 1, 300, 100, 256, 0, 50, 0, 0, NULL },              /* rows 149.. see nothing */
        { 1, 2, 2, 500, 500, 256, 1, 0, 0, 0, "random:0.001" },     /* (almost) all zero */
        { 1, 40, 40, 500, 500, 256, 0, 0, 0, 0, "random:0.5" },    /* 160 tiles: persistent */
    };
    int failures = 0, ran = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mcase *mc = &cases[k];
        attn_problem p = test_problem(mc->B, mc->H, mc->H_kv, mc->N_q, mc->N_k, mc->d, mc->causal);
        p.window = mc->window;
        p.dtype = mc->fp16 ? ATTN_FP16 : ATTN_BF16;
        attn_host in;
        masked_inputs(&in, &p, mc->mask, test_seed(4300 + k));
        attn_ref r;
        cr_assert_eq(attn_oracle(&in, ATTN_FORWARD, NULL, &r), 0);
        for (int si = 0; si < ns; si++) ran += masked_run(st[si], &in, ATTN_FORWARD, &r, mc->mask, 1, &failures);
        attn_ref_free(&r);
        attn_host_free(&in);
    }
    if (!ran) cr_skip_test("no stage with masks runs head dim 256");
    cr_assert_eq(failures, 0, "%d masked runs failed", failures);
}

/* An all-zero mask: every row sees nothing, so O = 0 and L = -inf exactly, and the gradients are
 * 0, whatever the inputs. */
Test(gpu, all_zero_mask, .timeout = 120)
{
    need_gpu();
    const attn_stage *st[8];
    const int ns = masked_stages(st, 8);
    if (!ns) cr_skip_test("no stage with masks built");
    attn_problem p = test_problem(2, 2, 2, 300, 300, 64, 0);
    for (int si = 0; si < ns; si++) {
        attn_host in, t;
        masked_inputs(&in, &p, "random:0.5", test_seed(4100));
        memset(in.block_mask, 0, attn_mask_bytes(&in.p));
        attn_run_info info;
        cr_assert_eq(run_copy(st[si], &in, ATTN_BACKWARD, &t, &info), ATTN_RUN_OK, "%s", info.why);
        for (size_t e = 0; e < attn_numel_q(&p); e++) {
            cr_assert_eq(attn_to_f32(t.o[e], p.dtype), 0.0f, "%s: O[%zu] = %g", st[si]->name, e,
                         attn_to_f32(t.o[e], p.dtype));
            cr_assert_eq(attn_to_f32(t.dq[e], p.dtype), 0.0f, "%s: dQ[%zu]", st[si]->name, e);
        }
        for (size_t e = 0; e < attn_numel_lse(&p); e++)
            cr_assert(t.lse[e] == -INFINITY, "%s: L[%zu] = %g", st[si]->name, e, t.lse[e]);
        for (size_t e = 0; e < attn_numel_kv(&p); e++)
            cr_assert(attn_to_f32(t.dk[e], p.dtype) == 0.0f && attn_to_f32(t.dv[e], p.dtype) == 0.0f,
                      "%s: dK or dV[%zu] not 0", st[si]->name, e);
        attn_host_free(&t);
        attn_host_free(&in);
    }
}

/* A mask of all ones, and a window as wide as the sequence, change nothing: the results are
 * bitwise those of the same stage without them (the lists visit every tile, in order; dQ
 * deterministic, so the backward's bits repeat). With the mask, they are also bitwise those of
 * the dense stage the masked one is made from (dense_parent: 06_fa2 for 12_block_sparse,
 * 10_fa3_backward for 13_hopper_masks): the same tiles in the same order. Not quite for 13
 * without causality: there 10's deterministic walks start at a step rotated per key tile
 * (bwd_turn), 13's at the first of their lists, so only O and L are its parent's bits (the
 * gradients are the same sums in another order, which the oracle tests check). */
Test(gpu, all_ones_mask_is_dense, .timeout = 300)
{
    need_gpu();
    const attn_stage *st[8];
    const int ns = masked_stages(st, 8);
    if (!ns) cr_skip_test("no stage with masks built");
    int differ = 0;
    static const struct { int H, H_kv, N, d, causal; } shapes[] = {
        { 4, 2, 1000, 128, 1 }, { 2, 2, 300, 128, 0 }, { 2, 2, 255, 64, 0 }, { 2, 1, 4097, 64, 1 },
        { 60, 15, 600, 64, 0 },     /* 60 heads: 240 query tiles at d = 64 */
        { 60, 15, 600, 128, 1 } };  /* two sections of the forward's order (54 + 6 heads) */
    for (int si = 0; si < ns; si++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            for (int how = 0; how < 2; how++) {   /* all-ones mask, full-width window */
                const attn_stage *dense = NULL;
                for (int i = 0; i < attn_nstages; i++)
                    if (dense_parent(st[si]->name) && !strcmp(attn_stages[i]->name, dense_parent(st[si]->name)))
                        dense = attn_stages[i];
                attn_problem p = test_problem(1, shapes[k].H, shapes[k].H_kv, shapes[k].N, shapes[k].N,
                                              shapes[k].d, shapes[k].causal);
                p.deterministic = 1;
                attn_host in, plain, masked;
                masked_inputs(&in, &p, NULL, test_seed(4200 + k));
                attn_run_info info;
                cr_assert_eq(run_copy(st[si], &in, ATTN_BACKWARD, &plain, &info), ATTN_RUN_OK, "%s", info.why);
                if (how == 0) {
                    char err[ATTN_MSG_LEN];
                    cr_assert_eq(attn_mask_generate(&in.p, &in.block_mask, "random:1", 1, err), 0, "%s", err);
                } else {
                    in.p.window = shapes[k].N;
                }
                cr_assert_eq(run_copy(st[si], &in, ATTN_BACKWARD, &masked, &info), ATTN_RUN_OK, "%s", info.why);
                const char *what = how == 0 ? "all-ones mask" : "full-width window";
                cr_assert(all_finite(plain.o, attn_numel_q(&p), p.dtype) && all_finite(plain.dq, attn_numel_q(&p), p.dtype) &&
                          all_finite(plain.dk, attn_numel_kv(&p), p.dtype) && all_finite(plain.dv, attn_numel_kv(&p), p.dtype),
                          "%s: an output holds NaN or Inf (unwritten?)", st[si]->name);
                cr_assert_eq(memcmp(plain.o, masked.o, attn_numel_q(&p) * 2), 0, "%s %s: O differs", st[si]->name, what);
                cr_assert_eq(memcmp(plain.lse, masked.lse, attn_numel_lse(&p) * 4), 0, "%s %s: L differs", st[si]->name, what);
                cr_assert_eq(memcmp(plain.dq, masked.dq, attn_numel_q(&p) * 2), 0, "%s %s: dQ differs", st[si]->name, what);
                cr_assert_eq(memcmp(plain.dk, masked.dk, attn_numel_kv(&p) * 2), 0, "%s %s: dK differs", st[si]->name, what);
                cr_assert_eq(memcmp(plain.dv, masked.dv, attn_numel_kv(&p) * 2), 0, "%s %s: dV differs", st[si]->name, what);
                if (dense && how == 0) {   /* the dense parent on the same inputs without the mask */
                    attn_host d6, src = in;
                    src.p = p;
                    src.block_mask = NULL;
                    cr_assert_eq(run_copy(dense, &src, ATTN_BACKWARD, &d6, &info), ATTN_RUN_OK, "%s", info.why);
                    const struct { const char *t; const void *a, *b; size_t n; } cmp[] = {
                        { "O", d6.o, masked.o, attn_numel_q(&p) * 2 }, { "L", d6.lse, masked.lse, attn_numel_lse(&p) * 4 },
                        { "dQ", d6.dq, masked.dq, attn_numel_q(&p) * 2 }, { "dK", d6.dk, masked.dk, attn_numel_kv(&p) * 2 },
                        { "dV", d6.dv, masked.dv, attn_numel_kv(&p) * 2 } };
                    const int rotated = !shapes[k].causal && !strcmp(dense->name, "10_fa3_backward");
                    for (size_t c = 0; c < (rotated ? 2 : sizeof cmp / sizeof cmp[0]); c++)
                        if (memcmp(cmp[c].a, cmp[c].b, cmp[c].n)) {
                            cr_log_error("%s all-ones mask, H=%d Hkv=%d N=%d d=%d causal=%d: %s differs from %s's",
                                         st[si]->name, shapes[k].H, shapes[k].H_kv, shapes[k].N, shapes[k].d,
                                         shapes[k].causal, cmp[c].t, dense->name);
                            differ++;
                        }
                    attn_host_free(&d6);
                }
                attn_host_free(&plain);
                attn_host_free(&masked);
                attn_host_free(&in);
            }
    cr_assert_eq(differ, 0, "%d results differ from the dense parent's (above)", differ);
}
