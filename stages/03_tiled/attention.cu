/* stages/03_tiled/attention.cu: FlashAttention-1's forward, Algorithm 1 as the paper writes it.
 *
 * Changed from 02_fused: a block no longer holds a whole score row. It walks over the keys in
 * tiles K_j, V_j of Bc rows (the outer loop, Algorithm 1 line 5) and, for each, over the
 * queries in tiles Q_i of Br rows (the inner loop, line 7). Each inner step reads Q_i and the
 * running O_i, l_i, m_i from HBM (line 8), folds tile j into them with the online softmax
 * (lines 9-11: S_ij, the tile's own max m~ and sum l~, the new m_i, l_i) and writes them back
 * (lines 12-13). O_i is kept normalised after every step, in fp32 in the workspace; the last
 * key tile a Q_i sees writes O in the dtype and L = m_i + log l_i instead.
 *
 * Why: stage 2 needed shared memory for a whole row of N_k scores, so N_k was capped. Here
 * shared memory holds four tiles whatever N is, so any N runs, and nothing N x N exists.
 * What it costs is HBM traffic: O_i, l_i and m_i make a round trip per (K_j, Q_i) pair, Tc
 * times over the run, which is FA-1's Theta(N^2 d^2 / M) (docs/03_tiled.md derives it).
 * Parallelism: one block per (batch, head), as FA-1's CUDA code had it; the sequence is not
 * split across blocks, so few heads leave SMs idle (the FA-2 lesson measures that).
 * Causal: for K_j, the Q tiles whose last row is above key j0 are skipped.
 * Memory: workspace O (fp32, 2x the output) + l, m: O(N), no N x N buffer.
 * Time: scalar fp32 FMAs on the CUDA cores (tensor cores are stage 5's lesson), each thread a
 * 4 x 4 micro-tile of S_ij; one block per SM, B x H blocks.
 *
 * Run: make build/03_tiled && build/03_tiled --seqlen 4096 --dim 128 --causal --check
 */
#include <stdio.h>
#include "attn_device.cuh"

#ifndef BR
#define BR 64
#endif
#ifndef BC
#define BC 64
#endif
#define Br        BR               /* query rows per inner step: a Q_i tile (make ... BR=32) */
#define Bc        BC               /* keys per outer step: a K_j, V_j tile (make ... BC=128) */
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
#if Br % TY != 0 || Bc % (TX * VEC) != 0 || Br < TY || Br > 8 * TY || Bc > 8 * TX * VEC
#error "BR must be a multiple of 16 up to 128, BC a multiple of 64 up to 512"
#endif

/* Dynamic shared memory, fp32: K_j [Bc][d + PAD] and V_j [Bc][d], which stay for the whole
 * inner loop, Q_i [Br][d + PAD] and P_ij [Br][Bc + PAD]. */
static size_t smem_bytes(int d)
{
    return ((size_t)Bc * (d + PAD) + (size_t)Bc * d + (size_t)Br * (d + PAD) +
            (size_t)Br * (Bc + PAD)) * sizeof(float);
}

/* The forward's workspace (Algorithm 1 line 2: O, l, m in HBM): O fp32 [B, N_q, H, d] (the
 * layout of the output), then l and m, fp32 [B, H, N_q] each. */
static __host__ __device__ size_t O_acc_bytes(const attn_problem *p)
{
    return (size_t)p->B * p->N_q * p->H * p->d * sizeof(float);
}

