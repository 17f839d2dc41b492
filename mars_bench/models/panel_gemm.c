/* Small-M fp32 GEMM for the CPU fast path: y[M, N] = x[M, K] @ W[N, K]^T + b, M <= a few dozen rows.
 *
 * W is packed once into panels of NB output columns, k-major: wp[p*K*NB + k*NB + j] = W[p*NB + j, k],
 * so each thread streams whole panels front to back (one DRAM stream, software-prefetched PF k-steps
 * ahead). For each panel the rows of x go through in chunks of RMAX, each chunk held transposed ([K][R])
 * so the R broadcasts of one k-step read one cache line; the chunk's R x NB accumulators stay in
 * registers. Weights come from DRAM once per call whatever M is, which is what makes scoring k + 1
 * tokens cost about what 1 token costs. Summation over k is sequential in fp32 (rounding differs from
 * MKL's, as any two BLAS differ). Built by mars_bench/models/panel.py per kernel family: avx512 (-march=native:
 * zmm, 12 rows x 32 columns; AVX512_BF16 / AMX bf16 kernels below) or avx2 (-mavx2 -mfma -mf16c: ymm, 6 rows x 16
 * columns; bf16 weights in panel_bf16_avx2.h) or, on aarch64, neon (q registers, 12 rows x 8 columns; bf16 weights
 * in panel_bf16_neon.h: BFDOT where the compiler targets +bf16, else widening + FMA). */
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0                  /* built without OpenMP: one thread (panel.build says so) */
#endif
#include "attend.h"

#if defined(__AVX512F__)
#define VW 16                                   /* floats per zmm register */
#define RMAX 12                                 /* rows per chunk: 2*RMAX accumulators + 3 of 32 registers */
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VBCAST(s) _mm512_set1_ps(s)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8                                    /* floats per ymm register */
#define RMAX 6                                  /* 2*RMAX accumulators + 3 of 16 registers */
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VBCAST(s) _mm256_set1_ps(s)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#elif defined(__aarch64__)
#define VW 4                                    /* floats per q register */
#define RMAX 12                                 /* 2*RMAX accumulators + 3 of 32 registers */
typedef float32x4_t vec;
#define VZERO() vdupq_n_f32(0.0f)
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32(p, v)
#define VBCAST(s) vdupq_n_f32(s)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VADD(a, b) vaddq_f32(a, b)
#define PREFETCH_T1(p) __builtin_prefetch((const void *)(p), 0, 2)
#else
#error "panel_gemm.c needs AVX-512F, AVX2 + FMA or aarch64 NEON (without them the fast path uses MKL packed GEMM)"
#endif
#ifndef PREFETCH_T1
#define PREFETCH_T1(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#endif
#define NB (2 * VW)                             /* panel width: two vectors */
/* fp32 -> bf16, round to nearest even (as torch), NaN kept quiet: the bf16 kernels that round x (AVX512_BF16, BFDOT) */
static inline __attribute__((unused)) unsigned short to_bf16(float f) {
    unsigned int u; __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 0x40);    /* quiet NaN */
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
#define PF 64                                   /* prefetch distance in k-steps (best of 4..128 here) */

#define KERN(R) \
static void kern_##R(const float *xt, long K, const float *w, float *y, long N, const float *b) { \
    vec a0[R], a1[R]; \
    for (int r = 0; r < R; r++) { a0[r] = VZERO(); a1[r] = VZERO(); } \
    for (long k = 0; k < K; k++) { \
        PREFETCH_T1(w + (k + PF) * NB); \
        PREFETCH_T1(w + (k + PF) * NB + VW); \
        vec b0 = VLOAD(w + k * NB), b1 = VLOAD(w + k * NB + VW); \
        for (int r = 0; r < R; r++) { vec xb = VBCAST(xt[k * R + r]); \
            a0[r] = VFMA(xb, b0, a0[r]); a1[r] = VFMA(xb, b1, a1[r]); } \
    } \
    vec c0 = b ? VLOAD(b) : VZERO(), c1 = b ? VLOAD(b + VW) : VZERO(); \
    for (int r = 0; r < R; r++) { VSTORE(y + r * N, VADD(a0[r], c0)); VSTORE(y + r * N + VW, VADD(a1[r], c1)); } \
}
KERN(1) KERN(2) KERN(3) KERN(4) KERN(5) KERN(6)
#if RMAX == 12
KERN(7) KERN(8) KERN(9) KERN(10) KERN(11) KERN(12)
#endif
typedef void (*kern_t)(const float *, long, const float *, float *, long, const float *);
static const kern_t KERNS[13] = {0, kern_1, kern_2, kern_3, kern_4, kern_5, kern_6,
#if RMAX == 12
                                 kern_7, kern_8, kern_9, kern_10, kern_11, kern_12
#endif
};

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

