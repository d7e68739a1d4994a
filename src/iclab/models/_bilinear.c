/* The bilinear transformer of Sun, Jadbabaie, Azizan 2025 (eq. (2)-(3)) with its backward, W prompts at a time in
   the lanes of a vector: iclab.models._bilinear_fast runs it where it can be built, and computes the same numbers by
   torch code elsewhere.

   A prompt is T = n + 1 tokens z_t of DIM = d̄ + 1 entries (context t < n, the query t = n). Sub-layer l is
     an FFN (kinds[l] = 0):        z_t[:d̄] += (W_0 z_t[:d̄]) ⊙ (W_1 z_t[:d̄]), the label entry d̄ passes (eq. 3);
     an attention layer (kinds = 1): z_t ← R z_t for every token, R = I + Σ_h P_h G Q_h / n, G = Σ_{t<n} z_t z_tᵀ,
   which is eq. (2) in its moment form. The output is the query's label entry after the last sub-layer, which is an
   attention layer (the caller drops any FFN after it); that layer updates the query alone. Weights: one flat array,
   sub-layer l at wts + off[l]: W_0 then W_1 (d̄ x d̄ each) or P then Q (H x DIM x DIM each), row-major.

   Prompts sit in the lanes: a group's tokens are T x DIM vectors, so every per-prompt quantity (G, R, their
   adjoints) is a DIM x DIM array of vectors and nothing is summed across lanes until a call's weight gradients are
   reduced, in a fixed order. bl_forward_* keeps nothing; bl_backward_* replays the forward per group, keeping each
   sub-layer's input (L x T x DIM vectors, in cache), then walks the layers back. It adds dL/d(weights) for
   dL/d(out) = gout into gw (the same layout as wts).

   bl_jacobian_* runs the backward inside the forward instead, for dL/d(out) = 1 in every lane, and writes each
   prompt's d out / d(weights) (lanes, one row per group); bl_vjp_* is then the whole backward of the step: a product
   with the output gradient, no replay. bl_embed_* writes the prompt itself (eq. (1)) from the episode's x, x_q, y.

   Denormals are flushed to zero inside the calls. DIM is a compile-time constant (-DDIM=13): every DIM-long loop is
   unrolled and its vectors stay in registers.
   LIVE (-DLIVE=d+1): a first FFN reads the prompt's first LIVE entries alone (the others are scratch zeros).
   The lane count is the target's: 16 floats with AVX-512, else 8 (AVX2); doubles half that. Compiled as two
   instances by including itself: float32 (suffix _f32) and float64 (_f64). Built by iclab.core.native.load(). */
#ifndef PER_REAL
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#ifndef DIM
#error "compile with -DDIM=<tokens' width>"
#endif
#define DB (DIM - 1)
#ifndef LIVE
#define LIVE DB /* the prompt's live entries: a first FFN reads x[:LIVE] (-DLIVE=d+1; the rest are scratch zeros) */
#endif
#if LIVE < 1 || LIVE > DB
#error "LIVE must be in 1 … DIM - 1"
#endif
#include "_lanes.h" /* VBYTES */
enum { TILE = 24 }; /* tokens per tile of the passes that sum over tokens (their operands stay in L1) */

int bl_lanes_f32(void) { return VBYTES / 4; }
int bl_lanes_f64(void) { return VBYTES / 8; }

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else /* one instance for the real type of PER_REAL */

#include "../core/_per_real.h"
#undef SPLAT
#undef GATHER
#undef LANE_INDEX
/* SPLAT(w): w in every lane; GATHER(p, idx): lane l = p[idx[l]], idx from LANE_INDEX(stride) = (l * stride)_l */
#if PER_REAL == 32
#if VBYTES == 64
#define SPLAT(w) ((vec)_mm512_set1_ps(w))
#define LANE_INDEX(s)                                                                                                \
    _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(s))
#define GATHER(p, idx) ((vec)_mm512_i32gather_ps(idx, p, 4))
#else
#define SPLAT(w) ((vec)_mm256_set1_ps(w))
#define LANE_INDEX(s) _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s))
#define GATHER(p, idx) ((vec)_mm256_i32gather_ps(p, idx, 4))
#endif
#else
#if VBYTES == 64
#define SPLAT(w) ((vec)_mm512_set1_pd(w))
#define LANE_INDEX(s) _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s))
#define GATHER(p, idx) ((vec)_mm512_i32gather_pd(idx, p, 8))
#else
#define SPLAT(w) ((vec)_mm256_set1_pd(w))
#define LANE_INDEX(s) _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(s))
#define GATHER(p, idx) ((vec)_mm256_i32gather_pd(p, idx, 8))
#endif
#endif
#include "_lanes.h" /* vec, W */
#define UNROLL _Pragma("GCC unroll 32")

