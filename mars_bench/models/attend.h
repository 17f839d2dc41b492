/* Helpers shared by the CPU kernels (panel_gemm.c, quant_gemm.c); AVX-512F, else AVX2 + FMA (8 lanes, the same
 * arithmetic in a different summation order), or aarch64 NEON (four 4-lane partial sums). panel.build hashes this
 * file with each source, so a change here rebuilds both libraries. */
#ifndef MARS_ATTEND_H
#define MARS_ATTEND_H
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
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

#elif defined(__aarch64__)

static inline float32x4_t expq(float32x4_t x) {   /* exp512's Cephes expf; 2^n built in the exponent bits */
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504089f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));   /* n in [-126, 127]: 2^n is a normal float */
}

/* attend() of the AVX-512 branch with four 4-lane partial sums over q . k (16 lanes, as there), reduced in a fixed
 * order by vaddvq_f32; 4-lane sums elsewhere. hd a multiple of 16. */
static inline void attend(const float *q, const float *kc, const float *vc, int hd, const int *keys, int n,
                   float scale, float *s, float *out) {
    float mx = -INFINITY;
    for (int c = 0; c < n; c++) {
        const float *kr = kc + (long)keys[c] * hd;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < hd; i += 16) {
            a0 = vfmaq_f32(a0, vld1q_f32(q + i), vld1q_f32(kr + i));
            a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), vld1q_f32(kr + i + 4));
            a2 = vfmaq_f32(a2, vld1q_f32(q + i + 8), vld1q_f32(kr + i + 8));
            a3 = vfmaq_f32(a3, vld1q_f32(q + i + 12), vld1q_f32(kr + i + 12));
        }
        s[c] = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3))) * scale;
        mx = fmaxf(mx, s[c]);
    }
    const int32x4_t lane = {0, 1, 2, 3};
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int c = 0; c < n; c += 4) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int m = n - c < 4 ? n - c : 4;
        for (int j = 0; j < m; j++) t[j] = s[c + j];
        const uint32x4_t keep = vcltq_s32(lane, vdupq_n_s32(m));
        const float32x4_t e = vreinterpretq_f32_u32(vandq_u32(
            vreinterpretq_u32_f32(expq(vsubq_f32(vld1q_f32(t), vdupq_n_f32(mx)))), keep));
        vst1q_f32(t, e);
        for (int j = 0; j < m; j++) s[c + j] = t[j];
        sum = vaddq_f32(sum, e);
    }
    const float inv = 1.0f / vaddvq_f32(sum);
    for (int i = 0; i < hd; i += 4) {
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int c = 0; c < n; c++) acc = vfmaq_f32(acc, vdupq_n_f32(s[c]), vld1q_f32(vc + (long)keys[c] * hd + i));
        vst1q_f32(out + i, vmulq_f32(acc, vdupq_n_f32(inv)));
    }
}

#endif
#endif
