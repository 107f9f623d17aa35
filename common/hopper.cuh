/* common/hopper.cuh: Hopper's asynchronous path (sm_90a), one named function per PTX
 * instruction, shared by the Hopper stages (07 on).
 *
 *   TMA        the tensor memory accelerator copies a box of a tensor global -> shared by
 *              itself, described by a tensor map built on the host (hopper_tensor_map);
 *   mbarrier   a barrier object in shared memory that counts arrivals and bytes; a TMA copy
 *              "completes" by subtracting its bytes from the barrier it names;
 *   wgmma      a warpgroup (4 consecutive warps) issues one asynchronous matrix product
 *              m64 x n x k16, operands read from shared memory through 64-bit descriptors
 *              (A may come from registers), accumulators in registers.
 * TMA and wgmma act in the "async proxy": their accesses to shared memory are not ordered with
 * ordinary loads and stores by __syncthreads alone; the fences below say when they are.
 *
 * Shared-memory tiles here are 16-bit [rows][64] boxes with the 128-byte swizzle: row r is 128
 * bytes at r * 128, its 16-byte chunk c stored at chunk c ^ (r % 8). A head dim d is d / 64 such
 * boxes one after the other (the inner box dimension of a 128-byte swizzle is at most 128
 * bytes). Every box starts 1024-byte aligned (8 rows: one period of the swizzle).
 */
#ifndef ATTN_HOPPER_CUH
#define ATTN_HOPPER_CUH

#include <stdint.h>
#include <stdio.h>
#include <cuda.h>           /* CUtensorMap (a type only: nothing links libcuda) */
#include <cudaTypedefs.h>   /* PFN_cuTensorMapEncodeTiled_v12000 */
#include "attn.h"

#define WARPGROUP   128   /* threads of a warpgroup: the unit that issues a wgmma */
#define WG_ROWS     64    /* rows of a wgmma's A operand and accumulators (m64) */
#define WGMMA_K     16    /* the reduction step of a 16-bit wgmma */
#define WGMMA_K8    32    /* that of an 8-bit (e4m3) wgmma: 32 bytes, as 16-bit's 16 elements */
#define BOX_COLS    64    /* 16-bit columns of a 128-byte swizzled box */
#define BOX_ROW     128   /* bytes per row of such a box */
#define SWIZZLE_ATOM 1024 /* 8 rows x 128 bytes: the swizzle's period and the boxes' alignment */
/* A wait on an mbarrier longer than this is a deadlock (a lost arrive, a wrong phase, a TMA
 * that never completes): the launch is made to fail (hopper_fail), so the harness reports an
 * error naming the shape instead of hanging. A real wait is microseconds; the sanitizers slow
 * it a hundredfold. */
#define MBAR_TIMEOUT_NS 10000000000ull

/* ---- host: tensor maps ------------------------------------------------------------------- */

/* 1 if the current device is compute capability 9.0 (what sm_90a code runs on), else 0. */
static inline int hopper_device_sm90(void)
{
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
           major == 9 && minor == 0;
}

/* cuTensorMapEncodeTiled, a driver function: reached through the runtime's entry-point query,
 * so the program needs no -lcuda. NULL if the driver lacks it. */
static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess && fn)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    return encode;
}

/* A tensor map of a [B, N, heads, d] 16-bit tensor (Q, K, V or O) for boxes of 64 columns x
 * box_rows rows of one (batch, head), 128-byte swizzled. Dimensions innermost first: column
 * (d), row (N, stride heads * d elements), head (stride d), batch. Rows past N read as zeros
 * (and a store there writes nothing). 0 on success. */
