/* tests/test_npy.c: .npy round trips and malformed files (CPU only). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test_util.h"

static char dir[256];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/attn_npy_test_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

TestSuite(npy, .init = make_dir, .fini = remove_dir);

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* a v1.0 file with the given header dict and raw data */
static void write_npy(const char *path, const char *dict, const void *data, size_t n)
{
    char hdr[256];
    size_t len = strlen(dict);
    size_t total = 10 + len + 1, pad = (64 - total % 64) % 64;
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)((len + pad + 1) & 0xFF); hdr[9] = (char)((len + pad + 1) >> 8);
    memcpy(hdr + 10, dict, len);
    memset(hdr + 10 + len, ' ', pad);
    hdr[10 + len + pad] = '\n';
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite(hdr, 1, 10 + len + pad + 1, f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

Test(npy, round_trip_f32)
{
    char path[300], err[ATTN_MSG_LEN];
    snprintf(path, sizeof path, "%s/a.npy", dir);
    float x[2 * 3 * 4 * 5];
    for (int i = 0; i < 120; i++) x[i] = (float)i * 0.25f - 7.0f;
    int64_t shape[4] = { 2, 3, 4, 5 };
    cr_assert_eq(attn_npy_write_f32(path, x, 4, shape, err), 0, "%s", err);
    float *y;
    int nd;
    int64_t s[8];
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), 0, "%s", err);
    cr_assert_eq(nd, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(s[i], shape[i]);
    cr_assert_eq(memcmp(x, y, sizeof x), 0);
    free(y);
    /* header is padded to 64 bytes and parses as NumPy writes it */
    FILE *f = fopen(path, "rb");
    char h[128] = { 0 };
    cr_assert_eq(fread(h, 1, 128, f), 128);
    fclose(f);
    cr_assert_eq((10 + (unsigned char)h[8] + 256 * (unsigned char)h[9]) % 64, 0);
    cr_assert(strstr(h + 10, "'shape': (2, 3, 4, 5)") != NULL, "%s", h + 10);
    /* 1-D shape keeps its comma */
    int64_t one[1] = { 3 };
    cr_assert_eq(attn_npy_write_f32(path, x, 1, one, err), 0);
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), 0, "%s", err);
    cr_assert(nd == 1 && s[0] == 3);
    free(y);
}

Test(npy, reads_f2)
{
    char path[300], err[ATTN_MSG_LEN];
    snprintf(path, sizeof path, "%s/h.npy", dir);
    uint16_t h[6] = { 0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x0000 };
    write_npy(path, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", h, sizeof h);
    float *y;
    int nd;
    int64_t s[8];
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), 0, "%s", err);
    cr_assert(nd == 2 && s[0] == 2 && s[1] == 3);
    cr_assert(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0.5f && y[3] == 0x1p-24f && y[4] == 65504.0f);
    free(y);
}

static void expect_reject(const char *path, const char *what)
{
    char err[ATTN_MSG_LEN] = { 0 };
    float *y = (float *)1;
    int nd;
    int64_t s[8];
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), -1, "%s accepted", what);
    cr_assert_null(y);
    cr_assert(strstr(err, path) != NULL, "error names the file: %s", err);
    cr_assert(strchr(err, '\n') == NULL, "one line: %s", err);
}

