/* stages/04_backward/attention.cu: FlashAttention-1's backward, Algorithm 4 as the paper
 * writes it: recomputation from the logsumexp.
 *
 * Changed from 03_tiled: a backward pass; the forward is 03_tiled's, unchanged. Three launches:
 *   1. rowdot_kernel      D = rowsum(dO ∘ O), fp32 [B, H, N_q] in the workspace (line 19,
 *                         hoisted: it depends on the query row alone)
 *   2. backward_kernel    one launch per K_j, V_j (line 6's outer loop, run by the host), one
 *                         block per (kv head, batch), dK_j, dV_j in registers; inner loop over
 *                         every query head of the GQA group and every Q_i that can see K_j
 *                         (line 9): recompute
 *                         S_ij = scale Q_i K_jᵀ and P_ij = exp(S_ij - L_i) from the saved
 *                         logsumexp (no max, no sum: L_i = m_i + log l_i holds both), then
 *                         dV_j += P_ijᵀ dO_i, dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij - D_i),
 *                         dK_j += scale dS_ijᵀ Q_i, and dQ_i += scale dS_ij K_j read from,
 *                         added to and written back to HBM (line 21); dK_j, dV_j written once
 *   3. convert_dq_kernel  dq = the fp32 dQ rounded to the dtype
 *
 * Why: 01_naive's backward stores S, P and dP, O(N²) bytes. The forward kept L, one float
 * per query row, and that is enough to rebuild every P_ij = exp(S_ij - L_i) tile by tile on
 * chip; the price is computing S_ij a second time. dQ_i makes a round trip to HBM per
 * (K_j, Q_i) pair, as O_i did in the forward. Only the block of a head touches its dQ, so
 * there are no atomics and the sum is taken in one fixed order: --deterministic changes
 * nothing here. Causal: query tiles whose last row is above K_j's first key are skipped.
 * Memory: workspace D (4·B·H·N_q bytes, rounded up to 256) + dQ (4·B·N_q·H·d bytes): O(N).
 * Time: five Br x Bc x d products per pair of tiles against the forward's two (the harness
 * counts 2.5x the forward's FLOPs), scalar fp32 as in 03_tiled; B x H_kv blocks, one per SM.
 *
 * Run: make build/04_backward && build/04_backward --backward --seqlen 4096 --dim 128 --causal --check
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

/* ---- Backward ------------------------------------------------------------------------------ */

#define KROWS     (Bc / TY)        /* key rows of dK_j and dV_j per thread (4) */
#if KROWS != VEC
#error "the backward reads KROWS = 4 key rows per float4: BC must be 64"
#endif

/* Backward dynamic shared memory, fp32: K_j, V_j, Q_i, dO_i [rows][d + PAD] (V_j is padded
 * too: dP_ij reads it by key rows, as S_ij reads K_j), P_ij then dS_ij [Br][Bc + PAD], and
 * L_i, D_i [Br]. */
static size_t backward_smem_bytes(int d)
{
    return ((size_t)(2 * Bc + 2 * Br) * (d + PAD) + (size_t)Br * (Bc + PAD) + 2 * Br) * sizeof(float);
}

/* Backward workspace: D, fp32 [B, H, N_q] (rounded up to 256 bytes, so that what follows
 * stays aligned), then dQ, fp32 [B, N_q, H, d]: Algorithm 4 keeps dQ in HBM (line 5) and
 * each step reads, adds to and writes back its dQ_i (line 21). */
static size_t D_bytes(const attn_problem *p)
{
    const size_t bytes = (size_t)p->B * p->H * p->N_q * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

static size_t dq_acc_bytes(const attn_problem *p)
{
    return (size_t)p->B * p->N_q * p->H * p->d * sizeof(float);
}

/* D_i = rowsum(dO_i ∘ O_i) (Algorithm 4 line 19), one thread per row (b, h, i), stored like L:
 * [B, H, N_q]. Line 19 sits inside the loop over K_j, but D_i depends on i alone, so it is
 * computed once, before the loop (as FA-1's CUDA code did), not Tc times. The sum
 * is the same chain of fp32 FMAs over c = 0 .. d-1 as dP_ij = dO_i · V_j in tile_abt, so where
 * O_i equals one V_j (a one-hot softmax row, as with very large logits) dP_ij - D_i is exactly
 * 0, not the difference of two roundings. */
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
        acc = fmaf(attn_load(d_o, r + c, p.dtype), attn_load(o, r + c, p.dtype), acc);
    D[row] = acc;
}

/* acc[r][c] += A[ty*ROWS + r] · B[tx + TX*c] over the head dim: an S_ij-shaped tile
 * (rows of A against rows of B, both [rows][ld] in shared memory), as in the forward. */
