/* Weight-quantized small-M GEMM for draft models (AVX512-VNNI, else AVX2: quant_avx2.h; aarch64: quant_neon.h): y[M, N] = x[M, K] @ W[N, K]^T + b.
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
 * so a panel streams from DRAM front to back once per call whatever M is. The AVX2 kernel (quant_avx2.h) takes its
 * own k-pair-major layout of the same bytes and computes the same integers and the same fp32 operations per lane. */
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0                  /* built without OpenMP: one thread (panel.build says so) */
#endif

#define G 32
#define NB 32
#define RMAX 4
#define PFD 4096                               /* software prefetch distance, bytes */

/* 1: AVX512-VNNI (the layout above), 2: AVX2 (quant_avx2.h's layout), 3: NEON (quant_neon.h's layout), 0: none. */
int quant_kind(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 1;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return 2;
#elif defined(__aarch64__)
    return 3;
#else
    return 0;
#endif
}

int quant_available(void) { return quant_kind() != 0; }

long quant_block_bytes(int bits) { return (bits == 4 ? 16 * G : 32 * G) + 2 * NB; }

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "attend.h"
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

static void rms_norm(const float *x, const float *w, float *y, long D, float eps) {
    __m512 acc = _mm512_setzero_ps();
    for (long i = 0; i < D; i += 16) { __m512 v = _mm512_loadu_ps(x + i); acc = _mm512_fmadd_ps(v, v, acc); }
    const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)D + eps));
    for (long i = 0; i < D; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), inv)));
}

static void silu_mul(float *g, const float *u, long n) {
    for (long i = 0; i < n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 sg = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(sg, _mm512_loadu_ps(u + i)));
    }
}
#define X_ELEM signed char                   /* the quantized activations' storage */
#define QUANT_SIMD
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "attend.h"
#include "quant_avx2.h"
#define QUANT_SIMD
#elif defined(__aarch64__)
#include "attend.h"
#include "quant_neon.h"
#define QUANT_SIMD
#endif

