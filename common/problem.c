/* common/problem.c: problem defaults and validation, FLOP count, host tensors, inputs (and
 * their e4m3 quantization). */
#include <pthread.h>
#include <unistd.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"

void attn_problem_default(attn_problem *p)
{
    memset(p, 0, sizeof *p);
    p->B = 2; p->H = 4; p->H_kv = 4;
    p->N_q = 1000; p->N_k = 1000;
    p->d = 64;
    p->causal = 0;
    p->scale = (float)(1.0 / sqrt(64.0));
    p->dtype = ATTN_BF16;
    p->deterministic = 0;
}

/* a * b * c * d > ATTN_MAX_ELEMENTS (every factor >= 1), by division: nothing wraps */
static int too_many(int a, int b, int c, int d)
{
    const int f[4] = { a, b, c, d };
    size_t n = 1;
    for (int i = 0; i < 4; i++) {
        if ((size_t)f[i] > ATTN_MAX_ELEMENTS / n) return 1;
        n *= (size_t)f[i];
    }
    return 0;
}

int attn_problem_validate(const attn_problem *p, char *why)
{
    if (p->B <= 0 || p->H <= 0 || p->H_kv <= 0 || p->N_q <= 0 || p->N_k <= 0 || p->d <= 0) {
        snprintf(why, ATTN_MSG_LEN, "sizes must be >= 1 (B=%d H=%d Hkv=%d Nq=%d Nk=%d d=%d)",
                 p->B, p->H, p->H_kv, p->N_q, p->N_k, p->d);
        return -1;
    }
    if (p->H % p->H_kv != 0) {
        snprintf(why, ATTN_MSG_LEN, "--heads %d is not a multiple of --kv-heads %d", p->H, p->H_kv);
        return -1;
    }
    if (p->N_q > ATTN_MAX_SEQLEN || p->N_k > ATTN_MAX_SEQLEN) {
        snprintf(why, ATTN_MSG_LEN, "sequence lengths must be at most %d (Nq=%d Nk=%d)", ATTN_MAX_SEQLEN,
                 p->N_q, p->N_k);
        return -1;
    }
    if (p->B > ATTN_MAX_GRID_YZ || p->H > ATTN_MAX_GRID_YZ) {
        snprintf(why, ATTN_MSG_LEN, "batch %d and heads %d must each be at most %d (a grid dimension)",
                 p->B, p->H, ATTN_MAX_GRID_YZ);
        return -1;
    }
    if ((long long)p->B * p->H > INT_MAX) {
        snprintf(why, ATTN_MSG_LEN, "B * H = %lld (batch %d, heads %d) is more than %d", (long long)p->B * p->H,
                 p->B, p->H, INT_MAX);
        return -1;
    }
    if (too_many(p->B, p->N_q, p->H, p->d) || too_many(p->B, p->N_k, p->H_kv, p->d) ||
        too_many(p->B, p->H, p->N_q, 1)) {
        snprintf(why, ATTN_MSG_LEN, "too large: Q would hold %.4g elements and K, V %.4g each (at most "
                 "2^40 a tensor)", (double)p->B * p->N_q * p->H * p->d, (double)p->B * p->N_k * p->H_kv * p->d);
        return -1;
    }
    if (!isfinite(p->scale) || p->scale <= 0.0f || p->scale > ATTN_MAX_SCALE) {
        snprintf(why, ATTN_MSG_LEN, "--scale must be a positive number up to %g", ATTN_MAX_SCALE);
        return -1;
    }
    if (p->window < 0) {
        snprintf(why, ATTN_MSG_LEN, "--window must be >= 1 (0: no window)");
        return -1;
    }
    if (p->dtype != ATTN_BF16 && p->dtype != ATTN_FP16 && p->dtype != ATTN_E4M3) {
        snprintf(why, ATTN_MSG_LEN, "unknown dtype");
        return -1;
    }
    return 0;
}

size_t attn_numel_q(const attn_problem *p) { return (size_t)p->B * p->N_q * p->H * p->d; }
size_t attn_numel_kv(const attn_problem *p) { return (size_t)p->B * p->N_k * p->H_kv * p->d; }
size_t attn_numel_lse(const attn_problem *p) { return (size_t)p->B * p->H * p->N_q; }