static __host__ __device__ size_t stats_bytes(const attn_problem *p)
{
    return (size_t)p->B * p->H * p->N_q * sizeof(float);
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

/* One block: every query of head h, batch b (Algorithm 1 for one head). Thread (ty, tx) owns,
 * in every step, query rows ty*ROWS + r of Q_i, keys tx + TX*c of S_ij, and columns
 * g*TX*VEC + tx*VEC + v of O_i, which it reads from and writes to HBM itself.
 * d is a literal at each call site, so the loops over the head dim unroll. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const int d)
{
    extern __shared__ __align__(16) float smem[];
    const int ld = d + PAD, ldp = Bc + PAD;
    float *K_j = smem;               /* [Bc][ld] */
    float *V_j = K_j + Bc * ld;      /* [Bc][d]  */
    float *Q_i = V_j + Bc * d;       /* [Br][ld] */
    float *P_ij = Q_i + Br * ld;     /* [Br][ldp] */

    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int h = blockIdx.y, b = blockIdx.z;
    const int h_kv = h / (p.H / p.H_kv);
    const int col_groups = d / (TX * VEC);   /* float4 column groups of O_i per thread */
    float *O_acc = (float *)a.ws;                                              /* O, fp32 */
    float *l_hbm = (float *)((char *)a.ws + O_acc_bytes(&p)) + ((size_t)b * p.H + h) * p.N_q;
    float *m_hbm = l_hbm + (size_t)p.B * p.H * p.N_q;
    float *L = a.lse + ((size_t)b * p.H + h) * p.N_q;

    const int Tr = (p.N_q + Br - 1) / Br, Tc = (p.N_k + Bc - 1) / Bc;

    for (int j = 0; j < Tc; j++) {                 /* line 5: K/V outer */
        const int j0 = j * Bc;
        /* Causal: Q tile t ends at row t*Br + Br - 1, which sees key j0 iff it is >= j0; the
         * tiles before j0 / Br see none of these keys and are skipped (and once no tile is
         * left, no later K_j has any either). */
        const int i_first = p.causal ? j0 / Br : 0;
        if (i_first >= Tr) break;
        __syncthreads();   /* everyone is done with the previous K_j, V_j */
        load_tile(K_j, ld, a.k, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);   /* line 6 */
        load_tile(V_j, d, a.v, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);

        for (int i = i_first; i < Tr; i++) {       /* line 7: Q inner */
            const int i0 = i * Br;
            const int rows = min(Br, p.N_q - i0);  /* the last tile may hold fewer */
            /* The last key tile this Q_i sees: there O and L are written in their final form.
             * (With Bc a multiple of Br no Q_i is visited past it; with other BR, BC the
             * last, partial Q tile can be, and has nothing to add.) */
            const int last_j = (visible_keys(p, i0 + rows - 1) - 1) / Bc;
            if (j > last_j) continue;
            __syncthreads();   /* K_j, V_j are in; everyone is done with the previous Q_i, P_ij */
            load_tile(Q_i, ld, a.q, p.dtype, b, i0, Br, p.N_q, h, p.H, d);   /* line 8 */

            /* Line 8, continued: O_i, l_i, m_i from HBM, each thread its own elements. The
             * first key tile starts from line 2's O = 0, l = 0, m = -inf instead of reading
             * them (the same values, without a pass over HBM to write them). */
            float m[ROWS], l[ROWS], o[ROWS][COLS_MAX];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int row = ty * ROWS + r;
                const int inside = row < rows && j > 0;
                const size_t e = attn_row(b, i0 + (inside ? row : 0), h, p.N_q, p.H, d);
                m[r] = inside ? m_hbm[i0 + row] : -INFINITY;
                l[r] = inside ? l_hbm[i0 + row] : 0.0f;
#pragma unroll
                for (int g = 0; g < col_groups; g++) {
                    const float4 x = inside ? *(const float4 *)&O_acc[e + g * TX * VEC + tx * VEC]
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    o[r][g * VEC + 0] = x.x; o[r][g * VEC + 1] = x.y;
                    o[r][g * VEC + 2] = x.z; o[r][g * VEC + 3] = x.w;
                }
            }
            __syncthreads();

            /* Line 9: S_ij = Q_i K_j^T, four head-dim steps per float4 load. */
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

            /* Lines 10-11: the tile's max m~ and sum l~ of P~ = exp(S_ij - m~), then the new
             * running max and sum. Masked scores are -inf and add exp(-inf) = 0. */
            float m_new[ROWS], l_new[ROWS], beta[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int i_row = i0 + ty * ROWS + r;
                float m_tile = -INFINITY;
#pragma unroll
                for (int c = 0; c < KEYS; c++) {
                    const int key = j0 + tx + TX * c;
                    const int visible = key < visible_keys(p, i_row);
                    /* the product rounded on its own, not fused with the subtraction below,
                     * so that 04_backward recomputes S_ij with the same bits */
                    s[r][c] = visible ? __fmul_rn(p.scale, s[r][c]) : -INFINITY;
                    m_tile = fmaxf(m_tile, s[r][c]);
                }
                m_tile = row_max(m_tile);                                /* m~_ij */
                /* A row that sees no key of this tile has m~ = -inf: subtract 0 instead, so
                 * that exp gives 0 rather than exp(-inf - -inf) = NaN. */
                const float m_use = m_tile == -INFINITY ? 0.0f : m_tile;
                float l_tile = 0.0f;
#pragma unroll
                for (int c = 0; c < KEYS; c++) {
                    s[r][c] = expf(s[r][c] - m_use);                     /* P~_ij */
                    l_tile += s[r][c];
                }
                l_tile = row_sum(l_tile);                                /* l~_ij */
                m_new[r] = fmaxf(m[r], m_tile);   /* finite: every row sees key 0 at j = 0 */
                const float alpha = expf(m[r] - m_new[r]);   /* 0 at j = 0 (m = -inf) */
                beta[r] = expf(m_tile - m_new[r]);           /* 0 if the row saw no key here */
                l_new[r] = alpha * l[r] + beta[r] * l_tile;
                /* O_i's old part of line 12, diag(l_i) e^(m_i - m_new) O_i, divided below */
#pragma unroll
                for (int c = 0; c < COLS_MAX; c++) o[r][c] *= alpha * l[r];
            }

#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < KEYS; c++) P_ij[(ty * ROWS + r) * ldp + tx + TX * c] = s[r][c];
            __syncthreads();

            /* Line 12: O_i += e^(m~ - m_new) P~_ij V_j, four keys per float4 load of P~_ij;
             * then O_i /= l_new, so that O_i in HBM is always normalised. */
            float pv[ROWS][COLS_MAX];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < COLS_MAX; c++) pv[r][c] = 0.0f;
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
                            pv[r][g * VEC + 0] = fmaf(pr[r][u], v.x, pv[r][g * VEC + 0]);
                            pv[r][g * VEC + 1] = fmaf(pr[r][u], v.y, pv[r][g * VEC + 1]);
                            pv[r][g * VEC + 2] = fmaf(pr[r][u], v.z, pv[r][g * VEC + 2]);
                            pv[r][g * VEC + 3] = fmaf(pr[r][u], v.w, pv[r][g * VEC + 3]);
                        }
                    }
            }

            /* Lines 12-13: write O_i, l_i, m_i back; at this Q_i's last key tile, O in the
             * dtype and L_i = m_i + log(l_i) instead (l_i >= 1: the max term is exp(0)).
             * Rows past N_q are not stored. */
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int row = ty * ROWS + r;
                if (row >= rows) continue;
                const float inv_l = 1.0f / l_new[r];
                const size_t e = attn_row(b, i0 + row, h, p.N_q, p.H, d);
