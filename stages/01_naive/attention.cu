/* stages/01_naive/attention.cu: naive attention, three kernels, S and P in HBM.
 *
 * The formula as it is written, one kernel per line:
 *   1. scores_kernel   S = scale Q K^T         fp32 [B, H, N_q, N_k] in HBM, -inf where masked
 *   2. softmax_kernel  P = softmax(S), by rows fp32 [B, H, N_q, N_k] in HBM, and L = m + log(l)
 *   3. output_kernel   O = P V                 dtype [B, N_q, H, d]
 * One thread computes one score, a dot product of length d read straight from global memory;
 * one warp normalises one row; one thread computes one element of O. Arithmetic is fp32,
 * rounded to the 16-bit dtype only when O is stored.
 *
 * Why: this is the baseline every later stage removes something from.
 * Memory: S and P take 2 * B*H*N_q*N_k * 4 bytes of workspace: 32 GiB at B = 1, H = 16,
 * N = 16384, and 2 TiB at N = 131072, where the harness refuses. That is the memory wall.
 * Time: slow at every size, and not because of HBM: each FMA of every pass waits on two
 * loads straight from global memory (Q and K, or P and V) and some 64-bit address arithmetic,
 * so the load path sets the pace (docs/01_naive.md reads the numbers; cuBLAS also writes S
 * and P to HBM and is two orders of magnitude faster). Stage 02_fused keeps S and P on chip.
 *
 * Backward, materialised the same way (stage 04_backward is measured against it): S and P
 * are recomputed by kernels 1 and 2, then
 *   dV = P^T dO                    grad_kv_kernel (summed over the query heads of a GQA group)
 *   dP = dO V^T                    scores_kernel again
 *   D  = rowsum(dO ∘ O)            rowdot_kernel
 *   dS = P ∘ (dP - D)              grad_scores_kernel, in place over dP
 *   dQ = scale dS K                output_kernel again
 *   dK = scale dS^T Q              grad_kv_kernel again
 * S is dead once P exists, so dP and dS reuse its buffer: the workspace is S + P + D.
 *
 * Run: make build/01_naive && build/01_naive --check --seqlen 1024
 *      build/01_naive --check --backward --seqlen 1024
 */
#include <stdio.h>
#include "attn_device.cuh"

#define THREADS        256                /* threads per block */
#define ROWS_PER_BLOCK (THREADS / WARP)   /* softmax_kernel: one warp per row */

/* Keys that query i sees: all N_k, or keys 0 .. i when causal (key 0 always, also when
 * N_q > N_k). */
static __device__ __forceinline__ int visible_keys(const attn_problem p, int i)
{
    return p.causal ? min(i + 1, p.N_k) : p.N_k;
}

/* 1. S = scale Q K^T, one thread per score S[b, h, i, j]. A score that query i cannot see is
 * set to `masked`: -inf, so that exp gives 0. The backward reuses this kernel for
 * dP = dO V^T (q = dO, k = V, scale 1, masked 0: P is 0 there, and 0 * -inf would be NaN). */
static __global__ void scores_kernel(attn_problem p, const void *q, const void *k, float scale,
                                     float masked, float *S)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.H * p.N_q * p.N_k) return;
    const int j = idx % p.N_k;
    const size_t row = idx / p.N_k;   /* (b*H + h)*N_q + i */
    const int i = row % p.N_q;
    const int h = (row / p.N_q) % p.H;
    const int b = row / p.N_q / p.H;
    if (j >= visible_keys(p, i)) {
        S[idx] = masked;
        return;
    }
    const size_t q_i = attn_row(b, i, h, p.N_q, p.H, p.d);
    const size_t k_j = attn_row(b, j, h / (p.H / p.H_kv), p.N_k, p.H_kv, p.d);
    float s = 0.0f;
    for (int c = 0; c < p.d; c++)
        s += attn_load(q, q_i + c, p.dtype) * attn_load(k, k_j + c, p.dtype);
    S[idx] = scale * s;
}

/* 2. P = softmax(S) row by row, one warp per row: the row's max m, the sum l of exp(S - m),
 * then P = exp(S - m) / l. Also L = m + log(l), from which stage 4's backward recomputes P
 * (lse is NULL when this file's backward reruns the kernel). */
