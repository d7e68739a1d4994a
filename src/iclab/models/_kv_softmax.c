/* Fused softmax attention with keys = values (iclab.models._categorical_fast: the Trained TF's first block).

   Per context b: o_j = Σ_i p_ij s_i, p_ij = softmax_i(q_jᵀ s_i), for M query rows q (M x 16) and n sources s (n x 16),
   float32, rows of 16 (the 15-wide (x; u) padded with a zero column). The backward takes g = dL/do and returns
   dq = dS s and the gradient of the source columns [c0, c0 + w) as (w x n), dsᵀ = qᵀ dS + gᵀ P, with dP = g sᵀ and
   the score gradient dS = P ⊙ (dP − Σ_i p_ij dP_ij) (torch's softmax backward). The forward leaves the unnormalised
   weights e_ij = exp(q_jᵀ s_i − max_i) in rows of np = n rounded up to 16 (zeros beyond n; streamed to memory past
   the caches) and 1 / Σ_i e_ij per row, for the backward (P = e / Σ e). Per block of 6 query rows, scores, softmax
   and products stay in L1 (no (M, n) temporaries). Denormals are flushed to zero inside the calls (values below
   1.2e-38, far under float32 rounding of the outputs). Built by iclab.core.native.load() with cc -O3 -mavx2 -mfma;
   torch code computes the same where it is absent. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "_avx_exp.h"

#define R 16 /* row width */
#define RB 6 /* query rows per block: 12 accumulators + 2 loads + 1 broadcast registers */

static inline float hmax(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps(a, a, 1)));
}

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_shuffle_ps(a, a, 1)));
}

#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define FMA2(r, ptr)                                                                                              \
    {                                                                                                             \
        __m256 av = _mm256_broadcast_ss(ptr);                                                                     \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                               \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                               \
    }
#define STORE2(r, ptr)                                                                                            \
    {                                                                                                             \
        _mm256_storeu_ps(ptr, c##r##0);                                                                           \
        _mm256_storeu_ps((ptr) + 8, c##r##1);                                                                     \
    }

/* out (RB x np) = a (RB x R) @ st (R x np), np a multiple of 16 */
static void rows_times_st(const float *a, const float *st, int np, float *out) {
    for (int i0 = 0; i0 < np; i0 += 16) {
        DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5)
        for (int k = 0; k < R; k++) {
            __m256 b0 = _mm256_loadu_ps(st + k * np + i0), b1 = _mm256_loadu_ps(st + k * np + i0 + 8);
            FMA2(0, a + k) FMA2(1, a + R + k) FMA2(2, a + 2 * R + k) FMA2(3, a + 3 * R + k)
            FMA2(4, a + 4 * R + k) FMA2(5, a + 5 * R + k)
        }
        STORE2(0, out + i0) STORE2(1, out + np + i0) STORE2(2, out + 2 * np + i0) STORE2(3, out + 3 * np + i0)
        STORE2(4, out + 4 * np + i0) STORE2(5, out + 5 * np + i0)
    }
}

/* out (RB x R) = w (RB x ldw) @ s (n x R) */
static void rows_times_s(const float *w, int ldw, const float *s, int n, float *out) {
    DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5)
    for (int i = 0; i < n; i++) {
        __m256 b0 = _mm256_loadu_ps(s + i * R), b1 = _mm256_loadu_ps(s + i * R + 8);
        FMA2(0, w + i) FMA2(1, w + ldw + i) FMA2(2, w + 2 * ldw + i) FMA2(3, w + 3 * ldw + i)
        FMA2(4, w + 4 * ldw + i) FMA2(5, w + 5 * ldw + i)
    }
    STORE2(0, out) STORE2(1, out + R) STORE2(2, out + 2 * R) STORE2(3, out + 3 * R) STORE2(4, out + 4 * R)
    STORE2(5, out + 5 * R)
}

/* st (R x np) = sᵀ, zero beyond n */
static void transpose_pad(const float *s, int n, int np, float *st) {
    for (int k = 0; k < R; k++) {
        for (int i = 0; i < n; i++) st[k * np + i] = s[i * R + k];
        for (int i = n; i < np; i++) st[k * np + i] = 0.0f;
    }
}

/* the block's rows j0 .. j0 + rows of src (stride R), zero-padded to RB rows when rows < RB */
static const float *block_rows(const float *src, int rows, float *pad) {
    if (rows == RB) return src;
    memset(pad, 0, sizeof(float) * RB * R);
    memcpy(pad, src, sizeof(float) * rows * R);
    return pad;
}

