/* stages/05_tensor_cores/attention.cu: FlashAttention-1 on the tensor cores (mma.sync, sm_80 and
 * up), as FA-1's CUDA code ran it.
 *
 * Changed from 04_backward: the same algorithm, loop order and parallelism (Algorithm 1 and 4:
 * K/V outer, O_i, l_i, m_i and dQ_i through HBM, one block per head), now on the tensor cores:
 * - Every product is mma.sync.m16n8k16, bf16/fp16 operands, fp32 accumulators
 *   (common/mma.cuh). Tiles stay 16-bit in shared memory, read with ldmatrix (.trans where the
 *   operand is stored the other way round); the 16-byte chunks of each row are XOR-swizzled
 *   with the row (chunk ^ row % 8), so the 8 rows one ldmatrix phase reads fall in 8 bank
 *   groups: no conflicts, no padding. Fragment addresses move along a row by XOR.
 * - Copies global -> shared are 16-byte cp.async, zero-filled past N; the next step's Q_i,
 *   O_i, l_i and m_i load while this step computes.
 * - Forward: FA-1's split of K/V across warps. Bc = 16384 / d keys per K_j, V_j (128 at
 *   d = 128, 256 at d = 64: 32 KiB tiles); each of the 4 warps takes a quarter and keeps its
 *   K and V fragments in registers for the whole inner loop; Q_i is Br = 16 rows. Each warp
 *   computes its slice of S_ij, its own max, sum and P_w V_w; the slices meet in shared memory,
 *   where the online-softmax rule combines them (across warps, then with O_i from HBM).
 *   Scores stay in the log2 domain: P = exp2(S scale log2e - m), one FFMA and one ex2.
 * - Backward: 8 warps per K_j, V_j (Bc = 128), one launch per K_j (the host runs line 6's
 *   loop); per step S_ij, dP_ij, then P_ij, dS_ij through shared memory for
 *   dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i and dQ_i += dS_ij K_j, whose read-modify-write in
 *   HBM is one red.global.add per element (one block per head adds to it: in a fixed order).
 *   D = rowsum(dO ∘ O) in a kernel of its own, once.
 * Why: stage 4 ran on the fp32 CUDA cores; the matrix products belong on the tensor cores.
 * What stays FA-1's: the grid (B x H blocks forward, B x H_kv backward: the sequence is not
 * split, so few heads leave SMs idle), O_i and dQ_i's round trip to HBM per step, the split of
 * keys across warps with its shared-memory exchange. FA-2 (stage 6) changes those.
 * Memory: forward O (fp32) + l, m; backward D + dQ (fp32): O(N).
 * Shared memory per block: forward 88 KiB (d = 128) / 76 KiB (64), two blocks per SM;
 * backward 161 KiB / 162 KiB (97 KiB where a block gets less: 64 query rows per step).
 *
 * Run: make build/05_tensor_cores && build/05_tensor_cores --seqlen 4096 --dim 128 --check --backward
 */
#include <limits.h>
#include <stdio.h>
#include "attn_device.cuh"
#include "mma.cuh"
#include "mma_tiles.cuh"

#define QUAD    4     /* lanes that share a row of an mma accumulator */
#define Br      16    /* query rows per inner step: a Q_i tile, one mma tile tall */
#define THREADS 128   /* 4 warps, which split the keys of K_j, V_j */
#define WARPS   (THREADS / WARP)
#define KV_TILE_BYTES 32768   /* a K_j or V_j tile: Bc = 16384 / d keys of 16-bit elements */
#define KW_MAX  64    /* keys per warp at most (Bc / WARPS at d = 64) */
#define MMA_M   16    /* an m16n8k16 tile: rows of A and C */
#define MMA_N   8     /* columns of B and C */
#define MMA_K   16    /* the reduction step */
#define D_MAX   128   /* largest head dim supported */

/* Keys per K_j, V_j tile (FA-1's Bc): 128 at d = 128, 256 at d = 64 (FA-1's code took the
 * same two). */
static __host__ __device__ __forceinline__ int kv_keys(int d)
{
    return KV_TILE_BYTES / (2 * d);
}

/* Dynamic shared memory of the forward, byte offsets: K_j, V_j [Bc][d], 16-bit, at 0 and V,
 * which once in registers leave their bytes to the exchange of the warps' slices (WARPS
 * partial O_w [Br][d] fp32 from 0, then their m_w, l_w [WARPS][Br] at xm); two Q_i buffers
 * [Br][d] 16-bit at Q; two buffers of the state read from HBM at O, each O_i [Br][d], then
 * l_i and m_i [Br], fp32 (state bytes each). */
typedef struct { int V, Q, O, state, xm, bytes; } fwd_smem;

static __host__ __device__ __forceinline__ fwd_smem forward_layout(int d)
{
    fwd_smem m;
    m.V = KV_TILE_BYTES;
    m.Q = 2 * KV_TILE_BYTES;
    m.O = m.Q + 2 * Br * 2 * d;
    m.state = (Br * d + 2 * Br) * (int)sizeof(float);
    m.xm = WARPS * Br * d * (int)sizeof(float);
    m.bytes = m.O + 2 * m.state;
    return m;
}

/* The exchange (WARPS partial O_w and their m_w, l_w) must fit in K_j's and V_j's bytes. */
static_assert(WARPS * Br * D_MAX * sizeof(float) + 2 * WARPS * Br * sizeof(float) <= 2 * KV_TILE_BYTES,
              "the warps' exchange does not fit in K_j, V_j");

static size_t smem_bytes(int d)
{
    return (size_t)forward_layout(d).bytes;
}

/* The forward's workspace (Algorithm 1 line 2: O, l, m in HBM), fp32, per (b, h) and rows
 * padded to Br: O [B, H, Tr Br, d], then l and m [B, H, Tr Br] (stats_bytes each). */
static __host__ __device__ __forceinline__ size_t O_acc_bytes(const attn_problem *p)
{
    return (size_t)p->B * p->H * ((p->N_q + Br - 1) / Br) * Br * p->d * sizeof(float);
}

static size_t stats_bytes(const attn_problem *p)
{
    return (size_t)p->B * p->H * attn_ceil_div(p->N_q, Br) * Br * sizeof(float);
}

/* Keys that query i sees: all N_k, or keys 0 .. i when causal (key 0 always, also when
 * N_q > N_k). */
static __device__ __forceinline__ int visible_keys(const attn_problem p, int i)
{
    return p.causal ? min(i + 1, p.N_k) : p.N_k;
}

