/* bf16 weights on aarch64 NEON (included by panel_gemm.c where the compiler targets aarch64):
 * y[M, N] = x[M, K] @ W[N, K]^T + b with W held as bf16 and fp32 accumulation.
 *
 * The panels are those of panel_pack_bf16 (k-pair-major) with NB = 8 columns, so one k-pair step is 32 bytes: two
 * q registers of 4 columns x 2 k, each 32-bit lane bf16(w[j, k]) | bf16(w[j, k + 1]) << 16. Two kernels read them:
 *   BFDOT (the compiler targets +bf16, __ARM_FEATURE_BF16_VECTOR_ARITHMETIC): x is rounded to bf16 (round to nearest
 *     even, as torch's .to(bfloat16)) and one vbfdotq_f32 per row and register adds x[k] w[j, k] + x[k + 1] w[j, k + 1]
 *     to the accumulator, as the AVX512_BF16 kernel does (panel_neon_bfdot() == 1);
 *   convert + FMA (plain ARMv8-A): lane << 16 and lane & 0xffff0000 are the two weights as fp32 (exact), x stays
 *     fp32, and each output element is one fp32 FMA chain over k in order: the AVX2 kernel's arithmetic, so equal
 *     results to it (panel_neon_bfdot() == 0).
 * Either way each output element is computed by one thread with the same instructions whatever the chunk of rows:
 * a row's result does not depend on the other rows of the call or on the thread count. K must be even. */
#if NB != 8
#error "panel_bf16_neon.h expects 8-column panels"
#endif
#define PFB 256                                 /* prefetch distance in k-pair steps (8 KB ahead) */

int panel_bf16_available(void) { return 1; }
int panel_amx_init(void) { return 0; }
int panel_linear_amx(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias,
                     float *y, int threads) { return -2; }

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
int panel_neon_bfdot(void) { return 1; }

#define KERNB(R) \
static void kernb_##R(const unsigned int *xt, long K2, const unsigned short *w, float *y, long N, const float *b) { \
    float32x4_t a0[R], a1[R]; \
    for (int r = 0; r < R; r++) { a0[r] = vdupq_n_f32(0.0f); a1[r] = vdupq_n_f32(0.0f); } \
    for (long k = 0; k < K2; k++) { \
        __builtin_prefetch(w + (k + PFB) * 2 * NB, 0, 2); \
        const bfloat16x8_t b0 = vld1q_bf16((const bfloat16_t *)(w + k * 2 * NB)); \
        const bfloat16x8_t b1 = vld1q_bf16((const bfloat16_t *)(w + k * 2 * NB + NB)); \
        for (int r = 0; r < R; r++) { \
            const bfloat16x8_t xb = vreinterpretq_bf16_u32(vld1q_dup_u32(xt + k * R + r)); \
            a0[r] = vbfdotq_f32(a0[r], b0, xb); a1[r] = vbfdotq_f32(a1[r], b1, xb); \
        } \
    } \
    const float32x4_t c0 = b ? vld1q_f32(b) : vdupq_n_f32(0.0f), c1 = b ? vld1q_f32(b + 4) : vdupq_n_f32(0.0f); \
    for (int r = 0; r < R; r++) { vst1q_f32(y + r * N, vaddq_f32(a0[r], c0)); vst1q_f32(y + r * N + 4, vaddq_f32(a1[r], c1)); } \
}
typedef unsigned int xelem_t;                   /* one k-pair of bf16(x) */
#define XSTEP 2                                 /* k per xelem_t */
static inline void put_x(xelem_t *xt, const float *xr) {
    *xt = (unsigned int)to_bf16(xr[0]) | ((unsigned int)to_bf16(xr[1]) << 16);
}
#else
int panel_neon_bfdot(void) { return 0; }

#define KERNB(R) \
static void kernb_##R(const float *xt, long K2, const unsigned short *w, float *y, long N, const float *b) { \
    float32x4_t a0[R], a1[R]; \
    const uint32x4_t hi = vdupq_n_u32(0xffff0000u); \
    for (int r = 0; r < R; r++) { a0[r] = vdupq_n_f32(0.0f); a1[r] = vdupq_n_f32(0.0f); } \
    for (long k = 0; k < K2; k++) { \
        __builtin_prefetch(w + (k + PFB) * 2 * NB, 0, 2); \
        const uint32x4_t v0 = vld1q_u32((const unsigned int *)(w + k * 2 * NB)); \
        const uint32x4_t v1 = vld1q_u32((const unsigned int *)(w + k * 2 * NB + NB)); \
        const float32x4_t l0 = vreinterpretq_f32_u32(vshlq_n_u32(v0, 16)), h0 = vreinterpretq_f32_u32(vandq_u32(v0, hi)); \
        const float32x4_t l1 = vreinterpretq_f32_u32(vshlq_n_u32(v1, 16)), h1 = vreinterpretq_f32_u32(vandq_u32(v1, hi)); \
        for (int r = 0; r < R; r++) { \
            const float32x4_t x0 = vld1q_dup_f32(xt + 2 * k * R + r), x1 = vld1q_dup_f32(xt + (2 * k + 1) * R + r); \
            a0[r] = vfmaq_f32(vfmaq_f32(a0[r], x0, l0), x1, h0); \
            a1[r] = vfmaq_f32(vfmaq_f32(a1[r], x0, l1), x1, h1); \
        } \
    } \
    const float32x4_t c0 = b ? vld1q_f32(b) : vdupq_n_f32(0.0f), c1 = b ? vld1q_f32(b + 4) : vdupq_n_f32(0.0f); \
    for (int r = 0; r < R; r++) { vst1q_f32(y + r * N, vaddq_f32(a0[r], c0)); vst1q_f32(y + r * N + 4, vaddq_f32(a1[r], c1)); } \
}
typedef float xelem_t;                          /* x as fp32, one k per element */
#define XSTEP 1
static inline void put_x(xelem_t *xt, const float *xr) { *xt = xr[0]; }
#endif

KERNB(1) KERNB(2) KERNB(3) KERNB(4) KERNB(5) KERNB(6) KERNB(7) KERNB(8) KERNB(9) KERNB(10) KERNB(11) KERNB(12)
typedef void (*kernb_t)(const xelem_t *, long, const unsigned short *, float *, long, const float *);
static const kernb_t KERNBS[RMAX + 1] = {0, kernb_1, kernb_2, kernb_3, kernb_4, kernb_5, kernb_6,
                                         kernb_7, kernb_8, kernb_9, kernb_10, kernb_11, kernb_12};

#define BROWS RMAX                              /* rows per chunk of the driver (panel_gemm.c) */