/* The keys query row i sees: [*lo, *hi) (empty when *lo >= *hi). See attn.h. */
void attn_window_clamp(attn_problem *p)
{
    if ((long long)p->window > (long long)p->N_q + p->N_k) p->window = p->N_q + p->N_k;
}

void attn_visible_keys(const attn_problem *p, int i, int *lo, int *hi)
{
    long long a = 0, b = p->N_k;   /* i + W can pass INT_MAX */
    if (p->causal && (long long)i + 1 < b) b = (long long)i + 1;
    if (p->window > 0) {
        if ((long long)i - p->window + 1 > a) a = (long long)i - p->window + 1;
        if (!p->causal && (long long)i + p->window < b) b = (long long)i + p->window;
    }
    *lo = (int)a;
    *hi = (int)(b > a ? b : a);
}

/* The one FLOP formula: two matmuls of 2*N_q*N_k*d each per head, half of it when causal
 * (counted as N_q*N_k/2, the usual convention); with a window, the (query, key) pairs that are
 * visible, counted exactly, as FlexAttention reports its masks; the backward does 2.5x the
 * forward's work. */
double attn_flops(const attn_problem *p, attn_dir dir)
{
    double pairs = (double)p->N_q * p->N_k;
    if (p->block_mask) {
        pairs = p->pairs / ((double)p->B * p->H);   /* set with the mask: every (b, h) */
    } else if (p->window > 0) {
        pairs = 0.0;
        for (int i = 0; i < p->N_q; i++) {
            int lo, hi;
            attn_visible_keys(p, i, &lo, &hi);
            pairs += hi - lo;
        }
    } else if (p->causal) {
        pairs *= 0.5;
    }
    double f = 4.0 * p->B * p->H * pairs * p->d;
    if (dir == ATTN_BACKWARD) f *= 2.5;
    return f;
}

void attn_problem_str(const attn_problem *p, const char *stage, attn_dir dir, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s %s %s B=%d H=%d Hkv=%d Nq=%d Nk=%d d=%d causal=%d", stage,
                     dir == ATTN_BACKWARD ? "backward" : "forward", attn_dtype_name(p->dtype), p->B,
                     p->H, p->H_kv, p->N_q, p->N_k, p->d, p->causal);
    if (p->window > 0 && k > 0 && (size_t)k < n) k += snprintf(buf + k, n - (size_t)k, " window=%d", p->window);
    if (p->block_mask && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " block-mask density=%.3g",
                 p->pairs / ((double)p->B * p->H * (double)p->N_q * p->N_k));
}

/* The inputs of nq and nkv elements: q, k, v, or with e4m3 q8, k8, v8, their scales and q32,
 * k32, v32. 1 if all were allocated. */
static int alloc_inputs(attn_host *t, size_t nq, size_t nkv)
{
    const attn_problem *p = &t->p;
    if (p->dtype != ATTN_E4M3) {
        t->q = malloc(nq * 2); t->k = malloc(nkv * 2); t->v = malloc(nkv * 2);
        return t->q && t->k && t->v;
    }
    const size_t ns = (size_t)p->B * p->H_kv;
    t->q8 = malloc(nq); t->k8 = malloc(nkv); t->v8 = malloc(nkv);
    t->q32 = malloc(nq * sizeof(float)); t->k32 = malloc(nkv * sizeof(float));
    t->v32 = malloc(nkv * sizeof(float));
    t->q_descale = malloc(ns * sizeof(float)); t->k_descale = malloc(ns * sizeof(float));
    t->v_descale = malloc(ns * sizeof(float));
    return t->q8 && t->k8 && t->v8 && t->q32 && t->k32 && t->v32 && t->q_descale &&
           t->k_descale && t->v_descale;
}

