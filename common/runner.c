/* common/runner.c: runs one stage on the GPU. Allocates every tensor and the workspace
 * (stages never allocate), poisons outputs and workspace with 0xFF bytes (NaN in bf16, fp16
 * and fp32; the workspace another byte if asked) before every checked run, and times the stage
 * with CUDA events, L2 flushed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"

/* Every CUDA call is checked: on error, record "file:line: call: error string" and bail. */
#define CHECK(call)                                                                         \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            snprintf(info->why, sizeof info->why, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                     cudaGetErrorString(e_));                                               \
            info->status = ATTN_RUN_CUDA_ERROR;                                             \
            goto out;                                                                       \
        }                                                                                   \
    } while (0)

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* The bench protocol; plots/anchors.py reads these #defines (keep each `#define NAME value`)
 * and times the PyTorch anchors by the same rules. Under sustained load the H200 holds its
 * boost clock for only the first ~70 ms and then settles about 10% lower (docs/notes.md,
 * "Timing"). So a shape first runs untimed until the clock has settled (SETTLE_MS, twice
 * those ~70 ms), and is then timed in that state, whatever ran before it. Every run, settling
 * or timed, is preceded by the L2 flush (outside its events); runs are queued about CHUNK_MS
 * at a time between host waits, so the GPU does not idle between them. */
#define SETTLE_MS 150.0        /* untimed runs first: this much time in the stage ... */
#define SETTLE_MIN_RUNS 2      /* ... and at least this many runs, */
#define SETTLE_ONE_MS 250.0    /* or one run this long (it settles the clock itself) */
#define BENCH_MIN_RUNS 10      /* then timed runs: at least this many ... */
#define BENCH_MIN_MS 250.0     /* ... and this much time, */
#define BENCH_MAX_RUNS 200     /* at most this many; */
#define BENCH_SLOW_RUNS 1      /* a slow shape stops after this many runs ... */
#define BENCH_SLOW_MS 500.0    /* ... once this much was timed */
#define CHUNK_MS 20.0          /* runs queued at once: about this much GPU time, */
#define CHUNK_MAX 32           /* at most this many */

int attn_smem_per_block(int *bytes)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 1;
    const char *cap = getenv("ATTN_SMEM_PER_BLOCK");   /* validated by attn_parse_args */
    const long n = cap ? strtol(cap, NULL, 10) : 0;
    if (n > 0 && n < *bytes) *bytes = (int)n;
    return 0;
}

int attn_gpu_available(int *count, char *why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (count) *count = n;
    if (e != cudaSuccess) {
        snprintf(why, ATTN_MSG_LEN, "%s", cudaGetErrorString(e));
        cudaGetLastError(); /* clear */
        return -1;
    }
    if (n == 0) {
        snprintf(why, ATTN_MSG_LEN, "cudaGetDeviceCount found 0 devices");
        return -1;
    }
    return 0;
}

typedef struct {
    void *q, *k, *v, *o, *d_o, *dq, *dk, *dv, *ws, *flush, *mask;
    float *lse, *q_descale, *k_descale, *v_descale;
} dev_bufs;

static cudaError_t launch(const attn_stage *st, attn_dir dir, const attn_problem *p,
                          const attn_args *a, cudaStream_t s)
{
    return dir == ATTN_BACKWARD ? st->backward(p, a, s) : st->forward(p, a, s);
}

/* Copies n elements of `size` bytes (2, or 1 for e4m3's inputs) to dst on the device: all of
 * src, or (period < n: a timed run's inputs, attn_host_alloc_timed) its first period elements,
 * then the filled part doubled onto what follows until n are there. */
