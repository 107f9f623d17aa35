/* stages/09_fa3_persistent/attention.cu: FlashAttention-3's forward, persistent (sm_90a).
 *
 * Changed from 08_fa3: the same schedule (producer, ping-pong consumers, overlap); what it takes
 * to pass cuDNN, the fixed costs of a block and of a step spread thinner:
 * - A persistent grid (d = 128; 256 without a causal mask, 64 with one): one block per SM takes
 *   query tiles from an atomic counter; the next Q_i and K_0 load under the last tile's P V and
 *   epilogue (two Q_i buffers where shared memory has room). Causal tiles go longest first, over
 *   sections of heads whose K and V fit in L2 (FA-3's LPT order).
 * - The epilogue by TMA store: O_i staged in V's ring (at d = 64 in Q_i's tile, or with a causal
 *   mask in a tile of its own: o_place) leaves by one bulk tensor store per box, while the
 *   producer already loads the next tile.
 * - Lazy rescaling (FlashAttention-4's, d = 128 and 256): O is rescaled only when a row's max,
 *   in log2 units, grows by more than RESCALE_LOG2 = 8 (a factor 2^8 on P), so most steps skip
 *   the d / 2 multiplications.
 * Each can be built out for the ablation (make ablation; docs/09_fa3_persistent.md):
 *   make build/09_fa3_persistent OFF=persistent|tma_store|lazy (a list).
 * Why: at 08's speed a block's start and end, and each step's max, rescale and turn, are what
 *   is left between the tensor cores and their peak. Expected: past cuDNN's forward from
 *   N = 2048 at d = 64, 128 and 256 (docs/09_fa3_persistent.md).
 * Memory: L, and an int (the tile counter). Shared memory: 192 KiB at d = 128 (two Q_i, 128
 *   keys), 224 KiB at d = 256, 112 KiB at d = 64 (with O's tile). sm_90a.
 *
 * Run: make build/09_fa3_persistent && build/09_fa3_persistent --seqlen 8192 --dim 128 --check --bench
 *      make build/09_fa3_persistent OFF=persistent   (the same stage, one tile a block)
 */
#include <math.h>
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
#define RESCALE_LOG2 8.0f   /* lazy rescaling: P_ij stays below 2^8 (consumer_step) */
/* Registers a thread after setmaxnreg, producer and consumers: 24 x 128 + 240 x 256 and
 * 24 x 128 + 160 x 384 (three consumers) fit the SM's 64 K. Literals: setmaxnreg takes no
 * variable. */
#define PRODUCER_REGS 24
#define CONSUMER_REGS_2 240
#define CONSUMER_REGS_3 160
#define BAR_TURN 1    /* named barrier BAR_TURN + c: consumer c's turn to issue its products */
#define BAR_EPI  4    /* BAR_EPI + c: consumer c's O is in shared memory */
#define BAR_ALL  7    /* every consumer: the tile's last P V products are done, V's ring is free */
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
/* This stage's three, likewise. */
#ifndef PERSISTENT   /* knob: OFF=persistent, one query tile a block */
#define PERSISTENT 1
#endif
#ifndef TMA_STORE   /* knob: OFF=tma_store, O stored by the consumers as in 08 */
#define TMA_STORE 1
#endif
#ifndef LAZY   /* knob: OFF=lazy, O rescaled at every step */
#define LAZY 1
#endif

/* The share of L2 (60 MiB on the H200) that one section of the causal order's heads may fill
 * with K and V (tile_of): 16 MiB measured faster than 8 and 32. */
#define L2_KV_BYTES (16u << 20)

/* Dynamic shared memory, 16-bit tiles of 64-column boxes (hopper.cuh): Q_BUFS x Q_i [Br][d];
 * STAGES x K_j [Bc][d]; STAGES x V_j [Bc][d]; at d = 64, O_i [Br][d] (where O_i waits for its
 * store: o_place); then the mbarriers: Q's full and empty ones (two of each), O's (its store
 * has read V's ring), and full K, full V, empty K, empty V, STAGES of each; then two ints, the
 * posted query tile. */
typedef struct { uint32_t Q, K, V, O, bar_q, empty_q, o_free, full_k, full_v, empty_k, empty_v, slot; } fa3_smem;

/* Q_i's buffers: two where shared memory has room for a second (d = 128 with 128-key tiles: 192
 * of 227 KiB), so that a walking block's next Q_i loads while its last tile still reads the
 * other; else one, reloaded once the last tile's S products are done. */
#define Q_BUFS(d) ((d) == 128 ? 2 : 1)
static __host__ __device__ __forceinline__ size_t smem_bytes(int d)
{
    return (size_t)((Q_BUFS(d) + (d == 64)) * Br(d) + STAGES * 2 * Bc(d)) * d * 2
           + (5 + 4 * STAGES) * sizeof(uint64_t) + 2 * sizeof(int);
}

