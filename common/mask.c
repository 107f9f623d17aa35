/* common/mask.c: block masks, one 0/1 entry per 128 x 128 tile of (query, key) per (batch, head)
 * (attn.h): their size, lookup, visible-pair count, generators and .npy loading. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"

/* (N - 1) / 128 + 1, not (N + 127) / 128: no sum to wrap */
int attn_mask_tiles_q(const attn_problem *p) { return (p->N_q - 1) / ATTN_MASK_TILE + 1; }
int attn_mask_tiles_k(const attn_problem *p) { return (p->N_k - 1) / ATTN_MASK_TILE + 1; }

size_t attn_mask_bytes(const attn_problem *p)
{
    return (size_t)p->bm_b * p->bm_h * attn_mask_tiles_q(p) * attn_mask_tiles_k(p);
}

int attn_mask_at(const attn_problem *p, const unsigned char *mask, int b, int h, int tq, int tk)
{
    const size_t bb = p->bm_b == 1 ? 0 : (size_t)b, hh = p->bm_h == 1 ? 0 : (size_t)h;
    return mask[((bb * p->bm_h + hh) * attn_mask_tiles_q(p) + tq) * attn_mask_tiles_k(p) + tk];
}

/* Per (b, h) as the mask varies. A row's interval [lo, hi) never moves left as i grows, so a
 * tile lies wholly inside the intervals of its rows, or wholly outside them, when its first and
 * last rows say so; only the tiles the interval edges cross are counted row by row. */
double attn_mask_pairs(const attn_problem *p, const unsigned char *mask)
{
    const int Tq = attn_mask_tiles_q(p), Tk = attn_mask_tiles_k(p);
    double total = 0.0;
    for (int bb = 0; bb < p->bm_b; bb++)
        for (int hh = 0; hh < p->bm_h; hh++) {
            double pairs = 0.0;
            for (int tq = 0; tq < Tq; tq++) {
                const int r0 = tq * ATTN_MASK_TILE;
                const int r1 = (r0 + ATTN_MASK_TILE < p->N_q ? r0 + ATTN_MASK_TILE : p->N_q) - 1;
                int lo0, hi0, lo1, hi1;
                attn_visible_keys(p, r0, &lo0, &hi0);
                attn_visible_keys(p, r1, &lo1, &hi1);
                for (int tk = 0; tk < Tk; tk++) {
                    if (!attn_mask_at(p, mask, bb, hh, tq, tk)) continue;
                    const int c0 = tk * ATTN_MASK_TILE;
                    const int c1 = c0 + ATTN_MASK_TILE < p->N_k ? c0 + ATTN_MASK_TILE : p->N_k;
                    if (hi1 <= c0 || lo0 >= c1) continue;                     /* no row sees it */
                    if (lo1 <= c0 && hi0 >= c1) {                             /* every row all */
                        pairs += (double)(r1 - r0 + 1) * (c1 - c0);
                        continue;
                    }
                    for (int i = r0; i <= r1; i++) {
                        int lo, hi;
                        attn_visible_keys(p, i, &lo, &hi);
                        const int a = c0 > lo ? c0 : lo, e = c1 < hi ? c1 : hi;
                        if (e > a) pairs += e - a;
                    }
                }
            }
            /* a broadcast dimension stands for all B (or H) of them */
            total += pairs * (p->bm_b == 1 ? p->B : 1) * (p->bm_h == 1 ? p->H : 1);
        }
    return total;
}

static int set_mask(attn_problem *p, unsigned char **mask, unsigned char *m, int bm_b, int bm_h)
{
    p->block_mask = 1;
    p->bm_b = bm_b;
    p->bm_h = bm_h;
    free(*mask);
    *mask = m;
    p->pairs = attn_mask_pairs(p, m);
    return 0;
}

/* The end of the item of a pattern that starts at s (its comma, or the end of the pattern), and
 * the start of the next item (NULL after the last). */
static const char *item_end(const char *s)
{
    const char *comma = strchr(s, ',');
    return comma ? comma : s + strlen(s);
}
static const char *next_item(const char *s)
{
    const char *e = item_end(s);
    return *e ? e + 1 : NULL;
}

/* The item [s, e), "name:value": its kind, the name's first letter (r, l, g, s), and its value,
 * checked strictly (attn_mask_spec_check). 0 ok. */