static __global__ void softmax_kernel(attn_problem p, const float *S, float *P, float *lse)
{
    const int lane = threadIdx.x % WARP;
    const size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= (size_t)p.B * p.H * p.N_q) return;   /* the whole warp leaves together */
    const float *S_i = S + row * p.N_k;
    float *P_i = P + row * p.N_k;

    float m = -INFINITY;
    for (int j = lane; j < p.N_k; j += WARP) m = fmaxf(m, S_i[j]);
    m = warp_max(m);   /* finite: every row sees key 0 */

    float l = 0.0f;
    for (int j = lane; j < p.N_k; j += WARP) l += expf(S_i[j] - m);
    l = warp_sum(l);

    for (int j = lane; j < p.N_k; j += WARP) P_i[j] = expf(S_i[j] - m) / l;
    if (lse != NULL && lane == 0) lse[row] = m + logf(l);   /* row = (b*H + h)*N_q + i, as L */
}

/* 3. O = scale P V, one thread per element O[b, i, h, c] (the forward passes scale 1).
 * Consecutive threads take consecutive c, so their loads of V coalesce and P_i[j] is one
 * broadcast. Keys past visible_keys have P = 0 and are skipped. The backward reuses this
 * kernel for dQ = scale dS K. */
static __global__ void output_kernel(attn_problem p, const float *P, const void *v, float scale,
                                     void *o)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.N_q * p.H * p.d) return;
    const int c = idx % p.d;
    const int h = (idx / p.d) % p.H;
    const int i = (idx / p.d / p.H) % p.N_q;
    const int b = idx / p.d / p.H / p.N_q;
    const float *P_i = P + (((size_t)b * p.H + h) * p.N_q + i) * p.N_k;
    const size_t v_c = attn_row(b, 0, h / (p.H / p.H_kv), p.N_k, p.H_kv, p.d) + c;
    const size_t key_stride = (size_t)p.H_kv * p.d;   /* from V[b, j, ., c] to V[b, j+1, ., c] */
    float acc = 0.0f;
    for (int j = 0; j < visible_keys(p, i); j++)
        acc += P_i[j] * attn_load(v, v_c + j * key_stride, p.dtype);
    attn_store(o, idx, scale * acc, p.dtype);   /* idx is the [B, N_q, H, d] index of O */
}

/* dV = P^T dO and dK = scale dS^T Q: one thread per element out[b, j, h_kv, c], summing over
 * the query heads h of the GQA group of h_kv and over the queries i that see key j (i >= j
 * when causal; P and dS are 0 elsewhere). */
static __global__ void grad_kv_kernel(attn_problem p, const float *P, const void *x, float scale,
                                      void *out)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.N_k * p.H_kv * p.d) return;
    const int c = idx % p.d;
    const int h_kv = (idx / p.d) % p.H_kv;
    const int j = (idx / p.d / p.H_kv) % p.N_k;
    const int b = idx / p.d / p.H_kv / p.N_k;
    const int group = p.H / p.H_kv;
    const size_t query_stride = (size_t)p.H * p.d;   /* from x[b, i, h, c] to x[b, i+1, h, c] */
    float acc = 0.0f;
    for (int h = h_kv * group; h < (h_kv + 1) * group; h++) {
        const float *P_j = P + ((size_t)b * p.H + h) * p.N_q * p.N_k + j;   /* column j */
        const size_t x_c = attn_row(b, 0, h, p.N_q, p.H, p.d) + c;
        for (int i = p.causal ? j : 0; i < p.N_q; i++)
            acc += P_j[(size_t)i * p.N_k] * attn_load(x, x_c + i * query_stride, p.dtype);
    }
    attn_store(out, idx, scale * acc, p.dtype);   /* idx is the [B, N_k, H_kv, d] index */
}

/* D_i = rowsum(dO_i ∘ O_i), one thread per row (b, h, i), stored like L: [B, H, N_q]. */
static __global__ void rowdot_kernel(attn_problem p, const void *d_o, const void *o, float *D)
{
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   /* (b*H + h)*N_q + i */
    if (row >= (size_t)p.B * p.H * p.N_q) return;
    const int i = row % p.N_q;
    const int h = (row / p.N_q) % p.H;
    const int b = row / p.N_q / p.H;
    const size_t r = attn_row(b, i, h, p.N_q, p.H, p.d);
    float acc = 0.0f;
    for (int c = 0; c < p.d; c++)
        acc += attn_load(d_o, r + c, p.dtype) * attn_load(o, r + c, p.dtype);
    D[row] = acc;
}

