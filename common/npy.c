/* common/npy.c: reading and writing NumPy .npy files (format versions 1.0 to 3.0 read,
 * 1.0 written). bf16 has no NumPy dtype, so every 16-bit tensor is written as '<f4'
 * (bf16 and fp16 values are exactly representable in float32): np.load gives the exact
 * values; a block mask is written as '|u1'. e4m3 inputs are written as the float32 values
 * they were quantized from, with their scales. Reading accepts '<f4' and '<f2' (and '|u1',
 * '|b1' for masks, not for the inputs q, k, v, do), C order only. Any malformed file is an
 * error message naming the file, never a crash. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "harness.h"

#define NPY_MAX_HEADER (1u << 20)
#define NPY_MAX_DIM 8

static const char NPY_MAGIC[6] = { '\x93', 'N', 'U', 'M', 'P', 'Y' };

/* One array of item-byte elements with NumPy type descr ('<f4', '|u1'), v1.0, C order. */
static int npy_write(const char *path, const char *descr, size_t item, const void *data, int ndim,
                     const int64_t *shape, char *err)
{
    char hdr[512];
    size_t numel = 1;
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++) {
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%lld,%s", (long long)shape[i],
                      i + 1 < ndim ? " " : "");
        numel *= (size_t)shape[i];
    }
    if (ndim > 1) n--; /* "(2, 3)" not "(2, 3,)"; a 1-tuple keeps its comma */
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "), }");
    /* pad with spaces and a final newline so magic + version + length + header is a
     * multiple of 64 bytes */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, ATTN_MSG_LEN, "%s: cannot create (%s)", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10];
    memcpy(pre, NPY_MAGIC, 6);
    pre[6] = 1; pre[7] = 0;
    size_t hlen = (size_t)n + pad + 1;
    pre[8] = (unsigned char)(hlen & 0xFF); pre[9] = (unsigned char)(hlen >> 8);
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, item, numel, f) == numel; /* host is little-endian */
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        snprintf(err, ATTN_MSG_LEN, "%s: write failed (%s)", path, strerror(errno));
        return -1;
    }
    return 0;
}

int attn_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                       char *err)
{
    return npy_write(path, "<f4", sizeof(float), data, ndim, shape, err);
}

