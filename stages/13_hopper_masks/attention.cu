/* stages/13_hopper_masks/attention.cu: block-sparse and sliding-window FlashAttention-3 (sm_90a).
 *
 * Changed from 10_fa3_backward: the same kernels, walking per-tile lists (12_block_sparse's idea
 * in the Hopper pipeline). Masks (attn.h): causal, a window W, 128 x 128 block-mask tiles, ANDed.
 * - Lists: without a block mask a query tile's key tiles are one range (key_tiles) and a key
 *   tile's query tiles another (query_tiles); with one, build_lists and build_bwd_lists write
 *   them once a call, a warp per tile packing the visible tiles by ballot.
 * - Forward: the producer walks the list and puts each entry beside K_j in shared memory. A
 *   consumer runs 10's plain step over the full run (the range, or the list's leading full
 *   entries) and the masked copy only where its rows are cut (step_mask: the band's edges, N_k,
 *   a block-mask tile split by a query or key tile); at d = 64 it skips a step its rows do not
 *   see. The walking grid takes an L2 section's tiles longest list first (sort_tiles). An empty
 *   list runs one step that sees no key: O = 0, L = -inf.
 * - Backward: a key tile's block walks its (head, query tile) steps, masked where the band cuts;
 *   a consumer reads a stored step during the one before, ahead of that step's dQ atomics; an
 *   empty list writes dK = dV = 0. --deterministic: a query tile's key tiles add in key order
 *   (causal: reversed), its turn counted among the key tiles that list it (bwd_turn); the
 *   walks are not rotated.
 * Why: exact attention at a fraction of the work, on the Hopper pipeline rather than mma.sync.
 * Expected: time follows the visible tiles; a window W makes it linear in N. Goals: >= 1.0x
 *   FlexAttention per mask (met); visible pairs at >= 0.9x 10_fa3_backward's rate (met at
 *   random 0.5, missed at random 0.1).
 * Memory: as 10_fa3_backward, plus with a block mask the lists in the workspace (an int per
 *   listed tile, at most its key or query range: W-bounded with a window), deterministic the
 *   row prefix sums; shared memory +24 bytes forward (entries, step counts), +8 backward (turns).
 *
 * Run: make build/13_hopper_masks && build/13_hopper_masks --seqlen 8192 --dim 128 --backward \
 *      --mask random:0.25 --check --bench   (or --causal --window 4096; --block-mask F.npy)
 */
#include <limits.h>
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
/* A warpgroup skips the steps whose keys none of its rows sees (step_mask's 2): only at d = 64,
 * whose 192-row tile spans two rows of 128-row mask tiles, so its list is the union of theirs */
#define SKIPS(d) ((d) == 64 && WS && SKIP)
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
#define MASK_TILE ATTN_MASK_TILE   /* 128: a block-mask entry covers 128 queries x 128 keys */
/* A forward list entry: the key tile in the low ENTRY_BITS bits; above them, for each consumer
 * c, two bits (2c, 2c + 1): the block mask's entries for c's rows at the tile's first and last
 * key (a tile of 80 keys at d = 256 may straddle two mask columns). ENTRY_ALL: every consumer
 * sees the whole tile (no block mask); 0 (key tile 0, no bits): an empty list's one step, where
 * no consumer sees a key (masked, or skipped at d = 64): O = 0, L = -inf by the usual epilogue. */
#define ENTRY_BITS 24
#define ENTRY_ALL (0x3f << ENTRY_BITS)
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
/* And this one's: at d = 64 a consumer skips the steps it does not see (SKIPS). */
#ifndef SKIP   /* knob: OFF=skip, every consumer takes every listed step */
#define SKIP 1
#endif
/* The backward's: a consumer reads a stored step's entry during the step before (READ_AHEAD). */
#ifndef READ_AHEAD   /* knob: OFF=read_ahead, read at the step's start, after the last atomics */
#define READ_AHEAD 1
#endif

/* The share of L2 (60 MiB on the H200) that one section of the causal order's heads may fill
 * with K and V (tile_of): 16 MiB measured faster than 8 and 32. */
#define L2_KV_BYTES (16u << 20)

/* Dynamic shared memory, 16-bit tiles of 64-column boxes (hopper.cuh): Q_BUFS x Q_i [Br][d];
 * STAGES x K_j [Bc][d]; STAGES x V_j [Bc][d]; at d = 64, O_i [Br][d] (where O_i waits for its
 * store: o_place); then the mbarriers: Q's full and empty ones (two of each), O's (its store
 * has read V's ring), and full K, full V, empty K, empty V, STAGES of each; then six ints, the
 * posted query tile, its steps and full steps (two of each), and STAGES ints, the list entry of
 * the K_j in each stage of K's ring. */
typedef struct { uint32_t Q, K, V, O, bar_q, empty_q, o_free, full_k, full_v, empty_k, empty_v, slot, entry; } fa3_smem;

/* Q_i's buffers: two where shared memory has room for a second (d = 128 with 128-key tiles: 192
 * of 227 KiB), so that a walking block's next Q_i loads while its last tile still reads the
 * other; else one, reloaded once the last tile's S products are done. */
#define Q_BUFS(d) ((d) == 128 ? 2 : 1)
static __host__ __device__ __forceinline__ size_t smem_bytes(int d)
{
    return (size_t)((Q_BUFS(d) + (d == 64)) * Br(d) + STAGES * 2 * Bc(d)) * d * 2
           + (5 + 4 * STAGES) * sizeof(uint64_t) + (6 + STAGES) * sizeof(int);
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
    m.slot = m.empty_v + 8 * STAGES;   /* [6]: the posted tile, steps, full steps: by parity */
    m.entry = m.slot + 24;             /* [STAGES]: K_j's list entry, by stage */
    return m;
}

/* Keys that query i sees, lo <= j < hi (attn.h): all N_k, keys 0 .. i when causal, and with a
 * window W also i - W < j (and without causal j < i + W). Both ends grow with i. */
static __device__ __forceinline__ void visible_keys(const attn_problem p, int i, int *lo, int *hi)
{
    int a = 0, e = p.N_k;
    if (p.causal) e = min(i + 1, e);
    if (p.window > 0) {
        a = max(a, i - p.window + 1);
        if (!p.causal) e = min(e, i + p.window);
    }
    *lo = a;
    *hi = max(a, e);
}

/* The tiles of bc keys in which rows i0 .. i0+rows-1 (those below N_q) see some key: jt_lo ..
 * jt_hi-1, none if the first row sees nothing (then neither do the later ones). Both ends of a
 * row's keys grow with the row, so the rows' keys run from the first row's first key to the
 * last row's last one without a gap. */
static __device__ __forceinline__ void key_tiles(const attn_problem p, int i0, int rows, int bc,
                                                 int *jt_lo, int *jt_hi)
{
    int lo, hi, unused;
    visible_keys(p, i0, &lo, &unused);
    visible_keys(p, min(i0 + rows, p.N_q) - 1, &unused, &hi);
    const int e = min(hi, p.N_k);
    *jt_lo = lo / bc;
    *jt_hi = lo < e ? (e + bc - 1) / bc : *jt_lo;
}

/* The keys of row r that causal and the window leave visible, as offsets from the diagonal:
 * key k is visible iff k < N_k and lo <= k - r <= hi (visible_keys element by element). Computed
 * on the host and passed to the kernels by value, so that the masked steps compare with kernel
 * parameters rather than with registers, which the consumers run short of. */
typedef struct { int lo, hi; } band;

static band diagonal_band(const attn_problem *p)
{
    band w;
    w.lo = p->window > 0 ? 1 - p->window : INT_MIN;
    w.hi = p->causal ? 0 : p->window > 0 ? p->window - 1 : INT_MAX;
    return w;
}

/* 1 iff some row r0 .. r1 sees some key k0 .. k1-1 (k1 <= N_k) in the band: the offsets k - r
 * of the rectangle run without a gap from k0 - r1 to k1 - 1 - r0. */
static __device__ __forceinline__ int band_sees(const band w, int r0, int r1, int k0, int k1)
{
    return k0 < k1 && r0 <= r1 && k0 - r1 <= w.hi && k1 - 1 - r0 >= w.lo;
}

/* 1 iff some row r0 .. r1 does not see some key k0 .. k1-1 (past N_k, or outside the band): a
 * step over them needs the mask. */
static __device__ __forceinline__ int band_cuts(const attn_problem p, const band w, int r0, int r1,
                                                int k0, int k1)
{
    return k1 > p.N_k || k0 - r1 < w.lo || k1 - 1 - r0 > w.hi;
}

/* The row of mask tiles tq of (b, h) in the block mask, broadcast over its batch and head
 * extents (attn.h), and the row itself (its entry (tq, 0)). */
static __device__ __forceinline__ size_t mask_row_index(const attn_problem p, int b, int h, int tq)
{
    const int Tq = (p.N_q + MASK_TILE - 1) / MASK_TILE;
    const size_t bh = (size_t)(p.bm_b == 1 ? 0 : b) * p.bm_h + (p.bm_h == 1 ? 0 : h);
    return bh * Tq + tq;
}

static __device__ __forceinline__ const unsigned char *mask_row(const attn_problem p,
                                                                const attn_args a, int b, int h,
                                                                int tq)
{
    return a.block_mask + mask_row_index(p, b, h, tq) * ((p.N_k + MASK_TILE - 1) / MASK_TILE);
}

/* The forward's tile lists, built once a call with a block mask (build_lists): query tile uc =
 * (b H + h) n_i + it has count[uc] entries at entry + uc cap, in key order, of which the first
 * full[uc] need no mask; order holds the query tiles in a walking grid's order (sort_tiles: by
 * section, longest list first). Without a block mask entry is NULL and a tile's list is
 * key_tiles' range, every entry ENTRY_ALL. */
typedef struct { const int *entry, *count, *full, *order; int cap; } tile_lists;

/* Query tile uc's list: its steps (the list's length, or 1 for an empty list), the one value
 * list_entry reads it with, base: the stored list at entry + base, or the range's tiles from
 * base; -1 for an empty list, whose one step has entry 0. One value, so that the producer thread
 * keeps within its 24 registers. And n_full: a stored list's leading steps that need no mask. */
static __device__ __forceinline__ int tile_list(const attn_problem p, const tile_lists tl, int uc,
                                                int i0, int d, int *base, int *n_full)
{
    int jt_lo, jt_hi;
    key_tiles(p, i0, Br(d), Bc(d), &jt_lo, &jt_hi);
    const int n = tl.entry ? __ldg(tl.count + uc) : jt_hi - jt_lo;
    *base = n == 0 ? -1 : tl.entry ? uc * tl.cap : jt_lo;
    *n_full = tl.entry ? __ldg(tl.full + uc) : 0;
    return max(n, 1);
}

