/* common/mma_tiles.cuh: swizzled 16-bit tiles in shared memory for the mma.sync stages (5, 6
 * and 12): where a chunk lives (swz), the ldmatrix fragment loaders, the cp.async tile loads and
 * the epilogue through shared memory. The Hopper stages have their own (TMA's swizzle).
 */
#ifndef ATTN_MMA_TILES_CUH
#define ATTN_MMA_TILES_CUH

#include "attn_device.cuh"
#include "mma.cuh"

#define CHUNK   8     /* 16-bit elements in 16 bytes: one cp.async, one ldmatrix row */

/* Byte offset of 16-byte chunk c of row r in a tile of row_bytes per row. The chunk index is
 * XORed with r % 8 (inside each 128-byte segment), so the 8 rows an ldmatrix phase reads at
 * the same logical chunk land on 8 different bank groups. */
static __device__ __forceinline__ uint32_t swz(int r, int c, int row_bytes)
{
    return r * row_bytes + ((c ^ (r & 7)) << 4);
}

/* Fragment loaders. A tile is stored row-major in shared memory; "[m][k]" says what its
 * rows and columns are. Lane l gives the row address for matrix l / 8, row l % 8. Each
 * loader takes the lane's address in the fragment at (0, 0) and moves it: down the rows by
 * adding whole rows, along the columns by XORing the chunk index, since the swizzle is an
 * XOR and the columns step by 16 (an even number of chunks, below row_bytes): so one LOP3
 * per fragment and no address register per column position. Tiles start on a multiple of
 * row_bytes (the shared memory is 1024-byte aligned), so the XOR stays inside the row.
 * A operand (16 x 16) at rows m0.., columns k0.. of a tile stored [m][k] (Q, dO, dS). */
static __device__ __forceinline__ void ldsm_a(uint32_t a[4], uint32_t tile, int row_bytes,
                                              int m0, int k0)
{
    const int lane = threadIdx.x % WARP;
    ldmatrix_x4(a, ((tile + swz(lane & 15, lane / 16, row_bytes)) ^ (k0 / CHUNK << 4)) + m0 * row_bytes);
}

/* A operand (16 x 16, rows m0.., columns k0..) of a tile stored transposed, [k][m]
 * (P_ij, dS_ij read as P_ijᵀ, dS_ijᵀ). */
static __device__ __forceinline__ void ldsm_a_t(uint32_t a[4], uint32_t tile, int row_bytes,
                                                int m0, int k0)
{
    const int lane = threadIdx.x % WARP;
    ldmatrix_x4_trans(a, ((tile + swz((lane & 7) + (lane / 16) * 8, (lane / 8) % 2, row_bytes)) ^
                          (m0 / CHUNK << 4)) + k0 * row_bytes);
}

/* B operands of two neighbouring n-tiles (columns n0..n0+15, reduction k0..k0+15) of a tile
 * stored [n][k] (K_j for Q Kᵀ, V_j for dO Vᵀ): b[0..1] columns n0.., b[2..3] n0+8.. */
static __device__ __forceinline__ void ldsm_b(uint32_t b[4], uint32_t tile, int row_bytes,
                                              int n0, int k0)
{
    const int lane = threadIdx.x % WARP;
    ldmatrix_x4(b, ((tile + swz((lane & 7) + (lane / 16) * 8, (lane / 8) % 2, row_bytes)) ^
                    (k0 / CHUNK << 4)) + n0 * row_bytes);
}

/* Same from a tile stored [k][n] (V_j for P V, dO_i and Q_i for dV and dK, K_j for dQ). */
static __device__ __forceinline__ void ldsm_b_t(uint32_t b[4], uint32_t tile, int row_bytes,
                                                int k0, int n0)
{
    const int lane = threadIdx.x % WARP;
    ldmatrix_x4_trans(b, ((tile + swz(lane & 15, lane / 16, row_bytes)) ^ (n0 / CHUNK << 4)) +
                         k0 * row_bytes);
}

/* Start copying rows n0 .. n0+rows-1 of head h of x ([B, N, heads, d]) into the swizzled tile
 * at shared address tile, and (y not NULL) the same rows of y, a tensor of the same shape,
 * into the tile right after it: 16 bytes per cp.async, one address computation for both.
 * Rows past N are zero-filled (src-size 0, from row N-1's address, so that every address
 * stays inside the tensor): out-of-range queries and keys stay finite. Thread t copies
 * chunk t % (d/8) of rows t / (d/8) + k threads / (d/8). */
static __device__ __forceinline__ void load_tiles(uint32_t tile, const void *x, const void *y,
                                                  int b, int n0, int rows, int N, int h,
                                                  int heads, int d, int threads)
{
    const unsigned chunks = d / CHUNK, c = threadIdx.x % chunks;
    const size_t head = attn_row(b, 0, h, N, heads, d);   /* row 0 of (b, h) */
#pragma unroll
    for (int it = 0; it < rows * (int)chunks / threads; it++) {
        const unsigned r = threadIdx.x / chunks + it * (threads / chunks), n = n0 + r;
        const size_t e = head + (size_t)min(n, (unsigned)N - 1) * (unsigned)(heads * d) + c * CHUNK;
        const uint32_t at = tile + swz(r, c, 2 * d);
        cp_async_16(at, (const uint16_t *)x + e, n < (unsigned)N);
        if (y) cp_async_16(at + rows * 2 * d, (const uint16_t *)y + e, n < (unsigned)N);
    }
}

/* Epilogue, 16 bytes a store: a warp puts its accumulators, rounded in pairs, into a swizzled
 * 16-bit tile at byte offset off of shared memory (put_pair: row r, columns col, col + 1),
 * then copies its own rows r0 .. r0+rows-1, columns c0 .. c0+cols-1, to rows n0 + r of head
 * h of x ([B, N, heads, d]) whole 16-byte chunks at a time (store_rows); rows past N are not
 * written. Only the warp's own rows are read back, so __syncwarp() between the two is enough. */
static __device__ __forceinline__ void put_pair(int off, int row_bytes, int r, int col, uint32_t v)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    *(uint32_t *)(smem + off + swz(r, col / CHUNK, row_bytes) + col % CHUNK * 2) = v;
}

static __device__ __forceinline__ void store_rows(void *x, int off, int r0, int rows, int c0,
                                                  int cols, int b, int n0, int N, int h,
                                                  int heads, int d)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int lane = threadIdx.x % WARP, chunks = cols / CHUNK;
#pragma unroll
    for (int it = 0; it < rows * chunks / WARP; it++) {
        const int e = it * WARP + lane, r = r0 + e / chunks, c = c0 / CHUNK + e % chunks;
        if (n0 + r < N)
            *(uint4 *)((uint16_t *)x + attn_row(b, n0 + r, h, N, heads, d) + c * CHUNK) =
                *(const uint4 *)(smem + off + swz(r, c, 2 * d));
    }
}

#endif
