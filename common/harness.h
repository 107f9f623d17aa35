/* common/harness.h: the host-side harness library (C11).
 *
 * Used by every stage program (through attn_main, see common/main.c) and by the tests.
 * Everything here is independent of any one stage: problem setup, dtype conversions,
 * the float64 oracle, the tolerance check, .npy I/O and the GPU runner (allocation,
 * poisoning, timing). Host tensors hold the raw 16-bit bits of bf16/fp16 elements, and with
 * dtype e4m3 the e4m3 bytes of Q, K, V with their scales (attn_host).
 */
#ifndef ATTN_HARNESS_H
#define ATTN_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_MSG_LEN 512

/* ---- dtypes (dtype.c) -------------------------------------------------------------- */

float    attn_bf16_to_f32(uint16_t h);
uint16_t attn_f32_to_bf16(float f);      /* round to nearest even; NaN stays NaN */
float    attn_f16_to_f32(uint16_t h);
uint16_t attn_f32_to_f16(float f);       /* round to nearest even, overflow -> inf */
/* a 16-bit element of dtype t: bf16 or fp16 (the 16-bit tensors of an e4m3 problem, O, are bf16) */
float    attn_to_f32(uint16_t h, attn_dtype t);
uint16_t attn_from_f32(float f, attn_dtype t);
double   attn_unit_roundoff(attn_dtype t); /* bf16 2^-8, fp16 2^-11, e4m3 2^-4 */
size_t   attn_input_bytes(attn_dtype t);   /* bytes of a Q, K or V element: 2, e4m3 1 */
/* e4m3, one byte: 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, largest
 * finite 448, NaN 0x7F / 0xFF, subnormals down to 2^-9. Encoding rounds to nearest even and
 * saturates to +-448 (infinities too); NaN stays NaN. */
float    attn_e4m3_to_f32(uint8_t x);
uint8_t  attn_f32_to_e4m3(float f);
const char *attn_dtype_name(attn_dtype t); /* "bf16", "fp16", "e4m3" */
int      attn_dtype_parse(const char *s, attn_dtype *t); /* 0 ok */

/* Small fixed PRNG: splitmix64, and a standard normal sample by Box-Muller. */
typedef struct { uint64_t s; int has_spare; double spare; } attn_rng;
void     attn_rng_init(attn_rng *r, uint64_t seed);
uint64_t attn_rng_u64(attn_rng *r);
double   attn_rng_uniform(attn_rng *r);  /* in (0, 1) */
double   attn_rng_normal(attn_rng *r);   /* N(0, 1) */

/* ---- problem and host tensors (problem.c) ------------------------------------------ */

/* B=2 H=4 H_kv=4 N_q=N_k=1000 d=64, non-causal, bf16, scale 1/sqrt(d). */
void   attn_problem_default(attn_problem *p);
/* Limits on a problem's sizes, so that no count wraps: at most ATTN_MAX_ELEMENTS elements a
 * tensor (Q, K, V, L; the .npy reader's cap too), B * H at most INT_MAX (the (batch, head) pairs
 * are counted in int), B and H at most ATTN_MAX_GRID_YZ (the stages launch grids of (tiles, H, B)
 * or (tiles, H_kv, B), and CUDA's y and z go to 65535), N_q and N_k at most ATTN_MAX_SEQLEN
 * (N + 255 fits an int: a count of tiles of up to 256 rows), and a scale at most ATTN_MAX_SCALE (stages take scale * log2(e) * score in
 * float32, which a scale near float's range makes infinite, and NaN the outputs; no use needs
 * more than 1e4, where scores 1e-3 apart already weigh e^10 apart: the softmax is a max). */
#define ATTN_MAX_ELEMENTS ((size_t)1 << 40)
#define ATTN_MAX_GRID_YZ  65535
#define ATTN_MAX_SEQLEN   (0x7FFFFFFF - 255)
#define ATTN_MAX_SCALE    1e4
/* 0 if p is well formed (positive sizes within the limits above, H % H_kv == 0, a positive
 * finite scale up to ATTN_MAX_SCALE); else writes why. */