/* value of key in a header dict: pointer just after "'key':" and spaces, or NULL */
static const char *dict_value(const char *hdr, const char *key)
{
    char k1[32], k2[32];
    snprintf(k1, sizeof k1, "'%s'", key);
    snprintf(k2, sizeof k2, "\"%s\"", key);
    const char *p = strstr(hdr, k1);
    if (!p) p = strstr(hdr, k2);
    if (!p) return NULL;
    p += strlen(k1);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* attn_npy_read_f32; inputs: float32 and float16 only (no mask dtypes) */
static int npy_read(const char *path, int inputs, float **data, int *ndim, int64_t shape[8], char *err)
{
    *data = NULL;
    *ndim = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, ATTN_MSG_LEN, "%s: cannot open (%s)", path, strerror(errno));
        return -1;
    }
    char *hdr = NULL;
    float *out = NULL;
    unsigned char pre[12];
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, NPY_MAGIC, 6) != 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: not a .npy file (bad magic)", path);
        goto fail;
    }
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    } else {
        snprintf(err, ATTN_MSG_LEN, "%s: unsupported .npy version %d.%d", path, pre[6], pre[7]);
        goto fail;
    }
    if (hlen == 0 || hlen > NPY_MAX_HEADER) {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header length %zu", path, hlen);
        goto fail;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) { snprintf(err, ATTN_MSG_LEN, "%s: out of memory", path); goto fail; }
    if (fread(hdr, 1, hlen, f) != hlen) goto truncated;
    hdr[hlen] = 0;
    if (strlen(hdr) != hlen || hdr[0] != '{') {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header", path);
        goto fail;
    }
    /* descr */
    const char *v = dict_value(hdr, "descr");
    if (!v || (*v != '\'' && *v != '"')) {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header (no 'descr')", path);
        goto fail;
    }
    char quote = *v++, descr[16];
    size_t dn = 0;
    while (*v && *v != quote && dn < sizeof descr - 1) descr[dn++] = *v++;
    descr[dn] = 0;
    if (*v != quote) {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header ('descr')", path);
        goto fail;
    }
    int item;
    if (strcmp(descr, "<f4") == 0) item = 4;
    else if (strcmp(descr, "<f2") == 0) item = 2;
    else if (!inputs && (!strcmp(descr, "|u1") || !strcmp(descr, "|b1") || !strcmp(descr, "<u1")))
        item = 1;   /* masks */
    else if (inputs) {
        snprintf(err, ATTN_MSG_LEN, "%s: dtype '%s' not supported for an input (want float32 '<f4' or "
                 "float16 '<f2')", path, descr);
        goto fail;
    } else {
        snprintf(err, ATTN_MSG_LEN, "%s: dtype '%s' not supported (want '<f4', '<f2', or for a mask "
                 "'|u1' or '|b1')", path, descr);
        goto fail;
    }
    /* fortran_order */
    v = dict_value(hdr, "fortran_order");
    if (!v || (strncmp(v, "False", 5) != 0 && strncmp(v, "True", 4) != 0)) {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header (no 'fortran_order')", path);
        goto fail;
    }
    if (strncmp(v, "True", 4) == 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: Fortran-ordered arrays not supported", path);
        goto fail;
    }
    /* shape */
    v = dict_value(hdr, "shape");
    if (!v || *v != '(') {
        snprintf(err, ATTN_MSG_LEN, "%s: bad .npy header (no 'shape')", path);
        goto fail;
    }
    v++;
    size_t numel = 1;
    int nd = 0;
    for (;;) {
        while (*v == ' ') v++;
        if (*v == ')') break;
        if (*v < '0' || *v > '9' || nd == NPY_MAX_DIM) {
            snprintf(err, ATTN_MSG_LEN, "%s: bad .npy shape", path);
            goto fail;
        }
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || x < 0 || x > (1ll << 40)) {
            snprintf(err, ATTN_MSG_LEN, "%s: bad .npy shape", path);
            goto fail;
        }
        if (x > 0 && numel > ((size_t)1 << 40) / (size_t)x) {
            snprintf(err, ATTN_MSG_LEN, "%s: .npy shape too large", path);
            goto fail;
        }
        numel *= (size_t)x;
        shape[nd++] = x;
        v = end;
        while (*v == ' ') v++;
        if (*v == ',') v++;
        else if (*v != ')') {
            snprintf(err, ATTN_MSG_LEN, "%s: bad .npy shape", path);
            goto fail;
        }
    }
    /* the data must be exactly numel items */
    long pos = ftell(f);
    if (pos < 0 || fseek(f, 0, SEEK_END) != 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: cannot seek", path);
        goto fail;
    }
    long endpos = ftell(f);
    if (endpos < pos || (size_t)(endpos - pos) != numel * (size_t)item) {
        if (endpos >= pos && (size_t)(endpos - pos) > numel * (size_t)item)
            snprintf(err, ATTN_MSG_LEN, "%s: %ld bytes of data, the shape needs %zu", path,
                     endpos - pos, numel * (size_t)item);
        else
            snprintf(err, ATTN_MSG_LEN, "%s: truncated (%ld bytes of data, the shape needs %zu)",
                     path, endpos - pos, numel * (size_t)item);
        goto fail;
    }
    fseek(f, pos, SEEK_SET);
    out = malloc(numel * sizeof(float) + 1);
    if (!out) { snprintf(err, ATTN_MSG_LEN, "%s: out of memory", path); goto fail; }
    if (item == 4) {
        if (fread(out, 4, numel, f) != numel) goto truncated;
    } else if (item == 1) {
        for (size_t i = 0; i < numel; i++) {
            const int ch = fgetc(f);
            if (ch == EOF) goto truncated;
            out[i] = (float)ch;
        }
    } else {
        uint16_t *tmp = malloc(numel * 2 + 1);
        if (!tmp) { snprintf(err, ATTN_MSG_LEN, "%s: out of memory", path); goto fail; }
        size_t got = fread(tmp, 2, numel, f);
        for (size_t i = 0; i < got; i++) out[i] = attn_f16_to_f32(tmp[i]);
        free(tmp);
        if (got != numel) goto truncated;
    }
    fclose(f);
    free(hdr);
    *data = out;
    *ndim = nd;
    return 0;
