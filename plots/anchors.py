#!/usr/bin/env python3
"""plots/anchors.py: what the stages are measured against.

Times PyTorch's fused attention, torch.nn.functional.scaled_dot_product_attention with
the FLASH backend (FlashAttention-2) and with the cuDNN backend, on exactly the shapes of
plots/bench.sh, and appends rows in the bench's CSV format (stage torch_flash, torch_cudnn).
The backend flex (stage torch_flex) is PyTorch's FlexAttention instead
(torch.nn.attention.flex_attention.flex_attention under torch.compile, dynamic=False), the
anchor of the masked runs: it takes the masks the stages take, ANDed into one mask_mod and
turned into a BlockMask of 128 x 128 blocks by create_block_mask:
  --causal 1      key j visible to query i iff j <= i (as the harness's --causal)
  --window W      also i - W < j, and without causal j < i + W (as --window)
  --block-mask F  a .npy file as the harness's --block-mask reads it: uint8 or bool
                  [1 or B, 1 or H, ceil(N / 128), ceil(N / 128)]; query i sees key j only if
                  entry (i // 128, j // 128) of its (batch, head) is 1 (build/<stage> --save
                  DIR writes the mask a run used as DIR/block_mask.npy)
  --mask-spec S   the --mask pattern the file was made from, for the note (below)
or, for several masks one after the other in one process (torch imported and set up once,
not once per mask: plots/bench.sh's masks part), --pattern P once per mask in place of the
four flags above, P written as plots/bench.sh's MASK_PATTERNS are:
  dense           no mask (--causal 0)
  causal          --causal 1
  window:W        --causal 1 --window W (a causal sliding window)
  S=F             --block-mask F --mask-spec S (a --mask pattern S and its block mask F)
Each mask's rows then come after a line "bench: torch_flex on P" (the bench's progress).
Its FLOP count is the harness's (common/problem.c attn_flops): 4 d per visible (query, key)
pair, summed over (batch, head), counted exactly with a window or a block mask (causal alone:
half of N^2, the usual convention), x2.5 for the backward. Its note starts as a stage's row
of the same mask does (common/cli.c), "window=W; mask=S; block-mask density=X; " (without
--mask-spec "block-mask=FILE; " instead of "mask=S; "), so that the rows pair up. The first
call of each shape and direction compiles the kernel (seconds to a minute); it runs before
the timing, and before the workspace is measured, and is never timed.
The backend cudnn_fp8 (stage cudnn_fp8, dtype e4m3, forward only) is cuDNN's fp8 attention
through the cuDNN frontend's Python package (pip nvidia-cudnn-frontend; its sdpa_fp8 graph),
the anchor of the fp8 stage: e4m3 Q, K, V, every scale 1, O in e4m3 (what cuDNN's Hopper fp8
forward writes), the bf16 FLOP count; a missing package gives a row with status failed.
Optionally (--gemm, sweep shapes only) two ceiling rows, measured in the same run:
  ceiling_gemm  a bf16 8192^3 GEMM through torch.matmul; tflops = 2 * 8192^3 / time.
  ceiling_copy  a device-to-device copy of COPY_BYTES (4 GiB; less where the GPU has less
                than 4 x that free) from one bf16 tensor into another, through
                torch.Tensor.copy_; tflops is empty.

    python3 plots/anchors.py --csv plots/results/NVIDIA-H200.csv            # the sweep
    python3 plots/anchors.py --csv X-long.csv --shapes long                 # B=1 H=16 d=128
    python3 plots/anchors.py --csv X.csv --dims 128 --ns 8192 --backends flash --gemm
    python3 plots/anchors.py --csv X-masks.csv --shapes masks --backends flex \
        --block-mask /tmp/run1/block_mask.npy --mask-spec random:0.1           # B=2 H=16 d=128
    python3 plots/anchors.py --csv X-masks.csv --shapes masks --backends flex \
        --pattern dense --pattern causal --pattern random:0.1=/tmp/run1/block_mask.npy

Timing is the harness's bench protocol (common/runner.c), rule for rule: untimed runs until
the clock has settled (150 ms, at least 2 runs, or one run of 250 ms), then the median of the
timed runs (at least 10 and 250 ms, at most 200; a slow shape stops once 500 ms was timed);
CUDA events around each run, the L2 flushed before every run (a 2 x L2 buffer filled outside
the events), runs queued about 20 ms at a time. The constants are read from common/runner.c's
#defines, so the two cannot drift apart. Both ceilings are timed the same way.

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
The same for torch_flex, whose forward and backward are each compiled (untimed) first.
Normally called by plots/bench.sh (torch_flex by its masks part only); needs a CUDA build of
torch (and numpy; flex also triton, which torch.compile uses on the GPU).
"""
import argparse
import os
import re
import statistics
import sys
import time
import warnings