static __device__ __forceinline__ void tile_abt(float acc[ROWS][KEYS], const float *A, const float *B,
                                                int ld, int d, int tx, int ty)
{
#pragma unroll 4
    for (int k = 0; k < d; k += VEC) {
        float4 x[ROWS], y[KEYS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) x[r] = *(const float4 *)&A[(ty * ROWS + r) * ld + k];
#pragma unroll
        for (int c = 0; c < KEYS; c++) y[c] = *(const float4 *)&B[(tx + TX * c) * ld + k];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < KEYS; c++) acc[r][c] = dot4(x[r], y[c], acc[r][c]);
    }
}

/* acc[r][.] += sum over query rows n of X[n][ty*KROWS + r] * Y[n][columns of this thread]:
 * dV_j += P_ijᵀ dO_i and dK_j += dS_ijᵀ Q_i (X is [Br][ldx], Y is [Br][ld]). */
static __device__ __forceinline__ void tile_atb(float acc[KROWS][COLS_MAX], const float *X, int ldx,
                                                const float *Y, int ld, int d, int tx, int ty)
{
    const int col_groups = d / (TX * VEC);
#pragma unroll 4
    for (int n = 0; n < Br; n++) {
        const float4 x4 = *(const float4 *)&X[n * ldx + ty * KROWS];
        const float x[KROWS] = {x4.x, x4.y, x4.z, x4.w};   /* KROWS = VEC = 4 */
#pragma unroll
        for (int g = 0; g < col_groups; g++) {
            const float4 y = *(const float4 *)&Y[n * ld + g * TX * VEC + tx * VEC];
#pragma unroll
            for (int r = 0; r < KROWS; r++) {
                acc[r][g * VEC + 0] = fmaf(x[r], y.x, acc[r][g * VEC + 0]);
                acc[r][g * VEC + 1] = fmaf(x[r], y.y, acc[r][g * VEC + 1]);
                acc[r][g * VEC + 2] = fmaf(x[r], y.z, acc[r][g * VEC + 2]);
                acc[r][g * VEC + 3] = fmaf(x[r], y.w, acc[r][g * VEC + 3]);
            }
        }
    }
}

/* One block: key tile j (keys j0 .. j0+Bc-1) of kv head h_kv, batch b: the body of
 * Algorithm 4's outer loop (lines 7-24), whose loop over j (line 6) is the host's: one launch
 * per K_j (backward()), so between two K_j everything lives in HBM, as the algorithm has it.
 * The block loads K_j, V_j, keeps dK_j, dV_j in registers (line 8) while it visits every query
 * head of the GQA group and every query tile Q_i that can see these keys (line 9), and writes
 * them once (line 24), already summed over the group. dQ_i lives in HBM, fp32: each step reads
 * it, adds this K_j's part and writes it back (line 21). Only this block touches the dQ of
 * these query heads, and launches run in stream order, so no atomics are needed and the sum
 * is taken in a fixed order.
 * Thread (ty, tx) owns S_ij, dP_ij entries (query ty*ROWS + r, key tx + TX*c), dK_j, dV_j rows
 * ty*KROWS + r, and dQ_i rows ty*ROWS + r, with columns g*TX*VEC + tx*VEC + v. */