/* ---- bf16 weights (AVX512_BF16): y[M, N] = bf16(x)[M, K] @ W[N, K]^T + b, fp32 accumulation ----------
 * Same panels of NB columns, now k-pair-major: wq[p*K*NB + (k/2)*2*NB + 2*j + (k&1)] = W[p*NB + j, k] as
 * bf16, so one k-pair step is two zmm loads (64 bf16) and one vdpbf16ps per row and vector: a*b products
 * of bf16 are exact in fp32; each output element is one sequential fp32 sum over k pairs computed by one
 * thread, so a row's result does not depend on how many rows the call has (batch invariance) or on the
 * thread count. x is rounded to bf16 (round to nearest even, as torch's .to(bfloat16)). K must be even. */
/* Row-wise attention (attention.py): for sequence b, query row r and head h, out[b, r, h, :] = softmax(scale q k^T) v
 * over the key columns keys[key_off[b*Q + r] .. key_off[b*Q + r + 1]) of kv head h / (H / Hkv), each row computed
 * alone (attend.h), so a row's result never depends on the rows beside it. q[b, h, r, :] at q + b*qsb + h*qsh + r*qsr;
 * key column c of head g at k + b*ksb + g*ksh + c*hd (likewise v). A row with no keys gets zeros. Returns 0, -1
 * when scratch cannot be allocated, -2 for bad shapes. */
int rows_attention(const float *q, long qsb, long qsh, long qsr, const float *k, long ksb, long ksh, const float *v,
                   long vsb, long vsh, int B, int H, int Hkv, int Q, int hd, const int *keys, const int *key_off,
                   float scale, float *out, int threads) {
    if (hd % 16 || Hkv <= 0 || H % Hkv) return -2;
    int most = 0;
    for (long i = 0; i < (long)B * Q; i++) most = key_off[i + 1] - key_off[i] > most ? key_off[i + 1] - key_off[i] : most;
    float *s = malloc(sizeof(float) * (size_t)threads * (most + 16));
    if (!s) return -1;
    #pragma omp parallel num_threads(threads)
    {
        float *ss = s + (long)omp_get_thread_num() * (most + 16);
        #pragma omp for schedule(static)
        for (long i = 0; i < (long)B * Q * H; i++) {
            const long b = i / ((long)Q * H), r = (i / H) % Q;
            const int h = (int)(i % H), g = h / (H / Hkv), n = key_off[b * Q + r + 1] - key_off[b * Q + r];
            float *o = out + i * hd;
            if (!n) { for (int j = 0; j < hd; j++) o[j] = 0.0f; continue; }
            attend(q + b * qsb + h * qsh + r * qsr, k + b * ksb + g * ksh, v + b * vsb + g * vsh, hd,
                   keys + key_off[b * Q + r], n, scale, ss, o);
        }
    }
    free(s);
    return 0;
}

