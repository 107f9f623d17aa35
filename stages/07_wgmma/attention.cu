/* stages/07_wgmma/attention.cu: FlashAttention-2's forward on Hopper's own instructions (sm_90a).
 *
 * Changed from 06_fa2 (forward): the same algorithm (Q outer, one block per query tile, online
 * softmax in registers, P_ij never leaves them), moved from mma.sync to the asynchronous path:
 * - TMA: Q_i, K_j, V_j arrive by cp.async.bulk.tensor, one instruction per 64-column box issued
 *   by one thread, described by tensor maps built on the host; the copy engine computes the
 *   addresses, zero-fills rows past N and writes the 128-byte swizzle itself.
 * - mbarriers: each K_j, V_j stage of a ring of STAGES completes on a barrier armed with its
 *   bytes; the threads wait on the barrier's phase instead of on their own copies.
 * - wgmma: a warpgroup (4 warps) owns 64 query rows and issues S_ij = Q_i K_jᵀ as m64 x Bc x 16
 *   products reading Q_i and K_j from shared memory by descriptor (no ldmatrix), and
 *   O_i += P_ij V_j with P_ij from S's accumulators in registers.
 * The structure stays synchronous: every warpgroup waits for its own products before the
 * softmax, and one barrier per tile frees the ring's oldest stage. Overlap is stage 8's lesson.
 * Tiles: Br = 128 (2 warpgroups, 256 threads; one block per SM, up to 255 registers a thread for
 *   64 x d accumulators of O plus 64 x Bc of S; two at d = 64, 128 registers), Bc = 128 keys for
 *   d = 64 and 128, 64 for d = 256 (O takes 128 registers there).
 * Why: mma.sync is a warp-wide 16 x 8 x 16 product whose operands pass through registers;
 *   wgmma is a warpgroup-wide 64 x N x 16 product fed from shared memory, the only way to
 *   Hopper's full tensor-core rate. Expected: >= 1.3x 06's forward from N = 1024; less at d = 128,
 *   N = 512, where a block has few tiles to amortise its setup (docs/07_wgmma.md's tables).
 * Memory: nothing beyond L. Shared memory per block: Q_i + STAGES x (K_j + V_j), 160 KiB at
 *   d = 128, 80 KiB at 64, 192 KiB at 256.
 * Forward only; GPUs of compute capability 9.0 only (sm_90a code).
 *
 * Run: make build/07_wgmma && build/07_wgmma --seqlen 8192 --dim 128 --check --bench
 */
#include <stdio.h>
#include "attn_device.cuh"
#include "mma.cuh"
#include "hopper.cuh"

#define QUAD    4     /* lanes that share a row of an accumulator */
#define Br      128   /* query rows per block: a Q_i tile */
#define Bc(d)   ((d) <= 128 ? 128 : 64)   /* keys per K_j, V_j tile */
#define WGS     (Br / WG_ROWS)            /* warpgroups per block, 64 query rows each */
#define THREADS (WGS * WARPGROUP)
#define STAGES  2     /* K_j, V_j buffers in the ring */
#define BLOCKS_PER_SM(d) ((d) == 64 ? 2 : 1)
#define MMA_N   8     /* columns of an accumulator tile (the layout is mma.sync's m16n8) */
#define CHUNK   8     /* 16-bit elements in 16 bytes */
#define D_MAX   256   /* largest head dim supported */

/* Dynamic shared memory, 16-bit tiles of 64-column boxes (hopper.cuh): Q_i [Br][d], then
 * STAGES x (K_j [Bc][d], V_j [Bc][d]), then the mbarriers: Q's, and one per stage. */
static size_t smem_bytes(int d)
{
    return (size_t)(Br + STAGES * 2 * Bc(d)) * d * 2 + (1 + STAGES) * sizeof(uint64_t);
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

/* Byte offset of 16-byte chunk c (columns 8c .. 8c+7) of row r in a tile of `rows` rows made
 * of 64-column boxes: box c / 8, chunk c % 8 of the row there, swizzled as the TMA wrote it. */
static __device__ __forceinline__ uint32_t tile_at(int r, int c, int rows)
{
    return (c / CHUNK) * rows * BOX_ROW + box_swz(r, c % CHUNK);
}

/* Issue the TMA loads of K_j and V_j (keys j0 .. j0+Bc-1 of kv head h_kv) into a stage and arm
 * its barrier with their bytes. One thread. */
static __device__ __forceinline__ void load_kv(uint32_t K_j, uint32_t bar, const CUtensorMap *tmK,
                                               const CUtensorMap *tmV, int b, int h_kv, int j0,
                                               int d)
{
    const int bc = Bc(d), tile_bytes = bc * d * 2;
    mbar_arrive_expect_tx(bar, 2 * tile_bytes);
    for (int c = 0; c < d / BOX_COLS; c++) {
        tma_load_4d(K_j + c * bc * BOX_ROW, tmK, c * BOX_COLS, j0, h_kv, b, bar);
        tma_load_4d(K_j + tile_bytes + c * bc * BOX_ROW, tmV, c * BOX_COLS, j0, h_kv, b, bar);
    }
}

/* Epilogue, 16 bytes a store: a warp puts its accumulators, rounded in pairs, into its own rows
 * of the Q_i tile (put_pair: row r, columns col, col + 1), then copies rows r0 .. r0+rows-1
 * to rows n0 + r of head h of x ([B, N, heads, d]) (store_rows); rows past N are not written.
 * Only the warp's own rows are read back, so __syncwarp() between the two is enough. */
static __device__ __forceinline__ void put_pair(int r, int col, uint32_t v)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    *(uint32_t *)(smem + tile_at(r, col / CHUNK, Br) + col % CHUNK * 2) = v;
}