static inline int hopper_tensor_map(CUtensorMap *map, const void *base, attn_dtype t, int d, int N,
                             int heads, int B, int box_rows)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return -1;
    const cuuint64_t dims[4] = { (cuuint64_t)d, (cuuint64_t)N, (cuuint64_t)heads, (cuuint64_t)B };
    const cuuint64_t row = (cuuint64_t)heads * d * 2;   /* bytes; dimension 0 is contiguous */
    const cuuint64_t strides[3] = { row, (cuuint64_t)d * 2, row * N };
    const cuuint32_t box[4] = { BOX_COLS, (cuuint32_t)box_rows, 1, 1 };
    const cuuint32_t elem_strides[4] = { 1, 1, 1, 1 };
    const CUresult r = encode(map, t == ATTN_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                              4, (void *)base, dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* The same for a tensor of 1-byte elements (e4m3): boxes of 128 columns (128 bytes) x box_rows
 * rows, 128-byte swizzled; d (bytes a row) a multiple of 16, as the strides must be (stage 11:
 * d = 64, 128, 256, and Vt's Np keys); where d < 128 the box's columns past d read as zeros.
 * 0 on success. */
static inline int hopper_tensor_map_8bit(CUtensorMap *map, const void *base, int d, int N, int heads,
                                         int B, int box_rows)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return -1;
    const cuuint64_t dims[4] = { (cuuint64_t)d, (cuuint64_t)N, (cuuint64_t)heads, (cuuint64_t)B };
    const cuuint64_t row = (cuuint64_t)heads * d;   /* bytes */
    const cuuint64_t strides[3] = { row, (cuuint64_t)d, row * N };
    const cuuint32_t box[4] = { BOX_ROW, (cuuint32_t)box_rows, 1, 1 };
    const cuuint32_t elem_strides[4] = { 1, 1, 1, 1 };
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, (void *)base, dims, strides,
                              box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* ---- device: mbarriers ------------------------------------------------------------------- */

/* Byte offset of 16-byte chunk c of row r in a 128-byte swizzled box (see the top). */
static __device__ __forceinline__ uint32_t box_swz(int r, int c)
{
    return r * BOX_ROW + ((c ^ (r & 7)) << 4);
}

/* Initialise the barrier at shared address bar to expect count arrivals per phase. */
static __device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}

/* Make the initialisations above visible to the other threads and to the async proxy (the TMA
 * unit completes transactions on them); a __syncthreads() follows. */
static __device__ __forceinline__ void mbar_fence_init(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* Arrive once on bar and add bytes to the transactions the current phase waits for: the phase
 * completes when every arrival has happened and that many bytes have landed. */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}

/* Plain arrive (no bytes): for barriers that count threads or warpgroups. */
static __device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

/* 1 once the phase with parity `parity` of bar has completed (the hardware may suspend the
 * thread for a while before answering no). */
static __device__ __forceinline__ int mbar_try_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return (int)done;
}

static __device__ __forceinline__ uint64_t global_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}

/* End the kernel with an error the host sees (an illegal-address fault: a store to address 0),
 * where a program cannot go on. Not `trap`, nor printf: with a trap anywhere in a setmaxnreg
 * region, ptxas (nvcc 13.0) compiles the region with the register count at kernel entry, and
 * spills; a function call makes it serialise every wgmma (C7510). */
static __device__ __forceinline__ void hopper_fail(void)
{
    asm volatile("st.global.u32 [%0], 0;\n exit;\n" :: "l"((uint64_t)0) : "memory");
}

/* Wait for the phase of parity `parity` (a barrier's phases alternate 0, 1, 0, ...: a ring of
 * S stages waits on parity (j / S) % 2 for its j-th use). Bounded: see MBAR_TIMEOUT_NS. */
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    if (mbar_try_wait(bar, parity)) return;
    const uint64_t start = global_ns();
    while (!mbar_try_wait(bar, parity))
        if (global_ns() - start > MBAR_TIMEOUT_NS) hopper_fail();
}

/* ---- device: TMA --------------------------------------------------------------------------- */

/* Copy the box at coordinates (c0 column, c1 row, c2 head, c3 batch) of the tensor described by
 * map (a __grid_constant__ kernel parameter) into shared memory at dst (1024-byte aligned);
 * on landing its bytes complete a transaction of the mbarrier bar. Issued by one thread. */
static __device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0,
                                                   int c1, int c2, int c3, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

/* Copy `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory at src to
 * shared memory at dst, a 1-D bulk copy without a tensor map; on landing the bytes complete a
 * transaction of the mbarrier bar. One thread. */
static __device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                                 uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

/* Store a box from shared memory at src (1024-byte aligned, the same swizzled layout) to the
 * tensor at coordinates (c0, c1, c2, c3); rows past the tensor's end are not written. One
 * thread; the copy runs on after the instruction: commit it, and wait (bulk_wait_read_0)
 * before the shared memory is reused or the block exits. */
