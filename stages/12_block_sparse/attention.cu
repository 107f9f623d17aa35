/* stages/12_block_sparse/attention.cu: block-sparse and sliding-window FlashAttention-2
 * (mma.sync, sm_80 and up).
 *
 * Changed from 06_fa2: the same kernels, told which tiles to skip. A tile that the mask zeroes
 * costs neither a load nor a product, so time falls with the density while the answer stays
 * exact (FA-1 section 3.3: IO Θ(Nd + N²d²s/M) for a fraction s of nonzero blocks).
 * - Masks (attn.h): causal, a window W (--window) and a block mask of 128 x 128 tiles per
 *   (batch, head) (--mask, --block-mask), ANDed; visible_keys gives a row's keys [lo, hi).
 * - Tile lists (build_list): a bitmap of the mask tiles to visit and one of those the window,
 *   the diagonal or N_k cut; only cut tiles run mask code (forward_step and backward_step each
 *   have a copy with it and one without). The backward has such lists per key tile (next_step).
 * - Registers: build_list is out of line and the d = 128 forward keeps its row sums in shared
 *   memory (with them in registers it spills). An all-ones mask gives 06's bits. A row that
 *   sees no key gets O = 0 and L = -inf; its P is 0 in the backward.
 * Why: sliding windows, local + global tokens and random blocks are where exact attention does
 *   a fraction of the work, if the kernel skips what the mask zeroes.
 * Time: falls with the density; below dense 06_fa2's rate on the visible pairs, the more so
 *   the sparser the mask (docs/12_block_sparse.md, generated).
 * Memory: as 06_fa2, plus in shared memory the lists (two words per 32 mask tiles, per query
 *   head in the backward) and the forward's row sums (2 KiB at every d, used at d = 128).
 * Run: make build/12_block_sparse && build/12_block_sparse --seqlen 8192 --dim 128 \
 *      --mask random:0.25 --check --bench --backward   (or --causal --window 1024; --block-mask F.npy)
 */
#include <limits.h>
#include <stdio.h>
#include "attn_device.cuh"
#include "mma.cuh"
#include "mma_tiles.cuh"

#define QUAD    4     /* lanes that share a row of an mma accumulator */
#define Br      128   /* query rows per forward block: a Q_i tile */
#define Bc      64    /* keys per K_j, V_j tile */
#define THREADS 128   /* 4 warps of 32 query rows */
#define MT      2     /* 16-row mma tiles per warp in the forward */
#define MMA_M   16    /* an m16n8k16 tile: rows of A and C */
#define MMA_N   8     /* columns of B and C */
#define MMA_K   16    /* the reduction step */
#define D_MAX   128   /* largest head dim supported */
#define MASK_TILE ATTN_MASK_TILE   /* 128: a block-mask entry covers 128 queries x 128 keys */

/* Dynamic shared memory of the forward, 16-bit: Q_i [Br][d], then two stages of
 * K_j [Bc][d], V_j [Bc][d], then the row sums (fp32, 4 a thread; used at d = 128 only); the
 * tile list follows (list_bytes). */
static __host__ __device__ __forceinline__ size_t smem_bytes(int d)
{
    return (size_t)(Br + 2 * 2 * Bc) * d * 2 + THREADS * 4 * sizeof(float);
}

/* Words of one bitmap of a tile list: a bit per mask tile of the keys (keys = 1: a Q-outer
 * block, the forward and the deterministic dQ kernel) or of the queries (a K/V-outer backward
 * block has a list per query head of its GQA group). */
static __host__ __device__ __forceinline__ int list_words(const attn_problem *p, int keys)
{
    const int tiles = ((keys ? p->N_k : p->N_q) + MASK_TILE - 1) / MASK_TILE;
    return (tiles + WARP - 1) / WARP;
}

/* Shared memory of a block's tile list: two bitmaps (build_list), per query head of the GQA group
 * in the backward. */
static size_t list_bytes(const attn_problem *p, int keys)
{
    return (size_t)(keys ? 1 : p->H / p->H_kv) * 2 * list_words(p, keys) * sizeof(uint32_t);
}

/* Keys that query i sees, lo <= j < hi (attn.h): all N_k, keys 0 .. i when causal, and with a
 * window W also i - W < j (and without causal j < i + W). Both ends grow with i and stay in
 * 0 .. N_k: a row past N_k + W - 1 sees no key (lo = hi = N_k), and a list of its keys' tiles
 * has none past the mask's last column. */
static __device__ __forceinline__ void visible_keys(const attn_problem p, int i, int *lo, int *hi)
{
    int a = 0, e = p.N_k;
    if (p.causal) e = min(i + 1, e);
    if (p.window > 0) {
        a = min(max(a, i - p.window + 1), p.N_k);
        if (!p.causal) e = min(e, i + p.window);
    }
    *lo = a;
    *hi = max(a, e);
}

/* The query rows that see some key of j0 .. j1-1 (the inverse of visible_keys, which is
 * monotone): q_lo <= i < q_hi. */
static __device__ __forceinline__ void visible_queries(const attn_problem p, int j0, int j1,
                                                       int *q_lo, int *q_hi)
{
    int a = 0, e = p.N_q;
    if (p.causal) a = j0;                                  /* hi(i) = i + 1 > j0 */
    else if (p.window > 0) a = max(0, j0 - p.window + 1);  /* hi(i) = i + W > j0 */
    if (p.window > 0) e = min(e, j1 + p.window - 1);       /* lo(i) = i - W + 1 < j1 */
    *q_lo = min(a, p.N_q);
    *q_hi = max(*q_lo, e);
}

/* ---- Tile lists ------------------------------------------------------------------------------ */

/* Entry (tq, 0) of the block mask of (b, h), broadcast over its batch and head extents (attn.h);
 * NULL without a mask (every tile visible). */
