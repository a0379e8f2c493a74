/* The torch engine's decode step, all but its matrix products, in float32 with AVX-512 or, where
 * the CPU has none, AVX2 and FMA (rlonce/engine/fast/native.py builds this file with -march=native
 * and calls it; decode.py says when):
 *
 * - rl_attend: one query per row and head against the row's cached keys and values. For each row
 *   b and key/value head h, the G query heads that read h are scored against the N cached keys,
 *   the row's mask added as a bias (0 or -inf), softmax-ed and used to weigh the N cached values;
 *   given the rotary tables, the queries are rotated (and scaled) first and so is each row's newest
 *   key, in the cache. torch's batched products spend most of their time per small matrix at these
 *   shapes (3x32 by 32xN, 96 of them a layer on the embedded model), which this loop does not.
 * - rl_rms_norm: RMSNorm of rows.
 * - rl_silu_mul: the gated MLP's silu(gate) * up, in place.
 *
 * Each replaces several torch operations, whose per-call cost is most of a small model's step.
 * Exact to float32 rounding; exp is Cephes' single-precision polynomial. The two instruction sets
 * share everything but the vector loops (attend_one, rms_row, silu_span), which add in different
 * orders: their results differ in the last bits. rl_ready() says which was compiled (512, 256), or
 * 0 without either: then the engine keeps torch's operations.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __AVX512F__
#include <immintrin.h>

/* exp of 16 lanes within [-87, 88]: Cephes' polynomial after taking out k ln 2, scaled back by 2^k */
static inline __m512 exp_poly16(__m512 c)
{
    __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), c);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, k);
}

/* exp of 16 lanes, each <= 0 or -inf (which gives exactly 0) */
static inline __m512 exp_nonpos16(__m512 x)
{
    __mmask16 finite = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm512_maskz_mov_ps(finite, exp_poly16(_mm512_max_ps(x, _mm512_set1_ps(-87.0f))));
}

/* The lane sums of v[0..15], in order: a transpose folded into adds. */
static inline __m512 sums16(const __m512 *v)
{
    __m512 u[8], w[4];
    for (int i = 0; i < 8; i++)
        u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(u[2 * i]), b = _mm512_castps_pd(u[2 * i + 1]);
        w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
    __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

static inline __mmask16 live(int64_t left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }

/* q's dot product with the key at kr, as 16 partial sums (D/16 chunks of 16) */
static inline __attribute__((always_inline)) __m512 dot16(const __m512 *qv, const float *kr, const int C)
{
    __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    for (int c = 1; c < C; c++) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), a);
    return a;
}

/* One row and key/value head: q (G x D), keys and values N x D with row strides kn, vn, bias N
 * (or NULL), out G x D; s holds G x N scores. D is a constant where this is inlined. */
static inline __attribute__((always_inline)) void attend_one(
    const float *restrict q, const float *restrict K, const float *restrict V, const float *restrict bias,
    float *restrict out, float *restrict s, int64_t G, int64_t N, const int D, int64_t kn, int64_t vn)
{
    const int C = D / 16, U = D >= 64 ? 1 : 64 / D; /* U accumulators hide the multiply-add's latency */
    for (int64_t g = 0; g < G; g++) { /* scores, 16 keys at a time */
        __m512 qv[8], p[16];
        float *sg = s + g * N;
        for (int c = 0; c < C; c++) qv[c] = _mm512_loadu_ps(q + g * D + 16 * c);
        int64_t n = 0;
        for (; n + 16 <= N; n += 16) {
            for (int j = 0; j < 16; j++) p[j] = dot16(qv, K + (n + j) * kn, C);
            __m512 t = sums16(p);
            _mm512_storeu_ps(sg + n, bias ? _mm512_add_ps(t, _mm512_loadu_ps(bias + n)) : t);
        }
        for (; n < N; n++) sg[n] = _mm512_reduce_add_ps(dot16(qv, K + n * kn, C)) + (bias ? bias[n] : 0.0f);
    }
    for (int64_t g = 0; g < G; g++) { /* softmax; a tail's spare lanes read -inf */
        float *sg = s + g * N;
        const __m512 ninf = _mm512_set1_ps(-INFINITY);
        __m512 mx = ninf, tot = _mm512_setzero_ps();
        for (int64_t n = 0; n < N; n += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, live(N - n), sg + n));
        __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        for (int64_t n = 0; n < N; n += 16) {
            __m512 e = exp_nonpos16(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, live(N - n), sg + n), top));
            _mm512_mask_storeu_ps(sg + n, live(N - n), e);
            tot = _mm512_add_ps(tot, e);
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(tot));
        for (int64_t n = 0; n < N; n += 16)
            _mm512_mask_storeu_ps(sg + n, live(N - n), _mm512_mul_ps(_mm512_maskz_loadu_ps(live(N - n), sg + n), inv));
    }
    for (int64_t g = 0; g < G; g++) { /* weighted values */
        __m512 acc[4][8];
        const float *sg = s + g * N;
        for (int u = 0; u < U; u++)
            for (int c = 0; c < C; c++) acc[u][c] = _mm512_setzero_ps();
        int64_t n = 0;
        for (; n + U <= N; n += U)
            for (int u = 0; u < U; u++) {
                __m512 w = _mm512_set1_ps(sg[n + u]);
                for (int c = 0; c < C; c++)
                    acc[u][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(V + (n + u) * vn + 16 * c), acc[u][c]);
            }
        for (; n < N; n++) {
            __m512 w = _mm512_set1_ps(sg[n]);
            for (int c = 0; c < C; c++) acc[0][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(V + n * vn + 16 * c), acc[0][c]);
        }
        for (int u = 1; u < U; u++)
            for (int c = 0; c < C; c++) acc[0][c] = _mm512_add_ps(acc[0][c], acc[u][c]);
        for (int c = 0; c < C; c++) _mm512_storeu_ps(out + g * D + 16 * c, acc[0][c]);
    }
}

