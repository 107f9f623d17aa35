/* common/cublas_baseline.cu: attention the way a framework's unfused path computes it
 * (PyTorch's MATH backend): batched cuBLAS GEMMs around a softmax kernel.
 *
 *   S = scale Q K^T   cuBLAS: 16-bit inputs, fp32 accumulation, fp32 S [B, H, N_q, N_k]
 *   P = softmax(S)    one warp per row: causal mask, max, sum; P stored in the 16-bit dtype, L
 *   O = P V           cuBLAS: 16-bit inputs and output, fp32 accumulation
 * Backward: S and P are recomputed first (the harness keeps nothing between calls; a
 * framework keeps P from its forward, so this backward does one GEMM more than theirs), then
 *   dV = P^T dO, dP = dO V^T, dS = P ∘ (dP - D) with D = rowsum(P ∘ dP),
 *   dQ = scale dS K, dK = scale dS^T Q,
 * with dS rounded to the dtype before its two GEMMs, as autograd does.
 *
 * Layouts. Q [B, N_q, H, d] holds, for each (b, h), a row-major N_q x d matrix with row
 * stride H*d. cuBLAS is column-major and sees that same memory as the d x N_q matrix Q^T with
 * leading dimension H*d, so every product is asked for transposed: row-major C = A B is
 * column-major C^T = B^T A^T. GQA gives query head h the key/value head h / (H / H_kv),
 * which no single batch stride expresses, so each GEMM is one cublasGemmBatchedEx over the
 * B*H pairs (b, h), its matrix pointers written into the workspace by a small kernel.
 * dK and dV are summed over the query heads of a group: cuBLAS writes each query head's
 * share to an fp32 buffer [B, H, N_k, d], and group_sum_kernel adds them up.
 *
 * Workspace: S fp32 (then dP) and P in the dtype (then dS), [B, H, N_q, ld] with rows padded
 * to ld = N_k rounded up to 8 so that every row starts 16-byte aligned; the backward adds the
 * fp32 buffer for dK and dV; and three arrays of B*H pointers. About 6*B*H*N_q*N_k bytes
 * forward, plus 4*B*H*N_k*d backward.
 *
 * Link with -lcublas. Run: make build/cublas && build/cublas --check --backward --seqlen 1024
 */
#include <limits.h>
#include <stdio.h>
#include <cublas_v2.h>
#include "attn_device.cuh"

#define THREADS        256                /* threads per block */
#define ROWS_PER_BLOCK (THREADS / WARP)   /* row kernels: one warp per row */
#define ROW_ALIGN      8                  /* 16-bit elements in 16 bytes: row alignment */
#define WS_ALIGN       256                /* bytes: alignment of each part of the workspace */

/* One operand of a batched GEMM. Matrix (b, h) starts base + b*batch_stride +
 * (h / head_div)*head_stride elements in; cuBLAS reads it column-major with leading
 * dimension ld. */
typedef struct {
    const void *base;
    cudaDataType type;      /* CUDA_R_32F, or the 16-bit dtype */
    int ld;
    size_t batch_stride;
    size_t head_stride;
    int head_div;           /* H / H_kv for K and V, 1 otherwise */
} operand;

/* What one forward or backward call works with. */
typedef struct {
    const attn_problem *p;
    cudaStream_t s;
    float *S;       /* fp32 [B, H, N_q, ld]: S, then dP */
    void *P;        /* dtype [B, H, N_q, ld]: P, then dS */
    float *acc;     /* backward: fp32 [B, H, N_k, d], each query head's dV, then dK */
    const void **A_ptrs, **B_ptrs;   /* B*H matrix pointers each, for cublasGemmBatchedEx */
    void **C_ptrs;
} context;

static cublasHandle_t handle;   /* created on first use, kept for the life of the program */