static __device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, uint32_t src, int c0,
                                                    int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

/* Add `bytes` of fp32 values (a multiple of 16, both addresses 16-byte aligned) from shared
 * memory at src to global memory at dst, element by element, in the L2 (a 1-D bulk reduce).
 * One thread; committed and waited for as a bulk store. */
static __device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}

/* Copy `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared memory at src to
 * global memory at dst (a 1-D bulk store). One thread; committed and waited for as above. */
static __device__ __forceinline__ void bulk_store(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}

/* Close this thread's bulk stores issued so far into a group; wait until every group has read
 * its shared memory (the global writes may still be in flight: the kernel's end flushes them). */
static __device__ __forceinline__ void bulk_commit(void)
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

static __device__ __forceinline__ void bulk_wait_read_0(void)
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* Wait until every group has completed, its global writes (or reductions) included. */
static __device__ __forceinline__ void bulk_wait_0(void)
{
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* ---- device: named barriers and register reallocation (warp specialisation) --------------- */

/* Named barrier id (1..15; 0 is __syncthreads'): bar_sync waits until `threads` threads (a
 * multiple of 32) have arrived at it, counting itself; bar_arrive counts this thread and goes
 * on. Two warpgroups hand a turn over with them: one syncs on its barrier (128 threads), the
 * other arrives on it (128 more). */
static __device__ __forceinline__ void bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

/* bar_sync for a warp whose threads may arrive apart (after a branch that one thread took, with
 * waits in it): bar.sync is barrier.sync.aligned, which requires the whole warp to execute the
 * one instruction together; barrier.sync without .aligned does not (synccheck holds to it). */
static __device__ __forceinline__ void bar_sync_apart(int id, int threads)
{
    asm volatile("barrier.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

static __device__ __forceinline__ void bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

/* Give registers back to the SM (dec) or take them (inc): every thread of the warpgroup, the
 * count a literal multiple of 8 in 24..256. ptxas honours it only in a kernel with a register
 * cap at entry (__launch_bounds__(threads, 1)) whose roles are the branches of one if/else;
 * otherwise it says so (C7508), which the static check rejects. */
#define SETMAXNREG_DEC(n) SETMAXNREG_("dec", n)
#define SETMAXNREG_INC(n) SETMAXNREG_("inc", n)
#define SETMAXNREG_(op, n) SETMAXNREG_STR_(op, n)   /* expands n (a macro) before the # below */
#define SETMAXNREG_STR_(op, n) asm volatile("setmaxnreg." op ".sync.aligned.u32 " #n ";\n" ::: "memory")

/* Ordinary shared-memory writes of this thread become visible to the async proxy (a TMA store
 * or a wgmma reading what st.shared or stmatrix wrote); a barrier follows. */
static __device__ __forceinline__ void fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- device: wgmma --------------------------------------------------------------------------- */

/* Shared-memory matrix descriptor of an operand made of 128-byte swizzled boxes: start address
 * >> 4 (bits 0-13), leading-dimension byte offset >> 4 (16-29), stride-dimension byte offset >> 4
 * (32-45), swizzle mode 1 = 128 bytes (62-63). The stride offset is the distance between groups
 * of 8 rows (1024 bytes here); the leading offset, for an MN-major operand wider than one box,
 * the distance between the boxes (a K-major operand ignores it). Moving the start address
 * inside a swizzled box walks the operand along K (32 bytes per k16 step for K-major) or along
 * the rows (a whole number of 8-row groups for MN-major). */
static __device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lead, uint32_t stride)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)(lead >> 4) << 16 |
           (uint64_t)(stride >> 4) << 32 | 1ull << 62;
}

/* desc moved on by `bytes` (a multiple of 16). The start address is the low 14-bit field and a
 * shared-memory address stays under 256 KiB, so no carry leaves the low 32 bits: one 32-bit
 * addition, where `desc + (bytes >> 4)` on 64 bits costs ptxas four instructions per wgmma. */
static __device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t desc, uint32_t bytes)
{
    return (uint64_t)(uint32_t)(desc >> 32) << 32 | ((uint32_t)desc + (bytes >> 4));
}