#ifdef __AVX512BF16__
#define PFB 256                                 /* prefetch distance in k-pair steps (32 KB ahead; both lines of a step) */
#define KERNB(R) \
static void kernb_##R(const unsigned int *xt, long K2, const unsigned short *w, float *y, long N, const float *b) { \
    __m512 a0[R], a1[R]; \
    for (int r = 0; r < R; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
    for (long k = 0; k < K2; k++) { \
        _mm_prefetch((const char *)(w + (k + PFB) * 2 * NB), _MM_HINT_T1); \
        _mm_prefetch((const char *)(w + (k + PFB) * 2 * NB + NB), _MM_HINT_T1); \
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(w + k * 2 * NB), b1 = (__m512bh)_mm512_loadu_si512(w + k * 2 * NB + NB); \
        for (int r = 0; r < R; r++) { __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xt[k * R + r]); \
            a0[r] = _mm512_dpbf16_ps(a0[r], xb, b0); a1[r] = _mm512_dpbf16_ps(a1[r], xb, b1); } \
    } \
    __m512 c0 = b ? _mm512_loadu_ps(b) : _mm512_setzero_ps(), c1 = b ? _mm512_loadu_ps(b + VW) : _mm512_setzero_ps(); \
    for (int r = 0; r < R; r++) { _mm512_storeu_ps(y + r * N, _mm512_add_ps(a0[r], c0)); \
        _mm512_storeu_ps(y + r * N + VW, _mm512_add_ps(a1[r], c1)); } \
}
KERNB(1) KERNB(2) KERNB(3) KERNB(4) KERNB(5) KERNB(6) KERNB(7) KERNB(8) KERNB(9) KERNB(10) KERNB(11) KERNB(12)
typedef void (*kernb_t)(const unsigned int *, long, const unsigned short *, float *, long, const float *);
static const kernb_t KERNBS[RMAX + 1] = {0, kernb_1, kernb_2, kernb_3, kernb_4, kernb_5, kernb_6,
                                         kernb_7, kernb_8, kernb_9, kernb_10, kernb_11, kernb_12};

int panel_bf16_available(void) { return 1; }

typedef unsigned int xelem_t;                   /* one k-pair of bf16(x) */
#define XSTEP 2                                 /* k per xelem_t */
static inline void put_x(xelem_t *xt, const float *xr) {
    *xt = (unsigned int)to_bf16(xr[0]) | ((unsigned int)to_bf16(xr[1]) << 16);
}
#define BROWS RMAX                              /* rows per chunk of the bf16 driver (below) */
#define BF16_DRIVER

/* The same product on AMX tiles (Sapphire Rapids and later), same packed panels: per panel and 32-wide k
 * block, A = 16 rows of bf16(x), B0/B1 = the panel's two 16-column halves (16 k-pairs x 16 columns x 2,
 * row stride 128 bytes: exactly the k-pair-major layout above), C0/C1 += A B. Rows are always run in
 * blocks of 16 (missing rows zero), so every row goes through the same instruction sequence whatever the
 * call's row count: a row's result does not depend on the other rows (batch invariance). The tile
 * multiply leaves the weights' DRAM stream as the only cost up to 16 rows. K must be a multiple of 32. */
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { unsigned char palette, start; unsigned char pad[14]; unsigned short colsb[16]; unsigned char rows[16]; } tilecfg;

/* 1 when the kernel may use AMX tiles (asks the kernel for permission once), else 0. */
int panel_amx_init(void) {
    static int ok = -1;
    if (ok < 0) ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return ok;
}

static void tile_setup(void) {
    tilecfg c = {0};
    c.palette = 1;
    for (int t = 0; t < 5; t++) { c.colsb[t] = 64; c.rows[t] = 16; }
    _tile_loadconfig(&c);
}