/* Max and sum over the QUAD lanes that share a row of an accumulator tile. */
static __device__ __forceinline__ float row_max(float x)
{
    for (int o = 1; o < QUAD; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

static __device__ __forceinline__ float row_sum(float x)
{
    for (int o = 1; o < QUAD; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Scores a query must not see become -inf: keys past N_k, and (causal) keys after the query.
 * s holds n_tiles accumulator tiles along the keys; this thread's entries are rows row and
 * row + 8, keys key + MMA_N * n + {0, 1}. */
static __device__ __forceinline__ void mask_scores(float s[][4], int n_tiles, int row, int key,
                                                   int N_k, int causal)
{
#pragma unroll
    for (int n = 0; n < n_tiles; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int k = key + MMA_N * n + c % 2, r = row + 8 * (c / 2);
            if (k >= N_k || (causal && k > r)) s[n][c] = -INFINITY;
        }
}

/* Start copying Algorithm 1's state of query tile `tile` (its first row) from HBM into a state
 * buffer at shared address at: O_i [Br][d], then l_i and m_i [Br], fp32, 16 bytes a copy. */
static __device__ __forceinline__ void load_state(uint32_t at, const float *O_hbm, const float *l_hbm,
                                                  const float *m_hbm, size_t tile, int d)
{
    for (int c = threadIdx.x; c < Br * d / 4; c += THREADS)
        cp_async_16(at + 16 * c, O_hbm + tile * d + 4 * c, 1);
    const int t = threadIdx.x % (Br / 4);   /* 4 threads copy l_i, 4 m_i */
    if (threadIdx.x < Br / 4)
        cp_async_16(at + Br * d * 4 + 16 * t, l_hbm + tile + 4 * t, 1);
    else if (threadIdx.x < 2 * Br / 4)
        cp_async_16(at + (Br * d + Br) * 4 + 16 * t, m_hbm + tile + 4 * t, 1);
}

/* Byte offset of column col of row r of warp w's partial O_w in the exchange: rows of d fp32,
 * whose 16-byte chunks are XORed with 2 (r % 4), so that the 16 lanes that store float2 pairs
 * of rows r .. r+3 at one mma column tile, and the 8 threads that read a row's chunks in the
 * combine, all fall in different banks. */
static __device__ __forceinline__ int xchg(int w, int r, int col, int d)
{
    return (w * Br + r) * d * (int)sizeof(float) + (((col / 4) ^ ((r & 3) << 1)) << 4) + col % 4 * 4;
}

/* One block: every query of head h, batch b (Algorithm 1 for one head, on the tensor cores).
 * Outer loop over K_j, V_j (Bc keys); the 4 warps split them, warp w owning keys
 * KW w .. KW w + KW-1 (KW = Bc / 4), whose K and V fragments it loads into registers once per
 * K_j and keeps for the whole inner loop. Inner loop over Q_i (Br = 16 rows, one mma tile):
 * every warp multiplies all 16 rows by its keys, so each warp holds a slice of S_ij, its own
 * max m_w, sum l_w and partial O_w = P_w V_w (Br x d); the four slices meet in shared memory,
 * where the combine applies the online-softmax rule across warps (the tile's m~, l~ and
 * P~ V_j) and then across steps (line 12 against O_i, l_i, m_i read from HBM), and writes
 * O_i, l_i, m_i back. In an accumulator tile lane l holds rows l/4 and l/4 + 8, columns
 * 2*(l%4) + {0, 1}. d and fp16 are literals at each call site: register arrays sized, loops
 * unrolled, one mma instruction per dtype. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const int d, const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const fwd_smem m = forward_layout(d);
    const int row_bytes = 2 * d, Bc = kv_keys(d), KW = Bc / WARPS;
    const uint32_t K_j = smem_u32(smem), V_j = K_j + m.V;   /* [Bc][d] each, 16-bit */
    const uint32_t Qs = K_j + m.Q;                           /* Q_i of step s at Qs + (s%2) Br 2d */

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int b = blockIdx.z, h = blockIdx.y;   /* gridDim.x = 1: the sequence is not split */
    const int h_kv = h / (p.H / p.H_kv);
    const float scale_log2 = p.scale * LOG2E;
    const int Tr = (p.N_q + Br - 1) / Br, Tc = (p.N_k + Bc - 1) / Bc;
    /* Algorithm 1's HBM state, fp32, in the workspace: this head's O [Tr Br][d], l, m [Tr Br] */
    const size_t head = (size_t)b * p.H + h;
    float *O_hbm = (float *)a.ws + head * Tr * Br * d;
    float *l_hbm = (float *)((char *)a.ws + O_acc_bytes(&p)) + head * Tr * Br;
    float *m_hbm = l_hbm + (size_t)p.B * p.H * Tr * Br;

    load_tiles(Qs, a.q, NULL, b, 0, Br, p.N_q, h, p.H, d, THREADS);   /* the first step's Q_i */
    cp_async_commit();

    uint32_t kf[D_MAX / MMA_K][KW_MAX / MMA_N][2];   /* this warp's K_j fragments, [k][n] */
    uint32_t vf[KW_MAX / MMA_K][D_MAX / MMA_N][2];   /* and V_j's */
    int s = 0;                 /* step counter: Q_i and state buffer s % 2 */
    int state_ready = 0;       /* this step's O_i, l_i, m_i were started by the last step */
    for (int j = 0; j < Tc; j++) {                   /* line 5: K/V outer */
        const int j0 = j * Bc;
        /* Causal: Q tile t ends at row t Br + Br - 1, which sees key j0 iff it is >= j0; the
         * tiles before j0 / Br see none of these keys and are skipped (and once no tile is
         * left, no later K_j has any either). */
        const int i_first = p.causal ? j0 / Br : 0;
        if (i_first >= Tr) break;
        __syncthreads();   /* everyone is done with the last combine, whose buffer K_j, V_j reuse */
        load_tiles(K_j, a.k, a.v, b, j0, Bc, p.N_k, h_kv, p.H_kv, d, THREADS);   /* line 6 */
        cp_async_commit();

        for (int i = i_first; i < Tr; i++, s++) {    /* line 7: Q inner */
            const int i0 = i * Br;
            const uint32_t Q_i = Qs + (s % 2) * Br * row_bytes;
            cp_async_wait_all();
            __syncthreads();   /* Q_i (and K_j, V_j) have landed for all threads; all are done
                                  with the last step's O_i and combine buffers */
            if (i == i_first) {   /* K_j, V_j into registers, once per outer step */
#pragma unroll
                for (int k = 0; k < d / MMA_K; k++)
#pragma unroll
                    for (int n = 0; n < KW / MMA_N; n += 2) {
                        uint32_t kb[4];
                        ldsm_b(kb, K_j, row_bytes, KW * warp + n * MMA_N, k * MMA_K);
                        kf[k][n][0] = kb[0]; kf[k][n][1] = kb[1];
                        kf[k][n + 1][0] = kb[2]; kf[k][n + 1][1] = kb[3];
                    }
#pragma unroll
                for (int k = 0; k < KW / MMA_K; k++)
#pragma unroll
                    for (int n = 0; n < d / MMA_N; n += 2) {
                        uint32_t vb[4];
                        ldsm_b_t(vb, V_j, row_bytes, KW * warp + k * MMA_K, n * MMA_N);
                        vf[k][n][0] = vb[0]; vf[k][n][1] = vb[1];
                        vf[k][n + 1][0] = vb[2]; vf[k][n + 1][1] = vb[3];
                    }
                __syncthreads();   /* every warp has its fragments: the combine may reuse the tiles */
            }
            /* Line 8: O_i, l_i, m_i from HBM. Normally the last step started that copy (below);
             * the first K_j starts from line 2's O = 0, l = 0, m = -inf instead (the same
             * values, without a pass over HBM to write them). */
            const uint32_t state = K_j + m.O + (s % 2) * m.state;
            if (j > 0 && !state_ready) load_state(state, O_hbm, l_hbm, m_hbm, (size_t)i * Br, d);
            cp_async_commit();
            /* The next step's Q_i, and its O_i, l_i, m_i, into the other buffers, landing while
             * this step computes. Its state was last written by the step before it in its
             * column i_next, which has passed, unless that step is this one (i_next = i: the
             * next K_j's only Q tile is this one); that step then loads its own. A group of its
             * own, possibly empty, so that waiting for all groups but the last one waits for
             * this step's alone. */
            int j_next = j, i_next = i + 1;
            if (i_next >= Tr) { j_next = j + 1; i_next = p.causal ? j_next * Bc / Br : 0; }
            const int has_next = j_next < Tc && i_next < Tr;
            if (has_next)
                load_tiles(Qs + ((s + 1) % 2) * Br * row_bytes, a.q, NULL, b, i_next * Br, Br,
                           p.N_q, h, p.H, d, THREADS);
            const int prefetch = has_next && j_next > 0 && i_next != i;
            if (prefetch)
                load_state(K_j + m.O + ((s + 1) % 2) * m.state, O_hbm, l_hbm, m_hbm,
                           (size_t)i_next * Br, d);
            cp_async_commit();
            state_ready = prefetch;

            /* Line 9: this warp's slice of S_ij = Q_i K_jᵀ, 16 rows x KW keys. */
            float sc[KW_MAX / MMA_N][4];
#pragma unroll
            for (int n = 0; n < KW / MMA_N; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) sc[n][c] = 0.0f;
#pragma unroll
            for (int k = 0; k < d / MMA_K; k++) {
                uint32_t qa[4];
                ldsm_a(qa, Q_i, row_bytes, 0, k * MMA_K);
#pragma unroll
                for (int n = 0; n < KW / MMA_N; n++) mma_16816(sc[n], qa, kf[k][n][0], kf[k][n][1], fp16);
            }
            if (j0 + Bc > p.N_k || (p.causal && j0 + Bc - 1 > i0))
                mask_scores(sc, KW / MMA_N, i0 + lane / QUAD, j0 + KW * warp + 2 * (lane % QUAD),
                            p.N_k, p.causal);

            /* Line 10 on the slice, in the log2 domain (m holds max(S) * scale * log2(e), scale
             * > 0): m_w = rowmax, P_w = exp2(S scale_log2 - m_w), one FFMA and one ex2 per
             * score, l_w = rowsum(P_w). */
            float m_w[2], l_w[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < KW / MMA_N; n++) mx = fmaxf(mx, fmaxf(sc[n][2 * hf], sc[n][2 * hf + 1]));
                m_w[hf] = row_max(mx) * scale_log2;
                /* A row with no visible key in this slice has m_w = -inf: subtract 0 instead,
                 * so that exp2 gives 0 rather than exp2(-inf - -inf) = NaN. */
                const float m_use = m_w[hf] == -INFINITY ? 0.0f : m_w[hf];
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < KW / MMA_N; n++)
#pragma unroll
                    for (int c = 2 * hf; c < 2 * hf + 2; c++) {
                        sc[n][c] = exp2_fast(fmaf(sc[n][c], scale_log2, -m_use));
                        sum += sc[n][c];
                    }
                l_w[hf] = row_sum(sum);
            }

            /* O_w = P_w V_w. Accumulator tiles 2k, 2k+1 of the slice (keys 16k..16k+15),
             * rounded in pairs, are exactly the A fragment of reduction step k. */
            float o[D_MAX / MMA_N][4];
#pragma unroll
            for (int n = 0; n < d / MMA_N; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) o[n][c] = 0.0f;
#pragma unroll
            for (int k = 0; k < KW / MMA_K; k++) {
                const uint32_t pa[4] = {
                    pack_x2(sc[2 * k][0], sc[2 * k][1], fp16), pack_x2(sc[2 * k][2], sc[2 * k][3], fp16),
                    pack_x2(sc[2 * k + 1][0], sc[2 * k + 1][1], fp16),
                    pack_x2(sc[2 * k + 1][2], sc[2 * k + 1][3], fp16)};
#pragma unroll
                for (int n = 0; n < d / MMA_N; n++) mma_16816(o[n], pa, vf[k][n][0], vf[k][n][1], fp16);
            }

            /* The slices meet in shared memory (in K_j's and V_j's bytes, which the registers
             * now hold): O_w at xchg(w, row, column), m_w and l_w per row. */
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = lane / QUAD + 8 * hf;
#pragma unroll
                for (int n = 0; n < d / MMA_N; n++)
                    *(float2 *)(smem + xchg(warp, r, n * MMA_N + 2 * (lane % QUAD), d)) =
                        make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
                if (lane % QUAD == 0) {
                    ((float *)(smem + m.xm))[warp * Br + r] = m_w[hf];
                    ((float *)(smem + m.xm))[(WARPS + warp) * Br + r] = l_w[hf];
                }
            }
            cp_async_wait_1();   /* this thread's part of O_i, l_i, m_i has landed (if this
                                    step loaded them; if the last did, they had already) */
            __syncthreads();     /* everyone's, and every slice */

            /* The combine. Thread t takes row r = t / 8 and the 16-byte column chunks
             * t % 8 + 8 k. Across warps (line 10 for the whole tile): m~ = max m_w,
             * l~ = sum e^(m_w - m~) l_w, P~ V_j = sum e^(m_w - m~) O_w. Across steps
             * (lines 11-12): m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~,
             * O_i = (l_i e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j) / l_new. */
            {
                const int r = threadIdx.x / 8, cg = threadIdx.x % 8;
                const float *xs = (const float *)(smem + m.xm);
                float mw[WARPS], cw[WARPS], m_t = -INFINITY;
#pragma unroll
                for (int w = 0; w < WARPS; w++) { mw[w] = xs[w * Br + r]; m_t = fmaxf(m_t, mw[w]); }
                const float m_t_use = m_t == -INFINITY ? 0.0f : m_t;   /* as above */
                float l_t = 0.0f;
#pragma unroll
                for (int w = 0; w < WARPS; w++) {
                    cw[w] = exp2_fast(mw[w] - m_t_use);
                    l_t += cw[w] * xs[(WARPS + w) * Br + r];
                }
                const float *lm = (const float *)(smem + m.O + (s % 2) * m.state) + Br * d;
                const float l_i = j > 0 ? lm[r] : 0.0f, m_i = j > 0 ? lm[Br + r] : -INFINITY;
                /* finite: every row sees key 0, at j = 0 */
                const float m_new = fmaxf(m_i, m_t);
                const float alpha = exp2_fast(m_i - m_new), beta = exp2_fast(m_t - m_new);
                const float l_new = alpha * l_i + beta * l_t, inv_l = 1.0f / l_new;
                const float c_i = alpha * l_i * inv_l;
#pragma unroll
                for (int w = 0; w < WARPS; w++) cw[w] *= beta * inv_l;
                /* Lines 12-13: O_i, l_i, m_i back to HBM; at this Q_i's last key tile, O in the
                 * dtype and L_i = (m_i + log2 l_i) ln 2 instead (l_i >= 1: the max term is 1).
                 * Rows past N_q are kept in the padded workspace, never stored to O or L. */
                const int last_j = (visible_keys(p, min(i0 + Br, p.N_q) - 1) - 1) / Bc;
                const int i_row = i0 + r;
#pragma unroll
                for (int k = 0; k < d / 32; k++) {
                    const int c = cg + 8 * k;   /* columns 4c .. 4c+3 */
                    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (j > 0) {
                        const float4 y = ((const float4 *)(smem + m.O + (s % 2) * m.state))[r * (d / 4) + c];
                        x = make_float4(c_i * y.x, c_i * y.y, c_i * y.z, c_i * y.w);
                    }
#pragma unroll
                    for (int w = 0; w < WARPS; w++) {
                        const float4 y = *(const float4 *)(smem + xchg(w, r, 4 * c, d));
                        x.x = fmaf(cw[w], y.x, x.x); x.y = fmaf(cw[w], y.y, x.y);
                        x.z = fmaf(cw[w], y.z, x.z); x.w = fmaf(cw[w], y.w, x.w);
                    }
                    if (j < last_j)
                        ((float4 *)(O_hbm + ((size_t)i0 + r) * d))[c] = x;
                    else if (i_row < p.N_q)
                        *(uint2 *)((uint16_t *)a.o + attn_row(b, i_row, h, p.N_q, p.H, d) + 4 * c) =
                            make_uint2(pack_x2(x.x, x.y, fp16), pack_x2(x.z, x.w, fp16));
                }
                if (cg == 0) {
                    if (j < last_j) {
                        l_hbm[i0 + r] = l_new;
                        m_hbm[i0 + r] = m_new;
                    } else if (i_row < p.N_q) {
                        a.lse[head * p.N_q + i_row] = (m_new + log2f(l_new)) * LN2;
                    }
                }
            }
        }
    }
    cp_async_wait_all();   /* nothing is in flight, but leave no copy behind */
}