/* Entry j of a query tile's list (tile_list). */
static __device__ __forceinline__ int list_entry(const tile_lists tl, int base, int j)
{
    if (base < 0) return 0;
    return tl.entry ? __ldg(tl.entry + base + j) : (base + j) | ENTRY_ALL;
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

/* The key tile of a list entry. */
static __device__ __forceinline__ int entry_tile(int e) { return e & ((1 << ENTRY_BITS) - 1); }

/* The producer's two steps for list entry e (key tile j = entry_tile(e): keys j * bc .. of kv
 * head h_kv), the ring's n-th (n counts on across a block's query tiles): wait until every
 * consumer warp has released the stage tile n uses (its empty barrier's previous phase; the
 * first lap passes at once), put e in the stage's entry slot (slots; 0: V's ring, none), arm the
 * stage's full barrier with the tile's bytes (its arrive releases the slot's write to the
 * consumers, whose wait acquires it) and issue one TMA load per 64-column box. One thread. */
static __device__ __forceinline__ void load_tile(uint32_t ring, uint32_t full, uint32_t empty,
                                                 uint32_t slots, const CUtensorMap *map, int b,
                                                 int h_kv, int e, int n, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int bc = Bc(d), tile_bytes = bc * d * 2, s = n % STAGES, j = entry_tile(e);
    mbar_wait(empty + 8 * s, (n / STAGES & 1) ^ 1);
    if (slots) ((volatile int *)(smem + (slots - smem_u32(smem))))[s] = e;
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

/* The query tile of index v = (b H + h) n_i + it (tile_index's inverse). */
static __device__ __forceinline__ void tile_by_index(const attn_problem p, int v, int d, int *b,
                                                     int *h, int *i0)
{
    const int n_i = (p.N_q + Br(d) - 1) / Br(d);
    *h = v / n_i % p.H;
    *b = v / n_i / p.H;
    *i0 = v % n_i * Br(d);
}

/* The query tile u of the grid's order: rows i0 .., head h, batch b. Row tiles fastest, as FA-3
 * orders them. Causal tiles longest first (last row first), and across the G heads of a section
 * (FA-3's LPT order): the section's last row tiles, then the ones before, ...; G heads' K and V
 * fit in a share of L2 (forward), so the blocks running at once read the same keys. A block
 * that walks tiles counts them in a 1-D grid; one that has one is the block (it, h, b) of a 3-D
 * grid (d = 64 without a causal mask), whose indices ptxas can read again where needed rather
 * than keep in registers. With a block mask's lists (order), a walking grid takes the sections
 * in order and in each the tiles longest list first (sort_tiles): lengths follow the mask, not
 * the row. */
static __device__ __forceinline__ void tile_of(const attn_problem p, int G, int u, int d, int walk,
                                               const int *order, int *b, int *h, int *i0)
{
    const int n_i = (p.N_q + Br(d) - 1) / Br(d);
    if (order && walk) {
        tile_by_index(p, __ldg(order + u), d, b, h, i0);
        return;
    }
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

/* The index of query tile (b, h, i0) in the lists: (b H + h) n_i + i0 / Br. */
static __device__ __forceinline__ int tile_index(const attn_problem p, int b, int h, int i0, int d)
{
    return (b * p.H + h) * ((p.N_q + Br(d) - 1) / Br(d)) + i0 / Br(d);
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

/* Scores a query must not see become -inf: keys outside k_lo .. k_hi-1 (the tile's keys that
 * the block mask leaves this warpgroup, below N_k) and outside the band w. s holds n_tiles
 * accumulator tiles along the keys; this thread's entries are rows row and row + 8, keys
 * key + MMA_N * n + {0, 1}. Each of the two rows sees one run of keys, first[h] .. last[h] as
 * offsets from key: two compares an entry, with the entry's offset a literal. */
static __device__ __forceinline__ void mask_scores(float s[][4], int n_tiles, int row, int key,
                                                   int k_lo, int k_hi, const band w)
{
    int first[2], last[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {   /* max(k_lo, r + w.lo), min(k_hi - 1, r + w.hi): no overflow */
        const int r = row + 8 * h;
        first[h] = max(k_lo - r, w.lo) + r - key;
        last[h] = min(k_hi - 1 - r, w.hi) + r - key;
    }
#pragma unroll
    for (int n = 0; n < n_tiles; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int o = MMA_N * n + c % 2;
            if (o < first[c / 2] || o > last[c / 2]) s[n][c] = -INFINITY;
        }
}

/* What a consumer warpgroup keeps across the steps of its loop, and where its tiles are. */
typedef struct {
    const attn_problem *p;
    const attn_args *a;
    const CUtensorMap *tmK, *tmV;
    band w;              /* causal and the window (diagonal_band) */
    tile_lists tl;       /* the lists, and this tile's (tile_list) */
    int base, n_full, f_lo;   /* the tile's steps f_lo .. n_full-1 need no mask (its full run) */
    int cw, b, h_kv, Tc, row0, row, loader, pingpong;
    uint64_t dQ, dK, dV;   /* wgmma descriptors of Q (this consumer's rows), K and V stage 0 */
    int t, n0;   /* the block's t-th query tile; the rings' count at its K_0, V_0 */
} consumer;

/* The list entry of the K_j in stage st of K's ring: the tile's first key; the keys k_lo ..
 * k_hi-1 that the block mask leaves this warpgroup's rows (its two bits: the mask at the tile's
 * first and last key, which may lie in two mask columns: keys up to mid in the first), below
 * N_k. */
static __device__ __forceinline__ void entry_keys(const consumer *c, int st, const int d, int *key0,
                                                  int *k_lo, int *k_hi)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const fa3_smem sm = smem_layout(d);
    /* Lane 0 reads the slot and hands the entry to its warp: its arrive on K's empty barrier
     * then releases the slot's only read (an arrive releases its own thread's accesses). */
    int e = 0;
    if (threadIdx.x % WARP == 0) e = ((volatile int *)(smem + (sm.entry - sm.Q)))[st];
    e = __shfl_sync(0xffffffffu, e, 0);
    const int j0 = entry_tile(e) * Bc(d), j1 = min(j0 + Bc(d), c->p->N_k);
    const int bits = e >> (ENTRY_BITS + 2 * c->cw), mid = min(j1, (j0 / MASK_TILE + 1) * MASK_TILE);
    *key0 = j0;
    *k_lo = bits & 1 ? j0 : bits & 2 ? mid : j1;
    *k_hi = bits & 2 ? j1 : bits & 1 ? mid : j1;
}

/* Step j of a consumer's loop (K_j: the j-th tile of the query tile's list; a masked step hides
 * the keys that entry_keys and the band leave out): in its turn, issue S_j = Q_i K_jᵀ (has_s:
 * j < Tc) and O += P_{j-1} V_{j-1} (has_pv: j > 0); then the softmax of S_j, while the second
 * product runs (OVERLAP) or after it; then rescale O and pack P_j for the next step. has_s,
 * has_pv, masked, d and fp16 are literals at each call: no wgmma sits behind a run-time branch
 * (ptxas would serialise them all, C7520), and no branch lies between the PV product and its
 * wait (ptxas puts the wait before the first branch it meets, so a run-time "if (tile needs a
 * mask)" there would leave nothing to overlap): tiles that need a mask run a copy of the step
 * with it, the others a copy without. In the accumulators, warp w of the warpgroup and lane l hold rows
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
        load_tile(sm.K, sm.full_k, sm.empty_k, sm.entry, c->tmK, c->b, c->h_kv,
                  list_entry(c->tl, c->base, j + STAGES - 1), n + STAGES - 1, d);
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
        if (masked) {   /* before K_j's stage (and its entry) is released */
            int key0, k_lo, k_hi;
            entry_keys(c, st, d, &key0, &k_lo, &k_hi);
            mask_scores(s, bc / MMA_N, c->row, key0 + 2 * (lane % QUAD), k_lo, k_hi, c->w);
        }
        if (lane == 0) mbar_arrive(sm.empty_k + 8 * st);   /* this warp is done with K_j */

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
        load_tile(sm.V, sm.full_v, sm.empty_v, 0, c->tmV, c->b, c->h_kv,
                  list_entry(c->tl, c->base, j + STAGES - 1), n + STAGES - 1, d);
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

/* A ring stage's release without its product (SKIPS): after the tile n of the ring has landed,
 * so that the arrive counts toward that tile's phase, one arrive a warp. */
static __device__ __forceinline__ void release(uint32_t full, uint32_t empty, int n)
{
    mbar_wait(full + 8 * (n % STAGES), n / STAGES & 1);
    if (threadIdx.x % WARP == 0) mbar_arrive(empty + 8 * (n % STAGES));
}

/* A range's full run: the tiles whose every key every row of the warpgroup sees, from the band's
 * left edge at its last row to the right edge (or N_k) at its first. */
static __device__ __forceinline__ void full_run(consumer *c, const int d)
{
    const attn_problem p = *c->p;
    const int r1 = min(c->row0 + WG_ROWS, p.N_q) - 1, bc = Bc(d);
    const long long k0 = max(0LL, (long long)c->w.lo + r1);
    const long long k1 = min((long long)p.N_k, (long long)c->w.hi + c->row0 + 1);
    c->f_lo = max(0, min((int)((k0 + bc - 1) / bc) - c->base, c->Tc));
    c->n_full = max(c->f_lo, min((int)(k1 / bc) - c->base, c->Tc));
}

/* 1 iff step j needs the mask: some key of its tile hidden by the block mask (entry_keys), past
 * N_k or outside the band for some row of the warpgroup; 2 (SKIPS) iff its rows see none. Where
 * the list tells without its entry, the step does not wait for it (a wait, a read and a shuffle
 * at every step cost the dense run ~5% at d = 128): a range's tile is base + j; the full run
 * (f_lo .. n_full-1) needs no mask. Else the entry, read once K_j has landed (the producer put
 * it in the stage's slot before arming K_j's barrier), while K_j's stage is held. The masked
 * step reads the entry again: its keys would take registers across the step's products. */
static __device__ __forceinline__ int step_mask(const consumer *c, int j, const int d)
{
    const fa3_smem sm = smem_layout(d);
    const attn_problem p = *c->p;
    const int n = c->n0 + j, bc = Bc(d), r1 = min(c->row0 + WG_ROWS, p.N_q) - 1;
    /* Not at d = 256, whose consumers (no ping-pong) ran the causal mask 3-4% slower with these
     * two tests than with the entry alone. */
    if (d != 256 && j >= c->f_lo && j < c->n_full) return 0;   /* the full run */
    if (d != 256 && !c->tl.entry) {   /* a range: tile base + j, every key (or an empty range) */
        const int k0 = (c->base + j) * bc;
        if (SKIPS(d) && (c->base < 0 || !band_sees(c->w, c->row0, r1, k0, min(k0 + bc, p.N_k))))
            return 2;
        return c->base < 0 || band_cuts(p, c->w, c->row0, r1, k0, k0 + bc);
    }
    mbar_wait(sm.full_k + 8 * (n % STAGES), n / STAGES & 1);
    int key0, k_lo, k_hi;
    entry_keys(c, n % STAGES, d, &key0, &k_lo, &k_hi);
    if (SKIPS(d) && !band_sees(c->w, c->row0, r1, k_lo, k_hi)) return 2;
    return k_lo > key0 || k_hi < key0 + bc || band_cuts(p, c->w, c->row0, r1, key0, key0 + bc);
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

/* The producer posts the block's t-th query tile (its index, tile_index; n_tiles: none left) in
 * slot[t & 1], its steps in slot[2 + (t & 1)] and its full steps (tile_list) in slot[4 + (t & 1)],
 * before it arms Q's barrier for it; a consumer reads them once that phase is complete (so that
 * it need not read the order and then the list itself, global loads one after the other). Q_i's
 * buffers are a ring of Q_BUFS stages: tile t's is t % Q_BUFS, its barriers' parity
 * t / Q_BUFS & 1. */
static __device__ __forceinline__ void post_tile(const fa3_smem sm, int t, int v, int steps,
                                                 int n_full)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    ((volatile int *)(smem + (sm.slot - sm.Q)))[t & 1] = v;
    ((volatile int *)(smem + (sm.slot - sm.Q)))[2 + (t & 1)] = steps;
    ((volatile int *)(smem + (sm.slot - sm.Q)))[4 + (t & 1)] = n_full;
}

static __device__ __forceinline__ int posted_tile(const fa3_smem sm, int t, const int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    mbar_wait(sm.bar_q + 8 * (t % Q_BUFS(d)), t / Q_BUFS(d) & 1);
    return ((volatile int *)(smem + (sm.slot - sm.Q)))[t & 1];
}

static __device__ __forceinline__ int posted_steps(const fa3_smem sm, int t)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    return ((volatile int *)(smem + (sm.slot - sm.Q)))[2 + (t & 1)];
}

static __device__ __forceinline__ int posted_full(const fa3_smem sm, int t)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    return ((volatile int *)(smem + (sm.slot - sm.Q)))[4 + (t & 1)];
}

/* A consumer warpgroup: rows cw * 64 .. of each of the block's query tiles (its one, or those
 * the producer posts). Per tile, step 0 has only S_0, the steps 1 .. Tc-1 both products,
 * step Tc only the last PV; then the epilogue, while the producer loads the next K_0 (and the
 * next Q_i, unless it is already in Q's other buffer). */
static __device__ __forceinline__ void consume(const attn_problem p, const attn_args a, int G,
                                               const band w, const tile_lists tl,
                                               const fa3_smem sm, const CUtensorMap *tmQ,
                                               const CUtensorMap *tmK, const CUtensorMap *tmV,
                                               const CUtensorMap *tmO, int cw, int n_tiles,
                                               const int walk, const int counted, const int d, const int fp16)
{
    const int warp = threadIdx.x / WARP % 4, lane = threadIdx.x % WARP;
    consumer c;
    c.p = &p; c.a = &a; c.tmK = tmK; c.tmV = tmV;
    c.w = w; c.tl = tl;
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
        c.base = 0;
        if (counted) {   /* u: the tile's index, posted with its steps (a range's base: computed) */
            tile_by_index(p, u, d, &c.b, &h, &i0);
            c.Tc = posted_steps(sm, c.t);
            c.n_full = posted_full(sm, c.t);
            if (!tl.entry) tile_list(p, tl, u, i0, d, &c.base, &c.n_full);
        } else {
            tile_of(p, G, u, d, walk, tl.order, &c.b, &h, &i0);
            c.Tc = tile_list(p, tl, tile_index(p, c.b, h, i0, d), i0, d, &c.base, &c.n_full);
        }
        c.h_kv = h / (p.H / p.H_kv);
        c.row0 = i0 + cw * WG_ROWS;
        c.row = c.row0 + warp * 16 + lane / QUAD;     /* + 8 {0, 1} */
        c.f_lo = 0;   /* a stored list's full run: its first n_full entries */
        if (d == 256) c.n_full = 0;   /* d = 256 tests every step (step_mask) */
        else if (!tl.entry && c.base >= 0) full_run(&c, d);
        if (c.loader) {
            mbar_arrive_expect_tx(sm.bar_q, Br(d) * d * 2);
            for (int k = 0; k < d / BOX_COLS; k++)
                tma_load_4d(sm.Q + k * Br(d) * BOX_ROW, tmQ, k * BOX_COLS, i0, h, c.b, sm.bar_q);
            for (int j = 0; j < STAGES - 1 && j < c.Tc; j++) {
                const int e = list_entry(tl, c.base, j);
                load_tile(sm.K, sm.full_k, sm.empty_k, sm.entry, tmK, c.b, c.h_kv, e, c.n0 + j, d);
                load_tile(sm.V, sm.full_v, sm.empty_v, 0, tmV, c.b, c.h_kv, e, c.n0 + j, d);
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

        /* Only the entries that cut this warpgroup's rows (step_mask: the band's edges, the tail
         * past N_k, a tile the block mask hides in part) take the masked copy of the step. */
        const int Tc = c.Tc;
        int due = 1;   /* P_{j-1} V_{j-1} is due (tile j-1 was not skipped) */
        if (c.row0 >= p.N_q) {   /* no row of this warpgroup exists: its O is clipped by the store */
            for (int j = 0; j < Tc; j++) pass_step(&c, j, d);
        } else if (SKIPS(d)) {   /* a skipped tile: no S_j, and no P_j V_j in the next step */
            due = 0;
            for (int j = 0; j < Tc; j++) {
                const int k = step_mask(&c, j, d);
                if (k == 2 && due) {
                    consumer_step(&c, j, s, o, pa, m, l, 0, 1, 0, d, fp16);
                    release(sm.full_k, sm.empty_k, c.n0 + j);
                } else if (k == 2) {
                    pass_step(&c, j, d);
                } else if (!due) {
                    if (k) consumer_step(&c, j, s, o, pa, m, l, 1, 0, 1, d, fp16);
                    else   consumer_step(&c, j, s, o, pa, m, l, 1, 0, 0, d, fp16);
                    if (j > 0) release(sm.full_v, sm.empty_v, c.n0 + j - 1);
                } else if (k) {
                    consumer_step(&c, j, s, o, pa, m, l, 1, 1, 1, d, fp16);
                } else {
                    consumer_step(&c, j, s, o, pa, m, l, 1, 1, 0, d, fp16);
                }
                due = k != 2;
            }
        } else {
            if (!step_mask(&c, 0, d))
                consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 0, d, fp16);
            else
                consumer_step(&c, 0, s, o, pa, m, l, 1, 0, 1, d, fp16);
            /* The full run takes a loop of its own, as 10's full tiles do: the hot loop then
             * holds one copy of the step, and no test. */
            int j = 1;
            for (;;) {
                for (; j < Tc && (j < c.f_lo || j >= c.n_full); j++)   /* steps that may need it */
                    if (!step_mask(&c, j, d))
                        consumer_step(&c, j, s, o, pa, m, l, 1, 1, 0, d, fp16);
                    else
                        consumer_step(&c, j, s, o, pa, m, l, 1, 1, 1, d, fp16);
                if (j >= Tc) break;
                for (; j < c.n_full; j++) consumer_step(&c, j, s, o, pa, m, l, 1, 1, 0, d, fp16);
            }
        }
        /* Every S product of this tile is complete: the producer may load the next Q_i, and post
         * in the slot this thread read (so every consumer thread arrives, not one a warp). */
        mbar_arrive(sm.empty_q + 8 * qs);
        if (c.row0 >= p.N_q || !due) pass_step(&c, Tc, d);
        else                         consumer_step(&c, Tc, s, o, pa, m, l, 0, 1, 0, d, fp16);

        /* O_i = O_i / l_i and L_i = (m_i + log2 l_i) ln 2; a row that saw no key has l_i = 0 and
         * m_i = -inf: O_i = 0 and L_i = -inf (attn.h), so 1 / l_i is not taken there. O_i is
         * staged in shared memory (o_place; in V's ring as FA-3 does, when the block walks
         * tiles), then leaves by one TMA store per 64-column box; rows past N_q are clipped by
         * the tensor map. */
        const int n_o = c.n0 + Tc - STAGES;   /* -1 for a block's first tile if it has one step */
        const uint32_t o_tile = o_place(sm, walk, n_o, d);
        if (walk && d == 256) bar_sync(BAR_ALL, CONSUMERS(d) * WARPGROUP);
        else if (walk && d == 64) bar_sync(BAR_EPI + cw, WARPGROUP);   /* the last store has read O */
        else if (walk) mbar_wait(sm.empty_v + 8 * ring_stage(n_o), ring_parity(n_o));
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float l_row = row_sum(l[r]);
            const int i = c.row + 8 * r;
            const float inv_l = l_row > 0.0f ? 1.0f / l_row : 0.0f;
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
                                                       const band w, const tile_lists tl,
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
                int b, h, i0, base;
                tile_of(p, G, u, d, walk, tl.order, &b, &h, &i0);
                const int h_kv = h / (p.H / p.H_kv), v = tile_index(p, b, h, i0, d);
                int n_full;
                const int Tc = tile_list(p, tl, v, i0, d, &base, &n_full);
                /* Q_i once the consumers' S products of the tile before that used its buffer
                 * are complete: the last tile (one buffer), or the one before it (two). */
                const int qs = t % Q_BUFS(d);
                const uint32_t Qt = sm.Q + qs * Br(d) * d * 2, full_q = sm.bar_q + 8 * qs;
                mbar_wait(sm.empty_q + 8 * qs, (t / Q_BUFS(d) & 1) ^ 1);
                if (counted) post_tile(sm, t, v, Tc, n_full);
                mbar_arrive_expect_tx(full_q, Br(d) * d * 2);
                for (int c = 0; c < d / BOX_COLS; c++)
                    tma_load_4d(Qt + c * Br(d) * BOX_ROW, tmQ, c * BOX_COLS, i0, h, b, full_q);
                /* The next tile, asked for now: the counter's answer arrives under the loads. */
                const int u_next = counted ? next_tile_of(a, u) : n_tiles;
                for (int j = 0; j < Tc; j++) {   /* the list's tiles, each with its entry */
                    const int e = list_entry(tl, base, j);
                    TRACE_AT(&a, t, j, 0);
                    load_tile(sm.K, sm.full_k, sm.empty_k, sm.entry, tmK, b, h_kv, e, n0 + j, d);
                    TRACE_AT(&a, t, j, 1);
                    /* V's ring holds the last tile's O until its store has read it. */
                    if (j == 0 && t > 0 && d != 64) mbar_wait(sm.o_free, (t - 1) & 1);
                    load_tile(sm.V, sm.full_v, sm.empty_v, 0, tmV, b, h_kv, e, n0 + j, d);
                    TRACE_AT(&a, t, j, 2);
                }
                n0 += Tc;
                u = u_next;
            }
            if (counted) {   /* no tile left: the consumers wake on Q's barrier to read so */
                const int qs = t % Q_BUFS(d);
                mbar_wait(sm.empty_q + 8 * qs, (t / Q_BUFS(d) & 1) ^ 1);
                post_tile(sm, t, n_tiles, 0, 0);
                mbar_arrive(sm.bar_q + 8 * qs);
            }
        }
    } else {
        if (CONSUMERS(d) == 3) SETMAXNREG_INC(CONSUMER_REGS_3);   /* d is a literal: one remains */
        else                   SETMAXNREG_INC(CONSUMER_REGS_2);
        consume(p, a, G, w, tl, sm, tmQ, tmK, tmV, tmO, wg - 1, n_tiles, walk, counted, d, fp16);
    }
}