/* ---- the group's tokens ------------------------------------------------------------------------------------ */

/* z0 (B, T, DIM) rows b0 … b0 + m − 1 into X (T x DIM vectors); lanes m … W − 1 are zero. A full group is gathered,
   one vector per entry. */
static void NAME(load_group)(const real *z0, long b0, int m, int T, vec *X) {
    if (m == W) {
        const real *p = z0 + b0 * (long)T * DIM;
        const int count = T * DIM;
        for (int i = 0; i < count; i++) X[i] = GATHER(p + i, LANE_INDEX(count));
        return;
    }
    memset(X, 0, sizeof(vec) * (size_t)T * DIM);
    for (int l = 0; l < m; l++) {
        const real *p = z0 + (b0 + l) * (long)T * DIM;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < DIM; r++) X[t * DIM + r][l] = p[t * DIM + r];
    }
}

/* ---- forward sub-layers (Y = layer(X), Y may be X) ----------------------------------------------------------- */

/* a, b of one token: a = W_0 x[:K], b = W_1 x[:K] (columns :K of the d̄ x d̄ weights; x[K:d̄] is zero) */
static inline __attribute__((always_inline)) void NAME(ffn_ab)(const vec *x, const real *W0, const real *W1, vec *a,
                                                              vec *b, const int K) {
    vec x0 = x[0]; /* inputs outer, the 2 d̄ sums in registers: each FMA independent of the next 2 d̄ - 1 */
    UNROLL for (int o = 0; o < DB; o++) {
        a[o] = x0 * W0[o * DB];
        b[o] = x0 * W1[o * DB];
    }
    UNROLL for (int j = 1; j < K; j++) {
        vec xj = x[j];
        UNROLL for (int o = 0; o < DB; o++) {
            a[o] += xj * W0[o * DB + j];
            b[o] += xj * W1[o * DB + j];
        }
    }
}

/* Y = FFN(X) for T tokens (Y may be X); K: the live columns, DB or LIVE */
static inline __attribute__((always_inline)) void NAME(ffn_tokens)(const vec *X, vec *Y, int T, const real *W0,
                                                                  const real *W1, const int K) {
    for (int t = 0; t < T; t++) {
        const vec *x = X + t * DIM;
        vec *y = Y + t * DIM, a[DB], b[DB];
        NAME(ffn_ab)(x, W0, W1, a, b, K);
        UNROLL for (int o = 0; o < DB; o++) y[o] = x[o] + a[o] * b[o];
        y[DB] = x[DB];
    }
}

/* ``first``: the prompt's FFN, which reads its LIVE first entries alone (the scratch rows are zero) */
static void NAME(ffn_forward)(const vec *X, vec *Y, int T, const real *W0, const real *W1, int first) {
    if (first)
        NAME(ffn_tokens)(X, Y, T, W0, W1, LIVE);
    else
        NAME(ffn_tokens)(X, Y, T, W0, W1, DB);
}

/* G = Σ_{t<n} z_t z_tᵀ (full, symmetric), tiled over tokens */
static void NAME(gram)(const vec *X, int n, vec *G) {
    memset(G, 0, sizeof(vec) * DIM * DIM);
    for (int t0 = 0; t0 < n; t0 += TILE) {
        int t1 = t0 + TILE < n ? t0 + TILE : n;
        UNROLL for (int r = 0; r < DIM; r++) {
            vec acc[DIM];
            UNROLL for (int c = 0; c < DIM; c++) acc[c] = G[r * DIM + c];
            for (int t = t0; t < t1; t++) {
                vec xr = X[t * DIM + r];
                UNROLL for (int c = r; c < DIM; c++) acc[c] += xr * X[t * DIM + c];
            }
            UNROLL for (int c = r; c < DIM; c++) G[r * DIM + c] = acc[c];
        }
    }
    UNROLL for (int r = 0; r < DIM; r++) UNROLL for (int c = 0; c < r; c++) G[r * DIM + c] = G[c * DIM + r];
}