/* One kernel per head dim and dtype, each with literals inside (one kernel holding all four
 * branches is register-allocated as a whole and spills). Two blocks of 4 warps per SM: up to
 * 255 registers a thread, 2 x 88 KiB of shared memory at d = 128. */
typedef void (*attention_fn)(attn_problem, attn_args);
static __global__ void __launch_bounds__(THREADS, 2) attention_64_bf16(attn_problem p, attn_args a)  { tiled_attention(p, a, 64, 0); }
static __global__ void __launch_bounds__(THREADS, 2) attention_64_fp16(attn_problem p, attn_args a)  { tiled_attention(p, a, 64, 1); }
static __global__ void __launch_bounds__(THREADS, 2) attention_128_bf16(attn_problem p, attn_args a) { tiled_attention(p, a, 128, 0); }
static __global__ void __launch_bounds__(THREADS, 2) attention_128_fp16(attn_problem p, attn_args a) { tiled_attention(p, a, 128, 1); }

static attention_fn pick_forward(const attn_problem *p)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64) return fp16 ? attention_64_fp16 : attention_64_bf16;
    return fp16 ? attention_128_fp16 : attention_128_bf16;
}

/* ---- Backward ------------------------------------------------------------------------------ */

#define BWD_THREADS 256 /* 8 warps */
#define BWD_Bc 128    /* keys per backward block: K_j, V_j stay in shared memory */
#define BWD_BR_MAX 128 /* query rows per step at most (Q_i, dO_i, L_i, D_i, double-buffered) */

