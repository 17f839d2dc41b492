/* AVX2 + FMA + F16C kernels of quant_gemm.c (included there where the compiler does not target AVX512-VNNI).
 *
 * The same codes, scales and per-row int8 activations as the VNNI kernel; only the layout of a block's codes and
 * the integer instruction differ. Per panel of NB = 32 columns and group of G = 32 k, the codes are k-pair-major
 * in four vectors of 8 columns (quant.pack, layout "avx2"):
 *   q8: pair t (k = 2t, 2t + 1), vector v, column j, i: byte [t*64 + v*16 + 2j + i] = u[8v + j, 2t + i]
 *   q4: quad o < 8 (pairs 2o, 2o + 1), vector v, column j, i: byte [o*64 + v*16 + 2j + i]
 *       = u[8v + j, 4o + i] | u[8v + j, 4o + 2 + i] << 4
 * then the 32 fp16 scales. 16 bytes widen (vpmovzxbw) to 8 columns x 2 k of int16 u, and one vpmaddwd with the
 * row's two int16 activations of that pair gives 8 exact int32 sums of two products (u <= 255, |xq| <= 127:
 * never saturates, unlike vpmaddubsw). The group's int32 sums are exact, so they equal the VNNI kernel's, and
 * the fp32 steps after them are the same operations per lane: the AVX2 and VNNI kernels give equal results.
 * Activations are stored as int16 (X_ELEM) so a pair is one 32-bit broadcast. */
#define X_ELEM short

static inline __attribute__((always_inline)) void panel_rows(int bits, int R, const short *xq, const float *dx, const int *sx, long K,
                       const unsigned char *w, float *y, long N, const float *b) {
    const long Gn = K / G, bb = quant_block_bytes(bits), codes = bb - 2 * NB;
    const int off = bits == 4 ? 8 : 128;
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    __m256 f[RMAX][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) f[r][v] = _mm256_setzero_ps();
    for (long g = 0; g < Gn; g++) {
        const unsigned char *blk = w + g * bb;
        for (long l = 0; l < bb; l += 64) _mm_prefetch((const char *)blk + PFD + l, _MM_HINT_T0);
        for (int v = 0; v < 4; v++) {                 /* one vector of 8 columns at a time: R accumulators live */
            __m256i acc[RMAX];
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_si256();
            if (bits == 4) {
                for (int o = 0; o < 8; o++) {
                    const __m128i c = _mm_loadu_si128((const __m128i *)(blk + o * 64 + v * 16));
                    const __m256i wl = _mm256_cvtepu8_epi16(_mm_and_si128(c, lo4));
                    const __m256i wh = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(c, 4), lo4));
                    for (int r = 0; r < R; r++) {
                        const int *xp = (const int *)(xq + r * K + g * G + o * 4);
                        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wl, _mm256_set1_epi32(xp[0])));
                        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wh, _mm256_set1_epi32(xp[1])));
                    }
                }
            } else {
                for (int t = 0; t < 16; t++) {
                    const __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + t * 64 + v * 16)));
                    for (int r = 0; r < R; r++) {
                        const int xp = *(const int *)(xq + r * K + g * G + 2 * t);
                        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wv, _mm256_set1_epi32(xp)));
                    }
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + codes + 16 * v)));
            for (int r = 0; r < R; r++) {
                const __m256i corr = _mm256_set1_epi32(-off * sx[r * Gn + g]);
                const __m256 s = _mm256_set1_ps(dx[r * Gn + g]);
                f[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(acc[r], corr)), _mm256_mul_ps(d, s), f[r][v]);
            }
        }
    }
    for (int v = 0; v < 4; v++) {
        const __m256 c = b ? _mm256_loadu_ps(b + 8 * v) : _mm256_setzero_ps();
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * N + 8 * v, _mm256_add_ps(f[r][v], c));
    }
}

/* The fused layer's helpers with 8-lane partial sums (summation order differs from the AVX-512 ones). */
static void rms_norm(const float *x, const float *w, float *y, long D, float eps) {
    __m256 acc = _mm256_setzero_ps();
    for (long i = 0; i < D; i += 8) { __m256 v = _mm256_loadu_ps(x + i); acc = _mm256_fmadd_ps(v, v, acc); }
    const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum256(acc) / (float)D + eps));
    for (long i = 0; i < D; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), inv)));
}

static void silu_mul(float *g, const float *u, long n) {
    for (long i = 0; i < n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 sg = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
}
