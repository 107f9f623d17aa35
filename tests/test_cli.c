/* tests/test_cli.c: flag parsing (in process), a stage program's exit codes for bad input
 * (a subprocess), the CSV row's note of a masked run (attn_main in process, on stand-in
 * stages that never run), and --points: its lines, its rows (those of one run a line) and its
 * exit codes. Bad input is rejected before any CUDA call, so this runs without a GPU. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <limits.h>
#include <math.h>
#include "test_util.h"

extern const attn_stage *const attn_stages[];
extern const int attn_nstages;

static int parse(attn_cli *c, const char *line, char *err)
{
    static char buf[512];
    static char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof buf, "prog %s", line);
    for (char *tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    return attn_parse_args(c, argc, argv, err);
}

Test(cli, defaults)
{
    attn_cli c;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(parse(&c, "", err), 0);
    cr_assert(c.p.B == 2 && c.p.H == 4 && c.p.H_kv == 4 && c.p.N_q == 1000 && c.p.N_k == 1000);
    cr_assert(c.p.d == 64 && c.p.causal == 0 && c.p.dtype == ATTN_BF16 && c.seed == 1);
    cr_assert_float_eq(c.p.scale, 0.125f, 1e-7);
    cr_assert(c.dir == ATTN_FORWARD && !c.check && !c.bench && !c.csv);
}

Test(cli, flags)
{
    attn_cli c;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(parse(&c, "--seqlen-q 17 --seqlen 99 --heads 8 --kv-heads 2 --dim 128 --causal "
                           "--dtype fp16 --seed 0 --check --bench --backward --deterministic "
                           "--csv x.csv --save d1 --load d2", err), 0, "%s", err);
    cr_assert(c.p.N_q == 17 && c.p.N_k == 99, "--seqlen-q wins over --seqlen in any order");
    cr_assert(c.p.H == 8 && c.p.H_kv == 2 && c.p.d == 128 && c.p.causal && c.p.dtype == ATTN_FP16);
    cr_assert_float_eq(c.p.scale, 1.0 / sqrt(128.0), 1e-7);
    cr_assert(c.seed == 0 && c.check && c.bench && c.dir == ATTN_BACKWARD && c.p.deterministic);
    cr_assert(!strcmp(c.csv, "x.csv") && !strcmp(c.save, "d1") && !strcmp(c.load, "d2"));
    cr_assert_eq(parse(&c, "--scale 0.5 --heads 6", err), 0);
    cr_assert(c.p.scale == 0.5f && c.p.H_kv == 6, "--kv-heads defaults to --heads");
    cr_assert_eq(parse(&c, "--help --heads 0", err), 2, "values are checked even with --help");
    cr_assert_eq(parse(&c, "--help", err), 0);
    cr_assert(c.help);
    cr_assert_eq(parse(&c, "--window 256 --causal", err), 0, "%s", err);
    cr_assert(c.p.window == 256 && c.p.causal);
    char s[256];
    attn_problem_str(&c.p, "x", ATTN_FORWARD, s, sizeof s);
    cr_assert(strstr(s, "window=256") != NULL, "%s", s);
    cr_assert_eq(parse(&c, "--dtype e4m3 --check", err), 0, "%s", err);
    cr_assert(c.p.dtype == ATTN_E4M3 && c.dir == ATTN_FORWARD && c.inputs == ATTN_INPUT_NORMAL && !c.hadamard);
    cr_assert_eq(parse(&c, "--hadamard --dtype e4m3 --dim 256", err), 0, "%s", err);
    cr_assert(c.hadamard && c.p.d == 256);
    const char *kinds[] = { "normal", "large-logits", "flat-rows", "medium-logits", "outliers" };
    for (int k = 0; k < 5; k++) {
        char line[64];
        snprintf(line, sizeof line, "--inputs %s", kinds[k]);
        cr_assert_eq(parse(&c, line, err), 0, "%s", err);
        cr_assert(c.inputs == (attn_input_kind)k && !strcmp(attn_input_name(c.inputs), kinds[k]), "%s", line);
    }
}

/* With a window the FLOP count is the visible (query, key) pairs, exactly: causal window W at
 * N >= W: W (W + 1) / 2 pairs for the first W rows, then W a row; without causal, the band. */
Test(cli, window_flops_count_the_visible_pairs)
{
    attn_problem p;
    attn_problem_default(&p);
    p.B = 1; p.H = 1; p.d = 1; p.N_q = p.N_k = 100; p.causal = 1; p.window = 10;
    cr_assert_float_eq(attn_flops(&p, ATTN_FORWARD), 4.0 * (10 * 11 / 2 + 90 * 10), 1e-9);
    p.causal = 0;   /* row i sees [max(0, i-9), min(100, i+10)) */
    double pairs = 0;
    for (int i = 0; i < 100; i++) pairs += (i + 10 < 100 ? i + 10 : 100) - (i - 9 > 0 ? i - 9 : 0);
    cr_assert_float_eq(attn_flops(&p, ATTN_FORWARD), 4.0 * pairs, 1e-9);
    p.window = 1000;   /* a window wider than the sequence: every pair */
    cr_assert_float_eq(attn_flops(&p, ATTN_FORWARD), 4.0 * 100 * 100, 1e-9);
    int lo, hi;
    p.N_q = 50; p.N_k = 10; p.window = 5;
    attn_visible_keys(&p, 20, &lo, &hi);
    cr_assert(lo == hi, "row 20 of 50 sees none of 10 keys through a window of 5: [%d, %d)", lo, hi);
    attn_visible_keys(&p, 12, &lo, &hi);
    cr_assert(lo == 8 && hi == 10, "[%d, %d)", lo, hi);
    /* the widest window there is: i + W must not wrap around (every row sees every key) */
    p.N_q = p.N_k = 1000; p.window = INT_MAX;
    cr_assert_float_eq(attn_flops(&p, ATTN_FORWARD), 4.0 * 1000 * 1000, 1e-9);
    attn_visible_keys(&p, 999, &lo, &hi);
    cr_assert(lo == 0 && hi == 1000, "[%d, %d)", lo, hi);
    p.causal = 1;
    cr_assert_float_eq(attn_flops(&p, ATTN_FORWARD), 4.0 * 1000 * 1001 / 2, 1e-9);
}

Test(cli, bad_input_is_exit_2)
{
    const char *bad[] = { "--heads abc", "--heads 0", "--heads -3", "--batch 2x", "--dim 1e3",
                          "--heads 6 --kv-heads 4", "--dtype fp32", "--dtype", "--scale 0",
                          "--scale nan", "--scale x", "--seed -1", "--seqlen 99999999999",
                          "--frobnicate", "positional", "-x", "--window 0", "--window -4",
                          "--window x", "--dtype e4m3 --backward", "--backward --dtype e4m3",
                          "--inputs", "--inputs gaussian", "--inputs outliers --load d",
                          "--hadamard", "--hadamard --dtype fp16", "--dtype e4m3 --hadamard --dim 96",
                          /* element counts past 2^40 (2^63 and 2^64 here: size_t wraps), B * H past
                           * INT_MAX, a length past INT_MAX - 255 (its count of 192-row tiles would wrap) */
                          "--batch 2097152 --heads 2097152 --seqlen 1048576 --dim 2",
                          "--batch 2097152 --heads 2097152 --seqlen 1048576 --dim 4",
                          "--batch 65536 --heads 32768 --seqlen 1 --dim 1",
                          "--batch 1 --heads 1 --dim 1 --seqlen 2147483647",
                          "--seqlen-q 1 --seqlen-k 2147483520 --heads 1024",
                          "--batch 1 --heads 1 --dim 1 --seqlen-q 2147483400 --seqlen-k 1",
                          /* B or H past a grid's y and z (65535) */
                          "--heads 65536 --seqlen 64", "--batch 65536 --seqlen 64",
                          "--scale 1e5", "--scale 3e38",
                          /* mask patterns: checked when parsed */
                          "--mask local:inf", "--mask local:1e300", "--mask global:1e19", "--mask local:0x100",
                          "--mask local:3,", "--mask ,local:3", "--mask local:3,,global:5", "--mask local:1e3",
                          "--mask local:-3", "--mask local:+3", "--mask local:3000000000", "--mask local:0",
                          "--mask random:1.5", "--mask random:0", "--mask random:inf", "--mask random:nan",
                          "--mask random:-0.5", "--mask random:0x0.8p0", "--mask random:0.5,local:3",
                          "--mask local", "--mask local:", "--mask foo:3", "--mask", "--mask ,",
                          "--mask random:0.5 --block-mask m.npy" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_cli c;
        char err[ATTN_MSG_LEN] = { 0 };
        cr_assert_eq(parse(&c, bad[i], err), 2, "'%s' accepted", bad[i]);
        cr_assert(err[0] && !strchr(err, '\n'), "'%s': one line message, got '%s'", bad[i], err);
    }
    const char *bad_env[] = { "abc", "0", "-5", "12k", "" };
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
        attn_cli c;
        char err[ATTN_MSG_LEN] = { 0 };
        setenv("ATTN_SMEM_PER_BLOCK", bad_env[i], 1);
        cr_assert_eq(parse(&c, "--heads 2", err), 2, "ATTN_SMEM_PER_BLOCK='%s' accepted", bad_env[i]);
        cr_assert(strstr(err, "ATTN_SMEM_PER_BLOCK") && !strchr(err, '\n'), "got '%s'", err);
    }
    setenv("ATTN_SMEM_PER_BLOCK", "101376", 1);
    attn_cli c;
    char err[ATTN_MSG_LEN] = { 0 };
    cr_assert_eq(parse(&c, "--heads 2", err), 0, "a valid ATTN_SMEM_PER_BLOCK refused: %s", err);
    setenv("ATTN_SMEM_PER_BLOCK", " 101376", 1);
    cr_assert_eq(parse(&c, "--heads 2", err), 2, "ATTN_SMEM_PER_BLOCK=' 101376' accepted");
    unsetenv("ATTN_SMEM_PER_BLOCK");
    /* values with blanks in them (parse() splits at blanks, so these go in argv as they are):
     * a number is digits from its first character; a pattern has no blanks */
    const char *pairs[][2] = { { "--seed", " -1" }, { "--seed", " 5" }, { "--seed", "+5" },
                               { "--heads", " 4" }, { "--heads", "+4" }, { "--timeout", " 3" },
                               { "--mask", "local: 3" }, { "--mask", "local:3 " }, { "--mask", " local:3" } };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char flag[32], value[32];
        snprintf(flag, sizeof flag, "%s", pairs[i][0]);
        snprintf(value, sizeof value, "%s", pairs[i][1]);
        char *argv[] = { "prog", flag, value, NULL };
        err[0] = 0;
        cr_assert_eq(attn_parse_args(&c, 3, argv, err), 2, "%s '%s' accepted", pairs[i][0], pairs[i][1]);
        cr_assert(err[0] && !strchr(err, '\n'), "%s '%s': one line, got '%s'", pairs[i][0], pairs[i][1], err);
    }
    /* still accepted: the largest scale, the largest integers a pattern takes, a density too
     * small to leave a tile (a valid density) */
    const char *good[] = { "--scale 1e4", "--seed 18446744073709551615", "--mask local:2147483647",
                           "--mask local:1024,global:256", "--mask strided:3", "--mask random:1",
                           "--mask random:1e-300", "--mask random:.5", "--window 2147483647" };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert_eq(parse(&c, good[i], err), 0, "'%s' refused: %s", good[i], err);
}

/* Tile counts are ceil(N / 128) up to N = INT_MAX (N + 127 would wrap). */
Test(cli, mask_tile_counts_do_not_wrap)
{
    attn_problem p = test_problem(1, 1, 1, INT_MAX, 1000, 64, 0);
    cr_assert_eq(attn_mask_tiles_q(&p), 16777216);
    cr_assert_eq(attn_mask_tiles_k(&p), 8);
    p.N_k = 128;
    cr_assert_eq(attn_mask_tiles_k(&p), 1);
    p.N_k = 129;
    cr_assert_eq(attn_mask_tiles_k(&p), 2);
}

/* An oracle sample that is skipped (a backward too big, or no memory for the sample masks) is
 * honoured in either direction: nothing is computed, rather than every row of a forward. */
Test(cli, skipped_sample_computes_nothing)
{
    attn_problem p = test_problem(1, 2, 2, 40, 40, 16, 0);
    attn_host t;
    attn_ref r;
    attn_sample s;
    cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
    attn_host_fill(&t, 1, ATTN_INPUT_NORMAL);
    for (int dir = 0; dir < 2; dir++) {
        attn_sample_all(&s);
        s.skipped = 1;
        cr_assert_eq(attn_oracle(&t, (attn_dir)dir, &s, &r), 0);
        for (size_t e = 0; e < attn_numel_q(&p); e++)
            cr_assert(isnan(r.o[e]), "dir %d: o[%zu] computed for a skipped sample", dir, e);
        attn_ref_free(&r);
    }
    attn_host_free(&t);
}

