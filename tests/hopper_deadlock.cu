/* tests/hopper_deadlock.cu: a deadlock of the Hopper stages' pipelines ends in an error, never
 * a hang. One block waits (mbar_wait, common/hopper.cuh) on an mbarrier that nothing arrives
 * on, as a lost arrive or a wrong phase would leave a consumer; past MBAR_TIMEOUT_NS the wait
 * ends the kernel with a fault the host sees. The program prints the error and the time it took
 * and exits 0 when the launch failed within twice the timeout, 1 otherwise (2: no sm_90 GPU).
 * Run by the GPU tests (tests/test_gpu.c: a_deadlock_ends_in_an_error). */
#include <stdio.h>
#include <time.h>
#include "hopper.cuh"

static __global__ void wait_forever(void)
{
    __shared__ __align__(8) uint64_t bar;
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        mbar_fence_init();
    }
    __syncthreads();
    mbar_wait(b, 0);   /* phase 0 never completes: no arrive */
}

int main(void)
{
    if (!hopper_device_sm90()) {
        printf("hopper_deadlock: needs a compute capability 9.0 GPU\n");
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    wait_forever<<<1, 128>>>();
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const double limit = 2e-9 * (double)MBAR_TIMEOUT_NS;
    printf("hopper_deadlock: the launch ended after %.1f s (timeout %.0f s): %s\n", s,
           1e-9 * (double)MBAR_TIMEOUT_NS, e == cudaSuccess ? "no error" : cudaGetErrorString(e));
    return e != cudaSuccess && s < limit ? 0 : 1;
}