/* The DIM x DIM products of the per-prompt matrices: out[r][c] = f · Σ_k A(r, k) B(k, c) (add: out[r][c] += that),
   A(r, k) = A[r ar + k ak], B(k, c) = B[k bk + c bc], so a transposed operand is a swap of its strides. Row r's DIM
   sums stay in registers and each A(r, k) is loaded once; A, B are vectors (a per-prompt matrix) or reals (a weight,
   broadcast). One definition per operand-type pair; inlined, the strides are constants. */
#define BL_MATMUL(name, TA, TB)                                                                                      \
    static inline __attribute__((always_inline)) void NAME(name)(const TA *A, int ar, int ak, const TB *B, int bk,  \
                                                                 int bc, vec *out, int add, real f) {              \
        for (int r = 0; r < DIM; r++) {                                                                            \
            vec acc[DIM];                                                                                          \
            TA a = A[r * ar];                                                                                      \
            UNROLL for (int c = 0; c < DIM; c++) acc[c] = a * B[c * bc];                                           \
            for (int k = 1; k < DIM; k++) {                                                                        \
                a = A[r * ar + k * ak];                                                                            \
                UNROLL for (int c = 0; c < DIM; c++) acc[c] += a * B[k * bk + c * bc];                             \
            }                                                                                                      \
            UNROLL for (int c = 0; c < DIM; c++)                                                                   \
                out[r * DIM + c] = add ? out[r * DIM + c] + acc[c] * f : acc[c] * f;                              \
        }                                                                                                          \
    }
BL_MATMUL(mm_vr, vec, real)
BL_MATMUL(mm_rv, real, vec)
BL_MATMUL(mm_vv, vec, vec)
#undef BL_MATMUL

/* R = I + Σ_h P_h G Q_h / n */
static void NAME(transfer)(const vec *G, const real *P, const real *Q, int H, int n, vec *R, vec *M) {
    const real inv = (real)1 / n;
    for (int h = 0; h < H; h++) {
        NAME(mm_rv)(P + h * DIM * DIM, DIM, 1, G, DIM, 1, M, 0, 1);             /* M = P_h G */
        NAME(mm_vr)(M, DIM, 1, Q + h * DIM * DIM, DIM, 1, R, h > 0, inv); /* R (+)= M Q_h / n */
    }
    for (int r = 0; r < DIM; r++) R[r * DIM + r] += (real)1;
}

/* y_t = R x_t for t < T (Y may be X) */
static void NAME(apply)(const vec *X, vec *Y, int T, const vec *R) {
    for (int t = 0; t < T; t++) {
        const vec *x = X + t * DIM;
        vec *y = Y + t * DIM, acc[DIM];
        vec x0 = x[0];
        UNROLL for (int r = 0; r < DIM; r++) acc[r] = R[r * DIM] * x0;
        UNROLL for (int c = 1; c < DIM; c++) {
            vec xc = x[c];
            UNROLL for (int r = 0; r < DIM; r++) acc[r] += R[r * DIM + c] * xc;
        }
        UNROLL for (int r = 0; r < DIM; r++) y[r] = acc[r];
    }
}

/* The scratch of a call: L planes (the sub-layers' inputs) and one for the output gradient, L G's and R's, 4 DIM x DIM
   products, the FFN tile and ``extra`` vectors. */
typedef struct {
    vec *buf, *Xs, *Gt, *Gs, *Rs, *dR, *S, *M, *N, *Dab, *extra;
    size_t plane;
} NAME(scratch_t);

static int NAME(scratch)(NAME(scratch_t) *s, int n, int L, size_t extra) {
    const size_t plane = (size_t)(n + 1) * DIM, mat = DIM * DIM;
    size_t count = (size_t)(L + 1) * plane + 2 * (size_t)L * mat + 4 * mat + (size_t)TILE * 2 * DB + extra;
    s->buf = aligned_alloc(VBYTES, sizeof(vec) * count);
    if (!s->buf) return 1;
    s->plane = plane;
    s->Xs = s->buf;
    s->Gt = s->Xs + (size_t)L * plane;
    s->Gs = s->Gt + plane;
    s->Rs = s->Gs + (size_t)L * mat;
    s->dR = s->Rs + (size_t)L * mat;
    s->S = s->dR + mat;
    s->M = s->S + mat;
    s->N = s->M + mat;
    s->Dab = s->N + mat;
    s->extra = s->Dab + (size_t)TILE * 2 * DB;
    memset(s->extra, 0, sizeof(vec) * extra);
    return 0;
}

