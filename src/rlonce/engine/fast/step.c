/* The torch engine's decode step, all but its matrix products, in float32 with AVX-512
 * (rlonce/engine/fast/native.py builds this file and calls it; decode.py says when):
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
 * Exact to float32 rounding; exp is Cephes' single-precision polynomial. Compiled without AVX-512,
 * rl_ready() says 0 and the engine keeps torch's operations.
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

int rl_ready(void) { return 1; }

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
    for (int64_t b = 0; b < B; b++) {
        const float *xr = x + b * xs;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < H; i += 16) {
            __m512 t = _mm512_maskz_loadu_ps(live(H - i), xr + i);
            acc = _mm512_fmadd_ps(t, t, acc);
        }
        __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)H + eps));
        for (int64_t i = 0; i < H; i += 16)
            _mm512_mask_storeu_ps(out + b * H + i, live(H - i),
                                  _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live(H - i), xr + i), inv),
                                                _mm512_maskz_loadu_ps(live(H - i), w + i)));
    }
}

/* g = silu(g) * u = g / (1 + exp(-g)) * u over n floats, in place */
void rl_silu_mul(float *g, const float *u, int64_t n)
{
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = live(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp_poly16(_mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-87.0f)),
                                            _mm512_set1_ps(88.0f)));
        __m512 y = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, u + i)));
    }
}
#else
int rl_ready(void) { return 0; }

int rl_attend(const float *q, float *k, const float *v, const float *bias, float *out,
              const float *cs, const float *sn, float scale,
              int64_t B, int64_t H, int64_t G, int64_t N, int64_t D,
              int64_t ksb, int64_t ksh, int64_t kn, int64_t vsb, int64_t vsh, int64_t vn, int64_t bsb)
{
    return 3; /* built without AVX-512 */
}

void rl_rms_norm(const float *x, const float *w, float *out, int64_t B, int64_t H, int64_t xs, float eps) {}

void rl_silu_mul(float *g, const float *u, int64_t n) {}
#endif