/* Forward for contexts [b0, b1) of q (B, M, R), s (B, n, R): o (B, M, R) and, unless NULL, e (B, M, np), inv (B, M). */
int kv_softmax_forward(int b0, int b1, int M, int n, const float *q, const float *s, float *e, float *inv,
                       float *o) {
    const int np = (n + 15) / 16 * 16;
    float *st = aligned_alloc(64, sizeof(float) * R * np), *sc = aligned_alloc(64, sizeof(float) * RB * np);
    if (!st || !sc) {
        free(st);
        free(sc);
        return 1;
    }
    float pad[RB * R], ot[RB * R], rinv[RB];
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    for (int b = b0; b < b1; b++) {
        const float *qb = q + (size_t)b * M * R, *sb = s + (size_t)b * n * R;
        transpose_pad(sb, n, np, st);
        for (int j0 = 0; j0 < M; j0 += RB) {
            const int rows = M - j0 < RB ? M - j0 : RB;
            rows_times_st(block_rows(qb + j0 * R, rows, pad), st, np, sc);
            for (int r = 0; r < RB; r++) {
                float *row = sc + r * np;
                if (r >= rows) { /* padded rows: weights 0 */
                    memset(row, 0, sizeof(float) * np);
                    rinv[r] = 0.0f;
                    continue;
                }
                for (int i = n; i < np; i++) row[i] = -INFINITY;
                __m256 mx = _mm256_set1_ps(-INFINITY);
                for (int i = 0; i < np; i += 8) mx = _mm256_max_ps(mx, _mm256_load_ps(row + i));
                const __m256 m = _mm256_set1_ps(hmax(mx));
                __m256 sum = _mm256_setzero_ps();
                float *erow = e ? e + ((size_t)b * M + j0 + r) * np : NULL;
                for (int i = 0; i < np; i += 8) {
                    __m256 v = exp_ps(_mm256_sub_ps(_mm256_load_ps(row + i), m));
                    sum = _mm256_add_ps(sum, v);
                    _mm256_store_ps(row + i, v);
                    if (erow) _mm256_stream_ps(erow + i, v);
                }
                rinv[r] = 1.0f / hsum(sum);
                if (inv) inv[(size_t)b * M + j0 + r] = rinv[r];
            }
            rows_times_s(sc, np, sb, n, ot); /* Σ_i e_ij s_i, then ÷ Σ_i e_ij */
            float *ob = o + ((size_t)b * M + j0) * R;
            for (int r = 0; r < rows; r++) {
                const __m256 f = _mm256_set1_ps(rinv[r]);
                _mm256_storeu_ps(ob + r * R, _mm256_mul_ps(_mm256_loadu_ps(ot + r * R), f));
                _mm256_storeu_ps(ob + r * R + 8, _mm256_mul_ps(_mm256_loadu_ps(ot + r * R + 8), f));
            }
        }
    }
    _mm_sfence(); /* the streamed weights are visible before the backward reads them */
    _mm_setcsr(csr);
    free(st);
    free(sc);
    return 0;
}

/* Backward for contexts [b0, b1) given g (B, M, R), e and inv from the forward: dq (B, M, R) unless NULL and
   dst (B, w, n), the gradient of s's columns [c0, c0 + w). */