Test(npy, malformed_rejected)
{
    char path[300];
    snprintf(path, sizeof path, "%s/bad.npy", dir);
    float data[6] = { 0 };
    write_bytes(path, "NOTNUMPY........", 16);
    expect_reject(path, "bad magic");
    write_bytes(path, "", 0);
    expect_reject(path, "empty file");
    write_bytes(path, "\x93NUMPY\x01\x00\xff", 9);
    expect_reject(path, "truncated length");
    write_bytes(path, "\x93NUMPY\x01\x00\x40\x00{'descr'", 17);
    expect_reject(path, "truncated header");
    write_bytes(path, "\x93NUMPY\x09\x00\x10\x00{}              ", 26);
    expect_reject(path, "unknown version");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, 20);
    expect_reject(path, "truncated data");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, 0);
    expect_reject(path, "no data");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", data, 24);
    expect_reject(path, "too much data");
    write_npy(path, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", data, 24);
    expect_reject(path, "wrong dtype f8");
    write_npy(path, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", data, 24);
    expect_reject(path, "big endian");
    write_npy(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data, 24);
    expect_reject(path, "Fortran order");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", data, 24);
    expect_reject(path, "negative dim");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", data, 24);
    expect_reject(path, "garbage shape");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", data, 24);
    expect_reject(path, "huge shape");
    write_npy(path, "{'descr': '<f4', 'fortran_order': False }", data, 24);
    expect_reject(path, "no shape");
    write_npy(path, "{'descr': '<f4, 'fortran_order': False, 'shape': (6,), }", data, 24);
    expect_reject(path, "unterminated descr");
    snprintf(path, sizeof path, "%s/missing.npy", dir);
    expect_reject(path, "missing file");
    /* random garbage after a valid magic never crashes */
    snprintf(path, sizeof path, "%s/bad.npy", dir);
    attn_rng g;
    attn_rng_init(&g, 5);
    for (int trial = 0; trial < 200; trial++) {
        unsigned char b[300];
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        size_t n = 8 + attn_rng_u64(&g) % 290;
        for (size_t i = 8; i < n; i++) b[i] = (unsigned char)attn_rng_u64(&g);
        write_bytes(path, b, n);
        char err[ATTN_MSG_LEN];
        float *y;
        int nd;
        int64_t s[8];
        if (attn_npy_read_f32(path, &y, &nd, s, err) == 0) free(y);
    }
}

Test(npy, save_and_load_dir)
{
    attn_problem p = test_problem(2, 4, 2, 5, 7, 8, 1);
    p.dtype = ATTN_FP16;
    attn_host t, u;
    cr_assert_eq(attn_host_alloc(&t, &p, 1), 0);
    attn_host_fill(&t, 3, ATTN_INPUT_NORMAL);
    for (size_t i = 0; i < attn_numel_lse(&p); i++) t.lse[i] = (float)i;
    char err[ATTN_MSG_LEN];
    cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
    attn_problem p2 = test_problem(1, 1, 1, 1, 1, 64, 1);
    p2.dtype = ATTN_FP16;
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 1, err), 0, "%s", err);
    cr_assert(u.p.B == 2 && u.p.H == 4 && u.p.H_kv == 2 && u.p.N_q == 5 && u.p.N_k == 7 && u.p.d == 8);
    cr_assert_eq(memcmp(t.q, u.q, attn_numel_q(&p) * 2), 0);
    cr_assert_eq(memcmp(t.k, u.k, attn_numel_kv(&p) * 2), 0);
    cr_assert_eq(memcmp(t.v, u.v, attn_numel_kv(&p) * 2), 0);
    cr_assert_eq(memcmp(t.d_o, u.d_o, attn_numel_q(&p) * 2), 0);
    attn_host_free(&u);

    /* shapes must agree: k with another batch, v unlike k, heads not a multiple */
    char path[300];
    float x[2 * 7 * 3 * 8] = { 0 };
    int64_t bad_b[4] = { 1, 7, 2, 8 }, bad_v[4] = { 2, 6, 2, 8 }, bad_h[4] = { 2, 7, 3, 8 };
    snprintf(path, sizeof path, "%s/k.npy", dir);
    cr_assert_eq(attn_npy_write_f32(path, x, 4, bad_b, err), 0);
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), -1);
    cr_assert(strstr(err, "k.npy") != NULL, "%s", err);
    cr_assert_eq(attn_npy_write_f32(path, x, 4, bad_v, err), 0);
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), -1);
    cr_assert(strstr(err, "v.npy") != NULL, "%s", err);
    cr_assert_eq(attn_npy_write_f32(path, x, 4, bad_h, err), 0);
    snprintf(path, sizeof path, "%s/v.npy", dir);
    cr_assert_eq(attn_npy_write_f32(path, x, 4, bad_h, err), 0);
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), -1);
    cr_assert(strstr(err, "multiple") != NULL, "%s", err);
    /* wrong rank */
    int64_t three[3] = { 2, 7, 24 };
    cr_assert_eq(attn_npy_write_f32(path, x, 3, three, err), 0);
    snprintf(path, sizeof path, "%s/k.npy", dir);
    cr_assert_eq(attn_npy_write_f32(path, x, 3, three, err), 0);
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), -1);
    cr_assert(strstr(err, "4-D") != NULL, "%s", err);
    attn_host_free(&t);
}