static __device__ __forceinline__ const unsigned char *mask_row(const attn_problem p,
                                                                const attn_args a, int b, int h,
                                                                int tq)
{
    if (!a.block_mask) return NULL;
    const int Tq = (p.N_q + MASK_TILE - 1) / MASK_TILE, Tk = (p.N_k + MASK_TILE - 1) / MASK_TILE;
    const size_t bh = (size_t)(p.bm_b == 1 ? 0 : b) * p.bm_h + (p.bm_h == 1 ? 0 : h);
    return a.block_mask + (bh * Tq + tq) * Tk;
}

/* 1 iff some row of first .. last does not see all of the keys j0 .. j1-1: a step over them
 * needs the mask. Both ends of the visible keys grow with the row, so the first and the last
 * row decide. */
static __device__ __forceinline__ int needs_mask(const attn_problem p, int first, int last,
                                                 int j0, int j1)
{
    int lo_first, hi_first, lo_last, hi_last;
    visible_keys(p, first, &lo_first, &hi_first);
    visible_keys(p, last, &lo_last, &hi_last);
    return j0 < lo_last || j1 > hi_first;
}

/* The tile list: two bitmaps, their words interleaved (word w of the first at list[2w], of the
 * second at list[2w + 1]). Bit t of the first is set iff mask tile t, t0 <= t < t1, is to be
 * visited: its entry (at first[t * stride]) is 1, or always without a mask (first NULL); bit t
 * of the second iff it is visited and needs the mask (needs_mask) for rows r0 .. r1 (the
 * block's, or mask tile t's when along_keys is 0) and keys k0 .. k1-1 (mask tile t's when
 * along_keys, or the block's). FlexAttention's block masks keep the same two lists (partial
 * and full blocks). Each warp takes 32 tiles at a time and writes a ballot per bitmap; only the
 * words of t0 .. t1-1 are written. The caller synchronises. */
static __device__ __noinline__ void build_list(int list, const unsigned char *first,
                                                  size_t stride, int t0, int t1, const attn_problem p,
                                                  int r0, int r1, int k0, int k1, int along_keys,
                                                  int threads)
{
    extern __shared__ __align__(1024) uint32_t smem_words[];
    const int lane = threadIdx.x % WARP;
    for (int base = t0 / WARP * WARP + threadIdx.x - lane; base < t1; base += threads) {
        const int t = base + lane;
        const int on = t >= t0 && t < t1 && (first == NULL || first[t * stride] != 0);
        if (along_keys) { k0 = t * MASK_TILE; k1 = k0 + MASK_TILE; }
        else { r0 = t * MASK_TILE; r1 = min(r0 + MASK_TILE, p.N_q) - 1; }
        const uint32_t visit = __ballot_sync(0xffffffffu, on);
        const uint32_t cut = __ballot_sync(0xffffffffu, on && needs_mask(p, r0, r1, k0, k1));
        if (lane == 0) {
            smem_words[list + 2 * (base / WARP)] = visit;
            smem_words[list + 2 * (base / WARP) + 1] = cut;
        }
    }
}

/* 1 iff mask tile t of the list needs the mask. */
static __device__ __forceinline__ int cut_tile(int list, int t)
{
    extern __shared__ __align__(1024) uint32_t smem_words[];
    return (smem_words[list + 2 * (t / WARP) + 1] >> (t % WARP)) & 1;
}

/* The first tile j' >= j, j' < end, of MASK_TILE / per rows or keys whose mask tile is in the
 * list, or end; one word (32 mask tiles) at a time. j and end lie in the listed tiles' range. */