/* out = x / sqrt(mean(x^2) + eps) * w over H floats */
static inline void rms_row(const float *restrict xr, const float *restrict w, float *restrict out, int64_t H, float eps)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < H; i += 16) {
        __m512 t = _mm512_maskz_loadu_ps(live(H - i), xr + i);
        acc = _mm512_fmadd_ps(t, t, acc);
    }
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)H + eps));
    for (int64_t i = 0; i < H; i += 16)
        _mm512_mask_storeu_ps(out + i, live(H - i),
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live(H - i), xr + i), inv),
                                            _mm512_maskz_loadu_ps(live(H - i), w + i)));
}

/* g = silu(g) * u = g / (1 + exp(-g)) * u for the 16 floats at i (fewer at the end of n), in place */
static inline void silu_span(float *g, const float *u, int64_t i, int64_t n)
{
    __mmask16 m = live(n - i);
    __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    __m512 e = exp_poly16(_mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-87.0f)),
                                        _mm512_set1_ps(88.0f)));
    __m512 y = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, u + i)));
}

#define LANES 16
#define ISA 512
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* exp of 8 lanes within [-87, 88]: exp_poly16's polynomial; 2^k put into the exponent bits */
static inline __m256 exp_poly8(__m256 c)
{
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(c, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), c);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e)); /* k is within [-126, 127]: 2^k is a normal float */
}

/* exp of 8 lanes, each <= 0 or -inf (which gives exactly 0) */
static inline __m256 exp_nonpos8(__m256 x)
{
    __m256 finite = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm256_and_ps(finite, exp_poly8(_mm256_max_ps(x, _mm256_set1_ps(-87.0f))));
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* The lane sums of v[0..7], in order: pairwise adds, then the two 128-bit halves added. */
static inline __m256 sums8(const __m256 *v)
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* the lanes below left (all 8 from 8 up), as a mask for maskload/maskstore */
static inline __m256i live(int64_t left)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left >= 8 ? 8 : (int)left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 lanes at p, the lanes at and after left read as `fill` */
static inline __m256 load_or(const float *p, int64_t left, __m256 fill)
{
    __m256i m = live(left);
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

/* q's dot product with the key at kr, as 8 partial sums (D/8 chunks of 8) */
static inline __attribute__((always_inline)) __m256 dot8(const __m256 *qv, const float *kr, const int C)
{
    __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kr));
    for (int c = 1; c < C; c++) a = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kr + 8 * c), a);
    return a;
}