static __device__ __forceinline__ const void *matrix_address(operand m, int b, int h)
{
    const size_t e = (size_t)b * m.batch_stride + (size_t)(h / m.head_div) * m.head_stride;
    return (const char *)m.base + e * (m.type == CUDA_R_32F ? sizeof(float) : sizeof(uint16_t));
}

/* The pointers of matrix (b, h) of each operand, at index b*H + h. */
static __global__ void pointers_kernel(int B, int H, operand A, operand Bm, operand C,
                                       const void **a, const void **bm, void **c)
{
    const int z = blockIdx.x * blockDim.x + threadIdx.x;
    if (z >= B * H) return;
    a[z] = matrix_address(A, z / H, z % H);
    bm[z] = matrix_address(Bm, z / H, z % H);
    c[z] = (void *)matrix_address(C, z / H, z % H);
}

/* P = softmax(S) by rows, one warp per row (b, h, i), keys past the causal limit set to 0.
 * The max and the sum come from one pass: each lane keeps a running max m and the sum l of
 * exp(S - m), rescaling l when m grows, and the warp merges the 32 pairs. L = m + log(l)
 * (lse is NULL when the backward recomputes P). */
static __global__ void softmax_kernel(attn_problem p, int ld, const float *S, void *P, float *lse)
{
    const int lane = threadIdx.x % WARP;
    const size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= (size_t)p.B * p.H * p.N_q) return;   /* the whole warp leaves together */
    const int i = row % p.N_q;
    const int n = p.causal ? min(i + 1, p.N_k) : p.N_k;   /* keys row i sees (key 0 always) */
    const float *S_i = S + row * ld;

    float m = -INFINITY, l = 0.0f;
    for (int j = lane; j < n; j += WARP) {
        const float m_new = fmaxf(m, S_i[j]);
        l = l * expf(m - m_new) + expf(S_i[j] - m_new);   /* exp(-inf) = 0 on the first key */
        m = m_new;
    }
    const float m_row = warp_max(m);
    const float l_row = warp_sum(l * expf(m - m_row));   /* a lane with no key adds 0 */

    const float inv_l = 1.0f / l_row;
    for (int j = lane; j < p.N_k; j += WARP)
        attn_store(P, row * ld + j, j < n ? expf(S_i[j] - m_row) * inv_l : 0.0f, p.dtype);
    if (lse != NULL && lane == 0) lse[row] = m_row + logf(l_row);   /* row = (b*H + h)*N_q + i */
}

/* dS = P ∘ (dP - D_i), one warp per row (b, h, i), with D_i = rowsum(P_i ∘ dP_i) as
 * PyTorch's softmax backward computes it (equal to rowsum(dO_i ∘ O_i), and exactly consistent
 * with P and dP: when a row sees one key, dS is exactly 0). dS is stored in the dtype over
 * P: each lane reads an element of P before it writes it. */
static __global__ void grad_scores_kernel(attn_problem p, int ld, const float *dP, void *P_dS)
{
    const int lane = threadIdx.x % WARP;
    const size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= (size_t)p.B * p.H * p.N_q) return;
    const size_t r = row * ld;

    float D = 0.0f;
    for (int j = lane; j < p.N_k; j += WARP) D += attn_load(P_dS, r + j, p.dtype) * dP[r + j];
    D = warp_sum(D);

    for (int j = lane; j < p.N_k; j += WARP)
        attn_store(P_dS, r + j, attn_load(P_dS, r + j, p.dtype) * (dP[r + j] - D), p.dtype);
}

/* out[b, j, h_kv, c] (dK or dV, dtype) = the sum over the query heads h of group h_kv of
 * acc[b, h, j, c] (fp32), one thread per element of out. */
static __global__ void group_sum_kernel(attn_problem p, const float *acc, void *out)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.N_k * p.H_kv * p.d) return;
    const attn_pos x = attn_unflatten(idx, p.N_k, p.H_kv, p.d);   /* x.n = key j, x.h = h_kv */
    const int group = p.H / p.H_kv;
    float sum = 0.0f;
    for (int h = x.h * group; h < (x.h + 1) * group; h++)
        sum += acc[(((size_t)x.b * p.H + h) * p.N_k + x.n) * p.d + x.c];
    attn_store(out, idx, sum, p.dtype);
}