static __device__ __forceinline__ int next_tile(int list, int j, int end, int per)
{
    extern __shared__ __align__(1024) uint32_t smem_words[];
    while (j < end) {
        const int t = j / per;
        const uint32_t w = smem_words[list + 2 * (t / WARP)] >> (t % WARP);
        if (w) return min(end, max(j, (t + __ffs(w) - 1) * per));
        j = (t / WARP + 1) * WARP * per;   /* the first tile of the next word */
    }
    return end;
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

/* The keys of row r that causal and the window leave visible, as offsets from the diagonal:
 * key k is visible iff k < N_k and lo <= k - r <= hi (visible_keys element by element). causal
 * gives hi = 0, a window W lo = 1 - W (without causal also hi = W - 1). Computed on the host
 * and passed to the kernels by value, so that mask_scores compares with kernel parameters
 * (constant memory), not with values the loop would hold in registers: registers are what
 * the d = 128 forward runs short of. */
typedef struct { int lo, hi; } band;

static band diagonal_band(const attn_problem *p)
{
    band w;
    w.lo = p->window > 0 ? 1 - p->window : INT_MIN;
    w.hi = p->causal ? 0 : p->window > 0 ? p->window - 1 : INT_MAX;
    return w;
}

/* Scores a query must not see become -inf: keys past N_k and outside the band w. s holds
 * n_tiles accumulator tiles along the keys; this thread's entries are rows row and row + 8,
 * keys key + MMA_N * n + {0, 1}. */
static __device__ __forceinline__ void mask_scores(float s[][4], int n_tiles, int row, int key,
                                                   int N_k, const band w)
{
#pragma unroll
    for (int n = 0; n < n_tiles; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int k = key + MMA_N * n + c % 2, r = row + 8 * (c / 2);
            if (k >= N_k || k - r < w.lo || k - r > w.hi) s[n][c] = -INFINITY;
        }
}

/* One step of the forward: S_ij = Q_i K_jᵀ, the online softmax, O_i += P_ij V_j, for this warp's
 * 32 rows (this lane's: row + 16 mt + 8 {0, 1}) and keys j0 .. j0+Bc-1 (K_j, V_j in shared
 * memory); m, l (or l_sm at d = 128) and o carry from step to step. masked is a literal at
 * each call, as in the backward's step: a full tile runs a copy without mask code. */
static __device__ __forceinline__ void forward_step(const attn_problem *p, const band w,
                                                    float o[MT][D_MAX / MMA_N][4], float m[2 * MT],
                                                    float l[2 * MT], float4 *l_sm, uint32_t Q_i,
                                                    uint32_t K_j, uint32_t V_j, int row, int j0,
                                                    const int d, const int fp16, const int masked)
{
    const int row_bytes = 2 * d, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const float scale_log2 = p->scale * LOG2E;
    /* S_ij = Q_i K_jᵀ for this warp's 32 rows. Q_i fragments are re-read from shared
     * memory every tile: 32 rows of them would take 64 registers for the whole loop. */
    float s[MT][Bc / MMA_N][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < Bc / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[mt][n][c] = 0.0f;
#pragma unroll
    for (int k = 0; k < d / MMA_K; k++) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldsm_a(qa[mt], Q_i, row_bytes, (warp * MT + mt) * MMA_M, k * MMA_K);
#pragma unroll
        for (int n = 0; n < Bc / MMA_N; n += 2) {
            uint32_t kb[4];
            ldsm_b(kb, K_j, row_bytes, n * MMA_N, k * MMA_K);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(s[mt][n], qa[mt], kb[0], kb[1], fp16);
                mma_16816(s[mt][n + 1], qa[mt], kb[2], kb[3], fp16);
            }
        }
    }
    if (masked)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            mask_scores(s[mt], Bc / MMA_N, row + mt * MMA_M, j0 + 2 * (lane % QUAD), p->N_k, w);

    /* Online softmax in the log2 domain: m holds max(S) * scale * log2(e) (scale > 0),
     * so P = exp2(S * scale_log2 - m) is one FFMA and one ex2 per score. */
    float alpha[2 * MT], m_use[2 * MT], l_tile[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        const int mt = r / 2, hf = r % 2;
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < Bc / MMA_N; n++)
            mx = fmaxf(mx, fmaxf(s[mt][n][2 * hf], s[mt][n][2 * hf + 1]));
        const float m_new = fmaxf(m[r], row_max(mx) * scale_log2);
        /* A row that has seen only masked keys has m_new = -inf: subtract 0 instead, so
         * that exp2 gives 0 rather than exp2(-inf - -inf) = NaN. */
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = exp2_fast(m[r] - m_use[r]);   /* 0 on the first tile, 1 if m is unchanged */
        m[r] = m_new;
        l_tile[r] = 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < Bc / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = 2 * mt + c / 2;
                s[mt][n][c] = exp2_fast(fmaf(s[mt][n][c], scale_log2, -m_use[r]));   /* P_ij */
                l_tile[r] += s[mt][n][c];
            }
    if (d == 128) {
        float4 v = *l_sm;
        v.x = alpha[0] * v.x + l_tile[0]; v.y = alpha[1] * v.y + l_tile[1];
        v.z = alpha[2] * v.z + l_tile[2]; v.w = alpha[3] * v.w + l_tile[3];
        *l_sm = v;
    } else {
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) l[r] = alpha[r] * l[r] + l_tile[r];
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++) {
            o[mt][n][0] *= alpha[2 * mt];     o[mt][n][1] *= alpha[2 * mt];
            o[mt][n][2] *= alpha[2 * mt + 1]; o[mt][n][3] *= alpha[2 * mt + 1];
        }

    /* O_i += P_ij V_j. Accumulator tiles 2k, 2k+1 of S (keys 16k..16k+15), rounded in
     * pairs, are exactly the A fragment of reduction step k: P stays in registers. */
#pragma unroll
    for (int k = 0; k < Bc / MMA_K; k++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pa[mt][0] = pack_x2(s[mt][2 * k][0], s[mt][2 * k][1], fp16);
            pa[mt][1] = pack_x2(s[mt][2 * k][2], s[mt][2 * k][3], fp16);
            pa[mt][2] = pack_x2(s[mt][2 * k + 1][0], s[mt][2 * k + 1][1], fp16);
            pa[mt][3] = pack_x2(s[mt][2 * k + 1][2], s[mt][2 * k + 1][3], fp16);
        }
#pragma unroll
        for (int n = 0; n < d / MMA_N; n += 2) {
            uint32_t vb[4];
            ldsm_b_t(vb, V_j, row_bytes, k * MMA_K, n * MMA_N);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(o[mt][n], pa[mt], vb[0], vb[1], fp16);
                mma_16816(o[mt][n + 1], pa[mt], vb[2], vb[3], fp16);
            }
        }
    }
}

