/* common/attn.h: the one interface between the harness and every stage.
 *
 * A stage is one kernel file, stages/NN_name/attention.cu, that exports exactly one
 * descriptor named stage_NN_name (everything else in the file is static). The harness
 * (common/) owns the problem, the tensors, the workspace, the checks and the timing;
 * a stage only enqueues kernels. One test binary links every stage and compares them.
 *
 * Layouts (row-major, like the models use):
 *   Q, O, dQ, dO : [B, N_q, H,    d]   16-bit elements (bf16 or fp16)
 *   K, V, dK, dV : [B, N_k, H_kv, d]   16-bit elements
 *   L (logsumexp): [B, H, N_q]         fp32, natural log: L_i = m_i + log(l_i), of the scaled scores
 * With dtype e4m3 (forward only) Q, K and V hold one e4m3 byte a value and O is bf16. Each
 * (batch, kv head) has its own scale for each of Q, K and V (Q's is shared by the query heads
 * of the group): the value an element stands for is its e4m3 value times that scale, the
 * descale factors q_descale, k_descale, v_descale of attn_args, [B * H_kv] fp32 each, index
 * b * H_kv + kv head. A stage folds q_descale * k_descale into the softmax scale and applies
 * v_descale to O (as FlashAttention-3 does).
 * Query head h reads key/value head h / (H / H_kv) (GQA; MQA when H_kv = 1).
 * Causal: key j is visible to query i iff j <= i (top-left aligned, as PyTorch's
 * is_causal), so with N_q > N_k every row still sees key 0.
 * Sliding window W (window > 0): query i also needs i - W < j, and without causal j < i + W
 * (|i - j| < W). Block mask (block_mask = 1): query i also needs the entry of tile
 * (i / ATTN_MASK_TILE, j / ATTN_MASK_TILE) of its (batch, head) to be 1: a uint8 array
 * [bm_b][bm_h][ceil(N_q / 128)][ceil(N_k / 128)], bm_b = 1 or B and bm_h = 1 or H (broadcast),
 * on the device in attn_args.block_mask. A row that sees no key at all has O = 0, L = -inf.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
#define ATTN_EXPORT extern "C"
extern "C" {
#else
#define ATTN_EXPORT
#endif

typedef enum { ATTN_BF16 = 0, ATTN_FP16 = 1, ATTN_E4M3 = 2 } attn_dtype;
typedef enum { ATTN_FORWARD = 0, ATTN_BACKWARD = 1 } attn_dir;

typedef struct {
    int B, H, H_kv;     /* batch, query heads, key/value heads (H % H_kv == 0) */
    int N_q, N_k;       /* query and key sequence lengths (>= 1) */
    int d;              /* head dim */
    int causal;         /* 0 or 1, see above */
    int window;         /* sliding window W, see above; 0: none */
    int block_mask;     /* 1: a block mask applies, see above */
    int bm_b, bm_h;     /* its batch and head extents (1: broadcast) */
    double pairs;       /* with a block mask: the visible (query, key) pairs over all (b, h), for
                         * the FLOP count (attn_mask_pairs); 0 otherwise */
    float scale;        /* softmax scale, default 1/sqrt(d) */
    attn_dtype dtype;   /* of Q, K, V, O, dO, dQ, dK, dV (e4m3: of Q, K, V; O is bf16) */
    int deterministic;  /* backward: reduce dQ deterministically (stages that offer it) */
} attn_problem;

/* Device pointers handed to a stage. The harness allocates every one of them. */
typedef struct {
    const void *q, *k, *v;
    void *o;            /* forward writes; backward reads */
    float *lse;         /* forward writes; backward reads */
    const void *d_o;    /* backward only: dO */
    void *dq, *dk, *dv; /* backward only: written (the harness poisons them first) */
    const unsigned char *block_mask; /* the block mask on the device (p.block_mask), or NULL */
    void *ws;           /* workspace of stage->workspace(p, dir) bytes, 256-byte aligned, */
    size_t ws_bytes;    /* contents undefined on entry (poisoned by the harness)          */
    /* e4m3: the scales of Q, K and V, [B * H_kv] each (see above); NULL for 16-bit dtypes */
    const float *q_descale, *k_descale, *v_descale;
} attn_args;

#define ATTN_WHY_LEN 256
#define ATTN_MASK_TILE 128   /* rows and columns of a block mask's tile */

typedef struct attn_stage {
    const char *name;       /* "01_naive": the directory name under stages/ */
    const char *summary;    /* one line: what this stage teaches */
    const char *supports;   /* one line: head dims, dtypes, causal, GQA, limits */
    int min_sm;             /* lowest compute capability x10 it runs on (80, 90) */
    /* 0 if the stage can run p in direction dir on the current device; otherwise writes
     * one line (no newline) saying why into why[ATTN_WHY_LEN] and returns non-zero.
     * The harness checks memory (inputs + workspace vs free GPU memory) itself. */
    int (*check)(const attn_problem *p, attn_dir dir, char *why);
    /* bytes of scratch the stage needs for p in direction dir (S and P in stage 1, D in
     * stage 4, ...); 0 if none. Never cudaMalloc inside forward/backward. */
    size_t (*workspace)(const attn_problem *p, attn_dir dir);
    /* Enqueue the work on stream s and return the first launch error (cudaGetLastError
     * after each launch), cudaSuccess otherwise. No synchronisation needed. */
    cudaError_t (*forward)(const attn_problem *p, const attn_args *a, cudaStream_t s);
    cudaError_t (*backward)(const attn_problem *p, const attn_args *a, cudaStream_t s); /* NULL: none */
    int masks;              /* 1 if it runs windows and block masks; 0 (unset): the harness refuses them */
    int fp8;                /* 1 if it runs dtype e4m3; 0 (unset): the harness refuses it;
                             * ATTN_FP8_ONLY: e4m3 only, the harness refuses bf16 and fp16 */
} attn_stage;

#define ATTN_FP8_ONLY 2     /* attn_stage.fp8 of a stage that runs e4m3 and no 16-bit dtype */

/* Host, from the harness: the shared memory a block may opt in to on the current device, in
 * bytes, into *bytes; 0 on success. ATTN_SMEM_PER_BLOCK=n (bytes) lowers it, to see what a
 * smaller GPU refuses or runs differently (an RTX 4090 or RTX A6000 gives a block 101376, an
 * A100 166912). Stages size their tiles and write check()'s refusals with it. */
int attn_smem_per_block(int *bytes);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */
