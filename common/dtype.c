/* common/dtype.c: host conversions between float32 and the two 16-bit dtypes (round to
 * nearest even, like __float2bfloat16_rn / __float2half_rn) and e4m3 (like
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE), and the input PRNG. */
#include <math.h>
#include <string.h>
#include "harness.h"

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float attn_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t attn_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)               /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* add half an ulp of bf16 minus one, plus the lowest kept bit: ties go to even */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float attn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {                                        /* zero or subnormal: m * 2^-24 */
        float x = ldexpf((float)m, -24);
        return sign ? -x : x;
    }
    if (e == 31)                                         /* inf or NaN */
        return bits_f32(sign | 0x7F800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13)); /* rebias 15 -> 127 */
}

uint16_t attn_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u;          /* NaN */
    if (a >= 0x477FF000u) return sign | 0x7C00u;         /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                               /* below 2^-14: subnormal */
        if (a < 0x33000000u) return sign;                /* below 2^-25: rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e;                       /* result = m * 2^(e-150) / 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - (112u << 23);                       /* rebias 127 -> 15 */
    r = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
    return (uint16_t)(sign | r);
}

/* e4m3 (OCP FP8 E4M3, CUDA's __nv_fp8_e4m3): sign, 4 exponent bits of bias 7, 3 mantissa bits;
 * no infinities, S.1111.111 is NaN, so the largest finite value is S.1111.110 = 1.75 * 2^8 = 448.
 * Exponent field 0 holds the subnormals m * 2^-9 (m = 0..7). */
float attn_e4m3_to_f32(uint8_t x)
{
    const int e = (x >> 3) & 0xF, m = x & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);             /* (1 + m/8) * 2^(e-7) */
    return x & 0x80u ? -v : v;
}

uint8_t attn_f32_to_e4m3(float f)
{
    const uint8_t sign = (uint8_t)((f32_bits(f) >> 24) & 0x80u);
    const float a = fabsf(f);
    if (isnan(a)) return sign | 0x7F;
    if (a >= 448.0f) return sign | 0x7E;                 /* saturate, infinities too */
    /* a in [2^e, 2^(e+1)), or e = -6 for the subnormals: the step there is 2^(e-3), so
     * a / 2^(e-3) (exact: a power of two) rounded to an integer (rintf: nearest even) is the
     * value in steps, 8..16 in a normal binade (16: rounded up into the next one), 0..8 below */
    int e = -6;
    if (a >= 0x1p-6f) {
        frexpf(a, &e);
        e -= 1;
    }
    int n = (int)rintf(ldexpf(a, 3 - e));
    if (n < 8) return sign | (uint8_t)n;                 /* subnormal (or zero) */
    if (n == 16) { n = 8; e++; }                         /* a < 448: e stays <= 8 */
    return sign | (uint8_t)((e + 7) << 3) | (uint8_t)(n - 8);
}

/* 16-bit tensors: fp16, or bf16 (that of bf16 problems, and e4m3's O) */
float attn_to_f32(uint16_t h, attn_dtype t)
{
    return t == ATTN_FP16 ? attn_f16_to_f32(h) : attn_bf16_to_f32(h);
}

uint16_t attn_from_f32(float f, attn_dtype t)
{
    return t == ATTN_FP16 ? attn_f32_to_f16(f) : attn_f32_to_bf16(f);
}

double attn_unit_roundoff(attn_dtype t)
{
    return ldexp(1.0, t == ATTN_FP16 ? -11 : t == ATTN_E4M3 ? -4 : -8);
}

size_t attn_input_bytes(attn_dtype t) { return t == ATTN_E4M3 ? 1 : 2; }

const char *attn_dtype_name(attn_dtype t)
{
    return t == ATTN_FP16 ? "fp16" : t == ATTN_E4M3 ? "e4m3" : "bf16";
}

int attn_dtype_parse(const char *s, attn_dtype *t)
{
    if (strcmp(s, "bf16") == 0) { *t = ATTN_BF16; return 0; }
    if (strcmp(s, "fp16") == 0) { *t = ATTN_FP16; return 0; }
    if (strcmp(s, "e4m3") == 0) { *t = ATTN_E4M3; return 0; }
    return -1;
}

/* splitmix64 (Steele, Lea, Flood 2014): a tiny generator with a 64-bit state. */
void attn_rng_init(attn_rng *r, uint64_t seed) { r->s = seed; r->has_spare = 0; r->spare = 0; }

uint64_t attn_rng_u64(attn_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double attn_rng_uniform(attn_rng *r)
{
    /* 53 random bits, shifted by half a step so the result is never 0 or 1 */
    return ((double)(attn_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double attn_rng_normal(attn_rng *r)
{
    if (r->has_spare) { r->has_spare = 0; return r->spare; }
    const double two_pi = 6.283185307179586;
    double u1 = attn_rng_uniform(r), u2 = attn_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    r->spare = rad * sin(two_pi * u2);
    r->has_spare = 1;
    return rad * cos(two_pi * u2);
}