static __device__ __forceinline__ fa3_smem smem_layout(int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    fa3_smem m;
    const uint32_t tile = Bc(d) * d * 2;
    m.Q = smem_u32(smem);
    m.K = m.Q + Q_BUFS(d) * Br(d) * d * 2;
    m.V = m.K + STAGES * tile;
    m.O = m.V + STAGES * tile;   /* d = 64: O's own tile (o_place) */
    m.bar_q = m.O + (d == 64 ? Br(d) * d * 2 : 0);
    m.empty_q = m.bar_q + 16;
    m.o_free = m.bar_q + 32;
    m.full_k = m.bar_q + 40;
    m.full_v = m.full_k + 8 * STAGES;
    m.empty_k = m.full_v + 8 * STAGES;
    m.empty_v = m.empty_k + 8 * STAGES;
    m.slot = m.empty_v + 8 * STAGES;   /* [2]: the query tile the producer posted, by parity */
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

/* The producer's two steps for tile j (keys j * bc .. of kv head h_kv), the ring's n-th (n
 * counts on across a block's query tiles): wait until every consumer warp has released the
 * stage tile n uses (its empty barrier's previous phase; the first lap passes at once), arm the
 * stage's full barrier with the tile's bytes and issue one TMA load per 64-column box. One
 * thread. */
static __device__ __forceinline__ void load_tile(uint32_t ring, uint32_t full, uint32_t empty,
                                                 const CUtensorMap *map, int b, int h_kv, int j,
                                                 int n, int d)
{
    const int bc = Bc(d), tile_bytes = bc * d * 2, s = n % STAGES;
    mbar_wait(empty + 8 * s, (n / STAGES & 1) ^ 1);
    mbar_arrive_expect_tx(full + 8 * s, tile_bytes);
    for (int c = 0; c < d / BOX_COLS; c++)
        tma_load_4d(ring + s * tile_bytes + c * bc * BOX_ROW, map, c * BOX_COLS, j * bc, h_kv, b,
                    full + 8 * s);
}

/* Epilogue: a warp puts its accumulators, rounded in pairs, into its own rows of an O_i tile
 * laid out as Q_i's, `at` bytes into shared memory (put_pair: row r, columns col, col + 1);
 * the TMA store reads it there, or (OFF=tma_store) the warp copies its rows r0 .. r0+rows-1 to
 * rows n0 + r of head h of x ([B, N, heads, d]), 16 bytes a store (store_rows); rows past N
 * are not written. */
static __device__ __forceinline__ void put_pair(uint32_t at, int r, int col, uint32_t v, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    *(uint32_t *)(smem + at + tile_at(r, col / CHUNK, Br(d)) + col % CHUNK * 2) = v;
}

static __device__ __forceinline__ void store_rows(void *x, uint32_t at, int r0, int rows, int b,
                                                  int n0, int N, int h, int heads, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int lane = threadIdx.x % WARP, chunks = d / CHUNK;
#pragma unroll
    for (int it = 0; it < rows * chunks / WARP; it++) {
        const int e = it * WARP + lane, r = r0 + e / chunks, c = e % chunks;
        if (n0 + r < N)
            *(uint4 *)((uint16_t *)x + attn_row(b, n0 + r, h, N, heads, d) + c * CHUNK) =
                *(const uint4 *)(smem + at + tile_at(r, c, Br(d)));
    }
}

/* The query tile u of the grid's order: rows i0 .., head h, batch b. Row tiles fastest, as FA-3
 * orders them. Causal tiles longest first (last row first), and across the G heads of a section
 * (FA-3's LPT order): the section's last row tiles, then the ones before, ...; G heads' K and V
 * fit in a share of L2 (forward), so the blocks running at once read the same keys. A block
 * that walks tiles counts them in a 1-D grid; one that has one is the block (it, h, b) of a 3-D
 * grid (d = 64 without a causal mask), whose indices ptxas can read again where needed rather
 * than keep in registers. */
static __device__ __forceinline__ void tile_of(const attn_problem p, int G, int u, int d, int walk,
                                               int *b, int *h, int *i0)
{
    const int n_i = (p.N_q + Br(d) - 1) / Br(d);
    if (p.causal && walk) {
        const int sec = u / (G * n_i), heads = min(G, p.H * p.B - sec * G), r = u - sec * G * n_i;
        const int hb = sec * G + r % heads;   /* head and batch, h fastest */
        *h = hb % p.H;
        *b = hb / p.H;
        *i0 = (n_i - 1 - r / heads) * Br(d);
        return;
    }
    const int it = walk ? u % n_i : (int)blockIdx.x;
    *h = walk ? u / n_i % p.H : (int)blockIdx.y;
    *b = walk ? u / n_i / p.H : (int)blockIdx.z;
    *i0 = (p.causal ? n_i - 1 - it : it) * Br(d);
}

/* The stage of a 2-stage ring that its n-th tile uses, and the parity of that tile's phase:
 * n & 1 and n >> 1 & 1, also for n = -1, the lap before the first (o_place's n_o), whose empty
 * barrier's wait passes at once: there n % STAGES and n / STAGES would give -1 and 0. */
static __device__ __forceinline__ int ring_stage(int n) { return n & (STAGES - 1); }
static __device__ __forceinline__ int ring_parity(int n) { return n >> 1 & 1; }

/* Where a tile's O waits for its store, laid out as Q_i's tile. With one tile a block, in Q_i's
 * tile (a consumer's rows once its own S products are done). A block that walks tiles loads the
 * next Q_i meanwhile: at d = 128 O takes the V stage of ring count n_o, the tile before the
 * last, once every consumer warp has released it; at d = 256 O needs both stages, after the
 * consumers meet (BAR_ALL); at d = 64 its 192 rows outgrow a stage, and take a tile of their
 * own, free once the warpgroup's last store has read it. */
static __device__ __forceinline__ uint32_t o_place(const fa3_smem sm, int walk, int n_o,
                                                   const int d)
{
    return !walk ? sm.Q : d == 64 ? sm.O : d == 256 ? sm.V : sm.V + ring_stage(n_o) * Bc(d) * d * 2;
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
    int t, n0;   /* the block's t-th query tile; the rings' count at its K_0, V_0 */
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
                                                     const int masked, const int d,
                                                     const int fp16)
{
    const attn_problem p = *c->p;
    const fa3_smem sm = smem_layout(d);   /* constants: the offsets of a fixed layout */
    const int bc = Bc(d), tile_bytes = bc * d * 2, lane = threadIdx.x % WARP;
    const int n = c->n0 + j;   /* K_j's place in the rings' count */
    const int st = n % STAGES, ph = n / STAGES & 1;   /* K_j's stage and its phase's parity */
    const int pv = (n - 1) % STAGES, ph_v = (n - 1) / STAGES & 1;   /* V_{j-1}'s (j > 0) */
    const float scale_log2 = p.scale * LOG2E;
    TRACE_AT(c->a, c->t, j, 0);
    if (c->loader && j + STAGES - 1 < c->Tc)   /* no producer: K one ring ahead, its stage freed */
        load_tile(sm.K, sm.full_k, sm.empty_k, c->tmK, c->b, c->h_kv, j + STAGES - 1, n + STAGES - 1, d);
    /* Both tiles have landed before the first wgmma: a wait loop between two wgmmas would be a
     * divergent path there. */
    if (has_s) mbar_wait(sm.full_k + 8 * st, ph);
    if (has_pv) mbar_wait(sm.full_v + 8 * pv, ph_v);
    TRACE_AT(c->a, c->t, j, 1);

    if (c->pingpong) bar_sync(BAR_TURN + c->cw, 2 * WARPGROUP);
    TRACE_AT(c->a, c->t, j, 2);
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
    TRACE_AT(c->a, c->t, j, 3);

    /* Lazy rescaling (FlashAttention-4's, at d = 128 and 256): the reference max m of a row
     * moves only when the tile's max passes it by more than RESCALE_LOG2, so after the first
     * tiles O is seldom rescaled and a warp skips the d / 2 products when none of its rows
     * moved. Exact: O, l and L = m + log2 l all refer to the same m. At d = 64 the vote costs
     * more than the products it saves. */
    const int lazy = LAZY && d >= 128;
    int rescale = 0;
    float alpha[2], m_old[2], l_tile[2];
    if (has_s) {
        /* S_j is final once at most the PV group is still in flight (overlap), or none. */
        if (has_pv && OVERLAP) wgmma_wait_1();
        else                   wgmma_wait_0();
        wgmma_hold(&s[0][0], bc / 2);
        TRACE_AT(c->a, c->t, j, 4);
        if (lane == 0) mbar_arrive(sm.empty_k + 8 * st);   /* this warp is done with K_j */
        if (masked) mask_scores(s, bc / MMA_N, c->row, j * bc + 2 * (lane % QUAD), p.N_k, p.causal);

        /* Online softmax in the log2 domain, as in 06 and 07: m holds max(S) * scale * log2(e). */
        float m_use[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = fmaxf(s[0][2 * r], s[0][2 * r + 1]);
#pragma unroll
            for (int n = 1; n < bc / MMA_N; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            const float m_new = fmaxf(m[r], row_max(mx) * scale_log2);
            /* Only a masked step can leave a row with no key (m = -inf); the lazy path's alpha
             * and l wait for the warp's (rare) rescale branch below. */
            m_old[r] = m[r];
            if (!lazy || m_new > m[r] + RESCALE_LOG2) {   /* m is the running max */
                m[r] = m_new;
                rescale = 1;
            }   /* else lazy: m stays, P_ij <= 2^RESCALE_LOG2, O and l as they are */
            m_use[r] = masked && m[r] == -INFINITY ? 0.0f : m[r];
            if (!lazy) alpha[r] = exp2_fast(m_old[r] - m_use[r]);
        }
        if (lazy) rescale = __any_sync(0xffffffffu, rescale);
#pragma unroll
        for (int n = 0; n < bc / MMA_N; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                s[n][k] = exp2_fast(fmaf(s[n][k], scale_log2, -m_use[k / 2]));   /* P_ij */
                /* l_tile starts at the row's first P (k = 0: row 0, k = 2: row 1), not at 0 */
                l_tile[k / 2] = n == 0 && k % 2 == 0 ? s[n][k] : l_tile[k / 2] + s[n][k];
            }
        if (!lazy)
#pragma unroll
            for (int r = 0; r < 2; r++) l[r] = alpha[r] * l[r] + l_tile[r];
        TRACE_AT(c->a, c->t, j, 5);
    }
    if (has_pv) {
        /* O_{j-1} is final: V_{j-1}'s stage can be refilled, and O rescaled for tile j. */
        wgmma_wait_0();
        wgmma_hold(&o[0][0], d / 2);
        TRACE_AT(c->a, c->t, j, 6);
        if (lane == 0) mbar_arrive(sm.empty_v + 8 * pv);
    }
    if (c->loader && j + STAGES - 1 < c->Tc)   /* no producer: V one ring ahead, its stage freed */
        load_tile(sm.V, sm.full_v, sm.empty_v, c->tmV, c->b, c->h_kv, j + STAGES - 1, n + STAGES - 1, d);
    if (has_s) {
        if (rescale) {   /* some row of the warp moved its max (always, without lazy rescaling) */
            if (lazy)   /* a row that kept its max keeps O and l (alpha exactly 1, as before) */
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    alpha[r] = m[r] == m_old[r] ? 1.0f : exp2_fast(m_old[r] - m[r]);   /* moved: m finite */
                    l[r] = alpha[r] * l[r] + l_tile[r];
                }
#pragma unroll
            for (int n = 0; n < d / MMA_N; n++) {
                o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
                o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
            }
        } else if (lazy) {
#pragma unroll
            for (int r = 0; r < 2; r++) l[r] += l_tile[r];
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
    const int lane = threadIdx.x % WARP, n = c->n0 + j;
    if (j < c->Tc) mbar_wait(sm.full_k + 8 * (n % STAGES), n / STAGES & 1);
    if (j > 0) mbar_wait(sm.full_v + 8 * ((n - 1) % STAGES), (n - 1) / STAGES & 1);
    if (c->pingpong) bar_sync(BAR_TURN + c->cw, 2 * WARPGROUP);
    if (c->pingpong) bar_arrive(BAR_TURN + (c->cw + 1) % CONSUMERS(d), 2 * WARPGROUP);
    if (j < c->Tc && lane == 0) mbar_arrive(sm.empty_k + 8 * (n % STAGES));
    if (j > 0 && lane == 0) mbar_arrive(sm.empty_v + 8 * ((n - 1) % STAGES));
}

/* The query tile a block of a persistent grid takes after tile u: from the counter at the start
 * of the workspace, which hands them out in tile_of's order to whichever block asks first (a
 * dynamic scheduler: causal tiles differ in length). */
static __device__ __forceinline__ int next_tile_of(const attn_args a, int u)
{
#ifndef TRACE
    (void)u;
    return atomicAdd((int *)a.ws, 1) + (int)gridDim.x;
#else
    return u + (int)gridDim.x;   /* the instrumented build: the static order */
#endif
}

/* The producer posts the block's t-th query tile (n_tiles: none left) in slot[t & 1] before it
 * arms Q's barrier for it; a consumer reads it once that phase is complete. Q_i's buffers are a
 * ring of Q_BUFS stages: tile t's is t % Q_BUFS, its barriers' parity t / Q_BUFS & 1. */
static __device__ __forceinline__ void post_tile(const fa3_smem sm, int t, int u)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    ((volatile int *)(smem + (sm.slot - sm.Q)))[t & 1] = u;
}

static __device__ __forceinline__ int posted_tile(const fa3_smem sm, int t, const int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    mbar_wait(sm.bar_q + 8 * (t % Q_BUFS(d)), t / Q_BUFS(d) & 1);
    return ((volatile int *)(smem + (sm.slot - sm.Q)))[t & 1];
}

/* A consumer warpgroup: rows cw * 64 .. of each of the block's query tiles (its one, or those
 * the producer posts). Per tile, step 0 has only S_0, the steps 1 .. Tc-1 both products,
 * step Tc only the last PV; then the epilogue, while the producer loads the next K_0 (and the
 * next Q_i, unless it is already in Q's other buffer). */
static __device__ __forceinline__ void consume(const attn_problem p, const attn_args a, int G,
                                               const fa3_smem sm, const CUtensorMap *tmQ,
                                               const CUtensorMap *tmK, const CUtensorMap *tmV,
                                               const CUtensorMap *tmO, int cw, int n_tiles,
                                               const int walk, const int counted, const int d, const int fp16)
{
    const int warp = threadIdx.x / WARP % 4, lane = threadIdx.x % WARP;
    consumer c;
    c.p = &p; c.a = &a; c.tmK = tmK; c.tmV = tmV;
    c.cw = cw;
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
    /* Without warp specialisation (OFF=ws) the first consumer thread is the loader, as in 07 (a
     * block then has one tile). */
    c.loader = !WS && threadIdx.x == WARPGROUP;
    /* Ping-pong: the last consumer hands consumer 0 its first turn; the turn then goes round,
     * 0, 1, (2,) 0, ..., from one tile into the next. */
    if (c.pingpong && cw == CONSUMERS(d) - 1) bar_arrive(BAR_TURN + 0, 2 * WARPGROUP);
    c.n0 = 0;
    c.t = 0;
    /* A block of a persistent grid takes its tiles from the producer; one of a tile a block has
     * blockIdx.x (1-D) or the block's indices (3-D, tile_of). */
    const uint64_t dQ = c.dQ;   /* Q's first buffer */
    for (int u = counted ? posted_tile(sm, 0, d) : walk ? blockIdx.x : 0; u < n_tiles;
         u = counted ? posted_tile(sm, c.t + 1, d) : n_tiles, c.t++) {
        const int qs = c.t % Q_BUFS(d);   /* this tile's Q_i buffer */
        if (d != 256) c.dQ = wgmma_desc_add(dQ, qs * Br(d) * d * 2);
        int h, i0;
        tile_of(p, G, u, d, walk, &c.b, &h, &i0);
        c.h_kv = h / (p.H / p.H_kv);
        c.Tc = (visible_keys(p, min(i0 + Br(d), p.N_q) - 1) + Bc(d) - 1) / Bc(d);
        c.row0 = i0 + cw * WG_ROWS;
        c.row = c.row0 + warp * 16 + lane / QUAD;     /* + 8 {0, 1} */
        if (c.loader) {
            mbar_arrive_expect_tx(sm.bar_q, Br(d) * d * 2);
            for (int k = 0; k < d / BOX_COLS; k++)
                tma_load_4d(sm.Q + k * Br(d) * BOX_ROW, tmQ, k * BOX_COLS, i0, h, c.b, sm.bar_q);
            for (int j = 0; j < STAGES - 1 && j < c.Tc; j++) {
                load_tile(sm.K, sm.full_k, sm.empty_k, tmK, c.b, c.h_kv, j, c.n0 + j, d);
                load_tile(sm.V, sm.full_v, sm.empty_v, tmV, c.b, c.h_kv, j, c.n0 + j, d);
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
        mbar_wait(sm.bar_q + 8 * qs, c.t / Q_BUFS(d) & 1);

        /* Tiles 0 .. n_full-1 need no mask: every key inside N_k and, when causal, at or before
         * this warpgroup's first row. The rest of the Tc tiles (the diagonal ones, or the tail
         * past N_k) take the masked copy of the step. */
        const int Tc = c.Tc, n_full = min(Tc, min(p.N_k, p.causal ? c.row0 + 1 : p.N_k) / Bc(d));
        if (c.row0 >= p.N_q) {   /* no row of this warpgroup exists: its O is clipped by the store */
            for (int j = 0; j < Tc; j++) pass_step(&c, j, d);
        } else {
            if (n_full > 0) consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 0, d, fp16);
            else            consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 1, d, fp16);
            for (int j = 1; j < n_full; j++) consumer_step(&c, j, s, o, pa, m, l, 1, 1, 0, d, fp16);
            for (int j = max(n_full, 1); j < Tc; j++) consumer_step(&c, j, s, o, pa, m, l, 1, 1, 1, d, fp16);
        }
        /* Every S product of this tile is complete: the producer may load the next Q_i, and post
         * in the slot this thread read (so every consumer thread arrives, not one a warp). */
        mbar_arrive(sm.empty_q + 8 * qs);
        if (c.row0 >= p.N_q) pass_step(&c, Tc, d);
        else                 consumer_step(&c, Tc, s, o, pa, m, l, 0, 1, 0, d, fp16);

        /* O_i = O_i / l_i and L_i = (m_i + log2 l_i) ln 2. O_i is staged in shared memory (o_place;
         * in V's ring as FA-3 does, when the block walks tiles), then leaves by one TMA store per
         * 64-column box; rows past N_q are clipped by the tensor map. */
        const int n_o = c.n0 + Tc - STAGES;   /* -1 for a block's first tile if it has one step */
        const uint32_t o_tile = o_place(sm, walk, n_o, d);
        if (walk && d == 256) bar_sync(BAR_ALL, CONSUMERS(d) * WARPGROUP);
        else if (walk && d == 64) bar_sync(BAR_EPI + cw, WARPGROUP);   /* the last store has read O */
        else if (walk) mbar_wait(sm.empty_v + 8 * ring_stage(n_o), ring_parity(n_o));
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float l_row = row_sum(l[r]);
            const int i = c.row + 8 * r;
            const float inv_l = 1.0f / l_row;
#pragma unroll
            for (int n = 0; n < d / MMA_N; n++)
                put_pair(o_tile - sm.Q, i - i0, n * MMA_N + 2 * (lane % QUAD),
                         pack_x2(o[n][2 * r] * inv_l, o[n][2 * r + 1] * inv_l, fp16), d);
            if (lane % QUAD == 0 && i < p.N_q)
                a.lse[((size_t)c.b * p.H + h) * p.N_q + i] = (m[r] + log2f(l_row)) * LN2;
        }
        if (TMA_STORE) {
            fence_proxy_async();   /* generic writes of O, read next by the TMA store (async proxy) */
            bar_sync(BAR_EPI + cw, WARPGROUP);
            if (threadIdx.x % WARPGROUP == 0) {
                for (int k = 0; k < d / BOX_COLS; k++)
                    tma_store_4d(tmO, o_tile + k * Br(d) * BOX_ROW + cw * WG_ROWS * BOX_ROW, k * BOX_COLS,
                                 c.row0, h, c.b);
                bulk_commit();
                bulk_wait_read_0();   /* the shared memory must keep O until the store has read it */
                if (d != 64) mbar_arrive(sm.o_free);   /* d = 64: O's own tile, nobody waits */
            }
        } else {   /* each warp its own rows, as in 08; then the stage is free */
            __syncwarp();
            store_rows(a.o, o_tile - sm.Q, cw * WG_ROWS + warp * 16, 16, c.b, i0, p.N_q, h, p.H, d);
            bar_sync(BAR_EPI + cw, WARPGROUP);
            if (d != 64 && threadIdx.x % WARPGROUP == 0) mbar_arrive(sm.o_free);
        }
        c.n0 += Tc;
    }
    /* The last consumer's last arrive on consumer 0's barrier has no turn left to open: take
     * it, so that every named barrier ends as it started. */
    if (c.pingpong && cw == 0) bar_sync(BAR_TURN + 0, 2 * WARPGROUP);
}

/* One block: warpgroup 0 produces, the others (2, or 3 at d = 64) consume, for query tiles of
 * the n_tiles in tile_of's order: one tile a block, or (persistent) one block per SM taking
 * blockIdx.x and then what the counter hands it, each tile's loads issued under the last one's
 * epilogue. causal (-1: read from p, else a literal), d and fp16 are literals at each call
 * site. */
static __device__ __forceinline__ void tiled_attention(attn_problem p, const attn_args a, int G,
                                                       const CUtensorMap *tmQ,
                                                       const CUtensorMap *tmK,
                                                       const CUtensorMap *tmV,
                                                       const CUtensorMap *tmO, const int causal,
                                                       const int d, const int fp16)
{
    if (causal >= 0) p.causal = causal;   /* a literal in the d = 64 causal kernels (else ptxas spills) */
    const fa3_smem sm = smem_layout(d);
    /* The warpgroup, broadcast from lane 0: ptxas then knows it is one value across the warp and
     * keeps what follows from it (Q_i's descriptors, the first row, the loop bounds) in uniform
     * registers, off the vector pipes. */
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / WARPGROUP, 0);
    /* Whether a block walks tiles of a 1-D grid (which may be persistent), or has one: at d = 64
     * the tile loop costs the three consumers' 160 registers 3-5%, which only the causal kernels
     * (causal 1) pay. A persistent grid (fewer blocks than tiles) takes them from the counter. */
    const int walk = d != 64 || causal == 1;
    const int n_tiles = walk ? (p.N_q + Br(d) - 1) / Br(d) * p.H * p.B : 1;
    const int counted = walk && (int)gridDim.x < n_tiles;

    /* The barriers: Q's full ones and the rings' full ones complete on one arrive plus the bytes;
     * Q's empty ones on one arrive per consumer thread, the rings' on one per consumer warp; O's
     * on one per consumer warpgroup (its store has read V's ring). */
    if (threadIdx.x == 0) {
        if (sm.Q % SWIZZLE_ATOM) hopper_fail();   /* the swizzled boxes need 1024-byte alignment */
        for (int q = 0; q < 2; q++) {
            mbar_init(sm.bar_q + 8 * q, 1);
            mbar_init(sm.empty_q + 8 * q, CONSUMERS(d) * WARPGROUP);
        }
        mbar_init(sm.o_free, CONSUMERS(d));
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
        if (WS && threadIdx.x == 0) {
            /* K_j, then V_j. */
            int n0 = 0;   /* the rings' count at this tile's K_0, V_0 */
            int u = walk ? blockIdx.x : 0, t = 0;
            for (; u < n_tiles; t++) {
                int b, h, i0;
                tile_of(p, G, u, d, walk, &b, &h, &i0);
                const int h_kv = h / (p.H / p.H_kv);
                const int Tc = (visible_keys(p, min(i0 + Br(d), p.N_q) - 1) + Bc(d) - 1) / Bc(d);
                /* Q_i once the consumers' S products of the tile before that used its buffer
                 * are complete: the last tile (one buffer), or the one before it (two). */
                const int qs = t % Q_BUFS(d);
                const uint32_t Qt = sm.Q + qs * Br(d) * d * 2, full_q = sm.bar_q + 8 * qs;
                mbar_wait(sm.empty_q + 8 * qs, (t / Q_BUFS(d) & 1) ^ 1);
                if (counted) post_tile(sm, t, u);
                mbar_arrive_expect_tx(full_q, Br(d) * d * 2);
                for (int c = 0; c < d / BOX_COLS; c++)
                    tma_load_4d(Qt + c * Br(d) * BOX_ROW, tmQ, c * BOX_COLS, i0, h, b, full_q);
                /* The next tile, asked for now: the counter's answer arrives under the loads. */
                const int u_next = counted ? next_tile_of(a, u) : n_tiles;
                for (int j = 0; j < Tc; j++) {
                    TRACE_AT(&a, t, j, 0);
                    load_tile(sm.K, sm.full_k, sm.empty_k, tmK, b, h_kv, j, n0 + j, d);
                    TRACE_AT(&a, t, j, 1);
                    /* V's ring holds the last tile's O until its store has read it. */
                    if (j == 0 && t > 0 && d != 64) mbar_wait(sm.o_free, (t - 1) & 1);
                    load_tile(sm.V, sm.full_v, sm.empty_v, tmV, b, h_kv, j, n0 + j, d);
                    TRACE_AT(&a, t, j, 2);
                }
                n0 += Tc;
                u = u_next;
            }
            if (counted) {   /* no tile left: the consumers wake on Q's barrier to read so */
                const int qs = t % Q_BUFS(d);
                mbar_wait(sm.empty_q + 8 * qs, (t / Q_BUFS(d) & 1) ^ 1);
                post_tile(sm, t, n_tiles);
                mbar_arrive(sm.bar_q + 8 * qs);
            }
        }
    } else {
        if (CONSUMERS(d) == 3) SETMAXNREG_INC(CONSUMER_REGS_3);   /* d is a literal: one remains */
        else                   SETMAXNREG_INC(CONSUMER_REGS_2);
        consume(p, a, G, sm, tmQ, tmK, tmV, tmO, wg - 1, n_tiles, walk, counted, d, fp16);
    }
}