int panel_linear_amx(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias,
                     float *y, int threads) {
    long MP = (M + 15) / 16 * 16;
    unsigned short *xa = calloc(MP * K, sizeof(unsigned short));
    if (!xa) return -1;
    for (long r = 0; r < M; r++)
        for (long k = 0; k < K; k++) xa[r * K + k] = to_bf16(x[r * K + k]);
    #pragma omp parallel num_threads(threads)
    {
        tile_setup();
        float c[16 * NB];
        #pragma omp for schedule(static)
        for (long p = 0; p < N / NB; p++) {
            const unsigned short *w = wq + p * K * NB;
            for (long r0 = 0; r0 < MP; r0 += 16) {
                _tile_zero(0); _tile_zero(1);
                for (long kb = 0; kb < K / 32; kb++) {
                    const unsigned short *wb = w + kb * 32 * NB;
                    for (int l = 0; l < 32; l++) _mm_prefetch((const char *)(wb + 16 * 32 * NB) + 64 * l, _MM_HINT_T0);
                    _tile_loadd(2, xa + r0 * K + kb * 32, K * 2);
                    _tile_loadd(3, wb, 4 * NB);
                    _tile_loadd(4, wb + NB, 4 * NB);
                    _tile_dpbf16ps(0, 2, 3);
                    _tile_dpbf16ps(1, 2, 4);
                }
                _tile_stored(0, c, NB * 4);
                _tile_stored(1, c + 16, NB * 4);
                long R = M - r0 < 16 ? M - r0 : 16;
                for (long r = 0; r < R; r++)
                    for (int j = 0; j < NB; j++) y[(r0 + r) * N + p * NB + j] = c[r * NB + j] + (bias ? bias[p * NB + j] : 0.0f);
            }
        }
        _tile_release();
    }
    free(xa);
    return 0;
}
#else
int panel_amx_init(void) { return 0; }
int panel_linear_amx(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias,
                     float *y, int threads) { return -2; }
#endif
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include "panel_bf16_avx2.h"
#define BF16_DRIVER
#elif defined(__aarch64__)
#include "panel_bf16_neon.h"
#define BF16_DRIVER
#else
int panel_bf16_available(void) { return 0; }
int panel_amx_init(void) { return 0; }
#endif

#ifdef BF16_DRIVER
/* The driver of every bf16 kernel but AMX (AVX512_BF16 above; AVX2 and NEON: their headers define xelem_t, XSTEP,
 * put_x, BROWS, KERNBS): x
 * transposed once into chunks of at most BROWS rows, k-major (x elements of XSTEP k each), then every panel
 * streamed once per chunk by one thread. Returns 0, or -1 when the scratch cannot be allocated. */
int panel_linear_bf16(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias,
                      float *y, int threads) {
    const long KX = K / XSTEP;                  /* x elements per row */
    xelem_t *xt = malloc(sizeof(xelem_t) * (M * KX + 1));
    if (!xt) return -1;
    for (long r0 = 0; r0 < M; r0 += BROWS) {
        long R = M - r0 < BROWS ? M - r0 : BROWS;
        for (long k = 0; k < KX; k++)
            for (long r = 0; r < R; r++) put_x(xt + r0 * KX + k * R + r, x + (r0 + r) * K + XSTEP * k);
    }
#ifdef KERNB_PAIR
    if (M == 1) {                               /* one row: two panels per pass (the header says why) */
        const long P = N / NB;
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (long pp = 0; pp < (P + 1) / 2; pp++) {
            const long p = 2 * pp;
            const float *b = bias ? bias + p * NB : 0;
            if (p + 1 < P) kernb_1x2(xt, K / 2, wq + p * K * NB, K * NB, y + p * NB, b);
            else KERNBS[1](xt, K / 2, wq + p * K * NB, y + p * NB, N, b);
        }
        free(xt);
        return 0;
    }
#endif
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < N / NB; p++) {
        const unsigned short *w = wq + p * K * NB;
        const float *b = bias ? bias + p * NB : 0;
        for (long r0 = 0; r0 < M; r0 += BROWS) {
            long R = M - r0 < BROWS ? M - r0 : BROWS;
            KERNBS[R](xt + r0 * KX, K / 2, w, y + r0 * N + p * NB, N, b);
        }
    }
    free(xt);
    return 0;
}
#endif

#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)) || defined(__aarch64__)
/* w: the weight as bf16 bits [N, K] (row-major) -> panels of NB columns, k-pair-major: the one layout the
 * AVX512_BF16, AMX, AVX2 and NEON bf16 kernels all read. */
void panel_pack_bf16(const unsigned short *w, long N, long K, unsigned short *wq, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < N / NB; p++)
        for (long k = 0; k < K; k++)
            for (int j = 0; j < NB; j++)
                wq[p * K * NB + (k / 2) * 2 * NB + 2 * j + (k & 1)] = w[(p * NB + j) * K + k];
}
#endif
