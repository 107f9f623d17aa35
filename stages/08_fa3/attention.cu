/* stages/08_fa3/attention.cu: FlashAttention-3's forward as the paper writes it (sm_90a).
 *
 * Changed from 07_wgmma: the same instructions (TMA, mbarriers, wgmma) and the same grid (one
 * block per query tile), FA-3's schedule (arXiv 2407.08608, §3.1-3.2, Algorithms 1 and 2):
 * - Warp specialisation: a producer warpgroup gives its registers back (setmaxnreg.dec) and one
 *   of its threads issues every TMA load; the consumer warpgroups take them (setmaxnreg.inc)
 *   and only compute. K and V have rings of their own, each stage a `full` mbarrier (the bytes
 *   landed) and an `empty` one (every consumer warp has finished reading it): no block barrier.
 * - Ping-pong: named barriers pass the turn to issue products from one consumer to the next,
 *   so that one warpgroup's softmax runs while another's products run.
 * - Intra-warpgroup overlap: O += P_{j-1} V_{j-1} is issued with S_j = Q K_jᵀ and waited for
 *   after the softmax of S_j, so the exponentials run under the warpgroup's own product.
 * Each idea can be built out for the ablation (make ablation; docs/08_fa3.md):
 *   make build/08_fa3 OFF=ws|pingpong|overlap (a list: OFF=pingpong,overlap).
 * Why: in 07 the tensor cores idle while a warpgroup computes its softmax, and the block waits
 *   at a barrier every tile. Expected: 1.1-1.3x over 07 at d = 128 and 256, less at d = 64
 *   (where 07 runs two blocks per SM); about cuDNN's forward (docs/08_fa3.md's tables).
 * Tiles (the paper's): Br = 128 rows (two consumers, 240 registers a thread) at d = 128 and 256,
 *   192 (three consumers, 160 registers) at d = 64; Bc = 128 keys, 80 at d = 256; 2-stage rings,
 *   one block per SM; the producer keeps 24 registers. Ping-pong is off at d = 256, as in FA-3:
 *   one warpgroup's 128 O registers leave the schedule nothing to gain there.
 * Memory: nothing beyond L. Shared memory: Q_i + 2 x (K_j + V_j): 160 KiB at d = 128, 224 KiB
 *   at d = 256, 88 KiB at d = 64. sm_90a.
 *
 * Run: make build/08_fa3 && build/08_fa3 --seqlen 8192 --dim 128 --check --bench
 *      make build/08_fa3 TRACE=1 && ATTN_TRACE=t.csv build/08_fa3 --seqlen 8192 --dim 128
 */
#include <stdio.h>
#include "attn_device.cuh"
#include "mma.cuh"
#include "hopper.cuh"
#include "trace.cuh"

#define QUAD    4     /* lanes that share a row of an accumulator */
#define Br(d)   ((d) == 64 ? 192 : 128)   /* query rows per block: a Q_i tile */
#define Bc(d)   ((d) <= 128 ? 128 : 80)   /* keys per K_j, V_j tile */
#define CONSUMERS(d) (Br(d) / WG_ROWS)    /* consumer warpgroups, 64 query rows each */
#define THREADS(d) ((1 + CONSUMERS(d)) * WARPGROUP)   /* and the producer (warpgroup 0) */
#define STAGES  2     /* K_j (and V_j) buffers in each ring */
/* Registers a thread after setmaxnreg, producer and consumers: 24 x 128 + 240 x 256 and
 * 24 x 128 + 160 x 384 (three consumers) fit the SM's 64 K. Literals: setmaxnreg takes no
 * variable. */
#define PRODUCER_REGS 24
#define CONSUMER_REGS_2 240
#define CONSUMER_REGS_3 160
#define BAR_TURN 1    /* named barrier BAR_TURN + c: consumer c's turn to issue its products */
#define MMA_N   8     /* columns of an accumulator tile (the layout is mma.sync's m16n8) */
#define CHUNK   8     /* 16-bit elements in 16 bytes */
#define D_MAX   256   /* largest head dim supported */
/* The paper's three ideas, each 1 (on) unless the build turns it off (OFF=..., the ablation). */
#ifndef WS   /* knob: OFF=ws, a consumer thread loads as in 07 */
#define WS 1
#endif
#ifndef PINGPONG   /* knob: OFF=pingpong */
#define PINGPONG 1
#endif
#ifndef OVERLAP   /* knob: OFF=overlap, the softmax waits for both products */
#define OVERLAP 1
#endif