int kv_softmax_backward(int b0, int b1, int M, int n, int c0, int w, const float *q, const float *s, const float *e,
                        const float *inv, const float *g, float *dq, float *dst) {
    const int np = (n + 15) / 16 * 16;
    float *st = aligned_alloc(64, sizeof(float) * R * np), *ds = aligned_alloc(64, sizeof(float) * RB * np);
    float *pp = aligned_alloc(64, sizeof(float) * RB * np), *acc = aligned_alloc(64, sizeof(float) * R * np);
    if (!st || !ds || !pp || !acc) {
        free(st);
        free(ds);
        free(pp);
        free(acc);
        return 1;
    }
    float pad[RB * R], ot[RB * R];
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    for (int b = b0; b < b1; b++) {
        const float *qb = q + (size_t)b * M * R, *sb = s + (size_t)b * n * R, *gb = g + (size_t)b * M * R;
        const float *eb = e + (size_t)b * M * np;
        transpose_pad(sb, n, np, st);
        memset(acc, 0, sizeof(float) * w * np);
        for (int j0 = 0; j0 < M; j0 += RB) {
            const int rows = M - j0 < RB ? M - j0 : RB;
            rows_times_st(block_rows(gb + j0 * R, rows, pad), st, np, ds); /* dP = g sᵀ */
            for (int r = 0; r < RB; r++) {
                float *dr = ds + r * np, *pr = pp + r * np;
                if (r >= rows) { /* padded rows: zero probabilities and score gradients */
                    memset(dr, 0, sizeof(float) * np);
                    memset(pr, 0, sizeof(float) * np);
                    continue;
                }
                const float *erow = eb + (size_t)(j0 + r) * np;
                const __m256 f = _mm256_set1_ps(inv[(size_t)b * M + j0 + r]);
                __m256 dv = _mm256_setzero_ps();
                for (int i = 0; i < np; i += 8) {
                    __m256 pv = _mm256_mul_ps(_mm256_load_ps(erow + i), f);
                    _mm256_store_ps(pr + i, pv);
                    dv = _mm256_fmadd_ps(pv, _mm256_load_ps(dr + i), dv);
                }
                const __m256 d = _mm256_set1_ps(hsum(dv)); /* Σ_i p_ij dP_ij, as torch's softmax backward */
                for (int i = 0; i < np; i += 8)
                    _mm256_store_ps(dr + i,
                                    _mm256_mul_ps(_mm256_load_ps(pr + i), _mm256_sub_ps(_mm256_load_ps(dr + i), d)));
            }
            if (dq) {
                rows_times_s(ds, np, sb, n, ot); /* dq = dS s */
                memcpy(dq + ((size_t)b * M + j0) * R, ot, sizeof(float) * rows * R);
            }
            for (int c = 0; c < w; c++) { /* acc[c] += Σ_r q[r][c0 + c] dS[r] + g[r][c0 + c] P[r] */
                __m256 qa[RB], ga[RB];
                for (int r = 0; r < RB; r++) {
                    qa[r] = _mm256_set1_ps(r < rows ? qb[(j0 + r) * R + c0 + c] : 0.0f);
                    ga[r] = _mm256_set1_ps(r < rows ? gb[(j0 + r) * R + c0 + c] : 0.0f);
                }
                float *ac = acc + c * np;
                for (int i = 0; i < np; i += 8) {
                    __m256 a = _mm256_loadu_ps(ac + i);
                    for (int r = 0; r < RB; r++) {
                        a = _mm256_fmadd_ps(qa[r], _mm256_loadu_ps(ds + r * np + i), a);
                        a = _mm256_fmadd_ps(ga[r], _mm256_loadu_ps(pp + r * np + i), a);
                    }
                    _mm256_storeu_ps(ac + i, a);
                }
            }
        }
        for (int c = 0; c < w; c++) memcpy(dst + ((size_t)b * w + c) * n, acc + c * np, sizeof(float) * n);
    }
    _mm_setcsr(csr);
    free(st);
    free(ds);
    free(pp);
    free(acc);
    return 0;
}

/* Softmax cross-attention to a few keys (the GD model's cross-attention to the class embeddings, eq. 38-43):
   o_j = Σ_c p_jc v_c, p_jc = softmax_c(k_cᵀ q_j), rows j in [r0, r1) of q (rows x dk), keys (nc x dk), values
   (nc x dm), o (rows x dm), float32, dk, dm ≤ XK and nc ≤ XC. Eight rows run along the vector lanes (a ragged last
   block padded with zero rows), the classes one after another, so no horizontal sums or dependent chains per row;
   nothing (rows x nc) is stored: the backward recomputes p from q. */
#define XK 16
#define XC 64

/* the rows [j0, j0 + rows) of a (· x w) row-major matrix, transposed into w vectors of 8 lanes (0 past rows) */
static void lanes_in(const float *a, int j0, int rows, int w, __m256 *out) {
    float t[XK * 8] = {0};
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) t[c * 8 + r] = a[(size_t)(j0 + r) * w + c];
    for (int c = 0; c < w; c++) out[c] = _mm256_loadu_ps(t + c * 8);
}

static void lanes_out(const __m256 *v, int j0, int rows, int w, float *a) {
    float t[XK * 8];
    for (int c = 0; c < w; c++) _mm256_storeu_ps(t + c * 8, v[c]);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) a[(size_t)(j0 + r) * w + c] = t[c * 8 + r];
}

/* p[c] = softmax_c(k_cᵀ q) for the 8 rows in qv (dk vectors) */
static void cross_probs(int nc, int dk, const float *keys, const __m256 *qv, __m256 *p) {
    __m256 mx = _mm256_set1_ps(-INFINITY), sum = _mm256_setzero_ps();
    for (int c = 0; c < nc; c++) {
        __m256 acc = _mm256_mul_ps(qv[0], _mm256_set1_ps(keys[c * dk]));
        for (int a = 1; a < dk; a++) acc = _mm256_fmadd_ps(qv[a], _mm256_set1_ps(keys[c * dk + a]), acc);
        p[c] = acc;
        mx = _mm256_max_ps(mx, acc);
    }
    for (int c = 0; c < nc; c++) {
        p[c] = exp_ps(_mm256_sub_ps(p[c], mx));
        sum = _mm256_add_ps(sum, p[c]);
    }
    const __m256 f = _mm256_div_ps(_mm256_set1_ps(1.0f), sum);
    for (int c = 0; c < nc; c++) p[c] = _mm256_mul_ps(p[c], f);
}