static int spec_item(const char *s, const char *e, char *kind, double *value)
{
    static const char *const names[] = { "random", "local", "global", "strided" };
    const char *colon = memchr(s, ':', (size_t)(e - s));
    if (!colon || colon + 1 == e) return -1;
    int k = -1;
    for (int i = 0; i < 4; i++)
        if (strlen(names[i]) == (size_t)(colon - s) && !strncmp(s, names[i], (size_t)(colon - s))) k = i;
    if (k < 0) return -1;
    *kind = names[k][0];
    const char *v = colon + 1;
    if (*kind == 'r') {   /* a density: strtod, from a digit or a point, and no hex */
        char num[64], *end;
        if ((size_t)(e - v) >= sizeof num || !((*v >= '0' && *v <= '9') || *v == '.')) return -1;
        memcpy(num, v, (size_t)(e - v));
        num[e - v] = 0;
        if (strpbrk(num, "xX")) return -1;
        *value = strtod(num, &end);
        return *end || !(*value > 0.0 && *value <= 1.0) ? -1 : 0;
    }
    long long w = 0;      /* a whole number of tokens or tiles: digits only, up to INT_MAX */
    for (; v < e; v++) {
        if (*v < '0' || *v > '9') return -1;
        w = w * 10 + (*v - '0');
        if (w > INT_MAX) return -1;
    }
    *value = (double)w;
    return w >= 1 ? 0 : -1;
}

int attn_mask_spec_check(const char *spec, char *err)
{
    int items = 0, random = 0;
    for (const char *item = spec; item; item = next_item(item)) {
        char kind;
        double v;
        if (spec_item(item, item_end(item), &kind, &v)) {
            items = 0;
            break;
        }
        items++;
        random |= kind == 'r';
    }
    if (items && !(random && items > 1)) return 0;   /* random:D alone */
    snprintf(err, ATTN_MSG_LEN, "--mask %.100s%s: want random:D (0 < D <= 1, alone), or local:W, global:G, "
             "strided:S (whole numbers 1 to %d) joined by commas, no blanks", spec,
             strlen(spec) > 100 ? "..." : "", INT_MAX);
    return -1;
}

int attn_mask_generate(attn_problem *p, unsigned char **mask, const char *spec, uint64_t seed,
                       char *err)
{
    if (attn_mask_spec_check(spec, err)) return -1;
    const int Tq = attn_mask_tiles_q(p), Tk = attn_mask_tiles_k(p);
    const int random = strncmp(spec, "random:", 7) == 0;   /* then the only item */
    const int bm_b = random ? p->B : 1, bm_h = random ? p->H : 1;
    unsigned char *m = calloc((size_t)bm_b * bm_h * Tq * Tk, 1);
    if (!m) { snprintf(err, ATTN_MSG_LEN, "--mask %.100s: out of memory", spec); return -1; }
    attn_rng r;
    attn_rng_init(&r, seed ^ 0x6D61736B6D61736Bull);
    for (const char *item = spec; item; item = next_item(item)) {
        char kind;
        double v;
        (void)spec_item(item, item_end(item), &kind, &v);   /* checked above */
        if (kind == 'r') {
            for (size_t e = 0; e < (size_t)bm_b * bm_h * Tq * Tk; e++) m[e] = attn_rng_uniform(&r) < v;
            continue;
        }
        const long w = (long)v;
        for (int tq = 0; tq < Tq; tq++)
            for (int tk = 0; tk < Tk; tk++) {
                const long dist = labs((long)tq - tk);   /* in tiles */
                int on;
                if (kind == 'l') on = dist * ATTN_MASK_TILE < w;
                else if (kind == 'g') on = (long)tq * ATTN_MASK_TILE < w || (long)tk * ATTN_MASK_TILE < w;
                else on = dist % w == 0;
                m[(size_t)tq * Tk + tk] |= (unsigned char)on;
            }
    }
    return set_mask(p, mask, m, bm_b, bm_h);
}

int attn_mask_load(attn_problem *p, unsigned char **mask, const char *path, char *err)
{
    float *x = NULL;
    int nd = 0;
    int64_t sh[8];
    if (attn_npy_read_f32(path, &x, &nd, sh, err)) return -1;
    const int Tq = attn_mask_tiles_q(p), Tk = attn_mask_tiles_k(p);
    if (nd != 4 || (sh[0] != 1 && sh[0] != p->B) || (sh[1] != 1 && sh[1] != p->H) || sh[2] != Tq ||
        sh[3] != Tk) {
        char got[256] = "";
        for (int i = 0, k = 0; i < nd && k >= 0 && (size_t)k < sizeof got; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i ? ", " : "", (long long)sh[i]);
        snprintf(err, ATTN_MSG_LEN, "%s: a block mask must be [1 or B=%d, 1 or H=%d, %d, %d] (tiles of "
                 "%d), got [%s]", path, p->B, p->H, Tq, Tk, ATTN_MASK_TILE, got);
        free(x);
        return -1;
    }
    const size_t n = (size_t)sh[0] * sh[1] * Tq * Tk;
    unsigned char *m = malloc(n ? n : 1);
    if (!m) { free(x); snprintf(err, ATTN_MSG_LEN, "%s: out of memory", path); return -1; }
    for (size_t e = 0; e < n; e++) {
        if (x[e] != 0.0f && x[e] != 1.0f) {
            snprintf(err, ATTN_MSG_LEN, "%s: entry %zu is %g; a block mask holds 0 or 1", path, e, x[e]);
            free(x); free(m);
            return -1;
        }
        m[e] = x[e] != 0.0f;
    }
    free(x);
    return set_mask(p, mask, m, (int)sh[0], (int)sh[1]);
}
