/* aarch64 NEON kernels of quant_gemm.c (included there where the compiler targets aarch64).
 *
 * The same codes, scales and per-row int8 activations as the x86 kernels; the codes are stored signed (q = u - off,
 * an int8 for q8 and q4 alike), so the group sums need no -off * sum(xq) correction and come out as the same exact
 * int32 the x86 kernels get. Per panel of NB = 32 columns and group of G = 32 k, eight vectors of 4 columns
 * (quant.pack, layout "neon"):
 *   q8: vector v, quad o < 8 (k = 4o..4o+3), column j, i: byte [v*128 + o*16 + 4j + i] = q[4v + j, 4o + i] (int8)
 *   q4: vector v, quad o < 4, column j, i: byte [v*64 + o*16 + 4j + i] = u[4v + j, 4o + i] | u[4v + j, 16 + 4o + i] << 4
 * then the 32 fp16 scales. One SDOT (int8 x int8 -> int32, four products a lane) per vector, quad and row where the
 * compiler targets +dotprod; on plain ARMv8-A the same sum from widening multiplies and pairwise adds (exact: a pair
 * of products is at most 2 * 127 * 127 < 2^15). The fp32 steps after the int32 sums are the x86 kernels' operations per
 * lane (convert, d * dx, one FMA per group in order, + bias), so the results equal theirs. */
#define X_ELEM signed char

static inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {   /* acc[j] += sum_i w[4j + i] x[4j + i] */
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(x)), hi = vmull_high_s8(w, x);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
#endif
}

static inline int8x16_t quad(const signed char *p) {   /* four activations, repeated in every lane */
    int a;
    memcpy(&a, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(a));
}

static inline __attribute__((always_inline)) void panel_rows(int bits, int R, const signed char *xq, const float *dx,
                       const int *sx, long K, const unsigned char *w, float *y, long N, const float *b) {
    const long Gn = K / G, bb = quant_block_bytes(bits), codes = bb - 2 * NB;
    const uint8x16_t lo4 = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t f[RMAX][8];
    (void)sx;
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 8; v++) f[r][v] = vdupq_n_f32(0.0f);
    for (long g = 0; g < Gn; g++) {
        const unsigned char *blk = w + g * bb;
        for (long l = 0; l < bb; l += 64) __builtin_prefetch(blk + PFD + l, 0, 3);
        for (int v = 0; v < 8; v++) {                 /* one vector of 4 columns at a time: R accumulators live */
            int32x4_t acc[RMAX];
            for (int r = 0; r < R; r++) acc[r] = vdupq_n_s32(0);
            if (bits == 4) {
                for (int o = 0; o < 4; o++) {
                    const uint8x16_t c = vld1q_u8(blk + v * 64 + o * 16);
                    const int8x16_t wl = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(c, lo4)), eight);
                    const int8x16_t wh = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(c, 4)), eight);
                    for (int r = 0; r < R; r++) {
                        const signed char *xr = xq + r * K + g * G + o * 4;
                        acc[r] = dot4(dot4(acc[r], wl, quad(xr)), wh, quad(xr + 16));
                    }
                }
            } else {
                for (int o = 0; o < 8; o++) {
                    const int8x16_t wv = vld1q_s8((const signed char *)blk + v * 128 + o * 16);
                    for (int r = 0; r < R; r++) acc[r] = dot4(acc[r], wv, quad(xq + r * K + g * G + o * 4));
                }
            }
            const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const unsigned short *)(blk + codes) + 4 * v)));
            for (int r = 0; r < R; r++) {
                const float32x4_t s = vdupq_n_f32(dx[r * Gn + g]);
                f[r][v] = vfmaq_f32(f[r][v], vcvtq_f32_s32(acc[r]), vmulq_f32(d, s));
            }
        }
    }
    for (int v = 0; v < 8; v++) {
        const float32x4_t c = b ? vld1q_f32(b + 4 * v) : vdupq_n_f32(0.0f);
        for (int r = 0; r < R; r++) vst1q_f32(y + r * N + 4 * v, vaddq_f32(f[r][v], c));
    }
}

/* The fused layer's helpers with 4-lane partial sums (summation order differs from the x86 ones). */
static void rms_norm(const float *x, const float *w, float *y, long D, float eps) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (long i = 0; i < D; i += 4) { const float32x4_t v = vld1q_f32(x + i); acc = vfmaq_f32(acc, v, v); }
    const float32x4_t inv = vdupq_n_f32(1.0f / sqrtf(vaddvq_f32(acc) / (float)D + eps));
    for (long i = 0; i < D; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), inv)));
}

static void silu_mul(float *g, const float *u, long n) {
    for (long i = 0; i < n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t sg = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), expq(vnegq_f32(x))));
        vst1q_f32(g + i, vmulq_f32(sg, vld1q_f32(u + i)));
    }
}