/* One block: query tile i0 .. i0+Br-1 of head h, batch b. Warp w owns query rows
 * 32w..32w+31 as MT = 2 mma tiles of 16 rows, so every K_j or V_j fragment read from shared
 * memory feeds two mmas. In an accumulator tile lane l holds rows l/4 and l/4 + 8, columns
 * 2*(l%4) + {0, 1}: row index r = 2 mt + {0, 1} below is row l/4 + 16 mt + 8 {0, 1}.
 * d and fp16 are literals at each call site: register arrays sized, loops unrolled, one
 * mma instruction per dtype. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const band w, const int d, const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int row_bytes = 2 * d, tile_bytes = Bc * row_bytes;
    const uint32_t Q_i = smem_u32(smem);            /* [Br][d] */
    const uint32_t KV = Q_i + Br * row_bytes;       /* stage s: K_j at KV + 2s tile_bytes, V_j next */
    const int list = smem_bytes(d) / 4;   /* the key tiles to visit: words of shared memory */

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int b = blockIdx.z, h = blockIdx.y;
    /* Causal tiles grow with i: the last ones are launched first, the small ones fill the tail. */
    const int i0 = (p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x) * Br;
    const int h_kv = h / (p.H / p.H_kv);

    /* The rows see keys lo .. hi-1 at most (the first row's lo, the last row's hi): only the
     * mask tiles of those keys can be in the list, and no K_j tile outside them is loaded. */
    const int last_row = min(i0 + Br, p.N_q) - 1;
    int lo, hi, unused;
    visible_keys(p, i0, &lo, &unused);
    visible_keys(p, last_row, &unused, &hi);
    const int j_end = (hi + Bc - 1) / Bc;

    load_tiles(Q_i, a.q, NULL, b, i0, Br, p.N_q, h, p.H, d, THREADS);
    build_list(list, mask_row(p, a, b, h, i0 / MASK_TILE), 1, lo / MASK_TILE,
               (hi + MASK_TILE - 1) / MASK_TILE, p, i0, last_row, 0, 0, 1, THREADS);
    __syncthreads();   /* the list is complete */
    int j = next_tile(list, lo / Bc, j_end, MASK_TILE / Bc);
    if (j < j_end) load_tiles(KV, a.k, a.v, b, j * Bc, Bc, p.N_k, h_kv, p.H_kv, d, THREADS);
    cp_async_commit();

    float o[MT][D_MAX / MMA_N][4];
    /* Running max (log2 domain) and this lane's part of the sum. At d = 128 the sum lives in
     * shared memory (l_sm), not in l: with a register fewer through the loop, that kernel
     * walks the list without spilling. */
    float m[2 * MT], l[2 * MT];
    float4 *l_sm = (float4 *)(smem + smem_bytes(d) - THREADS * 4 * sizeof(float)) + threadIdx.x;
    if (d == 128) *l_sm = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < D_MAX / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) o[mt][n][c] = 0.0f;
    const int row = i0 + warp * MT * MMA_M + lane / QUAD;   /* + 16 mt + 8 {0, 1} */
    const bool empty = j >= j_end;   /* a mask row of zeros: no step at all */

    for (int step = 0; j < j_end; step++) {   /* the step-th tile of the list is K_j, V_j (stage step & 1) */
        const int j0 = j * Bc, j_next = next_tile(list, j + 1, j_end, MASK_TILE / Bc);
        const uint32_t K_j = KV + (step & 1) * 2 * tile_bytes, V_j = K_j + tile_bytes;
        cp_async_wait_all();
        __syncthreads();   /* K_j, V_j have landed for all threads; the last tile's buffer is free */
        if (j_next < j_end) {  /* the next tile of the list loads while this one is computed */
            const uint32_t K_next = KV + ((step + 1) & 1) * 2 * tile_bytes;
            load_tiles(K_next, a.k, a.v, b, j_next * Bc, Bc, p.N_k, h_kv, p.H_kv, d, THREADS);
        }
        cp_async_commit();

        if (cut_tile(list, j0 / MASK_TILE))
            forward_step(&p, w, o, m, l, l_sm, Q_i, K_j, V_j, row, j0, d, fp16, 1);
        else
            forward_step(&p, w, o, m, l, l_sm, Q_i, K_j, V_j, row, j0, d, fp16, 0);
        j = j_next;
    }
    /* After a step nothing is in flight, and each warp goes on to its epilogue as 06's do,
     * without waiting for the others. With an empty list Q_i still is in flight, its rows
     * copied by every warp: all must land before a warp writes O_i over its own. */
    cp_async_wait_all();
    if (empty) __syncthreads();

    /* O_i = O_i / l_i and L_i = (m_i + log2 l_i) ln 2, written once. A row that saw a key has
     * l_i >= 1; one that saw none has l_i = 0 and m_i = -inf: O_i = 0 and L_i = -inf (attn.h),
     * so 1 / l_i is not taken there. Rows past N_q are not stored. O_i goes out through
     * this warp's rows of the Q_i tile, which no other warp reads (__syncwarp: nor does a lane
     * of this one any more, since lanes of a warp are not in lockstep). */
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        const int mt = r / 2, hf = r % 2;
        const float4 v = *l_sm;
        const float l_row = row_sum(d != 128 ? l[r] : r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w);
        const int i = row + mt * MMA_M + 8 * hf;
        const float inv_l = l_row > 0.0f ? 1.0f / l_row : 0.0f;
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++)
            put_pair(0, row_bytes, i - i0, n * MMA_N + 2 * (lane % QUAD),
                     pack_x2(o[mt][n][2 * hf] * inv_l, o[mt][n][2 * hf + 1] * inv_l, fp16));
        if (lane % QUAD == 0 && i < p.N_q)
            a.lse[((size_t)b * p.H + h) * p.N_q + i] = (m[r] + log2f(l_row)) * LN2;
    }
    __syncwarp();
    store_rows(a.o, 0, warp * MT * MMA_M, MT * MMA_M, 0, d, b, i0, p.N_q, h, p.H, d);
}

/* One kernel per head dim and dtype, each with literals inside (one kernel holding all four
 * branches is register-allocated as a whole and spills). Two blocks of 4 warps per SM: up to
 * 255 registers a thread, 2 x (98 KiB + the list) of shared memory at d = 128. */
typedef void (*attention_fn)(attn_problem, attn_args, band);
static __global__ void __launch_bounds__(THREADS, 2) attention_64_bf16(attn_problem p, attn_args a, band w) { tiled_attention(p, a, w, 64, 0); }
static __global__ void __launch_bounds__(THREADS, 2) attention_64_fp16(attn_problem p, attn_args a, band w) { tiled_attention(p, a, w, 64, 1); }
static __global__ void __launch_bounds__(THREADS, 2) attention_128_bf16(attn_problem p, attn_args a, band w) { tiled_attention(p, a, w, 128, 0); }
static __global__ void __launch_bounds__(THREADS, 2) attention_128_fp16(attn_problem p, attn_args a, band w) { tiled_attention(p, a, w, 128, 1); }

static attention_fn pick_forward(const attn_problem *p)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64) return fp16 ? attention_64_fp16 : attention_64_bf16;
    return fp16 ? attention_128_fp16 : attention_128_bf16;
}

/* ---- Backward ------------------------------------------------------------------------------ */

/* The first step (g', s') >= (g, s), heads first, then query tiles s' < s_end (s_begin for a
 * new head), whose mask tile is in head g's list (two bitmaps of `words` words each); g' =
 * group when none is left. */