/* One kernel per head dim, mask and dtype, each with literals inside; the tensor maps
 * are __grid_constant__ parameters. One block of 3 warpgroups per SM, 4 at d = 64 (the cap at
 * entry, 168 registers, 128 at d = 64, is what setmaxnreg redistributes). causal: -1 read from
 * p, 0 or 1 a literal. G: the causal order's heads per section. */
typedef void (*attention_fn)(attn_problem, attn_args, int, band, tile_lists, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                             const __grid_constant__ CUtensorMap);
#define KERNEL(name, d, causal, fp16)                                                           \
    static __global__ void __launch_bounds__(THREADS(d), 1)                                     \
    name(attn_problem p, attn_args a, int G, band w, tile_lists tl,                             \
         const __grid_constant__ CUtensorMap tmQ,                                                \
         const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,       \
         const __grid_constant__ CUtensorMap tmO)                                                \
    { tiled_attention(p, a, G, w, tl, &tmQ, &tmK, &tmV, &tmO, causal, d, fp16); }
KERNEL(attention_64_bf16, 64, -1, 0)
KERNEL(attention_64_fp16, 64, -1, 1)
KERNEL(attention_64_causal_bf16, 64, 1, 0)
KERNEL(attention_64_causal_fp16, 64, 1, 1)
KERNEL(attention_128_bf16, 128, -1, 0)
KERNEL(attention_128_fp16, 128, -1, 1)
KERNEL(attention_256_bf16, 256, -1, 0)
KERNEL(attention_256_fp16, 256, -1, 1)

/* Whether the problem runs on a persistent grid: at d = 128, at d = 256 without a causal mask
 * (its causal tiles ran 1-10% slower so) and at d = 64 with one (without, the tile loop costs
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

/* ---- Tile lists (with a block mask) ------------------------------------------------------- */

#define LIST_THREADS 256   /* the list kernels: a warp per list */
#define SORT_THREADS 1024  /* sort_tiles: one block */
#define SORT_BUCKETS 4096  /* (section, list length) keys it tells apart */