/* ---- host ---- */

/* cudaErrorUnknown for any cuBLAS failure, whose status is printed the first time. */
static cudaError_t cublas_check(cublasStatus_t status, const char *what)
{
    static int reported;
    if (status == CUBLAS_STATUS_SUCCESS) return cudaSuccess;
    if (!reported) {
        fprintf(stderr, "cublas: %s: %s\n", what, cublasGetStatusString(status));
        reported = 1;
    }
    return cudaErrorUnknown;
}

static cudaDataType dtype_of(const attn_problem *p)
{
    return p->dtype == ATTN_FP16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* Row stride of S and P: N_k rounded up to ROW_ALIGN elements. */
static int scores_ld(const attn_problem *p)
{
    return (p->N_k + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
}

static size_t align_up(size_t bytes)
{
    return (bytes + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
}

/* Byte offsets of the parts of the workspace, and its size. The three pointer arrays start
 * aligned too: cuBLAS reads them with wide loads. */
typedef struct {
    size_t S, P, acc, A_ptrs, B_ptrs, C_ptrs, bytes;
} layout;

static layout workspace_layout(const attn_problem *p, attn_dir dir)
{
    const size_t n_scores = (size_t)p->B * p->H * p->N_q * scores_ld(p);
    const size_t n_acc = dir == ATTN_BACKWARD ? (size_t)p->B * p->H * p->N_k * p->d : 0;
    const size_t n_ptrs = (size_t)p->B * p->H;
    layout w;
    w.S = 0;
    w.P = w.S + align_up(n_scores * sizeof(float));
    w.acc = w.P + align_up(n_scores * sizeof(uint16_t));
    w.A_ptrs = w.acc + align_up(n_acc * sizeof(float));
    w.B_ptrs = w.A_ptrs + align_up(n_ptrs * sizeof(void *));
    w.C_ptrs = w.B_ptrs + align_up(n_ptrs * sizeof(void *));
    w.bytes = w.C_ptrs + n_ptrs * sizeof(void *);
    return w;
}

/* Q, O, dO, dQ [B, N_q, H, d]: matrix (b, h) is d x N_q to cuBLAS, leading dimension H*d. */
static operand query_operand(const attn_problem *p, const void *x)
{
    const operand m = { x, dtype_of(p), p->H * p->d, (size_t)p->N_q * p->H * p->d,
                        (size_t)p->d, 1 };
    return m;
}

/* K, V [B, N_k, H_kv, d]: d x N_k, leading dimension H_kv*d, head h / (H / H_kv). */
static operand kv_operand(const attn_problem *p, const void *x)
{
    const operand m = { x, dtype_of(p), p->H_kv * p->d, (size_t)p->N_k * p->H_kv * p->d,
                        (size_t)p->d, p->H / p->H_kv };
    return m;
}

/* S, dP (fp32) or P, dS (dtype) [B, H, N_q, ld]: N_k x N_q, leading dimension ld. */
static operand scores_operand(const attn_problem *p, const void *x, cudaDataType type)
{
    const int ld = scores_ld(p);
    const operand m = { x, type, ld, (size_t)p->H * p->N_q * ld, (size_t)p->N_q * ld, 1 };
    return m;
}

/* Each query head's dK or dV, fp32 [B, H, N_k, d]: d x N_k, leading dimension d. */
static operand acc_operand(const attn_problem *p, const float *x)
{
    const operand m = { x, CUDA_R_32F, p->d, (size_t)p->H * p->N_k * p->d,
                        (size_t)p->N_k * p->d, 1 };
    return m;
}

/* C = alpha op(A) op(B) for each of the B*H matrices (b, h): m x n, inner dimension k. */
static cudaError_t gemm(const context *c, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                        int n, int k, float alpha, operand A, operand B, operand C)
{
    const int batch = c->p->B * c->p->H;
    pointers_kernel<<<attn_blocks_for(batch, THREADS), THREADS, 0, c->s>>>(
        c->p->B, c->p->H, A, B, C, c->A_ptrs, c->B_ptrs, c->C_ptrs);
    ATTN_LAUNCH_CHECK();
    const float beta = 0.0f;
    return cublas_check(cublasGemmBatchedEx(handle, op_a, op_b, m, n, k, &alpha, c->A_ptrs, A.type,
                                            A.ld, c->B_ptrs, B.type, B.ld, &beta, c->C_ptrs,
                                            C.type, C.ld, batch, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                        "cublasGemmBatchedEx");
}

/* The handle (created on the first call), bound to stream s, and the workspace split up. */
static cudaError_t begin(context *c, const attn_problem *p, const attn_args *a, cudaStream_t s,
                         attn_dir dir)
{
    if (handle == NULL) {
        cublasHandle_t created;
        ATTN_TRY(cublas_check(cublasCreate(&created), "cublasCreate"));
        handle = created;
    }
    ATTN_TRY(cublas_check(cublasSetStream(handle, s), "cublasSetStream"));
    const layout w = workspace_layout(p, dir);
    char *ws = (char *)a->ws;
    c->p = p;
    c->s = s;
    c->S = (float *)(ws + w.S);
    c->P = ws + w.P;
    c->acc = (float *)(ws + w.acc);
    c->A_ptrs = (const void **)(ws + w.A_ptrs);
    c->B_ptrs = (const void **)(ws + w.B_ptrs);
    c->C_ptrs = (void **)(ws + w.C_ptrs);
    return cudaSuccess;
}

/* S = scale Q K^T, then P = softmax(S) (and L when lse is not NULL). */
static cudaError_t scores_and_probs(const context *c, const attn_args *a, float *lse)
{
    const attn_problem *p = c->p;
    /* S^T = K Q^T: (N_k x d)(d x N_q) */
    ATTN_TRY(gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, p->N_k, p->N_q, p->d, p->scale, kv_operand(p, a->k),
                  query_operand(p, a->q), scores_operand(p, c->S, CUDA_R_32F)));
    const size_t n_rows = (size_t)p->B * p->H * p->N_q;
    softmax_kernel<<<attn_blocks_for(n_rows, ROWS_PER_BLOCK), THREADS, 0, c->s>>>(*p, scores_ld(p), c->S,
                                                                             c->P, lse);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

/* dK or dV from the per-query-head sums in c->acc. */
static cudaError_t group_sum(const context *c, void *out)
{
    const attn_problem *p = c->p;
    const size_t n = (size_t)p->B * p->N_k * p->H_kv * p->d;
    group_sum_kernel<<<attn_blocks_for(n, THREADS), THREADS, 0, c->s>>>(*p, c->acc, out);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    (void)dir;
    /* cuBLAS cannot see the alignment of matrices reached through pointer arrays, so every
     * matrix and row is kept 16-byte aligned: S and P rows are padded, Q, K, V rows need d
     * to be a multiple of 8. Lengths and group sizes are free. */
    if (p->d % ROW_ALIGN != 0) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: the cuBLAS baseline needs a multiple of %d",
                 p->d, ROW_ALIGN);
        return 1;
    }
    /* cuBLAS takes leading dimensions in int (Q's and O's rows are H d apart), and S and P's
     * bytes, 6 B H N_q ld, must not wrap size_t (the memory check would then pass) */
    if ((long long)p->H * p->d > INT_MAX) {
        snprintf(why, ATTN_WHY_LEN, "heads x head dim = %lld: the cuBLAS baseline's row stride must "
                 "fit an int", (long long)p->H * p->d);
        return 1;
    }
    if (6.0L * p->B * p->H * p->N_q * (long double)scores_ld(p) > 0x1p60L) {
        snprintf(why, ATTN_WHY_LEN, "S and P would take %.3Lg bytes: more than the cuBLAS baseline "
                 "addresses", 6.0L * p->B * p->H * p->N_q * (long double)scores_ld(p));
        return 1;
    }
    return 0;
}

static size_t workspace(const attn_problem *p, attn_dir dir)
{
    return workspace_layout(p, dir).bytes;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    context c;
    ATTN_TRY(begin(&c, p, a, s, ATTN_FORWARD));
    ATTN_TRY(scores_and_probs(&c, a, a->lse));
    /* O = P V, i.e. O^T = V^T P^T: (d x N_k)(N_k x N_q) */
    return gemm(&c, CUBLAS_OP_N, CUBLAS_OP_N, p->d, p->N_q, p->N_k, 1.0f, kv_operand(p, a->v),
                scores_operand(p, c.P, dtype_of(p)), query_operand(p, a->o));
}

static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    context c;
    ATTN_TRY(begin(&c, p, a, s, ATTN_BACKWARD));
    const operand P = scores_operand(p, c.P, dtype_of(p));
    const operand dS = P;                                        /* written over P */
    const operand dP = scores_operand(p, c.S, CUDA_R_32F);       /* written over S */
    const operand acc = acc_operand(p, c.acc);

    ATTN_TRY(scores_and_probs(&c, a, NULL));   /* L stays as the forward wrote it */

    /* dV = P^T dO per query head, i.e. dV^T = dO^T P: (d x N_q)(N_q x N_k); then the GQA sum */
    ATTN_TRY(gemm(&c, CUBLAS_OP_N, CUBLAS_OP_T, p->d, p->N_k, p->N_q, 1.0f,
                  query_operand(p, a->d_o), P, acc));
    ATTN_TRY(group_sum(&c, a->dv));

    /* dP = dO V^T, i.e. dP^T = V dO^T: (N_k x d)(d x N_q) */
    ATTN_TRY(gemm(&c, CUBLAS_OP_T, CUBLAS_OP_N, p->N_k, p->N_q, p->d, 1.0f, kv_operand(p, a->v),
                  query_operand(p, a->d_o), dP));

    /* dS = P ∘ (dP - D) */
    const size_t n_rows = (size_t)p->B * p->H * p->N_q;
    grad_scores_kernel<<<attn_blocks_for(n_rows, ROWS_PER_BLOCK), THREADS, 0, s>>>(*p, scores_ld(p), c.S,
                                                                             c.P);
    ATTN_LAUNCH_CHECK();

    /* dQ = scale dS K, i.e. dQ^T = K^T dS^T: (d x N_k)(N_k x N_q) */
    ATTN_TRY(gemm(&c, CUBLAS_OP_N, CUBLAS_OP_N, p->d, p->N_q, p->N_k, p->scale,
                  kv_operand(p, a->k), dS, query_operand(p, a->dq)));

    /* dK = scale dS^T Q per query head, i.e. dK^T = Q^T dS: (d x N_q)(N_q x N_k); GQA sum */
    ATTN_TRY(gemm(&c, CUBLAS_OP_N, CUBLAS_OP_T, p->d, p->N_k, p->N_q, p->scale,
                  query_operand(p, a->q), dS, acc));
    return group_sum(&c, a->dk);
}

ATTN_EXPORT const attn_stage stage_cublas = {
    "cublas",
    "baseline: S = QK^T and O = PV with cuBLAS, softmax kernel in between (a framework's "
    "unfused path)",
    "head dim a multiple of 8; bf16, fp16; any N (workspace 6*B*H*N_q*N_k bytes); causal; GQA; "
    "forward and backward",
    80,
    check,
    workspace,
    forward,
    backward,
};
