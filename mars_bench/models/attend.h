/* Helpers shared by the CPU kernels (panel_gemm.c, quant_gemm.c); AVX-512F, else AVX2 + FMA (8 lanes, the same
 * arithmetic in a different summation order). panel.build hashes this file with each source, so a change here
 * rebuilds both libraries. */
#ifndef MARS_ATTEND_H
#define MARS_ATTEND_H
#include <immintrin.h>
#include <math.h>
#if defined(__AVX2__) && defined(__FMA__)   /* 8-lane helpers, also for AVX2 kernels built beside AVX-512F */

static inline float hsum256(__m256 v) {            /* fixed order: halves, then pairs, then the last two */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline __m256 exp256(__m256 x) {            /* exp512's Cephes expf; 2^n built in the exponent bits */
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));   /* n in [-126, 127]: 2^n is a normal float */
}
#endif

#ifdef __AVX512F__

static inline __m512 exp512(__m512 x) {            /* Cephes expf: |rel err| < 2e-7 on [-87, 88] */
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* One query row q [hd] against the cached rows keys[0 .. n) of one head (row c at kc + keys[c] * hd, likewise
 * vc): softmax(scale q k^T) v into out [hd]. s: scratch for n floats (+ 16). Fixed order: 16-lane partial
 * sums reduced by _mm512_reduce_add_ps, keys in the order given. hd a multiple of 16. */
static inline void attend(const float *q, const float *kc, const float *vc, int hd, const int *keys, int n,
                   float scale, float *s, float *out) {
    float mx = -INFINITY;
    for (int c = 0; c < n; c++) {
        const float *kr = kc + (long)keys[c] * hd;
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < hd; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(kr + i), acc);
        s[c] = _mm512_reduce_add_ps(acc) * scale;
        mx = fmaxf(mx, s[c]);
    }
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        const __mmask16 m = n - c >= 16 ? 0xFFFF : (__mmask16)((1u << (n - c)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + c), _mm512_set1_ps(mx)));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(s + c, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    const float inv = 1.0f / _mm512_reduce_add_ps(sum);
    for (int i = 0; i < hd; i += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < n; c++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(s[c]), _mm512_loadu_ps(vc + (long)keys[c] * hd + i), acc);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
    }
}

#elif defined(__AVX2__) && defined(__FMA__)

/* attend() of the AVX-512 branch with 8-lane partial sums reduced by hsum256. hd a multiple of 8. */
static inline void attend(const float *q, const float *kc, const float *vc, int hd, const int *keys, int n,
                   float scale, float *s, float *out) {
    float mx = -INFINITY;
    for (int c = 0; c < n; c++) {
        const float *kr = kc + (long)keys[c] * hd;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kr + i), acc);
        s[c] = hsum256(acc) * scale;
        mx = fmaxf(mx, s[c]);
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 sum = _mm256_setzero_ps();
    for (int c = 0; c < n; c += 8) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - c), lane);
        __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(s + c, m), _mm256_set1_ps(mx)));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(s + c, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    const float inv = 1.0f / hsum256(sum);
    for (int i = 0; i < hd; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < n; c++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(s[c]), _mm256_loadu_ps(vc + (long)keys[c] * hd + i), acc);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
    }
}

#endif
#endif