/* The forward's lists: a warp per query tile uc (rows i0 .. of head h, batch b), whose lanes take
 * 32 key tiles of key_tiles' range at a time, in order. For each consumer c (64 rows, in one
 * mask row) the entry gets the block mask's two bits for the tile (its first and last key); the
 * tile is listed iff some consumer has a pair in it that the mask and the band leave visible.
 * The listed lanes' entries are packed by a ballot, as 12_block_sparse packs its bitmaps. */
static __global__ void __launch_bounds__(LIST_THREADS) build_lists(attn_problem p, attn_args a,
                                                                   band w, int *entry,
                                                                   int *count, int *full, int cap)
{
    const int d = p.d, bc = Bc(d), lane = threadIdx.x % WARP;
    const int uc = (int)((blockIdx.x * LIST_THREADS + threadIdx.x) / WARP);
    const int n_i = (p.N_q + Br(d) - 1) / Br(d);
    if (uc >= n_i * p.H * p.B) return;   /* a whole warp */
    const int i0 = uc % n_i * Br(d), h = uc / n_i % p.H, b = uc / n_i / p.H;
    int jt_lo, jt_hi, n = 0, n_full = 0;
    key_tiles(p, i0, Br(d), bc, &jt_lo, &jt_hi);
    for (int base = jt_lo; base < jt_hi; base += WARP) {
        const int jt = base + lane, j0 = jt * bc, j1 = min(j0 + bc, p.N_k);
        int e = jt, seen = 0, cut = 0;
        for (int c = 0; c < CONSUMERS(d) && jt < jt_hi && i0 + c * WG_ROWS < p.N_q; c++) {
            const int r0 = i0 + c * WG_ROWS, r1 = min(r0 + WG_ROWS, p.N_q) - 1;
            const unsigned char *row = mask_row(p, a, b, h, r0 / MASK_TILE);
            const int b0 = row[j0 / MASK_TILE] != 0, b1 = row[(j1 - 1) / MASK_TILE] != 0;
            const int mid = min(j1, (j0 / MASK_TILE + 1) * MASK_TILE);   /* as entry_keys */
            e |= (b0 | b1 << 1) << (ENTRY_BITS + 2 * c);
            seen |= band_sees(w, r0, r1, b0 ? j0 : mid, b1 ? j1 : mid);
            cut |= !b0 || !b1 || band_cuts(p, w, r0, r1, j0, j0 + bc);   /* as step_mask */
        }
        const uint32_t on = __ballot_sync(0xffffffffu, seen);
        const uint32_t part = __ballot_sync(0xffffffffu, seen && cut);   /* listed, to mask */
        if (seen) entry[(size_t)uc * cap + n + __popc(on & ((1u << lane) - 1))] = e;
        if (n_full == n)   /* no entry that needs the mask yet: count those before the first */
            n_full += __popc(part ? on & ((part & (0u - part)) - 1) : on);
        n += __popc(on);
    }
    if (lane == 0) { count[uc] = n; full[uc] = n_full; }
}

/* The bucket of query tile u in the walking grid's order with a block mask: the sections of G
 * heads whose K and V fit in a share of L2 (tile_of's), in order, and in each the tiles by list
 * length, longest first (a long tile taken last would end the kernel alone): n_sec sections of
 * lb buckets, lengths 0 .. cap spread over them; more than SORT_BUCKETS in all share buckets
 * (keys merged in order). */
static __device__ __forceinline__ int sort_bucket(int u, int len, int n_i, int G, int n_sec, int cap)
{
    const int lb = max(1, SORT_BUCKETS / n_sec), sec = u / n_i / G;
    const long key = (long)sec * lb + lb - 1 - (long)min(len, cap) * lb / (cap + 1);
    return (int)(key * SORT_BUCKETS / max((long)n_sec * lb, (long)SORT_BUCKETS));
}

/* That order, by a counting sort in one block: the buckets' histogram, each bucket's start, then
 * every tile at its bucket's next place (within a bucket in any order: a tile's result is its
 * own). */
static __global__ void __launch_bounds__(SORT_THREADS) sort_tiles(const int *count, int *order,
                                                                  int n_tiles, int n_i, int G,
                                                                  int cap)
{
    __shared__ int start[SORT_BUCKETS], part[SORT_THREADS];
    const int t = threadIdx.x, per = SORT_BUCKETS / SORT_THREADS, n_sec = (n_tiles / n_i + G - 1) / G;
    for (int k = t; k < SORT_BUCKETS; k += SORT_THREADS) start[k] = 0;
    __syncthreads();
    for (int u = t; u < n_tiles; u += SORT_THREADS)
        atomicAdd(&start[sort_bucket(u, count[u], n_i, G, n_sec, cap)], 1);
    __syncthreads();
    /* thread t owns the buckets per t .. per t + per - 1 */
    int sum = 0;
    for (int k = 0; k < per; k++) sum += start[per * t + k];
    part[t] = sum;
    __syncthreads();
    for (int o = 1; o < SORT_THREADS; o *= 2) {   /* the parts' inclusive scan */
        const int v = t >= o ? part[t - o] : 0;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    int at = part[t] - sum;
    for (int k = 0; k < per; k++) {
        const int c = start[per * t + k];
        start[per * t + k] = at;
        at += c;
    }
    __syncthreads();
    for (int u = t; u < n_tiles; u += SORT_THREADS)
        order[atomicAdd(&start[sort_bucket(u, count[u], n_i, G, n_sec, cap)], 1)] = u;
}

/* ---- Backward (FA-3 Algorithm 3) ------------------------------------------------------------ */

/* One block per key tile of BWD_Bc keys of a kv head (K/V outer, as stage 6's backward): the
 * producer warpgroup loads K_j and V_j once, then Q_i with L_i and dO_i with D_i into two
 * rings; consumer warpgroup c owns keys 64c .. 64c+63 and, at every step, computes
 *   Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ          (wgmma, both operands from shared memory),
 *   Pᵀ = exp2(Sᵀ scale log2e - L_i log2e), dSᵀ = Pᵀ ∘ (dPᵀ - D_i)          (registers),
 *   dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i          (wgmma, Pᵀ and dSᵀ from registers),
 *   dQ_i += dS K_j                                (wgmma from shared memory: dSᵀ is stored),
 * the products transposed (keys as the rows, FA-3's "swapAB"), so that Pᵀ and dSᵀ come out
 * of the accumulators already in the A-operand layout of the products that read them. dQ_i
 * is added to an fp32 accumulator with atomics; dK_j and dV_j leave once, by TMA store. */
#define BWD_Bc      128                       /* keys per block: two consumers of 64 */
#define BWD_Br(d)   ((d) == 64 ? 128 : 64)    /* query rows per step */
#define BWD_THREADS (3 * WARPGROUP)           /* producer, two consumers */
#if BWD_Bc != MASK_TILE
#error "build_bwd_lists, bwd_turn: a backward key tile must be one block-mask column"
#endif
#define BAR_DS      8                         /* both consumers: dSᵀ of the step is stored */
#define BAR_DKV     9                         /* both consumers: done with K_j and V_j */
#ifndef DQ_ATOMICS   /* knob: OFF=dq_atomics, a writer warp adds dQ_i by a bulk reduce from shared memory */
#define DQ_ATOMICS 1
#endif
/* wr (a literal of each kernel): dQ_i leaves through the writer warp, not by the consumers'
 * atomics. The deterministic kernels always take the writer: its warp waits for a query tile's
 * turn while the consumers go on with the next step. The default ones take the atomics. */
#define DEFAULT_WR  (!DQ_ATOMICS)
/* Registers a thread after setmaxnreg, consumers and producer: 240 x 256 + 24 x 128 fill the
 * 168 x 384 the kernel starts with. The writer reads each step's turn from shared memory
 * (bwd_smem's turn, written by the consumers), so that its loop fits in 24. */
#define DQ_SLICE    (64 * 64 * 4)             /* bytes of a consumer's part of dQ_i (writer) */

/* Dynamic shared memory of the backward, 16-bit tiles of 64-column boxes: K_j, V_j [Bc][d];
 * STAGES x Q_i, dO_i [Br][d]; two dSᵀ buffers [Bc][Br] (keys as rows, queries as columns);
 * STAGES x L_i, D_i [Br] fp32; then the mbarriers: K/V's, and full and empty ones per stage
 * for Q_i (with L_i) and for dO_i (with D_i). */
typedef struct { uint32_t K, V, Q, dO, dS, dQ, L, D, kv, q_full, q_empty, o_full, o_empty, dq_full, dq_free, turn; } bwd_smem;

static __host__ __device__ __forceinline__ size_t bwd_smem_bytes(int d, int wr)
{
    const int br = BWD_Br(d);
    return (size_t)(2 * BWD_Bc + 2 * STAGES * br) * d * 2 + 2 * (size_t)BWD_Bc * br * 2 +
           (wr ? 2 * DQ_SLICE : 0) + 2 * STAGES * br * sizeof(float) +
           (1 + 4 * STAGES + 4) * sizeof(uint64_t) + 2 * sizeof(int);
}

static __device__ __forceinline__ bwd_smem bwd_layout(int d, int wr)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int br = BWD_Br(d);
    bwd_smem m;
    m.K = smem_u32(smem);
    m.V = m.K + BWD_Bc * d * 2;
    m.Q = m.V + BWD_Bc * d * 2;            /* stage s at Q + s br d 2 */
    m.dO = m.Q + STAGES * br * d * 2;
    m.dS = m.dO + STAGES * br * d * 2;     /* buffer u at dS + u Bc br 2 */
    m.dQ = m.dS + 2 * BWD_Bc * br * 2;     /* wr: consumer c's part at dQ + c DQ_SLICE */
    m.L = m.dQ + (wr ? 2 * DQ_SLICE : 0);  /* stage s at L + s br 4 */
    m.D = m.L + STAGES * br * 4;
    m.kv = m.D + STAGES * br * 4;
    m.q_full = m.kv + 8;
    m.q_empty = m.q_full + 8 * STAGES;
    m.o_full = m.q_empty + 8 * STAGES;
    m.o_empty = m.o_full + 8 * STAGES;
    m.dq_full = m.o_empty + 8 * STAGES;    /* [2]: consumer c's part is in shared memory */
    m.dq_free = m.dq_full + 16;            /* [2]: the writer has read it */
    m.turn = m.dq_free + 16;               /* [2] int: the turn of consumer c's part (deterministic) */
    return m;
}

/* The backward's workspace: L in base 2 (+inf for a row that sees no key and for the rows past
 * N_q up to a whole query tile) and D = rowsum(dO ∘ O), fp32 [B, H, Nq_pad] each, Nq_pad = N_q
 * rounded up to a query tile (so that every step's L_i, D_i is one aligned bulk copy); then the
 * fp32 dQ accumulator, [B, H, Nq_pad, d] in the consumers' fragment order (below); then
 * (--deterministic) a semaphore per query tile, an int [B, H, Nq_pad / Br]. */
static size_t bwd_rows(const attn_problem *p) { return (size_t)attn_ceil_div(p->N_q, BWD_Br(p->d)) * BWD_Br(p->d); }
static size_t bwd_ld_bytes(const attn_problem *p) { return (size_t)p->B * p->H * bwd_rows(p) * sizeof(float); }
static size_t bwd_acc_bytes(const attn_problem *p) { return bwd_ld_bytes(p) * p->d; }
static size_t bwd_workspace(const attn_problem *p)
{
    return 2 * bwd_ld_bytes(p) + bwd_acc_bytes(p) + bwd_ld_bytes(p) / BWD_Br(p->d);
}
/* TRACE=1: the timeline's stamps follow those parts, 256-byte aligned. */
static size_t bwd_trace_at(const attn_problem *p) { return (bwd_workspace(p) + 255) / 256 * 256; }