/* Dynamic shared memory, 16-bit tiles of 64-column boxes (hopper.cuh): Q_i [Br][d]; STAGES x K_j
 * [Bc][d]; STAGES x V_j [Bc][d]; then the mbarriers: Q's, and full K, full V, empty K, empty V,
 * STAGES of each. */
typedef struct { uint32_t Q, K, V, bar_q, full_k, full_v, empty_k, empty_v; } fa3_smem;

static __host__ __device__ __forceinline__ size_t smem_bytes(int d)
{
    return (size_t)(Br(d) + STAGES * 2 * Bc(d)) * d * 2 + (1 + 4 * STAGES) * sizeof(uint64_t);
}

static __device__ __forceinline__ fa3_smem smem_layout(int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    fa3_smem m;
    const uint32_t tile = Bc(d) * d * 2;
    m.Q = smem_u32(smem);
    m.K = m.Q + Br(d) * d * 2;
    m.V = m.K + STAGES * tile;
    m.bar_q = m.V + STAGES * tile;
    m.full_k = m.bar_q + 8;
    m.full_v = m.full_k + 8 * STAGES;
    m.empty_k = m.full_v + 8 * STAGES;
    m.empty_v = m.empty_k + 8 * STAGES;
    return m;
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

/* The producer's two steps for tile j of a ring (keys j * Bc .. of kv head h_kv): wait until
 * every consumer warp has released the stage tile j uses (its empty barrier's previous phase;
 * the first lap passes at once), arm the stage's full barrier with the tile's bytes and issue
 * one TMA load per 64-column box. One thread. */
static __device__ __forceinline__ void load_tile(uint32_t ring, uint32_t full, uint32_t empty,
                                                 const CUtensorMap *map, int b, int h_kv, int j,
                                                 int d)
{
    const int bc = Bc(d), tile_bytes = bc * d * 2, s = j % STAGES;
    mbar_wait(empty + 8 * s, (j / STAGES & 1) ^ 1);
    mbar_arrive_expect_tx(full + 8 * s, tile_bytes);
    for (int c = 0; c < d / BOX_COLS; c++)
        tma_load_4d(ring + s * tile_bytes + c * bc * BOX_ROW, map, c * BOX_COLS, j * bc, h_kv, b,
                    full + 8 * s);
}

/* Epilogue, 16 bytes a store: a warp puts its accumulators, rounded in pairs, into its own rows
 * of the Q_i tile (put_pair: row r, columns col, col + 1), then copies rows r0 .. r0+rows-1
 * to rows n0 + r of head h of x ([B, N, heads, d]) (store_rows); rows past N are not written.
 * Only the warp's own rows are read back, so __syncwarp() between the two is enough. */
static __device__ __forceinline__ void put_pair(int r, int col, uint32_t v, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    *(uint32_t *)(smem + tile_at(r, col / CHUNK, Br(d)) + col % CHUNK * 2) = v;
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
                *(const uint4 *)(smem + tile_at(r, c, Br(d)));
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

/* What a consumer warpgroup keeps across the steps of its loop, and where its tiles are. */
typedef struct {
    const attn_problem *p;
    const attn_args *a;
    const CUtensorMap *tmK, *tmV;
    int cw, b, h_kv, Tc, row0, row, loader, pingpong;
    uint64_t dQ, dK, dV;   /* wgmma descriptors of Q (this consumer's rows), K and V stage 0 */
} consumer;

/* Step j of a consumer's loop: in its turn, issue S_j = Q_i K_jᵀ (has_s: j < Tc) and
 * O += P_{j-1} V_{j-1} (has_pv: j > 0); then the softmax of S_j, while the second product runs
 * (OVERLAP) or after it; then rescale O and pack P_j for the next step. has_s, has_pv, masked,
 * d and fp16 are literals at each call: no wgmma sits behind a run-time branch (ptxas would
 * serialise them all, C7520), and no branch lies between the PV product and its wait (ptxas
 * puts the wait before the first branch it meets, so a run-time "if (tile needs a mask)" there
 * would leave nothing to overlap): tiles that need a mask run a copy of the step with it, the
 * others a copy without. In the accumulators, warp w of the warpgroup and lane l hold rows
 * 16w + l/4 and 16w + l/4 + 8, columns 8n + 2(l%4) + {0, 1} of every 8-column tile n, as in 07. */
static __device__ __forceinline__ void consumer_step(const consumer *c, int j, float s[][4],
                                                     float o[][4], uint32_t pa[][4], float m[2],
                                                     float l[2], const int has_s, const int has_pv,
                                                     const int masked, const int d, const int fp16)
{
    const attn_problem p = *c->p;
    const fa3_smem sm = smem_layout(d);   /* constants: the offsets of a fixed layout */
    const int bc = Bc(d), tile_bytes = bc * d * 2, lane = threadIdx.x % WARP;
    const int st = j % STAGES, ph = j / STAGES & 1;   /* K_j's stage and its phase's parity */
    const int pv = (j - 1) % STAGES, ph_v = (j - 1) / STAGES & 1;   /* V_{j-1}'s (j > 0) */
    const float scale_log2 = p.scale * LOG2E;
    TRACE_AT(c->a, 0, j, 0);
    if (c->loader && j + STAGES - 1 < c->Tc)   /* no producer: K one ring ahead, its stage freed */
        load_tile(sm.K, sm.full_k, sm.empty_k, c->tmK, c->b, c->h_kv, j + STAGES - 1, d);
    /* Both tiles have landed before the first wgmma: a wait loop between two wgmmas would be a
     * divergent path there. */
    if (has_s) mbar_wait(sm.full_k + 8 * st, ph);
    if (has_pv) mbar_wait(sm.full_v + 8 * pv, ph_v);
    TRACE_AT(c->a, 0, j, 1);

    if (c->pingpong) bar_sync(BAR_TURN + c->cw, 2 * WARPGROUP);
    TRACE_AT(c->a, 0, j, 2);
    wgmma_fence();
    if (has_s) {   /* S_j = Q_i K_jᵀ: the first group */
        /* Built once at the consumer's start, except at d = 256 (there the kept descriptors
         * cost the 80-key tile a spill). */
        const uint64_t dQ = d != 256 ? c->dQ : wgmma_desc(sm.Q + c->cw * WG_ROWS * BOX_ROW, 16, SWIZZLE_ATOM);
        const uint64_t dK = wgmma_desc_add(d != 256 ? c->dK : wgmma_desc(sm.K, 16, SWIZZLE_ATOM), st * tile_bytes);
#pragma unroll
        for (int k = 0; k < d / WGMMA_K; k++) {
            const int box = k * WGMMA_K / BOX_COLS, in_box = k * WGMMA_K % BOX_COLS * 2;
            const uint64_t a_k = wgmma_desc_add(dQ, box * Br(d) * BOX_ROW + in_box);
            const uint64_t b_k = wgmma_desc_add(dK, box * bc * BOX_ROW + in_box);
            /* The 80-key tile's first k-step declares S written only: S of the last step is
             * then dead once packed into P, which frees the registers this tile needs (with
             * the read-write form the kernel spills). */
            if (bc == 80 && k == 0) wgmma_ss_first_n80(&s[0][0], a_k, b_k, fp16);
            else if (bc == 80)      wgmma_ss_n80(&s[0][0], a_k, b_k, 1, fp16);
            else                    wgmma_ss_n128(&s[0][0], a_k, b_k, k > 0, fp16);
        }
        wgmma_commit();
    }
    if (has_pv) {   /* O += P_{j-1} V_{j-1}: the second */
        const uint64_t dV = wgmma_desc_add(d != 256 ? c->dV : wgmma_desc(sm.V, bc * BOX_ROW, SWIZZLE_ATOM), pv * tile_bytes);
#pragma unroll
        for (int k = 0; k < bc / WGMMA_K; k++) {
            const uint64_t b_k = wgmma_desc_add(dV, k * WGMMA_K * BOX_ROW);
            if (d == 64)       wgmma_rs_n64(&o[0][0], pa[k], b_k, 1, fp16);
            else if (d == 128) wgmma_rs_n128(&o[0][0], pa[k], b_k, 1, fp16);
            else               wgmma_rs_n256(&o[0][0], pa[k], b_k, 1, fp16);
        }
        wgmma_commit();
    }
    if (c->pingpong) bar_arrive(BAR_TURN + (c->cw + 1) % CONSUMERS(d), 2 * WARPGROUP);
    TRACE_AT(c->a, 0, j, 3);

    float alpha[2], l_tile[2];
    if (has_s) {
        /* S_j is final once at most the PV group is still in flight (overlap), or none. */
        if (has_pv && OVERLAP) wgmma_wait_1();
        else                   wgmma_wait_0();
        wgmma_hold(&s[0][0], bc / 2);
        TRACE_AT(c->a, 0, j, 4);
        if (lane == 0) mbar_arrive(sm.empty_k + 8 * st);   /* this warp is done with K_j */
        if (masked) mask_scores(s, bc / MMA_N, c->row, j * bc + 2 * (lane % QUAD), p.N_k, p.causal);

        /* Online softmax in the log2 domain, as in 06 and 07: m holds max(S) * scale * log2(e). */
        float m_use[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < bc / MMA_N; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            const float m_new = fmaxf(m[r], row_max(mx) * scale_log2);
            /* Only a masked step can leave a row with no key (m = -inf): subtract 0 instead, so
             * that exp2 gives 0 rather than exp2(-inf - -inf) = NaN. */
            m_use[r] = masked && m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = exp2_fast(m[r] - m_use[r]);   /* 0 on the first tile, 1 if m is unchanged */
            m[r] = m_new;
            l_tile[r] = 0.0f;
        }
#pragma unroll
        for (int n = 0; n < bc / MMA_N; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                s[n][k] = exp2_fast(fmaf(s[n][k], scale_log2, -m_use[k / 2]));   /* P_ij */
                l_tile[k / 2] += s[n][k];
            }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = alpha[r] * l[r] + l_tile[r];
        TRACE_AT(c->a, 0, j, 5);
    }
    if (has_pv) {
        /* O_{j-1} is final: V_{j-1}'s stage can be refilled, and O rescaled for tile j. */
        wgmma_wait_0();
        wgmma_hold(&o[0][0], d / 2);
        TRACE_AT(c->a, 0, j, 6);
        if (lane == 0) mbar_arrive(sm.empty_v + 8 * pv);
    }
    if (c->loader && j + STAGES - 1 < c->Tc)   /* no producer: V one ring ahead, its stage freed */
        load_tile(sm.V, sm.full_v, sm.empty_v, c->tmV, c->b, c->h_kv, j + STAGES - 1, d);
    if (has_s) {
#pragma unroll
        for (int n = 0; n < d / MMA_N; n++) {
            o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
            o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int k = 0; k < bc / 16; k++) {
            pa[k][0] = pack_x2(s[2 * k][0], s[2 * k][1], fp16);
            pa[k][1] = pack_x2(s[2 * k][2], s[2 * k][3], fp16);
            pa[k][2] = pack_x2(s[2 * k + 1][0], s[2 * k + 1][1], fp16);
            pa[k][3] = pack_x2(s[2 * k + 1][2], s[2 * k + 1][3], fp16);
        }
    }
}

/* Step j of a consumer whose 64 rows all lie past N_q (in a head's last query tile when N_q is
 * not a multiple of Br): no products, only its part in the turns and in the rings' releases,
 * each release after its tile has landed, so that it counts toward that tile's phase. */
static __device__ __forceinline__ void pass_step(const consumer *c, int j, const int d)
{
    const fa3_smem sm = smem_layout(d);
    const int lane = threadIdx.x % WARP;
    if (j < c->Tc) mbar_wait(sm.full_k + 8 * (j % STAGES), j / STAGES & 1);
    if (j > 0) mbar_wait(sm.full_v + 8 * ((j - 1) % STAGES), (j - 1) / STAGES & 1);
    if (c->pingpong) bar_sync(BAR_TURN + c->cw, 2 * WARPGROUP);
    if (c->pingpong) bar_arrive(BAR_TURN + (c->cw + 1) % CONSUMERS(d), 2 * WARPGROUP);
    if (j < c->Tc && lane == 0) mbar_arrive(sm.empty_k + 8 * (j % STAGES));
    if (j > 0 && lane == 0) mbar_arrive(sm.empty_v + 8 * ((j - 1) % STAGES));
}

/* A consumer warpgroup: rows cw * 64 .. of the block's query tile. Step 0 has only S_0, the
 * steps 1 .. Tc-1 both products, step Tc only the last PV; then the epilogue, as in 07. */
static __device__ __forceinline__ void consume(const attn_problem p, const attn_args a,
                                               const fa3_smem sm, const CUtensorMap *tmQ,
                                               const CUtensorMap *tmK, const CUtensorMap *tmV,
                                               int cw, int b, int h, int i0, const int d,
                                               const int fp16)
{
    const int warp = threadIdx.x / WARP % 4, lane = threadIdx.x % WARP;
    consumer c;
    c.p = &p; c.a = &a; c.tmK = tmK; c.tmV = tmV;
    c.cw = cw;
    c.b = b;
    c.h_kv = h / (p.H / p.H_kv);
    c.Tc = (visible_keys(p, min(i0 + Br(d), p.N_q) - 1) + Bc(d) - 1) / Bc(d);
    c.row0 = i0 + cw * WG_ROWS;
    c.row = c.row0 + warp * 16 + lane / QUAD;     /* + 8 {0, 1} */
    c.pingpong = PINGPONG && d <= 128;
    if (d != 256) {
        /* The step's descriptors, built once; the low word (the address) broadcast from lane 0,
         * so that ptxas knows it is one value across the warp and keeps it in a uniform register;
         * the high word (stride, swizzle) is a constant. */
        const uint64_t q = wgmma_desc(sm.Q + cw * WG_ROWS * BOX_ROW, 16, SWIZZLE_ATOM);
        const uint64_t k = wgmma_desc(sm.K, 16, SWIZZLE_ATOM);
        const uint64_t v = wgmma_desc(sm.V, Bc(d) * BOX_ROW, SWIZZLE_ATOM);
        c.dQ = (q >> 32) << 32 | __shfl_sync(0xffffffffu, (uint32_t)q, 0);
        c.dK = (k >> 32) << 32 | __shfl_sync(0xffffffffu, (uint32_t)k, 0);
        c.dV = (v >> 32) << 32 | __shfl_sync(0xffffffffu, (uint32_t)v, 0);
    }
    /* Without warp specialisation (OFF=ws) the first consumer thread is the loader, as in 07. */
    c.loader = !WS && threadIdx.x == WARPGROUP;
    /* Ping-pong: the last consumer hands consumer 0 its first turn; the turn then goes round,
     * 0, 1, (2,) 0, ... */
    if (c.pingpong && cw == CONSUMERS(d) - 1) bar_arrive(BAR_TURN + 0, 2 * WARPGROUP);
    if (c.loader) {
        mbar_arrive_expect_tx(sm.bar_q, Br(d) * d * 2);
        for (int k = 0; k < d / BOX_COLS; k++)
            tma_load_4d(sm.Q + k * Br(d) * BOX_ROW, tmQ, k * BOX_COLS, i0, h, b, sm.bar_q);
        for (int j = 0; j < STAGES - 1 && j < c.Tc; j++) {
            load_tile(sm.K, sm.full_k, sm.empty_k, tmK, b, c.h_kv, j, d);
            load_tile(sm.V, sm.full_v, sm.empty_v, tmV, b, c.h_kv, j, d);
        }
    }

    float o[D_MAX / MMA_N][4];
    float m[2], l[2];   /* running max (log2 domain) and this lane's part of the sum */
#pragma unroll
    for (int r = 0; r < 2; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
#pragma unroll
    for (int n = 0; n < D_MAX / MMA_N; n++)
#pragma unroll
        for (int k = 0; k < 4; k++) o[n][k] = 0.0f;
    float s[128 / MMA_N][4];
    uint32_t pa[128 / 16][4];   /* P_{j-1}, packed: the A operand of the next PV product */
    mbar_wait(sm.bar_q, 0);

    /* Tiles 0 .. n_full-1 need no mask: every key inside N_k and, when causal, at or before
     * this warpgroup's first row. The rest of the Tc tiles (the diagonal ones, or the tail
     * past N_k) take the masked copy of the step. */
    const int Tc = c.Tc, n_full = min(Tc, min(p.N_k, p.causal ? c.row0 + 1 : p.N_k) / Bc(d));
    if (c.row0 >= p.N_q) {   /* no row of this warpgroup exists */
        for (int j = 0; j <= Tc; j++) pass_step(&c, j, d);
    } else {
        if (n_full > 0) consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 0, d, fp16);
        else            consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 1, d, fp16);
        for (int j = 1; j < n_full; j++) consumer_step(&c, j, s, o, pa, m, l, 1, 1, 0, d, fp16);
        for (int j = max(n_full, 1); j < Tc; j++) consumer_step(&c, j, s, o, pa, m, l, 1, 1, 1, d, fp16);
        consumer_step(&c, Tc, s, o, pa, m, l, 0, 1, 0, d, fp16);

        /* O_i = O_i / l_i and L_i = (m_i + log2 l_i) ln 2, written once. Every real row sees
         * key 0, so l_i >= 1 and L_i is finite; rows past N_q are not stored. O_i goes out
         * through this warp's rows of the Q_i tile: their last reader, this warpgroup's last
         * S product, is complete, and no other warp reads them. */
        const int r_warp = cw * WG_ROWS + warp * 16;   /* the warp's first row in the tile */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float l_row = row_sum(l[r]);
            const int i = c.row + 8 * r;
            const float inv_l = 1.0f / l_row;
#pragma unroll
            for (int n = 0; n < d / MMA_N; n++)
                put_pair(i - i0, n * MMA_N + 2 * (lane % QUAD),
                         pack_x2(o[n][2 * r] * inv_l, o[n][2 * r + 1] * inv_l, fp16), d);
            if (lane % QUAD == 0 && i < p.N_q)
                a.lse[((size_t)b * p.H + h) * p.N_q + i] = (m[r] + log2f(l_row)) * LN2;
        }
        __syncwarp();
        store_rows(a.o, r_warp, 16, b, i0, p.N_q, h, p.H, d);
    }
    /* The last consumer's last arrive on consumer 0's barrier has no turn left to open: take
     * it, so that every named barrier ends as it started. */
    if (c.pingpong && cw == 0) bar_sync(BAR_TURN + 0, 2 * WARPGROUP);
}