/* One kernel per head dim, mask and dtype, each with literals inside; the tensor maps
 * are __grid_constant__ parameters. One block of 3 warpgroups per SM, 4 at d = 64 (the cap at
 * entry, 168 registers, 128 at d = 64, is what setmaxnreg redistributes). causal: -1 read from
 * p, 0 or 1 a literal. G: the causal order's heads per section. */
typedef void (*attention_fn)(attn_problem, attn_args, int, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap);
#define KERNEL(name, d, causal, fp16)                                                           \
    static __global__ void __launch_bounds__(THREADS(d), 1)                                     \
    name(attn_problem p, attn_args a, int G, const __grid_constant__ CUtensorMap tmQ,            \
         const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,       \
         const __grid_constant__ CUtensorMap tmO)                                                \
    { tiled_attention(p, a, G, &tmQ, &tmK, &tmV, &tmO, causal, d, fp16); }
KERNEL(attention_64_bf16, 64, -1, 0)
KERNEL(attention_64_fp16, 64, -1, 1)
KERNEL(attention_64_causal_bf16, 64, 1, 0)
KERNEL(attention_64_causal_fp16, 64, 1, 1)
KERNEL(attention_128_bf16, 128, -1, 0)
KERNEL(attention_128_fp16, 128, -1, 1)
KERNEL(attention_256_bf16, 256, -1, 0)
KERNEL(attention_256_fp16, 256, -1, 1)

