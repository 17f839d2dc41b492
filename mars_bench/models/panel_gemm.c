/* Small-M fp32 GEMM for the CPU fast path: y[M, N] = x[M, K] @ W[N, K]^T + b, M <= a few dozen rows.
 *
 * W is packed once into panels of NB output columns, k-major: wp[p*K*NB + k*NB + j] = W[p*NB + j, k],
 * so each thread streams whole panels front to back (one DRAM stream, software-prefetched PF k-steps
 * ahead). For each panel the rows of x go through in chunks of RMAX, each chunk held transposed ([K][R])
 * so the R broadcasts of one k-step read one cache line; the chunk's R x NB accumulators stay in
 * registers. Weights come from DRAM once per call whatever M is, which is what makes scoring k + 1
 * tokens cost about what 1 token costs. Summation over k is sequential in fp32 (rounding differs from
 * MKL's, as any two BLAS differ). Built by mars_bench/models/panel.py with -march=native. */
#include <immintrin.h>
#include <stdlib.h>
#include <omp.h>

#ifndef __AVX512F__
#error "panel_gemm.c needs AVX-512F (without it the fast path uses MKL packed GEMM)"
#endif
#define VW 16                                   /* floats per zmm register */
#define RMAX 12                                 /* rows per chunk: 2*RMAX accumulators + 3 of 32 registers */
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VBCAST(s) _mm512_set1_ps(s)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define NB (2 * VW)                             /* panel width: two vectors */
#define PF 64                                   /* prefetch distance in k-steps (best of 4..128 here) */

#define KERN(R) \
static void kern_##R(const float *xt, long K, const float *w, float *y, long N, const float *b) { \
    vec a0[R], a1[R]; \
    for (int r = 0; r < R; r++) { a0[r] = VZERO(); a1[r] = VZERO(); } \
    for (long k = 0; k < K; k++) { \
        _mm_prefetch((const char *)(w + (k + PF) * NB), _MM_HINT_T1); \
        _mm_prefetch((const char *)(w + (k + PF) * NB + VW), _MM_HINT_T1); \
        vec b0 = VLOAD(w + k * NB), b1 = VLOAD(w + k * NB + VW); \
        for (int r = 0; r < R; r++) { vec xb = VBCAST(xt[k * R + r]); \
            a0[r] = VFMA(xb, b0, a0[r]); a1[r] = VFMA(xb, b1, a1[r]); } \
    } \
    vec c0 = b ? VLOAD(b) : VZERO(), c1 = b ? VLOAD(b + VW) : VZERO(); \
    for (int r = 0; r < R; r++) { VSTORE(y + r * N, VADD(a0[r], c0)); VSTORE(y + r * N + VW, VADD(a1[r], c1)); } \
}
KERN(1) KERN(2) KERN(3) KERN(4) KERN(5) KERN(6) KERN(7) KERN(8) KERN(9) KERN(10) KERN(11) KERN(12)
typedef void (*kern_t)(const float *, long, const float *, float *, long, const float *);
static const kern_t KERNS[RMAX + 1] = {0, kern_1, kern_2, kern_3, kern_4, kern_5, kern_6,
                                       kern_7, kern_8, kern_9, kern_10, kern_11, kern_12};

int panel_width(void) { return NB; }

/* Returns 0, or -1 when the scratch for the transposed rows cannot be allocated. */
int panel_linear(const float *x, long M, long K, const float *wp, long N, const float *bias, float *y, int threads) {
    float *xt = malloc(sizeof(float) * M * K);
    if (!xt) return -1;
    for (long r0 = 0; r0 < M; r0 += RMAX) {
        long R = M - r0 < RMAX ? M - r0 : RMAX;
        for (long k = 0; k < K; k++)
            for (long r = 0; r < R; r++) xt[r0 * K + k * R + r] = x[(r0 + r) * K + k];
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < N / NB; p++) {
        const float *w = wp + p * K * NB, *b = bias ? bias + p * NB : 0;
        for (long r0 = 0; r0 < M; r0 += RMAX) {
            long R = M - r0 < RMAX ? M - r0 : RMAX;
            KERNS[R](xt + r0 * K, K, w, y + r0 * N + p * NB, N, b);
        }
    }
    free(xt);
    return 0;
}

void panel_pack(const float *w, long N, long K, float *wp, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < N / NB; p++)
        for (long k = 0; k < K; k++)
            for (int j = 0; j < NB; j++) wp[p * K * NB + k * NB + j] = w[(p * NB + j) * K + k];
}