/* Registers written by ordinary code must not be read by a wgmma issued later, nor wgmma
 * accumulators by ordinary code, without these: the fence orders this warpgroup's prior
 * register and shared-memory accesses before the wgmmas that follow; commit closes the wgmmas
 * issued so far into a group; wait_group n blocks until at most n groups are in flight. */
static __device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_wait_0(void)
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_wait_1(void)
{
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

/* The compiler does not know that wgmma_wait is what makes the accumulators final: this empty
 * statement "rewrites" each of the n registers after the wait, so no read of them can be
 * scheduled before it (and no write of them after a wgmma moved before its fence). */
static __device__ __forceinline__ void wgmma_hold(float *d, int n)
{
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}

/* Operand lists of the accumulators: "+f" of d[0..n-1] (read and written), "=f" (written
 * only: a product whose scale_d is 0 does not read them), and the matching "{%0, ..., %n-1}". */
#define WGMMA_D8(d)   "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), \
                      "+f"((d)[4]), "+f"((d)[5]), "+f"((d)[6]), "+f"((d)[7])
#define WGMMA_W8(d)   "=f"((d)[0]), "=f"((d)[1]), "=f"((d)[2]), "=f"((d)[3]), \
                      "=f"((d)[4]), "=f"((d)[5]), "=f"((d)[6]), "=f"((d)[7])
#define WGMMA_W32(d)  WGMMA_W8(d), WGMMA_W8((d) + 8), WGMMA_W8((d) + 16), WGMMA_W8((d) + 24)
#define WGMMA_W40(d)  WGMMA_W32(d), WGMMA_W8((d) + 32)
#define WGMMA_W64(d)  WGMMA_W32(d), WGMMA_W32((d) + 32)
#define WGMMA_D32(d)  WGMMA_D8(d), WGMMA_D8((d) + 8), WGMMA_D8((d) + 16), WGMMA_D8((d) + 24)
#define WGMMA_D40(d)  WGMMA_D32(d), WGMMA_D8((d) + 32)
#define WGMMA_D64(d)  WGMMA_D32(d), WGMMA_D32((d) + 32)
#define WGMMA_D128(d) WGMMA_D64(d), WGMMA_D64((d) + 64)

#define WGMMA_ACC_32 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WGMMA_ACC_40 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39}"
#define WGMMA_ACC_64 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WGMMA_ACC_128 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

/* D[64 x N] (+)= A[64 x 16] B[16 x N], fp32 accumulators, 16-bit TY operands.
 * SS: A and B in shared memory by descriptor, both K-major (trans bits 0): for S = Q Kᵀ, Q_i
 *     and K_j are both stored [rows][d].
 * RS: A in four registers per thread (the accumulator layout of a previous wgmma, packed to
 *     16-bit pairs), B by descriptor, MN-major (trans-b 1): for O += P V, V_j is stored
 *     [keys][d], which is B = V_j [k = keys][n = d] with n contiguous.
 * scale_d = 0 ignores D's old value (the first k-step of a product). The %-numbers of the
 * operands after the accumulators are passed in: they depend on how many there are. */
#define WGMMA_SS(N, TY, ACC, A, B, SC)                                                      \
    "{\n .reg .pred p;\n setp.ne.b32 p, " SC ", 0;\n"                                        \
    " wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " " ACC ", " A ", " B        \
    ", p, 1, 1, 0, 0;\n}\n"
#define WGMMA_RS(N, TY, ACC, A0, A1, A2, A3, B, SC)                                         \
    "{\n .reg .pred p;\n setp.ne.b32 p, " SC ", 0;\n"                                        \
    " wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " " ACC ", {" A0 ", " A1     \
    ", " A2 ", " A3 "}, " B ", p, 1, 1, 1;\n}\n"

/* SS with both operands MN-major (trans-a 1, trans-b 1): for dQ = dS K_j, with dS stored
 * transposed, [keys][queries] (M contiguous), and K_j [keys][d] (N contiguous). */