int attn_host_alloc(attn_host *t, const attn_problem *p, int backward)
{
    memset(t, 0, sizeof *t);
    t->p = *p;
    t->backward = backward;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p), nl = attn_numel_lse(p);
    t->o = malloc(nq * 2); t->lse = malloc(nl * 4);
    int ok = alloc_inputs(t, nq, nkv) && t->o && t->lse;
    if (backward) {
        t->d_o = malloc(nq * 2); t->dq = malloc(nq * 2);
        t->dk = malloc(nkv * 2); t->dv = malloc(nkv * 2);
        ok = ok && t->d_o && t->dq && t->dk && t->dv;
    }
    if (!ok) { attn_host_free(t); return -1; }
    attn_host_poison_outputs(t);
    return 0;
}

int attn_host_alloc_timed(attn_host *t, const attn_problem *p, int backward)
{
    memset(t, 0, sizeof *t);
    t->p = *p;
    t->backward = backward;
    t->period = ATTN_TIMED_PERIOD;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p);
    nq = nq < t->period ? nq : t->period;
    nkv = nkv < t->period ? nkv : t->period;
    int ok = alloc_inputs(t, nq, nkv);
    if (backward) {
        t->d_o = malloc(nq * 2);
        ok = ok && t->d_o;
    }
    if (!ok) { attn_host_free(t); return -1; }
    return 0;
}

void attn_host_free(attn_host *t)
{
    free(t->q); free(t->k); free(t->v); free(t->d_o);
    free(t->o); free(t->lse); free(t->dq); free(t->dk); free(t->dv); free(t->block_mask);
    free(t->q8); free(t->k8); free(t->v8); free(t->q_descale); free(t->k_descale);
    free(t->v_descale); free(t->q32); free(t->k32); free(t->v32);
    memset(t, 0, sizeof *t);
}

void attn_host_poison_outputs(attn_host *t)
{
    const attn_problem *p = &t->p;
    if (t->o) memset(t->o, 0xFF, attn_numel_q(p) * 2);
    if (t->lse) memset(t->lse, 0xFF, attn_numel_lse(p) * 4);
    if (t->dq) memset(t->dq, 0xFF, attn_numel_q(p) * 2);
    if (t->dk) memset(t->dk, 0xFF, attn_numel_kv(p) * 2);
    if (t->dv) memset(t->dv, 0xFF, attn_numel_kv(p) * 2);
}

/* Work over n elements cut into chunks of FILL_CHUNK, spread over up to FILL_THREADS_MAX
 * threads: at bench sizes (10^8 elements, 2^31 at N = 10^6) one thread would spend seconds on
 * a pass, several times the GPU time being measured. chunk(ctx, c, begin, end) does chunk c. */
#define FILL_CHUNK ((size_t)1 << 16)
#define FILL_THREADS_MAX 16

typedef void (*chunk_fn)(const void *ctx, size_t c, size_t begin, size_t end);
typedef struct { chunk_fn chunk; const void *ctx; size_t n; int tid, nthreads; } par_job;

static void *par_worker(void *arg)
{
    const par_job *j = arg;
    for (size_t c = (size_t)j->tid; c * FILL_CHUNK < j->n; c += (size_t)j->nthreads)
        j->chunk(j->ctx, c, c * FILL_CHUNK, (c + 1) * FILL_CHUNK < j->n ? (c + 1) * FILL_CHUNK : j->n);
    return NULL;
}

static void par_chunks(size_t n, chunk_fn chunk, const void *ctx)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cpus < 1 ? 1 : cpus > FILL_THREADS_MAX ? FILL_THREADS_MAX : (int)cpus;
    if ((size_t)nthreads > n / FILL_CHUNK) nthreads = (int)(n / FILL_CHUNK) + 1;
    par_job jobs[FILL_THREADS_MAX];
    pthread_t th[FILL_THREADS_MAX];
    int started = 0;
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = (par_job){ chunk, ctx, n, i, nthreads };
        if (i > 0 && pthread_create(&th[i], NULL, par_worker, &jobs[i]) == 0) started |= 1 << i;
    }
    par_worker(&jobs[0]);
    for (int i = 1; i < nthreads; i++) {
        if (started & (1 << i)) pthread_join(th[i], NULL);
        else par_worker(&jobs[i]);  /* no thread: do its chunks here */
    }
}

static const char *const input_names[] = { "normal", "large-logits", "flat-rows", "medium-logits",
                                            "outliers" };