int    attn_problem_validate(const attn_problem *p, char *why);
size_t attn_numel_q(const attn_problem *p);   /* B*N_q*H*d   (Q, O, dO, dQ) */
size_t attn_numel_kv(const attn_problem *p);  /* B*N_k*H_kv*d (K, V, dK, dV) */
size_t attn_numel_lse(const attn_problem *p); /* B*H*N_q */
/* FLOPs of one call: forward 4*B*H*N_q*N_k*d (half when causal; with a window, 4*B*H*d per
 * visible (query, key) pair), backward 2.5x that. */
double attn_flops(const attn_problem *p, attn_dir dir);
/* The keys query row i sees (causal and window, attn.h): [*lo, *hi), empty if *lo == *hi. Any
 * window up to INT_MAX (the bounds are computed in long long). */
void   attn_visible_keys(const attn_problem *p, int i, int *lo, int *hi);
/* A window wider than N_q + N_k leaves every row the keys that one of N_q + N_k does (|i - j| <
 * N_q + N_k always): set it to that, so that no stage computes i + W past INT_MAX (they do in
 * int). A narrower one, or none, stays as it is. */
void   attn_window_clamp(attn_problem *p);

/* ---- block masks (mask.c) ------------------------------------------------------------- */

/* Tiles of a block mask along the queries and the keys: ceil(N / ATTN_MASK_TILE), any N >= 1. */
int    attn_mask_tiles_q(const attn_problem *p);
int    attn_mask_tiles_k(const attn_problem *p);
size_t attn_mask_bytes(const attn_problem *p);
/* The entry of tile (tq, tk) for (b, h) of mask (broadcast over bm_b, bm_h). */
int    attn_mask_at(const attn_problem *p, const unsigned char *mask, int b, int h, int tq, int tk);
/* Visible (query, key) pairs over every (b, h): causal, window and the mask together. */
double attn_mask_pairs(const attn_problem *p, const unsigned char *mask);
/* A mask from a pattern, for p's sizes: "random:D" (each tile visible with probability D, from
 * seed), "local:W" (tiles within W tokens of the diagonal), "global:G" (the first G tokens'
 * tiles, as queries and as keys), joined by commas to OR them ("local:1024,global:256"), or
 * "strided:S" (key tiles whose distance from the query tile is a multiple of S tiles). Sets
 * p->block_mask, bm_b = bm_h = 1 (random: one mask per (b, h)) and p->pairs. 0, or -1 with a
 * one-line err. */
int    attn_mask_generate(attn_problem *p, unsigned char **mask, const char *spec, uint64_t seed,
                          char *err);
/* Whether spec is a pattern attn_mask_generate takes, for any sizes: items name:value, none
 * empty; random:D a finite density 0 < D <= 1 (digits, a point, an exponent: no sign, blank or
 * hex), alone; local, global and strided a whole number from 1 to INT_MAX, digits only. 0, or -1
 * with a one-line err. */
int    attn_mask_spec_check(const char *spec, char *err);
/* A mask from a .npy file (uint8 or bool, or float 0/1), shape [1 or B, 1 or H, Tq, Tk] for
 * p's sizes; sets p's mask fields as above. 0, or -1 with a one-line err. */
int    attn_mask_load(attn_problem *p, unsigned char **mask, const char *path, char *err);
/* "01_naive forward bf16 B=2 H=4 Hkv=4 Nq=1000 Nk=1000 d=64 causal=0" into buf. */
void   attn_problem_str(const attn_problem *p, const char *stage, attn_dir dir, char *buf, size_t n);

typedef enum {
    ATTN_INPUT_NORMAL = 0,  /* every element N(0,1) */
    ATTN_INPUT_LARGE_LOGITS, /* Q and K scaled by 100: scaled scores of order +-1e4. Meant for
                              * the forward: at that size fp32 scores themselves are off by
                              * ~1e-2, which the backward's recomputed P amplifies */
    ATTN_INPUT_FLAT_ROWS,    /* every key of a head = one vector + 1e-3 noise: near-constant rows */
    ATTN_INPUT_MEDIUM_LOGITS, /* Q and K scaled by 10: scores of order +-1e2, P nearly one-hot */
    ATTN_INPUT_OUTLIERS      /* Q, K, V: N(0,1) plus, with probability 0.001, N(0,100) (standard
                              * deviation 10): FlashAttention-3's test of fp8, outlier features */
} attn_input_kind;
/* --inputs: "normal", "large-logits", "flat-rows", "medium-logits", "outliers" */
const char *attn_input_name(attn_input_kind k);
int    attn_input_parse(const char *s, attn_input_kind *k); /* 0 ok */