static vec NAME(read_out)(const vec *X, int n, const vec *R) {
    const vec *q = X + n * DIM;
    vec s = R[DB * DIM] * q[0];
    UNROLL for (int c = 1; c < DIM; c++) s += R[DB * DIM + c] * q[c];
    return s;
}

/* The forward of one group, whose prompt is in plane 0 of Xs. ``keep``: plane l + 1 gets sub-layer l's output, so
   plane l keeps its input, and Gs, Rs get every attention layer's G and R (DIM x DIM vectors each, one per
   sub-layer); else everything runs in plane 0 and one G, R (the scratch s's). The last sub-layer (attention)
   updates the query alone: returns its label entry. */
static vec NAME(forward_group)(const NAME(scratch_t) *s, int n, int L, const int *kinds, int H, const real *wts,
                               const long *off, int keep) {
    const int T = n + 1, mat = DIM * DIM;
    const size_t plane = s->plane;
    vec *X = s->Xs, *Gs = s->Gs, *Rs = s->Rs, *M = s->M;
    for (int l = 0;; l++) {
        vec *Y = keep ? X + plane : X, *G = Gs + (keep ? l * mat : 0), *R = Rs + (keep ? l * mat : 0);
        const real *w = wts + off[l];
        if (kinds[l] == 0) {
            NAME(ffn_forward)(X, Y, T, w, w + DB * DB, l == 0);
        } else {
            NAME(gram)(X, n, G);
            NAME(transfer)(G, w, w + H * mat, H, n, R, M);
            if (l == L - 1) return NAME(read_out)(X, n, R);
            NAME(apply)(X, Y, T, R);
        }
        X = Y;
    }
}

/* ---- backward ---------------------------------------------------------------------------------------------- */

/* An attention layer's backward. U: its input (T x DIM), Gt: the output gradient (T x DIM; with ``last`` only the
   query's label entry, gq lanes), rewritten in place as the input gradient unless ``first``. Adds dP, dQ (lanes) to
   gP, gQ. Scratch: dR, S, M, N (DIM x DIM vectors each). */