#pragma unroll
                for (int g = 0; g < col_groups; g++) {
                    float x[VEC];
#pragma unroll
                    for (int v = 0; v < VEC; v++)
                        x[v] = (o[r][g * VEC + v] + beta[r] * pv[r][g * VEC + v]) * inv_l;
                    const size_t at = e + g * TX * VEC + tx * VEC;
                    if (j == last_j) {
#pragma unroll
                        for (int v = 0; v < VEC; v++) attn_store(a.o, at + v, x[v], p.dtype);
                    } else {
                        *(float4 *)&O_acc[at] = make_float4(x[0], x[1], x[2], x[3]);
                    }
                }
                if (tx == 0) {
                    if (j == last_j) {
                        L[i0 + row] = m_new[r] + logf(l_new[r]);
                    } else {
                        l_hbm[i0 + row] = l_new[r];
                        m_hbm[i0 + row] = m_new[r];
                    }
                }
            }
        }
    }
}

/* One block per SM at d = 128 (the shared memory of two does not fit), so launch bounds for
 * one: up to 255 registers a thread. */
static __global__ void __launch_bounds__(THREADS, 1) attention_kernel(attn_problem p, attn_args a)
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

/* O (fp32), l and m: Algorithm 1 keeps them in HBM between the steps. O(N), nothing N x N:
 * S_ij and P_ij never leave the chip. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)dir;
    return O_acc_bytes(p) + 2 * stats_bytes(p);
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    const dim3 grid(1, p->H, p->B);   /* one block per (head, batch): FA-1's grid */
    attention_kernel<<<grid, THREADS, smem, s>>>(*p, *a);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_03_tiled = {
    "03_tiled",
    "FlashAttention-1 forward (Algorithm 1): K/V outer, O, l, m through HBM, one block per head; scalar fp32",
    "head dim 64 or 128; bf16, fp16; any N; causal; GQA; forward only",
    80,
    check,
    workspace,
    forward,
    NULL,
};
