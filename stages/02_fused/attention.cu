/* stages/02_fused/attention.cu: one fused kernel, scores on chip, no tiling over keys.
 *
 * Changed from 01_naive: the three kernels became one, and S and P moved from HBM into
 * shared memory. A block owns Br query rows Q_i of one head. It computes their scores
 * S_i = scale Q_i K^T into shared memory (N_k floats per row), takes each row's max m_i and
 * sum l_i there, overwrites S_i with P_i = exp(S_i - m_i) / l_i, writes L = m_i + log(l_i),
 * and computes O_i = P_i V from shared memory. S and P never touch HBM: no workspace, and
 * HBM traffic is Q, K, V read and O written (each block re-reads K and V, mostly from L2).
 * One more change, in how a score is computed: a warp takes one key K_j and its 32 lanes
 * split the head dim, so K_j is read by coalesced loads (stage 1 had 32 threads read 32
 * different rows of K). O_i = P_i V keeps stage 1's mapping, one thread per element.
 * The backward is gone: it returns, by recomputation, in stage 04_backward.
 *
 * Why it stops here: nothing is tiled over the keys, so a block needs Br * N_k * 4 bytes of
 * shared memory and N_k is capped by what a block may opt in to: N_k <= smem / (Br * 4),
 * which is 29056 on an H100 or H200 (227 KiB). check() refuses longer key sequences;
 * stage 03_tiled removes the cap.
 * Br = 2: the largest power of two whose cap covers the longest sequence of the bench
 * (16384); Br = 4 would cap N_k at 14528. More rows per block would share each load of K_j among more rows,
 * but the shuffles that finish each dot product grow with Br too, so the time per row
 * should change little with Br, while the cap halves with every doubling.
 * Time: faster than stage 1 (no HBM round trips, coalesced K), still scalar fp32 on the
 * CUDA cores with a shuffle reduction per score, and K, V re-read by every block; with one
 * block per SM at long N_k (its shared memory), few warps hide latency.
 *
 * Run: make build/02_fused && build/02_fused --check --seqlen 4096
 */
#include <stdio.h>
#include "attn_device.cuh"

#define Br        2                /* query rows per block: a Q_i tile */
#define THREADS   256              /* threads per block */
#define D_MAX     128              /* largest head dim supported */
#define LANE_COLS (D_MAX / WARP)   /* head-dim elements per lane in a dot product (4) */

/* Dynamic shared memory: S_i, then P_i, of the block's Br rows, fp32 [Br][N_k]. */
static size_t smem_bytes(int N_k)
{
    return (size_t)Br * N_k * sizeof(float);
}

/* Keys that query i sees: all N_k, or keys 0 .. i when causal (key 0 always, also when
 * N_q > N_k). */
static __device__ __forceinline__ int visible_keys(const attn_problem p, int i)
{
    return p.causal ? min(i + 1, p.N_k) : p.N_k;
}