/* Host copies of every tensor of one problem. 16-bit tensors hold raw bf16/fp16 bits. With
 * e4m3 (a forward only) q, k, v are NULL: the inputs are q8, k8, v8 with their scales, and O
 * is bf16. */
typedef struct {
    attn_problem p;
    int backward;                /* d_o, dq, dk, dv allocated */
    uint16_t *q, *k, *v, *d_o;   /* inputs */
    uint16_t *o;  float *lse;    /* forward outputs */
    uint16_t *dq, *dk, *dv;      /* backward outputs */
    unsigned char *block_mask;   /* when p.block_mask: [bm_b][bm_h][Tq][Tk], 0 or 1 (freed with t) */
    size_t period;               /* 0, or (attn_host_alloc_timed) q, k, v, d_o hold at most this
                                  * many elements, repeated to fill the tensors on the device,
                                  * and o, lse, dq, dk, dv are not allocated */
    /* e4m3 only (attn.h): */
    unsigned char *q8, *k8, *v8; /* e4m3 bytes, layouts of q, k, v */
    float *q_descale, *k_descale, *v_descale; /* [B * H_kv]: an element stands for its e4m3 value
                                  * times the scale of its (batch, kv head) */
    float *q32, *k32, *v32;      /* the inputs as drawn or loaded, before quantization (as many
                                  * elements as q8, k8, v8) */
} attn_host;

/* The inputs of a run that is only timed (--bench without --check, --save or --load) are drawn
 * for at most ATTN_TIMED_PERIOD elements a tensor and repeated on the device: the time of a
 * stage does not depend on the values, and the host's memory and fill time then stay flat in N
 * (a million tokens of 16 heads would take 36 GiB of host tensors). 2^25 is the sweep's whole
 * tensor (16384 tokens x hidden 2048), so only the long-context shapes repeat. */
#define ATTN_TIMED_PERIOD ((size_t)1 << 25)

int  attn_host_alloc(attn_host *t, const attn_problem *p, int backward); /* 0 ok, -1 no memory */
int  attn_host_alloc_timed(attn_host *t, const attn_problem *p, int backward); /* see period */
void attn_host_free(attn_host *t);
/* Fresh inputs (q, k, v and d_o when allocated) from seed, rounded to p.dtype (e4m3: drawn into
 * q32, k32, v32 and quantized, attn_host_quantize without rotation). Outputs are filled with
 * 0xFF bytes (NaN) so an unwritten element can never pass a check. */
void attn_host_fill(attn_host *t, uint64_t seed, attn_input_kind kind);
/* e4m3: q8, k8, v8 and their scales from q32, k32, v32. Each of Q, K, V has one scale per
 * (batch, kv head), amax / 448 over the slice (Q's over the query heads of the group; 1 when
 * that is 0: an all-zero slice), and an element is stored as e4m3(x / scale). A timed host
 * (period) scales the part it holds. With hadamard (--hadamard), each row of Q and of K is
 * rotated first, x M with M = H_d diag(s) / sqrt(d) (attn_hadamard_row; d a power of two), s
 * one draw of d random signs per (batch, kv head) from seed, shared by the query heads of the
 * group and the keys: (Q M)(K M)^T = Q K^T while an outlier spreads over the head dim; q32 and
 * k32 keep the values before the rotation. attn_host_fill and attn_load_dir quantize without
 * it. 0, or -1 with a one-line err (a value not finite, d not a power of two, no memory). */