HEADER = ("gpu,stage,direction,dtype,B,H,H_kv,N_q,N_k,d,causal,median_ms,tflops,"
          "workspace_bytes,status,note")
TOKENS = 16384       # the bench protocol: B * N = 16384 tokens ...
HIDDEN = 2048        # ... and H * d = 2048 (H_kv = H)
LONG_B, LONG_H, LONG_D = 1, 16, 128   # the long-context wall, as in plots/bench.sh
MASKS_B, MASKS_H = 2, 16             # the masked runs, as in plots/bench.sh (N 8192, d 128)
MASK_TILE = 128      # a block mask's tile, as the harness's ATTN_MASK_TILE
GEMM_N = 8192        # the ceiling row: an 8192^3 GEMM
COPY_BYTES = 4 << 30 # the copy ceiling: bytes copied (so 2 x this read + written)
PROTOCOL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common",
                               "runner.c")
PROTOCOL_NAMES = ("SETTLE_MS", "SETTLE_MIN_RUNS", "SETTLE_ONE_MS", "BENCH_MIN_RUNS",
                  "BENCH_MIN_MS", "BENCH_MAX_RUNS", "BENCH_SLOW_RUNS", "BENCH_SLOW_MS",
                  "CHUNK_MS", "CHUNK_MAX")