/* Whether the problem runs on a persistent grid: at d = 128, at d = 256 without a causal mask
 * (its causal tiles run 1-10% slower so) and at d = 64 with one (without, the tile loop costs
 * 3-5%). */
static int persistent(const attn_problem *p)
{
    return PERSISTENT && WS && (p->d == 128 || (p->d == 256 && !p->causal) || (p->d == 64 && p->causal));
}

/* The kernel for the problem: a row per head dim and mask, a column per dtype. */
static attention_fn pick_forward(const attn_problem *p)
{
    static const attention_fn k[][2] = {
        { attention_64_bf16, attention_64_fp16 },
        { attention_64_causal_bf16, attention_64_causal_fp16 },
        { attention_128_bf16, attention_128_fp16 },
        { attention_256_bf16, attention_256_fp16 } };
    const int row = p->d == 64 ? (p->causal && persistent(p) ? 1 : 0) : p->d == 128 ? 2 : 3;
    return k[row][p->dtype == ATTN_FP16];
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    (void)dir;   /* no backward: the harness refuses --backward before asking */
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        snprintf(why, ATTN_WHY_LEN, "09_fa3_persistent cannot query the device");
        return 1;
    }
    if (major != 9 || minor != 0) {
        snprintf(why, ATTN_WHY_LEN, "stage 09_fa3_persistent is sm_90a code (wgmma, TMA, setmaxnreg): "
                 "it runs on compute capability 9.0 (H100, H200) only, this GPU is %d.%d", major, minor);
        return 1;
    }
    if (p->d != 64 && p->d != 128 && p->d != 256) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 09_fa3_persistent supports 64, 128 and 256", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 09_fa3_persistent needs a positive scale", p->scale);
        return 1;
    }
    if (trace_refuse("09_fa3_persistent", why)) return 1;
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "09_fa3_persistent cannot query the device");
        return 1;
    }
    const size_t smem = smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 09_fa3_persistent", p->d, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

