/* common/attn_device.cuh: device helpers every stage uses (not the lesson of any stage).
 * Element access for the two 16-bit dtypes, the launch check, and named constants. */
#ifndef ATTN_DEVICE_CUH
#define ATTN_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include "attn.h"

#define LOG2E 1.4426950408889634f   /* log2(e): exp(x) = exp2(x * LOG2E) */
#define LN2   0.6931471805599453f   /* ln(2):  log(x) = log2(x) * LN2   */

/* Return the launch error of the kernel just enqueued (stages: `ATTN_LAUNCH_CHECK();`). */
#define ATTN_LAUNCH_CHECK()                                   \
    do {                                                      \
        cudaError_t attn_err_ = cudaGetLastError();           \
        if (attn_err_ != cudaSuccess) return attn_err_;       \
    } while (0)

/* Same, for a cudaError_t-returning call inside a stage. */
#define ATTN_TRY(call)                                        \
    do {                                                      \
        cudaError_t attn_err_ = (call);                       \
        if (attn_err_ != cudaSuccess) return attn_err_;       \
    } while (0)

#define WARP 32   /* threads per warp */

/* Max and sum of x over the 32 lanes of a warp (butterfly: every lane gets the result). */
static __device__ __forceinline__ float warp_max(float x)
{
    for (int o = WARP / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

static __device__ __forceinline__ float warp_sum(float x)
{
    for (int o = WARP / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

static inline int attn_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Blocks of per_block threads (or items) for n items. n can pass 2^32 (stage 1's S at B = 1,
 * H = 16, N = 16384 has 2^32 elements), so it is a size_t; grid x takes up to 2^31 - 1 blocks. */
static inline unsigned attn_blocks_for(size_t n, int per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

/* One 16-bit element of dtype t at index i of base, as float. The dtype is uniform across
 * a launch, so the branch costs no divergence. */
static __device__ __forceinline__ float attn_load(const void *base, size_t i, attn_dtype t)
{
    const unsigned short bits = ((const unsigned short *)base)[i];
    return t == ATTN_FP16 ? __half2float(__ushort_as_half(bits))
                          : __bfloat162float(__ushort_as_bfloat16(bits));
}

/* Store x, rounded to nearest, as dtype t at index i of base. */
static __device__ __forceinline__ void attn_store(void *base, size_t i, float x, attn_dtype t)
{
    ((unsigned short *)base)[i] = t == ATTN_FP16 ? __half_as_ushort(__float2half_rn(x))
                                                 : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* Indices into the [B, N, heads, d] layout and into L [B, H, N_q]. */
static __device__ __forceinline__ size_t attn_row(int b, int n, int h, int N, int heads, int d)
{
    return (((size_t)b * N + n) * heads + h) * d;
}

/* The position (b, n, h, c) of flat index idx in a [B, N, heads, d] tensor. */
typedef struct { int b, n, h, c; } attn_pos;

static __device__ __forceinline__ attn_pos attn_unflatten(size_t idx, int N, int heads, int d)
{
    attn_pos q;
    q.c = (int)(idx % d);
    q.h = (int)(idx / d % heads);
    q.n = (int)(idx / d / heads % N);
    q.b = (int)(idx / d / heads / N);
    return q;
}

#endif /* ATTN_DEVICE_CUH */