static __device__ __forceinline__ void next_step(int list, int words, int group,
                                                 int s_begin, int s_end, int per, int *g, int *s)
{
    while (*g < group) {
        *s = next_tile(list + 2 * *g * words, *s, s_end, per);
        if (*s < s_end) return;
        ++*g;
        *s = s_begin;
    }
}

#define BWD_THREADS 256 /* 8 warps */
#define BWD_Bc 128    /* keys per backward block: K_j, V_j stay in shared memory */
#define BWD_BR_MAX 128 /* query rows per step at most (Q_i, dO_i, L_i, D_i, double-buffered) */
#define DQ_Br  64     /* deterministic dQ kernel: query rows per block, 16 per warp */
#define DQ_Bc  64     /* and keys per K_j, V_j tile */
#define DQ_THREADS 128


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

/* Query rows per backward step (br, FA-2's B_r): 64 at d = 128; at d = 64, 128 where the
 * tiles fit (162 KiB: an H100, H200 or A100), since with half-depth products a taller step
 * spreads the per-step work (exponentials, P_ij and dS_ij stores, barriers, atomics) over
 * twice the rows; 64 on GPUs with less shared memory per block (97 KiB: RTX 4090, A6000). */
static int backward_rows(const attn_problem *p)
{
    int smem_max = 0;
    if (p->d == 64 && !attn_smem_per_block(&smem_max) &&
        backward_layout(64, 128).bytes + list_bytes(p, 0) <= (size_t)smem_max)
        return 128;
    return 64;
}

static size_t backward_smem_bytes(const attn_problem *p)
{
    return (size_t)backward_layout(p->d, backward_rows(p)).bytes + list_bytes(p, 0);
}

/* Deterministic dQ kernel: Q_i, dO_i [Br][d] and two stages of K_j, V_j [Bc][d], 16-bit. */
static __host__ __device__ __forceinline__ size_t dq_smem_bytes(int d)
{
    return (size_t)(2 * DQ_Br + 2 * 2 * DQ_Bc) * d * 2;
}

/* Backward workspace: D, fp32 [B, H, N_q] (rounded up to 256 bytes, so that what follows
 * stays aligned), then (atomic dQ only) the fp32 dQ accumulator, see dq_acc_bytes. */
