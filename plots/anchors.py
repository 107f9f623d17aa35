#!/usr/bin/env python3
"""plots/anchors.py: what the stages are measured against.

Times PyTorch's fused attention, torch.nn.functional.scaled_dot_product_attention with
the FLASH backend (FlashAttention-2) and with the cuDNN backend, on exactly the shapes of
plots/bench.sh, and appends rows in the bench's CSV format (stage torch_flash, torch_cudnn).
Optionally (--gemm, sweep shapes only) two ceiling rows, measured in the same run:
  ceiling_gemm  a bf16 8192^3 GEMM through torch.matmul; tflops = 2 * 8192^3 / time.
  ceiling_copy  a device-to-device copy of COPY_BYTES (4 GiB; less where the GPU has less
                than 4 x that free) from one bf16 tensor into another, through
                torch.Tensor.copy_; tflops is empty.

    python3 plots/anchors.py --csv plots/results/NVIDIA-H200.csv            # the sweep
    python3 plots/anchors.py --csv X-long.csv --shapes long                 # B=1 H=16 d=128
    python3 plots/anchors.py --csv X.csv --dims 128 --ns 8192 --backends flash --gemm

Timing follows the harness: CUDA events around each run, warm-up first, L2 flushed before
every run (a 2 x L2 buffer zeroed outside the events), median of as many runs as fit in
--budget-s (at least --min-reps, at most --reps). Both ceilings are timed the same way.

The ceiling rows in the 16 columns (d = 0 marks a ceiling: plots/bench.sh's summary skips
such rows, and the plotting scripts read the stage names ceiling_*):
  ceiling_gemm  gpu,ceiling_gemm,forward,bf16,1,1,1,8192,8192,0,0,MS,TFLOPS,0,ok,NOTE
  ceiling_copy  gpu,ceiling_copy,forward,bf16,1,1,1,0,0,0,0,MS,,0,ok,NOTE with NOTE
                "device-to-device copy; GB/s = (bytes read + written) / time: X;
                bytes read + written = B; torch.Tensor.copy_ of 4 GiB bf16; torch V"
                (one line; ";" where a CSV note cannot have ","). B is twice the bytes
                copied (each byte is read once and written once), MS the median time in
                milliseconds; GB/s = B / (MS * 1e6), and X is that figure rounded to 0.1:
                plots/docs_tables.sh recomputes it from B and MS. A copy that fails
                (out of memory, say) writes status refused or failed and no B.
Backward: one forward builds the graph, then torch.autograd.grad(O, (Q, K, V), dO,
retain_graph=True) is what is timed, so each timed run is exactly one backward pass.
Normally called by plots/bench.sh; needs a CUDA build of torch.
"""
import argparse
import statistics
import sys
import time
import warnings

HEADER = ("gpu,stage,direction,dtype,B,H,H_kv,N_q,N_k,d,causal,median_ms,tflops,"
          "workspace_bytes,status,note")
TOKENS = 16384       # the bench protocol: B * N = 16384 tokens ...
HIDDEN = 2048        # ... and H * d = 2048 (H_kv = H)
LONG_B, LONG_H, LONG_D = 1, 16, 128   # the long-context wall, as in plots/bench.sh
GEMM_N = 8192        # the ceiling row: an 8192^3 GEMM
COPY_BYTES = 4 << 30 # the copy ceiling: bytes copied (so 2 x this read + written)
WARMUP_MAX_S = 1.0   # slow shapes (N = 131072) warm up with fewer runs
BACKWARD_FLOP_FACTOR = 2.5
BACKENDS = {"flash": ("torch_flash", "FLASH_ATTENTION"),
            "cudnn": ("torch_cudnn", "CUDNN_ATTENTION")}


def attention_flops(B, H, N, d, causal, direction):
    """The harness's count: S = Q K^T and O = P V, 2 N^2 d multiply-adds per head."""
    flops = 4.0 * B * H * N * N * d
    if causal:
        flops /= 2
    if direction == "backward":
        flops *= BACKWARD_FLOP_FACTOR
    return flops


