/* common/trace.cuh: the timeline of a warp-specialised Hopper stage's pipeline, measured.
 *
 * Built only with `make build/<stage> TRACE=1`; without TRACE, TRACE_AT is nothing and the
 * stage carries no trace code. In the instrumented build, with ATTN_TRACE=FILE set, thread 0
 * of each warpgroup of the first TRACE_BLOCKS blocks of head 0, batch 0 stamps the SM's clock
 * (clock64: one clock for all the warpgroups of a block) at the events of each step of the
 * block's first query tile into the workspace; after the call the host writes the stamps to
 * FILE as CSV (block, warpgroup, step, event, cycles), which plots/timeline.sh draws.
 * Stage 8's consumer events, in order: step begins, tiles landed, turn taken, products issued,
 * S ready, softmax done, P V done; producer: wait for a free stage begins, K issued, V issued.
 * Stage 10's are at its TRACE_AT lines (eight a consumer step, three a producer step);
 * plots/timeline.sh names the phases between them, for both.
 */
#ifndef ATTN_TRACE_CUH
#define ATTN_TRACE_CUH

#include <stdio.h>
#include <stdlib.h>
#include "attn.h"

#ifdef TRACE
#define TRACE_BLOCKS 2
#define TRACE_WGS    4     /* the producer and up to 3 consumers */
#define TRACE_STEPS  64
#define TRACE_EVENTS 8
static size_t trace_bytes(void) { return (size_t)TRACE_BLOCKS * TRACE_WGS * TRACE_STEPS * TRACE_EVENTS * 8; }

static __device__ __forceinline__ void trace(const attn_args *a, int step, int event)
{
    if (threadIdx.x % 128 || blockIdx.x >= TRACE_BLOCKS || blockIdx.y || blockIdx.z ||
        step >= TRACE_STEPS)
        return;
    const int wg = threadIdx.x / 128;
    ((long long *)a->ws)[((blockIdx.x * TRACE_WGS + wg) * TRACE_STEPS + step) * TRACE_EVENTS + event] = clock64();
}
/* Event `event` of step `step` of the block's tile-th query tile: only tile 0 is recorded. */
#define TRACE_AT(a, tile, step, event) trace(a, (tile) ? TRACE_STEPS : (step), event)

/* The workspace the stamps need: trace_bytes() when a timeline is asked for, else none. */
static size_t trace_workspace(void) { return getenv("ATTN_TRACE") ? trace_bytes() : 0; }

/* Without TRACE an ATTN_TRACE request is refused; with it, nothing to say. */
static int trace_refuse(const char *stage, char *why) { (void)stage; (void)why; return 0; }

/* The stamps of the call just enqueued on s into ATTN_TRACE's file; entries no event wrote
 * keep the harness' poison (all ones) and are left out. */
static cudaError_t trace_write(const char *stage, const void *ws, cudaStream_t s)
{
    const char *path = getenv("ATTN_TRACE");
    if (!path) return cudaSuccess;
    const size_t n = trace_bytes() / 8;
    long long *t = (long long *)malloc(trace_bytes());
    if (!t) return cudaErrorMemoryAllocation;
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaMemcpy(t, ws, trace_bytes(), cudaMemcpyDeviceToHost);
    FILE *out = e == cudaSuccess ? fopen(path, "w") : NULL;
    if (out) {
        fprintf(out, "block,warpgroup,step,event,cycles\n");
        for (size_t i = 0; i < n; i++)
            if (t[i] != -1)
                fprintf(out, "%d,%d,%d,%d,%lld\n", (int)(i / TRACE_EVENTS / TRACE_STEPS / TRACE_WGS),
                        (int)(i / TRACE_EVENTS / TRACE_STEPS % TRACE_WGS),
                        (int)(i / TRACE_EVENTS % TRACE_STEPS), (int)(i % TRACE_EVENTS), t[i]);
        fclose(out);
    } else if (e == cudaSuccess) {
        fprintf(stderr, "%s: cannot write the timeline to %s\n", stage, path);
    }
    free(t);
    return e;
}
#else
#define TRACE_AT(a, tile, step, event)
static inline size_t trace_workspace(void) { return 0; }
static inline int trace_refuse(const char *stage, char *why)
{
    if (!getenv("ATTN_TRACE")) return 0;
    snprintf(why, ATTN_WHY_LEN, "ATTN_TRACE is set, but this %s records no timeline: build it with "
             "make build/%s TRACE=1", stage, stage);
    return 1;
}
static inline cudaError_t trace_write(const char *stage, const void *ws, cudaStream_t s)
{
    (void)stage; (void)ws; (void)s;
    return cudaSuccess;
}
#endif

#endif /* ATTN_TRACE_CUH */