/* --load: q, k, v and do are float32 or float16 (a mask's uint8 and bool are not inputs), and their
 * values finite, also once rounded to the dtype (fp16's largest is 65504): else one line naming
 * the file and the element. */
Test(npy, load_wants_finite_float_inputs)
{
    char path[300], err[ATTN_MSG_LEN];
    int64_t sq[4] = { 1, 3, 2, 4 }, skv[4] = { 1, 5, 1, 4 };
    float q[24], kv[20];
    for (int i = 0; i < 24; i++) q[i] = 0.25f * (float)(i - 12);
    for (int i = 0; i < 20; i++) kv[i] = 0.5f * (float)(10 - i);
    static const char *names[4] = { "q", "k", "v", "do" };
    const float *data[4] = { q, kv, kv, q };
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
        cr_assert_eq(attn_npy_write_f32(path, data[i], 4, i == 1 || i == 2 ? skv : sq, err), 0, "%s", err);
    }
    attn_problem p = test_problem(1, 1, 1, 1, 1, 64, 0);
    attn_host u;
    for (int t = 0; t < 2; t++) {
        p.dtype = t ? ATTN_FP16 : ATTN_BF16;
        cr_assert_eq(attn_load_dir(dir, &u, &p, 1, err), 0, "%s", err);
        attn_host_free(&u);
    }
    /* uint8 and bool files are masks, not inputs */
    const unsigned char bytes[24] = { 1 };
    const char *descr[] = { "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 3, 2, 4), }",
                            "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 3, 2, 4), }" };
    snprintf(path, sizeof path, "%s/q.npy", dir);
    for (int i = 0; i < 2; i++) {
        write_npy(path, descr[i], bytes, sizeof bytes);
        err[0] = 0;
        cr_assert_eq(attn_load_dir(dir, &u, &p, 0, err), -1, "%s accepted as q", descr[i]);
        cr_assert(strstr(err, "q.npy") && strstr(err, "dtype") && !strchr(err, '\n'), "%s", err);
    }
    cr_assert_eq(attn_npy_write_f32(path, q, 4, sq, err), 0, "%s", err);
    /* values that are not finite, or not once rounded */
    static const struct { const char *name; int at; float x; attn_dtype t; int ok; } cases[] = {
        { "q", 3, NAN, ATTN_BF16, 0 }, { "k", 5, INFINITY, ATTN_FP16, 0 }, { "v", 0, -INFINITY, ATTN_BF16, 0 },
        { "do", 7, NAN, ATTN_FP16, 0 }, { "k", 2, 70000.0f, ATTN_FP16, 0 }, { "v", 4, -65520.0f, ATTN_FP16, 0 },
        { "k", 2, 65519.0f, ATTN_FP16, 1 }, { "k", 2, 70000.0f, ATTN_BF16, 1 }, { "q", 1, 3.4e38f, ATTN_BF16, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int is_q = cases[c].name[0] == 'q' || cases[c].name[0] == 'd';
        float x[24];
        memcpy(x, is_q ? q : kv, is_q ? sizeof q : sizeof kv);
        x[cases[c].at] = cases[c].x;
        snprintf(path, sizeof path, "%s/%s.npy", dir, cases[c].name);
        cr_assert_eq(attn_npy_write_f32(path, x, 4, is_q ? sq : skv, err), 0, "%s", err);
        p.dtype = cases[c].t;
        err[0] = 0;
        const int rc = attn_load_dir(dir, &u, &p, 1, err);
        if (rc == 0) attn_host_free(&u);
        char at[32];
        snprintf(at, sizeof at, "element %d", cases[c].at);
        if (cases[c].ok)
            cr_assert_eq(rc, 0, "case %zu: %s", c, err);
        else
            cr_assert(rc == -1 && strstr(err, path) && strstr(err, at) && !strchr(err, '\n'),
                      "case %zu: %g at %d of %s: rc %d, '%s'", c, cases[c].x, cases[c].at, path, rc, err);
        cr_assert_eq(attn_npy_write_f32(path, is_q ? q : kv, 4, is_q ? sq : skv, err), 0, "%s", err);
    }
}