/* attend_one of the AVX-512 loop above, in 8 lanes */
static inline __attribute__((always_inline)) void attend_one(
    const float *restrict q, const float *restrict K, const float *restrict V, const float *restrict bias,
    float *restrict out, float *restrict s, int64_t G, int64_t N, const int D, int64_t kn, int64_t vn)
{
    const int C = D / 8, U = D >= 64 ? 1 : 64 / D;
    for (int64_t g = 0; g < G; g++) { /* scores, 8 keys at a time */
        __m256 qv[16], p[8];
        float *sg = s + g * N;
        for (int c = 0; c < C; c++) qv[c] = _mm256_loadu_ps(q + g * D + 8 * c);
        int64_t n = 0;
        for (; n + 8 <= N; n += 8) {
            for (int j = 0; j < 8; j++) p[j] = dot8(qv, K + (n + j) * kn, C);
            __m256 t = sums8(p);
            _mm256_storeu_ps(sg + n, bias ? _mm256_add_ps(t, _mm256_loadu_ps(bias + n)) : t);
        }
        for (; n < N; n++) sg[n] = hsum8(dot8(qv, K + n * kn, C)) + (bias ? bias[n] : 0.0f);
    }
    for (int64_t g = 0; g < G; g++) { /* softmax; a tail's spare lanes read -inf */
        float *sg = s + g * N;
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        __m256 mx = ninf, tot = _mm256_setzero_ps();
        for (int64_t n = 0; n < N; n += 8) mx = _mm256_max_ps(mx, load_or(sg + n, N - n, ninf));
        __m256 top = _mm256_set1_ps(hmax8(mx));
        for (int64_t n = 0; n < N; n += 8) {
            __m256 e = exp_nonpos8(_mm256_sub_ps(load_or(sg + n, N - n, ninf), top));
            _mm256_maskstore_ps(sg + n, live(N - n), e);
            tot = _mm256_add_ps(tot, e);
        }
        __m256 inv = _mm256_set1_ps(1.0f / hsum8(tot));
        for (int64_t n = 0; n < N; n += 8)
            _mm256_maskstore_ps(sg + n, live(N - n), _mm256_mul_ps(_mm256_maskload_ps(sg + n, live(N - n)), inv));
    }
    for (int64_t g = 0; g < G; g++) { /* weighted values */
        __m256 acc[4][16];
        const float *sg = s + g * N;
        for (int u = 0; u < U; u++)
            for (int c = 0; c < C; c++) acc[u][c] = _mm256_setzero_ps();
        int64_t n = 0;
        for (; n + U <= N; n += U)
            for (int u = 0; u < U; u++) {
                __m256 w = _mm256_set1_ps(sg[n + u]);
                for (int c = 0; c < C; c++)
                    acc[u][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(V + (n + u) * vn + 8 * c), acc[u][c]);
            }
        for (; n < N; n++) {
            __m256 w = _mm256_set1_ps(sg[n]);
            for (int c = 0; c < C; c++) acc[0][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(V + n * vn + 8 * c), acc[0][c]);
        }
        for (int u = 1; u < U; u++)
            for (int c = 0; c < C; c++) acc[0][c] = _mm256_add_ps(acc[0][c], acc[u][c]);
        for (int c = 0; c < C; c++) _mm256_storeu_ps(out + g * D + 8 * c, acc[0][c]);
    }
}

/* out = x / sqrt(mean(x^2) + eps) * w over H floats */
static inline void rms_row(const float *restrict xr, const float *restrict w, float *restrict out, int64_t H, float eps)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < H; i += 8) {
        __m256 t = _mm256_maskload_ps(xr + i, live(H - i));
        acc = _mm256_fmadd_ps(t, t, acc);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum8(acc) / (float)H + eps));
    for (int64_t i = 0; i < H; i += 8) {
        __m256i m = live(H - i);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(xr + i, m), inv),
                                                      _mm256_maskload_ps(w + i, m)));
    }
}

/* g = silu(g) * u = g / (1 + exp(-g)) * u for the 8 floats at i (fewer at the end of n), in place */
static inline void silu_span(float *g, const float *u, int64_t i, int64_t n)
{
    __m256i m = live(n - i);
    __m256 x = _mm256_maskload_ps(g + i, m);
    __m256 e = exp_poly8(_mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(-87.0f)),
                                       _mm256_set1_ps(88.0f)));
    __m256 y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(y, _mm256_maskload_ps(u + i, m)));
}

#define LANES 8
#define ISA 256
#endif

#ifdef ISA
/* x (D) rotated in place: x * cos + rotate_half(x) * sin (rotate_half(x) = (-x2, x1) for the
 * halves x1, x2), times scale */
static inline void rope(float *restrict x, const float *restrict cs, const float *restrict sn, int64_t D, float scale)
{
    float t[128];
    const int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) t[i] = (x[i] * cs[i] - x[i + h] * sn[i]) * scale;
    for (int64_t i = h; i < D; i++) t[i] = (x[i] * cs[i] + x[i - h] * sn[i]) * scale;
    for (int64_t i = 0; i < D; i++) x[i] = t[i];
}