static void NAME(attn_backward)(const vec *U, vec *Gt, int n, int H, const real *P, const real *Q, const vec *G,
                                const vec *R, vec *gP, vec *gQ, int last, vec gq, int first, vec *dR, vec *S, vec *M,
                                vec *N) {
    const int T = n + 1;
    const real inv = (real)1 / n;
    /* dR = Σ_t g_t u_tᵀ */
    if (last) {
        memset(dR, 0, sizeof(vec) * DIM * DIM);
        UNROLL for (int c = 0; c < DIM; c++) dR[DB * DIM + c] = gq * U[n * DIM + c];
    } else {
        memset(dR, 0, sizeof(vec) * DIM * DIM);
        for (int t0 = 0; t0 < T; t0 += TILE) {
            int t1 = t0 + TILE < T ? t0 + TILE : T;
            for (int r = 0; r < DIM; r++) {
                vec acc[DIM];
                UNROLL for (int c = 0; c < DIM; c++) acc[c] = dR[r * DIM + c];
                for (int t = t0; t < t1; t++) {
                    vec g = Gt[t * DIM + r];
                    UNROLL for (int c = 0; c < DIM; c++) acc[c] += g * U[t * DIM + c];
                }
                UNROLL for (int c = 0; c < DIM; c++) dR[r * DIM + c] = acc[c];
            }
        }
    }
    /* per head: dP_h += dR (G Q_h)ᵀ / n, dQ_h += (P_h G)ᵀ dR / n, dG += P_hᵀ dR Q_hᵀ / n */
    memset(S, 0, sizeof(vec) * DIM * DIM); /* dG first */
    for (int h = 0; h < H; h++) {
        const real *Ph = P + h * DIM * DIM, *Qh = Q + h * DIM * DIM;
        vec *gPh = gP + h * DIM * DIM, *gQh = gQ + h * DIM * DIM;
        NAME(mm_vr)(G, DIM, 1, Qh, DIM, 1, M, 0, 1);         /* M = G Q_h */
        NAME(mm_vv)(dR, DIM, 1, M, 1, DIM, gPh, 1, inv);     /* dP_h += dR Mᵀ / n */
        NAME(mm_rv)(Ph, DIM, 1, G, DIM, 1, M, 0, 1);         /* M = P_h G */
        NAME(mm_vv)(M, 1, DIM, dR, DIM, 1, gQh, 1, inv);     /* dQ_h += Mᵀ dR / n */
        if (first) continue;
        NAME(mm_rv)(Ph, 1, DIM, dR, DIM, 1, N, 0, 1);        /* N = P_hᵀ dR */
        NAME(mm_vr)(N, DIM, 1, Qh, 1, DIM, S, 1, inv);       /* dG += N Q_hᵀ / n */
    }
    if (first) return; /* the prompt is data: no input gradient */
    /* S = dG + dGᵀ (in place: the upper triangle from both, then mirrored) */
    UNROLL for (int r = 0; r < DIM; r++) UNROLL for (int c = r; c < DIM; c++) {
        vec s = S[r * DIM + c] + S[c * DIM + r];
        S[r * DIM + c] = s;
        S[c * DIM + r] = s;
    }
    /* g_t ← Rᵀ g_t + [t < n] S u_t */
    if (last) {
        for (int t = 0; t < n; t++) {
            const vec *u = U + t * DIM;
            vec *g = Gt + t * DIM, acc[DIM];
            vec u0 = u[0];
            UNROLL for (int r = 0; r < DIM; r++) acc[r] = S[r * DIM] * u0;
            UNROLL for (int c = 1; c < DIM; c++) {
                vec uc = u[c];
                UNROLL for (int r = 0; r < DIM; r++) acc[r] += S[r * DIM + c] * uc;
            }
            UNROLL for (int r = 0; r < DIM; r++) g[r] = acc[r];
        }
        UNROLL for (int r = 0; r < DIM; r++) Gt[n * DIM + r] = R[DB * DIM + r] * gq;
        return;
    }
    for (int t = 0; t < T; t++) {
        const vec *u = U + t * DIM;
        vec *g = Gt + t * DIM, acc[DIM];
        vec g0 = g[0];
        UNROLL for (int r = 0; r < DIM; r++) acc[r] = R[r] * g0; /* (Rᵀ)[r][0] = R[0][r] */
        UNROLL for (int c = 1; c < DIM; c++) {
            vec gc = g[c];
            UNROLL for (int r = 0; r < DIM; r++) acc[r] += R[c * DIM + r] * gc;
        }
        if (t < n) {
            UNROLL for (int c = 0; c < DIM; c++) {
                vec uc = u[c];
                UNROLL for (int r = 0; r < DIM; r++) acc[r] += S[r * DIM + c] * uc;
            }
        }
        UNROLL for (int r = 0; r < DIM; r++) g[r] = acc[r];
    }
}

/* An FFN's backward over K live input columns (DB, or LIVE for the prompt's FFN, whose scratch rows are zero: their
   weight gradients are zero and are not touched). X: its input, Gt: the output gradient (T x DIM), rewritten in place
   as the input gradient unless ``first``. Adds dW_0, dW_1 (lanes) to gW0, gW1. Dab: TILE x 2d̄ vectors of scratch. */
static inline __attribute__((always_inline)) void NAME(ffn_backward_k)(const vec *X, vec *Gt, int T, const real *W0,
                                                                      const real *W1, vec *gW0, vec *gW1, int first,
                                                                      vec *Dab, const int K) {
    for (int t0 = 0; t0 < T; t0 += TILE) {
        int t1 = t0 + TILE < T ? t0 + TILE : T;
        for (int t = t0; t < t1; t++) {
            const vec *x = X + t * DIM;
            vec *g = Gt + t * DIM, a[DB], b[DB];
            vec *da = Dab + (t - t0) * 2 * DB, *db = da + DB;
            NAME(ffn_ab)(x, W0, W1, a, b, K); /* recomputed: cheaper than keeping [a; b] (measured) */
            UNROLL for (int o = 0; o < DB; o++) {
                da[o] = g[o] * b[o]; /* ∂a = g ⊙ b */
                db[o] = g[o] * a[o]; /* ∂b = g ⊙ a */
            }
            if (first) continue;
            /* dx[:d̄] = g[:d̄] + W_0ᵀ ∂a + W_1ᵀ ∂b; the label entry passes */
            vec acc[DB];
            UNROLL for (int j = 0; j < DB; j++) acc[j] = g[j];
            for (int o = 0; o < DB; o++) {
                vec pa = da[o], pb = db[o];
                UNROLL for (int j = 0; j < DB; j++) {
                    acc[j] += pa * W0[o * DB + j];
                    acc[j] += pb * W1[o * DB + j];
                }
            }
            UNROLL for (int j = 0; j < DB; j++) g[j] = acc[j];
        }
        /* dW_0[o][j] += Σ_t ∂a_o x_j, dW_1 likewise */
        for (int o = 0; o < 2 * DB; o++) {
            vec *gw = o < DB ? gW0 + o * DB : gW1 + (o - DB) * DB, acc[DB];
            UNROLL for (int j = 0; j < K; j++) acc[j] = gw[j];
            for (int t = t0; t < t1; t++) {
                vec p = Dab[(t - t0) * 2 * DB + o];
                UNROLL for (int j = 0; j < K; j++) acc[j] += p * X[t * DIM + j];
            }
            UNROLL for (int j = 0; j < K; j++) gw[j] = acc[j];
        }
    }
}