/* One block: query tile i0 .. i0+Br-1 of head h, batch b. Warpgroup 0 produces, the others
 * (2, or 3 at d = 64) consume. d and fp16 are literals at each call site. */
static __device__ __forceinline__ void tiled_attention(const attn_problem p, const attn_args a,
                                                       const CUtensorMap *tmQ,
                                                       const CUtensorMap *tmK,
                                                       const CUtensorMap *tmV, const int d,
                                                       const int fp16)
{
    const fa3_smem sm = smem_layout(d);
    /* The warpgroup, broadcast from lane 0: ptxas then knows it is one value across the warp and
     * keeps what follows from it (Q_i's descriptors, the first row, the loop bounds) in uniform
     * registers, off the vector pipes. */
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / WARPGROUP, 0);
    const int b = blockIdx.z, h = blockIdx.y;
    /* Causal tiles grow with i: the last ones are launched first, the small ones fill the tail. */
    const int i0 = (p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x) * Br(d);

    /* The barriers: Q's full one and the rings' full ones complete on one arrive plus the bytes;
     * the rings' empty ones on one arrive per consumer warp. */
    if (threadIdx.x == 0) {
        if (sm.Q % SWIZZLE_ATOM) hopper_fail();   /* the swizzled boxes need 1024-byte alignment */
        mbar_init(sm.bar_q, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(sm.full_k + 8 * s, 1);
            mbar_init(sm.full_v + 8 * s, 1);
            mbar_init(sm.empty_k + 8 * s, CONSUMERS(d) * 4);
            mbar_init(sm.empty_v + 8 * s, CONSUMERS(d) * 4);
        }
        mbar_fence_init();
    }
    __syncthreads();   /* the last block-wide barrier: warps of the producer exit below */

    if (wg == 0) {
        SETMAXNREG_DEC(PRODUCER_REGS);
        if (WS && threadIdx.x == 0) {   /* Q_i, then K_j and V_j as the rings free up */
            const int h_kv = h / (p.H / p.H_kv);
            const int Tc = (visible_keys(p, min(i0 + Br(d), p.N_q) - 1) + Bc(d) - 1) / Bc(d);
            mbar_arrive_expect_tx(sm.bar_q, Br(d) * d * 2);
            for (int c = 0; c < d / BOX_COLS; c++)
                tma_load_4d(sm.Q + c * Br(d) * BOX_ROW, tmQ, c * BOX_COLS, i0, h, b, sm.bar_q);
            for (int j = 0; j < Tc; j++) {
                TRACE_AT(&a, 0, j, 0);
                load_tile(sm.K, sm.full_k, sm.empty_k, tmK, b, h_kv, j, d);
                TRACE_AT(&a, 0, j, 1);
                load_tile(sm.V, sm.full_v, sm.empty_v, tmV, b, h_kv, j, d);
                TRACE_AT(&a, 0, j, 2);
            }
        }
    } else {
        if (CONSUMERS(d) == 3) SETMAXNREG_INC(CONSUMER_REGS_3);   /* d is a literal: one remains */
        else                   SETMAXNREG_INC(CONSUMER_REGS_2);
        consume(p, a, sm, tmQ, tmK, tmV, wg - 1, b, h, i0, d, fp16);
    }
}

