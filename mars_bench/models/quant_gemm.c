/* Weight-quantized small-M GEMM for draft models (AVX512-VNNI): y[M, N] = x[M, K] @ W[N, K]^T + b.
 *
 * W is stored in groups of G = 32 consecutive k per output column: an fp16 scale d and integers q
 * (q4: 4 bits, q in [-8, 7]; q8: 8 bits, q in [-127, 127]), stored unsigned u = q + off (off = 8 or
 * 128) so one vpdpbusd (u8 x s8 -> s32, four products per lane) multiplies them. Each row of x is
 * quantized per group too: dx = max|x| / 127 and xq = round(x / dx) in [-127, 127]. Then
 *     y[r, n] = sum_g  d[n, g] * dx[r, g] * (sum_k u[n, k] xq[r, k]  -  off * sum_k xq[r, k])
 * where the inner sums are exact int32 and the outer sum runs over g in order, in fp32, for one row at
 * a time: a row's result depends on that row only (not on the other rows of the call, not on the
 * thread count), like every kernel of the fast path.
 *
 * Layout (built by mars_bench/models/quant.py): panels of NB = 32 output columns; per panel and group
 * one block of BYTES(bits) = the two 16-column halves' codes, then the 32 fp16 scales:
 *   q8: half h, quad o (k = 4o..4o+3), column j, i: byte [h*512 + o*64 + 4j + i] = u[16h + j, 4o + i]
 *   q4: half h, octet o, column j, i: byte [h*256 + o*64 + 4j + i] = u[., 8o + i] | u[., 8o + 4 + i] << 4
 * so a panel streams from DRAM front to back once per call whatever M is. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#define G 32
#define NB 32
#define RMAX 4
#define PFD 4096                               /* software prefetch distance, bytes */

int quant_available(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

long quant_block_bytes(int bits) { return (bits == 4 ? 16 * G : 32 * G) + 2 * NB; }

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* One panel, rows [0, R) of the quantized activations; inlined per (bits, R) so both are constants. */
static inline __attribute__((always_inline)) void panel_rows(int bits, int R, const signed char *xq, const float *dx, const int *sx, long K,
                       const unsigned char *w, float *y, long N, const float *b) {
    const long Gn = K / G, bb = quant_block_bytes(bits), codes = bb - 2 * NB;
    const int off = bits == 4 ? 8 : 128;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 f0[RMAX], f1[RMAX];
    for (int r = 0; r < R; r++) { f0[r] = _mm512_setzero_ps(); f1[r] = _mm512_setzero_ps(); }
    for (long g = 0; g < Gn; g++) {
        const unsigned char *blk = w + g * bb;
        for (long l = 0; l < bb; l += 64) _mm_prefetch((const char *)blk + PFD + l, _MM_HINT_T0);
        __m512i i0[RMAX], i1[RMAX];
        for (int r = 0; r < R; r++) { i0[r] = _mm512_setzero_si512(); i1[r] = _mm512_setzero_si512(); }
        if (bits == 4) {
            for (int o = 0; o < 4; o++) {
                __m512i v0 = _mm512_loadu_si512(blk + o * 64), v1 = _mm512_loadu_si512(blk + 256 + o * 64);
                __m512i l0 = _mm512_and_si512(v0, lo4), h0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), lo4);
                __m512i l1 = _mm512_and_si512(v1, lo4), h1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), lo4);
                for (int r = 0; r < R; r++) {
                    const signed char *xr = xq + r * K + g * G + o * 8;
                    int a, c;
                    memcpy(&a, xr, 4); memcpy(&c, xr + 4, 4);
                    __m512i xa = _mm512_set1_epi32(a), xc = _mm512_set1_epi32(c);
                    i0[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i0[r], l0, xa), h0, xc);
                    i1[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i1[r], l1, xa), h1, xc);
                }
            }
        } else {
            for (int o = 0; o < 8; o++) {
                __m512i v0 = _mm512_loadu_si512(blk + o * 64), v1 = _mm512_loadu_si512(blk + 512 + o * 64);
                for (int r = 0; r < R; r++) {
                    int a;
                    memcpy(&a, xq + r * K + g * G + o * 4, 4);
                    __m512i xa = _mm512_set1_epi32(a);
                    i0[r] = _mm512_dpbusd_epi32(i0[r], v0, xa);
                    i1[r] = _mm512_dpbusd_epi32(i1[r], v1, xa);
                }
            }
        }
        const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + codes)));
        const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + codes + 32)));
        for (int r = 0; r < R; r++) {
            __m512i corr = _mm512_set1_epi32(-off * sx[r * Gn + g]);
            __m512 s = _mm512_set1_ps(dx[r * Gn + g]);
            f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0[r], corr)), _mm512_mul_ps(d0, s), f0[r]);
            f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i1[r], corr)), _mm512_mul_ps(d1, s), f1[r]);
        }
    }
    __m512 c0 = b ? _mm512_loadu_ps(b) : _mm512_setzero_ps(), c1 = b ? _mm512_loadu_ps(b + 16) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(y + r * N, _mm512_add_ps(f0[r], c0));
        _mm512_storeu_ps(y + r * N + 16, _mm512_add_ps(f1[r], c1));
    }
}

/* y[M, N] (N a multiple of 32, K of 32). Returns 0, -1 when scratch cannot be allocated, -2 for bad bits. */
int quant_linear(int bits, const float *x, long M, long K, const unsigned char *wp, long N, const float *bias,
                 float *y, int threads) {
    if (bits != 4 && bits != 8) return -2;
    const long Gn = K / G, bb = quant_block_bytes(bits);
    signed char *xq = malloc(M * K);
    float *dx = malloc(sizeof(float) * M * Gn);
    int *sx = malloc(sizeof(int) * M * Gn);
    if (!xq || !dx || !sx) { free(xq); free(dx); free(sx); return -1; }
    for (long r = 0; r < M; r++)
        for (long g = 0; g < Gn; g++) {
            const float *xg = x + r * K + g * G;
            float m = 0.0f;
            for (int i = 0; i < G; i++) m = fmaxf(m, fabsf(xg[i]));
            float d = m / 127.0f, inv = m > 0.0f ? 127.0f / m : 0.0f;
            int s = 0;
            for (int i = 0; i < G; i++) {
                int q = (int)nearbyintf(xg[i] * inv);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                xq[r * K + g * G + i] = (signed char)q;
                s += q;
            }
            dx[r * Gn + g] = d; sx[r * Gn + g] = s;
        }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < N / NB; p++) {
        const unsigned char *w = wp + p * Gn * bb;
        const float *b = bias ? bias + p * NB : 0;
        for (long r0 = 0; r0 < M; r0 += RMAX) {
            int R = M - r0 < RMAX ? (int)(M - r0) : RMAX;
            const signed char *xr = xq + r0 * K;
            const float *dr = dx + r0 * Gn;
            const int *sr = sx + r0 * Gn;
            float *yr = y + r0 * N + p * NB;
            switch (bits * 8 + R) {
#define CASE(B, RR) case B * 8 + RR: panel_rows(B, RR, xr, dr, sr, K, w, yr, N, b); break;
                CASE(4, 1) CASE(4, 2) CASE(4, 3) CASE(4, 4) CASE(8, 1) CASE(8, 2) CASE(8, 3) CASE(8, 4)
#undef CASE
            }
        }
    }
    free(xq); free(dx); free(sx);
    return 0;
}
#else
int quant_linear(int bits, const float *x, long M, long K, const unsigned char *wp, long N, const float *bias,
                 float *y, int threads) { return -2; }
#endif