int  attn_host_quantize(attn_host *t, int hadamard, uint64_t seed, char *err);
/* x <- x H_d diag(s) / sqrt(d), in place: H_d the Sylvester Hadamard matrix (+-1 entries,
 * H_d H_d^T = d I), by the fast Walsh-Hadamard transform (d log2 d additions); d a power of two,
 * s d signs (+-1). The matrix is orthogonal: dot products of rotated rows are those of the rows. */
void attn_hadamard_row(double *x, int d, const signed char *s);
/* e4m3: the values the kernel computes with, each e4m3 value times its scale, as float (the
 * product rounded once, 2^-24 relative), into malloc'd *q, *k, *v (caller frees). 0, or -1 when
 * out of host memory. */
int  attn_host_dequantize(const attn_host *t, float **q, float **k, float **v);
void attn_host_poison_outputs(attn_host *t);
/* Float copy of a 16-bit host tensor (malloc'd, caller frees; NULL on no memory). */
float *attn_host_to_f32(const uint16_t *x, size_t n, attn_dtype t);

/* ---- oracle (oracle.c): float64 on the CPU, from the rounded inputs ----------------- */

/* Which rows to compute and check. Row masks index the [B, N, heads] row space:
 * mask_q[(b*N_q + i)*H + h], mask_kv[(b*N_k + j)*H_kv + g]. A NULL mask means all rows. */
typedef struct {
    unsigned char *mask_q, *mask_kv;
    unsigned char *mask_unit;     /* backward: [B*H_kv] kv heads whose query heads get a full
                                   * forward (L, D for every row); NULL: all */
    size_t rows_q, rows_kv;       /* number of rows set (checked) */
    int sampled;                  /* 1 if the masks are a sample */
    int assisted;                 /* backward whose heads are too large for the oracle's own
                                   * forward of every row: one kv head, L of its rows from the
                                   * oracle alone, D of the unsampled rows from the run's O
                                   * (see attn_oracle) */
    int skipped;                  /* nothing is checked: a backward too large even assisted, or
                                   * no host memory for the sample masks (see note) */
    char note[ATTN_MSG_LEN];      /* "checked 64 of 16384 rows per head (sampled)" */
} attn_sample;

/* The oracle's results, all float64, full-size arrays (rows outside the sample unset). */
typedef struct {
    double *o, *lse;              /* [B,N_q,H,d], [B,H,N_q] */
    double *dq, *dk, *dv;         /* backward only */
    /* term magnitudes: sqrt(sum over the terms summed into the element of term^2), e.g.
     * o_m[i,c] = sqrt(sum_j (P_ij V_jc)^2); the scale of a kernel's rounding errors */
    double *o_m, *dq_m, *dk_m, *dv_m;
    /* e4m3 only (else NULL), [B,H,N_q]: the size of the addends of row i's scores,
     * t_i = scale sum_j P_ij sum_s max(|Q_i K_j^T over the columns before k-step s|,
     * max over the columns c of k-step s of |Q_ic K_jc|), s the k-steps of ATTN_E4M3_KSTEP
     * columns: the scale of the fp8 tensor cores' error in L (check.c) */
    double *lse_m;
    /* e4m3 only (else NULL), [B,N_q,H,d]: the same for O: c_acc u_acc t'_ic bounds what the
     * scores' errors (each at most c_acc u_acc scale sum_s a_ijs) move O_ic; to first order
     * t'_ic = scale sum_j P_ij (sum_s a_ijs) |V_jc - O_ic| (oracle.c keeps the exponentials) */
    double *o_acc;
} attn_ref;

extern int attn_oracle_threads;   /* 0: min(online CPUs, 16) (default); else this many */

/* Choose the rows to check: everything when B*H*N_q*N_k*d <= 2e9, else a random sample
 * (seeded). For the backward, dK/dV rows need L and D of every query row of their heads,
 * so the sample is restricted to a few heads; if the oracle's forward of even one head is
 * too big, the sample is `assisted` (one head; L from the oracle alone, D from the run's O); if
 * that is too big, skipped. */
void attn_sample_choose(attn_sample *s, const attn_problem *p, attn_dir dir, uint64_t seed);
void attn_sample_all(attn_sample *s);      /* every row */
void attn_sample_free(attn_sample *s);

