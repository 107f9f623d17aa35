/* tests/fp8_layout.cu: the layouts stage 11_fp8 assumes, checked on one warpgroup with exact
 * small integers (e4m3 holds -8 .. 8 exactly, so every result must match bit for bit), before
 * the stage itself is trusted. It includes the stage's file, to test its own transpose_v8 and
 * pack_p8:
 *   1. a TMA load of a [N][128]-byte e4m3 tensor (hopper_tensor_map_8bit, 128-byte swizzle);
 *   2. S = Q K^T by wgmma m64n128k32 e4m3 from shared memory, K-major descriptors, 32 bytes a
 *      k-step (the 16-bit descriptor in bytes);
 *   3. V_j transposed by transpose_v8, split over 4 warps as transpose_tile splits it;
 *   4. O = P V by wgmma with P from registers packed by pack_p8 (the 8-bit A fragment assumed
 *      to be mma.m16n8k32's for each warp: register j, byte b holds row g + 8(j%2), k 16(j/2) +
 *      4q + b) and B = Vt through a K-major descriptor;
 *   5. the byte order of cvt.rn.satfinite.e4m3x2.f32 (e4m3x2(x0, x1): x0 in the low byte);
 *   6. transpose_v8 alone at d = 256 (two boxes of V_j), Vt_j read back byte for byte: key k of
 *      column c at row c, position 16(k/16) + 4(k%8/2) + 2(k%16/8) + k%2 (when 4 fails and this
 *      holds, the A fragment is what differs);
 *   7. transpose_v_kernel, the stage's pass over V in HBM, at d = 256 with two kv heads and N_k
 *      not a multiple of 16: Vt [B, d, H_kv, Np] in the same key order, the pad keys zero.
 * Prints one line a part; exits 0 when all hold, 1 otherwise (the part that fails names the
 * assumption), 2 without a compute capability 9.0 GPU. Run by the GPU tests (tests/test_gpu.c:
 * fp8_layouts_hold). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../stages/11_fp8/attention.cu"

#define NK 128   /* keys: Bc */
#define D 128    /* head dim (one 128-byte box) */
#define M 64     /* query rows: one warpgroup */

/* the synthetic P of row i, key k (exact in e4m3) */
static __host__ __device__ int p_of(int i, int k) { return (i * 3 + k * 5) % 9 - 4; }

static __global__ void __launch_bounds__(128, 1)
fp8_layout(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
           const __grid_constant__ CUtensorMap tmV, float *S_out, float *O_out, uint16_t *cvt_out)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Q = smem_u32(smem), K = Q + M * D, V = K + NK * D, Vt = V + NK * D, bar = Vt + D * NK;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, M * D + 2 * NK * D);
        tma_load_4d(Q, &tmQ, 0, 0, 0, 0, bar);
        tma_load_4d(K, &tmK, 0, 0, 0, 0, bar);
        tma_load_4d(V, &tmV, 0, 0, 0, 0, bar);
    }
    mbar_wait(bar, 0);
    __syncwarp();
    /* 3: the transpose, as the stage's producer warps split it */
    for (int i = warp; i < (NK / KEY_GROUP) * (D / COL_BLOCK); i += 4) transpose_v8(V, Vt, i % (NK / KEY_GROUP), i / (NK / KEY_GROUP), D);
    fence_proxy_async();
    __syncthreads();

    /* 2: S = Q Kᵀ */
    float s[NK / 8][4], o[D / 8][4];
    const uint64_t dQ = wgmma_desc(Q, 16, SWIZZLE_ATOM), dK = wgmma_desc(K, 16, SWIZZLE_ATOM);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / WGMMA_K8; k++) {
        if (k == 0) wgmma8_ss_first_n128(&s[0][0], wgmma_desc_add(dQ, 32 * k), wgmma_desc_add(dK, 32 * k));
        else        wgmma8_ss_n128(&s[0][0], wgmma_desc_add(dQ, 32 * k), wgmma_desc_add(dK, 32 * k), 1);
    }
    wgmma_commit();
    wgmma_wait_0();
    wgmma_hold(&s[0][0], NK / 2);
    const int row = warp * 16 + lane / 4;
#pragma unroll
    for (int n = 0; n < NK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            S_out[(row + 8 * (c / 2)) * NK + 8 * n + 2 * (lane % 4) + c % 2] = s[n][c];

    /* 4: P (synthetic, laid out as S's accumulators) packed as consumer_step packs it */
#pragma unroll
    for (int n = 0; n < NK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            s[n][c] = (float)p_of(row + 8 * (c / 2), 8 * n + 2 * (lane % 4) + c % 2);
    uint32_t pa[NK / WGMMA_K8][4];
#pragma unroll
    for (int k = 0; k < NK / WGMMA_K8; k++) pack_p8(pa[k], s, k);
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[n][c] = 0.0f;
    const uint64_t dVt = wgmma_desc(Vt, 16, SWIZZLE_ATOM);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < NK / WGMMA_K8; k++) wgmma8_rs_n128(&o[0][0], pa[k], wgmma_desc_add(dVt, 32 * k), 1);
    wgmma_commit();
    wgmma_wait_0();
    wgmma_hold(&o[0][0], D / 2);
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            O_out[(row + 8 * (c / 2)) * D + 8 * n + 2 * (lane % 4) + c % 2] = o[n][c];
    /* 5: the byte order of the conversion: 1.0 is 0x38, 2.0 0x40 */
    if (threadIdx.x == 0) cvt_out[0] = e4m3x2(1.0f, 2.0f);
}