/* Backward dynamic shared memory, byte offsets from its start: K_j, V_j [Bc][d]; two stages of
 * Q_i, dO_i [Br][d]; P_ij and dS_ij [Br][Bc], all 16-bit; two stages of L_i, D_i [Br] fp32. */
typedef struct { int V, QdO, stage, P, dS, LD, bytes; } bwd_smem;

static __host__ __device__ __forceinline__ bwd_smem backward_layout(int d, int br)
{
    bwd_smem m;
    m.V = BWD_Bc * 2 * d;                   /* K_j at 0 */
    m.QdO = 2 * m.V;                        /* stage s: Q_i at QdO + s stage, dO_i next */
    m.stage = 2 * br * 2 * d;
    m.P = m.QdO + 2 * m.stage;
    m.dS = m.P + br * 2 * BWD_Bc;
    m.LD = m.dS + br * 2 * BWD_Bc;          /* stage s: L_i at LD + s 2 br floats, D_i next */
    m.bytes = m.LD + 2 * 2 * br * (int)sizeof(float);
    return m;
}

/* Query rows per backward step (br): 64 at d = 128; at d = 64, 128 where the tiles fit
 * (162 KiB: an H100, H200 or A100), since with half-depth products a taller step spreads the
 * per-step work (exponentials, P_ij and dS_ij stores, barriers, the dQ_i round trip) over
 * twice the rows; 64 on GPUs with less shared memory per block (97 KiB: RTX 4090, A6000). */
static int backward_rows(const attn_problem *p)
{
    int smem_max = 0;
    if (p->d == 64 && !attn_smem_per_block(&smem_max) && backward_layout(64, 128).bytes <= smem_max)
        return 128;
    return 64;
}

static size_t backward_smem_bytes(const attn_problem *p)
{
    return (size_t)backward_layout(p->d, backward_rows(p)).bytes;
}