/* With a block mask the lists follow the rest of the workspace (and the timeline's stamps),
 * 256-byte aligned. Forward: order, count and full [n_tiles], then the entries [n_tiles][cap];
 * backward: count [blocks], the entries [blocks][cap], then (--deterministic) the mask's
 * prefix sums. cap: the longest list a tile can have, all of its range; with a window the
 * range spans at most the tile and the window on either side. */
static size_t round_256(size_t x) { return (x + 255) / 256 * 256; }
static int fwd_cap(const attn_problem *p)
{
    const int n_kt = attn_ceil_div(p->N_k, Bc(p->d));
    const long span = p->window > 0 ? ((long)Br(p->d) + 2L * p->window) / Bc(p->d) + 2 : n_kt;
    return (int)(span < n_kt ? span : n_kt);
}
static int bwd_cap(const attn_problem *p)
{
    const int br = BWD_Br(p->d), n_t = attn_ceil_div(p->N_q, br);
    const long span = p->window > 0 ? ((long)BWD_Bc + 2L * p->window) / br + 2 : n_t;
    return p->H / p->H_kv * (int)(span < n_t ? span : n_t);
}
static size_t fwd_tiles(const attn_problem *p) { return (size_t)attn_ceil_div(p->N_q, Br(p->d)) * p->H * p->B; }
static size_t bwd_blocks(const attn_problem *p) { return (size_t)attn_ceil_div(p->N_k, BWD_Bc) * p->H_kv * p->B; }
static size_t mask_rows(const attn_problem *p) { return (size_t)p->bm_b * p->bm_h * attn_ceil_div(p->N_q, MASK_TILE); }
static size_t fwd_lists_at(void)
{
    const size_t t = trace_workspace();
    return round_256(t > sizeof(int) ? t : sizeof(int));
}
static size_t fwd_list_bytes(const attn_problem *p)
{
    return p->block_mask ? fwd_tiles(p) * (3 + (size_t)fwd_cap(p)) * sizeof(int) : 0;
}
static size_t bwd_lists_at(const attn_problem *p)
{
    return round_256(trace_workspace() ? bwd_trace_at(p) + trace_workspace() : bwd_workspace(p));
}
static size_t bwd_list_bytes(const attn_problem *p)
{
    if (!p->block_mask) return 0;
    const size_t prefix = p->deterministic ? mask_rows(p) * (attn_ceil_div(p->N_k, MASK_TILE) + 1) : 0;
    return (bwd_blocks(p) * (1 + (size_t)bwd_cap(p)) + prefix) * sizeof(int);
}

/* The dQ accumulator's layout, a query tile (of br rows) after the other: each consumer
 * computes a 64 x 64 part of the tile (the columns 64c .. at d = 128, the rows 64c .. at
 * d = 64), the part c after part c - 1, and its thread t holds that part's accumulators as any
 * wgmma's (dq[n][e]: row 16 warp + lane/4 + 8 (e/2), column 8n + 2 (lane%4) + e%2); the four
 * values dq[n][0..3] of thread t sit together at 4 (WARPGROUP n + t), so that a thread adds
 * them with one 16-byte atomic and a warp's atomics cover 512 consecutive bytes. */

/* Preprocess: for every row of every head, L in base 2 and D_i = rowsum(dO_i ∘ O_i), into the
 * padded rows of the workspace; the dQ accumulator set to zero. d / 8 threads a row, one
 * 16-byte chunk of O and of dO each (a warp reads 512 consecutive bytes of each when H > 1:
 * the rows of neighbouring heads are neighbours in [B, N, H, d]), summed by shuffles. */
static __global__ void bwd_preprocess(attn_problem p, attn_args a, float *L2, float *D, float *dq_acc,
                                      int *sem)
{
    const size_t rows = (size_t)p.B * p.H * ((p.N_q + BWD_Br(p.d) - 1) / BWD_Br(p.d) * BWD_Br(p.d));
    const int n_pad = (int)(rows / ((size_t)p.B * p.H)), fp16 = p.dtype == ATTN_FP16;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * p.d / 4;
         e += (size_t)gridDim.x * blockDim.x)
        ((float4 *)dq_acc)[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x < rows / BWD_Br(p.d)) sem[x] = 0;
    const int per_row = p.d / CHUNK, c = (int)(x % per_row);
    const size_t row = x / per_row;
    if (row >= rows) return;   /* whole warps: rows * per_row is a multiple of 32 */
    const int h = (int)(row % p.H), i = (int)(row / p.H % n_pad), b = (int)(row / p.H / n_pad);
    float acc = 0.0f;
    if (i < p.N_q) {
        const uint4 u = ((const uint4 *)((const uint16_t *)a.o + attn_row(b, i, h, p.N_q, p.H, p.d)))[c];
        const uint4 v = ((const uint4 *)((const uint16_t *)a.d_o + attn_row(b, i, h, p.N_q, p.H, p.d)))[c];
        const uint32_t us[4] = { u.x, u.y, u.z, u.w }, vs[4] = { v.x, v.y, v.z, v.w };
        for (int k = 0; k < 4; k++) {
            const float2 f = unpack_x2(us[k], fp16), w = unpack_x2(vs[k], fp16);
            acc = fmaf(f.x, w.x, fmaf(f.y, w.y, acc));
        }
    }
    for (int m = per_row / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (c != 0) return;
    const size_t at = ((size_t)b * p.H + h) * n_pad + i;
    if (i >= p.N_q) { L2[at] = INFINITY; D[at] = 0.0f; return; }
    const float L = a.lse[((size_t)b * p.H + h) * p.N_q + i];
    L2[at] = L == -INFINITY ? INFINITY : L * LOG2E;   /* no key seen: P = 0 */
    D[at] = acc;
}

/* Postprocess: dQ = scale * the accumulator, rounded to the dtype, in [B, N_q, H, d], at full
 * width both ways. A thread reads two float4s in the accumulator's order (a warp's loads are
 * 512 consecutive bytes), its dq[n][0..3] and dq[n+1][0..3] (n even): two columns in each of
 * two 8-column groups, on rows r and r + 8 (the layout above). The four threads of a quad hold
 * 16 columns of those two rows, four 16-byte chunks; two rounds of shuffles (a 4 x 4 transpose)
 * give each thread one whole chunk, stored in one 16-byte write. */