/* dS = P ∘ (dP - D_i), one thread per element, in place: dS enters holding dP. */
static __global__ void grad_scores_kernel(attn_problem p, const float *P, const float *D, float *dS)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.H * p.N_q * p.N_k) return;
    dS[idx] = P[idx] * (dS[idx] - D[idx / p.N_k]);
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    (void)dir;
    if (p->d != 64 && p->d != 128) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 01_naive supports 64 and 128", p->d);
        return 1;
    }
    return 0;
}

/* Elements of S (and of P): one fp32 score per query, key and head. */
static size_t n_scores(const attn_problem *p)
{
    return (size_t)p->B * p->H * p->N_q * p->N_k;
}

/* S and P, fp32 [B, H, N_q, N_k] each; the backward adds D, fp32 [B, H, N_q]. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    size_t bytes = 2 * n_scores(p) * sizeof(float);
    if (dir == ATTN_BACKWARD) bytes += (size_t)p->B * p->H * p->N_q * sizeof(float);
    return bytes;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *S = (float *)a->ws;
    float *P = S + n_scores(p);
    const size_t n_rows = (size_t)p->B * p->H * p->N_q;
    const size_t n_out = (size_t)p->B * p->N_q * p->H * p->d;

    scores_kernel<<<attn_blocks_for(n_scores(p), THREADS), THREADS, 0, s>>>(*p, a->q, a->k, p->scale,
                                                                       -INFINITY, S);
    ATTN_LAUNCH_CHECK();
    softmax_kernel<<<attn_blocks_for(n_rows, ROWS_PER_BLOCK), THREADS, 0, s>>>(*p, S, P, a->lse);
    ATTN_LAUNCH_CHECK();
    output_kernel<<<attn_blocks_for(n_out, THREADS), THREADS, 0, s>>>(*p, P, a->v, 1.0f, a->o);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *S = (float *)a->ws;
    float *P = S + n_scores(p);
    float *D = P + n_scores(p);
    float *dP = S, *dS = S;   /* S is dead once P exists: dP, then dS in place, take its buffer */
    const size_t n_rows = (size_t)p->B * p->H * p->N_q;
    const size_t n_q = (size_t)p->B * p->N_q * p->H * p->d;
    const size_t n_kv = (size_t)p->B * p->N_k * p->H_kv * p->d;

    /* S and P again, the forward's way (the harness keeps nothing between calls; L stays). */
    scores_kernel<<<attn_blocks_for(n_scores(p), THREADS), THREADS, 0, s>>>(*p, a->q, a->k, p->scale,
                                                                       -INFINITY, S);
    ATTN_LAUNCH_CHECK();
    softmax_kernel<<<attn_blocks_for(n_rows, ROWS_PER_BLOCK), THREADS, 0, s>>>(*p, S, P, NULL);
    ATTN_LAUNCH_CHECK();

    /* dV = P^T dO */
    grad_kv_kernel<<<attn_blocks_for(n_kv, THREADS), THREADS, 0, s>>>(*p, P, a->d_o, 1.0f, a->dv);
    ATTN_LAUNCH_CHECK();
    /* dP = dO V^T, D = rowsum(dO ∘ O), dS = P ∘ (dP - D) */
    scores_kernel<<<attn_blocks_for(n_scores(p), THREADS), THREADS, 0, s>>>(*p, a->d_o, a->v, 1.0f,
                                                                       0.0f, dP);
    ATTN_LAUNCH_CHECK();
    rowdot_kernel<<<attn_blocks_for(n_rows, THREADS), THREADS, 0, s>>>(*p, a->d_o, a->o, D);
    ATTN_LAUNCH_CHECK();
    grad_scores_kernel<<<attn_blocks_for(n_scores(p), THREADS), THREADS, 0, s>>>(*p, P, D, dS);
    ATTN_LAUNCH_CHECK();
    /* dQ = scale dS K, dK = scale dS^T Q */
    output_kernel<<<attn_blocks_for(n_q, THREADS), THREADS, 0, s>>>(*p, dS, a->k, p->scale, a->dq);
    ATTN_LAUNCH_CHECK();
    grad_kv_kernel<<<attn_blocks_for(n_kv, THREADS), THREADS, 0, s>>>(*p, dS, a->q, p->scale, a->dk);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_01_naive = {
    "01_naive",
    "naive attention: S = scale QK^T, P = softmax(S), O = PV in three kernels, S and P in HBM",
    "head dim 64 or 128; bf16, fp16; any N (workspace 8*B*H*N_q*N_k bytes); causal; GQA; "
    "forward and backward",
    80,
    check,
    workspace,
    forward,
    backward,
};