/* Backward workspace: D, fp32 [B, H, N_q] (rounded up to 256 bytes, so that what follows
 * stays aligned), then dQ, fp32 (Algorithm 4 keeps it in HBM), see dq_acc_bytes. */
static size_t D_bytes(const attn_problem *p)
{
    const size_t bytes = (size_t)p->B * p->H * p->N_q * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

/* dQ in HBM holds, for every (b, h) and query tile of br rows, the tile's br x d values in
 * the order the backward's threads hold them in registers: value `slot` of thread t at
 * slot * BWD_THREADS + t. Each load and store instruction of a warp then covers 32
 * consecutive floats (4 full sectors). */
static size_t dq_acc_bytes(const attn_problem *p)
{
    const int br = backward_rows(p);
    const size_t tiles = (size_t)p->B * p->H * attn_ceil_div(p->N_q, br);
    return tiles * br * p->d * sizeof(float);
}

/* D_i = rowsum(dO_i ∘ O_i), stored like L: [B, H, N_q], and (atomic dQ) the accumulator set
 * to zero in the same pass. A row is d / 8 threads reading 16 bytes each, rows taken in the
 * [B, N_q, H] order of O, so neighbouring threads read neighbouring memory; a shuffle tree
 * sums each row. Thread t also zeroes accumulator floats 8t .. 8t+7 (acc_chunks of them). */
static __global__ void rowdot_kernel(attn_problem p, const void *d_o, const void *o, float *D,
                                     float *dq_acc, size_t acc_chunks)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = p.d / CHUNK, fp16 = p.dtype == ATTN_FP16;
    const size_t n_chunks = (size_t)p.B * p.N_q * p.H * per_row;
    if (t < acc_chunks) {
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ((float4 *)dq_acc)[2 * t] = zero;
        ((float4 *)dq_acc)[2 * t + 1] = zero;
    }
    float acc = 0.0f;
    if (t < n_chunks) {
        const uint4 x = ((const uint4 *)d_o)[t], y = ((const uint4 *)o)[t];
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 a = unpack_x2(xs[k], fp16), b = unpack_x2(ys[k], fp16);
            acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
        }
    }
    for (int k = per_row / 2; k > 0; k /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, k);
    if (t < n_chunks && t % per_row == 0) {
        const size_t row = t / per_row;   /* (b N_q + i) H + h */
        const int h = (int)(row % p.H), i = (int)(row / p.H % p.N_q), b = (int)(row / p.H / p.N_q);
        D[((size_t)b * p.H + h) * p.N_q + i] = acc;
    }
}

/* Start loading one step of the backward loop into a stage: Q_i, dO_i (rows i0 .. i0+br-1 of
 * query head h) and L_i, D_i (fp32, 4 bytes per cp.async: those rows are not 16-byte aligned). */
static __device__ __forceinline__ void load_step(uint32_t QdO, uint32_t LD, const attn_problem *p,
                                                 const attn_args *a, const float *D, int b,
                                                 int h, int i0, int d, int br)
{
    if (threadIdx.x < br) {   /* thread r copies L_i[r] and D_i[r] */
        const int r = threadIdx.x, inside = i0 + r < p->N_q;
        const size_t row = ((size_t)b * p->H + h) * p->N_q + i0 + (inside ? r : 0);
        cp_async_4(LD + r * sizeof(float), a->lse + row, inside);
        cp_async_4(LD + (br + r) * sizeof(float), D + row, inside);
    }
    load_tiles(QdO, a->q, a->d_o, b, i0, br, p->N_q, h, p->H, d, BWD_THREADS);
}

/* One step of the backward loop: query tile i0 .. i0+br-1 of query head h (stage st of the
 * Q_i, dO_i buffers) against K_j, V_j (keys j0 ..), after starting the loads of the next step
 * (h_next, i_next) into the other stage. masked is a literal: the steps that cross the
 * diagonal or N_k run a copy of this code with the mask, all others a copy without it, which
 * is one stretch of code from the barrier to the dQ_i adds, scheduled as a whole (one copy
 * with the mask behind a branch is slower: the branch cuts that stretch in pieces). See
 * tiled_backward for who owns what. */
static __device__ __forceinline__ void backward_step(const attn_problem *p, const attn_args *a,
                                                     const float *D, float *dq_acc,
                                                     float dK[2][D_MAX / 16][4],
                                                     float dV[2][D_MAX / 16][4], int st, int j0,
                                                     int h, int i0, int h_next, int i_next, const int d,
                                                     const int br, const int fp16, const int masked)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const bwd_smem m = backward_layout(d, br);
    const int row_bytes = 2 * d, ps_bytes = 2 * BWD_Bc;
    const uint32_t K_j = smem_u32(smem), V_j = K_j + m.V, QdO = K_j + m.QdO;
    const uint32_t P_ij = K_j + m.P, dS_ij = K_j + m.dS;
    const int stage_bytes = m.stage, P_off = m.P, dS_off = m.dS, LD_off = m.LD;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wm = warp % 2, wn = warp / 2;
    const int b = blockIdx.z;
    const int MQ = br / 32;   /* query mma tiles per warp: br / 2 rows */
    const int Tr = (p->N_q + br - 1) / br;
    const float scale_log2 = p->scale * LOG2E;

    const uint32_t Q_i = QdO + st * stage_bytes, dO_i = Q_i + br * row_bytes;
    const float *L_i = (const float *)(smem + LD_off) + st * 2 * br, *D_i = L_i + br;
    cp_async_wait_all();
    __syncthreads();   /* this step has landed for all threads; all are done with the last */
    load_step(QdO + (1 - st) * stage_bytes, K_j + LD_off + (1 - st) * 2 * br * sizeof(float),
              p, a, D, b, h_next, i_next, d, br);
    cp_async_commit();

    /* Recompute S_ij = Q_i K_jᵀ and P_ij = exp2(S_ij scale log2e - L_i log2e) from the saved
     * logsumexp: no max or sum needed. */
    float s[BWD_BR_MAX / 32][4][4], dp[BWD_BR_MAX / 32][4][4];
#pragma unroll
    for (int mt = 0; mt < MQ; mt++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[mt][n][c] = dp[mt][n][c] = 0.0f;
#pragma unroll
    for (int k = 0; k < d / MMA_K; k++) {
        uint32_t qa[BWD_BR_MAX / 32][4], kb[2][4];
#pragma unroll
        for (int mt = 0; mt < MQ; mt++) ldsm_a(qa[mt], Q_i, row_bytes, br / 2 * wm + MMA_M * mt, k * MMA_K);
#pragma unroll
        for (int n = 0; n < 2; n++) ldsm_b(kb[n], K_j, row_bytes, 32 * wn + 16 * n, k * MMA_K);
#pragma unroll
        for (int mt = 0; mt < MQ; mt++)
#pragma unroll
            for (int n = 0; n < 2; n++) {
                mma_16816(s[mt][2 * n], qa[mt], kb[n][0], kb[n][1], fp16);
                mma_16816(s[mt][2 * n + 1], qa[mt], kb[n][2], kb[n][3], fp16);
            }
    }
#pragma unroll
    for (int mt = 0; mt < MQ; mt++) {
        const int r0 = br / 2 * wm + MMA_M * mt + lane / QUAD;   /* rows r0, r0 + 8 of the step */
        if (masked)
            mask_scores(s[mt], 4, i0 + r0, j0 + 32 * wn + 2 * (lane % QUAD), p->N_k, p->causal);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float lse2 = L_i[r0 + 8 * (c / 2)] * LOG2E;
#pragma unroll
            for (int n = 0; n < 4; n++) s[mt][n][c] = exp2_fast(fmaf(s[mt][n][c], scale_log2, -lse2));
        }
    }

    /* dP_ij = dO_i V_jᵀ */
#pragma unroll
    for (int k = 0; k < d / MMA_K; k++) {
        uint32_t oa[BWD_BR_MAX / 32][4], vb[2][4];
#pragma unroll
        for (int mt = 0; mt < MQ; mt++) ldsm_a(oa[mt], dO_i, row_bytes, br / 2 * wm + MMA_M * mt, k * MMA_K);
#pragma unroll
        for (int n = 0; n < 2; n++) ldsm_b(vb[n], V_j, row_bytes, 32 * wn + 16 * n, k * MMA_K);
#pragma unroll
        for (int mt = 0; mt < MQ; mt++)
#pragma unroll
            for (int n = 0; n < 2; n++) {
                mma_16816(dp[mt][2 * n], oa[mt], vb[n][0], vb[n][1], fp16);
                mma_16816(dp[mt][2 * n + 1], oa[mt], vb[n][2], vb[n][3], fp16);
            }
    }

    /* dS_ij = P_ij ∘ (dP_ij - D_i). P_ij and dS_ij go to shared memory, 16-bit: dV_j and dK_j
     * need them transposed, dQ_i needs every key of the tile. */
#pragma unroll
    for (int mt = 0; mt < MQ; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = br / 2 * wm + MMA_M * mt + lane / QUAD + 8 * hf;
            const float D_r = D_i[r];
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const uint32_t at = swz(r, 4 * wn + n, ps_bytes) + 4 * (lane % QUAD);
                const float p0 = s[mt][n][2 * hf], p1 = s[mt][n][2 * hf + 1];
                *(uint32_t *)(smem + P_off + at) = pack_x2(p0, p1, fp16);
                *(uint32_t *)(smem + dS_off + at) =
                    pack_x2(p0 * (dp[mt][n][2 * hf] - D_r), p1 * (dp[mt][n][2 * hf + 1] - D_r), fp16);
            }
        }
    __syncthreads();

    /* dV_j += P_ijᵀ dO_i and dK_j += dS_ijᵀ Q_i (scale applied once, at the end). */
    const int cK = wm * (d / 2);
#pragma unroll
    for (int k = 0; k < br / MMA_K; k++) {
        uint32_t pa[2][4], sa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            ldsm_a_t(pa[mt], P_ij, ps_bytes, 32 * wn + MMA_M * mt, k * MMA_K);
            ldsm_a_t(sa[mt], dS_ij, ps_bytes, 32 * wn + MMA_M * mt, k * MMA_K);
        }
#pragma unroll
        for (int n = 0; n < d / 2 / MMA_N; n += 2) {
            uint32_t ob[4], qb[4];
            ldsm_b_t(ob, dO_i, row_bytes, k * MMA_K, cK + n * MMA_N);
            ldsm_b_t(qb, Q_i, row_bytes, k * MMA_K, cK + n * MMA_N);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma_16816(dV[mt][n], pa[mt], ob[0], ob[1], fp16);
                mma_16816(dV[mt][n + 1], pa[mt], ob[2], ob[3], fp16);
                mma_16816(dK[mt][n], sa[mt], qb[0], qb[1], fp16);
                mma_16816(dK[mt][n + 1], sa[mt], qb[2], qb[3], fp16);
            }
        }
    }

    /* Line 21: dQ_i += dS_ij K_j (unscaled: convert_dq_kernel applies scale) in HBM. */
    {
        const int cQ = wn * (d / 4);
        float dq[BWD_BR_MAX / 32][D_MAX / 32][4];
#pragma unroll
        for (int mt = 0; mt < MQ; mt++)
#pragma unroll
            for (int n = 0; n < D_MAX / 32; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) dq[mt][n][c] = 0.0f;
#pragma unroll
        for (int k = 0; k < BWD_Bc / MMA_K; k++) {
            uint32_t sa[BWD_BR_MAX / 32][4];
#pragma unroll
            for (int mt = 0; mt < MQ; mt++) ldsm_a(sa[mt], dS_ij, ps_bytes, br / 2 * wm + MMA_M * mt, k * MMA_K);
#pragma unroll
            for (int n = 0; n < d / 4 / MMA_N; n += 2) {
                uint32_t kb[4];
                ldsm_b_t(kb, K_j, row_bytes, k * MMA_K, cQ + n * MMA_N);
#pragma unroll
                for (int mt = 0; mt < MQ; mt++) {
                    mma_16816(dq[mt][n], sa[mt], kb[0], kb[1], fp16);
                    mma_16816(dq[mt][n + 1], sa[mt], kb[2], kb[3], fp16);
                }
            }
        }
        /* The read-modify-write of dQ_i, one red.global.add.f32 per element: the L2 reads, adds
         * and writes back, coalesced (see dq_acc_bytes). No other block adds to these
         * addresses, and this thread's adds to one address happen in loop order, so the sum is
         * the same in every run. Rows past N_q add zeros (dO_i and D_i are zero-filled there),
         * so no test is needed. */
        float *dst = dq_acc + (((size_t)b * p->H + h) * Tr + i0 / br) * br * d + threadIdx.x;
#pragma unroll
        for (int mt = 0; mt < MQ; mt++)
#pragma unroll
            for (int n = 0; n < d / 4 / MMA_N; n++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    atomicAdd(dst + ((mt * (d / 32) + n) * 4 + c) * BWD_THREADS, dq[mt][n][c]);
    }
}