#define D2 256   /* part 6: the largest head dim, V_j in two 128-byte boxes */
static __global__ void __launch_bounds__(128, 1)
fp8_transpose(const __grid_constant__ CUtensorMap tmV, unsigned char *vt_out)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t V = smem_u32(smem), Vt = V + NK * D2, bar = Vt + D2 * NK;
    const int warp = threadIdx.x / WARP;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, NK * D2);
        for (int c = 0; c < D2 / BOX_ROW; c++) tma_load_4d(V + c * NK * BOX_ROW, &tmV, c * BOX_ROW, 0, 0, 0, bar);
    }
    mbar_wait(bar, 0);
    __syncwarp();
    for (int i = warp; i < (NK / KEY_GROUP) * (D2 / COL_BLOCK); i += 4)
        transpose_v8(V, Vt, i % (NK / KEY_GROUP), i / (NK / KEY_GROUP), D2);
    __syncthreads();
    for (int e = threadIdx.x; e < D2 * NK; e += blockDim.x)   /* row c, position p, unswizzled */
        vt_out[e] = smem[(Vt - V) + box_swz(e / NK, e % NK / 16) + e % 16];
}

static int key_position(int k) { return 16 * (k / 16) + 4 * (k % 8 / 2) + 2 * (k % 16 / 8) + k % 2; }

static unsigned char to_e4m3(int v)   /* small integers only: |v| <= 8 */
{
    if (v == 0) return 0;
    const unsigned char sign = v < 0 ? 0x80 : 0;
    int a = abs(v), e = 0;
    while ((a >> e) > 1) e++;
    const int mant = ((a << 3) >> e) & 7;   /* a = 2^e (1 + mant / 8) */
    return sign | (unsigned char)((e + 7) << 3) | (unsigned char)mant;
}