const char *attn_input_name(attn_input_kind k)
{
    return (unsigned)k < sizeof input_names / sizeof input_names[0] ? input_names[k] : "?";
}

int attn_input_parse(const char *s, attn_input_kind *k)
{
    for (size_t i = 0; i < sizeof input_names / sizeof input_names[0]; i++)
        if (strcmp(s, input_names[i]) == 0) { *k = (attn_input_kind)i; return 0; }
    return -1;
}

/* Each tensor draws from its own stream, so adding dO does not change Q, K, V. A stream is
 * cut into chunks, each with its own generator, so the values do not depend on how many
 * threads fill them. A value goes to x rounded to t, or as drawn to x32 (e4m3's inputs, which
 * attn_host_quantize rounds): the same values for every dtype. With outliers, each value also
 * draws a uniform, and where it is below OUTLIER_P gets N(0, OUTLIER_SD^2) added. */
#define OUTLIER_P 0.001
#define OUTLIER_SD 10.0
typedef struct {
    uint16_t *x;
    float *x32;
    uint64_t stream;
    double mul;
    attn_dtype t;
    int outliers;
} fill_ctx;

static void fill_chunk(const void *ctx, size_t c, size_t begin, size_t end)
{
    const fill_ctx *f = ctx;
    attn_rng r;
    attn_rng_init(&r, f->stream + c * 0xD1B54A32D192ED03ull);
    for (size_t i = begin; i < end; i++) {
        double v = attn_rng_normal(&r);
        if (f->outliers && attn_rng_uniform(&r) < OUTLIER_P) v += OUTLIER_SD * attn_rng_normal(&r);
        const float x = (float)(f->mul * v);
        if (f->x32) f->x32[i] = x;
        else f->x[i] = attn_from_f32(x, f->t);
    }
}

static void fill_normal(uint16_t *x, float *x32, size_t n, uint64_t seed, uint64_t tag,
                        double mul, attn_dtype t, int outliers)
{
    const fill_ctx f = { x, x32, seed * 0x9E3779B97F4A7C15ull + tag, mul, t, outliers };
    par_chunks(n, fill_chunk, &f);
}

void attn_host_fill(attn_host *t, uint64_t seed, attn_input_kind kind)
{
    const attn_problem *p = &t->p;
    /* large logits: q.k ~ 1e4 * sqrt(d), times scale 1/sqrt(d); medium: 1e2 */
    const double big = 100.0, medium = 10.0;
    double mul_qk = kind == ATTN_INPUT_LARGE_LOGITS ? big : kind == ATTN_INPUT_MEDIUM_LOGITS ? medium : 1.0;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p);
    if (t->period) {   /* attn_host_alloc_timed: the part the host holds */
        nq = nq < t->period ? nq : t->period;
        nkv = nkv < t->period ? nkv : t->period;
    }
    const int outliers = kind == ATTN_INPUT_OUTLIERS;
    fill_normal(t->q, t->q32, nq, seed, 1, mul_qk, p->dtype, outliers);
    fill_normal(t->k, t->k32, nkv, seed, 2, mul_qk, p->dtype, outliers);
    fill_normal(t->v, t->v32, nkv, seed, 3, 1.0, p->dtype, outliers);
    if (t->d_o) fill_normal(t->d_o, NULL, nq, seed, 4, 1.0, p->dtype, 0);
    if (kind == ATTN_INPUT_FLAT_ROWS && !t->period) {
        /* every key of head (b, g) = the same vector plus 1e-3 noise: all scores of a row
         * nearly equal, so P is nearly uniform and O nearly the mean of V */
        const double noise = 1e-3;
        attn_rng r;
        attn_rng_init(&r, seed * 0x9E3779B97F4A7C15ull + 5);
        double *base = malloc(sizeof(double) * p->d);
        if (base) {
            for (int b = 0; b < p->B; b++)
                for (int g = 0; g < p->H_kv; g++) {
                    for (int c = 0; c < p->d; c++) base[c] = attn_rng_normal(&r);
                    for (int j = 0; j < p->N_k; j++) {
                        const size_t row = (((size_t)b * p->N_k + j) * p->H_kv + g) * p->d;
                        for (int c = 0; c < p->d; c++) {
                            const float x = (float)(base[c] + noise * attn_rng_normal(&r));
                            if (t->k32) t->k32[row + c] = x;
                            else t->k[row + c] = attn_from_f32(x, p->dtype);
                        }
                    }
                }
            free(base);
        }
    }
    char err[ATTN_MSG_LEN];
    if (p->dtype == ATTN_E4M3) (void)attn_host_quantize(t, 0, 0, err);   /* drawn values are finite */
    attn_host_poison_outputs(t);
}

