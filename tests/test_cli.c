/* tests/test_cli.c: flag parsing (in process) and a stage program's exit codes for bad
 * input (a subprocess). Bad input is rejected before any CUDA call, so this runs without
 * a GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
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
}

Test(cli, bad_input_is_exit_2)
{
    const char *bad[] = { "--heads abc", "--heads 0", "--heads -3", "--batch 2x", "--dim 1e3",
                          "--heads 6 --kv-heads 4", "--dtype fp32", "--dtype", "--scale 0",
                          "--scale nan", "--scale x", "--seed -1", "--seqlen 99999999999",
                          "--frobnicate", "positional", "-x", "--window 0", "--window -4",
                          "--window x" };
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
    unsetenv("ATTN_SMEM_PER_BLOCK");
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
    /* without a GPU: one line naming the reason, exit 2 */
    int n;
    char why[ATTN_MSG_LEN];
    if (attn_gpu_available(&n, why) != 0) {
        cr_assert_eq(run_prog("--seqlen 8 --check", &lines, first, sizeof first), 2);
        cr_assert_eq(lines, 1);
        cr_assert(strstr(first, "no CUDA GPU (") != NULL, "%s", first);
    }
}