/* Compute the reference for the rows of s (forward: o, lse; backward also dq, dk, dv,
 * with D from the oracle's own float64 O). Inputs are the rounded host inputs of t.
 * With an assisted sample (backward), t also holds the run's outputs: the oracle computes O
 * and L of the sampled rows itself (they are compared with the run's) and L, never the run's,
 * of every other row of the chosen head; for D = rowsum(dO ∘ O) of those rows it takes the
 * run's 16-bit O, as a kernel does. A skipped s computes nothing (every row stays NaN). Returns
 * 0, or -1 when out of host memory. */
int  attn_oracle(const attn_host *t, attn_dir dir, const attn_sample *s, attn_ref *r);
/* The same from float inputs (the tests perturb them for finite differences); d_o only
 * for the backward; s may be NULL (all rows); block_mask as attn_host's (NULL unless
 * p->block_mask: then -1 without it). An assisted s needs the run's outputs: -1. */
int  attn_oracle_f32(const attn_problem *p, const float *q, const float *k, const float *v,
                     const float *d_o, const unsigned char *block_mask, attn_dir dir,
                     const attn_sample *s, attn_ref *r);
/* e4m3: the forward (O, L) of the rows of s from the inputs before quantization (q32, k32, v32),
 * what the values drawn or loaded give in float64: the reference of what e4m3 costs (attn_rmse),
 * not of the check. 0, or -1 when out of host memory (or not an e4m3 host that holds them all). */
int  attn_oracle_unquantized(const attn_host *t, const attn_sample *s, attn_ref *r);
void attn_ref_free(attn_ref *r);

/* ---- tolerance check (check.c) ----------------------------------------------------- */

typedef enum { ATTN_T_O = 0, ATTN_T_LSE, ATTN_T_DQ, ATTN_T_DK, ATTN_T_DV } attn_tensor;

/* Tolerance rule. With u the unit roundoff of the dtype (bf16 2^-8, fp16 2^-11), an
 * element x with reference r passes iff x is finite and
 *     O, dQ, dK, dV :  |x - r| <= c * u * (|r| + max(s, m)),  m = the oracle's term
 *                      magnitude of the element (attn_ref), s = max(RMS of r, RMS of m)
 *                      over the checked elements of the tensor: an absolute floor at the
 *                      scale of the rounding errors of the sums (for random inputs m ~ |r|
 *                      in RMS; m matters where a sum cancels, e.g. dQ of near-constant rows)
 *     L             :  |x - r| <= c * u32 * (|r| + 1), u32 = 2^-24: L is float32 in every
 *                      stage, computed from float32 scores, so it is held to float32's scale
 * with c = 4 for O, 256 for L and 16 for dQ, dK, dV (P and dS are rounded to 16 bits in
 * the tensor-core stages). NaN and Inf never pass. And each of O, dQ, dK, dV as a whole:
 *     ||x - r||_2 <= c_nw * u * max(||r||_2, ||m||_2),   c_nw = 3
 * over the checked elements. The element-wise bound leaves room for one element's rounding
 * to land far from the average; errors that all lean one way (a bias, a wrong scale, a
 * wrong L in the gradients) add up in the norm instead: rounding alone gives about 0.4 u,
 * correct kernels at most about 1 u, a uniform 2% bias 5 u in bf16 (41 u in fp16). */