static __device__ __forceinline__ void store_rows(void *x, int r0, int rows, int b, int n0,
                                                  int N, int h, int heads, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int lane = threadIdx.x % WARP, chunks = d / CHUNK;
#pragma unroll
    for (int it = 0; it < rows * chunks / WARP; it++) {
        const int e = it * WARP + lane, r = r0 + e / chunks, c = e % chunks;
        if (n0 + r < N)
            *(uint4 *)((uint16_t *)x + attn_row(b, n0 + r, h, N, heads, d) + c * CHUNK) =
                *(const uint4 *)(smem + tile_at(r, c, Br));
    }
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

/* One block: query tile i0 .. i0+Br-1 of head h, batch b. Warpgroup g owns rows 64g .. 64g+63;
 * in its m64 x n accumulators, warp w (of the warpgroup) and lane l hold rows 16w + l/4 and
 * 16w + l/4 + 8, columns 8n + 2(l%4) + {0, 1} of every 8-column tile n: the layout of 06's
 * m16n8 tiles, so its softmax code applies as it was. d and fp16 are literals at each call site. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const CUtensorMap *tmQ,
                                                       const CUtensorMap *tmK,
                                                       const CUtensorMap *tmV, const int d,
                                                       const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int bc = Bc(d), tile_bytes = bc * d * 2;
    const uint32_t Q_i = smem_u32(smem);                /* [Br][d] */
    const uint32_t KV = Q_i + Br * d * 2;               /* stage s: K_j at KV + 2s tile_bytes, V_j next */
    const uint32_t bar_q = KV + STAGES * 2 * tile_bytes; /* then full[s] at bar_q + 8 (1 + s) */

    const int wg = threadIdx.x / WARPGROUP, warp = threadIdx.x / WARP % 4, lane = threadIdx.x % WARP;
    const int b = blockIdx.z, h = blockIdx.y;
    /* Causal tiles grow with i: the last ones are launched first, the small ones fill the tail. */
    const int i0 = (p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x) * Br;
    const int h_kv = h / (p.H / p.H_kv);
    const float scale_log2 = p.scale * LOG2E;

    const int last_row = min(i0 + Br, p.N_q) - 1;
    const int n_keys = visible_keys(p, last_row);
    const int Tc = (n_keys + bc - 1) / bc;

    /* The barriers: Q's, and one per stage, each completed by one arrive (the loading thread's)
     * plus the bytes of its TMA copies. Then Q_i and the first STAGES - 1 tiles of K, V. */
    if (threadIdx.x == 0) {
        if (Q_i % SWIZZLE_ATOM) hopper_fail();   /* the swizzled boxes need 1024-byte alignment */
        for (int s = 0; s <= STAGES; s++) mbar_init(bar_q + 8 * s, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar_q, Br * d * 2);
        for (int c = 0; c < d / BOX_COLS; c++)
            tma_load_4d(Q_i + c * Br * BOX_ROW, tmQ, c * BOX_COLS, i0, h, b, bar_q);
        for (int j = 0; j < STAGES - 1 && j < Tc; j++)
            load_kv(KV + j * 2 * tile_bytes, bar_q + 8 * (1 + j), tmK, tmV, b, h_kv, j * bc, d);
    }

    float o[D_MAX / MMA_N][4];
    float m[2], l[2];   /* running max (log2 domain) and this lane's part of the sum */
#pragma unroll
    for (int r = 0; r < 2; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
#pragma unroll
    for (int n = 0; n < D_MAX / MMA_N; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[n][c] = 0.0f;
    const int row0 = i0 + wg * WG_ROWS;                /* this warpgroup's first row */
    const int row = row0 + warp * 16 + lane / QUAD;    /* + 8 {0, 1} */

    /* Descriptors (hopper.cuh) of this warpgroup's Q_i rows and of stage 0's K_j, V_j; k-steps
     * and stages move the start address only. */
    const uint64_t dQ = wgmma_desc(Q_i + wg * WG_ROWS * BOX_ROW, 16, SWIZZLE_ATOM);
    const uint64_t dK = wgmma_desc(KV, 16, SWIZZLE_ATOM);
    const uint64_t dV = wgmma_desc(KV + tile_bytes, bc * BOX_ROW, SWIZZLE_ATOM);
    mbar_wait(bar_q, 0);

    for (int j = 0; j < Tc; j++) {
        const int j0 = j * bc, st = j % STAGES;
        /* Every warpgroup is done with tile j - 1: its stage takes tile j + STAGES - 1. */
        __syncthreads();
        if (threadIdx.x == 0 && j + STAGES - 1 < Tc) {
            const int nx = (j + STAGES - 1) % STAGES;
            load_kv(KV + nx * 2 * tile_bytes, bar_q + 8 * (1 + nx), tmK, tmV, b, h_kv,
                    j0 + (STAGES - 1) * bc, d);
        }
        /* Causal: a tile wholly above this warpgroup's rows (only the last ones can be) is
         * skipped, which leaves the barrier's later phases untouched. */
        if (p.causal && j0 > row0 + WG_ROWS - 1) continue;
        mbar_wait(bar_q + 8 * (1 + st), (j / STAGES) & 1);
        const uint64_t stage = (uint64_t)(st * 2 * tile_bytes) >> 4;   /* in descriptor units */

        /* S_ij = Q_i K_jᵀ: d/16 wgmmas, each a k-step of 16 columns of both tiles: 32 bytes
         * further inside a box, or the next box (rows x 128 bytes on) every 4 steps. */
        float s[128 / MMA_N][4];
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < d / WGMMA_K; k++) {
            const int box = k * WGMMA_K / BOX_COLS, in_box = k * WGMMA_K % BOX_COLS * 2;
            const uint64_t a_k = dQ + ((box * Br * BOX_ROW + in_box) >> 4);
            const uint64_t b_k = dK + stage + ((box * bc * BOX_ROW + in_box) >> 4);
            if (bc == 128) wgmma_ss_n128(&s[0][0], a_k, b_k, k > 0, fp16);
            else           wgmma_ss_n64(&s[0][0], a_k, b_k, k > 0, fp16);
        }
        wgmma_commit();
        wgmma_wait_0();
        wgmma_hold(&s[0][0], bc / 2);

        if (j0 + bc > p.N_k || (p.causal && j0 + bc - 1 > row0))
            mask_scores(s, bc / MMA_N, row, j0 + 2 * (lane % QUAD), p.N_k, p.causal);

        /* Online softmax in the log2 domain, as in 06: m holds max(S) * scale * log2(e). */
        float alpha[2], m_use[2], l_tile[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < bc / MMA_N; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            const float m_new = fmaxf(m[r], row_max(mx) * scale_log2);
            /* A row that has seen only masked keys has m_new = -inf: subtract 0 instead, so
             * that exp2 gives 0 rather than exp2(-inf - -inf) = NaN. */
            m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = exp2_fast(m[r] - m_use[r]);   /* 0 on the first tile, 1 if m is unchanged */
            m[r] = m_new;
            l_tile[r] = 0.0f;
        }
#pragma unroll
        for (int n = 0; n < bc / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                s[n][c] = exp2_fast(fmaf(s[n][c], scale_log2, -m_use[c / 2]));   /* P_ij */
                l_tile[c / 2] += s[n][c];
            }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = alpha[r] * l[r] + l_tile[r];
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++) {
            o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
            o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
        }

        /* O_i += P_ij V_j. Accumulator tiles 2k, 2k+1 of S (keys 16k..16k+15), rounded in
         * pairs, are exactly the register A operand of k-step k; V_j's k-step k starts 16 rows
         * (2048 bytes) further, its 64-column boxes bc x 128 bytes apart (the leading offset). */
        uint32_t pa[128 / 16][4];
#pragma unroll
        for (int k = 0; k < bc / 16; k++) {
            pa[k][0] = pack_x2(s[2 * k][0], s[2 * k][1], fp16);
            pa[k][1] = pack_x2(s[2 * k][2], s[2 * k][3], fp16);
            pa[k][2] = pack_x2(s[2 * k + 1][0], s[2 * k + 1][1], fp16);
            pa[k][3] = pack_x2(s[2 * k + 1][2], s[2 * k + 1][3], fp16);
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < bc / WGMMA_K; k++) {
            const uint64_t b_k = dV + stage + ((k * WGMMA_K * BOX_ROW) >> 4);
            if (d == 64)       wgmma_rs_n64(&o[0][0], pa[k], b_k, 1, fp16);
            else if (d == 128) wgmma_rs_n128(&o[0][0], pa[k], b_k, 1, fp16);
            else               wgmma_rs_n256(&o[0][0], pa[k], b_k, 1, fp16);
        }
        wgmma_commit();
        wgmma_wait_0();
        wgmma_hold(&o[0][0], d / 2);
    }

    /* O_i = O_i / l_i and L_i = (m_i + log2 l_i) ln 2, written once. Every real row sees
     * key 0, so l_i >= 1 and L_i is finite; rows past N_q are not stored. O_i goes out through
     * this warp's rows of the Q_i tile: its last reader, this warpgroup's last S product, is
     * complete, and no other warp reads those rows. */
    const int r_warp = wg * WG_ROWS + warp * 16;   /* the warp's first row in the tile */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float l_row = row_sum(l[r]);
        const int i = row + 8 * r;
        const float inv_l = 1.0f / l_row;
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++)
            put_pair(i - i0, n * MMA_N + 2 * (lane % QUAD),
                     pack_x2(o[n][2 * r] * inv_l, o[n][2 * r + 1] * inv_l, fp16));
        if (lane % QUAD == 0 && i < p.N_q)
            a.lse[((size_t)b * p.H + h) * p.N_q + i] = (m[r] + log2f(l_row)) * LN2;
    }
    __syncwarp();
    store_rows(a.o, r_warp, 16, b, i0, p.N_q, h, p.H, d);
}