int main(void)
{
    if (!hopper_device_sm90()) {
        printf("fp8_layout: needs a compute capability 9.0 GPU\n");
        return 2;
    }
    static unsigned char hq[M * D], hk[NK * D], hv[NK * D];
    static int q[M][D], k[NK][D], v[NK][D];
    srand(7);
    for (int i = 0; i < M; i++) for (int c = 0; c < D; c++) { q[i][c] = rand() % 5 - 2; hq[i * D + c] = to_e4m3(q[i][c]); }
    for (int j = 0; j < NK; j++) for (int c = 0; c < D; c++) { k[j][c] = rand() % 5 - 2; hk[j * D + c] = to_e4m3(k[j][c]); }
    for (int j = 0; j < NK; j++) for (int c = 0; c < D; c++) { v[j][c] = rand() % 9 - 4; hv[j * D + c] = to_e4m3(v[j][c]); }
    unsigned char *dq, *dk, *dv;
    float *dS, *dO;
    uint16_t *dcvt;
    cudaMalloc(&dq, sizeof hq); cudaMalloc(&dk, sizeof hk); cudaMalloc(&dv, sizeof hv);
    cudaMalloc(&dS, M * NK * 4); cudaMalloc(&dO, M * D * 4); cudaMalloc(&dcvt, 2);
    cudaMemcpy(dq, hq, sizeof hq, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv, sizeof hv, cudaMemcpyHostToDevice);
    CUtensorMap tq, tk, tv;
    if (hopper_tensor_map_8bit(&tq, dq, D, M, 1, 1, M) || hopper_tensor_map_8bit(&tk, dk, D, NK, 1, 1, NK) ||
        hopper_tensor_map_8bit(&tv, dv, D, NK, 1, 1, NK)) { printf("fp8_layout: tensor map failed\n"); return 1; }
    const int smem = M * D + 3 * NK * D + 64;
    cudaFuncSetAttribute(fp8_layout, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    fp8_layout<<<1, 128, smem>>>(tq, tk, tv, dS, dO, dcvt);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("fp8_layout: %s\n", cudaGetErrorString(e)); return 1; }
    static float S[M * NK], O[M * D];
    uint16_t cvt;
    cudaMemcpy(S, dS, sizeof S, cudaMemcpyDeviceToHost);
    cudaMemcpy(O, dO, sizeof O, cudaMemcpyDeviceToHost);
    cudaMemcpy(&cvt, dcvt, 2, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < M; i++) for (int j = 0; j < NK; j++) {
        int r = 0;
        for (int c = 0; c < D; c++) r += q[i][c] * k[j][c];
        if (S[i * NK + j] != (float)r && bad++ < 8) printf("  S[%d][%d] = %g, want %d\n", i, j, S[i * NK + j], r);
    }
    printf("fp8_layout: S = Q K^T (TMA 8-bit, K-major e4m3 descriptors): %s\n", bad ? "MISMATCH" : "ok");
    int bad_o = 0;
    for (int i = 0; i < M; i++) for (int c = 0; c < D; c++) {
        int r = 0;
        for (int j = 0; j < NK; j++) r += p_of(i, j) * v[j][c];
        if (O[i * D + c] != (float)r && bad_o++ < 8) printf("  O[%d][%d] = %g, want %d\n", i, c, O[i * D + c], r);
    }
    printf("fp8_layout: O = P V (transpose_v8, P packing, 8-bit A fragment): %s\n", bad_o ? "MISMATCH" : "ok");
    printf("fp8_layout: e4m3x2(1, 2) = 0x%04x, want 0x4038: %s\n", cvt, cvt == 0x4038 ? "ok" : "MISMATCH");

    static unsigned char hv2[NK * D2], vt[D2 * NK];
    for (int i = 0; i < NK * D2; i++) hv2[i] = (unsigned char)rand();
    unsigned char *dv2, *dvt;
    cudaMalloc(&dv2, sizeof hv2); cudaMalloc(&dvt, sizeof vt);
    cudaMemcpy(dv2, hv2, sizeof hv2, cudaMemcpyHostToDevice);
    CUtensorMap tv2;
    if (hopper_tensor_map_8bit(&tv2, dv2, D2, NK, 1, 1, NK)) { printf("fp8_layout: tensor map failed\n"); return 1; }
    const int smem2 = 2 * NK * D2 + 64;
    cudaFuncSetAttribute(fp8_transpose, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2);
    fp8_transpose<<<1, 128, smem2>>>(tv2, dvt);
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("fp8_layout: %s\n", cudaGetErrorString(e)); return 1; }
    cudaMemcpy(vt, dvt, sizeof vt, cudaMemcpyDeviceToHost);
    int bad_t = 0;
    for (int k = 0; k < NK; k++) for (int c = 0; c < D2; c++)
        if (vt[c * NK + key_position(k)] != hv2[k * D2 + c] && bad_t++ < 8)
            printf("  Vt[%d][%d] = %d, want V[%d][%d] = %d\n", c, key_position(k), vt[c * NK + key_position(k)], k, c,
                   hv2[k * D2 + c]);
    printf("fp8_layout: Vt at d = %d (transpose_v8, key order): %s\n", D2, bad_t ? "MISMATCH" : "ok");

    /* 7: the pass in HBM */
    attn_problem p3;
    memset(&p3, 0, sizeof p3);
    p3.B = 1; p3.H = p3.H_kv = 2; p3.N_q = p3.N_k = 201; p3.d = D2;
    const int np = vt_keys(&p3);
    static unsigned char hv3[201 * 2 * D2], hvt3[D2 * 2 * 208];
    for (size_t i = 0; i < sizeof hv3; i++) hv3[i] = (unsigned char)(rand() % 255 + 1);   /* no zeros */
    unsigned char *dv3, *dvt3;
    cudaMalloc(&dv3, sizeof hv3); cudaMalloc(&dvt3, sizeof hvt3);
    cudaMemcpy(dv3, hv3, sizeof hv3, cudaMemcpyHostToDevice);
    cudaMemset(dvt3, 0xff, sizeof hvt3);   /* poisoned: every byte must be written */
    transpose_v_kernel<<<dim3(attn_ceil_div(np, VT_KEYS), p3.H_kv, p3.B), 256>>>(p3, dv3, dvt3, np);
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess || np != 208) { printf("fp8_layout: %s, Np %d\n", cudaGetErrorString(e), np); return 1; }
    cudaMemcpy(hvt3, dvt3, sizeof hvt3, cudaMemcpyDeviceToHost);
    int bad_h = 0;
    for (int c = 0; c < D2; c++) for (int h = 0; h < 2; h++) for (int k = 0; k < np; k++) {
        const unsigned char got = hvt3[((size_t)c * 2 + h) * np + key_position(k)];
        const unsigned char want = k < 201 ? hv3[((size_t)k * 2 + h) * D2 + c] : 0;
        if (got != want && bad_h++ < 8)
            printf("  Vt[%d][%d][%d] = %d, want %d (key %d)\n", c, h, key_position(k), got, want, k);
    }
    printf("fp8_layout: Vt in HBM (transpose_v_kernel, N_k = 201, key order, zero pad): %s\n",
           bad_h ? "MISMATCH" : "ok");
    return bad || bad_o || cvt != 0x4038 || bad_t || bad_h;
}
