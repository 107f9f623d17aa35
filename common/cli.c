/* common/cli.c: the program every build/<stage> is: flags, setup, run, check, bench, CSV.
 * Exit codes: 0 ok, 1 check failed (or the stage failed on the GPU), 2 bad input, shape
 * refused by the stage, not enough GPU memory, no GPU, or a --check that compared nothing.
 * Flags are parsed completely before any CUDA call, so bad input is reported the same on a
 * machine without a GPU.
 * With --points, one process runs many problems (a line of flags each), each exactly as a
 * program of its own would (run_one), so that a bench pays the CUDA context's start once. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

#define MIB (1024.0 * 1024.0)

enum {
    OPT_BATCH = 256, OPT_HEADS, OPT_KV_HEADS, OPT_SEQLEN, OPT_SEQLEN_Q, OPT_SEQLEN_K, OPT_DIM,
    OPT_CAUSAL, OPT_DTYPE, OPT_SCALE, OPT_SEED, OPT_CHECK, OPT_BENCH, OPT_BACKWARD,
    OPT_DETERMINISTIC, OPT_CSV, OPT_LOAD, OPT_SAVE, OPT_HELP, OPT_WINDOW, OPT_MASK, OPT_BLOCK_MASK,
    OPT_INPUTS, OPT_HADAMARD, OPT_POINTS, OPT_TIMEOUT
};

static const struct option long_opts[] = {
    { "batch", required_argument, NULL, OPT_BATCH },
    { "heads", required_argument, NULL, OPT_HEADS },
    { "kv-heads", required_argument, NULL, OPT_KV_HEADS },
    { "seqlen", required_argument, NULL, OPT_SEQLEN },
    { "seqlen-q", required_argument, NULL, OPT_SEQLEN_Q },
    { "seqlen-k", required_argument, NULL, OPT_SEQLEN_K },
    { "dim", required_argument, NULL, OPT_DIM },
    { "causal", no_argument, NULL, OPT_CAUSAL },
    { "window", required_argument, NULL, OPT_WINDOW },
    { "mask", required_argument, NULL, OPT_MASK },
    { "block-mask", required_argument, NULL, OPT_BLOCK_MASK },
    { "dtype", required_argument, NULL, OPT_DTYPE },
    { "scale", required_argument, NULL, OPT_SCALE },
    { "seed", required_argument, NULL, OPT_SEED },
    { "inputs", required_argument, NULL, OPT_INPUTS },
    { "hadamard", no_argument, NULL, OPT_HADAMARD },
    { "check", no_argument, NULL, OPT_CHECK },
    { "bench", no_argument, NULL, OPT_BENCH },
    { "backward", no_argument, NULL, OPT_BACKWARD },
    { "deterministic", no_argument, NULL, OPT_DETERMINISTIC },
    { "csv", required_argument, NULL, OPT_CSV },
    { "load", required_argument, NULL, OPT_LOAD },
    { "save", required_argument, NULL, OPT_SAVE },
    { "points", required_argument, NULL, OPT_POINTS },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "help", no_argument, NULL, OPT_HELP },
    { NULL, 0, NULL, 0 }
};

void attn_print_help(FILE *f, const char *prog, const attn_stage *st)
{
    if (st) fprintf(f, "%s: %s\nsupports: %s\n\n", st->name, st->summary, st->supports);
    fprintf(f,
        "usage: %s [flags]\n"
        "Runs one attention problem on the GPU with fresh random inputs (normal(0,1) from\n"
        "--seed, rounded to the dtype; see --inputs) and reports correctness and/or time.\n"
        "\n"
        "problem (layouts Q,O [B,Nq,H,d], K,V [B,Nk,Hkv,d], L [B,H,Nq]):\n"
        "  --batch B        batch size (default 2)\n"
        "  --heads H        query heads (default 4)\n"
        "  --kv-heads Hkv   key/value heads, must divide H (default H; GQA when < H)\n"
        "  --seqlen N       query and key length (default 1000)\n"
        "  --seqlen-q Nq    query length (overrides --seqlen)\n"
        "  --seqlen-k Nk    key length (overrides --seqlen)\n"
        "  --dim d          head dim (default 64)\n"
        "                   (sizes: at most 2^40 elements a tensor, B and H at most 65535, B*H at\n"
        "                   most 2^31-1, Nq and Nk at most 2^31-256)\n"
        "  --causal         causal mask, top-left: key j visible to query i iff j <= i\n"
        "  --window W       sliding window: also i - W < j (and, without --causal, j < i + W);\n"
        "                   a row that sees no key gets O = 0, L = -inf; TFLOP/s count the\n"
        "                   visible pairs (stages without masks refuse it); a W above Nq + Nk is\n"
        "                   taken as Nq + Nk (the same keys)\n"
        "  --mask PATTERN   a block mask (tiles of 128 x 128, ANDed with --causal, --window):\n"
        "                   random:D (density D, from --seed), or local:W, global:G, strided:S\n"
        "                   (whole numbers) joined by commas (local:1024,global:256); TFLOP/s\n"
        "                   count visible pairs\n"
        "  --block-mask F   the block mask from F.npy, uint8 or bool (or float 0/1) [1 or B, 1 or\n"
        "                   H, Tq, Tk]\n"
        "  --dtype T        bf16, fp16 or e4m3 (default bf16). e4m3: forward only, stages with an\n"
        "                   fp8 forward; Q, K, V drawn in float32 and stored as e4m3 with one\n"
        "                   scale per (batch, kv head) each (amax / 448); O is bf16\n"
        "  --hadamard       e4m3: before quantization, multiply each head's Q and K by M =\n"
        "                   H_d diag(s) / sqrt(d) (d a power of two; random signs s from --seed,\n"
        "                   one draw per (batch, kv head)): (QM)(KM)^T = QK^T, while outliers\n"
        "                   spread over the head dim (FlashAttention-3's incoherent processing)\n"
        "  --scale s        softmax scale (default 1/sqrt(d)), at most 1e4\n"
        "  --seed n         input seed (default 1)\n"
        "  --inputs KIND    normal (default); outliers: Q, K, V N(0,1) plus, with probability\n"
        "                   0.001, N(0,100) (FlashAttention-3's fp8 test); or the tests' hard\n"
        "                   kinds: large-logits (Q, K x100; forward), medium-logits (x10),\n"
        "                   flat-rows (each head's keys one vector + 1e-3 noise)\n"
        "\n"
        "what to do (default: run once, report nothing but the summary):\n"
        "  --check          compare with a float64 CPU oracle, element-wise; rows are sampled\n"
        "                   for big shapes (the output says how many were checked); e4m3: the\n"
        "                   oracle takes the dequantized inputs, and a line gives the RMSE of O\n"
        "                   against the float64 result of the inputs before quantization. A\n"
        "                   check that compares nothing (a backward too big for the oracle even\n"
        "                   sampled, or no host memory for it) says why and exits 2\n"
        "  --bench          time the stage call with CUDA events, L2 flushed before each run;\n"
        "                   prints the median ms and TFLOP/s (FLOPs 4*B*H*Nq*Nk*d, half when\n"
        "                   causal, 2.5x for the backward)\n"
        "  --backward       run the backward pass (the forward runs first for O and L; only\n"
        "                   the backward is checked in full and timed)\n"
        "  --deterministic  backward: ask for a deterministic dQ reduction (stages that offer it)\n"
        "\n"
        "files:\n"
        "  --csv FILE       append one result row (header written if FILE is new or empty):\n"
        "                   gpu,stage,direction,dtype,B,H,H_kv,N_q,N_k,d,causal,median_ms,\n"
        "                   tflops,workspace_bytes,status,note (status ok|refused|failed); a\n"
        "                   masked run's note starts with window=W; mask=PATTERN; (or\n"
        "                   block-mask=FILE;) block-mask density=X; (the fraction of pairs seen);\n"
        "                   then inputs=KIND; (but for normal inputs), hadamard; (with it)\n"
        "                   and, for a checked e4m3 run, rmse_vs_unquantized=X;\n"
        "  --load DIR       read q.npy, k.npy, v.npy (and do.npy with --backward), 4-D float32\n"
        "                   or float16 [B,N,heads,d], instead of random inputs; their shapes\n"
        "                   override the size flags; values are rounded to --dtype (e4m3:\n"
        "                   quantized) and must be finite, also once rounded\n"
        "  --save DIR       write q,k,v,o,lse (and do,dq,dk,dv) .npy files; 16-bit tensors are\n"
        "                   stored as float32 (exact), lse as float32 [B,H,Nq]; with a block\n"
        "                   mask also block_mask.npy, uint8 [bm_b,bm_h,Tq,Tk], the mask the run\n"
        "                   used (what --block-mask reads); e4m3: q,k,v as the float32 values\n"
        "                   before quantization (and --hadamard; --load gives the same run back,\n"
        "                   with the same --hadamard --seed) and q_descale,k_descale,v_descale\n"
        "                   float32 [B,Hkv]\n"
        "  --help           this text\n"
        "\n"
        "many runs in one process:\n"
        "  --points FILE    one run per line of FILE (- reads standard input, each line as it\n"
        "                   comes): a line holds flags, added after the command line's (blank\n"
        "                   lines and lines whose first word starts with # are skipped; no\n"
        "                   quotes: words are split at blanks). Each run is what the program\n"
        "                   with those flags would do: the same checks and refusals, its own\n"
        "                   fresh inputs, settling and CSV row; a run's exit status goes to\n"
        "                   stderr, \"STAGE: point I/N (line L): exit E, S s\" (I without /N from\n"
        "                   -). A bad line is one line and exit 2 (a FILE is read whole first,\n"
        "                   so then nothing ran). A CUDA error that leaves the GPU unusable\n"
        "                   ends the program after that run's row (its line ends with \"no more\n"
        "                   points\", exit 1). Exit status: 1 if a run's was 1, else 2 if one's\n"
        "                   was 2, else 0\n"
        "  --timeout S      end the program (exit 124, as timeout(1)) when one run takes more\n"
        "                   than S seconds\n"
        "\n"
        "environment:\n"
        "  ATTN_SMEM_PER_BLOCK=n  answer as if a block could have at most n bytes of shared\n"
        "                   memory (101376: an RTX 4090), to see what a smaller GPU refuses\n"
        "\n"
        "exit status: 0 ok, 1 check failed or the stage failed on the GPU, 2 bad input,\n"
        "shape refused by the stage, not enough GPU memory, no GPU, or a --check that compared\n"
        "nothing.\n",
        prog);
}

/* strtol and strtoull skip leading blanks and take a sign: a number here starts with a digit */
static int parse_pos_int(const char *flag, const char *s, int *out, char *err)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!isdigit((unsigned char)s[0]) || errno || end == s || *end || v <= 0 || v > INT_MAX) {
        snprintf(err, ATTN_MSG_LEN, "--%s: '%s' is not a positive integer (see --help)", flag, s);
        return 2;
    }
    *out = (int)v;
    return 0;
}

