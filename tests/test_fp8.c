/* tests/test_fp8.c: the e4m3 side of the harness (CPU only): the e4m3 encoding. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "test_util.h"

/* Every code decodes to the value its bits say and encodes back to itself; the finite values
 * increase with the code; NaN, saturation and ties to even. */
Test(fp8, e4m3_codes)
{
    float prev = -1.0f;
    for (int c = 0; c < 128; c++) {
        const float x = attn_e4m3_to_f32((uint8_t)c), y = attn_e4m3_to_f32((uint8_t)(c | 0x80));
        if (c == 0x7F) {
            cr_assert(isnan(x) && isnan(y), "0x7F and 0xFF are NaN");
            continue;
        }
        const int e = c >> 3, m = c & 7;
        const double want = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
        cr_assert(x == (float)want && y == -x, "code 0x%02x: %g, want %g", c, x, want);
        cr_assert(c == 0 || x > prev, "code 0x%02x does not increase", c);
        prev = x;
        cr_assert_eq(attn_f32_to_e4m3(x), c, "0x%02x does not encode back", c);
        cr_assert_eq(attn_f32_to_e4m3(y), c | 0x80, "0x%02x does not encode back", c | 0x80);
    }
    cr_assert_eq(attn_e4m3_to_f32(0x7E), 448.0f);
    cr_assert_eq(attn_e4m3_to_f32(0x01), 0x1p-9f);
    cr_assert_eq(attn_f32_to_e4m3(NAN), 0x7F);
    cr_assert_eq(attn_f32_to_e4m3(-NAN) & 0x7F, 0x7F);
    cr_assert_eq(attn_f32_to_e4m3(INFINITY), 0x7E, "saturates");
    cr_assert_eq(attn_f32_to_e4m3(-INFINITY), 0xFE);
    cr_assert_eq(attn_f32_to_e4m3(1e6f), 0x7E);
    cr_assert_eq(attn_f32_to_e4m3(464.0f), 0x7E);
    /* ties to even: 1 + 1/16 between 1 and 1.125 goes to 1 (mantissa 0), 1 + 3/16 to 1.25 */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.0625f)), 1.0f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.1875f)), 1.25f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.0626f)), 1.125f);
    /* the top binade: 432 between 416 and 448 goes to 448 (mantissa 6) */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(432.0f)), 448.0f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(431.0f)), 416.0f);
    /* subnormals: half the smallest goes to 0, one and a half to 2 steps (even) */
    cr_assert_eq(attn_f32_to_e4m3(0x1p-10f), 0x00);
    cr_assert_eq(attn_f32_to_e4m3(0x1.8p-9f), 0x02);
    cr_assert_eq(attn_f32_to_e4m3(-0x1p-11f), 0x80);
    /* rounding up out of the subnormals and out of a binade */
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(0x1.fp-7f)), 0x1p-6f);
    cr_assert_eq(attn_e4m3_to_f32(attn_f32_to_e4m3(1.97f)), 2.0f);
}

/* The relative error of a rounding is at most 2^-4 in the normal range (3 mantissa bits) and
 * the absolute error at most 2^-10 below it, over a sweep of values. */
Test(fp8, e4m3_rounding_error)
{
    for (double x = 1e-4; x < 448.0; x *= 1.0007) {
        const double y = attn_e4m3_to_f32(attn_f32_to_e4m3((float)x));
        if (x >= 0x1p-6)
            cr_assert(fabs(y - x) <= 0x1p-4 * x, "%g -> %g", x, y);
        else
            cr_assert(fabs(y - x) <= 0x1p-10, "%g -> %g", x, y);
    }
}