/* One kernel per head dim and dtype, each with literals inside. The tensor maps are kernel
 * parameters (__grid_constant__: the TMA unit reads them from the parameter space). Blocks of
 * 8 warps, BLOCKS_PER_SM(d) an SM: one, up to 255 registers a thread; two at d = 64, 128. */
typedef void (*attention_fn)(attn_problem, attn_args, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap);
#define KERNEL(name, d, fp16)                                                                   \
    static __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM(d))                         \
    name(attn_problem p, attn_args a, const __grid_constant__ CUtensorMap tmQ,                   \
         const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV)       \
    { tiled_attention(p, a, &tmQ, &tmK, &tmV, d, fp16); }
KERNEL(attention_64_bf16, 64, 0)
KERNEL(attention_64_fp16, 64, 1)
KERNEL(attention_128_bf16, 128, 0)
KERNEL(attention_128_fp16, 128, 1)
KERNEL(attention_256_bf16, 256, 0)
KERNEL(attention_256_fp16, 256, 1)

static attention_fn pick_forward(const attn_problem *p)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64) return fp16 ? attention_64_fp16 : attention_64_bf16;
    if (p->d == 128) return fp16 ? attention_128_fp16 : attention_128_bf16;
    return fp16 ? attention_256_fp16 : attention_256_bf16;
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    (void)dir;   /* no backward: the harness refuses --backward before asking */
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        snprintf(why, ATTN_WHY_LEN, "07_wgmma cannot query the device");
        return 1;
    }
    if (major != 9 || minor != 0) {
        snprintf(why, ATTN_WHY_LEN, "stage 07_wgmma is sm_90a code (wgmma, TMA): it runs on compute "
                 "capability 9.0 (H100, H200) only, this GPU is %d.%d", major, minor);
        return 1;
    }
    if (p->d != 64 && p->d != 128 && p->d != 256) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 07_wgmma supports 64, 128 and 256", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 07_wgmma needs a positive scale", p->scale);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "07_wgmma cannot query the device");
        return 1;
    }
    const size_t smem = smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 07_wgmma", p->d, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

/* Nothing beyond L. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)p; (void)dir;
    return 0;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    const attention_fn kernel = pick_forward(p);
    /* Tensor maps: Q in boxes of Br rows, K and V in boxes of Bc keys, 64 columns each. */
    CUtensorMap tmQ, tmK, tmV;
    if (hopper_tensor_map(&tmQ, a->q, p->dtype, p->d, p->N_q, p->H, p->B, Br) ||
        hopper_tensor_map(&tmK, a->k, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)) ||
        hopper_tensor_map(&tmV, a->v, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)))
        return cudaErrorInvalidValue;
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(attn_ceil_div(p->N_q, Br), p->H, p->B);
    kernel<<<grid, THREADS, smem, s>>>(*p, *a, tmQ, tmK, tmV);
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_07_wgmma = {
    "07_wgmma",
    "FlashAttention-2's forward on Hopper: TMA loads on mbarriers, wgmma from shared memory, P in registers",
    "head dim 64, 128 or 256; bf16, fp16; any N; causal; GQA; forward only; compute capability 9.0 only",
    90,
    check,
    workspace,
    forward,
    NULL,
};