#ifdef QUANT_SIMD
/* y[M, N] (N a multiple of 32, K of 32). Returns 0, -1 when scratch cannot be allocated, -2 for bad bits. */
int quant_linear(int bits, const float *x, long M, long K, const unsigned char *wp, long N, const float *bias,
                 float *y, int threads) {
    if (bits != 4 && bits != 8) return -2;
    const long Gn = K / G, bb = quant_block_bytes(bits);
    X_ELEM *xq = malloc(sizeof(X_ELEM) * M * K);
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
                xq[r * K + g * G + i] = (X_ELEM)q;
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
            const X_ELEM *xr = xq + r0 * K;
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

/* ---- One decoder layer of a Qwen2 / Llama model for a few new tokens (fused.py) ------------------------
 * h[M, D] (residual stream, in / out):
 *   t = rmsnorm(h) ln1;  q, k, v = t Wq + bq, t Wk + bk, t Wv + bv;  rotary(q, k) with cos / sin [M, hd]
 *   (rotate-half form);  k, v written to the cache [B, Hkv, cap, hd] at (tok_row[m], tok_col[m]);
 *   per token m and head j: softmax(scale q k^T) v over the cache columns keys[key_off[m] .. key_off[m+1]);
 *   h += att Wo + bo;  t = rmsnorm(h) ln2;  h += (silu(t Wg) * (t Wu)) Wd.
 * Every sum has a fixed order per token (16-lane partial sums, then _mm512_reduce_add_ps; 8 lanes and hsum256 on
 * AVX2), and the linear
 * layers are row-invariant: a token's result depends on its own inputs and keys only. */
static void rotary(float *x, int heads, int hd, const float *cos, const float *sin) {
    const int half = hd / 2;
    for (int j = 0; j < heads; j++) {
        float *v = x + j * hd;
        for (int i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cos[i] - b * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/* A linear layer y[M, N] = x[M, K] W^T + b of any kernel: quant_linear_q4 / _q8 below, or panel_gemm.c's
 * panel_linear_bf16 or panel_linear_amx (a bf16 target's panels; fused.py passes their addresses). Each is
 * row-invariant; returns 0, or nonzero when it fails. */
typedef int (*linear_fn)(const float *x, long M, long K, const void *w, long N, const float *bias, float *y,
                         int threads);
int quant_linear_q4(const float *x, long M, long K, const void *w, long N, const float *bias, float *y, int threads) {
    return quant_linear(4, x, M, K, w, N, bias, y, threads);
}
int quant_linear_q8(const float *x, long M, long K, const void *w, long N, const float *bias, float *y, int threads) {
    return quant_linear(8, x, M, K, w, N, bias, y, threads);
}

/* lin / w / b: the seven linear layers q, k, v, o, gate, up, down (each its kernel, its weights as that kernel
 * takes them, its bias or NULL). Returns 0, -1 when scratch cannot be allocated, -2 for bad shapes, or a
 * linear layer's own nonzero code. */
int fused_layer_with(const linear_fn *lin, long M, long D, float *h, const float *ln1, const float *ln2, float eps,
                     const void *const *w, const float *const *b, long F, int H, int Hkv, int hd, float scale,
                     const float *cos, const float *sin, float *kbuf, float *vbuf, long cap, const int *tok_row,
                     const int *tok_col, const int *keys, const int *key_off, int threads) {
    if (D % 32 || F % 32 || hd % 16 || H % Hkv || (H * hd) % 32 || (Hkv * hd) % 32) return -2;
    const long Nq = (long)H * hd, Nk = (long)Hkv * hd, W = D > F ? D : F;
    int most = 0;
    for (long m = 0; m < M; m++) most = key_off[m + 1] - key_off[m] > most ? key_off[m + 1] - key_off[m] : most;
    float *t = malloc(sizeof(float) * M * W), *q = malloc(sizeof(float) * M * Nq), *k = malloc(sizeof(float) * M * Nk),
          *v = malloc(sizeof(float) * M * Nk), *att = malloc(sizeof(float) * M * Nq), *g = malloc(sizeof(float) * M * F),
          *u = malloc(sizeof(float) * M * F), *s = malloc(sizeof(float) * M * H * (most + 16));
    int rc = 0;
    if (!t || !q || !k || !v || !att || !g || !u || !s) { rc = -1; goto done; }
    for (long m = 0; m < M; m++) rms_norm(h + m * D, ln1, t + m * D, D, eps);
    if ((rc = lin[0](t, M, D, w[0], Nq, b[0], q, threads))) goto done;
    if ((rc = lin[1](t, M, D, w[1], Nk, b[1], k, threads))) goto done;
    if ((rc = lin[2](t, M, D, w[2], Nk, b[2], v, threads))) goto done;
    for (long m = 0; m < M; m++) {
        rotary(q + m * Nq, H, hd, cos + m * hd, sin + m * hd);
        rotary(k + m * Nk, Hkv, hd, cos + m * hd, sin + m * hd);
        for (int j = 0; j < Hkv; j++) {
            const long at = (((long)tok_row[m] * Hkv + j) * cap + tok_col[m]) * hd;
            memcpy(kbuf + at, k + m * Nk + j * hd, sizeof(float) * hd);
            memcpy(vbuf + at, v + m * Nk + j * hd, sizeof(float) * hd);
        }
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long mj = 0; mj < M * H; mj++) {
        const long m = mj / H; const int j = (int)(mj % H), kv = j / (H / Hkv);
        const long base = ((long)tok_row[m] * Hkv + kv) * cap * hd;
        attend(q + m * Nq + j * hd, kbuf + base, vbuf + base, hd, keys + key_off[m], key_off[m + 1] - key_off[m],
               scale, s + mj * (most + 16), att + m * Nq + j * hd);
    }
    if ((rc = lin[3](att, M, Nq, w[3], D, b[3], t, threads))) goto done;
    for (long i = 0; i < M * D; i++) h[i] += t[i];
    for (long m = 0; m < M; m++) rms_norm(h + m * D, ln2, t + m * D, D, eps);
    if ((rc = lin[4](t, M, D, w[4], F, b[4], g, threads))) goto done;
    if ((rc = lin[5](t, M, D, w[5], F, b[5], u, threads))) goto done;
    silu_mul(g, u, M * F);                                  /* silu(gate) * up */
    if ((rc = lin[6](g, M, F, w[6], D, b[6], t, threads))) goto done;
    for (long i = 0; i < M * D; i++) h[i] += t[i];
done:
    free(t); free(q); free(k); free(v); free(att); free(g); free(u); free(s);
    return rc;
}

/* fused_layer_with for a quantized draft: all seven layers ``bits``-bit panels as quant_linear takes them. */
int fused_layer(int bits, long M, long D, float *h, const float *ln1, const float *ln2, float eps,
                const unsigned char *const *w, const float *const *b, long F, int H, int Hkv, int hd, float scale,
                const float *cos, const float *sin, float *kbuf, float *vbuf, long cap, const int *tok_row,
                const int *tok_col, const int *keys, const int *key_off, int threads) {
    if (bits != 4 && bits != 8) return -2;
    const linear_fn f = bits == 4 ? quant_linear_q4 : quant_linear_q8, lin[7] = {f, f, f, f, f, f, f};
    return fused_layer_with(lin, M, D, h, ln1, ln2, eps, (const void *const *)w, b, F, H, Hkv, hd, scale, cos, sin,
                            kbuf, vbuf, cap, tok_row, tok_col, keys, key_off, threads);
}
#else

int fused_layer(void) { return -2; }
int fused_layer_with(void) { return -2; }
int quant_linear_q4(void) { return -2; }
int quant_linear_q8(void) { return -2; }
int quant_linear(int bits, const float *x, long M, long K, const unsigned char *wp, long N, const float *bias,
                 float *y, int threads) { return -2; }
#endif