/* One block: key tile j (keys j0 .. j0+Bc-1) of kv head h_kv, batch b: the body of
 * Algorithm 4's outer loop (lines 7-24), whose loop over j is the host's (backward()). K_j,
 * V_j stay in shared memory and dK_j, dV_j in registers while the block visits every query
 * head of the GQA group and every query tile Q_i that can see these keys; so dK_j, dV_j come
 * out already summed over the group and are written once. dQ_i is read, added to and written
 * back in HBM (line 21). Warp w = (wn, wm) = (w / 2, w % 2) owns
 *   S_ij, dP_ij: queries br/2 wm .. +br/2-1, keys 32 wn .. +31 of the step (br/32 x 4 mma
 *                tiles),
 *   dK_j, dV_j:  keys 32 wn .. +31, columns wm d/2 .. +d/2 (2 x d/16 tiles),
 *   dQ_i:        queries br/2 wm .. +br/2-1, columns wn d/4 .. +d/4 (br/32 x d/32 tiles).
 * br, the query rows per step, is 64 or 128 (backward_rows). */
static __device__ __forceinline__ void tiled_backward(const attn_problem p, const attn_args a,
                                                      const float *D, float *dq_acc, int j,
                                                      const int d, const int br, const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const bwd_smem m = backward_layout(d, br);
    const int row_bytes = 2 * d;
    const uint32_t K_j = smem_u32(smem);

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wm = warp % 2, wn = warp / 2;
    const int b = blockIdx.z, h_kv = blockIdx.y, j0 = j * BWD_Bc;   /* gridDim.x = 1 */
    const int group = p.H / p.H_kv;

    /* Causal: query tile t reaches row t*br + br - 1, which sees key j0 iff that is >= j0;
     * the tiles before j0 / br see none of these keys and are skipped. A step is one
     * (query head, query tile) pair. */
    const int Tr = (p.N_q + br - 1) / br;
    const int t_first = p.causal ? min(j0 / br, Tr) : 0;
    const int tiles = Tr - t_first, steps = group * tiles;

    load_tiles(K_j, a.k, a.v, b, j0, BWD_Bc, p.N_k, h_kv, p.H_kv, d, BWD_THREADS);
    if (steps > 0)
        load_step(K_j + m.QdO, K_j + m.LD, &p, &a, D, b, h_kv * group, t_first * br, d, br);
    cp_async_commit();

    float dK[2][D_MAX / 16][4], dV[2][D_MAX / 16][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < D_MAX / 16; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) dK[mt][n][c] = dV[mt][n][c] = 0.0f;

    int h = h_kv * group, i0 = t_first * br;   /* step t's query head and first row */
    for (int t = 0; t < steps; t++) {
        const int st = t % 2;
        /* The next step: the next query tile, or the first of the next head. The last step
         * loads itself once more, into the stage nothing reads: no branch before the mmas. */
        int h_next = h, i_next = i0 + br;
        if (i_next >= Tr * br) { h_next = h + 1; i_next = t_first * br; }
        if (t + 1 == steps) { h_next = h; i_next = i0; }
        if (j0 + BWD_Bc > p.N_k || (p.causal && j0 + BWD_Bc - 1 > i0))
            backward_step(&p, &a, D, dq_acc, dK, dV, st, j0, h, i0, h_next, i_next, d, br, fp16, 1);
        else
            backward_step(&p, &a, D, dq_acc, dK, dV, st, j0, h, i0, h_next, i_next, d, br, fp16, 0);
        h = h_next;
        i0 = i_next;
    }
    cp_async_wait_all();

    /* dK_j = scale sum dS_ijᵀ Q_i, dV_j = sum P_ijᵀ dO_i, written once, through the K_j and
     * V_j tiles once every warp is done with them; keys past N_k are not stored. Keys no
     * query sees (causal, key >= N_q) get zeros. */
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int key = 32 * wn + MMA_M * mt + lane / QUAD + 8 * hf;
#pragma unroll
            for (int n = 0; n < d / 2 / MMA_N; n++) {
                const int col = wm * (d / 2) + n * MMA_N + 2 * (lane % QUAD);
                put_pair(0, row_bytes, key, col,
                         pack_x2(p.scale * dK[mt][n][2 * hf], p.scale * dK[mt][n][2 * hf + 1], fp16));
                put_pair(m.V, row_bytes, key, col,
                         pack_x2(dV[mt][n][2 * hf], dV[mt][n][2 * hf + 1], fp16));
            }
        }
    __syncwarp();
    store_rows(a.dk, 0, 32 * wn, 32, wm * (d / 2), d / 2, b, j0, p.N_k, h_kv, p.H_kv, d);
    store_rows(a.dv, m.V, 32 * wn, 32, wm * (d / 2), d / 2, b, j0, p.N_k, h_kv, p.H_kv, d);
}

/* One block per (kv head, batch): 161-162 KiB of shared memory allows one per SM anyway, and the
 * dK_j, dV_j accumulators (128 registers a thread at d = 128) need the registers. One kernel per
 * (d, br, dtype): backward_<d>_<br>_<dtype>; d = 64 has both step heights (backward_rows). */