int cross_softmax_forward(int r0, int r1, int nc, int dk, int dm, const float *q, const float *keys,
                          const float *values, float *o) {
    if (dk > XK || dm > XK || nc > XC || dk < 1) return 2;
    __m256 qv[XK], p[XC], ov[XK];
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    for (int j0 = r0; j0 < r1; j0 += 8) {
        const int rows = r1 - j0 < 8 ? r1 - j0 : 8;
        lanes_in(q, j0, rows, dk, qv);
        cross_probs(nc, dk, keys, qv, p);
        for (int b = 0; b < dm; b++) ov[b] = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++)
            for (int b = 0; b < dm; b++) ov[b] = _mm256_fmadd_ps(p[c], _mm256_set1_ps(values[c * dm + b]), ov[b]);
        lanes_out(ov, j0, rows, dm, o);
    }
    _mm_setcsr(csr);
    return 0;
}

/* Backward for rows [r0, r1) given g = dL/do (rows x dm): dq (rows x dk), and this slice's share of the keys' and
   values' gradients, transposed and padded: dkt (dk x np), dvt (dm x np), np = nc rounded up to 8 (overwritten).
   dP = g Vᵀ, dS = P ⊙ (dP − Σ_c p_c dP_c) (torch's softmax backward), dq = dS K, dK = dSᵀ q, dV = Pᵀ g; the
   keys' and values' gradients are summed per lane and the lanes added at the end. */
int cross_softmax_backward(int r0, int r1, int nc, int dk, int dm, const float *q, const float *keys,
                           const float *values, const float *g, float *dq, float *dkt, float *dvt) {
    if (dk > XK || dm > XK || nc > XC || dk < 1) return 2;
    const int np = (nc + 7) / 8 * 8;
    __m256 *acc_k = aligned_alloc(32, sizeof(__m256) * nc * dk), *acc_v = aligned_alloc(32, sizeof(__m256) * nc * dm);
    if (!acc_k || !acc_v) {
        free(acc_k);
        free(acc_v);
        return 1;
    }
    for (int i = 0; i < nc * dk; i++) acc_k[i] = _mm256_setzero_ps();
    for (int i = 0; i < nc * dm; i++) acc_v[i] = _mm256_setzero_ps();
    __m256 qv[XK], gv[XK], p[XC], ds[XC], dqv[XK];
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    for (int j0 = r0; j0 < r1; j0 += 8) {
        const int rows = r1 - j0 < 8 ? r1 - j0 : 8;
        lanes_in(q, j0, rows, dk, qv);
        lanes_in(g, j0, rows, dm, gv); /* padded rows: g = 0, so they add nothing */
        cross_probs(nc, dk, keys, qv, p);
        __m256 dot = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) {
            __m256 dp = _mm256_mul_ps(gv[0], _mm256_set1_ps(values[c * dm]));
            acc_v[c * dm] = _mm256_fmadd_ps(p[c], gv[0], acc_v[c * dm]);
            for (int b = 1; b < dm; b++) {
                dp = _mm256_fmadd_ps(gv[b], _mm256_set1_ps(values[c * dm + b]), dp);
                acc_v[c * dm + b] = _mm256_fmadd_ps(p[c], gv[b], acc_v[c * dm + b]);
            }
            ds[c] = dp;
            dot = _mm256_fmadd_ps(p[c], dp, dot);
        }
        for (int a = 0; a < dk; a++) dqv[a] = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const __m256 d = _mm256_mul_ps(p[c], _mm256_sub_ps(ds[c], dot));
            for (int a = 0; a < dk; a++) {
                dqv[a] = _mm256_fmadd_ps(d, _mm256_set1_ps(keys[c * dk + a]), dqv[a]);
                acc_k[c * dk + a] = _mm256_fmadd_ps(d, qv[a], acc_k[c * dk + a]);
            }
        }
        lanes_out(dqv, j0, rows, dk, dq);
    }
    memset(dkt, 0, sizeof(float) * dk * np);
    memset(dvt, 0, sizeof(float) * dm * np);
    for (int c = 0; c < nc; c++) {
        for (int a = 0; a < dk; a++) dkt[a * np + c] = hsum(acc_k[c * dk + a]);
        for (int b = 0; b < dm; b++) dvt[b * np + c] = hsum(acc_v[c * dm + b]);
    }
    _mm_setcsr(csr);
    free(acc_k);
    free(acc_v);
    return 0;
}