static __global__ void bwd_postprocess(attn_problem p, const float *dq_acc, void *dq)
{
    const int br = BWD_Br(p.d), n_t = (p.N_q + br - 1) / br, fp16 = p.dtype == ATTN_FP16;
    const int per_tile = br * p.d / 8;   /* threads a tile; a multiple of 512: whole warps */
    const size_t n = (size_t)p.B * p.H * n_t * per_tile;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t tile = e / per_tile;
        const int in = (int)(e % per_tile), c = in / 512, t = in % WARPGROUP, np = in / WARPGROUP % 4;
        const float4 *src = (const float4 *)dq_acc + 2 * (e - in) + 1024 * c + 2 * np * WARPGROUP + t;
        const float4 v0 = src[0], v1 = src[WARPGROUP];
        const float sc = p.scale;
        /* x[2 hf + g]: row r + 8 hf, columns 16 np + 8 g + 2 q, + 1 (q: the thread in its quad) */
        const uint32_t x[4] = { pack_x2(sc * v0.x, sc * v0.y, fp16), pack_x2(sc * v1.x, sc * v1.y, fp16),
                                pack_x2(sc * v0.z, sc * v0.w, fp16), pack_x2(sc * v1.z, sc * v1.w, fp16) };
        /* the transpose: quad thread q ends with chunk q (row r + 8 (q / 2), group q % 2), word s
         * from thread s. Round 1 swaps 2 x 2 blocks with thread q ^ 2, round 2 words with q ^ 1. */
        const int q = t % QUAD, hi = q >> 1, lo = q & 1;
        const uint32_t k0 = hi ? x[2] : x[0], k1 = hi ? x[3] : x[1];   /* chunks 2 hi, 2 hi + 1 */
        const uint32_t p0 = __shfl_xor_sync(0xffffffffu, hi ? x[0] : x[2], 2);
        const uint32_t p1 = __shfl_xor_sync(0xffffffffu, hi ? x[1] : x[3], 2);
        const uint32_t ks = lo ? k1 : k0, kp = lo ? p1 : p0;            /* chunk q: from q, q ^ 2 */
        const uint32_t rs = __shfl_xor_sync(0xffffffffu, lo ? k0 : k1, 1); /* from q ^ 1 */
        const uint32_t rp = __shfl_xor_sync(0xffffffffu, lo ? p0 : p1, 1); /* from q ^ 3 */
        uint32_t w[4];
        for (int s = 0; s < 4; s++) {
            const int from = s ^ q;
            w[s] = from == 0 ? ks : from == 1 ? rs : from == 2 ? kp : rp;
        }
        const int rr = t / WARP * 16 + t % WARP / QUAD + 8 * hi, cc = 16 * np + 8 * lo;
        const int r = br == 64 ? rr : 64 * c + rr, col = br == 64 ? 64 * c + cc : cc;
        const int qt = (int)(tile % n_t), h = (int)(tile / n_t % p.H), b = (int)(tile / n_t / p.H);
        const int i = qt * br + r;
        if (i < p.N_q)
            *(uint4 *)((uint16_t *)dq + attn_row(b, i, h, p.N_q, p.H, p.d) + col) =
                make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* The query tiles of br rows in which some row sees some key of j0 .. j0+Bc-1: qt_lo .. qt_hi-1
 * (visible_keys inverted: the rows that see a key of the tile run without a gap from the
 * first row whose keys reach j0 to the last whose keys begin before the tile's end). Exactly
 * the query tiles whose key_tiles hold this key tile. */
static __device__ __forceinline__ void query_tiles(const attn_problem p, int j0, int br, int *qt_lo,
                                                   int *qt_hi)
{
    const int j1 = min(j0 + BWD_Bc, p.N_k);
    int a = 0, e = p.N_q;
    if (p.causal) a = j0;                                  /* hi(i) = i + 1 > j0 */
    else if (p.window > 0) a = max(0, j0 - p.window + 1);  /* hi(i) = i + W > j0 */
    if (p.window > 0) e = min(e, j1 + p.window - 1);       /* lo(i) = i - W + 1 < j1 */
    a = min(a, p.N_q);
    *qt_lo = a / br;
    *qt_hi = a < e ? (e + br - 1) / br : *qt_lo;
}

/* The backward's lists, built once a call with a block mask (build_bwd_lists): the block of key
 * tile jt of kv head h_kv, batch b, v = (b H_kv + h_kv) n_kt + jt, has count[v] steps at
 * entry + v cap, each g n_t + qt (query tile qt of query head g of the group), heads first,
 * then tiles in order; with --deterministic, prefix holds each block-mask row's running count
 * of ones, [rows][Tk + 1] (bwd_turn). Without a block mask entry is NULL: a block's steps are
 * every head's query tiles of query_tiles' range. */
typedef struct { const int *entry, *count, *prefix; int cap; } bwd_lists;

/* Step t of block v: query tile qt of query head g of the kv head's group. */
static __device__ __forceinline__ void bwd_step_of(const bwd_lists bl, int v, int t, int per_head,
                                                   int first, int n_t, int *g, int *qt)
{
    if (bl.entry) {
        const int e = __ldg(bl.entry + (size_t)v * bl.cap + t);
        *g = e / n_t;
        *qt = e % n_t;
        return;
    }
    *g = t / per_head;
    *qt = first + t % per_head;
}

/* --deterministic: the arrivals (two a block) that must precede key tile j's add to query tile
 * qt of head h: two for each key tile before j in the order of qt's semaphore, among the key
 * tiles that list qt: those of its key_tiles range lo .. hi-1, and with a block mask only the
 * ones its mask row holds (counted with the row's prefix sums). The order: that of j; causal,
 * j from hi - 1 down, the shortest blocks (the last key tiles, with the fewest query tiles)
 * first, since they reach qt first; they are also launched first (tiled_backward's rev). So in
 * either order a block only ever waits for blocks launched before it, which wait only for
 * blocks before them: no cycle, whatever order a block's own list is in. */
static __device__ __forceinline__ int bwd_turn(const attn_problem *p, const attn_args *a,
                                               const bwd_lists bl, int b, int h, int j, int qt, int br)
{
    int lo, hi;
    key_tiles(*p, qt * br, br, BWD_Bc, &lo, &hi);
    if (!bl.prefix) return 2 * (p->causal ? hi - 1 - j : j - lo);
    const int Tk = (p->N_k + MASK_TILE - 1) / MASK_TILE;   /* a key tile is a mask column */
    const int *P = bl.prefix + mask_row_index(*p, b, h, qt * br / MASK_TILE) * (Tk + 1);
    return 2 * (p->causal ? __ldg(P + hi) - __ldg(P + j + 1) : __ldg(P + j) - __ldg(P + lo));
}

/* Wait until the semaphore at s reaches `turn` (a load with acquire semantics, so that the adds
 * counted before are visible); a wait past MBAR_TIMEOUT_NS ends the kernel with a named error
 * (hopper_fail), never a hang. */
static __device__ __forceinline__ void sem_wait(const int *s, int turn)
{
    const uint64_t start = global_ns();
    for (;;) {
        int v;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(s) : "memory");
        if (v >= turn) return;
        if (global_ns() - start > MBAR_TIMEOUT_NS) hopper_fail();
    }
}

/* Step t of consumer c: query rows i0 .., head h; stage st of the rings, dSᵀ buffer t % 2.
 * masked (a literal at each call) masks the scores of keys outside the band w (causal, the
 * window) and keys past N_k. dk, dv: this consumer's 64 keys x d accumulators. next: the
 * next step's list entry, read into *e_next before the dQ atomics (NULL: none to read). */
static __device__ __forceinline__ void bwd_step(const attn_problem *p, const attn_args *a,
                                                float *dq_acc, int turn, const band w, int c, int b,
                                                int h, int i0, int j0, int st, int t, float dk[][4],
                                                float dv[][4], const int masked, const int d,
                                                const int fp16, const int wr, const int *next, int *e_next)
{
    const bwd_smem sm = bwd_layout(d, wr);
    const int br = BWD_Br(d), lane = threadIdx.x % WARP, warp = threadIdx.x / WARP % 4;
    const int tid = threadIdx.x % WARPGROUP, u = t % 2;
    const uint32_t Q = sm.Q + st * br * d * 2, dO = sm.dO + st * br * d * 2;
    const float *L = (const float *)(smem_ptr(sm.L) + st * br * 4);
    const float *Dv = (const float *)(smem_ptr(sm.D) + st * br * 4);
    const float scale_log2 = p->scale * LOG2E;

    /* wr: this consumer's dQ slice is free (the writer has read the last step's); waited for
     * here, where no product is in flight. */
    if (wr) mbar_wait(sm.dq_free + 8 * c, u ^ 1);

    /* Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ: M = this consumer's 64 keys, N = br queries. */
    float s[BWD_Br(64) / MMA_N][4], dp[BWD_Br(64) / MMA_N][4];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < d / WGMMA_K; k++) {
        const int box = k * WGMMA_K / BOX_COLS, in_box = k * WGMMA_K % BOX_COLS * 2;
        const uint64_t a_k = wgmma_desc(sm.K + box * BWD_Bc * BOX_ROW + c * WG_ROWS * BOX_ROW + in_box, 16, SWIZZLE_ATOM);
        const uint64_t b_k = wgmma_desc(Q + box * br * BOX_ROW + in_box, 16, SWIZZLE_ATOM);
        if (br == 64) wgmma_ss_n64(&s[0][0], a_k, b_k, k > 0, fp16);
        else          wgmma_ss_n128(&s[0][0], a_k, b_k, k > 0, fp16);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < d / WGMMA_K; k++) {
        const int box = k * WGMMA_K / BOX_COLS, in_box = k * WGMMA_K % BOX_COLS * 2;
        const uint64_t a_k = wgmma_desc(sm.V + box * BWD_Bc * BOX_ROW + c * WG_ROWS * BOX_ROW + in_box, 16, SWIZZLE_ATOM);
        const uint64_t b_k = wgmma_desc(dO + box * br * BOX_ROW + in_box, 16, SWIZZLE_ATOM);
        if (br == 64) wgmma_ss_n64(&dp[0][0], a_k, b_k, k > 0, fp16);
        else          wgmma_ss_n128(&dp[0][0], a_k, b_k, k > 0, fp16);
    }
    wgmma_commit();

    /* Pᵀ from the saved L: no max or sum. This thread's entries are keys key0 + 8 (e / 2) and
     * queries i0 + 8n + 2 (lane % 4) + e % 2. */
    const int key0 = j0 + c * WG_ROWS + warp * 16 + lane / QUAD, q0 = 2 * (lane % QUAD);
    wgmma_wait_1();
    wgmma_hold(&s[0][0], br / 2);
    TRACE_AT(a, 0, t, 2);
#pragma unroll
    for (int n = 0; n < br / MMA_N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int q = MMA_N * n + q0 + e % 2, key = key0 + 8 * (e / 2);
            float x = exp2_fast(fmaf(s[n][e], scale_log2, -L[q]));
            if (masked && (key >= p->N_k || key - (i0 + q) < w.lo || key - (i0 + q) > w.hi)) x = 0.0f;
            s[n][e] = x;
        }
    wgmma_wait_0();
    wgmma_hold(&dp[0][0], br / 2);
#pragma unroll
    for (int n = 0; n < br / MMA_N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[n][e] = s[n][e] * (dp[n][e] - Dv[MMA_N * n + q0 + e % 2]);

    /* Pᵀ and dSᵀ packed: k-slice k (queries 16k .. 16k+15) is the A operand of the products
     * over the queries, as P in the forward's O += P V. */
    uint32_t pa[BWD_Br(64) / 16][4], sa[BWD_Br(64) / 16][4];
#pragma unroll
    for (int k = 0; k < br / 16; k++) {
        pa[k][0] = pack_x2(s[2 * k][0], s[2 * k][1], fp16);
        pa[k][1] = pack_x2(s[2 * k][2], s[2 * k][3], fp16);
        pa[k][2] = pack_x2(s[2 * k + 1][0], s[2 * k + 1][1], fp16);
        pa[k][3] = pack_x2(s[2 * k + 1][2], s[2 * k + 1][3], fp16);
        sa[k][0] = pack_x2(dp[2 * k][0], dp[2 * k][1], fp16);
        sa[k][1] = pack_x2(dp[2 * k][2], dp[2 * k][3], fp16);
        sa[k][2] = pack_x2(dp[2 * k + 1][0], dp[2 * k + 1][1], fp16);
        sa[k][3] = pack_x2(dp[2 * k + 1][2], dp[2 * k + 1][3], fp16);
    }
    TRACE_AT(a, 0, t, 3);
    /* dV_j += Pᵀ dO_i: M = keys, N = d, K = queries; dO_i is the B operand, MN-major (d
     * contiguous), as V_j in the forward. */
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < br / WGMMA_K; k++) {
        const uint64_t b_o = wgmma_desc(dO + k * WGMMA_K * BOX_ROW, br * BOX_ROW, SWIZZLE_ATOM);
        if (d == 64) wgmma_rs_n64(&dv[0][0], pa[k], b_o, 1, fp16);
        else         wgmma_rs_n128(&dv[0][0], pa[k], b_o, 1, fp16);
    }
    wgmma_commit();

    /* dSᵀ to shared memory, [keys][queries] in 64-query boxes, while that product runs: dQ_i's
     * product reads all 128 keys of it, both consumers' rows. */
    const uint32_t dS = sm.dS + u * BWD_Bc * br * 2;
#pragma unroll
    for (int n = 0; n < br / MMA_N; n++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = c * WG_ROWS + warp * 16 + lane / QUAD + 8 * hf, q = MMA_N * n + q0;
            *(uint32_t *)(smem_ptr(dS) + q / BOX_COLS * BWD_Bc * BOX_ROW + box_swz(r, q % BOX_COLS / CHUNK) + q % CHUNK * 2) =
                sa[n / 2][2 * (n % 2) + hf];
        }
    fence_proxy_async();

    /* dQ_i = dS K_j over all 128 keys, once both consumers' dSᵀ is stored: each consumer a
     * 64 x 64 part (d = 128: columns 64c ..; d = 64: rows 64c ..). A = dS, stored transposed
     * (MN-major, queries contiguous), B = K_j (MN-major, d contiguous). Then dK_j += dSᵀ Q_i
     * (Q_i the B operand as dO_i above), which runs while dQ_i's part leaves. */
    bar_sync(BAR_DS, 2 * WARPGROUP);
    TRACE_AT(a, 0, t, 4);
    float dq[64 / MMA_N][4];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BWD_Bc / WGMMA_K; k++) {
        const uint64_t a_k = wgmma_desc(dS + (br == 64 ? 0 : c * BWD_Bc * BOX_ROW) + k * WGMMA_K * BOX_ROW,
                                        BWD_Bc * BOX_ROW, SWIZZLE_ATOM);
        const uint64_t b_k = wgmma_desc(sm.K + (br == 64 ? c * BWD_Bc * BOX_ROW : 0) + k * WGMMA_K * BOX_ROW,
                                        BWD_Bc * BOX_ROW, SWIZZLE_ATOM);
        wgmma_ss_tt_n64(&dq[0][0], a_k, b_k, k > 0, fp16);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < br / WGMMA_K; k++) {
        const uint64_t b_q = wgmma_desc(Q + k * WGMMA_K * BOX_ROW, br * BOX_ROW, SWIZZLE_ATOM);
        if (d == 64) wgmma_rs_n64(&dk[0][0], sa[k], b_q, 1, fp16);
        else         wgmma_rs_n128(&dk[0][0], sa[k], b_q, 1, fp16);
    }
    wgmma_commit();
    wgmma_wait_1();                 /* dV's and dQ's products are done, dK's may run on */
    wgmma_hold(&dq[0][0], 32);
    wgmma_hold(&dv[0][0], d / 2);
    TRACE_AT(a, 0, t, 5);
    /* dO_i (and D_i) are read: every consumer thread releases them. */
    mbar_arrive(sm.o_empty + 8 * st);
    /* The next step's list entry, read before this step's dQ atomics: a read after them waits
     * until they have left the SM. */
    if (next) *e_next = __ldg(next);

    /* dQ_i's part, added to the accumulator: a 16-byte red.global.add.f32 per n, a warp's
     * atomics on 512 consecutive bytes (the accumulator's layout), or (wr) handed to the
     * writer with its turn (bwd_turn, deterministic). Rows past N_q add zeros. */
    if (wr) {   /* to the writer, through this consumer's slice (one at a time) */
        float4 *slice = (float4 *)smem_ptr(sm.dQ + c * DQ_SLICE);
#pragma unroll
        for (int n = 0; n < 64 / MMA_N; n++)
            slice[n * WARPGROUP + tid] = make_float4(dq[n][0], dq[n][1], dq[n][2], dq[n][3]);
        if (tid == 0) ((volatile int *)smem_ptr(sm.turn))[c] = turn;
        fence_proxy_async();
        mbar_arrive(sm.dq_full + 8 * c);
    } else {
        const size_t tile = ((size_t)b * p->H + h) * ((p->N_q + br - 1) / br) + i0 / br;
        float4 *dst = (float4 *)(dq_acc + tile * br * d + (size_t)c * 64 * 64) + tid;
#pragma unroll
        for (int n = 0; n < 64 / MMA_N; n++)
            atomicAdd(dst + n * WARPGROUP, make_float4(dq[n][0], dq[n][1], dq[n][2], dq[n][3]));
    }
    TRACE_AT(a, 0, t, 6);
    wgmma_wait_0();
    wgmma_hold(&dk[0][0], d / 2);
    TRACE_AT(a, 0, t, 7);
    /* Q_i (and L_i) are read. */
    mbar_arrive(sm.q_empty + 8 * st);
}

