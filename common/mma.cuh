/* common/mma.cuh: thin PTX wrappers for the sm_80 tensor-core path (stage 5, reused by 6).
 *
 * Every function is one instruction (or two) with a name; the kernels read as "load a
 * fragment, multiply, accumulate" instead of walls of inline asm. Nothing here is Hopper
 * only: it all builds for sm_80 and runs unchanged on sm_90.
 *
 * Shared-memory operands are passed as 32-bit shared-window addresses (smem_u32), which
 * is what ldmatrix and cp.async take.
 */
#ifndef ATTN_MMA_CUH
#define ATTN_MMA_CUH

#include <stdint.h>
#include <cuda_fp16.h>

/* Address of a shared-memory object in the shared window (what ldmatrix/cp.async expect). */
static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* The generic address of a shared-window address (smem_u32's inverse), in the dynamic shared
 * memory of the stages that keep it as one array, smem[]. */
static __device__ __forceinline__ unsigned char *smem_ptr(uint32_t addr)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    return smem + (addr - smem_u32(smem));
}

/* Copy 16 bytes global -> shared without passing through registers; when valid is 0 no
 * byte is read and the 16 bytes are zero-filled (src-size 0), for rows past the end. */
static __device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, int valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

/* Same for one 4-byte word (fp32 L and D rows, which are not 16-byte aligned). */
static __device__ __forceinline__ void cp_async_4(uint32_t dst, const void *src, int valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

/* Close the group of cp.async issued so far by this thread (one group per tile). */
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until all of this thread's cp.async groups have landed (follow with a barrier
 * so that the other threads' copies are visible too). */
static __device__ __forceinline__ void cp_async_wait_all(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Wait until at most one group (the most recent) is still in flight. */
static __device__ __forceinline__ void cp_async_wait_1(void)
{
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

/* Four 8x8 matrices of 16-bit elements from shared memory: lane l gives the address of
 * row l%8 of matrix l/8; register r[k] receives row lane/4, elements 2*(lane%4)+{0,1}
 * of matrix k (exactly one mma A/B fragment register). */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* Same, each matrix transposed on the way: r[k] receives column lane/4, elements
 * 2*(lane%4)+{0,1} of the stored rows (a [k][n] tile becomes a col-major B fragment). */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c[16x8] += a[16x16] * b[16x8], bf16 inputs, fp32 accumulators (one warp).
 * Fragment layout, g = lane/4, q = lane%4:
 *   a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..], a[3] = A[g+8][2q+8..]
 *   b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]
 *   c[0..1] = C[g][2q..2q+1], c[2..3] = C[g+8][2q..2q+1] */
static __device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4],
                                                      uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Same with fp16 inputs. */
static __device__ __forceinline__ void mma_f16_16816(float c[4], const uint32_t a[4],
                                                     uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The dtype picks the instruction; callers pass a compile-time constant, so after
 * inlining the branch is gone. */
static __device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4],
                                                 uint32_t b0, uint32_t b1, int fp16)
{
    if (fp16) mma_f16_16816(c, a, b0, b1);
    else      mma_bf16_16816(c, a, b0, b1);
}

/* Two floats rounded to nearest into one bf16x2 register, lo in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Same for f16x2. */
static __device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The 16-bit pair of the given dtype (compile-time constant at the call site). */
static __device__ __forceinline__ uint32_t pack_x2(float lo, float hi, int fp16)
{
    return fp16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

/* Its inverse: two 16-bit values of the dtype, unpacked to fp32 (lo, hi). */
static __device__ __forceinline__ float2 unpack_x2(uint32_t u, int fp16)
{
    if (fp16)
        return make_float2(__half2float(__ushort_as_half((unsigned short)(u & 0xffffu))),
                           __half2float(__ushort_as_half((unsigned short)(u >> 16))));
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

/* 2^x on the special-function unit, one instruction (exp2f adds range fix-ups we do not
 * need: softmax arguments are <= 0, and underflow to 0 is what we want). */
static __device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif /* ATTN_MMA_CUH */