static size_t D_bytes(const attn_problem *p)
{
    const size_t bytes = (size_t)p->B * p->H * p->N_q * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

/* The dQ accumulator holds, for every (b, h) and query tile of br rows, the tile's
 * br x d values in the order the backward's threads hold them in registers: value
 * `slot` of thread t at slot * BWD_THREADS + t. Each atomicAdd instruction of a warp then
 * covers 32 consecutive floats (4 full sectors) instead of 8 half-used ones. */
static size_t dq_acc_bytes(const attn_problem *p)
{
    const int br = backward_rows(p);
    const size_t tiles = (size_t)p->B * p->H * attn_ceil_div(p->N_q, br);
    return p->deterministic ? 0 : tiles * br * p->d * sizeof(float);
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
 * Q_i, dO_i buffers) against this block's K_j, V_j, after starting the loads of the next step
 * (h_next, i_next) into the other stage. masked is a literal: the steps that cross the
 * diagonal or N_k run a copy of this code with the mask, all others a copy without it, which
 * is one stretch of code from the barrier to the atomics, scheduled as a whole (with the
 * mask behind a branch in a single copy, the backward was 3.5% slower: a probe without the
 * mask measured that). See tiled_backward for who owns what. */
static __device__ __forceinline__ void backward_step(const attn_problem *p, const attn_args *a,
                                                     const float *D, float *dq_acc, const band w,
                                                     float dK[2][D_MAX / 16][4],
                                                     float dV[2][D_MAX / 16][4], int st, int h,
                                                     int i0, int h_next, int i_next, const int d,
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
    const int b = blockIdx.z, j0 = blockIdx.x * BWD_Bc;
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
    if (masked)   /* scores the rows must not see start at -inf: the product keeps them there */
#pragma unroll
        for (int mt = 0; mt < MQ; mt++)
            mask_scores(s[mt], 4, i0 + br / 2 * wm + MMA_M * mt + lane / QUAD,
                        j0 + 32 * wn + 2 * (lane % QUAD), p->N_k, w);
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
#pragma unroll
        for (int c = 0; c < 4; c++) {
            /* a row that saw no key (L = -inf) gets P = exp2(-inf) = 0, masked or not */
            const float L = L_i[r0 + 8 * (c / 2)], lse2 = L == -INFINITY ? INFINITY : L * LOG2E;
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

    /* This block's part of dQ_i = dS_ij K_j (unscaled: convert_dq_kernel applies scale). */
    if (dq_acc) {
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
        /* red.global.add.f32, coalesced: see dq_acc_bytes. Rows past N_q add zeros (dO_i
         * and D_i are zero-filled there), so no test is needed. */
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

/* One block: key tile j0 .. j0+Bc-1 of kv head h_kv, batch b (K/V outer, FA-2 Algorithm 2).
 * K_j, V_j stay in shared memory and dK_j, dV_j in registers while the block visits every
 * query head of the GQA group and every query tile Q_i that can see these keys; so dK_j,
 * dV_j come out already summed over the group and are written once. dQ_i is shared by all
 * key tiles: with dq_acc each block adds its part with atomicAdd; without (deterministic),
 * the dq_* kernels compute it. Warp w = (wn, wm) = (w / 2, w % 2) owns
 *   S_ij, dP_ij: queries br/2 wm .. +br/2-1, keys 32 wn .. +31 of the step (br/32 x 4 mma
 *                tiles),
 *   dK_j, dV_j:  keys 32 wn .. +31, columns wm d/2 .. +d/2 (2 x d/16 tiles),
 *   dQ_i:        queries br/2 wm .. +br/2-1, columns wn d/4 .. +d/4 (br/32 x d/32 tiles).
 * br, the query rows per step, is 64 or 128 (backward_rows). */
static __device__ __forceinline__ void tiled_backward(const attn_problem p, const attn_args a,
                                                      const float *D, float *dq_acc, const band w,
                                                      const int d, const int br, const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const bwd_smem m = backward_layout(d, br);
    const int row_bytes = 2 * d;
    const uint32_t K_j = smem_u32(smem);

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wm = warp % 2, wn = warp / 2;
    const int b = blockIdx.z, h_kv = blockIdx.y, j0 = blockIdx.x * BWD_Bc;
    const int group = p.H / p.H_kv;

    /* The rows that see some of these keys are q_lo .. q_hi-1 (visible_queries): the query
     * tiles s_begin .. s_end-1 of br rows. A step is one (query head g of the group, query
     * tile s) pair whose mask tile is in head g's list (two bitmaps of `words` words each),
     * visited heads first, then tiles, as 06 does. */
    int q_lo, q_hi;
    visible_queries(p, j0, min(j0 + BWD_Bc, p.N_k), &q_lo, &q_hi);
    const int s_begin = q_lo / br, per = MASK_TILE / br;
    const int s_end = (q_hi + br - 1) / br;
    const size_t Tk = (p.N_k + MASK_TILE - 1) / MASK_TILE;   /* mask entries a row */
    const int words = list_words(&p, 0);   /* of a bitmap; a head's list has two */
    const int list = m.bytes / 4;   /* words of shared memory */

    load_tiles(K_j, a.k, a.v, b, j0, BWD_Bc, p.N_k, h_kv, p.H_kv, d, BWD_THREADS);
    /* The block's keys j0 .. j0 + BWD_Bc - 1, those past N_k too: at a ragged N_k the last
     * block's tiles are cut, so its zero-padded keys score -inf, not 0 (exp(0 - L) overflows
     * where a row's scores lie far below 0, and dS times a zero K row is then NaN in dQ). */
    for (int g = 0; g < group; g++) {   /* column j0 / MASK_TILE of each head's mask */
        const unsigned char *first = mask_row(p, a, b, h_kv * group + g, 0);
        build_list(list + 2 * g * words, first ? first + j0 / MASK_TILE : NULL, Tk,
                   q_lo / MASK_TILE, (q_hi + MASK_TILE - 1) / MASK_TILE, p, 0, 0, j0,
                   j0 + BWD_Bc, 0, BWD_THREADS);
    }
    __syncthreads();   /* the list is complete */
    int g = 0, s = s_begin;
    next_step(list, words, group, s_begin, s_end, per, &g, &s);
    if (g < group)
        load_step(K_j + m.QdO, K_j + m.LD, &p, &a, D, b, h_kv * group + g, s * br, d, br);
    cp_async_commit();

    float dK[2][D_MAX / 16][4], dV[2][D_MAX / 16][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < D_MAX / 16; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) dK[mt][n][c] = dV[mt][n][c] = 0.0f;

    for (int t = 0; g < group; t++) {
        const int st = t % 2, h = h_kv * group + g, i0 = s * br;   /* step t */
        /* The next step of the list. The last step loads itself once more, into the stage
         * nothing reads: no branch before the mmas. */
        int g_next = g, s_next = s + 1;
        next_step(list, words, group, s_begin, s_end, per, &g_next, &s_next);
        const int h_next = g_next < group ? h_kv * group + g_next : h;
        const int i_next = g_next < group ? s_next * br : i0;
        if (cut_tile(list + 2 * g * words, i0 / MASK_TILE))
            backward_step(&p, &a, D, dq_acc, w, dK, dV, st, h, i0, h_next, i_next, d, br, fp16, 1);
        else
            backward_step(&p, &a, D, dq_acc, w, dK, dV, st, h, i0, h_next, i_next, d, br, fp16, 0);
        g = g_next;
        s = s_next;
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

/* One block per key tile: 161-162 KiB of shared memory allows one per SM anyway, and the
 * dK_j, dV_j accumulators (128 registers a thread at d = 128) need the registers. One kernel per
 * (d, br, dtype): backward_<d>_<br>_<dtype>; d = 64 has both step heights (backward_rows). */
typedef void (*backward_fn)(attn_problem, attn_args, const float *, float *, band);
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_128_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w) { tiled_backward(p, a, D, dq_acc, w, 64, 128, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_128_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w) { tiled_backward(p, a, D, dq_acc, w, 64, 128, 1); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_64_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w)  { tiled_backward(p, a, D, dq_acc, w, 64, 64, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_64_64_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w)  { tiled_backward(p, a, D, dq_acc, w, 64, 64, 1); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_128_64_bf16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w) { tiled_backward(p, a, D, dq_acc, w, 128, 64, 0); }
static __global__ void __launch_bounds__(BWD_THREADS, 1) backward_128_64_fp16(attn_problem p, attn_args a, const float *D, float *dq_acc, band w) { tiled_backward(p, a, D, dq_acc, w, 128, 64, 1); }

static backward_fn pick_backward(const attn_problem *p, int br)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64 && br == 128) return fp16 ? backward_64_128_fp16 : backward_64_128_bf16;
    if (p->d == 64) return fp16 ? backward_64_64_fp16 : backward_64_64_bf16;
    return fp16 ? backward_128_64_fp16 : backward_128_64_bf16;
}

/* Deterministic dQ (Q outer, like the forward): one block per query tile Q_i of DQ_Br rows of
 * head h, warp w owns rows 16w..16w+15 and keeps Q_i, dO_i fragments and the dQ_i accumulator
 * in registers while it walks over K_j, V_j: S_ij, P_ij (from L), dP_ij = dO_i V_jᵀ,
 * dS_ij = P_ij ∘ (dP_ij - D_i), and dQ_i += dS_ij K_j with dS_ij straight from the
 * accumulators as in P V. Each dQ element is summed by one thread in key order. */
static __device__ __forceinline__ void tiled_dq(const attn_problem p, const attn_args a,
                                                const float *D, const band w, const int d,
                                                const int fp16)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int row_bytes = 2 * d, tile_bytes = DQ_Bc * row_bytes;
    const uint32_t Q_i = smem_u32(smem);               /* [Br][d] */
    const uint32_t dO_i = Q_i + DQ_Br * row_bytes;     /* [Br][d] */
    const uint32_t KV = dO_i + DQ_Br * row_bytes;      /* stage s: K_j, V_j */
    const int list = dq_smem_bytes(d) / 4;   /* the key tiles, as the forward's */

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int b = blockIdx.z, h = blockIdx.y;
    const int i0 = (p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x) * DQ_Br;
    const int h_kv = h / (p.H / p.H_kv);
    const float scale_log2 = p.scale * LOG2E;
    const int last_row = min(i0 + DQ_Br, p.N_q) - 1;
    int lo, hi, unused;
    visible_keys(p, i0, &lo, &unused);
    visible_keys(p, last_row, &unused, &hi);
    const int j_end = (hi + DQ_Bc - 1) / DQ_Bc;

    load_tiles(Q_i, a.q, a.d_o, b, i0, DQ_Br, p.N_q, h, p.H, d, DQ_THREADS);
    build_list(list, mask_row(p, a, b, h, i0 / MASK_TILE), 1, lo / MASK_TILE,
               (hi + MASK_TILE - 1) / MASK_TILE, p, i0, last_row, 0, 0, 1, DQ_THREADS);
    __syncthreads();   /* the list is complete */
    int j = next_tile(list, lo / DQ_Bc, j_end, MASK_TILE / DQ_Bc);
    if (j < j_end) load_tiles(KV, a.k, a.v, b, j * DQ_Bc, DQ_Bc, p.N_k, h_kv, p.H_kv, d, DQ_THREADS);
    cp_async_commit();

    const int row = i0 + warp * MMA_M + lane / QUAD;   /* rows row, row + 8 */
    float lse2[2], D_r[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row + 8 * r;
        const size_t e = ((size_t)b * p.H + h) * p.N_q + i;
        const float L = i < p.N_q ? a.lse[e] : 0.0f;
        lse2[r] = L == -INFINITY ? INFINITY : L * LOG2E;   /* a row that saw no key: P = 0 */
        D_r[r] = i < p.N_q ? D[e] : 0.0f;
    }
    cp_async_wait_all();
    __syncthreads();
    uint32_t q[D_MAX / MMA_K][4], g[D_MAX / MMA_K][4];   /* Q_i and dO_i fragments */
#pragma unroll
    for (int k = 0; k < d / MMA_K; k++) {
        ldsm_a(q[k], Q_i, row_bytes, warp * MMA_M, k * MMA_K);
        ldsm_a(g[k], dO_i, row_bytes, warp * MMA_M, k * MMA_K);
    }
    float dq[D_MAX / MMA_N][4];
#pragma unroll
    for (int n = 0; n < D_MAX / MMA_N; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) dq[n][c] = 0.0f;

    for (int step = 0; j < j_end; step++) {
        const int j0 = j * DQ_Bc, j_next = next_tile(list, j + 1, j_end, MASK_TILE / DQ_Bc);
        const uint32_t K_j = KV + (step % 2) * 2 * tile_bytes, V_j = K_j + tile_bytes;
        cp_async_wait_all();
        __syncthreads();
        if (j_next < j_end) {
            const uint32_t K_next = KV + ((step + 1) % 2) * 2 * tile_bytes;
            load_tiles(K_next, a.k, a.v, b, j_next * DQ_Bc, DQ_Bc, p.N_k, h_kv, p.H_kv, d, DQ_THREADS);
        }
        cp_async_commit();

        float s[DQ_Bc / MMA_N][4], dp[DQ_Bc / MMA_N][4];
#pragma unroll
        for (int n = 0; n < DQ_Bc / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[n][c] = dp[n][c] = 0.0f;
        if (cut_tile(list, j0 / MASK_TILE))   /* as in the forward: masked scores start at -inf */
            mask_scores(s, DQ_Bc / MMA_N, row, j0 + 2 * (lane % QUAD), p.N_k, w);
#pragma unroll
        for (int k = 0; k < d / MMA_K; k++)
#pragma unroll
            for (int n = 0; n < DQ_Bc / MMA_N; n += 2) {
                uint32_t kb[4], vb[4];
                ldsm_b(kb, K_j, row_bytes, n * MMA_N, k * MMA_K);
                ldsm_b(vb, V_j, row_bytes, n * MMA_N, k * MMA_K);
                mma_16816(s[n], q[k], kb[0], kb[1], fp16);
                mma_16816(s[n + 1], q[k], kb[2], kb[3], fp16);
                mma_16816(dp[n], g[k], vb[0], vb[1], fp16);
                mma_16816(dp[n + 1], g[k], vb[2], vb[3], fp16);
            }
#pragma unroll
        for (int n = 0; n < DQ_Bc / MMA_N; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float P = exp2_fast(fmaf(s[n][c], scale_log2, -lse2[c / 2]));
                s[n][c] = P * (dp[n][c] - D_r[c / 2]);   /* dS_ij */
            }
#pragma unroll
        for (int k = 0; k < DQ_Bc / MMA_K; k++) {
            const uint32_t sa[4] = {
                pack_x2(s[2 * k][0], s[2 * k][1], fp16), pack_x2(s[2 * k][2], s[2 * k][3], fp16),
                pack_x2(s[2 * k + 1][0], s[2 * k + 1][1], fp16),
                pack_x2(s[2 * k + 1][2], s[2 * k + 1][3], fp16)};
#pragma unroll
            for (int n = 0; n < d / MMA_N; n += 2) {
                uint32_t kb[4];
                ldsm_b_t(kb, K_j, row_bytes, k * MMA_K, n * MMA_N);
                mma_16816(dq[n], sa, kb[0], kb[1], fp16);
                mma_16816(dq[n + 1], sa, kb[2], kb[3], fp16);
            }
        }
        j = j_next;
    }
    cp_async_wait_all();

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row + 8 * r;
        if (i >= p.N_q) continue;
        uint16_t *out = (uint16_t *)a.dq + attn_row(b, i, h, p.N_q, p.H, d) + 2 * (lane % QUAD);
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++)
            *(uint32_t *)(out + n * MMA_N) =
                pack_x2(p.scale * dq[n][2 * r], p.scale * dq[n][2 * r + 1], fp16);
    }
}

/* Two blocks of 4 warps per SM (96 KiB of shared memory each at d = 128). */
typedef void (*dq_fn)(attn_problem, attn_args, const float *, band);
static __global__ void __launch_bounds__(DQ_THREADS, 2) dq_64_bf16(attn_problem p, attn_args a, const float *D, band w)  { tiled_dq(p, a, D, w, 64, 0); }
static __global__ void __launch_bounds__(DQ_THREADS, 2) dq_64_fp16(attn_problem p, attn_args a, const float *D, band w)  { tiled_dq(p, a, D, w, 64, 1); }
static __global__ void __launch_bounds__(DQ_THREADS, 2) dq_128_bf16(attn_problem p, attn_args a, const float *D, band w) { tiled_dq(p, a, D, w, 128, 0); }
static __global__ void __launch_bounds__(DQ_THREADS, 2) dq_128_fp16(attn_problem p, attn_args a, const float *D, band w) { tiled_dq(p, a, D, w, 128, 1); }

static dq_fn pick_dq(const attn_problem *p)
{
    const int fp16 = p->dtype == ATTN_FP16;
    if (p->d == 64) return fp16 ? dq_64_fp16 : dq_64_bf16;
    return fp16 ? dq_128_fp16 : dq_128_bf16;
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
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 12_block_sparse supports 64 and 128", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 12_block_sparse needs a positive scale", p->scale);
        return 1;
    }
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "12_block_sparse cannot query the device");
        return 1;
    }
    const size_t keys_list = list_bytes(p, 1);
    size_t smem = dir == ATTN_BACKWARD ? backward_smem_bytes(p) : smem_bytes(p->d) + keys_list;
    if (dir == ATTN_BACKWARD && p->deterministic && dq_smem_bytes(p->d) + keys_list > smem)
        smem = dq_smem_bytes(p->d) + keys_list;
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d at N_q = %d, N_k = %d needs %zu KiB of shared memory for the tiles and "
                 "the tile list; this GPU gives a block %d KiB, too little for stage 12_block_sparse",
                 p->d, p->N_q, p->N_k, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