static __device__ __forceinline__ void tiled_backward(const attn_problem p, const attn_args a,
                                                      const float *D, float *dq_acc, int j,
                                                      const int d)
{
    extern __shared__ __align__(16) float smem[];
    const int ld = d + PAD, ldp = Bc + PAD;
    float *K_j = smem;               /* [Bc][ld] */
    float *V_j = K_j + Bc * ld;      /* [Bc][ld] */
    float *Q_i = V_j + Bc * ld;      /* [Br][ld] */
    float *dO_i = Q_i + Br * ld;     /* [Br][ld] */
    float *P_ij = dO_i + Br * ld;    /* [Br][ldp] */
    float *L_i = P_ij + Br * ldp;    /* [Br] */
    float *D_i = L_i + Br;           /* [Br] */
    float *dS_ij = P_ij;             /* P_ij is dead once dV_j has used it */

    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int h_kv = blockIdx.y, b = blockIdx.z, j0 = j * Bc;   /* gridDim.x = 1 */
    const int group = p.H / p.H_kv;
    const int col_groups = d / (TX * VEC);
    const int Tr = (p.N_q + Br - 1) / Br;

    load_tile(K_j, ld, a.k, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);   /* line 7 */
    load_tile(V_j, ld, a.v, p.dtype, b, j0, Bc, p.N_k, h_kv, p.H_kv, d);

    float dK[KROWS][COLS_MAX], dV[KROWS][COLS_MAX];                  /* line 8 */
#pragma unroll
    for (int r = 0; r < KROWS; r++)
#pragma unroll
        for (int c = 0; c < COLS_MAX; c++) dK[r][c] = dV[r][c] = 0.0f;

    /* Causal: query tile t reaches row t*Br + Br - 1, which sees key j0 iff that is >= j0;
     * the tiles before j0 / Br see none of these keys and are skipped. */
    const int t_first = p.causal ? j0 / Br : 0;

    for (int h = h_kv * group; h < (h_kv + 1) * group; h++) {
        const float *L = a.lse + ((size_t)b * p.H + h) * p.N_q;
        const float *Dh = D + ((size_t)b * p.H + h) * p.N_q;
        for (int t = t_first; t < Tr; t++) {                         /* line 9 */
            const int i0 = t * Br;
            __syncthreads();   /* K_j, V_j are in; everyone is done with the previous Q_i,
                                  dO_i, dS_ij */
            load_tile(Q_i, ld, a.q, p.dtype, b, i0, Br, p.N_q, h, p.H, d);   /* line 10 */
            load_tile(dO_i, ld, a.d_o, p.dtype, b, i0, Br, p.N_q, h, p.H, d);
            for (int r = threadIdx.x; r < Br; r += THREADS) {
                L_i[r] = i0 + r < p.N_q ? L[i0 + r] : 0.0f;
                D_i[r] = i0 + r < p.N_q ? Dh[i0 + r] : 0.0f;
            }
            __syncthreads();

            /* Lines 11-13: recompute S_ij = scale Q_i K_jᵀ and P_ij = exp(S_ij - L_i) from
             * the saved logsumexp (L_i = m_i + log l_i, so this is line 13's
             * diag(l_i)^-1 exp(S_ij - m_i)); S_ij is the forward's, bit for bit (same FMA
             * chain, product rounded as there). Line 17: dP_ij = dO_i V_jᵀ; line 20:
             * dS_ij = P_ij ∘ (dP_ij - D_i). */
            float P[ROWS][KEYS], dS[ROWS][KEYS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < KEYS; c++) P[r][c] = dS[r][c] = 0.0f;
            tile_abt(P, Q_i, K_j, ld, d, tx, ty);
            tile_abt(dS, dO_i, V_j, ld, d, tx, ty);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int row = ty * ROWS + r, i = i0 + row;
#pragma unroll
                for (int c = 0; c < KEYS; c++) {
                    const int key = j0 + tx + TX * c;
                    const int visible = i < p.N_q && key < visible_keys(p, i);
                    P[r][c] = visible ? expf(__fmul_rn(p.scale, P[r][c]) - L_i[row]) : 0.0f;
                    dS[r][c] = P[r][c] * (dS[r][c] - D_i[row]);
                }
            }

            /* Line 16: dV_j += P_ijᵀ dO_i */
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < KEYS; c++) P_ij[(ty * ROWS + r) * ldp + tx + TX * c] = P[r][c];
            __syncthreads();
            tile_atb(dV, P_ij, ldp, dO_i, ld, d, tx, ty);
            __syncthreads();   /* everyone is done with P_ij */

            /* Line 22: dK_j += dS_ijᵀ Q_i (scale applied once, at the end) */
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < KEYS; c++) dS_ij[(ty * ROWS + r) * ldp + tx + TX * c] = dS[r][c];
            __syncthreads();
            tile_atb(dK, dS_ij, ldp, Q_i, ld, d, tx, ty);

            /* Line 21: dQ_i += scale dS_ij K_j, read from HBM, added to, written back, each
             * thread its own elements. The first K_j starts from line 5's dQ = 0 instead of
             * reading it (every query tile sees key 0, so every dQ_i is written there). */
            float dq[ROWS][COLS_MAX];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int c = 0; c < COLS_MAX; c++) dq[r][c] = 0.0f;
#pragma unroll 2
            for (int k = 0; k < Bc; k += VEC) {
                float ds[ROWS][VEC];
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const float4 x = *(const float4 *)&dS_ij[(ty * ROWS + r) * ldp + k];
                    ds[r][0] = x.x; ds[r][1] = x.y; ds[r][2] = x.z; ds[r][3] = x.w;
                }
#pragma unroll
                for (int u = 0; u < VEC; u++)
#pragma unroll
                    for (int g = 0; g < col_groups; g++) {
                        const float4 y = *(const float4 *)&K_j[(k + u) * ld + g * TX * VEC + tx * VEC];
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            dq[r][g * VEC + 0] = fmaf(ds[r][u], y.x, dq[r][g * VEC + 0]);
                            dq[r][g * VEC + 1] = fmaf(ds[r][u], y.y, dq[r][g * VEC + 1]);
                            dq[r][g * VEC + 2] = fmaf(ds[r][u], y.z, dq[r][g * VEC + 2]);
                            dq[r][g * VEC + 3] = fmaf(ds[r][u], y.w, dq[r][g * VEC + 3]);
                        }
                    }
            }
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int i = i0 + ty * ROWS + r;
                if (i >= p.N_q) continue;