int rl_ready(void) { return ISA; }

/* q and out: (B, H, G, D) contiguous; keys and values: (B, H, N, D) with the given strides of
 * their first three dimensions (the last is contiguous); bias: (B, N) with row stride bsb, or
 * NULL. cs, sn: NULL (q is rotated and scaled already), or the rotary tables (B, D): then each
 * query is rotated and multiplied by scale, and each row's last key (column N - 1) is rotated in
 * place first. Returns 0, 1 when out of memory, 2 for a head size it was not built for. */
int rl_attend(const float *q, float *k, const float *v, const float *bias, float *out,
              const float *cs, const float *sn, float scale,
              int64_t B, int64_t H, int64_t G, int64_t N, int64_t D,
              int64_t ksb, int64_t ksh, int64_t kn, int64_t vsb, int64_t vsh, int64_t vn, int64_t bsb)
{
    if (D % 16 != 0 || D < 16 || D > 128) return 2;
    int failed = 0;
    /* rows split over the calling thread's OpenMP team (torch's own libgomp: native.py builds with
       -fopenmp only then), each thread with its own scores and rotated queries; small calls stay
       on one thread */
#pragma omp parallel if (B * H * G * N >= 8192)
    {
        float *s = malloc(sizeof(float) * (size_t)(G * N + G * D));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H && s; h++) {
                const float *qq = q + (b * H + h) * G * D, *V = v + b * vsb + h * vsh;
                float *K = k + b * ksb + h * ksh;
                if (cs) {
                    float *r = s + G * N;
                    for (int64_t i = 0; i < G * D; i++) r[i] = qq[i];
                    for (int64_t g = 0; g < G; g++) rope(r + g * D, cs + b * D, sn + b * D, D, scale);
                    rope(K + (N - 1) * kn, cs + b * D, sn + b * D, D, 1.0f);
                    qq = r;
                }
                const float *bb = bias ? bias + b * bsb : NULL;
                float *oo = out + (b * H + h) * G * D;
                switch (D) { /* a constant head size unrolls the chunk loops */
                case 16: attend_one(qq, K, V, bb, oo, s, G, N, 16, kn, vn); break;
                case 32: attend_one(qq, K, V, bb, oo, s, G, N, 32, kn, vn); break;
                case 48: attend_one(qq, K, V, bb, oo, s, G, N, 48, kn, vn); break;
                case 64: attend_one(qq, K, V, bb, oo, s, G, N, 64, kn, vn); break;
                case 80: attend_one(qq, K, V, bb, oo, s, G, N, 80, kn, vn); break;
                case 96: attend_one(qq, K, V, bb, oo, s, G, N, 96, kn, vn); break;
                case 112: attend_one(qq, K, V, bb, oo, s, G, N, 112, kn, vn); break;
                default: attend_one(qq, K, V, bb, oo, s, G, N, 128, kn, vn); break;
                }
            }
        free(s);
    }
    return failed;
}


/* out[b] = x[b] / sqrt(mean(x[b]^2) + eps) * w for B rows of H (row stride xs); out contiguous */
void rl_rms_norm(const float *x, const float *w, float *out, int64_t B, int64_t H, int64_t xs, float eps)
{
#pragma omp parallel for schedule(static) if (B * H >= 65536)
    for (int64_t b = 0; b < B; b++) rms_row(x + b * xs, w, out + b * H, H, eps);
}

/* g = silu(g) * u = g / (1 + exp(-g)) * u over n floats, in place */
void rl_silu_mul(float *g, const float *u, int64_t n)
{
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i += LANES) silu_span(g, u, i, n);
}
#else
int rl_ready(void) { return 0; }

int rl_attend(const float *q, float *k, const float *v, const float *bias, float *out,
              const float *cs, const float *sn, float scale,
              int64_t B, int64_t H, int64_t G, int64_t N, int64_t D,
              int64_t ksb, int64_t ksh, int64_t kn, int64_t vsb, int64_t vsh, int64_t vn, int64_t bsb)
{
    return 3; /* built without AVX-512 or AVX2 */
}

void rl_rms_norm(const float *x, const float *w, float *out, int64_t B, int64_t H, int64_t xs, float eps) {}

void rl_silu_mul(float *g, const float *u, int64_t n) {}
#endif