def shapes(args):
    """(B, H, N, d, causal) in the bench's loop order."""
    if args.shapes == "long":
        return [(LONG_B, LONG_H, n, LONG_D, 0) for n in args.ns]
    return [(TOKENS // n, HIDDEN // d, n, d, c)
            for d in args.dims for c in args.causal for n in args.ns]


def clean(text, limit=160):
    """A CSV note: one line, no commas."""
    text = " ".join(str(text).replace(",", ";").split())
    return text[:limit]


def row(gpu, stage, direction, B, H, N, d, causal, ms=None, tflops=None, ws=None,
        status="ok", note=""):
    num = lambda x, fmt: "" if x is None else fmt % x
    return ",".join([clean(gpu), stage, direction, "bf16", str(B), str(H), str(H), str(N),
                     str(N), str(d), str(causal), num(ms, "%.4f"), num(tflops, "%.2f"),
                     num(ws, "%d"), status, clean(note)])


class CsvOut:
    """Appends rows, writing the header first if the file is new or empty."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path) as f:
                empty = f.read(1) == ""
        except FileNotFoundError:
            empty = True
        if empty:
            self.write(HEADER)

    def write(self, line):
        with open(self.path, "a") as f:
            f.write(line + "\n")


def parse_args(argv):
    words = lambda s: s.replace(",", " ").split()
    ints = lambda s: [int(x) for x in words(s)]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", required=True, help="CSV file to append rows to")
    p.add_argument("--shapes", choices=["sweep", "long"], default="sweep")
    p.add_argument("--ns", type=ints, default=None,
                   help="sequence lengths (default: the bench's for --shapes)")
    p.add_argument("--dims", type=ints, default=[64, 128], help="head dims (sweep only)")
    p.add_argument("--causal", type=ints, default=[0, 1], help="0 1 (sweep only)")
    p.add_argument("--dirs", type=words, default=["forward", "backward"])
    p.add_argument("--backends", type=words, default=["flash", "cudnn"])
    p.add_argument("--gemm", action="store_true",
                   help="also the ceiling rows: the GEMM (ceiling_gemm) and a device copy "
                        "(ceiling_copy)")
    p.add_argument("--reps", type=int, default=50, help="timed runs at most")
    p.add_argument("--min-reps", type=int, default=3, help="timed runs at least")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs at most (1 s at most)")
    p.add_argument("--budget-s", type=float, default=3.0,
                   help="timed runs: as many as fit in about this much GPU time")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.ns is None:
        args.ns = ([8192, 16384, 32768, 65536, 131072] if args.shapes == "long"
                   else [512, 1024, 2048, 4096, 8192, 16384])
    for b in args.backends:
        if b not in BACKENDS:
            p.error("unknown backend %r (have: %s)" % (b, ", ".join(BACKENDS)))
    for direction in args.dirs:
        if direction not in ("forward", "backward"):
            p.error("unknown direction %r" % direction)
    return args


def copy_ceiling(out, gpu, time_ms):
    """The ceiling_copy row: a device-to-device copy, src into dst, both bf16, COPY_BYTES each
    (halved until 4 x the bytes fit in free memory), timed by time_ms; see the docstring."""
    import torch
    version = "torch %s" % torch.__version__
    fields = (gpu, "ceiling_copy", "forward", 1, 1, 0, 0, 0)
    nbytes = COPY_BYTES
    try:
        free, _ = torch.cuda.mem_get_info()
        while nbytes > (64 << 20) and 4 * nbytes > free:
            nbytes //= 2
        src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        ms = time_ms(lambda: dst.copy_(src))
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        status = "refused" if isinstance(e, torch.cuda.OutOfMemoryError) else "failed"
        out.write(row(*fields, ws=0, status=status,
                      note="device-to-device copy of %d MiB: %s (%s)"
                      % (nbytes >> 20, str(e).splitlines()[0] if str(e) else status, version)))
        print("[copy] %s" % status, flush=True)
        return
    finally:
        src = dst = None
        torch.cuda.empty_cache()
    moved = 2 * nbytes                       # each byte read once and written once
    gbs = moved / (ms * 1e-3) / 1e9
    size = "%d GiB" % (nbytes >> 30) if nbytes >= 1 << 30 else "%d MiB" % (nbytes >> 20)
    out.write(row(*fields, ms=ms, ws=0, status="ok",
                  note="device-to-device copy, GB/s = (bytes read + written) / time: %.1f; "
                       "bytes read + written = %d; torch.Tensor.copy_ of %s bf16; %s"
                  % (gbs, moved, size, version)))
    print("[copy] %s bf16 device to device ... %.3f ms  %.1f GB/s (read + written)"
          % (size, ms, gbs), flush=True)


def main(argv):
    args = parse_args(argv)
    import torch  # only here, so --help and the helpers above work without it
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("anchors: torch sees no CUDA device", flush=True)
        return 2
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev).replace(" ", "-")   # as the harness writes it
    out = CsvOut(args.csv)
    torch.manual_seed(args.seed)

    props = torch.cuda.get_device_properties(dev)
    l2_bytes = getattr(props, "L2_cache_size", 0) or 64 << 20   # older torch: assume 64 MiB
    flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=dev)

    def time_ms(fn):
        """Median of CUDA-event times of fn(), L2 flushed before each run."""
        started = time.perf_counter()
        for _ in range(args.warmup):
            fn()
            torch.cuda.synchronize()
            if time.perf_counter() - started > WARMUP_MAX_S:
                break
        probe_start = torch.cuda.Event(enable_timing=True)
        probe_end = torch.cuda.Event(enable_timing=True)
        flush.zero_()
        probe_start.record()
        fn()
        probe_end.record()
        torch.cuda.synchronize()
        probe = max(probe_start.elapsed_time(probe_end), 1e-3)
        reps = int(min(args.reps, max(args.min_reps, args.budget_s * 1e3 / probe)))  # slow: few
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            flush.zero_()            # evict Q, K, V from L2, outside the timed region
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    def extra_bytes(fn, result_bytes):
        """Peak allocation of one fn() beyond what existed before and what it returns:
        the counterpart of the harness's workspace (L and scratch). Goes in the CSV's
        workspace_bytes column."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(dev)
        del result
        return max(0, peak - base - result_bytes)

    if args.gemm and args.shapes == "sweep":
        a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: a @ b)
        tflops = 2.0 * GEMM_N ** 3 / (ms * 1e-3) / 1e12
        out.write(row(gpu, "ceiling_gemm", "forward", 1, 1, GEMM_N, 0, 0, ms, tflops, 0,
                      "ok", "torch.matmul %d^3 bf16 (cuBLAS) torch %s"
                      % (GEMM_N, torch.__version__)))
        print("[gemm] %d^3 bf16 ... %.3f ms  %.1f TFLOP/s" % (GEMM_N, ms, tflops), flush=True)
        del a, b
        copy_ceiling(out, gpu, time_ms)

    points = [(be, direction, shape) for be in args.backends for direction in args.dirs
              for shape in shapes(args)]
    for i, (be, direction, (B, H, N, d, causal)) in enumerate(points, 1):
        stage, enum_name = BACKENDS[be]
        print("[%s %d/%d] %s d=%d N=%d causal=%d ... "
              % (stage, i, len(points), direction, d, N, causal), end="", flush=True)
        fields = (gpu, stage, direction, B, H, N, d, causal)
        version = "torch %s" % torch.__version__
        if be == "cudnn":
            version += " cuDNN %s" % torch.backends.cudnn.version()
        backend = getattr(SDPBackend, enum_name, None)
        if backend is None:
            out.write(row(*fields, status="failed", note="no SDPBackend.%s in %s"
                          % (enum_name, version)))
            print("failed: backend missing", flush=True)
            continue
        grad = direction == "backward"
        try:
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
                warnings.simplefilter("always")
                # Built as [B, N, H, d] (our layout) and viewed as the [B, H, N, d] that
                # SDPA wants, so both read the same memory with the same strides.
                q, k, v = (torch.randn(B, N, H, d, device=dev, dtype=torch.bfloat16,
                                       requires_grad=grad) for _ in range(3))
                sdpa = lambda: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=bool(causal))
                try:
                    if grad:
                        o = sdpa()
                        d_o = torch.randn_like(o)
                        step = lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
                        result_bytes = 3 * q.numel() * q.element_size()   # dQ, dK, dV
                    else:
                        step = sdpa
                        result_bytes = q.numel() * q.element_size()       # O
                    ws = extra_bytes(step, result_bytes)
                    ms = time_ms(step)
                except torch.cuda.OutOfMemoryError:
                    raise
                except RuntimeError as e:
                    # "No available kernel" comes with warnings that say why.
                    why = [str(w.message) for w in caught] + [str(e).splitlines()[0]]
                    raise RuntimeError(" / ".join(why)) from e
            tflops = attention_flops(B, H, N, d, causal, direction) / (ms * 1e-3) / 1e12
            out.write(row(*fields, ms=ms, tflops=tflops, ws=ws, status="ok", note=version))
            print("%.3f ms  %.1f TFLOP/s" % (ms, tflops), flush=True)
        except torch.cuda.OutOfMemoryError:
            out.write(row(*fields, status="refused", note="out of GPU memory (%s)" % version))
            print("refused: out of GPU memory", flush=True)
        except RuntimeError as e:
            out.write(row(*fields, status="failed", note="%s: %s" % (version, e)))
            print("failed: %s" % clean(e), flush=True)
        finally:
            q = k = v = o = d_o = step = sdpa = None
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