#define WGMMA_SS_TT(N, TY, ACC, A, B, SC)                                                   \
    "{\n .reg .pred p;\n setp.ne.b32 p, " SC ", 0;\n"                                        \
    " wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " " ACC ", " A ", " B        \
    ", p, 1, 1, 1, 1;\n}\n"

/* One wrapper per shape, written by these two macros: wgmma_ss_n<N>(d, a, b, scale_d, fp16) and
 * wgmma_rs_n<N>(d, a[4], b, scale_d, fp16), d holding N/2 floats per thread. NACC, ACC, DOUT
 * and WOUT are the accumulator count and lists above; the other arguments are the %-numbers
 * of the operands after them. fp16 is a literal at every call, so one asm statement remains.
 * wgmma_ss_first_n<N>(d, a, b, fp16) is the first k-step of a product (scale_d 0) with the
 * accumulators declared outputs only ("=f"): the compiler then need not keep their old values
 * alive until the product is issued (with "+f" they are read, as far as it knows), which can
 * free as many registers as the accumulators take. */
#define WGMMA_SS_FN(N, NACC, ACC, DOUT, WOUT, A, B, SC)                                            \
    static __device__ __forceinline__ void wgmma_ss_n##N(float d[NACC], uint64_t a, uint64_t b,    \
                                                         int scale_d, int fp16)                    \
    {                                                                                              \
        if (fp16) asm volatile(WGMMA_SS(#N, "f16", ACC, A, B, SC)                                  \
                               : DOUT(d) : "l"(a), "l"(b), "r"(scale_d));                          \
        else      asm volatile(WGMMA_SS(#N, "bf16", ACC, A, B, SC)                                 \
                               : DOUT(d) : "l"(a), "l"(b), "r"(scale_d));                          \
    }                                                                                              \
    static __device__ __forceinline__ void wgmma_ss_first_n##N(float d[NACC], uint64_t a,          \
                                                               uint64_t b, int fp16)               \
    {                                                                                              \
        if (fp16) asm volatile(WGMMA_SS(#N, "f16", ACC, A, B, SC) : WOUT(d) : "l"(a), "l"(b), "r"(0)); \
        else      asm volatile(WGMMA_SS(#N, "bf16", ACC, A, B, SC) : WOUT(d) : "l"(a), "l"(b), "r"(0)); \
    }
#define WGMMA_RS_FN(N, NACC, ACC, DOUT, A0, A1, A2, A3, B, SC)                                     \
    static __device__ __forceinline__ void wgmma_rs_n##N(float d[NACC], const uint32_t a[4],       \
                                                         uint64_t b, int scale_d, int fp16)        \
    {                                                                                              \
        if (fp16) asm volatile(WGMMA_RS(#N, "f16", ACC, A0, A1, A2, A3, B, SC)                     \
                               : DOUT(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),     \
                                 "r"(scale_d));                                                    \
        else      asm volatile(WGMMA_RS(#N, "bf16", ACC, A0, A1, A2, A3, B, SC)                    \
                               : DOUT(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),     \
                                 "r"(scale_d));                                                    \
    }

/* m64n64k16, m64n80k16 and m64n128k16 with both operands from shared memory
 * (S = Q Kᵀ). */
WGMMA_SS_FN(64, 32, WGMMA_ACC_32, WGMMA_D32, WGMMA_W32, "%32", "%33", "%34")
WGMMA_SS_FN(80, 40, WGMMA_ACC_40, WGMMA_D40, WGMMA_W40, "%40", "%41", "%42")
WGMMA_SS_FN(128, 64, WGMMA_ACC_64, WGMMA_D64, WGMMA_W64, "%64", "%65", "%66")

/* m64n64k16 with both operands MN-major, from shared memory (the backward's dQ = dS K_j). */
static __device__ __forceinline__ void wgmma_ss_tt_n64(float d[32], uint64_t a, uint64_t b,
                                                       int scale_d, int fp16)
{
    if (fp16) asm volatile(WGMMA_SS_TT("64", "f16", WGMMA_ACC_32, "%32", "%33", "%34")
                           : WGMMA_D32(d) : "l"(a), "l"(b), "r"(scale_d));
    else      asm volatile(WGMMA_SS_TT("64", "bf16", WGMMA_ACC_32, "%32", "%33", "%34")
                           : WGMMA_D32(d) : "l"(a), "l"(b), "r"(scale_d));
}

/* m64n64k16, m64n128k16 and m64n256k16 with A from registers (O += P V, N = d). */
WGMMA_RS_FN(64, 32, WGMMA_ACC_32, WGMMA_D32, "%32", "%33", "%34", "%35", "%36", "%37")
WGMMA_RS_FN(128, 64, WGMMA_ACC_64, WGMMA_D64, "%64", "%65", "%66", "%67", "%68", "%69")
WGMMA_RS_FN(256, 128, WGMMA_ACC_128, WGMMA_D128, "%128", "%129", "%130", "%131", "%132", "%133")

/* ---- device: fp8 (e4m3) --------------------------------------------------------------------- */

/* Two floats to two e4m3 bytes, x0 in the low byte: round to nearest even, saturating to +-448
 * (cvt puts its first operand in the high byte). */
static __device__ __forceinline__ uint16_t e4m3x2(float x0, float x1)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(x1), "f"(x0));
    return r;
}

static __device__ __forceinline__ uint32_t e4m3x4(float x0, float x1, float x2, float x3)
{
    return (uint32_t)e4m3x2(x0, x1) | (uint32_t)e4m3x2(x2, x3) << 16;
}

/* Store four 8 x 8 matrices of 16-bit elements (stmatrix, the inverse of ldmatrix_x4): this
 * thread's r[m] is row lane/4, elements 2(lane%4), +1 of matrix m; lane 8m + i gives the
 * shared-memory address of row i of matrix m (16 bytes). */
static __device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

/* D[64 x N] (+)= A[64 x 32] B[32 x N], fp32 accumulators, e4m3 operands. fp8 wgmma has no
 * transpose bits: both operands K-major (A by descriptor or from four registers of four bytes
 * a thread, B by descriptor). */
#define WGMMA_SS8(N, ACC, A, B, SC)                                                           \
    "{\n .reg .pred p;\n setp.ne.b32 p, " SC ", 0;\n"                                          \
    " wgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 " ACC ", " A ", " B ", p, 1, 1;\n}\n"
#define WGMMA_RS8(N, ACC, A0, A1, A2, A3, B, SC)                                              \
    "{\n .reg .pred p;\n setp.ne.b32 p, " SC ", 0;\n"                                          \
    " wgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 " ACC ", {" A0 ", " A1 ", " A2     \
    ", " A3 "}, " B ", p, 1, 1;\n}\n"

static __device__ __forceinline__ void wgmma8_ss_n128(float d[64], uint64_t a, uint64_t b, int scale_d)
{
    asm volatile(WGMMA_SS8("128", WGMMA_ACC_64, "%64", "%65", "%66")
                 : WGMMA_D64(d) : "l"(a), "l"(b), "r"(scale_d));
}

/* The first k-step of a product (scale_d 0), the accumulators declared written only, as
 * wgmma_ss_first_n<N>. */
static __device__ __forceinline__ void wgmma8_ss_first_n128(float d[64], uint64_t a, uint64_t b)
{
    asm volatile(WGMMA_SS8("128", WGMMA_ACC_64, "%64", "%65", "%66")
                 : WGMMA_W64(d) : "l"(a), "l"(b), "r"(0));
}

static __device__ __forceinline__ void wgmma8_rs_n64(float d[32], const uint32_t a[4], uint64_t b,
                                                     int scale_d)
{
    asm volatile(WGMMA_RS8("64", WGMMA_ACC_32, "%32", "%33", "%34", "%35", "%36", "%37")
                 : WGMMA_D32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma8_rs_n128(float d[64], const uint32_t a[4], uint64_t b,
                                                      int scale_d)
{
    asm volatile(WGMMA_RS8("128", WGMMA_ACC_64, "%64", "%65", "%66", "%67", "%68", "%69")
                 : WGMMA_D64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma8_rs_n256(float d[128], const uint32_t a[4], uint64_t b,
                                                      int scale_d)
{
    asm volatile(WGMMA_RS8("256", WGMMA_ACC_128, "%128", "%129", "%130", "%131", "%132", "%133")
                 : WGMMA_D128(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

#endif /* ATTN_HOPPER_CUH */