static void NAME(ffn_backward)(const vec *X, vec *Gt, int T, const real *W0, const real *W1, vec *gW0, vec *gW1,
                               int first, vec *Dab) {
    if (first)
        NAME(ffn_backward_k)(X, Gt, T, W0, W1, gW0, gW1, 1, Dab, LIVE);
    else
        NAME(ffn_backward_k)(X, Gt, T, W0, W1, gW0, gW1, 0, Dab, DB);
}

/* ---- entry points ------------------------------------------------------------------------------------------ */

/* The backward of one group after forward_group(keep = 1): adds the lanes' dL/d(weights) for dL/d(out) = gq to gv
   (vectors, the layout of wts). */
static void NAME(backward_group)(const NAME(scratch_t) *s, int n, int L, const int *kinds, int H, const real *wts,
                                 const long *off, vec gq, vec *gv) {
    const int T = n + 1, mat = DIM * DIM;
    const size_t plane = s->plane;
    for (int l = L - 1; l >= 0; l--) {
        const real *w = wts + off[l];
        vec *g = gv + off[l];
        if (kinds[l] == 0)
            NAME(ffn_backward)(s->Xs + l * plane, s->Gt, T, w, w + DB * DB, g, g + DB * DB, l == 0, s->Dab);
        else
            NAME(attn_backward)(s->Xs + l * plane, s->Gt, n, H, w, w + H * mat, s->Gs + l * mat, s->Rs + l * mat, g,
                                g + H * mat, l == L - 1, gq, l == 0, s->dR, s->S, s->M, s->N);
    }
}

static long NAME(wsize)(int L, const int *kinds, int H) {
    long s = 0;
    for (int l = 0; l < L; l++) s += kinds[l] == 0 ? 2 * DB * DB : 2 * (long)H * DIM * DIM;
    return s;
}

static vec NAME(lanes_of)(const real *x, int m) {
    vec v = {0};
    for (int l = 0; l < m; l++) v[l] = x[l];
    return v;
}

/* sum over lanes, in lane order, added to out[i] */
static void NAME(add_lanes)(const vec *v, long count, real *out) {
    for (long i = 0; i < count; i++) {
        real s = 0;
        for (int l = 0; l < W; l++) s += v[i][l];
        out[i] += s;
    }
}

/* The prompt of eq. (1), z (B, n + 1, DIM) row-major: token t < n of prompt b is [1, x_bt, 0 …, y_bt · inv], the
   query [1, xq_b, 0 …, 0], with d = LIVE − 1 inputs; x_bt at x + b * sxb + t * d, xq_b at xq + b * sqb, y_bt at
   y + b * syb + t. The label is one rounded product (y · 1 = y). Returns 0. */
int NAME(bl_embed)(long B, int n, const real *x, long sxb, const real *xq, long sqb, const real *y, long syb, real inv,
                   real *z) {
    enum { D = LIVE - 1 };
    for (long b = 0; b < B; b++) {
        real *zb = z + b * (long)(n + 1) * DIM;
        const real *xb = x + b * sxb, *yb = y + b * syb;
        for (int t = 0; t <= n; t++) {
            real *zt = zb + (long)t * DIM;
            const real *xt = t < n ? xb + (long)t * D : xq + b * sqb;
            zt[0] = 1;
            for (int j = 0; j < D; j++) zt[1 + j] = xt[j];
            for (int r = LIVE; r < DB; r++) zt[r] = 0;
            zt[DB] = t < n ? yb[t] * inv : 0;
        }
    }
    return 0;
}