/* One block: key tile j0 .. j0+Bc-1 of kv head h_kv, batch b. */
static __device__ __forceinline__ void tiled_backward(const attn_problem p, const attn_args a,
                                                      const float *L2, const float *D, float *dq_acc,
                                                      int *sem, const band w, const bwd_lists bl,
                                                      const CUtensorMap *tmQ, const CUtensorMap *tmK,
                                                      const CUtensorMap *tmV, const CUtensorMap *tmO,
                                                      const CUtensorMap *tmdK, const CUtensorMap *tmdV,
                                                      const int d, const int fp16, const int wr)
{
    const bwd_smem sm = bwd_layout(d, wr);
    const int br = BWD_Br(d), wg = __shfl_sync(0xffffffffu, threadIdx.x / WARPGROUP, 0);
    /* key tile j0 / Bc: the launch order, or (causal and deterministic) last first */
    const int b = blockIdx.z, h_kv = blockIdx.y, group = p.H / p.H_kv, rev = sem && p.causal;
    const int j0 = (rev ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x) * BWD_Bc;
    const int n_t = (p.N_q + br - 1) / br, v = (b * p.H_kv + h_kv) * (int)gridDim.x + j0 / BWD_Bc;
    int first, end;   /* the query tiles that see these keys (without a block mask, the steps) */
    query_tiles(p, j0, br, &first, &end);
    const int per_head = end - first, steps = bl.entry ? __ldg(bl.count + v) : group * per_head;
    const int n_pad = n_t * br;
    if (threadIdx.x == 0) {
        mbar_init(sm.kv, 1);
        for (int c = 0; c < 2; c++) {
            mbar_init(sm.dq_full + 8 * c, WARPGROUP);
            mbar_init(sm.dq_free + 8 * c, 1);
        }
        for (int s = 0; s < STAGES; s++) {
            mbar_init(sm.q_full + 8 * s, 1);
            mbar_init(sm.o_full + 8 * s, 1);
            mbar_init(sm.q_empty + 8 * s, 2 * WARPGROUP);
            mbar_init(sm.o_empty + 8 * s, 2 * WARPGROUP);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        SETMAXNREG_DEC(24);
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(sm.kv, 2 * BWD_Bc * d * 2);
            for (int c = 0; c < d / BOX_COLS; c++) {
                tma_load_4d(sm.K + c * BWD_Bc * BOX_ROW, tmK, c * BOX_COLS, j0, h_kv, b, sm.kv);
                tma_load_4d(sm.V + c * BWD_Bc * BOX_ROW, tmV, c * BOX_COLS, j0, h_kv, b, sm.kv);
            }
            for (int t = 0; t < steps; t++) {
                int g, qt;
                bwd_step_of(bl, v, t, per_head, first, n_t, &g, &qt);
                const int h = h_kv * group + g, i0 = qt * br, st = t % STAGES, ph = t / STAGES & 1;
                const size_t row = ((size_t)b * p.H + h) * n_pad + i0;
                TRACE_AT(&a, 0, t, 0);
                mbar_wait(sm.q_empty + 8 * st, ph ^ 1);
                mbar_arrive_expect_tx(sm.q_full + 8 * st, br * d * 2 + br * 4);
                for (int c = 0; c < d / BOX_COLS; c++)
                    tma_load_4d(sm.Q + st * br * d * 2 + c * br * BOX_ROW, tmQ, c * BOX_COLS, i0, h, b, sm.q_full + 8 * st);
                bulk_load(sm.L + st * br * 4, L2 + row, br * 4, sm.q_full + 8 * st);
                TRACE_AT(&a, 0, t, 1);
                mbar_wait(sm.o_empty + 8 * st, ph ^ 1);
                mbar_arrive_expect_tx(sm.o_full + 8 * st, br * d * 2 + br * 4);
                for (int c = 0; c < d / BOX_COLS; c++)
                    tma_load_4d(sm.dO + st * br * d * 2 + c * br * BOX_ROW, tmO, c * BOX_COLS, i0, h, b, sm.o_full + 8 * st);
                bulk_load(sm.D + st * br * 4, D + row, br * 4, sm.o_full + 8 * st);
                TRACE_AT(&a, 0, t, 2);
            }
        } else if (wr && threadIdx.x == WARP) {
            /* The dQ writer: each consumer's part of each step's dQ_i, added to the accumulator
             * by one bulk reduce of 16 KiB (the slice is in the accumulator's own order); the
             * slice is free once the copy has read it. Deterministic: after the key tiles
             * before this one (two arrivals a block, the turn its consumer computed), and
             * counted once the adds have landed. */
            for (int t = 0; t < steps; t++) {
                int g, qt;
                bwd_step_of(bl, v, t, per_head, first, n_t, &g, &qt);
                const size_t tile = ((size_t)b * p.H + h_kv * group + g) * n_t + qt;
                for (int c = 0; c < 2; c++) {
                    mbar_wait(sm.dq_full + 8 * c, t & 1);
                    if (sem && c == 0) sem_wait(sem + tile, ((volatile int *)smem_ptr(sm.turn))[0]);
                    bulk_reduce_add_f32(dq_acc + tile * br * d + (size_t)c * 64 * 64, sm.dQ + c * DQ_SLICE, DQ_SLICE);
                    bulk_commit();
                    bulk_wait_read_0();
                    mbar_arrive(sm.dq_free + 8 * c);
                }
                if (sem) {   /* both slices landed: one wait a step */
                    bulk_wait_0();
                    __threadfence();
                    atomicAdd(sem + tile, 2);
                }
            }
            bulk_wait_0();
        }
        return;
    }
    SETMAXNREG_INC(240);
    const int c = wg - 1;
    float dk[128 / MMA_N][4], dv[128 / MMA_N][4];
#pragma unroll
    for (int n = 0; n < d / MMA_N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    mbar_wait(sm.kv, 0);
    /* The steps that need the mask: keys past N_k (the last key tile), or a query tile that some
     * edge of the band crosses (band_cuts). */
    const int *list = bl.entry ? bl.entry + (size_t)v * bl.cap : NULL;
    int e_next = list && steps > 0 ? __ldg(list) : 0;
    for (int t = 0; t < steps; t++) {
        /* A stored step is read from its list one step ahead (in order: most reads hit L1), not
         * passed by the producer through shared memory as the forward's entries: with that, the
         * d = 64 consumers spill 48 bytes (ptxas, nvcc 13.0). */
        int g, qt;
        if (list) {
            if (!READ_AHEAD) e_next = __ldg(list + t);
            g = e_next / n_t;
            qt = e_next % n_t;
        } else {
            g = t / per_head;
            qt = first + t % per_head;
        }
        const int *next = READ_AHEAD && list && t + 1 < steps ? list + t + 1 : NULL;
        const int h = h_kv * group + g, i0 = qt * br, st = t % STAGES, ph = t / STAGES & 1;
        const int turn = sem ? bwd_turn(&p, &a, bl, b, h, j0 / BWD_Bc, qt, br) : 0;
        TRACE_AT(&a, 0, t, 0);
        mbar_wait(sm.q_full + 8 * st, ph);
        mbar_wait(sm.o_full + 8 * st, ph);
        TRACE_AT(&a, 0, t, 1);
        if (band_cuts(p, w, i0, min(i0 + br, p.N_q) - 1, j0, j0 + BWD_Bc))
            bwd_step(&p, &a, dq_acc, turn, w, c, b, h, i0, j0, st, t, dk, dv, 1, d, fp16, wr, next, &e_next);
        else
            bwd_step(&p, &a, dq_acc, turn, w, c, b, h, i0, j0, st, t, dk, dv, 0, d, fp16, wr, next, &e_next);
    }

    /* dK_j = scale sum dSᵀ Q_i and dV_j = sum Pᵀ dO_i, rounded, into K_j's and V_j's tiles once
     * both consumers are done with them (the other's dQ products read all of K_j), then one TMA
     * store per box; keys past N_k are not written. */
    bar_sync(BAR_DKV, 2 * WARPGROUP);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP % 4;
#pragma unroll
    for (int n = 0; n < d / MMA_N; n++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = c * WG_ROWS + warp * 16 + lane / QUAD + 8 * hf, col = MMA_N * n + 2 * (lane % QUAD);
            const uint32_t at = col / BOX_COLS * BWD_Bc * BOX_ROW + box_swz(r, col % BOX_COLS / CHUNK) + col % CHUNK * 2;
            *(uint32_t *)(smem_ptr(sm.K) + at) = pack_x2(p.scale * dk[n][2 * hf], p.scale * dk[n][2 * hf + 1], fp16);
            *(uint32_t *)(smem_ptr(sm.V) + at) = pack_x2(dv[n][2 * hf], dv[n][2 * hf + 1], fp16);
        }
    fence_proxy_async();
    bar_sync(BAR_DKV, 2 * WARPGROUP);
    if (threadIdx.x == WARPGROUP) {
        for (int col = 0; col < d / BOX_COLS; col++) {
            tma_store_4d(tmdK, sm.K + col * BWD_Bc * BOX_ROW, col * BOX_COLS, j0, h_kv, b);
            tma_store_4d(tmdV, sm.V + col * BWD_Bc * BOX_ROW, col * BOX_COLS, j0, h_kv, b);
        }
        bulk_commit();
        bulk_wait_read_0();
    }
}

typedef void (*backward_fn)(attn_problem, attn_args, const float *, const float *, float *, int *,
                            band, bwd_lists,
                            const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                            const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                            const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap);
#define BWD_KERNEL(name, d, fp16, wr)                                                             \
    static __global__ void __launch_bounds__(BWD_THREADS, 1)                                      \
    name(attn_problem p, attn_args a, const float *L2, const float *D, float *dq_acc, int *sem,    \
         band w, bwd_lists bl,                                                                      \
         const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,         \
         const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmO,         \
         const __grid_constant__ CUtensorMap tmdK, const __grid_constant__ CUtensorMap tmdV)       \
    { tiled_backward(p, a, L2, D, dq_acc, sem, w, bl, &tmQ, &tmK, &tmV, &tmO, &tmdK, &tmdV, d, fp16, wr); }
BWD_KERNEL(backward_64_bf16, 64, 0, DEFAULT_WR)
BWD_KERNEL(backward_64_fp16, 64, 1, DEFAULT_WR)
BWD_KERNEL(backward_128_bf16, 128, 0, DEFAULT_WR)
BWD_KERNEL(backward_128_fp16, 128, 1, DEFAULT_WR)
/* --deterministic: dQ through the writer, in the turns' order (bwd_turn) */
BWD_KERNEL(backward_64_bf16_det, 64, 0, 1)
BWD_KERNEL(backward_64_fp16_det, 64, 1, 1)
BWD_KERNEL(backward_128_bf16_det, 128, 0, 1)
BWD_KERNEL(backward_128_fp16_det, 128, 1, 1)

/* The backward's lists: a warp per key-tile block v (keys j0 .. of kv head h_kv, batch b), whose
 * lanes take 32 of its candidate steps (g, qt) at a time, heads first, then the query tiles of
 * query_tiles' range: a step is listed iff its mask entry is 1 (a key tile is one mask column,
 * a query tile of br <= 128 rows lies in one mask row: no step is cut by the mask, only by the
 * band). Packed by a ballot, as build_lists. */
static __global__ void __launch_bounds__(LIST_THREADS) build_bwd_lists(attn_problem p, attn_args a,
                                                                       int *entry, int *count,
                                                                       int cap)
{
    const int br = BWD_Br(p.d), lane = threadIdx.x % WARP, group = p.H / p.H_kv;
    const int n_kt = (p.N_k + BWD_Bc - 1) / BWD_Bc, n_t = (p.N_q + br - 1) / br;
    const int v = (int)((blockIdx.x * LIST_THREADS + threadIdx.x) / WARP);
    if (v >= n_kt * p.H_kv * p.B) return;   /* a whole warp */
    const int jt = v % n_kt, h_kv = v / n_kt % p.H_kv, b = v / n_kt / p.H_kv;
    int qt_lo, qt_hi, n = 0;
    query_tiles(p, jt * BWD_Bc, br, &qt_lo, &qt_hi);
    const int per_head = qt_hi - qt_lo;
    for (int base = 0; base < group * per_head; base += WARP) {
        const int x = base + lane, g = x / per_head, qt = qt_lo + x % per_head;
        const int on = x < group * per_head &&
                       mask_row(p, a, b, h_kv * group + g, qt * br / MASK_TILE)[jt] != 0;
        const uint32_t ones = __ballot_sync(0xffffffffu, on);
        if (on) entry[(size_t)v * cap + n + __popc(ones & ((1u << lane) - 1))] = g * n_t + qt;
        n += __popc(ones);
    }
    if (lane == 0) count[v] = n;
}

/* --deterministic with a block mask: each mask row's running count of ones, P[0] = 0 and
 * P[k + 1] = P[k] + (entry k != 0), a thread per row (bwd_turn). */
static __global__ void mask_prefix(attn_problem p, attn_args a, int *prefix)
{
    const int Tq = (p.N_q + MASK_TILE - 1) / MASK_TILE, Tk = (p.N_k + MASK_TILE - 1) / MASK_TILE;
    const size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)p.bm_b * p.bm_h * Tq) return;
    const unsigned char *m = a.block_mask + r * Tk;
    int *P = prefix + r * (Tk + 1), ones = 0;
    P[0] = 0;
    for (int k = 0; k < Tk; k++) P[k + 1] = ones += m[k] != 0;
}