typedef void (*backward_fn)(attn_problem, attn_args, const float *, float *, int);
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_128_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j) { tiled_backward(p, a, D, dq_acc, j, 64, 128, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_128_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j) { tiled_backward(p, a, D, dq_acc, j, 64, 128, 1); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_64_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j)  { tiled_backward(p, a, D, dq_acc, j, 64, 64, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_64_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j)  { tiled_backward(p, a, D, dq_acc, j, 64, 64, 1); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_128_64_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j) { tiled_backward(p, a, D, dq_acc, j, 128, 64, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_128_64_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, int j) { tiled_backward(p, a, D, dq_acc, j, 128, 64, 1); }

static backward_fn pick_backward(const attn_problem *p, int br)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64 && br == 128) return fp16 ? backward_64_128_fp16 : backward_64_128_bf16;
    if (p->d == 64) return fp16 ? backward_64_64_fp16 : backward_64_64_bf16;
    return fp16 ? backward_128_64_fp16 : backward_128_64_bf16;
}

/* dq = scale * the fp32 accumulator, rounded to the dtype and put back in the [B, N_q, H, d]
 * layout; a block per query tile of br rows, in two phases through shared memory. Reading: a
 * thread takes 16 neighbouring columns of one row. In the backward, register dq[mt][n][c] of
 * thread t = 32 (2 wn + wm) + lane holds row br/2 wm + 16 mt + lane / 4 + 8 (c / 2), column
 * wn d/4 + 8 n + 2 (lane % 4) + c % 2, at slot (mt (d/32) + n) 4 + c; so 8 columns (n) are
 * slots c0 and c0 + 1 of four neighbouring threads, two 16-byte reads, and the next 8 (n + 1)
 * the same 4 slots on. Neighbouring threads take neighbouring rows (row % 8), whose reads are
 * neighbouring 16 bytes. The rounded row goes into shared memory, rows padded by 16 bytes so
 * that 8 rows' stores fall in different banks. Writing: d / 8 threads a row, 16 bytes each, so
 * that a row of dQ leaves as one contiguous run (2 d bytes) rather than as 32-byte pieces. */
#define CONVERT_PITCH(d) (2 * (d) + 16)   /* bytes a row in shared memory */
static __global__ void __launch_bounds__(512) convert_dq_kernel(attn_problem p, int br,
                                                                const float *dq_acc, void *dq)
{
    /* br x d is 64 x 128 or 128 x 64 at most (backward_rows): 128 rows of d = 64 the larger. */
    __shared__ __align__(16) unsigned char rows_sm[BWD_BR_MAX * CONVERT_PITCH(64)];
    const int d = p.d, Tr = (p.N_q + br - 1) / br, groups = d / (2 * CHUNK);
    const int pitch = CONVERT_PITCH(d);
    const size_t tile = blockIdx.x;   /* (b H + h) Tr + query tile */
    const int e = threadIdx.x, fp16 = p.dtype == ATTN_FP16;
    {
        const int row = e % br, col = e / br * 2 * CHUNK;
        const int wm = row / (br / 2), mt = row % (br / 2) / MMA_M, hf = row % MMA_M / 8;
        const int wn = col / (d / 4), n = col % (d / 4) / MMA_N;
        const int t0 = (2 * wn + wm) * WARP + (row % 8) * QUAD;
        const int slot = (mt * (d / 32) + n) * 4 + 2 * hf;
        const float *src = dq_acc + tile * br * d + slot * BWD_THREADS + t0;
        const float sc = p.scale;
        uint4 *at = (uint4 *)(rows_sm + row * pitch + col * 2);
#pragma unroll
        for (int k = 0; k < 2; k++) {   /* columns col + 8k .. col + 8k + 7: slots 4k on */
            const float4 lo = *(const float4 *)(src + 4 * k * BWD_THREADS);
            const float4 hi = *(const float4 *)(src + (4 * k + 1) * BWD_THREADS);
            at[k] = make_uint4(pack_x2(sc * lo.x, sc * hi.x, fp16),
                               pack_x2(sc * lo.y, sc * hi.y, fp16),
                               pack_x2(sc * lo.z, sc * hi.z, fp16),
                               pack_x2(sc * lo.w, sc * hi.w, fp16));
        }
    }
    __syncthreads();
    const int h = (int)(tile / Tr % p.H), b = (int)(tile / Tr / p.H), i0 = (int)(tile % Tr) * br;
    for (int f = e; f < br * d / CHUNK; f += br * groups) {
        const int row = f / (d / CHUNK), c = f % (d / CHUNK) * CHUNK;
        if (i0 + row >= p.N_q) break;
        *(uint4 *)((uint16_t *)dq + attn_row(b, i0 + row, h, p.N_q, p.H, d) + c) =
            *(const uint4 *)(rows_sm + row * pitch + c * 2);
    }
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    if (p->d != 64 && p->d != 128) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 05_tensor_cores supports 64 and 128", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 05_tensor_cores needs a positive scale", p->scale);
        return 1;
    }
    /* A forward block counts its steps (K_j, Q_i pairs: at most Tc Tr) in an int */
    const long long steps = (long long)attn_ceil_div(p->N_k, kv_keys(p->d)) * attn_ceil_div(p->N_q, Br);
    if (steps > INT_MAX) {
        snprintf(why, ATTN_WHY_LEN, "N_q = %d, N_k = %d at head dim %d: a block of stage "
                 "05_tensor_cores would take %lld steps, more than its int step counter holds",
                 p->N_q, p->N_k, p->d, steps);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "05_tensor_cores cannot query the device");
        return 1;
    }
    const size_t smem = dir == ATTN_BACKWARD ? backward_smem_bytes(p) : smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 05_tensor_cores", p->d, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

/* Forward: O (fp32), l and m, which Algorithm 1 keeps in HBM between the steps. Backward: D
 * and dQ (fp32), which Algorithm 4 keeps in HBM. All O(N); no N x N buffer, since S_ij and
 * P_ij are recomputed on chip from L. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    return dir == ATTN_BACKWARD ? D_bytes(p) + dq_acc_bytes(p) : O_acc_bytes(p) + 2 * stats_bytes(p);
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    const attention_fn kernel = pick_forward(p);
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(1, p->H, p->B);   /* one block per (head, batch): FA-1's grid */
    kernel<<<grid, THREADS, smem, s>>>(*p, *a);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

/* D, then the K/V-outer backward (dK, dV written; dQ summed in fp32 in the workspace), then
 * dQ: scaled and rounded. */
static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *D = (float *)a->ws;
    float *dq_acc = (float *)((char *)a->ws + D_bytes(p));
    /* rowdot_kernel: a thread per 8 elements of O, and per 8 floats of dQ (which arrives
     * poisoned, and which line 5 sets to zero). */
    const size_t n_chunks = (size_t)p->B * p->H * p->N_q * (p->d / CHUNK);
    const size_t acc_chunks = dq_acc_bytes(p) / sizeof(float) / CHUNK;
    rowdot_kernel<<<attn_blocks_for(n_chunks > acc_chunks ? n_chunks : acc_chunks, THREADS), THREADS, 0, s>>>(
        *p, a->d_o, a->o, D, dq_acc, acc_chunks);
    ATTN_LAUNCH_CHECK();

    const int br = backward_rows(p);
    const size_t smem = backward_smem_bytes(p);
    const backward_fn kernel = pick_backward(p, br);
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* Line 6, the loop over K_j, V_j, on the host: one launch per K_j, each with one block per
     * (kv head, batch), FA-1's grid. In stream order, so each dQ element's sum is taken in
     * the same order every run. */
    const dim3 grid(1, p->H_kv, p->B);
    for (int j = 0; j < attn_ceil_div(p->N_k, BWD_Bc); j++) {
        kernel<<<grid, BWD_THREADS, smem, s>>>(*p, *a, D, dq_acc, j);
        ATTN_LAUNCH_CHECK();
    }

    const int tiles = attn_ceil_div(p->N_q, br) * p->H * p->B;   /* a block each */
    convert_dq_kernel<<<tiles, br * (p->d / (2 * CHUNK)), 0, s>>>(*p, br, dq_acc, a->dq);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_05_tensor_cores = {
    "05_tensor_cores",
    "FlashAttention-1 on mma.sync tensor cores: K/V outer, O and dQ through HBM, warps split keys, one block per head",
    "head dim 64 or 128; bf16, fp16; any N; causal; GQA; dQ summed in a fixed order (deterministic)",
    80,
    check,
    workspace,
    forward,
    backward,
};