int attn_parse_args(attn_cli *c, int argc, char **argv, char *err)
{
    memset(c, 0, sizeof *c);
    attn_problem_default(&c->p);
    c->dir = ATTN_FORWARD;
    c->seed = 1;
    int kv_set = 0, scale_set = 0, n_set = 0, N = c->p.N_q, nq = 0, nk = 0;
    const char *dtype = NULL, *inputs = NULL;
    opterr = 0;
    optind = 0;   /* glibc: 0 re-initialises getopt fully (1 can leave a half-read "-xy" behind) */
    for (;;) {
        int longidx = -1;
        int o = getopt_long(argc, argv, ":h", long_opts, &longidx);
        if (o == -1) break;
        const char *name = longidx >= 0 ? long_opts[longidx].name : "";
        int rc = 0;
        char *end;
        switch (o) {
        case OPT_BATCH: rc = parse_pos_int(name, optarg, &c->p.B, err); break;
        case OPT_HEADS: rc = parse_pos_int(name, optarg, &c->p.H, err); break;
        case OPT_KV_HEADS: rc = parse_pos_int(name, optarg, &c->p.H_kv, err); kv_set = 1; break;
        case OPT_SEQLEN: rc = parse_pos_int(name, optarg, &N, err); n_set = 1; break;
        case OPT_SEQLEN_Q: rc = parse_pos_int(name, optarg, &nq, err); c->nq_set = 1; break;
        case OPT_SEQLEN_K: rc = parse_pos_int(name, optarg, &nk, err); c->nk_set = 1; break;
        case OPT_DIM: rc = parse_pos_int(name, optarg, &c->p.d, err); break;
        case OPT_CAUSAL: c->p.causal = 1; break;
        case OPT_WINDOW: rc = parse_pos_int(name, optarg, &c->p.window, err); break;
        case OPT_MASK: c->mask_spec = optarg; break;
        case OPT_BLOCK_MASK: c->mask_file = optarg; break;
        case OPT_DTYPE: dtype = optarg; break;
        case OPT_INPUTS: inputs = optarg; break;
        case OPT_HADAMARD: c->hadamard = 1; break;
        case OPT_SCALE: {
            errno = 0;
            double s = strtod(optarg, &end);
            if (errno || end == optarg || *end || !isfinite(s) || s <= 0 || s > ATTN_MAX_SCALE) {
                snprintf(err, ATTN_MSG_LEN, "--scale: '%s' is not a positive number up to %g (see --help)",
                         optarg, ATTN_MAX_SCALE);
                rc = 2;
            }
            c->p.scale = (float)s;
            scale_set = 1;
            break;
        }
        case OPT_SEED: {
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (!isdigit((unsigned char)optarg[0]) || errno || end == optarg || *end) {
                snprintf(err, ATTN_MSG_LEN, "--seed: '%s' is not a non-negative integer (see --help)", optarg);
                rc = 2;
            }
            c->seed = s;
            break;
        }
        case OPT_CHECK: c->check = 1; break;
        case OPT_BENCH: c->bench = 1; break;
        case OPT_BACKWARD: c->dir = ATTN_BACKWARD; break;
        case OPT_DETERMINISTIC: c->p.deterministic = 1; break;
        case OPT_CSV: c->csv = optarg; break;
        case OPT_LOAD: c->load = optarg; break;
        case OPT_SAVE: c->save = optarg; break;
        case OPT_POINTS: c->points = optarg; break;
        case OPT_TIMEOUT: rc = parse_pos_int(name, optarg, &c->timeout, err); break;
        case 'h':
        case OPT_HELP: c->help = 1; break;
        case ':':
            snprintf(err, ATTN_MSG_LEN, "%s needs a value (see --help)", argv[optind - 1]);
            return 2;
        default:
            snprintf(err, ATTN_MSG_LEN, "unknown flag '%s' (see --help)", argv[optind - 1]);
            return 2;
        }
        if (rc) return rc;
    }
    if (optind < argc) {
        snprintf(err, ATTN_MSG_LEN, "unexpected argument '%s' (see --help)", argv[optind]);
        return 2;
    }
    if (c->help) return 0;
    if (dtype && attn_dtype_parse(dtype, &c->p.dtype)) {
        snprintf(err, ATTN_MSG_LEN, "--dtype: unknown dtype '%s' (want bf16, fp16 or e4m3)", dtype);
        return 2;
    }
    if (inputs && attn_input_parse(inputs, &c->inputs)) {
        snprintf(err, ATTN_MSG_LEN, "--inputs: unknown kind '%s' (want normal, outliers, large-logits, "
                 "medium-logits or flat-rows)", inputs);
        return 2;
    }
    if (inputs && c->load) {
        snprintf(err, ATTN_MSG_LEN, "--inputs and --load: the inputs are drawn or loaded, not both");
        return 2;
    }
    if (c->p.dtype == ATTN_E4M3 && c->dir == ATTN_BACKWARD) {
        snprintf(err, ATTN_MSG_LEN, "--dtype e4m3 is forward only: no --backward");
        return 2;
    }
    /* a pattern's syntax now, for any sizes (the mask itself is built once they are known) */
    if (c->mask_spec && c->mask_file) {
        snprintf(err, ATTN_MSG_LEN, "--mask and --block-mask: give one of them");
        return 2;
    }
    if (c->mask_spec && attn_mask_spec_check(c->mask_spec, err)) return 2;
    if (c->hadamard && c->p.dtype != ATTN_E4M3) {
        snprintf(err, ATTN_MSG_LEN, "--hadamard needs --dtype e4m3 (it rotates Q and K before they "
                 "are quantized)");
        return 2;
    }
    /* with --load, d comes from the files (attn_host_quantize checks it then) */
    if (c->hadamard && !c->load && (c->p.d & (c->p.d - 1))) {
        snprintf(err, ATTN_MSG_LEN, "--hadamard needs a head dim that is a power of two (--dim %d)", c->p.d);
        return 2;
    }
    const char *smem = getenv("ATTN_SMEM_PER_BLOCK");
    if (smem) {   /* read by attn_smem_per_block (runner.c); checked here, before CUDA */
        char *end;
        errno = 0;
        const long v = strtol(smem, &end, 10);
        if (!isdigit((unsigned char)smem[0]) || errno || end == smem || *end || v <= 0 || v > INT_MAX) {
            snprintf(err, ATTN_MSG_LEN, "ATTN_SMEM_PER_BLOCK: '%s' is not a positive number of bytes", smem);
            return 2;
        }
    }
    (void)n_set;
    c->p.N_q = c->nq_set ? nq : N;
    c->p.N_k = c->nk_set ? nk : N;
    if (!kv_set) c->p.H_kv = c->p.H;
    if (!scale_set) c->p.scale = (float)(1.0 / sqrt((double)c->p.d));
    if (attn_problem_validate(&c->p, err)) return 2;
    c->scale_set = scale_set;
    return 0;
}