#pragma unroll
                for (int g = 0; g < col_groups; g++) {
                    float4 *at = (float4 *)&dq_acc[attn_row(b, i, h, p.N_q, p.H, d) +
                                                   g * TX * VEC + tx * VEC];
                    float4 x = j > 0 ? *at : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    x.x = fmaf(p.scale, dq[r][g * VEC + 0], x.x);
                    x.y = fmaf(p.scale, dq[r][g * VEC + 1], x.y);
                    x.z = fmaf(p.scale, dq[r][g * VEC + 2], x.z);
                    x.w = fmaf(p.scale, dq[r][g * VEC + 3], x.w);
                    *at = x;
                }
            }
        }
    }

    /* Line 24: dK_j = scale sum dS_ijᵀ Q_i, dV_j = sum P_ijᵀ dO_i, written once; keys
     * past N_k are not stored. Keys no query sees (causal, key >= N_q) get zeros. */
#pragma unroll
    for (int r = 0; r < KROWS; r++) {
        const int key = j0 + ty * KROWS + r;
        if (key >= p.N_k) continue;
        const size_t row = attn_row(b, key, h_kv, p.N_k, p.H_kv, d);
#pragma unroll
        for (int g = 0; g < col_groups; g++)
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                const size_t e = row + g * TX * VEC + tx * VEC + v;
                attn_store(a.dk, e, p.scale * dK[r][g * VEC + v], p.dtype);
                attn_store(a.dv, e, dV[r][g * VEC + v], p.dtype);
            }
    }
}

/* One block per (kv head, batch): launch bounds for 1 block per SM, which the shared memory
 * allows anyway at d = 128, so the dK_j, dV_j accumulators get the registers they need. */
static __global__ void __launch_bounds__(THREADS, 1)
backward_kernel(attn_problem p, attn_args a, const float *D, float *dq_acc, int j)
{
    if (p.d == 64) tiled_backward(p, a, D, dq_acc, j, 64);
    else           tiled_backward(p, a, D, dq_acc, j, 128);
}

/* dq = the fp32 dQ in the workspace rounded to the dtype, one thread per element (same layout). */
static __global__ void convert_dq_kernel(attn_problem p, const float *dq_acc, void *dq)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.B * p.N_q * p.H * p.d) return;
    attn_store(dq, idx, dq_acc[idx], p.dtype);
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    if (p->d != 64 && p->d != 128) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 04_backward supports 64 and 128", p->d);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "04_backward cannot query the device");
        return 1;
    }
    const size_t smem = dir == ATTN_BACKWARD ? backward_smem_bytes(p->d) : smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 04_backward", p->d, (smem + 1023) / 1024,
                 smem_max / 1024);
        return 1;
    }
    return 0;
}

/* Forward: O (fp32), l and m, which Algorithm 1 keeps in HBM between the steps. Backward: D
 * and dQ (fp32), which Algorithm 4 keeps in HBM. All O(N); nothing N x N, since S_ij and P_ij
 * are recomputed on chip from L. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    return dir == ATTN_BACKWARD ? D_bytes(p) + dq_acc_bytes(p) : O_acc_bytes(p) + 2 * stats_bytes(p);
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

/* D, then the tiled backward (dK, dV written; dQ summed in fp32 in the workspace), then dQ to
 * the dtype. */
static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *D = (float *)a->ws;
    float *dq_acc = (float *)((char *)a->ws + D_bytes(p));
    const size_t n_rows = (size_t)p->B * p->H * p->N_q;
    const size_t n_q = (size_t)p->B * p->N_q * p->H * p->d;

    rowdot_kernel<<<attn_blocks_for(n_rows, THREADS), THREADS, 0, s>>>(*p, a->d_o, a->o, D);
    ATTN_LAUNCH_CHECK();

    const size_t smem = backward_smem_bytes(p->d);
    ATTN_TRY(cudaFuncSetAttribute(backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    /* Line 6, the loop over K_j, V_j, on the host: one launch per K_j, each with one block per
     * (kv head, batch), FA-1's grid. */
    const dim3 grid(1, p->H_kv, p->B);
    for (int j = 0; j < attn_ceil_div(p->N_k, Bc); j++) {
        backward_kernel<<<grid, THREADS, smem, s>>>(*p, *a, D, dq_acc, j);
        ATTN_LAUNCH_CHECK();
    }

    convert_dq_kernel<<<attn_blocks_for(n_q, THREADS), THREADS, 0, s>>>(*p, dq_acc, a->dq);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_04_backward = {
    "04_backward",
    "FlashAttention-1 backward (Algorithm 4): recomputation from the logsumexp, K/V outer, dQ through HBM; scalar fp32",
    "head dim 64 or 128; bf16, fp16; any N; causal; GQA; dQ summed in a fixed order (deterministic)",
    80,
    check,
    workspace,
    forward,
    backward,
};
