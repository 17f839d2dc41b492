/* Test driver for the aarch64 kernels (tests/test_neon_qemu.py): cross-compiled with panel_gemm.c and quant_gemm.c,
 * run under qemu-aarch64. Binary protocol on stdin / stdout (native little-endian):
 *   neon_driver f32|bf16 K N threads : W [N, K] (fp32 | bf16 bits), bias [N] fp32; packed by panel_pack(_bf16)
 *   neon_driver q4|q8 K N threads    : the packed panels (quant.pack, layout "neon"), bias [N] fp32
 *     then calls until EOF: int32 M, x [M, K] fp32 -> y [M, N] fp32
 *   neon_driver attn hd C H Hkv threads : k, v [Hkv, C, hd] fp32
 *     then calls until EOF: int32 Q, q [H, Q, hd] fp32, key_off [Q + 1] int32, keys [key_off[Q]] int32
 *     -> out [Q, H, hd] fp32 (rows_attention, one sequence)
 *   neon_driver fused bits D F H Hkv hd cap threads : ln1 [D], ln2 [D], the 7 packed linears q k v o gate up down
 *     (layout "neon"), their 7 biases, the cache k, v [2, Hkv, cap, hd] fp32 (kept across calls)
 *     then calls until EOF: int32 M, h [M, D], cos, sin [M, hd], tok_row, tok_col [M], key_off [M + 1], keys
 *     -> h [M, D] after the layer (fused_layer, eps 1e-6, scale 1 / sqrt(hd))
 *   neon_driver info : prints "bfdot=<0|1> quant_kind=<k> width=<NB>"
 * Exit status 2 on bad input, 3 when a kernel returns an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int panel_width(void);
int panel_neon_bfdot(void);
void panel_pack(const float *w, long N, long K, float *wp, int threads);
void panel_pack_bf16(const unsigned short *w, long N, long K, unsigned short *wq, int threads);
int panel_linear(const float *x, long M, long K, const float *wp, long N, const float *bias, float *y, int threads);
int panel_linear_bf16(const float *x, long M, long K, const unsigned short *wq, long N, const float *bias, float *y,
                      int threads);
int quant_kind(void);
long quant_block_bytes(int bits);
int quant_linear(int bits, const float *x, long M, long K, const unsigned char *wp, long N, const float *bias,
                 float *y, int threads);
int rows_attention(const float *q, long qsb, long qsh, long qsr, const float *k, long ksb, long ksh, const float *v,
                   long vsb, long vsh, int B, int H, int Hkv, int Q, int hd, const int *keys, const int *key_off,
                   float scale, float *out, int threads);

static void *take(size_t bytes) {               /* exactly `bytes` from stdin, or exit 2 */
    void *p = malloc(bytes ? bytes : 1);
    if (!p || fread(p, 1, bytes, stdin) != bytes) { fprintf(stderr, "neon_driver: short input\n"); exit(2); }
    return p;
}

static void give(const void *p, size_t bytes) { fwrite(p, 1, bytes, stdout); }

static int attn(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: neon_driver attn hd C H Hkv threads\n"); return 2; }
    const int hd = atoi(argv[2]), C = atoi(argv[3]), H = atoi(argv[4]), Hkv = atoi(argv[5]), threads = atoi(argv[6]);
    float *k = take(sizeof(float) * Hkv * C * hd), *v = take(sizeof(float) * Hkv * C * hd);
    int Q;
    while (fread(&Q, sizeof Q, 1, stdin) == 1) {
        float *q = take(sizeof(float) * H * Q * hd);
        int *off = take(sizeof(int) * (Q + 1));
        int *keys = take(sizeof(int) * off[Q]);
        float *out = malloc(sizeof(float) * Q * H * hd);
        const float scale = 1.0f / __builtin_sqrtf((float)hd);
        if (rows_attention(q, 0, (long)Q * hd, hd, k, 0, (long)C * hd, v, 0, (long)C * hd, 1, H, Hkv, Q, hd, keys, off,
                           scale, out, threads)) return 3;
        give(out, sizeof(float) * Q * H * hd);
        free(q); free(off); free(keys); free(out);
    }
    return 0;
}