#if BWD_Bc != MASK_TILE || Br != MASK_TILE
#error "build_list: a forward block's rows and a backward block's keys must each lie in one mask tile"
#endif

/* Forward: nothing beyond L. Backward: D and (atomic dQ) the fp32 dQ accumulator, both O(N);
 * no N x N buffer, since S_ij and P_ij are recomputed on chip from L. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    return dir == ATTN_BACKWARD ? D_bytes(p) + dq_acc_bytes(p) : 0;
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d) + list_bytes(p, 1);
    const attention_fn kernel = pick_forward(p);
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(attn_ceil_div(p->N_q, Br), p->H, p->B);
    kernel<<<grid, THREADS, smem, s>>>(*p, *a, diagonal_band(p));
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

/* D, then the K/V-outer backward (dK, dV written; dQ accumulated in fp32 with atomics, or
 * skipped), then dQ: scaled and rounded from the accumulator, or the deterministic dq_* kernel. */
static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *D = (float *)a->ws;
    float *dq_acc = p->deterministic ? NULL : (float *)((char *)a->ws + D_bytes(p));
    /* rowdot_kernel: a thread per 8 elements of O, and per 8 floats of the accumulator (which
     * arrives poisoned and must start at zero). */
    const size_t n_chunks = (size_t)p->B * p->H * p->N_q * (p->d / CHUNK);
    const size_t acc_chunks = dq_acc_bytes(p) / sizeof(float) / CHUNK;
    rowdot_kernel<<<attn_blocks_for(n_chunks > acc_chunks ? n_chunks : acc_chunks, THREADS), THREADS, 0, s>>>(
        *p, a->d_o, a->o, D, dq_acc, acc_chunks);
    ATTN_LAUNCH_CHECK();

    const int br = backward_rows(p);
    const size_t smem = backward_smem_bytes(p);
    const backward_fn kernel = pick_backward(p, br);
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(attn_ceil_div(p->N_k, BWD_Bc), p->H_kv, p->B);
    kernel<<<grid, BWD_THREADS, smem, s>>>(*p, *a, D, dq_acc, diagonal_band(p));
    ATTN_LAUNCH_CHECK();

    if (dq_acc) {
        const int tiles = attn_ceil_div(p->N_q, br) * p->H * p->B;   /* a block each */
        convert_dq_kernel<<<tiles, br * (p->d / (2 * CHUNK)), 0, s>>>(*p, br, dq_acc, a->dq);
    } else {
        const size_t dq_smem = dq_smem_bytes(p->d) + list_bytes(p, 1);
        const dq_fn dq = pick_dq(p);
        ATTN_TRY(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem));
        const dim3 dq_grid(attn_ceil_div(p->N_q, DQ_Br), p->H, p->B);
        dq<<<dq_grid, DQ_THREADS, dq_smem, s>>>(*p, *a, D, diagonal_band(p));
    }
    ATTN_LAUNCH_CHECK();
    return cudaSuccess;
}

ATTN_EXPORT const attn_stage stage_12_block_sparse = {
    "12_block_sparse",
    "block-sparse FlashAttention-2: per-tile lists skip the tiles a block mask or a window zeroes",
    "head dim 64 or 128; bf16, fp16; any N; causal, sliding window, block masks; GQA; dQ by fp32 atomics, or deterministic",
    80,
    check,
    workspace,
    forward,
    backward,
    1,
};