/* run a stage program; returns its exit status, stderr's line count, the first line */
static int run_prog(const char *args, int *lines, char *first, size_t n)
{
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char cmd[1024], errf[] = "/tmp/attn_cli_err_XXXXXX";
    int fd = mkstemp(errf);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s/%s %s >/dev/null 2>%s", build, attn_stages[0]->name, args, errf);
    int st = system(cmd);
    FILE *f = fopen(errf, "r");
    char line[1024];
    *lines = 0;
    first[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (*lines == 0) snprintf(first, n, "%s", line);
        (*lines)++;
    }
    if (f) fclose(f);
    unlink(errf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void need_program(void)
{
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    char path[512];
    if (attn_nstages == 0) cr_skip_test("no stage under stages/ yet: no program to run");
    snprintf(path, sizeof path, "%s/%s", build, attn_stages[0]->name);
    if (access(path, X_OK) != 0) cr_skip_test("%s not built (run from the repo root after make)", path);
}

Test(cli, program_exit_codes)
{
    need_program();
    const char *bad[] = { "--bad-flag", "--heads abc", "--seqlen 0", "--heads 4 --kv-heads 3",
                          "--dtype fp8", "--seqlen", "--load /nonexistent/dir",
                          "--save /nonexistent/dir/sub", "--save /dev/null" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int lines;
        char first[1024];
        int rc = run_prog(bad[i], &lines, first, sizeof first);
        cr_assert_eq(rc, 2, "%s %s: exit %d, want 2", attn_stages[0]->name, bad[i], rc);
        cr_assert_eq(lines, 1, "%s: one line on stderr, got %d: %s", bad[i], lines, first);
        cr_assert(strncmp(first, attn_stages[0]->name, strlen(attn_stages[0]->name)) == 0,
                  "the line names the stage: %s", first);
    }
    int lines;
    char first[1024];
    cr_assert_eq(run_prog("--help", &lines, first, sizeof first), 0);
    cr_assert_eq(lines, 0);
    /* a stage without an fp8 forward refuses e4m3 before any GPU work, with or without a GPU */
    if (!attn_stages[0]->fp8) {
        cr_assert_eq(run_prog("--dtype e4m3 --seqlen 8 --check", &lines, first, sizeof first), 2);
        cr_assert_eq(lines, 1, "%s", first);
        cr_assert(strncmp(first, attn_stages[0]->name, strlen(attn_stages[0]->name)) == 0 &&
                  strstr(first, "e4m3"), "%s", first);
    }
    /* without a GPU: one line naming the reason, exit 2 */
    int n;
    char why[ATTN_MSG_LEN];
    if (attn_gpu_available(&n, why) != 0) {
        cr_assert_eq(run_prog("--seqlen 8 --check", &lines, first, sizeof first), 2);
        cr_assert_eq(lines, 1);
        cr_assert(strstr(first, "no CUDA GPU (") != NULL, "%s", first);
    }
}

/* Stand-in stages for attn_main in process: one with masks whose check() refuses every shape,
 * and a dense one. Neither ever reaches the GPU: without one the run is refused as "no CUDA
 * GPU", with one check() refuses it; either way the program writes its refused row, which is
 * what these tests read. */
static int refuse_every_shape(const attn_problem *p, attn_dir dir, char *why)
{
    (void)p; (void)dir;
    snprintf(why, ATTN_WHY_LEN, "a test stage: refuses every shape");
    return 1;
}
static size_t no_workspace(const attn_problem *p, attn_dir dir) { (void)p; (void)dir; return 0; }
static cudaError_t never_runs(const attn_problem *p, const attn_args *a, cudaStream_t s)
{
    (void)p; (void)a; (void)s;
    return cudaErrorNotSupported;
}
static const attn_stage masked_stub = { .name = "masked_stub", .summary = "test", .supports = "test",
                                        .check = refuse_every_shape, .workspace = no_workspace,
                                        .forward = never_runs, .masks = 1 };
static const attn_stage dense_stub = { .name = "dense_stub", .summary = "test", .supports = "test",
                                       .check = refuse_every_shape, .workspace = no_workspace,
                                       .forward = never_runs };
/* one whose run fails on a GPU (exit 1): it accepts every shape and its forward returns an error */
static int accept_every_shape(const attn_problem *p, attn_dir dir, char *why)
{
    (void)p; (void)dir; (void)why;
    return 0;
}
static const attn_stage failing_stub = { .name = "failing_stub", .summary = "test", .supports = "test",
                                         .check = accept_every_shape, .workspace = no_workspace,
                                         .forward = never_runs, .masks = 1 };
static const attn_stage fp8_only_stub = { .name = "fp8_only_stub", .summary = "test", .supports = "test",
                                          .check = refuse_every_shape, .workspace = no_workspace,
                                          .forward = never_runs, .fp8 = ATTN_FP8_ONLY };

/* attn_main in process with the words of args; stderr hidden. Its exit code. */
static int main_quiet(const attn_stage *st, const char *args)
{
    static char buf[2048];
    static char *argv[128];
    int argc = 0;
    snprintf(buf, sizeof buf, "prog %s", args);
    for (char *tok = strtok(buf, " "); tok && argc < 127; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    fflush(stderr);
    const int saved = dup(2), devnull = open("/dev/null", O_WRONLY);
    cr_assert(saved >= 0 && devnull >= 0);
    dup2(devnull, 2);
    const int rc = attn_main(st, argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(devnull);
    return rc;
}

/* attn_main on a stand-in stage with the flags of line plus --csv; returns its exit code and
 * the note (the 16th field) of the one row it wrote into note */
static int main_row_note(const attn_stage *st, const char *line, char *note, size_t n)
{
    char csv[] = "/tmp/attn_cli_csv_XXXXXX", args[512], buf[1024];
    int fd = mkstemp(csv);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(args, sizeof args, "%s --csv %s", line, csv);
    const int rc = main_quiet(st, args);   /* its one line of refusal, expected here, is not shown */
    FILE *f = fopen(csv, "r");
    int rows = 0;
    note[0] = 0;
    while (f && fgets(buf, sizeof buf, f)) {
        if (rows++ == 0) continue;   /* the header */
        buf[strcspn(buf, "\n")] = 0;
        const char *field = buf;
        for (int i = 1; i < 16 && field; i++) field = strchr(field, ',') ? strchr(field, ',') + 1 : NULL;
        cr_assert_not_null(field, "a row of fewer than 16 fields: %s", buf);
        snprintf(note, n, "%s", field);
    }
    if (f) fclose(f);
    unlink(csv);
    cr_assert_eq(rows, 2, "want the header and one row, got %d lines", rows);
    return rc;
}

/* The density the note must give: the mask that pattern makes for these sizes and seed 1. */
static double pattern_density(attn_problem p, const char *spec)
{
    unsigned char *m = NULL;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_mask_generate(&p, &m, spec, 1, err), 0, "%s", err);
    free(m);
    return p.pairs / ((double)p.B * p.H * (double)p.N_q * p.N_k);
}

/* A masked row's note names the pattern (rows of different patterns stay apart in a bench
 * CSV), after the window and before the density; commas of a pattern become '+'. */
Test(cli, csv_note_names_the_mask)
{
    char note[1024], want[256];
    attn_problem p = test_problem(2, 2, 2, 300, 300, 64, 0);
    cr_assert_eq(main_row_note(&masked_stub, "--batch 2 --heads 2 --seqlen 300 --mask random:0.5", note,
                               sizeof note), 2);
    snprintf(want, sizeof want, "mask=random:0.5; block-mask density=%.4g; ", pattern_density(p, "random:0.5"));
    cr_assert(strncmp(note, want, strlen(want)) == 0, "note '%s', want it to start with '%s'", note, want);
    cr_assert(strstr(note, "a test stage") || strstr(note, "no CUDA GPU"), "the reason follows: %s", note);

    p.causal = 1;
    p.window = 200;
    cr_assert_eq(main_row_note(&masked_stub, "--batch 2 --heads 2 --seqlen 300 --causal --window 200 "
                               "--mask local:256,global:128", note, sizeof note), 2);
    snprintf(want, sizeof want, "window=200; mask=local:256+global:128; block-mask density=%.4g; ",
             pattern_density(p, "local:256,global:128"));
    cr_assert(strncmp(note, want, strlen(want)) == 0, "note '%s', want it to start with '%s'", note, want);

    cr_assert_eq(main_row_note(&masked_stub, "--batch 2 --heads 2 --seqlen 300 --causal", note, sizeof note), 2);
    cr_assert(strncmp(note, "window=", 7) && strncmp(note, "mask=", 5) && !strstr(note, "block-mask"),
              "a dense row names no mask: %s", note);
}

/* A dense stage refuses a mask before building it, and with --csv still writes its refused row,
 * naming the mask, so that a bench sees which pattern it refused. */
Test(cli, dense_stage_refusal_writes_a_row)
{
    char note[1024];
    cr_assert_eq(main_row_note(&dense_stub, "--seqlen 300 --mask random:0.1", note, sizeof note), 2);
    cr_assert(strncmp(note, "mask=random:0.1; has no sliding window or block masks", 53) == 0, "%s", note);
    cr_assert(strstr(note, "a dense stage") != NULL, "%s", note);
    cr_assert_eq(main_row_note(&dense_stub, "--seqlen 300 --causal --window 64", note, sizeof note), 2);
    cr_assert(strncmp(note, "window=64; has no sliding window", 32) == 0, "%s", note);
}

/* A stage without an fp8 forward refuses e4m3 before it runs, and with --csv writes its refused
 * row (dtype e4m3, the reason as the note). */
Test(cli, e4m3_refused_by_a_16_bit_stage)
{
    char note[1024];
    cr_assert_eq(main_row_note(&dense_stub, "--seqlen 300 --dtype e4m3", note, sizeof note), 2);
    cr_assert(strncmp(note, "has no e4m3 forward", 19) == 0, "%s", note);
}

/* A stage with only an fp8 forward (ATTN_FP8_ONLY) refuses bf16 and fp16 before it runs, with
 * its refused row; e4m3 it passes on (to its check(), or to the no-GPU refusal). */
Test(cli, bf16_refused_by_an_fp8_only_stage)
{
    char note[1024];
    cr_assert_eq(main_row_note(&fp8_only_stub, "--seqlen 300", note, sizeof note), 2);
    cr_assert(strncmp(note, "runs e4m3 inputs only", 21) == 0, "%s", note);
    cr_assert_eq(main_row_note(&fp8_only_stub, "--seqlen 300 --dtype fp16", note, sizeof note), 2);
    cr_assert(strncmp(note, "runs e4m3 inputs only", 21) == 0, "%s", note);
    cr_assert_eq(main_row_note(&fp8_only_stub, "--seqlen 300 --dim 128 --dtype e4m3", note, sizeof note), 2);
    cr_assert(strstr(note, "a test stage") || strstr(note, "no CUDA GPU"), "%s", note);
}

/* --block-mask: the note names the file (without its directory); the mask --save wrote is
 * the one the run used, so read back it gives the same density. */
Test(cli, csv_note_names_a_mask_file)
{
    char dir[] = "/tmp/attn_cli_mask_XXXXXX", line[512], note[1024], want[256], err[ATTN_MSG_LEN];
    cr_assert_not_null(mkdtemp(dir));
    attn_problem p = test_problem(2, 2, 2, 300, 300, 64, 0);
    attn_host t;
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    attn_host_fill(&t, 1, ATTN_INPUT_NORMAL);
    cr_assert_eq(attn_mask_generate(&t.p, &t.block_mask, "random:0.3", 1, err), 0, "%s", err);
    cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
    snprintf(line, sizeof line, "--batch 2 --heads 2 --seqlen 300 --block-mask %s/block_mask.npy", dir);
    cr_assert_eq(main_row_note(&masked_stub, line, note, sizeof note), 2);
    snprintf(want, sizeof want, "block-mask=block_mask.npy; block-mask density=%.4g; ",
             t.p.pairs / (2.0 * 2 * 300 * 300));
    cr_assert(strncmp(note, want, strlen(want)) == 0, "note '%s', want it to start with '%s'", note, want);
    attn_host_free(&t);
    snprintf(line, sizeof line, "rm -rf '%s'", dir);
    if (system(line)) {}
}

/* A window wider than N_q + N_k is the same window as one of N_q + N_k: taken as that once the
 * sizes are known (the stages compute i + W in int), and the row says so. */
Test(cli, huge_window_is_clamped_to_the_sizes)
{
    char note[1024];
    cr_assert_eq(main_row_note(&masked_stub, "--seqlen-q 300 --seqlen-k 200 --window 2147483647", note,
                               sizeof note), 2);
    cr_assert(strncmp(note, "window=500; ", 12) == 0, "%s", note);
    cr_assert_eq(main_row_note(&masked_stub, "--seqlen-q 300 --seqlen-k 200 --window 500", note, sizeof note), 2);
    cr_assert(strncmp(note, "window=500; ", 12) == 0, "%s", note);
    cr_assert_eq(main_row_note(&masked_stub, "--seqlen 300 --window 4096", note, sizeof note), 2);
    cr_assert(strncmp(note, "window=600; ", 12) == 0, "%s", note);
    cr_assert_eq(main_row_note(&masked_stub, "--seqlen 300 --window 299", note, sizeof note), 2);
    cr_assert(strncmp(note, "window=299; ", 12) == 0, "a window within the sizes stays: %s", note);
}

/* A pattern is read whole, however long (no truncation), strictly (no blanks, signs, hex, empty
 * items; integers for local, global, strided; a finite density 0 < D <= 1), and once read gives
 * the mask its items OR together. */
Test(cli, mask_patterns)
{
    attn_problem p = test_problem(1, 1, 1, 2000, 2000, 64, 0);
    char long_spec[1024] = "";
    for (int i = 0; i < 40; i++) strcat(long_spec, "local:128,");
    strcat(long_spec, "global:1024");
    cr_assert_gt(strlen(long_spec), 255);
    const double want = pattern_density(p, "local:128,global:1024");
    cr_assert_float_eq(pattern_density(p, long_spec), want, 1e-12, "a %zu-character pattern", strlen(long_spec));
    cr_assert_float_eq(pattern_density(p, "local:2147483647"), 1.0, 1e-12);
    cr_assert_float_eq(pattern_density(p, "global:2147483647"), 1.0, 1e-12);
    cr_assert(pattern_density(p, "random:1e-300") >= 0.0);
    const char *bad[] = { "local:inf", "local:1e300", "global:1e19", "local:0x100", "local: 3", "local:3 ",
                          "local:3,", ",local:3", "local:3,,local:5", "random:1e-300,local:3", "random:0",
                          "random:1.000001", "strided:0", "", "local:2147483648" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char *m = NULL;
        char err[ATTN_MSG_LEN] = { 0 };
        attn_problem q = p;
        cr_assert_eq(attn_mask_generate(&q, &m, bad[i], 1, err), -1, "'%s' accepted", bad[i]);
        cr_assert(err[0] && !strchr(err, '\n') && !m && !q.block_mask, "'%s': %s", bad[i], err);
        cr_assert_eq(attn_mask_spec_check(bad[i], err), -1, "'%s' passes the syntax check", bad[i]);
    }
}

/* ---- --points: many runs in one process ------------------------------------------------ */

/* attn_parse_point on line (copied: it is cut in place) after the command line cmd */
static int parse_point(attn_cli *c, const char *cmd, const char *line, char *err)
{
    static char cbuf[512], lbuf[4096];
    static char *argv[64], *args[64 + ATTN_POINT_WORDS + 1];
    int argc = 0;
    snprintf(cbuf, sizeof cbuf, "prog %s", cmd);
    for (char *tok = strtok(cbuf, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    snprintf(lbuf, sizeof lbuf, "%s", line);
    return attn_parse_point(c, argc, argv, lbuf, args, err);
}

Test(cli, points_lines)
{
    attn_cli c;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(parse_point(&c, "--csv a.csv --points -", "  --seqlen 64 --dim 128\t--causal\r\n", err), 0, "%s", err);
    cr_assert(c.p.N_q == 64 && c.p.N_k == 64 && c.p.d == 128 && c.p.causal);
    cr_assert(c.csv && !strcmp(c.csv, "a.csv") && c.points && !strcmp(c.points, "-"),
              "the command line's flags hold for every line");
    cr_assert_float_eq(c.p.scale, 1.0 / sqrt(128.0), 1e-7);
    cr_assert_eq(parse_point(&c, "--seqlen 99 --bench --points f", "--seqlen 7", err), 0, "%s", err);
    cr_assert(c.p.N_q == 7 && c.bench, "a line's flag comes after the command line's, and wins");
    cr_assert_eq(parse_point(&c, "--points f", "--causal --backward --window 4", err), 0, "%s", err);
    cr_assert_eq(parse_point(&c, "--points f", "--seqlen 5", err), 0, "%s", err);
    cr_assert(!c.p.causal && c.dir == ATTN_FORWARD && c.p.window == 0 && c.p.N_q == 5,
              "nothing of a line carries over to the next");
    const char *skip[] = { "", "\n", "   \t \r\n", "# a comment --dim x", "   #--heads 0" };
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        cr_assert_eq(parse_point(&c, "--points f", skip[i], err), 1, "'%s' is not skipped", skip[i]);
    char many[4096] = "";
    for (int i = 0; i <= ATTN_POINT_WORDS; i++) strcat(many, "--causal ");
    const char *bad[] = { "--dim x", "--heads 6 --kv-heads 4", "--seqlen", "positional", "--points g",
                          "--help", "--save 'a b'", "--mask \"random:0.5\"", "--save a\\ b", many,
                          "--batch 2097152 --heads 2097152 --seqlen 1048576 --dim 2", "--mask local:3," };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        cr_assert_eq(parse_point(&c, "--points f", bad[i], err), 2, "'%.40s' accepted", bad[i]);
        cr_assert(err[0] && !strchr(err, '\n'), "'%.40s': one line, got '%s'", bad[i], err);
    }
    cr_assert_eq(parse_point(&c, "--points f", "--causal", err), 0, "%s", err);
    char most[4096] = "";
    for (int i = 0; i < ATTN_POINT_WORDS; i++) strcat(most, "--causal ");
    cr_assert_eq(parse_point(&c, "--points f", most, err), 0, "%d words refused: %s", ATTN_POINT_WORDS, err);
}

/* A file's whole text into buf (empty if missing). */
static void slurp(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    buf[got] = 0;
    if (f) fclose(f);
}

/* The rows of a points file are those of one run per line, byte for byte (the stand-in stages
 * refuse every shape, and their refusals are the rows a bench gets from a dense stage given a
 * mask, or a 16-bit stage given e4m3); the exit code is the worst of the runs'. */
Test(cli, points_rows_are_the_runs_rows)
{
    const char *lines[] = { "--batch 2 --heads 2 --seqlen 300 --mask random:0.5",
                            "--seqlen 300 --causal --window 64", "--seqlen 300 --dtype e4m3 --dim 128",
                            "--seqlen 200 --heads 8 --kv-heads 2 --backward --bench" };
    const attn_stage *stubs[] = { &masked_stub, &dense_stub };
    for (int s = 0; s < 2; s++) {
        char one[] = "/tmp/attn_pts_one_XXXXXX", many[] = "/tmp/attn_pts_many_XXXXXX";
        char pts[] = "/tmp/attn_pts_file_XXXXXX", args[1024], a[8192], b[8192];
        int fd1 = mkstemp(one), fd2 = mkstemp(many), fd3 = mkstemp(pts);
        cr_assert(fd1 >= 0 && fd2 >= 0 && fd3 >= 0);
        close(fd1);
        close(fd2);
        FILE *f = fdopen(fd3, "w");
        fprintf(f, "# every kind of refusal\n\n");
        int worst = 0;
        for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
            fprintf(f, "%s\n", lines[i]);
            snprintf(args, sizeof args, "%s --csv %s", lines[i], one);
            const int rc = main_quiet(stubs[s], args);
            if (rc == 1 || (rc == 2 && worst == 0)) worst = rc;
        }
        fclose(f);
        snprintf(args, sizeof args, "--csv %s --points %s", many, pts);
        cr_assert_eq(main_quiet(stubs[s], args), worst, "%s: the worst run's exit code", stubs[s]->name);
        slurp(one, a, sizeof a);
        slurp(many, b, sizeof b);
        cr_assert(strchr(a, '\n') && !strcmp(a, b), "%s: rows differ:\n%s---\n%s", stubs[s]->name, a, b);
        unlink(one);
        unlink(many);
        unlink(pts);
    }
}

/* --points -: a run that exits 1, then a bad line: the exit code stays 1 (1 if a run's was 1,
 * else 2 if one's was 2). Only a GPU lets a run fail: without one every run is refused (2). */
Test(cli, points_a_failed_run_outranks_a_bad_line)
{
    int n;
    char why[ATTN_MSG_LEN], pts[] = "/tmp/attn_pts_fail_XXXXXX";
    if (attn_gpu_available(&n, why) != 0) cr_skip_test("no CUDA GPU (%s): no run can fail", why);
    cr_assert_eq(main_quiet(&failing_stub, "--seqlen 8"), 1, "the stand-in's run fails");
    const int fd = mkstemp(pts);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "--seqlen 8\n--dim x\n--seqlen 8\n");
    fclose(f);
    const int saved = dup(0), in = open(pts, O_RDONLY);
    cr_assert(saved >= 0 && in >= 0);
    dup2(in, 0);
    clearerr(stdin);
    const int rc = main_quiet(&failing_stub, "--points -");
    dup2(saved, 0);
    close(saved);
    close(in);
    clearerr(stdin);
    unlink(pts);
    cr_assert_eq(rc, 1, "a failed run, then a bad line: exit %d, want 1", rc);
}

/* run a shell command line; its exit status, and its stderr into err */
static int run_sh(const char *cmd, char *err, size_t n)
{
    char errf[] = "/tmp/attn_cli_err_XXXXXX", line[4096];
    int fd = mkstemp(errf);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(line, sizeof line, "%s 2>%s", cmd, errf);
    const int st = system(line);
    slurp(errf, err, n);
    unlink(errf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The program with --points: a bad line anywhere in a file is one line and exit 2 before any
 * run; from standard input, the runs before it have their rows. Each run's line on stderr. */
Test(cli, points_program)
{
    need_program();
    const char *build = getenv("ATTN_BUILD") ? getenv("ATTN_BUILD") : "build";
    const char *name = attn_stages[0]->name;
    char dir[] = "/tmp/attn_cli_pts_XXXXXX", cmd[2048], err[16384], path[600], csv[600], rows[8192];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/points", dir);
    snprintf(csv, sizeof csv, "%s/rows.csv", dir);

    FILE *f = fopen(path, "w");
    fprintf(f, "--seqlen 8\n# the next is fine\n--seqlen 8 --causal\n--heads abc\n--seqlen 8\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/%s --points %s --csv %s >/dev/null", build, name, path, csv);
    cr_assert_eq(run_sh(cmd, err, sizeof err), 2);
    cr_assert_eq(count_lines(err), 1, "one line: %s", err);
    cr_assert(!strncmp(err, name, strlen(name)) && strstr(err, "line 4") && strstr(err, "--heads"), "%s", err);
    cr_assert_eq(access(csv, F_OK), -1, "a bad line in a file: nothing ran, no row");
    /* a pattern is checked with the flags, as is a mask given twice */
    const char *bad_masks[] = { "--mask random:1.5", "--mask local:3,", "--mask local:4 --block-mask m.npy" };
    for (size_t i = 0; i < 3; i++) {
        f = fopen(path, "w");
        fprintf(f, "--seqlen 8\n%s\n--seqlen 8\n", bad_masks[i]);
        fclose(f);
        cr_assert_eq(run_sh(cmd, err, sizeof err), 2, "%s", bad_masks[i]);
        cr_assert(count_lines(err) == 1 && strstr(err, "line 2") && strstr(err, "--mask"), "%s: %s", bad_masks[i], err);
        cr_assert_eq(access(csv, F_OK), -1, "%s: a bad line in a file: nothing ran, no row", bad_masks[i]);
    }

    snprintf(cmd, sizeof cmd, "printf -- '--seqlen 8\\n--dim x\\n--seqlen 8\\n' | %s/%s --points - --csv %s "
             ">/dev/null", build, name, csv);
    cr_assert_eq(run_sh(cmd, err, sizeof err), 2);
    cr_assert(strstr(err, "point 1 (line 1): exit ") && strstr(err, "--points - line 2: --dim"), "%s", err);
    cr_assert(!strstr(err, "point 2"), "nothing runs after a bad line: %s", err);
    slurp(csv, rows, sizeof rows);
    cr_assert_eq(count_lines(rows), 2, "the header and line 1's row: %s", rows);
    unlink(csv);

    const char *bad[] = { "/nonexistent/points", dir };   /* no file; a directory */
    for (size_t i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s --points %s >/dev/null", build, name, bad[i]);
        cr_assert_eq(run_sh(cmd, err, sizeof err), 2, "--points %s", bad[i]);
        cr_assert_eq(count_lines(err), 1, "%s", err);
    }
    snprintf(cmd, sizeof cmd, "printf '# nothing\\n\\n' | %s/%s --points - >/dev/null", build, name);
    cr_assert_eq(run_sh(cmd, err, sizeof err), 2);
    cr_assert(count_lines(err) == 1 && strstr(err, "no points"), "%s", err);

    /* good lines: the rows and exit code of one process a line (no --bench: the rows are
     * equal byte for byte, on a GPU or without one) */
    const char *lines[] = { "--seqlen 8 --heads 2", "--seqlen 8 --causal --window 4",
                            "--seqlen 8 --dim 128 --dtype e4m3", "--seqlen 8 --backward" };
    char one[600], want[8192];
    snprintf(one, sizeof one, "%s/one.csv", dir);
    f = fopen(path, "w");
    int worst = 0;
    for (size_t i = 0; i < 4; i++) {
        fprintf(f, "%s\n", lines[i]);
        snprintf(cmd, sizeof cmd, "%s/%s %s --csv %s >/dev/null", build, name, lines[i], one);
        const int rc = run_sh(cmd, err, sizeof err);
        if (rc == 1 || (rc == 2 && worst == 0)) worst = rc;
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/%s --points %s --csv %s >/dev/null", build, name, path, csv);
    cr_assert_eq(run_sh(cmd, err, sizeof err), worst, "%s", err);
    for (int i = 1; i <= 4; i++) {
        char said[64];
        snprintf(said, sizeof said, "%s: point %d/4 (line %d): exit ", name, i, i);
        cr_assert(strstr(err, said), "no '%s' in:\n%s", said, err);
    }
    slurp(one, want, sizeof want);
    slurp(csv, rows, sizeof rows);
    cr_assert(count_lines(want) == 5 && !strcmp(want, rows), "rows differ:\n%s---\n%s", want, rows);

    /* --timeout: a run that takes longer ends the program, exit 124 (a FIFO nothing writes to
     * holds --load's open of q.npy) */
    snprintf(path, sizeof path, "%s/stuck", dir);
    cr_assert_eq(mkdir(path, 0777), 0);
    snprintf(path, sizeof path, "%s/stuck/q.npy", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    snprintf(cmd, sizeof cmd, "printf -- '--seqlen 8\\n--load %s/stuck\\n--seqlen 8\\n' | %s/%s --points - "
             "--timeout 1 --csv %s >/dev/null", dir, build, name, csv);
    cr_assert_eq(run_sh(cmd, err, sizeof err), 124, "%s", err);
    cr_assert(strstr(err, "point 2 (line 2): timed out after 1 s") && !strstr(err, "point 3"), "%s", err);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

/* Stage 5's forward counts a block's steps (K_j, Q_i pairs) in an int: a shape with more is
 * refused with one line, before any device query (so on any machine), and one just below is
 * not refused for it. */
Test(cli, a_stage_refuses_more_steps_than_its_counter_holds)
{
    const attn_stage *st = NULL;
    for (int i = 0; i < attn_nstages; i++)
        if (!strcmp(attn_stages[i]->name, "05_tensor_cores")) st = attn_stages[i];
    if (!st) cr_skip_test("05_tensor_cores is not built");
    attn_problem p = test_problem(1, 1, 1, 2200000, 2200000, 128, 0);   /* 17188 x 137500 steps */
    char why[ATTN_WHY_LEN] = "";
    for (int dir = 0; dir <= 1; dir++) {
        cr_assert_eq(st->check(&p, (attn_dir)dir, why), 1);
        cr_assert(strstr(why, "step counter") && !strchr(why, '\n'), "%s", why);
    }
    p.N_q = p.N_k = 2000000;   /* 15625 x 125000 */
    why[0] = 0;
    st->check(&p, ATTN_FORWARD, why);
    cr_assert(!strstr(why, "step counter"), "%s", why);
}