/* out[b] for b < B. Returns 0, or 1 where scratch memory could not be allocated. */
int NAME(bl_forward)(long B, int n, int L, const int *kinds, int H, const real *z0, const real *wts, const long *off,
                     real *out) {
    const int T = n + 1;
    NAME(scratch_t) s;
    if (NAME(scratch)(&s, n, 1, 0)) return 1;
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ: no denormal slow path */
    for (long b0 = 0; b0 < B; b0 += W) {
        int m = B - b0 < W ? (int)(B - b0) : W;
        NAME(load_group)(z0, b0, m, T, s.Xs);
        vec y = NAME(forward_group)(&s, n, L, kinds, H, wts, off, 0);
        for (int l = 0; l < m; l++) out[b0 + l] = y[l];
    }
    _mm_setcsr(csr);
    free(s.buf);
    return 0;
}

/* Every group forward (keeping its layers' inputs) and back. gout != NULL: dL/d(out) = gout, the lanes' weight
   gradients summed into gv; gout == NULL: dL/d(out) = 1 in every used lane, each group's into its own row of gv
   (nw vectors), and out[b] written. */
static void NAME(groups_backward)(const NAME(scratch_t) *s, long B, int n, int L, const int *kinds, int H,
                                  const real *z0, const real *wts, const long *off, const real *gout, real *out,
                                  vec *gv) {
    const long nw = NAME(wsize)(L, kinds, H);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    for (long b0 = 0, g = 0; b0 < B; b0 += W, g++) {
        int m = B - b0 < W ? (int)(B - b0) : W;
        NAME(load_group)(z0, b0, m, n + 1, s->Xs);
        vec y = NAME(forward_group)(s, n, L, kinds, H, wts, off, 1), seed = {0}, *to = gv;
        if (gout) {
            seed = NAME(lanes_of)(gout + b0, m);
        } else {
            for (int l = 0; l < m; l++) out[b0 + l] = y[l], seed[l] = 1;
            to = gv + g * nw;
            memset(to, 0, sizeof(vec) * (size_t)nw);
        }
        NAME(backward_group)(s, n, L, kinds, H, wts, off, seed, to);
    }
    _mm_setcsr(csr);
}

/* Adds dL/d(weights) to gw for dL/d(out[b]) = gout[b], replaying the forward. Returns 0, or 1 (no memory). */
int NAME(bl_backward)(long B, int n, int L, const int *kinds, int H, const real *z0, const real *wts,
                      const long *off, const real *gout, real *gw) {
    const long nw = NAME(wsize)(L, kinds, H);
    NAME(scratch_t) s;
    if (NAME(scratch)(&s, n, L, (size_t)nw)) return 1;
    NAME(groups_backward)(&s, B, n, L, kinds, H, z0, wts, off, gout, NULL, s.extra);
    NAME(add_lanes)(s.extra, nw, gw);
    free(s.buf);
    return 0;
}

/* out[b] and every prompt's d out[b] / d(weights), in lanes: J (ceil(B / W), nw, W), zero in the padded lanes. The
   backward of the step is then bl_vjp: no replay. Returns 0, or 1 (no memory). */
int NAME(bl_jacobian)(long B, int n, int L, const int *kinds, int H, const real *z0, const real *wts,
                      const long *off, real *out, real *J) {
    NAME(scratch_t) s;
    if (NAME(scratch)(&s, n, L, 0)) return 1;
    NAME(groups_backward)(&s, B, n, L, kinds, H, z0, wts, off, NULL, out, (vec *)J);
    free(s.buf);
    return 0;
}

/* gw[i] += Σ_b gout[b] J[b][i] for bl_jacobian's J: over groups in order, then over lanes. Returns 0, or 1. */
int NAME(bl_vjp)(long B, long nw, const real *J, const real *gout, real *gw) {
    vec *acc = aligned_alloc(VBYTES, sizeof(vec) * (size_t)nw);
    if (!acc) return 1;
    memset(acc, 0, sizeof(vec) * (size_t)nw);
    const vec *Jv = (const vec *)J;
    for (long b0 = 0, g = 0; b0 < B; b0 += W, g++) {
        vec go = NAME(lanes_of)(gout + b0, B - b0 < W ? (int)(B - b0) : W);
        const vec *Jg = Jv + g * nw;
        for (long i = 0; i < nw; i++) acc[i] += Jg[i] * go;
    }
    NAME(add_lanes)(acc, nw, gw);
    free(acc);
    return 0;
}

#undef vec
#endif