/* a CSV field: no commas or newlines */
static void csv_clean(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < n; i++) {
        char ch = src[i];
        dst[i] = (ch == ',' ? ';' : (ch == '\n' || ch == '\r') ? ' ' : ch);
    }
    dst[i] = 0;
}

/* The CSV has no mask columns: a row with a window or a block mask says so first in its note,
 * in this order: "window=W; ", the mask's name ("mask=PATTERN; " or "block-mask=FILE; ", when
 * the program knows it: mask_name, NULL for none), and the density of visible pairs (its
 * TFLOP/s count only those), "block-mask density=X; ". plots/bench.sh and the plotting scripts
 * tell the rows of different masks apart by these fields (plots/masks.awk). */
static int csv_row(const char *path, const char *gpu, const char *stage, const attn_problem *p,
                   attn_dir dir, double median_ms, double tflops, size_t ws_bytes,
                   const char *status, const char *mask_name, const char *note)
{
    FILE *f = fopen(path, "a");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    if (ftell(f) == 0)
        fprintf(f, "gpu,stage,direction,dtype,B,H,H_kv,N_q,N_k,d,causal,median_ms,tflops,"
                   "workspace_bytes,status,note\n");
    char g[256], n[ATTN_MSG_LEN];
    csv_clean(g, sizeof g, gpu);
    for (char *s = g; *s; s++)
        if (*s == ' ') *s = '-';
    char wn[ATTN_MSG_LEN] = "";
    size_t k = 0;
    if (p->window > 0) k += (size_t)snprintf(wn + k, sizeof wn - k, "window=%d; ", p->window);
    if (mask_name && mask_name[0] && k < sizeof wn)
        k += (size_t)snprintf(wn + k, sizeof wn - k, "%s; ", mask_name);
    if (p->block_mask && k < sizeof wn)
        k += (size_t)snprintf(wn + k, sizeof wn - k, "block-mask density=%.4g; ",
                              p->pairs / ((double)p->B * p->H * (double)p->N_q * p->N_k));
    if (k && k < sizeof wn) snprintf(wn + k, sizeof wn - k, "%s", note ? note : "");
    csv_clean(n, sizeof n, k ? wn : note);
    char ms[32] = "", tf[32] = "";
    if (median_ms > 0) {
        snprintf(ms, sizeof ms, "%.6g", median_ms);
        snprintf(tf, sizeof tf, "%.6g", tflops);
    }
    fprintf(f, "%s,%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%s,%s,%zu,%s,%s\n", g, stage,
            dir == ATTN_BACKWARD ? "backward" : "forward", attn_dtype_name(p->dtype), p->B, p->H,
            p->H_kv, p->N_q, p->N_k, p->d, p->causal, ms, tf, ws_bytes, status, n);
    return fclose(f) == 0 ? 0 : -1;
}