/* The persistent grid's tile counter, or the timeline's stamps when one is recorded (the
 * instrumented build walks tiles in the static order). */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    (void)p; (void)dir;
    const size_t t = trace_workspace();
    return t > sizeof(int) ? t : sizeof(int);
}

static cudaError_t forward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    const size_t smem = smem_bytes(p->d);
    const attention_fn kernel = pick_forward(p);
    /* Tensor maps: Q in boxes of Br rows, K and V of Bc keys, O of one warpgroup's 64 rows. */
    CUtensorMap tmQ, tmK, tmV, tmO;
    if (hopper_tensor_map(&tmQ, a->q, p->dtype, p->d, p->N_q, p->H, p->B, Br(p->d)) ||
        hopper_tensor_map(&tmK, a->k, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)) ||
        hopper_tensor_map(&tmV, a->v, p->dtype, p->d, p->N_k, p->H_kv, p->B, Bc(p->d)) ||
        hopper_tensor_map(&tmO, a->o, p->dtype, p->d, p->N_q, p->H, p->B, WG_ROWS))
        return cudaErrorInvalidValue;
    /* Above 48 KiB of dynamic shared memory a kernel has to opt in. */
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* The causal order's sections: as many heads as have K and V within L2_KV_BYTES, at least
     * one, at most all (so that G times the row tiles stays within the tile count). */
    const double kv = 4.0 * p->N_k * p->d;
    const int G = kv < L2_KV_BYTES ? (int)fmin(L2_KV_BYTES / kv, (double)p->H * p->B) : 1;
    /* One block per query tile (at d = 64 without a causal mask a 3-D grid, tile_of), or
     * (persistent) one per SM, each taking tiles from the counter. */
    const int n_i = attn_ceil_div(p->N_q, Br(p->d)), n_tiles = n_i * p->H * p->B;
    int dev = 0, sms = 0;
    ATTN_TRY(cudaGetDevice(&dev));
    ATTN_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const dim3 grid = p->d == 64 && !(p->causal && persistent(p)) ? dim3(n_i, p->H, p->B)
                    : dim3(persistent(p) && n_tiles > sms ? sms : n_tiles);
#ifndef TRACE
    if (grid.x < (unsigned)n_tiles)   /* blocks take their tiles after the first from a counter */
        ATTN_TRY(cudaMemsetAsync(a->ws, 0, sizeof(int), s));
#endif
    kernel<<<grid, THREADS(p->d), smem, s>>>(*p, *a, G, tmQ, tmK, tmV, tmO);
    ATTN_LAUNCH_CHECK();
    return trace_write("09_fa3_persistent", a->ws, s);
}

ATTN_EXPORT const attn_stage stage_09_fa3_persistent = {
    "09_fa3_persistent",
    "FlashAttention-3's forward on a persistent grid: LPT tile order, TMA-store epilogue, lazy rescaling",
    "head dim 64, 128 or 256; bf16, fp16; any N; causal; GQA; forward only; compute capability 9.0 only",
    90,
    check,
    workspace,
    forward,
    NULL,
};