int fused_layer(int bits, long M, long D, float *h, const float *ln1, const float *ln2, float eps,
                const unsigned char *const *w, const float *const *b, long F, int H, int Hkv, int hd, float scale,
                const float *cos, const float *sin, float *kbuf, float *vbuf, long cap, const int *tok_row,
                const int *tok_col, const int *keys, const int *key_off, int threads);

static int fused(int argc, char **argv) {
    if (argc != 10) { fprintf(stderr, "usage: neon_driver fused bits D F H Hkv hd cap threads\n"); return 2; }
    const int bits = atoi(argv[2]), H = atoi(argv[5]), Hkv = atoi(argv[6]), hd = atoi(argv[7]), threads = atoi(argv[9]);
    const long D = atol(argv[3]), F = atol(argv[4]), cap = atol(argv[8]);
    const long n[7] = {(long)H * hd, (long)Hkv * hd, (long)Hkv * hd, D, F, F, D}, k[7] = {D, D, D, (long)H * hd, D, D, F};
    float *ln1 = take(sizeof(float) * D), *ln2 = take(sizeof(float) * D);
    const unsigned char *w[7];
    const float *b[7];
    for (int i = 0; i < 7; i++) w[i] = take((size_t)(n[i] / 32) * (k[i] / 32) * quant_block_bytes(bits));
    for (int i = 0; i < 7; i++) b[i] = take(sizeof(float) * n[i]);
    float *kbuf = take(sizeof(float) * 2 * Hkv * cap * hd), *vbuf = take(sizeof(float) * 2 * Hkv * cap * hd);
    int M;
    while (fread(&M, sizeof M, 1, stdin) == 1) {
        float *h = take(sizeof(float) * M * D), *cs = take(sizeof(float) * M * hd), *sn = take(sizeof(float) * M * hd);
        int *row = take(sizeof(int) * M), *col = take(sizeof(int) * M), *off = take(sizeof(int) * (M + 1));
        int *keys = take(sizeof(int) * off[M]);
        const int rc = fused_layer(bits, M, D, h, ln1, ln2, 1e-6f, w, b, F, H, Hkv, hd, 1.0f / __builtin_sqrtf((float)hd),
                                   cs, sn, kbuf, vbuf, cap, row, col, keys, off, threads);
        if (rc) { fprintf(stderr, "neon_driver: fused_layer returned %d\n", rc); return 3; }
        give(h, sizeof(float) * M * D);
        free(h); free(cs); free(sn); free(row); free(col); free(off); free(keys);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "info")) {
        printf("bfdot=%d quant_kind=%d width=%d\n", panel_neon_bfdot(), quant_kind(), panel_width());
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "attn")) return attn(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "fused")) return fused(argc, argv);
    if (argc != 5) { fprintf(stderr, "usage: neon_driver f32|bf16|q4|q8 K N threads\n"); return 2; }
    const char *op = argv[1];
    const long K = atol(argv[2]), N = atol(argv[3]);
    const int threads = atoi(argv[4]), bits = !strcmp(op, "q4") ? 4 : !strcmp(op, "q8") ? 8 : 0;
    void *w;
    if (bits) {
        w = take((size_t)(N / 32) * (K / 32) * quant_block_bytes(bits));
    } else if (!strcmp(op, "f32")) {
        float *raw = take(sizeof(float) * N * K);
        w = malloc(sizeof(float) * N * K);
        panel_pack(raw, N, K, w, threads);
        free(raw);
    } else if (!strcmp(op, "bf16")) {
        unsigned short *raw = take(sizeof(unsigned short) * N * K);
        w = malloc(sizeof(unsigned short) * N * K);
        panel_pack_bf16(raw, N, K, w, threads);
        free(raw);
    } else {
        fprintf(stderr, "neon_driver: op %s; allowed: f32, bf16, q4, q8, attn, fused, info\n", op);
        return 2;
    }
    float *bias = take(sizeof(float) * N);
    int M;
    while (fread(&M, sizeof M, 1, stdin) == 1) {
        float *x = take(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
        int rc = bits ? quant_linear(bits, x, M, K, w, N, bias, y, threads)
                : !strcmp(op, "f32") ? panel_linear(x, M, K, w, N, bias, y, threads)
                : panel_linear_bf16(x, M, K, w, N, bias, y, threads);
        if (rc) { fprintf(stderr, "neon_driver: %s kernel returned %d\n", op, rc); return 3; }
        give(y, sizeof(float) * M * N);
        free(x); free(y);
    }
    return 0;
}