/* e4m3 (the forward): O by the same rule with u = 2^-4, e4m3's unit roundoff, and c_nw = 1. The
 * kernel rounds P to e4m3 before P V (relative errors d_j up to u) and, as FlashAttention-3,
 * sums l from P before that rounding (so L's sums keep float32's accuracy), which leaves
 * O - r = sum_j P_j d_j V_j: about u m where the d_j are independent, up to u |r| where a row's
 * probabilities round alike (near-uniform rows, V with a mean): the rule's two terms, with
 * e4m3's u. Nothing else comes near (the bf16 store costs u / 16, fp32 sums far less), and
 * those roundings give about 0.42 u max(||r||, ||m||) in the norm (the RMS relative error of 3
 * mantissa bits), hence c_nw = 1. tests/test_fp8.c simulates a correct kernel (at most 0.35 of
 * the element-wise bound, 0.32 of the norm-wise one, large logits aside) and the layout bugs of
 * an fp8 P V (at least 8.2 and 9.2 times them).
 * e4m3's L gets a second term, for the fp8 tensor cores' accumulator:
 *     L             :  |x - r| <= c * u32 * (|r| + 1) + c_acc * u_acc * t,   u_acc = 2^-13,
 *                      t = the oracle's size of the addends of the row's scores (attn_ref.lse_m)
 * Hopper's fp8 wgmma (e4m3 in, f32 accumulators) does not add in float32: each k-step of 32
 * columns aligns its 33 addends (the accumulator and 32 products) to the largest and truncates
 * them to 13 fraction bits (Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores",
 * arXiv:2512.07004, the H100's model; DeepSeek-V3's report measures about 14 bits). A score
 * S_ij is then off by less than 33 u_acc times the largest addend of each step, and L, to first
 * order, by sum_j P_ij dS_ij: t sums those largest addends over the steps and averages them over
 * the row with P. The truncations lean toward zero and the products' signs mostly differ, so a
 * step costs a few u_acc, not 33: c_acc = 8 is fitted, to a CPU model of those steps
 * (fp8_kstep in tests/test_fp8.c, which reproduces the errors of stage 11's L on the H200): there
 * L uses at most 0.2 of the bound on normal inputs (the short rows of a causal mask; 0.04
 * without one), and 0.4 on the outliers and peaked rows, where a row's largest products lean
 * one way. t is a few units on normal inputs, so L + 0.01 still fails every row (N = 1000 and
 * 4000, d = 128); on the outlier inputs the rows an outlier dominates have t up to a few
 * hundred and bounds above 0.01, and only the other rows catch such a bias.
 * e4m3's O gets the same kind of term, element by element, and its norm in the norm-wise bound:
 *     O             :  |x - r| <= c * u * (|r| + max(s, m)) + c_acc * u_acc * t'
 * Scores off by dS_ij move O_i by sum_j P_ij dS_ij (V_j - O_i) to first order, so
 * t'_ic = scale sum_j P_ij (sum_s a_ijs) |V_jc - O_ic| to first order (attn_ref.o_acc). With
 * large logits (scores of order 10^4) the scores come out several units off, two keys whose
 * scores lie that close can swap, and the oracle keeps the exponentials (oracle.c): the term is
 * then at most the sum of |V_jc - O_ic| over the keys within reach of the row's largest score,
 * and V's range, and a correct kernel whose two top keys swap uses most of it. Elsewhere it adds
 * a few percent to O's element-wise bounds on average and up to half to the norm-wise one
 * (tests/test_fp8.c prints both). */
#define ATTN_TOL_C_O    4.0
#define ATTN_TOL_C_LSE  256.0
#define ATTN_TOL_C_GRAD 16.0
#define ATTN_TOL_C_NW   3.0
#define ATTN_TOL_C_NW_E4M3 1.0
/* e4m3's O also has a bound on its lean, sum (x - r) r / sum r^2: what a uniform bias of O
 * shows as, and what rounding errors that do not lean one way average out of: c_lean u = 2.5%.
 * A correct kernel leans at most 1.1% (near-uniform rows, where every P of a row rounds alike
 * while l sums them unrounded), elsewhere 0.11% (tests/test_fp8.c's simulation, and
 * 11_fp8 on the GPU tests' shapes), growing slowly with N_k (11_fp8 at d = 128: 0.08% at
 * 16384 keys, 0.4% at 262144; near-uniform rows 0.9% at 65536); a uniform bias of 4% fails on
 * every kind of input. */
#define ATTN_TOL_C_LEAN_E4M3 0.4
#define ATTN_U_F32      5.9604644775390625e-08   /* 2^-24: L's unit roundoff */
#define ATTN_TOL_C_ACC  8.0                      /* e4m3's L and O: c_acc */
#define ATTN_U_ACC      1.220703125e-04          /* 2^-13: the fp8 accumulator's fraction bits */
#define ATTN_E4M3_KSTEP 32                       /* columns of one fp8 wgmma k-step (k32) */
double attn_tol_c(attn_tensor k);
const char *attn_tensor_name(attn_tensor k); /* "O", "L", "dQ", "dK", "dV" */