/* One block: query rows i0 .. i0+Br-1 of head h, batch b. */
static __global__ void __launch_bounds__(THREADS) attention_kernel(attn_problem p, attn_args a)
{
    extern __shared__ float S_i[];   /* [Br][N_k]: row r at S_i + r * N_k */
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * Br;
    const int h_kv = h / (p.H / p.H_kv);
    const int rows = min(Br, p.N_q - i0);   /* the last block may hold fewer */

    /* The block's last row sees the most keys; scores past a row's own limit are -inf. */
    const int last_row = i0 + rows - 1;
    const int n_keys = visible_keys(p, last_row);

    /* Q_i in registers: each lane keeps elements lane, lane + 32, ... of every row (rows past
     * N_q read 0 and are never stored). */
    float q[Br][LANE_COLS];
#pragma unroll
    for (int r = 0; r < Br; r++)
#pragma unroll
        for (int t = 0; t < LANE_COLS; t++) {
            const int c = lane + t * WARP;
            q[r][t] = r < rows && c < p.d
                    ? attn_load(a.q, attn_row(b, i0 + r, h, p.N_q, p.H, p.d) + c, p.dtype) : 0.0f;
        }

    /* 1. S_i = scale Q_i K^T. One warp per key j, its lanes splitting the head dim, and a
     * shuffle sum to finish each row's dot product. Masked scores are -inf, as in stage 1.
     * Unrolled so that a warp has the loads of several keys in flight at once. */
#pragma unroll 4
    for (int j = warp; j < n_keys; j += THREADS / WARP) {
        const size_t k_j = attn_row(b, j, h_kv, p.N_k, p.H_kv, p.d);
        float s[Br];
#pragma unroll
        for (int r = 0; r < Br; r++) s[r] = 0.0f;
#pragma unroll
        for (int t = 0; t < LANE_COLS; t++) {
            const int c = lane + t * WARP;
            if (c < p.d) {
                const float k = attn_load(a.k, k_j + c, p.dtype);
#pragma unroll
                for (int r = 0; r < Br; r++) s[r] += q[r][t] * k;
            }
        }
#pragma unroll
        for (int r = 0; r < Br; r++) s[r] = warp_sum(s[r]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < Br; r++)
                S_i[r * p.N_k + j] = j < visible_keys(p, i0 + r) ? p.scale * s[r] : -INFINITY;
    }
    __syncthreads();

    /* 2. P_i = softmax(S_i) in place, one warp per row as stage 1's softmax_kernel: the
     * row's max m, the sum l of exp(S - m), then P = exp(S - m) / l, and L. */
    for (int r = warp; r < rows; r += THREADS / WARP) {
        float *S_r = S_i + r * p.N_k;

        float m = -INFINITY;
        for (int j = lane; j < n_keys; j += WARP) m = fmaxf(m, S_r[j]);
        m = warp_max(m);   /* finite: every row sees key 0 */

        float l = 0.0f;
        for (int j = lane; j < n_keys; j += WARP) l += expf(S_r[j] - m);
        l = warp_sum(l);

        for (int j = lane; j < n_keys; j += WARP) S_r[j] = expf(S_r[j] - m) / l;
        if (lane == 0) a.lse[((size_t)b * p.H + h) * p.N_q + i0 + r] = m + logf(l);
    }
    __syncthreads();

    /* 3. O_i = P_i V, one thread per element (r, c) as stage 1's output_kernel: consecutive
     * threads take consecutive c, so their loads of V coalesce and P_i[r][j] is a broadcast. */
    const size_t key_stride = (size_t)p.H_kv * p.d;   /* from V[b, j, ., c] to V[b, j+1, ., c] */
    for (int e = threadIdx.x; e < rows * p.d; e += THREADS) {
        const int r = e / p.d, c = e % p.d;
        const float *P_r = S_i + r * p.N_k;
        const size_t v_c = attn_row(b, 0, h_kv, p.N_k, p.H_kv, p.d) + c;
        float acc = 0.0f;
#pragma unroll 4
        for (int j = 0; j < n_keys; j++)
            acc += P_r[j] * attn_load(a.v, v_c + j * key_stride, p.dtype);
        attn_store(a.o, attn_row(b, i0 + r, h, p.N_q, p.H, p.d) + c, acc, p.dtype);
    }
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    if (dir == ATTN_BACKWARD) {
        snprintf(why, ATTN_WHY_LEN, "02_fused has no backward pass (see 04_backward)");
        return 1;
    }
    if (p->d != 64 && p->d != 128) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 02_fused supports 64 and 128", p->d);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "02_fused cannot query the device");
        return 1;
    }
    if (smem_bytes(p->N_k) > (size_t)smem_max) {
        const int cap = smem_max / (int)(Br * sizeof(float));
        snprintf(why, ATTN_WHY_LEN,
                 "N_k = %d needs %zu KiB of shared memory for the scores of %d rows; this GPU "
                 "gives a block %d KiB, so stage 02_fused caps N_k at %d",
                 p->N_k, (smem_bytes(p->N_k) + 1023) / 1024, Br, smem_max / 1024, cap);
        return 1;
    }
    return 0;
}

/* Nothing beyond L: S and P never leave the chip. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)p;
    (void)dir;
    return 0;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->N_k);
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    const dim3 grid(attn_ceil_div(p->N_q, Br), p->H, p->B);
    attention_kernel<<<grid, THREADS, smem, s>>>(*p, *a);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_02_fused = {
    "02_fused",
    "one fused kernel: scores and probabilities in shared memory, no tiling over keys",
    "head dim 64 or 128; bf16, fp16; N_k up to smem / 8 bytes (29056 on H100/H200); causal; "
    "GQA; forward only",
    80,
    check,
    workspace,
    forward,
    NULL,
};
