/* stages/03_tiled/attention.cu: tiling over keys with the online softmax (FlashAttention-1 forward).
 *
 * Changed from 02_fused: the block no longer holds a whole score row. It walks over the keys
 * in tiles K_j, V_j of Bc rows and keeps, per query row, the running max m_i and normaliser
 * l_i. When a tile raises the max, the partial O_i and l_i are rescaled by exp(m_old - m_new);
 * O_i is divided by l_i once, after the last tile, and L = m_i + log(l_i) is written with it.
 * S_ij and P_ij are Br x Bc tiles that live only in registers and shared memory.
 *
 * Why: stage 2 needed shared memory for a full row of N_k scores, so N_k was capped. Here
 * shared memory holds three tiles whatever N is, so any N runs, and HBM traffic is Q, K, V
 * read and O written (K, V once per query tile). Memory: O(N), L only, no workspace.
 * Causal: tiles entirely above the diagonal are skipped, so causal costs about half.
 * Time: still scalar fp32 FMAs on the CUDA cores (tensor cores are stage 5's lesson), each
 * thread a 4 x 4 micro-tile of S_ij, so it is bounded by the fp32 peak, far below stage 5.
 *
 * Loop order: Q outer, K/V inner. Each block owns one Q_i tile and loops over every K_j, V_j
 * tile, so O_i, m_i and l_i stay in registers for the whole loop and are written to HBM once.
 * FA-1's Algorithm 1 puts K/V in the outer loop and reads and writes O_i, l_i, m_i in HBM at
 * every step; on a GPU, where a block is the unit that owns state, Q-outer is the natural
 * mapping (FA-2 later made it the algorithm). What this stage still leaves for stage 5:
 * tensor cores, warps that split query rows so no softmax statistic crosses warps, exp2
 * with the scale folded in, P_ij kept in registers. (The grid is already parallel over the
 * sequence: one block per Q_i tile, head and batch element.)
 *
 * Run: make build/03_tiled && build/03_tiled --seqlen 4096 --dim 128 --causal --check
 */
#include <stdio.h>
#include "attn_device.cuh"

#define Br        64               /* query rows per block: a Q_i tile */
#define Bc        64               /* keys per K_j, V_j tile */
#define THREADS   256              /* threads per block */
#define D_MAX     128              /* largest head dim supported */
#define TX        16               /* threads along a row: they split S_ij's keys, O_i's columns */
#define TY        (THREADS / TX)   /* threads along the query rows (16) */
#define ROWS      (Br / TY)        /* query rows per thread (4) */
#define KEYS      (Bc / TX)        /* keys of S_ij per thread (4) */
#define COLS_MAX  (D_MAX / TX)     /* columns of O_i per thread at D_MAX (8) */
#define VEC       4                /* floats per float4 shared-memory access */
#define PAD       4                /* floats added to each shared row: keeps float4 alignment,
                                      and shifts consecutive rows by 4 banks so that threads
                                      reading different rows at one column do not collide */

/* Dynamic shared memory: Q_i and K_j [rows][d + PAD], V_j [Bc][d], all fp32.
 * P_ij [Br][Bc + PAD] reuses K_j's space, which is at least as large for d >= 64. */
static size_t smem_bytes(int d)
{
    return ((size_t)Br * (d + PAD) + (size_t)Bc * (d + PAD) + (size_t)Bc * d) * sizeof(float);
}

/* Keys that query i sees: all N_k, or keys 0 .. i when causal (key 0 always, also when
 * N_q > N_k). */
static __device__ __forceinline__ int visible_keys(const attn_problem p, int i)
{
    return p.causal ? min(i + 1, p.N_k) : p.N_k;
}