static cudaError_t backward(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    float *L2 = (float *)a->ws, *D = (float *)((char *)a->ws + bwd_ld_bytes(p));
    float *dq_acc = (float *)((char *)a->ws + 2 * bwd_ld_bytes(p));
    int *sem = (int *)((char *)dq_acc + bwd_acc_bytes(p));   /* used when deterministic */
    const size_t rows = (size_t)p->B * p->H * bwd_rows(p);
    const size_t zero4 = rows * p->d / 4;
    bwd_preprocess<<<attn_blocks_for(rows * (p->d / CHUNK) > zero4 ? rows * (p->d / CHUNK) : zero4, 256), 256, 0, s>>>(*p, *a, L2, D, dq_acc, sem);
    ATTN_LAUNCH_CHECK();
    const int fp16 = p->dtype == ATTN_FP16, br = BWD_Br(p->d);
    const int det = p->deterministic, wr = det || DEFAULT_WR;
    const backward_fn kernel = p->d == 64 ? (fp16 ? (det ? backward_64_fp16_det : backward_64_fp16)
                                                  : (det ? backward_64_bf16_det : backward_64_bf16))
                                          : (fp16 ? (det ? backward_128_fp16_det : backward_128_fp16)
                                                  : (det ? backward_128_bf16_det : backward_128_bf16));
    CUtensorMap tmQ, tmK, tmV, tmO, tmdK, tmdV;
    if (hopper_tensor_map(&tmQ, a->q, p->dtype, p->d, p->N_q, p->H, p->B, br) ||
        hopper_tensor_map(&tmO, a->d_o, p->dtype, p->d, p->N_q, p->H, p->B, br) ||
        hopper_tensor_map(&tmK, a->k, p->dtype, p->d, p->N_k, p->H_kv, p->B, BWD_Bc) ||
        hopper_tensor_map(&tmV, a->v, p->dtype, p->d, p->N_k, p->H_kv, p->B, BWD_Bc) ||
        hopper_tensor_map(&tmdK, a->dk, p->dtype, p->d, p->N_k, p->H_kv, p->B, BWD_Bc) ||
        hopper_tensor_map(&tmdV, a->dv, p->dtype, p->d, p->N_k, p->H_kv, p->B, BWD_Bc))
        return cudaErrorInvalidValue;
    /* A block mask's lists: the steps of each key tile, and the prefix sums of the turns. */
    bwd_lists bl = { NULL, NULL, NULL, 0 };
    if (p->block_mask) {
        int *l = (int *)((char *)a->ws + bwd_lists_at(p));
        const size_t blocks = bwd_blocks(p);
        bl.count = l;
        bl.entry = l + blocks;
        bl.cap = bwd_cap(p);
        build_bwd_lists<<<attn_blocks_for(blocks * WARP, LIST_THREADS), LIST_THREADS, 0, s>>>(
            *p, *a, l + blocks, l, bl.cap);
        ATTN_LAUNCH_CHECK();
        if (p->deterministic) {
            int *prefix = l + blocks + blocks * bl.cap;
            mask_prefix<<<attn_blocks_for(mask_rows(p), 256), 256, 0, s>>>(*p, *a, prefix);
            ATTN_LAUNCH_CHECK();
            bl.prefix = prefix;
        }
    }
    const size_t smem = bwd_smem_bytes(p->d, wr);
    ATTN_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(attn_ceil_div(p->N_k, BWD_Bc), p->H_kv, p->B);
    attn_args ka = *a;   /* the kernel's a.ws: TRACE=1's stamps */
    ka.ws = (char *)a->ws + bwd_trace_at(p);
    kernel<<<grid, BWD_THREADS, smem, s>>>(*p, ka, L2, D, dq_acc, p->deterministic ? sem : NULL,
                                           diagonal_band(p), bl, tmQ, tmK, tmV, tmO, tmdK, tmdV);
    ATTN_LAUNCH_CHECK();
    bwd_postprocess<<<attn_blocks_for((size_t)p->B * p->H * bwd_rows(p) * p->d / 8, 256), 256, 0, s>>>(*p, dq_acc, a->dq);
    ATTN_LAUNCH_CHECK();
    return trace_write("13_hopper_masks", ka.ws, s);
}

static int check(const attn_problem *p, attn_dir dir, char *why)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        snprintf(why, ATTN_WHY_LEN, "13_hopper_masks cannot query the device");
        return 1;
    }
    if (major != 9 || minor != 0) {
        snprintf(why, ATTN_WHY_LEN, "stage 13_hopper_masks is sm_90a code (wgmma, TMA, setmaxnreg): "
                 "it runs on compute capability 9.0 (H100, H200) only, this GPU is %d.%d", major, minor);
        return 1;
    }
    if (p->d != 64 && p->d != 128 && p->d != 256) {
        snprintf(why, ATTN_WHY_LEN, "head dim %d: stage 13_hopper_masks supports 64, 128 and 256", p->d);
        return 1;
    }
    if (!(p->scale > 0.0f)) {   /* the running max is taken on unscaled scores */
        snprintf(why, ATTN_WHY_LEN, "softmax scale %g: stage 13_hopper_masks needs a positive scale", p->scale);
        return 1;
    }
    if (dir == ATTN_BACKWARD && p->d == 256) {
        snprintf(why, ATTN_WHY_LEN, "head dim 256: the backward of stage 13_hopper_masks supports 64 and 128 "
                 "(dK_j and dV_j of 64 keys x 256 take 256 registers a thread alone)");
        return 1;
    }
    /* The lists' indices are ints: a forward entry holds its key tile in ENTRY_BITS bits. */
    if (attn_ceil_div(p->N_k, Bc(p->d)) >= (1 << ENTRY_BITS) ||
        (p->block_mask && (fwd_tiles(p) * fwd_cap(p) >= INT_MAX || bwd_blocks(p) * bwd_cap(p) >= INT_MAX ||
                           (double)p->H / p->H_kv * attn_ceil_div(p->N_q, BWD_Br(p->d)) >= INT_MAX))) {
        snprintf(why, ATTN_WHY_LEN, "N_q = %d, N_k = %d: the tile lists of stage 13_hopper_masks index "
                 "at most 2^31 entries (and 2^24 key tiles)", p->N_q, p->N_k);
        return 1;
    }
    if (trace_refuse("13_hopper_masks", why)) return 1;
    int smem_max = 0;
    if (attn_smem_per_block(&smem_max)) {
        snprintf(why, ATTN_WHY_LEN, "13_hopper_masks cannot query the device");
        return 1;
    }
    const size_t smem = dir == ATTN_BACKWARD ? bwd_smem_bytes(p->d, p->deterministic || DEFAULT_WR) : smem_bytes(p->d);
    if (smem > (size_t)smem_max) {
        snprintf(why, ATTN_WHY_LEN,
                 "head dim %d needs %zu KiB of shared memory for the tiles; this GPU gives a block "
                 "%d KiB, too little for stage 13_hopper_masks", p->d, (smem + 1023) / 1024, smem_max / 1024);
        return 1;
    }
    return 0;
}

/* The persistent grid's tile counter, or the timeline's stamps when one is recorded (the
 * instrumented build walks tiles in the static order); then a block mask's lists. */
static size_t workspace(const attn_problem *p, attn_dir dir)
{
    if (dir == ATTN_BACKWARD) return bwd_lists_at(p) + bwd_list_bytes(p);
    return fwd_lists_at() + fwd_list_bytes(p);
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
    const int walk = !(p->d == 64 && !(p->causal && persistent(p)));
    const dim3 grid = !walk ? dim3(n_i, p->H, p->B) : dim3(persistent(p) && n_tiles > sms ? sms : n_tiles);
#ifndef TRACE
    if (grid.x < (unsigned)n_tiles)   /* blocks take their tiles after the first from a counter */
        ATTN_TRY(cudaMemsetAsync(a->ws, 0, sizeof(int), s));
#endif
    /* A block mask's lists, and (a 1-D grid) its order of the query tiles, longest first. */
    tile_lists tl = { NULL, NULL, NULL, NULL, 0 };
    if (p->block_mask) {
        int *l = (int *)((char *)a->ws + fwd_lists_at());
        tl.count = l + n_tiles;
        tl.full = l + 2 * (size_t)n_tiles;
        tl.entry = l + 3 * (size_t)n_tiles;
        tl.cap = fwd_cap(p);
        build_lists<<<attn_blocks_for((size_t)n_tiles * WARP, LIST_THREADS), LIST_THREADS, 0, s>>>(
            *p, *a, diagonal_band(p), l + 3 * (size_t)n_tiles, l + n_tiles, l + 2 * (size_t)n_tiles,
            tl.cap);
        ATTN_LAUNCH_CHECK();
        if (walk) {
            sort_tiles<<<1, SORT_THREADS, 0, s>>>(l + n_tiles, l, n_tiles, n_i, G, tl.cap);
            ATTN_LAUNCH_CHECK();
            tl.order = l;
        }
    }
    kernel<<<grid, THREADS(p->d), smem, s>>>(*p, *a, G, diagonal_band(p), tl, tmQ, tmK, tmV, tmO);
    ATTN_LAUNCH_CHECK();
    return trace_write("13_hopper_masks", a->ws, s);
}

ATTN_EXPORT const attn_stage stage_13_hopper_masks = {
    "13_hopper_masks",
    "block-sparse and sliding-window FlashAttention-3: the Hopper pipeline walks per-tile lists",
    "head dim 64, 128 or 256 (backward: 64 and 128); bf16, fp16; any N; causal, sliding window, "
    "block masks; GQA; deterministic dQ; compute capability 9.0 only",
    90,
    check,
    workspace,
    forward,
    backward,
    1,
};