/* One kernel per head dim and dtype, each with literals inside; the tensor maps are
 * __grid_constant__ parameters. One block per SM (the cap at entry, 168 registers, 128 at d = 64
 * with its 4 warpgroups, is what setmaxnreg redistributes). */
typedef void (*attention_fn)(attn_problem, attn_args, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap);
#define KERNEL(name, d, fp16)                                                                   \
    static __global__ void __launch_bounds__(THREADS(d), 1)                                     \
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
        snprintf(why, ATTN_WHY_LEN, "08_fa3 cannot query the device");
        return 1;
    }
    if (major != 9 || minor != 0) {
        snprintf(why, ATTN_WHY_LEN, "stage 08_fa3 is sm_90a code (wgmma, TMA, setmaxnreg): it runs on "
                 "compute capability 9.0 (H100, H200) only, this GPU is %d.%d", major, minor);
        return 1;
    }
    if (p->d != 64 && p->d != 128 && p->d != 256) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 08_fa3 supports 64, 128 and 256", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 08_fa3 needs a positive scale", p->scale);
        return 1;
    }
    if (trace_refuse("08_fa3", why)) return 1;
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "08_fa3 cannot query the device");
        return 1;
    }
    const size_t smem = smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 08_fa3", p->d, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

/* Nothing beyond L (the timeline's stamps, when one is recorded). */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)p; (void)dir;
    return trace_workspace();
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    const attention_fn kernel = pick_forward(p);
    /* Tensor maps: Q in boxes of Br rows, K and V in boxes of Bc keys, 64 columns each. */
    CUtensorMap tmQ, tmK, tmV;
    if (hopper_tensor_map(&tmQ, a->q, p->dtype, p->d, p->N_q, p->H, p->B, Br(p->d)) ||
        hopper_tensor_map(&tmK, a->k, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)) ||
        hopper_tensor_map(&tmV, a->v, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)))
        return cudaErrorInvalidValue;
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(attn_ceil_div(p->N_q, Br(p->d)), p->H, p->B);
    kernel<<<grid, THREADS(p->d), smem, s>>>(*p, *a, tmQ, tmK, tmV);
    ATTN_LAUNCH_CHECK();
    return trace_write("08_fa3", a->ws, s);
}

ATTN_EXPORT const attn_stage stage_08_fa3 = {
    "08_fa3",
    "FlashAttention-3's forward: a TMA producer warpgroup, ping-pong consumers, softmax under the products",
    "head dim 64, 128 or 256; bf16, fp16; any N; causal; GQA; forward only; compute capability 9.0 only",
    90,
    check,
    workspace,
    forward,
    NULL,
};