def bench_protocol(path=PROTOCOL_SOURCE):
    """The bench protocol's constants, read from the harness's #defines (common/runner.c, which
    says why a shape settles first), so that the anchors are timed by the very same rules."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        print("anchors: cannot read the bench protocol from %s: %s" % (path, e.strerror),
              file=sys.stderr)
        sys.exit(2)
    values = {}
    for name in PROTOCOL_NAMES:
        m = re.search(r"^#define %s +([0-9.]+)" % name, text, re.M)
        if not m:
            print("anchors: no '#define %s' in %s" % (name, path), file=sys.stderr)
            sys.exit(2)
        values[name] = float(m.group(1))
    return values
BACKWARD_FLOP_FACTOR = 2.5
BACKENDS = {"flash": ("torch_flash", "FLASH_ATTENTION"),
            "cudnn": ("torch_cudnn", "CUDNN_ATTENTION"),
            "flex": ("torch_flex", None),       # not an SDPA backend: flex_attention
            "cudnn_fp8": ("cudnn_fp8", None)}   # not SDPA: the cuDNN frontend's sdpa_fp8


def visible_pairs(B, H, N, causal, window=0, tiles=None):
    """The (query, key) pairs the harness counts for its FLOPs (common/problem.c attn_flops,
    common/mask.c attn_mask_pairs), over every (batch, head): with a window or a block mask
    the visible ones exactly, causal alone N^2 / 2, else N^2. tiles: the block mask,
    [1 or B, 1 or H, Tq, Tk] of 0 and 1. Exact in float64 (integers far below 2^53)."""
    import numpy as np
    if tiles is None and not window:
        return B * H * (N * N / 2.0 if causal else float(N * N))
    rows = np.arange(N, dtype=np.int64)
    lo = np.maximum(rows - window + 1, 0) if window else np.zeros(N, dtype=np.int64)
    hi = np.minimum(rows + 1, N) if causal else np.full(N, N, dtype=np.int64)
    if window and not causal:
        hi = np.minimum(hi, rows + window)
    if tiles is None:
        return float(B * H * np.maximum(hi - lo, 0).sum())
    # pairs[tq, tk]: the pairs of tile (tq, tk) that causal and the window leave, summed over
    # the rows of tq; a chunk of query tiles at a time, so that N = 1M fits in memory
    tq_n, tk_n = tiles.shape[2], tiles.shape[3]
    c0 = np.arange(tk_n, dtype=np.int64) * MASK_TILE
    c1 = np.minimum(c0 + MASK_TILE, N)
    pairs = np.zeros((tq_n, tk_n))
    step = max(1, (1 << 22) // max(1, tk_n * MASK_TILE))
    for t0 in range(0, tq_n, step):
        t1 = min(tq_n, t0 + step)
        r0, r1 = t0 * MASK_TILE, min(N, t1 * MASK_TILE)
        seen = np.minimum(hi[r0:r1, None], c1) - np.maximum(lo[r0:r1, None], c0)
        seen = np.maximum(seen, 0)
        pad = (t1 - t0) * MASK_TILE - (r1 - r0)      # the last tile may have fewer rows
        if pad:
            seen = np.concatenate([seen, np.zeros((pad, tk_n), dtype=seen.dtype)])
        pairs[t0:t1] = seen.reshape(t1 - t0, MASK_TILE, tk_n).sum(axis=1)
    total = (tiles.astype(np.float64) * pairs).sum()
    # a broadcast dimension stands for all B (or H) of them, as in attn_mask_pairs
    return float(total * (B if tiles.shape[0] == 1 else 1) * (H if tiles.shape[1] == 1 else 1))


def attention_flops(B, H, N, d, causal, direction, window=0, tiles=None):
    """The harness's count: S = Q K^T and O = P V, 2 d multiply-adds per visible pair each
    (visible_pairs); the backward 2.5 times the forward."""
    flops = 4.0 * d * visible_pairs(B, H, N, causal, window, tiles)
    if direction == "backward":
        flops *= BACKWARD_FLOP_FACTOR
    return flops


def load_block_mask(path, B, H, N):
    """The block mask of --block-mask as a uint8 array [1 or B, 1 or H, Tq, Tk], checked as
    the harness checks it (common/mask.c attn_mask_load); ValueError with the reason."""
    import numpy as np
    m = np.load(path)
    t = (N + MASK_TILE - 1) // MASK_TILE
    if (m.ndim != 4 or m.shape[0] not in (1, B) or m.shape[1] not in (1, H)
            or m.shape[2] != t or m.shape[3] != t):
        raise ValueError("%s: a block mask must be [1 or B=%d, 1 or H=%d, %d, %d] (tiles of %d), "
                         "got shape %s" % (path, B, H, t, t, MASK_TILE, tuple(m.shape)))
    if not np.isin(m, (0, 1)).all():
        raise ValueError("%s: a block mask holds 0 or 1" % path)
    return m.astype(np.uint8)


def flex_mask_mod(torch, tiles, causal, window, device):
    """FlexAttention's mask_mod for the harness's masks, ANDed: the tile's entry of the block
    mask tiles (a [1 or B, 1 or H, Tq, Tk] array of 0 and 1, or None), causal (key j <= query
    i) and the window (i - W < j and j < i + W: with causal, i - W < j <= i). Returns it and
    the mask's batch and head extents (1: the same for every batch or head, which
    create_block_mask then takes as None)."""
    mt = None if tiles is None else torch.from_numpy(tiles).to(device).bool()
    mb = 1 if mt is None else mt.shape[0]
    mh = 1 if mt is None else mt.shape[1]
    if mt is not None:    # index by batch and head only where the mask has them
        mt = mt[:, 0] if mh == 1 else mt
        mt = mt[0] if mb == 1 else mt

    tile = MASK_TILE    # a local: what the compiled mask_mod reads is all in its closure

    def mask_mod(b, h, q_idx, kv_idx):
        qt, kt = q_idx // tile, kv_idx // tile
        if mt is None:
            ok = q_idx >= 0
        elif mb > 1 and mh > 1:
            ok = mt[b, h, qt, kt]
        elif mb > 1:
            ok = mt[b, qt, kt]
        elif mh > 1:
            ok = mt[h, qt, kt]
        else:
            ok = mt[qt, kt]
        if causal:
            ok = ok & (kv_idx <= q_idx)
        if window:
            ok = ok & (q_idx - kv_idx < window) & (kv_idx - q_idx < window)
        return ok
    return mask_mod, mb, mh


def mask_note(mask, B, H, N, causal, tiles):
    """The note's prefix of a row of mask (a Mask), as common/cli.c writes a stage's:
    "window=W; ", the mask's name, "block-mask density=X; " (visible pairs over B H N^2, as
    %.4g; only when the mask could be read: tiles, else None)."""
    note = "window=%d; " % mask.window if mask.window else ""
    if mask.block_mask:
        if mask.mask_spec:
            note += "mask=%s; " % mask.mask_spec.replace(",", "+")
        else:
            note += "block-mask=%s; " % os.path.basename(mask.block_mask)
    if tiles is not None:
        pairs = visible_pairs(B, H, N, causal, mask.window, tiles)
        note += "block-mask density=%.4g; " % (pairs / (float(B) * H * N * N))
    return note


def shapes(args, causals):
    """(B, H, N, d, causal) in the bench's loop order, causal of the list causals."""
    if args.shapes == "long":
        return [(LONG_B, LONG_H, n, LONG_D, c) for c in causals for n in args.ns]
    if args.shapes == "masks":
        return [(MASKS_B, MASKS_H, n, d, c) for d in args.dims for c in causals for n in args.ns]
    return [(TOKENS // n, HIDDEN // d, n, d, c)
            for d in args.dims for c in causals for n in args.ns]


class Mask:
    """The mask of a run of points: name (the --pattern, None for the single-mask flags),
    causal (the list of --causal values), window (0: none), block_mask (a file, or None) and
    mask_spec (the --mask pattern of the file, or None)."""

    def __init__(self, name, causal, window=0, block_mask=None, mask_spec=None):
        self.name, self.causal, self.window = name, causal, window
        self.block_mask, self.mask_spec = block_mask, mask_spec


def parse_pattern(text):
    """A --pattern (see the docstring) as a Mask; ValueError with the reason."""
    if text == "dense":
        return Mask(text, [0])
    if text == "causal":
        return Mask(text, [1])
    if text.startswith("window:"):
        w = text[len("window:"):]
        if not w.isdigit() or int(w) <= 0:
            raise ValueError("--pattern %s: want window:W, W a positive integer" % text)
        return Mask(text, [1], window=int(w))
    spec, eq, path = text.partition("=")    # a --mask pattern has no "="; a path may
    if not eq or not spec or not path:
        raise ValueError("--pattern %s: want dense, causal, window:W, or a --mask pattern and "
                         "its block mask file, SPEC=FILE" % text)
    return Mask(spec, [0], block_mask=path, mask_spec=spec)


def clean(text, limit=160):
    """A CSV note: one line, no commas."""
    text = " ".join(str(text).replace(",", ";").split())
    return text[:limit]


def row(gpu, stage, direction, B, H, N, d, causal, ms=None, tflops=None, ws=None,
        status="ok", note="", dtype="bf16"):
    num = lambda x, fmt: "" if x is None else fmt % x
    return ",".join([clean(gpu), stage, direction, dtype, str(B), str(H), str(H), str(N),
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
    p.add_argument("--shapes", choices=["sweep", "long", "masks"], default="sweep",
                   help="sweep: B = 16384/N, H = 2048/d; long: B=1 H=16 d=128; "
                        "masks: B=2 H=16 (d 128, N 8192 unless --dims, --ns)")
    p.add_argument("--ns", type=ints, default=None,
                   help="sequence lengths (default: the bench's for --shapes)")
    p.add_argument("--dims", type=ints, default=None,
                   help="head dims (sweep: 64 128, masks: 128; long: always 128)")
    p.add_argument("--causal", type=ints, default=None,
                   help="0 1 (default: sweep 0 1, long and masks 0)")
    p.add_argument("--dirs", type=words, default=["forward", "backward"])
    p.add_argument("--backends", type=words, default=["flash", "cudnn"])
    p.add_argument("--window", type=int, default=0,
                   help="flex only: a sliding window of W keys, as the harness's --window")
    p.add_argument("--block-mask", default=None,
                   help="flex only: a block mask .npy, as the harness's --block-mask")
    p.add_argument("--mask-spec", default=None,
                   help="the --mask pattern the block mask was made from (for the note)")
    p.add_argument("--pattern", action="append", default=None, metavar="P",
                   help="flex only, repeatable: one mask after the other in one process, in "
                        "place of --causal, --window, --block-mask and --mask-spec: dense, "
                        "causal, window:W (causal), or SPEC=FILE (a --mask pattern and its "
                        "block mask), as plots/bench.sh's MASK_PATTERNS")
    p.add_argument("--gemm", action="store_true",
                   help="also the ceiling rows: the GEMM (ceiling_gemm) and a device copy "
                        "(ceiling_copy)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.ns is None:
        args.ns = {"long": [8192, 16384, 32768, 65536, 131072], "masks": [8192]}.get(
            args.shapes, [512, 1024, 2048, 4096, 8192, 16384])
    if args.dims is None:
        args.dims = [128] if args.shapes == "masks" else [64, 128]
    if args.pattern and (args.causal is not None or args.window or args.block_mask
                         or args.mask_spec):
        p.error("--pattern takes the place of --causal, --window, --block-mask and --mask-spec")
    if args.pattern and [b for b in args.backends if b != "flex"]:
        p.error("--pattern is for the flex backend only (SDPA's take no such mask)")
    if args.causal is None:
        args.causal = [0, 1] if args.shapes == "sweep" else [0]
    masked = args.window or args.block_mask
    if masked and [b for b in args.backends if b != "flex"]:
        p.error("--window and --block-mask are for the flex backend only (SDPA's take no such mask)")
    if args.window < 0:
        p.error("--window must be positive")
    if args.mask_spec and not args.block_mask:
        p.error("--mask-spec names the pattern of a --block-mask file: give the file too")
    for b in args.backends:
        if b not in BACKENDS:
            p.error("unknown backend %r (have: %s)" % (b, ", ".join(BACKENDS)))
    for direction in args.dirs:
        if direction not in ("forward", "backward"):
            p.error("unknown direction %r" % direction)
    if "cudnn_fp8" in args.backends and "backward" in args.dirs:
        p.error("cudnn_fp8 is forward only: give --dirs forward")
    # the masks, one after the other: the --patterns, or the one of the flags
    try:
        args.masks = ([parse_pattern(t) for t in args.pattern] if args.pattern else
                      [Mask(None, args.causal, args.window, args.block_mask, args.mask_spec)])
    except ValueError as e:
        p.error(str(e))
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
    protocol = bench_protocol()

    def time_ms(fn):
        """Median of CUDA-event times of fn(), L2 flushed before each run, by the harness's
        protocol: untimed runs until the clock has settled, then the timed ones, queued about
        CHUNK_MS at a time."""
        P = protocol
        settled, spent, runs, times, chunk, timing, ms = 0.0, 0.0, 0, [], 1, False, 0.0
        while True:
            events = []
            for i in range(chunk):
                flush.fill_((runs + i) & 1)   # evict Q, K, V from L2, outside the events
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            for start, end in events:
                runs += 1
                ms = start.elapsed_time(end)
                if not timing:               # settling: untimed
                    settled += ms
                    timing = ((runs >= P["SETTLE_MIN_RUNS"] and settled >= P["SETTLE_MS"])
                              or ms >= P["SETTLE_ONE_MS"])
                    continue
                times.append(ms)
                spent += ms
                n = len(times)
                if (n >= P["BENCH_MAX_RUNS"]
                        or (n >= P["BENCH_MIN_RUNS"] and spent >= P["BENCH_MIN_MS"])
                        or (n >= P["BENCH_SLOW_RUNS"] and spent >= P["BENCH_SLOW_MS"])):
                    return statistics.median(times)
            fit = P["CHUNK_MS"] // ms if ms > 0 else P["CHUNK_MAX"]   # runs in CHUNK_MS
            chunk = int(min(P["CHUNK_MAX"], max(1, fit)))

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

    def timed_step(call, inputs, grad):
        """What one anchor point times, and the bytes of its results (not workspace): the
        forward call itself (O), or one backward pass, torch.autograd.grad through the graph
        of one forward call built here, untimed (dQ, dK, dV)."""
        q = inputs[0]
        if not grad:
            return call, q.numel() * q.element_size()
        o = call()
        d_o = torch.randn_like(o)
        return (lambda: torch.autograd.grad(o, inputs, d_o, retain_graph=True),
                3 * q.numel() * q.element_size())

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

    def flex_point(mask, fields, B, H, N, d, causal, direction):
        """One torch_flex row: FlexAttention under torch.compile with mask (a Mask: the flags'
        or a --pattern's, see the docstring), timed as the SDPA anchors are, after an untimed
        compiling call."""
        version = "torch %s" % torch.__version__
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as e:
            out.write(row(*fields, status="failed", note="no flex_attention in %s: %s" % (version, e)))
            print("failed: no flex_attention", flush=True)
            return
        try:
            tiles = load_block_mask(mask.block_mask, B, H, N) if mask.block_mask else None
        except (OSError, ValueError) as e:
            out.write(row(*fields, status="refused", note=mask_note(mask, B, H, N, causal, None) + str(e)))
            print("refused: %s" % clean(e), flush=True)
            return
        prefix = mask_note(mask, B, H, N, causal, tiles)
        version += " flex_attention (torch.compile; BlockMask of 128 x 128)"
        grad = direction == "backward"
        q = k = v = step = None
        try:
            W = mask.window
            block_mask = None
            if tiles is not None or causal or W:
                mask_mod, mb, mh = flex_mask_mod(torch, tiles, causal, W, dev)
                block_mask = create_block_mask(mask_mod, B if mb > 1 else None, H if mh > 1 else None,
                                               N, N, device=dev, BLOCK_SIZE=MASK_TILE)
            # A fresh compile for each shape and direction (dynamic=False: no symbolic shapes),
            # so that no shape runs into torch._dynamo's limit of recompiles of one function.
            torch._dynamo.reset()
            flex = torch.compile(flex_attention, dynamic=False)
            # [B, N, H, d] (our layout) viewed as the [B, H, N, d] flex_attention takes, as for
            # the SDPA anchors: the same memory, the same strides
            q, k, v = (torch.randn(B, N, H, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
                       for _ in range(3))
            call = lambda: flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                block_mask=block_mask)
            started = time.perf_counter()
            step, result_bytes = timed_step(call, (q, k, v), grad)
            step()                                 # compiles: never timed, never measured
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - started
            ws = extra_bytes(step, result_bytes)
            ms = time_ms(step)
            tflops = (attention_flops(B, H, N, d, causal, direction, W, tiles)
                      / (ms * 1e-3) / 1e12)
            out.write(row(*fields, ms=ms, tflops=tflops, ws=ws, status="ok",
                          note=prefix + version))
            print("%.3f ms  %.1f TFLOP/s (compiled in %.0f s)" % (ms, tflops, compile_s), flush=True)
        except torch.cuda.OutOfMemoryError:
            out.write(row(*fields, status="refused", note=prefix + "out of GPU memory (%s)" % version))
            print("refused: out of GPU memory", flush=True)
        except Exception as e:   # a compile error is not a RuntimeError in every torch
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            out.write(row(*fields, status="failed", note=prefix + "%s: %s" % (version, first)))
            print("failed: %s" % clean(first), flush=True)
        finally:
            q = k = v = step = call = None
            torch.cuda.empty_cache()

    def fp8_point(fields, B, H, N, d, causal):
        """One cudnn_fp8 row: cuDNN's fp8 attention forward through its frontend's Python
        graph API (sdpa_fp8), e4m3 Q, K, V in our [B, N, H, d] layout viewed as [B, H, N, d],
        every scale and descale 1 (normal inputs fit e4m3's range), O in e4m3 (cuDNN's fp8
        forward on Hopper writes fp8 O), no L (inference). Timed as the other anchors."""
        try:
            import cudnn
        except ImportError as e:
            out.write(row(*fields, status="failed", dtype="e4m3",
                          note="no cuDNN frontend (pip nvidia-cudnn-frontend): %s" % e))
            print("failed: no cudnn frontend", flush=True)
            return
        version = "cuDNN frontend %s backend %s" % (getattr(cudnn, "__version__", "?"),
                                                     cudnn.backend_version())
        graph = q = k = v = o = ws = None
        try:
            e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
            q, k, v = (torch.randn(B, N, H, d, device=dev).to(torch.float8_e4m3fn)
                       for _ in range(3))
            o = torch.empty_like(q)
            dims, strides = (B, H, N, d), (N * H * d, d, H * d, 1)
            one = torch.ones(1, 1, 1, 1, device=dev, dtype=torch.float32)
            amax = [torch.empty(1, 1, 1, 1, device=dev, dtype=torch.float32) for _ in range(2)]
            handle = cudnn.create_handle()
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
            graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32,
                                  compute_data_type=fp32, handle=handle)
            tq, tk, tv = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3)
                          for n in ("q", "k", "v"))
            scalars = [graph.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
                       for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s",
                                 "scale_o")]
            to, _, ta_s, ta_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=scalars[0],
                                               descale_k=scalars[1], descale_v=scalars[2],
                                               descale_s=scalars[3], scale_s=scalars[4],
                                               scale_o=scalars[5], generate_stats=False,
                                               attn_scale=d ** -0.5, use_causal_mask=bool(causal))
            to.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
            for t in (ta_s, ta_o):
                t.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
            ws = torch.empty(graph.get_workspace_size(), device=dev, dtype=torch.uint8)
            pack = {tq: q, tk: k, tv: v, to: o, ta_s: amax[0], ta_o: amax[1]}
            pack.update({t: one for t in scalars})
            step = lambda: graph.execute(pack, ws, handle=handle)
            step()
            torch.cuda.synchronize()
            ms = time_ms(step)
            tflops = attention_flops(B, H, N, d, causal, "forward") / (ms * 1e-3) / 1e12
            out.write(row(*fields, ms=ms, tflops=tflops, ws=ws.numel(), status="ok",
                          dtype="e4m3", note="O in e4m3; " + version))
            print("%.3f ms  %.1f TFLOP/s" % (ms, tflops), flush=True)
        except torch.cuda.OutOfMemoryError:
            out.write(row(*fields, status="refused", dtype="e4m3",
                          note="out of GPU memory (%s)" % version))
            print("refused: out of GPU memory", flush=True)
        except Exception as e:   # cudnn raises its own error types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            out.write(row(*fields, status="failed", dtype="e4m3", note="%s: %s" % (version, first)))
            print("failed: %s" % clean(first), flush=True)
        finally:
            graph = q = k = v = o = ws = None
            torch.cuda.empty_cache()

    # the points in order: per mask (one but with --pattern), backend, direction and shape,
    # numbered within their mask
    points = []
    for mask in args.masks:
        these = [(be, direction, shape) for be in args.backends for direction in args.dirs
                 for shape in shapes(args, mask.causal)]
        points += [(mask, i, len(these)) + p for i, p in enumerate(these, 1)]
    for mask, i, n, be, direction, (B, H, N, d, causal) in points:
        stage, enum_name = BACKENDS[be]
        if i == 1 and mask.name is not None:
            print("bench: %s on %s" % (stage, mask.name), flush=True)
        print("[%s %d/%d] %s d=%d N=%d causal=%d ... "
              % (stage, i, n, direction, d, N, causal), end="", flush=True)
        fields = (gpu, stage, direction, B, H, N, d, causal)
        if be == "flex":
            flex_point(mask, fields, B, H, N, d, causal, direction)
            continue
        if be == "cudnn_fp8":
            fp8_point(fields, B, H, N, d, causal)
            continue
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
                    step, result_bytes = timed_step(sdpa, (q, k, v), grad)
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
            q = k = v = step = sdpa = None
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