/* A block mask from .npy: uint8 and bool, [1 or B, 1 or H, Tq, Tk] for the problem's sizes;
 * a wrong shape or an entry other than 0 and 1 is one line naming the file. */
Test(npy, block_mask_files)
{
    char path[300], err[ATTN_MSG_LEN];
    snprintf(path, sizeof path, "%s/m.npy", dir);
    attn_problem p = test_problem(2, 4, 4, 300, 200, 16, 0);   /* tiles: 3 x 2 */
    unsigned char *m = NULL;
    const unsigned char ones[1 * 4 * 3 * 2] = { 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1,
                                                1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0 };
    write_npy(path, "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 4, 3, 2), }", ones, sizeof ones);
    cr_assert_eq(attn_mask_load(&p, &m, path, err), 0, "%s", err);
    cr_assert(p.block_mask && p.bm_b == 1 && p.bm_h == 4);
    cr_assert(attn_mask_at(&p, m, 1, 0, 0, 1) == 0 && attn_mask_at(&p, m, 1, 3, 2, 1) == 0 &&
              attn_mask_at(&p, m, 0, 3, 2, 0) == 1, "broadcast over the batch, one mask a head");
    write_npy(path, "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 1, 3, 2), }", ones, 6);
    cr_assert_eq(attn_mask_load(&p, &m, path, err), 0, "%s", err);
    cr_assert(p.bm_b == 1 && p.bm_h == 1);
    free(m);
    m = NULL;
    const char *bad[] = { "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 2, 2), }",
                          "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 1, 3, 2), }",
                          "{'descr': '|u1', 'fortran_order': False, 'shape': (6,), }" };
    const char *got[] = { "got [1, 1, 2, 2]", "got [3, 1, 3, 2]", "got [6]" };
    const size_t bytes[] = { 4, 18, 6 };
    for (int k = 0; k < 3; k++) {
        write_npy(path, bad[k], ones, bytes[k]);
        err[0] = 0;
        cr_assert_eq(attn_mask_load(&p, &m, path, err), -1, "shape %d accepted", k);
        cr_assert(strstr(err, path) && !strchr(err, '\n'), "%s", err);
        cr_assert(strstr(err, got[k]), "the message names the shape it got, %s: %s", got[k], err);
    }
    const unsigned char two[6] = { 1, 0, 2, 1, 1, 1 };
    write_npy(path, "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 3, 2), }", two, 6);
    cr_assert_eq(attn_mask_load(&p, &m, path, err), -1, "an entry of 2 accepted");
    cr_assert(strstr(err, "0 or 1") != NULL, "%s", err);
    cr_assert_null(m);
}

/* --save writes the block mask the run used, as --block-mask reads it: block_mask.npy, '|u1',
 * [bm_b, bm_h, Tq, Tk] (per (batch, head) for random:D, broadcast [1, 1, ...] for local:W);
 * read back, the same bytes and the same visible pairs. Without a mask, no such file. */
