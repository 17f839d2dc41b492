/* bf16 weights on AVX2 + FMA (included by panel_gemm.c where the compiler targets AVX2 but not AVX-512):
 * y[M, N] = x[M, K] @ W[N, K]^T + b with W held as bf16 and fp32 math, for CPUs without AVX512_BF16.
 *
 * The panels are those of panel_pack_bf16 (k-pair-major) with NB = 16 columns, so one k-pair step is one
 * 64-byte line: two 32-byte loads of 8 columns x 2 k, each 32-bit lane bf16(w[j, k]) | bf16(w[j, k + 1]) << 16.
 * lane << 16 and lane & 0xffff0000 are then the two weights as fp32 (bf16 -> fp32 is exact): the weights stay
 * bf16 in memory and are widened only in registers. x stays fp32 (not rounded to bf16: more exact than the
 * AVX512_BF16 kernel, the same values as F.linear(x, W.float())). Each output element is one fp32 FMA chain over
 * k in order, computed by one thread with the same instructions whatever the chunk of rows: a row's result does
 * not depend on the other rows of the call or on the thread count. K must be even. */
#if NB != 16
#error "panel_bf16_avx2.h expects 16-column panels"
#endif
#ifndef PFB
#define PFB 128                                 /* prefetch distance in k-pair steps (8 KB ahead) */
#endif
#ifndef PFH
#define PFH _MM_HINT_T0
#endif
#define RB 5                                    /* rows per chunk: 2*RB accumulators + 4 weights + 2 broadcasts */

/* One row's two accumulators (8 columns each) per k-pair: named variables, not arrays, so that the compiler keeps
 * all 2*RB of them in registers (with arrays GCC stored every accumulator to the stack on every k-pair step: on the
 * 2-core AVX2 EPYC, one core, 63 GFLOP/s at 5 and at 100 rows; named, 97 of the core's ~99 GFLOP/s of FMA, with
 * bit-identical results: each element is the same FMA chain over k in the same order). */
#define KROW(r) if (RR > r) { \
        const __m256 x0 = _mm256_broadcast_ss(xt + 2 * k * RR + r), x1 = _mm256_broadcast_ss(xt + (2 * k + 1) * RR + r); \
        a0_##r = _mm256_fmadd_ps(x1, h0, _mm256_fmadd_ps(x0, l0, a0_##r)); \
        a1_##r = _mm256_fmadd_ps(x1, h1, _mm256_fmadd_ps(x0, l1, a1_##r)); }
#define KSTORE(r) if (RR > r) { _mm256_storeu_ps(y + r * N, _mm256_add_ps(a0_##r, c0)); \
        _mm256_storeu_ps(y + r * N + 8, _mm256_add_ps(a1_##r, c1)); }

#define KERNB(R) \
static void kernb_##R(const float *xt, long K2, const unsigned short *w, float *y, long N, const float *b) { \
    enum { RR = R }; \
    __m256 a0_0 = _mm256_setzero_ps(), a1_0 = a0_0, a0_1 = a0_0, a1_1 = a0_0, a0_2 = a0_0, a1_2 = a0_0, \
           a0_3 = a0_0, a1_3 = a0_0, a0_4 = a0_0, a1_4 = a0_0; \
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u); \
    for (long k = 0; k < K2; k++) { \
        _mm_prefetch((const char *)(w + (k + PFB) * 2 * NB), PFH); \
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + k * 2 * NB)); \
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + k * 2 * NB + NB)); \
        const __m256 l0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), h0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi)); \
        const __m256 l1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), h1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi)); \
        KROW(0) KROW(1) KROW(2) KROW(3) KROW(4) \
    } \
    const __m256 c0 = b ? _mm256_loadu_ps(b) : _mm256_setzero_ps(), c1 = b ? _mm256_loadu_ps(b + 8) : _mm256_setzero_ps(); \
    KSTORE(0) KSTORE(1) KSTORE(2) KSTORE(3) KSTORE(4) \
}
KERNB(1) KERNB(2) KERNB(3) KERNB(4) KERNB(5)
/* One row against two adjacent panels (32 columns) in one pass: four independent FMA chains instead of two. With one
 * row, kernb_1's two chains (two dependent FMAs per k-pair each) are latency-bound at one 64-byte line per ~8
 * cycles (~24 GB/s a core here); the pair streams two lines in that time. Each element is the same FMA chain over k
 * in the same order as kernb_1's, so the results are bit-identical and a row still does not depend on its call. */
#define KERNB_PAIR
static void kernb_1x2(const float *xt, long K2, const unsigned short *w, long wnext, float *y, const float *b) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const unsigned short *u = w + wnext;
    for (long k = 0; k < K2; k++) {
        _mm_prefetch((const char *)(w + (k + PFB) * 2 * NB), PFH);
        _mm_prefetch((const char *)(u + (k + PFB) * 2 * NB), PFH);
        const __m256 x0 = _mm256_broadcast_ss(xt + 2 * k), x1 = _mm256_broadcast_ss(xt + 2 * k + 1);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + k * 2 * NB));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + k * 2 * NB + NB));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(u + k * 2 * NB));
        const __m256i v3 = _mm256_loadu_si256((const __m256i *)(u + k * 2 * NB + NB));
        a0 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v0, hi)),
                             _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), a0));
        a1 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v1, hi)),
                             _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), a1));
        c0 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v2, hi)),
                             _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v2, 16)), c0));
        c1 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v3, hi)),
                             _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v3, 16)), c1));
    }
    const __m256 z = _mm256_setzero_ps();
    _mm256_storeu_ps(y, _mm256_add_ps(a0, b ? _mm256_loadu_ps(b) : z));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(a1, b ? _mm256_loadu_ps(b + 8) : z));
    _mm256_storeu_ps(y + 16, _mm256_add_ps(c0, b ? _mm256_loadu_ps(b + 16) : z));
    _mm256_storeu_ps(y + 24, _mm256_add_ps(c1, b ? _mm256_loadu_ps(b + 24) : z));
}
typedef void (*kernb_t)(const float *, long, const unsigned short *, float *, long, const float *);
static const kernb_t KERNBS[RB + 1] = {0, kernb_1, kernb_2, kernb_3, kernb_4, kernb_5};

int panel_bf16_available(void) { return 1; }
int panel_amx_init(void) { return 0; }
int panel_linear_amx(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias,
                     float *y, int threads) { return -2; }

typedef float xelem_t;                          /* x as fp32, one k per element */
#define XSTEP 1
static inline void put_x(xelem_t *xt, const float *xr) { *xt = xr[0]; }
#define BROWS RB                                /* rows per chunk of the driver (panel_gemm.c) */