/* Max and sum over the TX threads that share a query row: aligned groups of 16 lanes. */
static __device__ __forceinline__ float row_max(float x)
{
    for (int o = TX / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

static __device__ __forceinline__ float row_sum(float x)
{
    for (int o = TX / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* acc + a · b, four fp32 FMAs. */
static __device__ __forceinline__ float dot4(float4 a, float4 b, float acc)
{
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

/* Copy rows n0 .. n0+rows-1 of head h of x ([B, N, heads, d], dtype t) into tile (row stride
 * ld floats) as fp32. Rows past N read as 0, so out-of-range queries and keys stay finite.
 * THREADS is a multiple of d, so a thread always copies the same column k and consecutive
 * threads read consecutive elements. */
static __device__ __forceinline__ void load_tile(float *tile, int ld, const void *x, attn_dtype t,
                                                 int b, int n0, int rows, int N, int h, int heads,
                                                 int d)
{
    const int k = threadIdx.x % d, step = THREADS / d;
    const size_t stride = (size_t)step * heads * d;
    size_t e = attn_row(b, n0 + (int)threadIdx.x / d, h, N, heads, d) + k;
    for (int r = threadIdx.x / d; r < rows; r += step, e += stride)
        tile[r * ld + k] = n0 + r < N ? attn_load(x, e, t) : 0.0f;
}

/* One block: query tile i0 .. i0+Br-1 of head h, batch b. Thread (ty, tx) owns query rows
 * ty*ROWS + r, keys tx + TX*c of each S_ij, and columns g*TX*VEC + tx*VEC + v of O_i.
 * d is a literal at each call site, so the loops over the head dim unroll. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const int d)
{
    extern __shared__ __align__(16) float smem[];
    const int ld = d + PAD, ldp = Bc + PAD;
    float *Q_i = smem;               /* [Br][ld] */
    float *K_j = Q_i + Br * ld;      /* [Bc][ld] */
    float *V_j = K_j + Bc * ld;      /* [Bc][d]  */
    float *P_ij = K_j;               /* [Br][ldp]: K_j is dead once S_ij is in registers */

    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * Br;
    const int h_kv = h / (p.H / p.H_kv);
    const int rows = min(Br, p.N_q - i0);    /* the last block may hold fewer */
    const int col_groups = d / (TX * VEC);   /* float4 column groups of O_i per thread */

    load_tile(Q_i, ld, a.q, p.dtype, b, i0, Br, p.N_q, h, p.H, d);

    float m[ROWS], l[ROWS], o[ROWS][COLS_MAX];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < COLS_MAX; c++) o[r][c] = 0.0f;
    }

    /* The block's last row sees the most keys; the loop stops at the tile that holds its last
     * one, so with causal masking the tiles entirely above the diagonal are skipped. */
    const int last_row = i0 + rows - 1;
    const int n_keys = visible_keys(p, last_row);
    const int Tc = (n_keys + Bc - 1) / Bc;

    for (int j = 0; j < Tc; j++) {
        const int j0 = j * Bc;
        __syncthreads();   /* everyone is done with the previous P_ij (in K_j's space) and V_j */
        load_tile(K_j, ld, a.k, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);
        load_tile(V_j, d, a.v, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);
        __syncthreads();

        /* S_ij = Q_i K_j^T, four head-dim steps per float4 load. */
        float s[ROWS][KEYS];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < KEYS; c++) s[r][c] = 0.0f;
#pragma unroll 4
        for (int k = 0; k < d; k += VEC) {
            float4 q[ROWS], kt[KEYS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) q[r] = *(const float4 *)&Q_i[(ty * ROWS + r) * ld + k];
#pragma unroll
            for (int c = 0; c < KEYS; c++) kt[c] = *(const float4 *)&K_j[(tx + TX * c) * ld + k];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < KEYS; c++) s[r][c] = dot4(q[r], kt[c], s[r][c]);
        }

        /* Online softmax: scale and mask, new running max, rescale what came before. */
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int i = i0 + ty * ROWS + r;
            float m_tile = -INFINITY;
#pragma unroll
            for (int c = 0; c < KEYS; c++) {
                const int key = j0 + tx + TX * c;
                const int visible = key < visible_keys(p, i);
                /* the product rounded on its own, not fused with the subtraction below,
                 * so that 04_backward recomputes S_ij with the same bits */
                s[r][c] = visible ? __fmul_rn(p.scale, s[r][c]) : -INFINITY;
                m_tile = fmaxf(m_tile, s[r][c]);
            }
            const float m_new = fmaxf(m[r], row_max(m_tile));
            /* A row that has seen only masked keys has m_new = -inf: subtract 0 instead, so
             * that exp gives 0 rather than exp(-inf - -inf) = NaN. */
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = expf(m[r] - m_use);   /* 0 on the first tile */
            float l_tile = 0.0f;
#pragma unroll
            for (int c = 0; c < KEYS; c++) {
                s[r][c] = expf(s[r][c] - m_use);      /* P_ij, unnormalised */
                l_tile += s[r][c];
            }
            l[r] = alpha * l[r] + row_sum(l_tile);
            m[r] = m_new;
#pragma unroll
            for (int c = 0; c < COLS_MAX; c++) o[r][c] *= alpha;
        }

        __syncthreads();   /* everyone is done reading K_j before P_ij overwrites it */
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < KEYS; c++) P_ij[(ty * ROWS + r) * ldp + tx + TX * c] = s[r][c];
        __syncthreads();

        /* O_i += P_ij V_j, four keys per float4 load of P_ij. */