#define ATTN_NFIRST 5
typedef struct {
    attn_tensor kind;
    size_t checked, mismatches;
    double max_abs, max_rel, normwise, rms_ref, c, u;
    double s;                   /* the floor used: max(RMS of r, RMS of m) */
    double worst;               /* max |x - r| / tol: how close to the tolerance (< 1 passes) */
    double nw_bound;            /* the norm-wise bound on normwise (0: none, for L) */
    int nw_fail;                /* normwise > nw_bound */
    double lean, lean_bound;    /* e4m3's O: sum (x - r) r / sum r^2 and its bound (0: none) */
    int lean_fail;              /* |lean| > lean_bound */
    double c_acc;               /* e4m3's O and L: c_acc; else 0 */
    int nfirst;
    struct { int b, n, h, c; double got, want, tol; } first[ATTN_NFIRST];
} attn_cmp;

/* Compare x (16-bit bits, or float for L: pass it as x32) with the float64 reference over
 * the rows of the sample (NULL masks: all); mag: the term magnitudes (NULL: s = RMS r; unused
 * for L); acc: for O and L of an e4m3 problem, the accumulator term's t (attn_ref.o_acc,
 * lse_m; NULL, or another dtype: no such term). Returns 0 if every checked element passes
 * and the norm-wise error is within its bound. */
int attn_compare(attn_cmp *out, attn_tensor kind, const attn_problem *p,
                 const uint16_t *x16, const float *x32, const double *ref, const double *mag,
                 const double *acc, const attn_sample *s);
/* Compare every output of dir of stage run a against the oracle (O, L; with backward
 * also dQ, dK, dV). cmp gets up to 5 entries, *ncmp their count. Returns #failing tensors. */
int attn_compare_all(attn_cmp *cmp, int *ncmp, const attn_host *a, attn_dir dir,
                     const attn_ref *r, const attn_sample *s);
/* The root mean square of x - ref over O's elements of the rows of s (NULL masks: all); x is O
 * (16-bit bits of p's dtype). With attn_oracle_unquantized's reference, what a user of e4m3 loses
 * (FlashAttention-3's Table 3 reports this RMSE). */
double attn_rmse(const attn_problem *p, const uint16_t *x, const double *ref, const attn_sample *s);
/* One line per tensor: "O: PASS max abs 3.1e-03 max rel ... norm-wise ... 0 of N mismatches"
 * followed by the first mismatches with their (b, n, h, c) index. */
void attn_cmp_print(FILE *f, const attn_cmp *c);
/* Short form for the summary: "O max abs 3.1e-03 rel 1.2e-02 nw 2.0e-03". */
void attn_cmp_short(char *buf, size_t n, const attn_cmp *c, int nc);

/* ---- .npy I/O (npy.c) -------------------------------------------------------------- */

/* Write a float32 array (npy v1.0, '<f4', C order). 0 ok; -1 with err set. */
int attn_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                       char *err);
/* Read '<f4' or '<f2' (converted to float32; for a mask also '|u1', '|b1') into a malloc'd
 * array. ndim <= 8. 0 ok; -1 with err naming the file and the problem. Never crashes on garbage. */
int attn_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[8], char *err);
/* --save: q, k, v, o, lse (and do, dq, dk, dv with backward) into dir as .npy (16-bit
 * tensors stored as '<f4', exact; e4m3: q, k, v as q32, k32, v32, and q_descale, k_descale,
 * v_descale [B, H_kv]). --load: q, k, v (and do) from dir, float32 or float16 with finite values,
 * rounded to the dtype, where they must stay finite (e4m3: into q32, k32, v32, then quantized);
 * sets t->p's sizes, which must pass attn_problem_validate. */
int attn_save_dir(const char *dir, const attn_host *t, char *err);
int attn_load_dir(const char *dir, attn_host *t, const attn_problem *p, int backward, char *err);