truncated:
    snprintf(err, ATTN_MSG_LEN, "%s: truncated .npy file", path);
fail:
    fclose(f);
    free(hdr);
    free(out);
    return -1;
}

int attn_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[8], char *err)
{
    return npy_read(path, 0, data, ndim, shape, err);
}

static int save16(const char *dir, const char *name, const uint16_t *x, attn_dtype t,
                  const int64_t *shape, char *err)
{
    char path[4096];
    size_t n = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    float *f = attn_host_to_f32(x, n, t);
    if (!f) { snprintf(err, ATTN_MSG_LEN, "%s: out of memory", path); return -1; }
    int rc = attn_npy_write_f32(path, f, 4, shape, err);
    free(f);
    return rc;
}

int attn_save_dir(const char *dir, const attn_host *t, char *err)
{
    const attn_problem *p = &t->p;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, ATTN_MSG_LEN, "%s: cannot create directory (%s)", dir, strerror(errno));
        return -1;
    }
    int64_t sq[4] = { p->B, p->N_q, p->H, p->d }, skv[4] = { p->B, p->N_k, p->H_kv, p->d };
    int64_t sl[3] = { p->B, p->H, p->N_q };
    char path[4096];
    if (p->dtype == ATTN_E4M3) {
        /* the inputs before quantization, which --load quantizes again to the same bytes and
         * scales, and the scales, [B, H_kv] */
        const float *x[6] = { t->q32, t->k32, t->v32, t->q_descale, t->k_descale, t->v_descale };
        static const char *names[6] = { "q", "k", "v", "q_descale", "k_descale", "v_descale" };
        const int64_t ss[2] = { p->B, p->H_kv };
        for (int i = 0; i < 6; i++) {
            snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
            if (attn_npy_write_f32(path, x[i], i < 3 ? 4 : 2, i == 0 ? sq : i < 3 ? skv : ss, err))
                return -1;
        }
    } else if (save16(dir, "q", t->q, p->dtype, sq, err) || save16(dir, "k", t->k, p->dtype, skv, err) ||
               save16(dir, "v", t->v, p->dtype, skv, err)) {
        return -1;
    }
    if (save16(dir, "o", t->o, p->dtype, sq, err)) return -1;
    snprintf(path, sizeof path, "%s/lse.npy", dir);
    if (attn_npy_write_f32(path, t->lse, 3, sl, err)) return -1;
    if (t->backward) {
        if (save16(dir, "do", t->d_o, p->dtype, sq, err) || save16(dir, "dq", t->dq, p->dtype, sq, err) ||
            save16(dir, "dk", t->dk, p->dtype, skv, err) || save16(dir, "dv", t->dv, p->dtype, skv, err))
            return -1;
    }
    /* the block mask the run used, as --block-mask reads it: uint8 [bm_b, bm_h, Tq, Tk] */
    if (p->block_mask && t->block_mask) {
        int64_t sm[4] = { p->bm_b, p->bm_h, attn_mask_tiles_q(p), attn_mask_tiles_k(p) };
        snprintf(path, sizeof path, "%s/block_mask.npy", dir);
        if (npy_write(path, "|u1", 1, t->block_mask, 4, sm, err)) return -1;
    }
    return 0;
}

typedef struct { float *x; int64_t s[8]; char path[4096]; } loaded;

static int load4(const char *dir, const char *name, loaded *l, char *err)
{
    int nd;
    snprintf(l->path, sizeof l->path, "%s/%s.npy", dir, name);
    if (npy_read(l->path, 1, &l->x, &nd, l->s, err)) return -1;
    if (nd != 4) {
        snprintf(err, ATTN_MSG_LEN, "%s: expected a 4-D array [B, N, heads, d], got %d-D", l->path, nd);
        return -1;
    }
    for (int i = 0; i < 4; i++)
        if (l->s[i] < 1 || l->s[i] > 0x7FFFFFFF) {
            snprintf(err, ATTN_MSG_LEN, "%s: dimension %d is %lld, want 1..2^31-1", l->path, i,
                     (long long)l->s[i]);
            return -1;
        }
    return 0;
}