#pragma unroll 2
        for (int k = 0; k < Bc; k += VEC) {
            float pr[ROWS][VEC];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float4 x = *(const float4 *)&P_ij[(ty * ROWS + r) * ldp + k];
                pr[r][0] = x.x; pr[r][1] = x.y; pr[r][2] = x.z; pr[r][3] = x.w;
            }
#pragma unroll
            for (int u = 0; u < VEC; u++)
#pragma unroll
                for (int g = 0; g < col_groups; g++) {
                    const float4 v = *(const float4 *)&V_j[(k + u) * d + g * TX * VEC + tx * VEC];
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        o[r][g * VEC + 0] = fmaf(pr[r][u], v.x, o[r][g * VEC + 0]);
                        o[r][g * VEC + 1] = fmaf(pr[r][u], v.y, o[r][g * VEC + 1]);
                        o[r][g * VEC + 2] = fmaf(pr[r][u], v.z, o[r][g * VEC + 2]);
                        o[r][g * VEC + 3] = fmaf(pr[r][u], v.w, o[r][g * VEC + 3]);
                    }
                }
        }
    }

    /* O_i = O_i / l_i and L_i = m_i + log(l_i), written once. Every real row sees key 0,
     * so l_i >= 1 and L_i is finite; rows past N_q are not stored. */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int i = i0 + ty * ROWS + r;
        if (ty * ROWS + r >= rows) continue;
        const float inv_l = 1.0f / l[r];
        const size_t row = attn_row(b, i, h, p.N_q, p.H, d);
#pragma unroll
        for (int g = 0; g < col_groups; g++)
#pragma unroll
            for (int v = 0; v < VEC; v++)
                attn_store(a.o, row + g * TX * VEC + tx * VEC + v, o[r][g * VEC + v] * inv_l,
                           p.dtype);
        if (tx == 0) a.lse[((size_t)b * p.H + h) * p.N_q + i] = m[r] + logf(l[r]);
    }
}

/* Two blocks per SM (launch bounds cap registers at 128 per thread; at d = 128 the shared
 * memory of two blocks fits an H100/H200 SM), so one block computes while the other loads. */
static __global__ void __launch_bounds__(THREADS, 2) attention_kernel(attn_problem p, attn_args a)
{
    /* A literal head dim per branch: register arrays sized and loops unrolled for it. */
    if (p.d == 64) tiled_attention(p, a, 64);
    else           tiled_attention(p, a, 128);
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    if (dir == ATTN_BACKWARD) {
        snprintf(why, ATTN_WHY_LEN, "03_tiled has no backward pass (see 04_backward)");
        return 1;
    }
    if (p->d != 64 && p->d != 128) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 03_tiled supports 64 and 128", p->d);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "03_tiled cannot query the device");
        return 1;
    }
    if (smem_bytes(p->d) > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 03_tiled", p->d, (smem_bytes(p->d) + 1023) / 1024,
                 smem_max / 1024);
        return 1;
    }
    return 0;
}

/* Nothing beyond L: S_ij and P_ij never leave the chip. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)p;
    (void)dir;
    return 0;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    const dim3 grid(attn_ceil_div(p->N_q, Br), p->H, p->B);
    attention_kernel<<<grid, THREADS, smem, s>>>(*p, *a);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_03_tiled = {
    "03_tiled",
    "tiling over keys with the online softmax (FlashAttention-1 forward), scalar fp32",
    "head dim 64 or 128; bf16, fp16; any N; causal; GQA; forward only",
    80,
    check,
    workspace,
    forward,
    NULL,
};