/* ---- e4m3 inputs --------------------------------------------------------------------- */

/* One of Q, K, V of an e4m3 host: its bytes, scales and values before quantization, the
 * elements the host holds, and where an element's scale is: a row of the tensor is one head
 * of one token, `heads` heads a token, N tokens a batch, `group` heads a scale (Q: the G
 * query heads of a kv head; K, V: 1). */
typedef struct {
    unsigned char *x8;
    float *scale;
    const float *x32;
    float *y;                  /* attn_host_dequantize's output */
    size_t n;
    int d, heads, N, group, H_kv;
} qtensor;

static qtensor qtensor_of(const attn_host *t, int which)
{
    const attn_problem *p = &t->p;
    const int G = p->H / p->H_kv;
    qtensor x = { 0 };
    x.d = p->d;
    x.H_kv = p->H_kv;
    x.heads = which == 0 ? p->H : p->H_kv;
    x.N = which == 0 ? p->N_q : p->N_k;
    x.group = which == 0 ? G : 1;
    x.n = which == 0 ? attn_numel_q(p) : attn_numel_kv(p);
    if (t->period && x.n > t->period) x.n = t->period;
    x.x8 = which == 0 ? t->q8 : which == 1 ? t->k8 : t->v8;
    x.scale = which == 0 ? t->q_descale : which == 1 ? t->k_descale : t->v_descale;
    x.x32 = which == 0 ? t->q32 : which == 1 ? t->k32 : t->v32;
    return x;
}

/* the scale index, b * H_kv + kv head, of the elements of row `row` */
static size_t scale_of_row(const qtensor *x, size_t row)
{
    const size_t b = row / (size_t)x->heads / (size_t)x->N;
    return b * (size_t)x->H_kv + (size_t)(row % (size_t)x->heads) / (size_t)x->group;
}

static void quantize_chunk(const void *ctx, size_t c, size_t begin, size_t end)
{
    const qtensor *x = ctx;
    const size_t d = (size_t)x->d;
    (void)c;
    for (size_t i = begin; i < end;) {   /* row by row: one scale a row */
        const size_t row = i / d, stop = (row + 1) * d < end ? (row + 1) * d : end;
        const float s = x->scale[scale_of_row(x, row)];
        for (; i < stop; i++) x->x8[i] = attn_f32_to_e4m3(x->x32[i] / s);
    }
}

static void dequantize_chunk(const void *ctx, size_t c, size_t begin, size_t end)
{
    const qtensor *x = ctx;
    const size_t d = (size_t)x->d;
    (void)c;
    for (size_t i = begin; i < end;) {
        const size_t row = i / d, stop = (row + 1) * d < end ? (row + 1) * d : end;
        const float s = x->scale[scale_of_row(x, row)];
        for (; i < stop; i++) x->y[i] = attn_e4m3_to_f32(x->x8[i]) * s;
    }
}