/* l's n values rounded to t into dst; 0, or -1 with err naming the file and the first element
 * that is not finite, or not once rounded (fp16 above 65504) */
static int round_into(uint16_t *dst, const loaded *l, size_t n, attn_dtype t, char *err)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = attn_from_f32(l->x[i], t);
        if (!isfinite(attn_to_f32(dst[i], t))) {
            snprintf(err, ATTN_MSG_LEN, "%s: element %zu is %g, not finite in %s (largest %g): the inputs "
                     "must be finite", l->path, i, l->x[i], attn_dtype_name(t),
                     t == ATTN_FP16 ? 65504.0 : 3.3895313892515355e38);
            return -1;
        }
    }
    return 0;
}

int attn_load_dir(const char *dir, attn_host *t, const attn_problem *p0, int backward, char *err)
{
    loaded q = { 0 }, k = { 0 }, v = { 0 }, d_o = { 0 };
    int rc = -1;
    memset(t, 0, sizeof *t);
    if (load4(dir, "q", &q, err) || load4(dir, "k", &k, err) || load4(dir, "v", &v, err)) goto out;
    if (backward && load4(dir, "do", &d_o, err)) goto out;
    if (k.s[0] != q.s[0] || k.s[3] != q.s[3]) {
        snprintf(err, ATTN_MSG_LEN, "%s: shape [%lld, %lld, %lld, %lld] does not match q's B and d "
                 "[%lld, %lld, %lld, %lld]", k.path, (long long)k.s[0], (long long)k.s[1],
                 (long long)k.s[2], (long long)k.s[3], (long long)q.s[0], (long long)q.s[1],
                 (long long)q.s[2], (long long)q.s[3]);
        goto out;
    }
    if (memcmp(v.s, k.s, sizeof(int64_t) * 4) != 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: shape differs from k's", v.path);
        goto out;
    }
    if (backward && memcmp(d_o.s, q.s, sizeof(int64_t) * 4) != 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: shape differs from q's", d_o.path);
        goto out;
    }
    if (q.s[2] % k.s[2] != 0) {
        snprintf(err, ATTN_MSG_LEN, "%s: %lld query heads is not a multiple of %lld kv heads in %s",
                 q.path, (long long)q.s[2], (long long)k.s[2], k.path);
        goto out;
    }
    attn_problem p = *p0;
    p.B = (int)q.s[0]; p.N_q = (int)q.s[1]; p.H = (int)q.s[2]; p.d = (int)q.s[3];
    p.N_k = (int)k.s[1]; p.H_kv = (int)k.s[2];
    char why[ATTN_MSG_LEN];
    if (attn_problem_validate(&p, why)) {   /* the sizes of the files, as those of the flags */
        snprintf(err, ATTN_MSG_LEN, "%s: %s", dir, why);
        goto out;
    }
    if (attn_host_alloc(t, &p, backward)) {
        snprintf(err, ATTN_MSG_LEN, "%s: out of host memory for the loaded tensors", dir);
        goto out;
    }
    if (p.dtype == ATTN_E4M3) {
        memcpy(t->q32, q.x, attn_numel_q(&p) * sizeof(float));
        memcpy(t->k32, k.x, attn_numel_kv(&p) * sizeof(float));
        memcpy(t->v32, v.x, attn_numel_kv(&p) * sizeof(float));
        if (attn_host_quantize(t, 0, 0, why)) {
            snprintf(err, ATTN_MSG_LEN, "%s: %s", dir, why);
            attn_host_free(t);
            goto out;
        }
    } else if (round_into(t->q, &q, attn_numel_q(&p), p.dtype, err) ||
               round_into(t->k, &k, attn_numel_kv(&p), p.dtype, err) ||
               round_into(t->v, &v, attn_numel_kv(&p), p.dtype, err)) {
        attn_host_free(t);
        goto out;
    }
    if (backward && round_into(t->d_o, &d_o, attn_numel_q(&p), p.dtype, err)) {
        attn_host_free(t);
        goto out;
    }
    rc = 0;
out:
    free(q.x); free(k.x); free(v.x); free(d_o.x);
    return rc;
}