static cudaError_t put_input(void *dst, const void *src, size_t n, size_t size, size_t period,
                             cudaStream_t s)
{
    const size_t have = period && period < n ? period : n;
    cudaError_t e = cudaMemcpyAsync(dst, src, have * size, cudaMemcpyHostToDevice, s);
    for (size_t done = have; e == cudaSuccess && done < n; done *= 2)
        e = cudaMemcpyAsync((char *)dst + done * size, dst,
                            (done < n - done ? done : n - done) * size, cudaMemcpyDeviceToDevice, s);
    return e;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

attn_run_status attn_run(const attn_stage *st, attn_host *t, attn_dir dir,
                         const attn_run_opts *opts, attn_run_info *info)
{
    attn_problem pw = t->p;   /* the stages get a window of at most N_q + N_k */
    attn_window_clamp(&pw);
    const attn_problem *p = &pw;
    const int bwd = dir == ATTN_BACKWARD;
    dev_bufs d = { 0 };
    cudaStream_t stream = NULL;
    cudaEvent_t ev[2 * CHUNK_MAX] = { 0 };   /* start and end of each queued run */
    float *times = NULL;
    memset(info, 0, sizeof *info);
    info->status = ATTN_RUN_OK;

    int ndev;
    if (attn_gpu_available(&ndev, info->why)) {
        char tmp[ATTN_MSG_LEN];
        snprintf(tmp, sizeof tmp, "no CUDA GPU (%s)", info->why);
        snprintf(info->why, sizeof info->why, "%s", tmp);
        return info->status = ATTN_RUN_NO_GPU;
    }
    (void)cudaGetLastError();   /* an error an earlier run left (e.g. out of memory) is not this one's */
    int dev;
    struct cudaDeviceProp prop;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(info->device, sizeof info->device, "%s", prop.name);
    info->sm = prop.major * 10 + prop.minor;
    if (info->sm < st->min_sm) {
        snprintf(info->why, sizeof info->why, "needs compute capability %d.%d, %s is %d.%d",
                 st->min_sm / 10, st->min_sm % 10, prop.name, prop.major, prop.minor);
        return info->status = ATTN_RUN_REFUSED;
    }
    if (bwd && !st->backward) {
        snprintf(info->why, sizeof info->why, "has no backward pass");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->window > 0 && !st->masks) {
        snprintf(info->why, sizeof info->why, "has no sliding window (--window %d): a dense stage", p->window);
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->block_mask && !st->masks) {
        snprintf(info->why, sizeof info->why, "has no block masks (--mask, --block-mask): a dense stage");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->dtype == ATTN_E4M3 && !st->fp8) {
        snprintf(info->why, sizeof info->why, "has no e4m3 forward (--dtype e4m3): a 16-bit stage");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->dtype != ATTN_E4M3 && st->fp8 == ATTN_FP8_ONLY) {
        snprintf(info->why, sizeof info->why, "runs e4m3 inputs only (--dtype e4m3): an fp8 stage");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->dtype == ATTN_E4M3 && bwd) {
        snprintf(info->why, sizeof info->why, "e4m3 is forward only (no --backward)");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (p->block_mask && !t->block_mask) {
        snprintf(info->why, sizeof info->why, "internal: a block-masked problem without its mask");
        return info->status = ATTN_RUN_REFUSED;
    }
    if (bwd && !t->backward) {
        snprintf(info->why, sizeof info->why, "internal: host tensors allocated without backward");
        return info->status = ATTN_RUN_REFUSED;
    }
    char why[ATTN_WHY_LEN] = { 0 };
    /* the backward run also runs the forward, so both must be supported */
    if (st->check(p, ATTN_FORWARD, why) || (bwd && st->check(p, ATTN_BACKWARD, why))) {
        why[ATTN_WHY_LEN - 1] = 0;
        snprintf(info->why, sizeof info->why, "%s", why);
        return info->status = ATTN_RUN_REFUSED;
    }

    /* sizes: Q, K, V of eb bytes an element, O (and dO, dQ, dK, dV) of 2; e4m3's scales */
    const int e4m3 = p->dtype == ATTN_E4M3;
    const size_t eb = attn_input_bytes(p->dtype), ns = e4m3 ? (size_t)p->B * p->H_kv : 0;
    size_t nq = attn_numel_q(p), nkv = attn_numel_kv(p);
    size_t ws_f = st->workspace(p, ATTN_FORWARD), ws_b = bwd ? st->workspace(p, ATTN_BACKWARD) : 0;
    size_t ws = ws_f > ws_b ? ws_f : ws_b;
    info->tensor_bytes = (nq + 2 * nkv) * eb + nq * 2 + 3 * ns * sizeof(float) +
                         (bwd ? (nq + nkv) * 2 * 2 : 0);
    info->lse_bytes = attn_numel_lse(p) * sizeof(float);
    info->stage_ws_bytes = ws;
    info->workspace_bytes = info->lse_bytes + ws;
    size_t flush_bytes = opts && opts->bench ? 2 * (size_t)prop.l2CacheSize : 0;

    size_t free0, total0, free1, total1;
    CHECK(cudaFree(0)); /* create the context first, so it is not counted below */
    CHECK(cudaMemGetInfo(&free0, &total0));
    size_t need = info->tensor_bytes + info->workspace_bytes + flush_bytes;
    if (need > free0) {
        snprintf(info->why, sizeof info->why,
                 "needs %.2f GiB (workspace %.2f GiB: L %.2f GiB + stage %.2f GiB) but the GPU "
                 "has %.2f GiB free", need / GIB, info->workspace_bytes / GIB,
                 info->lse_bytes / GIB, ws / GIB, free0 / GIB);
        return info->status = ATTN_RUN_NO_MEMORY;
    }

    CHECK(cudaMalloc(&d.q, nq * eb));
    CHECK(cudaMalloc(&d.o, nq * 2));
    CHECK(cudaMalloc(&d.k, nkv * eb));
    CHECK(cudaMalloc(&d.v, nkv * eb));
    CHECK(cudaMalloc((void **)&d.lse, info->lse_bytes));
    if (e4m3) {
        CHECK(cudaMalloc((void **)&d.q_descale, ns * sizeof(float)));
        CHECK(cudaMalloc((void **)&d.k_descale, ns * sizeof(float)));
        CHECK(cudaMalloc((void **)&d.v_descale, ns * sizeof(float)));
    }
    if (ws) CHECK(cudaMalloc(&d.ws, ws));
    if (bwd) {
        CHECK(cudaMalloc(&d.d_o, nq * 2));
        CHECK(cudaMalloc(&d.dq, nq * 2));
        CHECK(cudaMalloc(&d.dk, nkv * 2));
        CHECK(cudaMalloc(&d.dv, nkv * 2));
    }
    CHECK(cudaMemGetInfo(&free1, &total1));
    info->memgetinfo_delta = (long long)free0 - (long long)free1;
    if (flush_bytes) CHECK(cudaMalloc(&d.flush, flush_bytes)); /* outside the measured part */
    if (p->block_mask) CHECK(cudaMalloc(&d.mask, attn_mask_bytes(p)));

    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const void *hq = e4m3 ? (const void *)t->q8 : t->q, *hk = e4m3 ? (const void *)t->k8 : t->k;
    const void *hv = e4m3 ? (const void *)t->v8 : t->v;
    CHECK(put_input(d.q, hq, nq, eb, t->period, stream));
    CHECK(put_input(d.k, hk, nkv, eb, t->period, stream));
    CHECK(put_input(d.v, hv, nkv, eb, t->period, stream));
    if (bwd) CHECK(put_input(d.d_o, t->d_o, nq, 2, t->period, stream));
    if (e4m3) {
        CHECK(cudaMemcpyAsync(d.q_descale, t->q_descale, ns * sizeof(float), cudaMemcpyHostToDevice, stream));
        CHECK(cudaMemcpyAsync(d.k_descale, t->k_descale, ns * sizeof(float), cudaMemcpyHostToDevice, stream));
        CHECK(cudaMemcpyAsync(d.v_descale, t->v_descale, ns * sizeof(float), cudaMemcpyHostToDevice, stream));
    }
    if (p->block_mask)
        CHECK(cudaMemcpyAsync(d.mask, t->block_mask, attn_mask_bytes(p), cudaMemcpyHostToDevice, stream));

    attn_args a = { 0 };
    a.q = d.q; a.k = d.k; a.v = d.v; a.o = d.o; a.lse = d.lse;
    a.d_o = d.d_o; a.dq = d.dq; a.dk = d.dk; a.dv = d.dv;
    a.ws = d.ws; a.ws_bytes = ws_f;
    a.block_mask = (const unsigned char *)d.mask;
    a.q_descale = d.q_descale; a.k_descale = d.k_descale; a.v_descale = d.v_descale;

    /* The first call of the timed direction is timed too: in a run that is only timed (no
     * outputs copied back, so the GPU does not idle after it) one of SETTLE_ONE_MS or more is
     * the bench's settling run. */
    const int timed_only = opts && opts->bench && !t->o;
    float first_ms = 0.0f;
    if (opts && opts->bench)
        for (int i = 0; i < 2 * CHUNK_MAX; i++) CHECK(cudaEventCreate(&ev[i]));

    /* forward: poison, run, sync, copy back (a timed run's host holds no outputs); with
     * opts->twice the call of dir is made again on fresh poison in the outputs only */
    const int ws_poison = opts && opts->ws_poison ? opts->ws_poison : 0xFF;
    const int calls = opts && opts->twice ? 2 : 1;
    if (ws_f) CHECK(cudaMemsetAsync(d.ws, ws_poison, ws_f, stream));
    for (int c = 0; c < (bwd ? 1 : calls); c++) {
        CHECK(cudaMemsetAsync(d.o, 0xFF, nq * 2, stream));
        CHECK(cudaMemsetAsync(d.lse, 0xFF, info->lse_bytes, stream));
        if (timed_only && !bwd) CHECK(cudaEventRecord(ev[0], stream));
        CHECK(st->forward(p, &a, stream));
        if (timed_only && !bwd) CHECK(cudaEventRecord(ev[1], stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    if (timed_only && !bwd) CHECK(cudaEventElapsedTime(&first_ms, ev[0], ev[1]));
    if (t->o) CHECK(cudaMemcpy(t->o, d.o, nq * 2, cudaMemcpyDeviceToHost));
    if (t->lse) CHECK(cudaMemcpy(t->lse, d.lse, info->lse_bytes, cudaMemcpyDeviceToHost));

    if (bwd) { /* the stage's own O and L feed its backward */
        a.ws_bytes = ws_b;
        if (ws_b) CHECK(cudaMemsetAsync(d.ws, ws_poison, ws_b, stream));
        for (int c = 0; c < calls; c++) {
            CHECK(cudaMemsetAsync(d.dq, 0xFF, nq * 2, stream));
            CHECK(cudaMemsetAsync(d.dk, 0xFF, nkv * 2, stream));
            CHECK(cudaMemsetAsync(d.dv, 0xFF, nkv * 2, stream));
            if (timed_only) CHECK(cudaEventRecord(ev[0], stream));
            CHECK(st->backward(p, &a, stream));
            if (timed_only) CHECK(cudaEventRecord(ev[1], stream));
        }
        CHECK(cudaStreamSynchronize(stream));
        if (timed_only) CHECK(cudaEventElapsedTime(&first_ms, ev[0], ev[1]));
        if (t->dq) {
            CHECK(cudaMemcpy(t->dq, d.dq, nq * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(t->dk, d.dk, nkv * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(t->dv, d.dv, nkv * 2, cudaMemcpyDeviceToHost));
        }
    }

    if (opts && opts->bench) {
        /* events around the stage call only; the L2 flush (a memset over twice the L2 size)
         * runs before each call, outside the events */
        times = malloc(sizeof(float) * BENCH_MAX_RUNS);
        if (!times) {
            snprintf(info->why, sizeof info->why, "out of host memory");
            info->status = ATTN_RUN_CUDA_ERROR;
            goto out;
        }
        double settled = 0.0, spent = 0.0;
        int runs = 0, n = 0, chunk = 1, timing = first_ms >= SETTLE_ONE_MS, done = 0;
        float ms = 0.0f;
        while (!done) {
            for (int i = 0; i < chunk; i++) {
                CHECK(cudaMemsetAsync(d.flush, (runs + i) & 1, flush_bytes, stream));
                CHECK(cudaEventRecord(ev[2 * i], stream));
                CHECK(launch(st, dir, p, &a, stream));
                CHECK(cudaEventRecord(ev[2 * i + 1], stream));
            }
            CHECK(cudaEventSynchronize(ev[2 * chunk - 1]));
            for (int i = 0; i < chunk && !done; i++, runs++) {
                CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
                if (!timing) {             /* settling: untimed */
                    settled += ms;
                    timing = (runs + 1 >= SETTLE_MIN_RUNS && settled >= SETTLE_MS) ||
                             ms >= SETTLE_ONE_MS;
                    continue;
                }
                times[n++] = ms;
                spent += ms;
                done = n >= BENCH_MAX_RUNS || (n >= BENCH_MIN_RUNS && spent >= BENCH_MIN_MS) ||
                       (n >= BENCH_SLOW_RUNS && spent >= BENCH_SLOW_MS);
            }
            chunk = ms > 0.0f ? (int)(CHUNK_MS / ms) : CHUNK_MAX;
            chunk = chunk < 1 ? 1 : chunk > CHUNK_MAX ? CHUNK_MAX : chunk;
        }
        qsort(times, (size_t)n, sizeof(float), cmp_float);
        info->median_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
        info->runs = n;
    }

out:
    free(times);
    for (int i = 0; i < 2 * CHUNK_MAX; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(d.q); cudaFree(d.k); cudaFree(d.v); cudaFree(d.o); cudaFree(d.lse);
    cudaFree(d.d_o); cudaFree(d.dq); cudaFree(d.dk); cudaFree(d.dv);
    cudaFree(d.ws); cudaFree(d.flush); cudaFree(d.mask);
    cudaFree(d.q_descale); cudaFree(d.k_descale); cudaFree(d.v_descale);
    return info->status;
}