/* ---- GPU runner (runner.c) --------------------------------------------------------- */

typedef enum {
    ATTN_RUN_OK = 0,
    ATTN_RUN_REFUSED,     /* stage->check() said no, no backward, or device too old */
    ATTN_RUN_NO_MEMORY,   /* tensors + workspace exceed free GPU memory */
    ATTN_RUN_NO_GPU,      /* no CUDA device */
    ATTN_RUN_CUDA_ERROR   /* a CUDA call or the stage failed */
} attn_run_status;

typedef struct {
    int bench;            /* time the stage (L2 flushed before each timed run) */
    int quiet;            /* no progress lines on stderr */
    int ws_poison;        /* the byte the workspace is poisoned with; 0: 0xFF, as the outputs */
    int twice;            /* call the stage's direction twice, its outputs poisoned again before
                           * the second call and its workspace not, as timed runs call it: what
                           * a call leaves in the workspace must not change the next one */
} attn_run_opts;

typedef struct {
    attn_run_status status;
    char why[ATTN_MSG_LEN];     /* one line for any status but OK */
    char device[256];           /* device name */
    int sm;                     /* compute capability x10 */
    size_t tensor_bytes;        /* Q,K,V,O (+dO,dQ,dK,dV; e4m3: + the scales) */
    size_t lse_bytes, stage_ws_bytes;
    size_t workspace_bytes;     /* lse_bytes + stage_ws_bytes (the CSV's workspace_bytes) */
    long long memgetinfo_delta; /* drop of cudaMemGetInfo's free bytes over our allocations */
    double median_ms;           /* with bench */
    int runs;                   /* timed runs */
} attn_run_info;

/* 0 and the device count if CUDA sees a device; else -1 with why set. No other effect. */
int attn_gpu_available(int *count, char *why);

/* Run stage on t (inputs filled). Forward: poison O and L, forward, copy O and L back into
 * t. Backward: as forward, then poison dQ, dK, dV, backward, copy them back (t must have
 * been allocated with backward = 1). The workspace is poisoned before each call (see opts).
 * With opts->bench, then time the call of dir. */
attn_run_status attn_run(const attn_stage *st, attn_host *t, attn_dir dir,
                         const attn_run_opts *opts, attn_run_info *info);

/* ---- the program (cli.c) ----------------------------------------------------------- */

typedef struct {
    attn_problem p;
    attn_dir dir;
    uint64_t seed;
    int check, bench, help;
    const char *csv, *load, *save;
    const char *mask_spec, *mask_file;   /* --mask PATTERN, --block-mask FILE.npy */
    attn_input_kind inputs;              /* --inputs KIND */
    int hadamard;                        /* --hadamard */
    int nq_set, nk_set, scale_set;
    const char *points;                  /* --points FILE (- standard input) */
    int timeout;                         /* --timeout S: seconds a run may take; 0 none */
} attn_cli;

/* Parse argv (no CUDA). 0 ok; 2 with a one-line message in err on bad input. */
int attn_parse_args(attn_cli *c, int argc, char **argv, char *err);
/* One line of a --points file: the flags of the command line argv (its --points included)
 * followed by the line's words, parsed into c. The line is cut at blanks in place, and c
 * points into it; args has room for argc + ATTN_POINT_WORDS + 1 pointers. 0 ok; 1 for a line
 * to skip (blank, or its first word starts with #); 2 with a one-line err (bad flags, quotes,
 * too many words, --points or --help on the line). */
#define ATTN_POINT_WORDS 128
int attn_parse_point(attn_cli *c, int argc, char **argv, char *line, char **args, char *err);
void attn_print_help(FILE *f, const char *prog, const attn_stage *st);
/* Append one row to the CSV file (header first if the file is new or empty). */
int attn_csv_append(const char *path, const char *gpu, const char *stage, const attn_problem *p,
                    attn_dir dir, double median_ms, double tflops, size_t ws_bytes,
                    const char *status, const char *note);
int attn_main(const attn_stage *st, int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_HARNESS_H */