Test(npy, save_writes_the_block_mask)
{
    char path[300], err[ATTN_MSG_LEN];
    snprintf(path, sizeof path, "%s/block_mask.npy", dir);
    attn_problem p = test_problem(2, 3, 3, 300, 200, 16, 1);   /* tiles: 3 x 2 */
    attn_host t;
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    attn_host_fill(&t, 3, ATTN_INPUT_NORMAL);
    cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
    cr_assert_neq(access(path, F_OK), 0, "a run without a mask wrote %s", path);

    const char *specs[] = { "random:0.5", "local:128" };
    const char *shapes[] = { "'shape': (2, 3, 3, 2)", "'shape': (1, 1, 3, 2)" };
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(attn_mask_generate(&t.p, &t.block_mask, specs[s], 7, err), 0, "%s", err);
        cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s: no %s", specs[s], path);
        char h[129] = { 0 };
        cr_assert_eq(fread(h, 1, 128, f), 128);
        fclose(f);
        cr_assert(strstr(h + 10, "'descr': '|u1'") && strstr(h + 10, shapes[s]), "%s: header %s", specs[s], h + 10);
        attn_problem q = p;
        unsigned char *m = NULL;
        cr_assert_eq(attn_mask_load(&q, &m, path, err), 0, "%s", err);
        cr_assert(q.bm_b == t.p.bm_b && q.bm_h == t.p.bm_h, "%s: extents", specs[s]);
        cr_assert_eq(memcmp(m, t.block_mask, attn_mask_bytes(&q)), 0, "%s: the entries differ", specs[s]);
        cr_assert_float_eq(q.pairs, t.p.pairs, 1e-9, "%s: visible pairs %g, want %g", specs[s], q.pairs, t.p.pairs);
        free(m);
    }
    attn_host_free(&t);
}

/* e4m3: --save writes the inputs as drawn (before quantization) and the scales, [B, H_kv];
 * --load quantizes them again to the same bytes and scales. */
Test(npy, save_and_load_e4m3)
{
    attn_problem p = test_problem(2, 4, 2, 5, 7, 16, 0);
    p.dtype = ATTN_E4M3;
    attn_host t, u;
    char err[ATTN_MSG_LEN], path[300];
    cr_assert_eq(attn_host_alloc(&t, &p, 0), 0);
    attn_host_fill(&t, 4, ATTN_INPUT_NORMAL);
    for (size_t i = 0; i < attn_numel_lse(&p); i++) t.lse[i] = (float)i;
    cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
    float *y;
    int nd;
    int64_t s[8];
    snprintf(path, sizeof path, "%s/k_descale.npy", dir);
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), 0, "%s", err);
    cr_assert(nd == 2 && s[0] == 2 && s[1] == 2);
    cr_assert_eq(memcmp(y, t.k_descale, 4 * sizeof(float)), 0);
    free(y);
    snprintf(path, sizeof path, "%s/q.npy", dir);
    cr_assert_eq(attn_npy_read_f32(path, &y, &nd, s, err), 0, "%s", err);
    cr_assert_eq(memcmp(y, t.q32, attn_numel_q(&p) * sizeof(float)), 0, "q.npy: the values before quantization");
    free(y);
    attn_problem p2 = test_problem(1, 1, 1, 1, 1, 64, 0);
    p2.dtype = ATTN_E4M3;
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), 0, "%s", err);
    cr_assert(u.p.B == 2 && u.p.H == 4 && u.p.H_kv == 2 && u.p.N_q == 5 && u.p.N_k == 7 && u.p.d == 16);
    cr_assert_eq(memcmp(t.q8, u.q8, attn_numel_q(&p)), 0);
    cr_assert_eq(memcmp(t.k8, u.k8, attn_numel_kv(&p)), 0);
    cr_assert_eq(memcmp(t.v8, u.v8, attn_numel_kv(&p)), 0);
    cr_assert_eq(memcmp(t.q_descale, u.q_descale, 4 * sizeof(float)), 0);
    cr_assert_eq(memcmp(t.v_descale, u.v_descale, 4 * sizeof(float)), 0);
    attn_host_free(&u);
    /* a value that is not finite: refused, one line naming the directory */
    t.k32[3] = NAN;
    cr_assert_eq(attn_save_dir(dir, &t, err), 0, "%s", err);
    cr_assert_eq(attn_load_dir(dir, &u, &p2, 0, err), -1);
    cr_assert(strstr(err, dir) && strstr(err, "finite") && !strchr(err, '\n'), "%s", err);
    attn_host_free(&t);
}