void attn_hadamard_row(double *x, int d, const signed char *s)
{
    for (int h = 1; h < d; h *= 2)   /* x H_d, H_2h = [H_h H_h; H_h -H_h] (symmetric) */
        for (int i = 0; i < d; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const double a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const double norm = 1.0 / sqrt((double)d);
    for (int c = 0; c < d; c++) x[c] *= s[c] * norm;
}

int attn_host_quantize(attn_host *t, int hadamard, uint64_t seed, char *err)
{
    const attn_problem *p = &t->p;
    const size_t ns = (size_t)p->B * p->H_kv, d = (size_t)p->d;
    static const char *names[3] = { "Q", "K", "V" };
    signed char *signs = NULL;   /* --hadamard: d signs a (batch, kv head), */
    float *rot = NULL;           /* Q or K rotated (x M), */
    double *buf = NULL;          /* one row of it, rotated in double */
    int rc = -1;
    if (hadamard) {
        if (p->d & (p->d - 1)) {
            snprintf(err, ATTN_MSG_LEN, "--hadamard needs a head dim that is a power of two (d = %d)", p->d);
            return -1;
        }
        const qtensor xq = qtensor_of(t, 0), xk = qtensor_of(t, 1);
        signs = malloc(ns * d);
        rot = malloc((xq.n > xk.n ? xq.n : xk.n) * sizeof(float) + 1);
        buf = malloc(d * sizeof(double));
        if (!signs || !rot || !buf) {
            snprintf(err, ATTN_MSG_LEN, "out of host memory for --hadamard");
            goto out;
        }
        attn_rng r;   /* a stream of its own: the inputs' tags are 1 to 5 (attn_host_fill) */
        attn_rng_init(&r, seed * 0x9E3779B97F4A7C15ull + 6);
        for (size_t i = 0; i < ns * d; i++) signs[i] = attn_rng_u64(&r) >> 63 ? -1 : 1;
    }
    for (int which = 0; which < 3; which++) {
        qtensor x = qtensor_of(t, which);
        if (hadamard && which < 2) {   /* Q and K: quantize x M instead of x */
            memcpy(rot, x.x32, x.n * sizeof(float));
            for (size_t r0 = 0; (r0 + 1) * d <= x.n; r0++) {
                for (size_t c = 0; c < d; c++) buf[c] = rot[r0 * d + c];
                attn_hadamard_row(buf, p->d, signs + scale_of_row(&x, r0) * d);
                for (size_t c = 0; c < d; c++) rot[r0 * d + c] = (float)buf[c];
            }
            x.x32 = rot;
        }
        for (size_t s = 0; s < ns; s++) x.scale[s] = 0.0f;   /* the slice's amax, first */
        for (size_t row = 0; row * d < x.n; row++) {
            float *amax = &x.scale[scale_of_row(&x, row)];
            for (size_t i = row * d; i < (row + 1) * d && i < x.n; i++) {
                const float a = fabsf(x.x32[i]);
                if (!isfinite(a)) {
                    snprintf(err, ATTN_MSG_LEN, "%s holds a value that is not finite (%g): e4m3 "
                             "needs finite inputs", names[which], x.x32[i]);
                    goto out;
                }
                if (a > *amax) *amax = a;
            }
        }
        /* 448, e4m3's largest value, for the amax; scale 1 where that is 0 (an all-zero slice,
         * or one so small that amax / 448 underflows) */
        for (size_t s = 0; s < ns; s++) {
            x.scale[s] /= 448.0f;
            if (!(x.scale[s] > 0.0f)) x.scale[s] = 1.0f;
        }
        par_chunks(x.n, quantize_chunk, &x);
    }
    rc = 0;
out:
    free(signs);
    free(rot);
    free(buf);
    return rc;
}

int attn_host_dequantize(const attn_host *t, float **q, float **k, float **v)
{
    float **out[3] = { q, k, v };
    int ok = 1;
    for (int which = 0; which < 3; which++) {
        qtensor x = qtensor_of(t, which);
        float *y = malloc(x.n * sizeof(float) + 1);
        *out[which] = y;
        if (!y) { ok = 0; continue; }
        x.y = y;
        par_chunks(x.n, dequantize_chunk, &x);
    }
    if (ok) return 0;
    for (int which = 0; which < 3; which++) { free(*out[which]); *out[which] = NULL; }
    return -1;
}

typedef struct { const uint16_t *x; float *f; attn_dtype t; } conv_ctx;

static void convert_chunk(const void *ctx, size_t c, size_t begin, size_t end)
{
    const conv_ctx *v = ctx;
    (void)c;
    for (size_t i = begin; i < end; i++) v->f[i] = attn_to_f32(v->x[i], v->t);
}

float *attn_host_to_f32(const uint16_t *x, size_t n, attn_dtype t)
{
    float *f = malloc(n * sizeof(float) + 1);
    if (!f) return NULL;
    const conv_ctx v = { x, f, t };
    par_chunks(n, convert_chunk, &v);
    return f;
}