int attn_csv_append(const char *path, const char *gpu, const char *stage, const attn_problem *p,
                    attn_dir dir, double median_ms, double tflops, size_t ws_bytes,
                    const char *status, const char *note)
{
    return csv_row(path, gpu, stage, p, dir, median_ms, tflops, ws_bytes, status, NULL, note);
}

/* The name of the block mask for the CSV note: "mask=PATTERN" (its commas written as '+', so
 * that it stays one field of the note: "mask=local:1024+global:256"), "block-mask=NAME" (the
 * file's name without its directory), or "" without a mask. */
static void mask_name(char *buf, size_t n, const attn_cli *c)
{
    buf[0] = 0;
    if (c->mask_spec) {
        snprintf(buf, n, "mask=%s", c->mask_spec);
        for (char *s = buf; *s; s++)
            if (*s == ',') *s = '+';
    } else if (c->mask_file) {
        const char *slash = strrchr(c->mask_file, '/');
        snprintf(buf, n, "block-mask=%s", slash ? slash + 1 : c->mask_file);
    }
}

/* The name of the GPU a run would use, for a row written before any run: "none" without one. */
static void device_name(char *buf, size_t n)
{
    int count, dev;
    char why[ATTN_MSG_LEN];
    struct cudaDeviceProp prop;
    if (attn_gpu_available(&count, why) == 0 && cudaGetDevice(&dev) == cudaSuccess &&
        cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(buf, n, "%s", prop.name);
    else
        snprintf(buf, n, "none");
}

static const char *dev_or_none(const attn_run_info *info)
{
    return info->device[0] ? info->device : "none";
}

/* One run: what the program does with the flags c once they are parsed. It returns the exit
 * status, having freed everything it allocated (--points runs it again and again). */
static int run_one(const attn_stage *st, const attn_cli *flags)
{
    const attn_cli c = *flags;
    char err[ATTN_MSG_LEN] = { 0 };
    /* --save DIR: the directory must be writable before the run, not found wanting after it */
    if (c.save) {
        if (mkdir(c.save, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "%s: --save %s: cannot create the directory (%s)\n", st->name, c.save,
                    strerror(errno));
            return 2;
        }
        struct stat sb;
        if (stat(c.save, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "%s: --save %s: not a directory\n", st->name, c.save);
            return 2;
        }
        if (access(c.save, W_OK | X_OK) != 0) {
            fprintf(stderr, "%s: --save %s: cannot write there (%s)\n", st->name, c.save,
                    strerror(errno));
            return 2;
        }
    }
    attn_host t;
    attn_problem p = c.p;
    if (c.load) {
        if (attn_load_dir(c.load, &t, &p, c.dir == ATTN_BACKWARD, err)) {
            fprintf(stderr, "%s: %s\n", st->name, err);
            return 2;
        }
        if (!c.scale_set) t.p.scale = (float)(1.0 / sqrt((double)t.p.d));
        attn_window_clamp(&t.p);   /* the run's note shows the window the stage gets */
        p = t.p;
    } else {
        attn_window_clamp(&p);
        /* a run that is only timed needs no host copy of whole tensors (ATTN_TIMED_PERIOD) */
        const int timed_only = c.bench && !c.check && !c.save;
        if (timed_only ? attn_host_alloc_timed(&t, &p, c.dir == ATTN_BACKWARD)
                       : attn_host_alloc(&t, &p, c.dir == ATTN_BACKWARD)) {
            fprintf(stderr, "%s: out of host memory for the tensors\n", st->name);
            return 2;
        }
        attn_host_fill(&t, c.seed, c.inputs);
    }
    /* --hadamard: Q and K quantized again, rotated (the drawn or loaded values were quantized
     * without the rotation) */
    if (c.hadamard && attn_host_quantize(&t, 1, c.seed, err)) {
        fprintf(stderr, "%s: %s\n", st->name, err);
        attn_host_free(&t);
        return 2;
    }
    char mname[ATTN_MSG_LEN];
    mask_name(mname, sizeof mname, &c);
    /* a stage without masks refuses them here, before a mask is built (the runner would too),
     * and likewise e4m3 for a stage without an fp8 forward, and bf16 or fp16 for one with only
     * that, before any of its code runs; with --csv the refused row names the mask, so that a
     * bench can tell the patterns apart */
    const char *why = (c.mask_spec || c.mask_file || p.window > 0) && !st->masks
                      ? "has no sliding window or block masks (--window, --mask, --block-mask): a dense stage"
                      : p.dtype == ATTN_E4M3 && !st->fp8 ? "has no e4m3 forward (--dtype e4m3): a 16-bit stage"
                      : p.dtype != ATTN_E4M3 && st->fp8 == ATTN_FP8_ONLY
                      ? "runs e4m3 inputs only (--dtype e4m3): an fp8 stage"
                      : NULL;
    if (why) {
        fprintf(stderr, "%s: %s\n", st->name, why);
        if (c.csv) {
            char gpu[256];
            device_name(gpu, sizeof gpu);
            csv_row(c.csv, gpu, st->name, &p, c.dir, 0, 0, 0, "refused", mname, why);
        }
        attn_host_free(&t);
        return 2;
    }
    /* the block mask, for the sizes now known (--load may have set them) */
    if (c.mask_spec || c.mask_file) {   /* one of them (attn_parse_args) */
        if (c.mask_spec ? attn_mask_generate(&t.p, &t.block_mask, c.mask_spec, c.seed, err)
                        : attn_mask_load(&t.p, &t.block_mask, c.mask_file, err)) {
            fprintf(stderr, "%s: %s\n", st->name, err);
            attn_host_free(&t);
            return 2;
        }
        p = t.p;
    }

    char desc[256];
    attn_problem_str(&p, st->name, c.dir, desc, sizeof desc);
    attn_run_opts opts = { .bench = c.bench };
    attn_run_info info;
    attn_run_status rs = attn_run(st, &t, c.dir, &opts, &info);
    if (rs != ATTN_RUN_OK) {
        fprintf(stderr, "%s: %s\n", st->name, info.why);
        if (c.csv)
            csv_row(c.csv, dev_or_none(&info), st->name, &p, c.dir, 0, 0, info.workspace_bytes,
                    rs == ATTN_RUN_CUDA_ERROR ? "failed" : "refused", mname, info.why);
        attn_host_free(&t);
        return rs == ATTN_RUN_CUDA_ERROR ? 1 : 2;
    }
    printf("%s on %s (sm_%d)\n", desc, info.device, info.sm);
    printf("memory: tensors %.1f MiB; workspace %.1f MiB (L %.1f MiB + stage %.1f MiB); "
           "cudaMemGetInfo delta %.1f MiB\n", info.tensor_bytes / MIB, info.workspace_bytes / MIB,
           info.lse_bytes / MIB, info.stage_ws_bytes / MIB, info.memgetinfo_delta / MIB);

    int exit_code = 0, checked = 0;   /* checked: the oracle compared this run's outputs */
    char check_str[ATTN_MSG_LEN] = "not checked (no --check)", fail_note[ATTN_MSG_LEN] = "";
    char unchecked[ATTN_MSG_LEN] = "";   /* --check that compared nothing: why */
    char rmse_note[64] = "";          /* e4m3: "rmse_vs_unquantized=X; " */
    char inputs_note[64] = "";        /* "inputs=KIND; " but for normal ones, then "hadamard; " */
    if (c.inputs != ATTN_INPUT_NORMAL)
        snprintf(inputs_note, sizeof inputs_note, "inputs=%s; ", attn_input_name(c.inputs));
    if (c.hadamard) strcat(inputs_note, "hadamard; ");
    if (c.check) {
        attn_sample s;
        attn_ref r;
        attn_sample_choose(&s, &p, c.dir, c.seed);
        printf("check: %s\n", s.note);
        if (s.skipped) {
            snprintf(unchecked, sizeof unchecked, "%s", s.note);
        } else if (attn_oracle(&t, c.dir, &s, &r)) {
            snprintf(unchecked, sizeof unchecked, "out of host memory for the oracle");
        } else {
            checked = 1;
            attn_cmp cmp[5];
            int nc, fails = attn_compare_all(cmp, &nc, &t, c.dir, &r, &s);
            for (int i = 0; i < nc; i++) attn_cmp_print(stdout, &cmp[i]);
            char sh[ATTN_MSG_LEN];
            attn_cmp_short(sh, sizeof sh, cmp, nc);
            snprintf(check_str, sizeof check_str, "check %s (%s)", fails ? "FAIL" : "PASS", sh);
            if (fails) {
                exit_code = 1;
                size_t used = 0;
                used += (size_t)snprintf(fail_note, sizeof fail_note, "check failed:");
                for (int i = 0; i < nc && used < sizeof fail_note; i++) {
                    if (cmp[i].mismatches)
                        used += (size_t)snprintf(fail_note + used, sizeof fail_note - used,
                                                 " %s %zu mismatches", attn_tensor_name(cmp[i].kind),
                                                 cmp[i].mismatches);
                    if (cmp[i].nw_fail && used < sizeof fail_note)
                        used += (size_t)snprintf(fail_note + used, sizeof fail_note - used,
                                                 " %s norm-wise %.2e > %.2e", attn_tensor_name(cmp[i].kind),
                                                 cmp[i].normwise, cmp[i].nw_bound);
                    if (cmp[i].lean_fail && used < sizeof fail_note)
                        used += (size_t)snprintf(fail_note + used, sizeof fail_note - used,
                                                 " %s lean %+.2e, bound %.2e", attn_tensor_name(cmp[i].kind),
                                                 cmp[i].lean, cmp[i].lean_bound);
                }
            }
            attn_ref_free(&r);
            /* e4m3: what it costs, beside the check: O against the float64 attention of the
             * inputs before quantization (FlashAttention-3's Table 3), once the check's reference
             * is freed */
            if (p.dtype == ATTN_E4M3) {
                if (attn_oracle_unquantized(&t, &s, &r)) {
                    printf("  O  rmse vs the unquantized inputs: not computed (out of host memory)\n");
                } else {
                    const double rmse = attn_rmse(&p, t.o, r.o, &s);
                    printf("  O  rmse vs the unquantized inputs %.3e (float64 attention of the float32 "
                           "inputs before quantization; RMS of O %.3e; not part of the check)\n", rmse,
                           cmp[0].rms_ref);
                    snprintf(rmse_note, sizeof rmse_note, "rmse_vs_unquantized=%.4g; ", rmse);
                    attn_ref_free(&r);
                }
            }
        }
        attn_sample_free(&s);
        if (!checked) {   /* a check asked for and not made is not a pass */
            snprintf(check_str, sizeof check_str, "not checked (%s)", unchecked);
            if (!exit_code) exit_code = 2;
        }
    }
    if (c.save) {
        if (attn_save_dir(c.save, &t, err)) {
            fprintf(stderr, "%s: %s\n", st->name, err);
            if (!exit_code) exit_code = 2;
        } else {
            printf("saved .npy files to %s\n", c.save);
        }
    }
    char bench_str[128] = "not timed (no --bench)";
    double tflops = 0;
    if (c.bench) {
        tflops = attn_flops(&p, c.dir) / (info.median_ms * 1e-3) / 1e12;
        snprintf(bench_str, sizeof bench_str, "%.3f ms %.1f TFLOP/s (median of %d)", info.median_ms,
                 tflops, info.runs);
    }
    if (c.csv) {
        const char *status = exit_code == 1 ? "failed" : "ok";
        char note[ATTN_MSG_LEN];
        /* a deterministic backward is another variant of the stage: say so in the row */
        snprintf(note, sizeof note, "%s%s%s%s",
                 p.deterministic && c.dir == ATTN_BACKWARD ? "deterministic " : "", inputs_note, rmse_note,
                 exit_code == 1 ? fail_note : (checked ? "checked" : c.check ? "not checked" : ""));
        if (csv_row(c.csv, info.device, st->name, &p, c.dir, c.bench ? info.median_ms : 0, tflops,
                    info.workspace_bytes, status, mname, note))
            fprintf(stderr, "%s: cannot append to %s\n", st->name, c.csv);
    }
    printf("%s: %s | %s | workspace %.1f MiB\n", desc, check_str, bench_str,
           info.workspace_bytes / MIB);
    if (c.check && !checked) fprintf(stderr, "%s: --check compared nothing: %s\n", st->name, unchecked);
    attn_host_free(&t);
    return exit_code;
}

/* ---- --timeout: SIGALRM ends the program, with the line said beforehand ------------------ */

static char timeout_line[ATTN_MSG_LEN];
static size_t timeout_len;

static void on_timeout(int sig)
{
    (void)sig;
    if (write(STDERR_FILENO, timeout_line, timeout_len) < 0) _exit(124);   /* nothing else to do */
    _exit(124);   /* as timeout(1): a bench reads 124 as "timed out" */
}

/* Arms the alarm for one run of `seconds` (0: disarms it); what: the run, for the line. */
static void arm_timeout(int seconds, const char *what)
{
    if (seconds <= 0) {
        alarm(0);
        return;
    }
    snprintf(timeout_line, sizeof timeout_line, "%s: timed out after %d s (--timeout)\n", what, seconds);
    timeout_len = strlen(timeout_line);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_timeout;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm((unsigned)seconds);
}

/* ---- --points: many runs in one process ---------------------------------------------------- */

int attn_parse_point(attn_cli *c, int argc, char **argv, char *line, char **args, char *err)
{
    const uintptr_t lo = (uintptr_t)line, hi = lo + strlen(line);
    int n = 0, words = 0;
    for (; n < argc; n++) args[n] = argv[n];
    char *save = NULL;
    for (char *w = strtok_r(line, " \t\r\n\v\f", &save); w; w = strtok_r(NULL, " \t\r\n\v\f", &save)) {
        if (words == 0 && w[0] == '#') return 1;   /* a comment */
        if (strpbrk(w, "'\"\\")) {
            snprintf(err, ATTN_MSG_LEN, "no quotes or backslashes in a points line (its words are "
                     "split at blanks): %s", w);
            return 2;
        }
        if (words == ATTN_POINT_WORDS) {
            snprintf(err, ATTN_MSG_LEN, "more than %d words on one line", ATTN_POINT_WORDS);
            return 2;
        }
        args[n++] = w;
        words++;
    }
    if (words == 0) return 1;   /* blank */
    args[n] = NULL;
    if (attn_parse_args(c, n, args, err)) return 2;
    if (c->help) {
        snprintf(err, ATTN_MSG_LEN, "--help is not a run (a points line holds the flags of one run)");
        return 2;
    }
    /* the line's own --points would point into it; the command line's points elsewhere */
    if (c->points && (uintptr_t)c->points >= lo && (uintptr_t)c->points < hi) {
        snprintf(err, ATTN_MSG_LEN, "--points in a points line (a program reads one file of points)");
        return 2;
    }
    return 0;
}

/* After a run: clears an error it left behind, and says whether the CUDA context can still
 * be used. A fault in a kernel is "sticky": every later call fails, so no later run in this
 * process could be measured. 1 (why set) if so; 0 if usable, or if there is no GPU at all. */
static int context_lost(char *why)
{
    int n;
    char tmp[ATTN_MSG_LEN];
    if (attn_gpu_available(&n, tmp)) return 0;
    (void)cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    snprintf(why, ATTN_MSG_LEN, "cudaDeviceSynchronize: %s", cudaGetErrorString(e));
    return 1;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --points FILE|-: a file is read whole and every line checked before the first run; standard
 * input a line at a time, each run as soon as its line has come (a bench keeps the program
 * open and hands it its points one by one). Each run ends with its line on stderr, "STAGE:
 * point I/N (line L): exit E, S s", after its stdout is flushed. */
static int run_points(const attn_stage *st, const attn_cli *c0, int argc, char **argv)
{
    const int from_stdin = strcmp(c0->points, "-") == 0;
    const char *src = from_stdin ? "-" : c0->points;
    char err[ATTN_MSG_LEN], why[ATTN_MSG_LEN], what[ATTN_MSG_LEN];
    char **args = malloc(sizeof(char *) * ((size_t)argc + ATTN_POINT_WORDS + 1));
    char **lines = NULL, *buf = NULL, *line = NULL;
    size_t nlines = 0, cap = 0;
    int npoints = 0, point = 0, worst = 0;
    attn_cli c;
    if (!args) {
        fprintf(stderr, "%s: out of host memory\n", st->name);
        return 2;
    }
    if (!from_stdin) {
        FILE *f = fopen(src, "r");
        if (!f) {
            fprintf(stderr, "%s: --points %s: cannot open it (%s)\n", st->name, src, strerror(errno));
            worst = 2;
            goto out;
        }
        for (size_t room = 0; getline(&buf, &cap, f) >= 0; nlines++) {
            if (nlines == room) {
                room = room ? 2 * room : 64;
                char **more = realloc(lines, sizeof(char *) * room);
                if (!more) break;
                lines = more;
            }
            if (!(lines[nlines] = strdup(buf))) break;
        }
        const int read_all = feof(f);
        fclose(f);
        if (!read_all) {
            fprintf(stderr, "%s: --points %s: cannot read it whole (out of host memory or a read "
                    "error)\n", st->name, src);
            worst = 2;
            goto out;
        }
        for (size_t i = 0; i < nlines; i++) {   /* every line is checked before the first run */
            if (!(line = strdup(lines[i]))) {
                fprintf(stderr, "%s: out of host memory\n", st->name);
                worst = 2;
                goto out;
            }
            const int r = attn_parse_point(&c, argc, argv, line, args, err);
            free(line);
            line = NULL;
            if (r == 2) {
                fprintf(stderr, "%s: --points %s line %zu: %s\n", st->name, src, i + 1, err);
                worst = 2;
                goto out;
            }
            npoints += r == 0;
        }
    }
    for (size_t lineno = 1;; lineno++) {
        if (from_stdin ? getline(&buf, &cap, stdin) < 0 : lineno > nlines) break;
        /* a run's 1 outranks the 2 of what ends the program here (the exit status's rule) */
        if (!(line = strdup(from_stdin ? buf : lines[lineno - 1]))) {
            fprintf(stderr, "%s: out of host memory\n", st->name);
            if (worst != 1) worst = 2;
            goto out;
        }
        const int r = attn_parse_point(&c, argc, argv, line, args, err);
        if (r == 2) {
            fprintf(stderr, "%s: --points %s line %zu: %s\n", st->name, src, lineno, err);
            if (worst != 1) worst = 2;
            goto out;
        }
        if (r == 0) {
            char total[32] = "";
            if (!from_stdin) snprintf(total, sizeof total, "/%d", npoints);
            snprintf(what, sizeof what, "%s: point %d%s (line %zu)", st->name, ++point, total, lineno);
            const double t0 = seconds_now();
            arm_timeout(c.timeout, what);
            const int code = run_one(st, &c);
            fflush(stdout);
            const int lost = context_lost(why);
            arm_timeout(0, NULL);
            if (code == 1 || (code == 2 && worst == 0)) worst = code;
            if (lost) {
                fprintf(stderr, "%s: exit %d, %.2f s; the CUDA context is lost (%s): no more points\n",
                        what, code, seconds_now() - t0, why);
                worst = 1;
                goto out;
            }
            fprintf(stderr, "%s: exit %d, %.2f s\n", what, code, seconds_now() - t0);
        }
        free(line);
        line = NULL;
    }
    if (point == 0) {
        fprintf(stderr, "%s: --points %s: no points (every line is blank or a comment)\n", st->name, src);
        worst = 2;
    }
out:
    free(line);
    for (size_t i = 0; i < nlines; i++) free(lines[i]);
    free(lines);
    free(buf);
    free(args);
    return worst;
}

int attn_main(const attn_stage *st, int argc, char **argv)
{
    attn_cli c;
    char err[ATTN_MSG_LEN] = { 0 };
    if (attn_parse_args(&c, argc, argv, err)) {
        fprintf(stderr, "%s: %s\n", st->name, err);
        return 2;
    }
    if (c.help) {
        attn_print_help(stdout, argv[0], st);
        return 0;
    }
    if (c.points) return run_points(st, &c, argc, argv);
    arm_timeout(c.timeout, st->name);
    const int code = run_one(st, &c);
    arm_timeout(0, NULL);
    return code;
}
