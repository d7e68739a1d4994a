/* The L-layer linear transformer of Ahn, Cheng, Daneshmand, Sra 2023 (eq. (3)-(4)) in its moment form, with its
   backward, W prompts at a time in the lanes of a vector: iclab.models._moment_fast runs it where it can be built,
   and the torch code of iclab.models.attention_core (AttentionStack.forward) computes the same numbers elsewhere.

   A prompt enters as its sources' Gram matrix G_0 = Σ_i z_i z_iᵀ (DIM x DIM) and its query row q_0 (DIM). Layer ℓ
   maps every row by one matrix, z ← z T_ℓ with
       T_ℓ = [I +] Σ_h Q_hᵀ G_ℓ P_hᵀ · s        (s = 1/n; the identity with the residual),
   so q_{ℓ+1} = q_ℓ T_ℓ and G_{ℓ+1} = T_ℓᵀ G_ℓ T_ℓ. The output is the query's label entry q_L[DIM − 1].
   Weights: P and Q, each L x H x DIM x DIM, row-major, in the paper's orientation.

   Inputs are batch-last, as the library keeps them: G_0[i][j] of prompt b at g0[(i DIM + j) stride + b], q_0[i] at
   q0[i stride + b]; a call takes `count` prompts from there. Every per-prompt quantity is a DIM x DIM array of
   vectors (prompts in the lanes), nothing is summed across lanes until a call's weight gradients are reduced, in
   lane order, at its end.

   The backward of one layer, for adjoints q̄' of q_{ℓ+1} and Ḡ' of G_{ℓ+1} (G symmetric, so is T's use of it):
       T̄ = q_ℓᵀ q̄' + G_ℓ T_ℓ (Ḡ' + Ḡ'ᵀ),   q̄ = T_ℓ q̄',   Ḡ = T_ℓ Ḡ' T_ℓᵀ + Σ_h Q_h T̄ P_h s,
       Q̄_h += G_ℓ P_hᵀ T̄ᵀ s,   P̄_h += T̄ᵀ Q_hᵀ G_ℓ s.
   Only Ḡ' + Ḡ'ᵀ is ever read, so the backward carries that sum S (symmetric): S ← T_ℓ S Tᵀ_ℓ + Σ_h (Q_h R_h + R_hᵀ Q_hᵀ)
   with R_h = T̄ P_h s, which also gives Q̄_h += G_ℓ R_hᵀ. ma_backward_* replays the forward per group, keeping each
   layer's G_ℓ, T_ℓ, G_ℓ T_ℓ, q_ℓ and s Q_hᵀ G_ℓ ((3 + H) DIM² + DIM vectors), then walks the layers back for
   dL/d(out) = gout, and adds dL/dP, dL/dQ into gP, gQ.

   ma_moments_* builds the inputs from the data, G_0 = Σ_i z_i z_iᵀ and q_0 = [x_q; 0] with z_i = [x_i; y_i] (eq. 1),
   without forming the (n+1) x DIM prompt.

   DIM is a compile-time constant (-DDIM=6): every DIM-long loop is unrolled. The lane count is the target's: 16
   floats with AVX-512, else 8 (AVX2); doubles half that. Compiled as two instances by including itself: float32
   (suffix _f32) and float64 (_f64). Built by iclab.core.native.load(). */
#ifndef PER_REAL
#include <stdlib.h>
#include <string.h>

#ifndef DIM
#error "compile with -DDIM=<tokens' width>"
#endif
#include "_lanes.h" /* VBYTES */
#define MAX_LAYERS 64
#define MAX_HEADS 64

int ma_lanes_f32(void) { return VBYTES / 4; }
int ma_lanes_f64(void) { return VBYTES / 8; }

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else /* one instance for the real type of PER_REAL */

#include "../core/_per_real.h"
#include "_lanes.h" /* vec, W */
#define UNROLL _Pragma("GCC unroll 32")
#define DD (DIM * DIM)

/* m prompts (m <= W) of a batch-last array of `rows` entries per prompt into X (rows vectors); lanes m … W − 1 are
   zero */
static void NAME(load)(const real *src, long stride, int rows, int m, vec *X) {
    for (int r = 0; r < rows; r++) {
        vec v = {0};
        if (m == W)
            memcpy(&v, src + r * stride, sizeof(vec));
        else
            for (int l = 0; l < m; l++) v[l] = src[r * stride + l];
        X[r] = v;
    }
}

/* T = [I +] Σ_h (s Q_hᵀ G) P_hᵀ for one layer; U_h = s Q_hᵀ G into U (H x DIM² vectors) when U is not NULL */
static inline __attribute__((always_inline)) void NAME(transfer)(const vec *G, const real *P, const real *Q, real s,
                                                                int H, int residual, vec *T, vec *U) {
    memset(T, 0, sizeof(vec) * DD);
    for (int h = 0; h < H; h++) {
        const real *Ph = P + h * DD, *Qh = Q + h * DD;
        UNROLL for (int a = 0; a < DIM; a++) {
            vec Ua[DIM]; /* row a of s Q_hᵀ G: Ua[j] = s Σ_i Q[i][a] G[i][j] */
            UNROLL for (int j = 0; j < DIM; j++) Ua[j] = (s * Qh[a]) * G[j];
            UNROLL for (int i = 1; i < DIM; i++) {
                const real qia = s * Qh[i * DIM + a];
                UNROLL for (int j = 0; j < DIM; j++) Ua[j] += qia * G[i * DIM + j];
            }
            if (U) memcpy(U + h * DD + a * DIM, Ua, sizeof Ua);
            UNROLL for (int k = 0; k < DIM; k++) { /* T[a][k] += Σ_j Ua[j] P[k][j] */
                vec acc = Ua[0] * Ph[k * DIM];
                UNROLL for (int j = 1; j < DIM; j++) acc += Ua[j] * Ph[k * DIM + j];
                T[a * DIM + k] += acc;
            }
        }
    }
    if (residual)
        UNROLL for (int a = 0; a < DIM; a++) T[a * DIM + a] += 1;
}

/* C = A B for per-lane DIM x DIM matrices */
static inline __attribute__((always_inline)) void NAME(mul)(const vec *A, const vec *B, vec *C) {
    UNROLL for (int i = 0; i < DIM; i++) {
        vec acc[DIM];
        UNROLL for (int k = 0; k < DIM; k++) acc[k] = A[i * DIM] * B[k];
        UNROLL for (int j = 1; j < DIM; j++) {
            const vec a = A[i * DIM + j];
            UNROLL for (int k = 0; k < DIM; k++) acc[k] += a * B[j * DIM + k];
        }
        UNROLL for (int k = 0; k < DIM; k++) C[i * DIM + k] = acc[k];
    }
}

/* C = Aᵀ B for per-lane DIM x DIM matrices whose product is symmetric (Tᵀ (G T)): i <= k summed, then mirrored */
static inline __attribute__((always_inline)) void NAME(mul_tn_sym)(const vec *A, const vec *B, vec *C) {
    UNROLL for (int i = 0; i < DIM; i++) {
        UNROLL for (int k = i; k < DIM; k++) {
            vec acc = A[i] * B[k];
            UNROLL for (int j = 1; j < DIM; j++) acc += A[j * DIM + i] * B[j * DIM + k];
            C[i * DIM + k] = acc;
            C[k * DIM + i] = acc;
        }
    }
}

/* C = A Bᵀ for per-lane DIM x DIM matrices whose product is symmetric ((T S) Tᵀ): i <= k summed, then mirrored */
static inline __attribute__((always_inline)) void NAME(mul_nt_sym)(const vec *A, const vec *B, vec *C) {
    UNROLL for (int i = 0; i < DIM; i++) {
        UNROLL for (int k = i; k < DIM; k++) {
            vec acc = A[i * DIM] * B[k * DIM];
            UNROLL for (int j = 1; j < DIM; j++) acc += A[i * DIM + j] * B[k * DIM + j];
            C[i * DIM + k] = acc;
            C[k * DIM + i] = acc;
        }
    }
}

/* The states of one layer that the backward reads: G_ℓ, T_ℓ, Y_ℓ = G_ℓ T_ℓ, q_ℓ, U_h = s Q_hᵀ G_ℓ. */
#define STATE(H) ((3 + (H)) * DD + DIM)

/* the forward of one group: with `keep`, every layer's state (STATE(H) vectors each) in order; the label entry of
   q_L into *out */
static void NAME(group_forward)(int L, int H, const real *P, const real *Q, real s, int residual, vec *G, vec *q,
                                vec *keep, vec *out) {
    vec T[DD], Y[DD], qn[DIM];
    for (int l = 0; l < L; l++) {
        vec *st = keep ? keep + (long)l * STATE(H) : NULL; /* G, T, Y, q, U */
        vec *Tl = st ? st + DD : T, *Yl = st ? st + 2 * DD : Y;
        if (st) {
            memcpy(st, G, sizeof(vec) * DD);
            memcpy(st + 3 * DD, q, sizeof(vec) * DIM);
        }
        NAME(transfer)(G, P + (long)l * H * DD, Q + (long)l * H * DD, s, H, residual, Tl, st ? st + 3 * DD + DIM : NULL);
        UNROLL for (int k = 0; k < DIM; k++) {
            vec acc = q[0] * Tl[k];
            UNROLL for (int a = 1; a < DIM; a++) acc += q[a] * Tl[a * DIM + k];
            qn[k] = acc;
        }
        memcpy(q, qn, sizeof(vec) * DIM);
        if (l < L - 1) {
            NAME(mul)(G, Tl, Yl);        /* G T */
            NAME(mul_tn_sym)(Tl, Yl, G); /* Tᵀ G T */
        }
    }
    *out = q[DIM - 1];
}

static void NAME(store)(const vec *v, int m, real *dst) {
    for (int l = 0; l < m; l++) dst[l] = (*v)[l];
}

int NAME(ma_forward)(long count, int L, int H, const real *P, const real *Q, real s, int residual, const real *g0,
                     const real *q0, long stride, real *out) {
    if (L > MAX_LAYERS || H > MAX_HEADS) return 2;
    vec G[DD], q[DIM], y;
    for (long b0 = 0; b0 < count; b0 += W) {
        const int m = count - b0 < W ? (int)(count - b0) : W;
        NAME(load)(g0 + b0, stride, DD, m, G);
        NAME(load)(q0 + b0, stride, DIM, m, q);
        NAME(group_forward)(L, H, P, Q, s, residual, G, q, NULL, &y);
        NAME(store)(&y, m, out + b0);
    }
    return 0;
}

/* the backward of one layer (module comment) from its state st: qb, S the adjoints of q_{ℓ+1} and of G_{ℓ+1} summed
   with its transpose (Ḡ' + Ḡ'ᵀ, all that is read of it) in, those of q_ℓ, G_ℓ out; has_G: S is nonzero (ℓ < L − 1);
   need_in: the adjoints of q_ℓ, G_ℓ are wanted (ℓ > 0). Per head, R = T̄ P_h s gives Q̄_h += G Rᵀ and Ḡ += Q_h R. */
static inline __attribute__((always_inline)) void NAME(layer_backward)(int H, const real *P, const real *Q, real s,
                                                                      const vec *st, vec *qb, vec *S, int has_G,
                                                                      int need_in, vec *gP, vec *gQ) {
    const vec *G = st, *T = st + DD, *Y = st + 2 * DD, *q = st + 3 * DD, *U = st + 3 * DD + DIM;
    vec Tb[DD], A[DD];
    if (has_G) {
        NAME(mul)(Y, S, Tb); /* G T (Ḡ' + Ḡ'ᵀ) */
        UNROLL for (int a = 0; a < DIM; a++) UNROLL for (int k = 0; k < DIM; k++) Tb[a * DIM + k] += q[a] * qb[k];
    } else
        UNROLL for (int a = 0; a < DIM; a++) UNROLL for (int k = 0; k < DIM; k++) Tb[a * DIM + k] = q[a] * qb[k];
    if (need_in) {
        vec qn[DIM];
        UNROLL for (int a = 0; a < DIM; a++) {
            vec acc = T[a * DIM] * qb[0];
            UNROLL for (int k = 1; k < DIM; k++) acc += T[a * DIM + k] * qb[k];
            qn[a] = acc;
        }
        memcpy(qb, qn, sizeof(vec) * DIM);
        if (has_G) { /* S ← T S Tᵀ */
            NAME(mul)(T, S, A);
            NAME(mul_nt_sym)(A, T, S);
        } else
            memset(S, 0, sizeof(vec) * DD);
    }
    for (int h = 0; h < H; h++) {
        const real *Ph = P + h * DD, *Qh = Q + h * DD;
        const vec *Uh = U + h * DD;
        vec *gPh = gP + h * DD, *gQh = gQ + h * DD;
        UNROLL for (int a = 0; a < DIM; a++) { /* R = s T̄ P_h (rows a) */
            vec Ra[DIM];
            UNROLL for (int j = 0; j < DIM; j++) Ra[j] = Tb[a * DIM] * (s * Ph[j]);
            UNROLL for (int k = 1; k < DIM; k++) {
                const vec t = Tb[a * DIM + k];
                UNROLL for (int j = 0; j < DIM; j++) Ra[j] += t * (s * Ph[k * DIM + j]);
            }
            memcpy(A + a * DIM, Ra, sizeof Ra);
        }
        UNROLL for (int i = 0; i < DIM; i++) UNROLL for (int a = 0; a < DIM; a++) { /* Q̄[i][a] += Σ_j G[i][j] R[a][j] */
            vec acc = G[i * DIM] * A[a * DIM];
            UNROLL for (int j = 1; j < DIM; j++) acc += G[i * DIM + j] * A[a * DIM + j];
            gQh[i * DIM + a] += acc;
        }
        UNROLL for (int k = 0; k < DIM; k++) UNROLL for (int j = 0; j < DIM; j++) { /* P̄ += T̄ᵀ U_h */
            vec acc = Tb[k] * Uh[j];
            UNROLL for (int a = 1; a < DIM; a++) acc += Tb[a * DIM + k] * Uh[a * DIM + j];
            gPh[k * DIM + j] += acc;
        }
        if (need_in) /* S += Q_h R + (Q_h R)ᵀ */
            UNROLL for (int i = 0; i < DIM; i++) UNROLL for (int j = 0; j < DIM; j++) {
                vec acc = Qh[i * DIM] * A[j];
                UNROLL for (int a = 1; a < DIM; a++) acc += Qh[i * DIM + a] * A[a * DIM + j];
                S[i * DIM + j] += acc;
                S[j * DIM + i] += acc;
            }
    }
}

/* G_0 = Σ_{t<n} z_t z_tᵀ (+ x_q x_qᵀ in the covariate block with `query`: the query, label slot 0, is a source)
   and q_0 = [x_q; 0] of `count` prompts, batch-last as ma_forward_* reads them (row stride `stride`), from the data:
   covariates x (prompt b, token t, entry i at x[b sx + t (DIM − 1) + i]), labels y[b sy + t], queries xq[b sq + i].
   The sums run over the tokens in order, W prompts in the lanes. */
int NAME(ma_moments)(long count, int n, const real *x, long sx, const real *y, long sy, const real *xq, long sq,
                     int query, real *g0, real *q0, long stride) {
    enum { d = DIM - 1 };
#if DIM <= 8 /* one prompt at a time, a token's DIM entries in one 8-wide vector: G's rows are 8-wide FMAs */
    typedef real row_t __attribute__((vector_size(8 * sizeof(real))));
    const real *x_end = x + (count - 1) * sx + (long)n * d; /* one past the call's last covariate */
    row_t keep = {0}, label = {0}; /* 1 in the covariate lanes; 1 in the label lane */
    for (int i = 0; i < 8; i++) keep[i] = i == d ? 0 : 1;
    label[d] = 1;
    for (long b = 0; b < count; b++) {
        const real *xb = x + b * sx, *yb = y + b * sy, *qb = xq + b * sq;
        row_t G[DIM] = {{0}};
        for (int t = 0; t < n; t++) {
            /* z_t = [x_t; y_t]: one 8-wide load from x_t where those 8 entries lie within the call's data (the entries
               past the label are read, never stored), else the d entries alone; the scalars from memory, not z */
            const real *xt = xb + (long)t * d;
            row_t z = {0};
            if (xt + 8 <= x_end)
                memcpy(&z, xt, sizeof z);
            else
                memcpy(&z, xt, sizeof(real) * d);
            z = z * keep + yb[t] * label; /* z[d] = y_t in registers (a lane store would stall the next load) */
            UNROLL for (int i = 0; i < d; i++) G[i] += xt[i] * z;
            G[d] += yb[t] * z;
        }
        row_t zq = {0};
        memcpy(&zq, qb, sizeof(real) * d);
        if (query)
            UNROLL for (int i = 0; i < d; i++) G[i] += zq[i] * zq;
        UNROLL for (int i = 0; i < DIM; i++) UNROLL for (int j = 0; j < DIM; j++) g0[(i * DIM + j) * stride + b] =
                                                                                      G[i][j];
        UNROLL for (int i = 0; i < DIM; i++) q0[i * stride + b] = zq[i];
    }
#else /* W prompts in the lanes */
    for (long b0 = 0; b0 < count; b0 += W) {
        const int m = count - b0 < W ? (int)(count - b0) : W;
        vec G[DD] = {{0}}, q[DIM] = {{0}};
        for (int l = 0; l < m; l++)
            for (int i = 0; i < d; i++) q[i][l] = xq[(b0 + l) * sq + i];
        for (int t = 0; t < n; t++) {
            vec z[DIM];
            UNROLL for (int i = 0; i < DIM; i++) z[i] = (vec){0};
            for (int l = 0; l < m; l++) {
                const real *xt = x + (b0 + l) * sx + (long)t * d;
                UNROLL for (int i = 0; i < d; i++) z[i][l] = xt[i];
                z[d][l] = y[(b0 + l) * sy + t];
            }
            UNROLL for (int i = 0; i < DIM; i++) UNROLL for (int j = i; j < DIM; j++) G[i * DIM + j] += z[i] * z[j];
        }
        if (query)
            UNROLL for (int i = 0; i < d; i++) UNROLL for (int j = i; j < d; j++) G[i * DIM + j] += q[i] * q[j];
        UNROLL for (int i = 0; i < DIM; i++) UNROLL for (int j = 0; j < i; j++) G[i * DIM + j] = G[j * DIM + i];
        for (int r = 0; r < DD; r++) NAME(store)(&G[r], m, g0 + r * stride + b0);
        for (int r = 0; r < DIM; r++) NAME(store)(&q[r], m, q0 + r * stride + b0);
    }
#endif
    return 0;
}

/* lanes summed in lane order into dst (+=) */
static void NAME(reduce)(const vec *acc, long count, real *dst) {
    for (long i = 0; i < count; i++) {
        real t = 0;
        for (int l = 0; l < W; l++) t += acc[i][l];
        dst[i] += t;
    }
}

int NAME(ma_backward)(long count, int L, int H, const real *P, const real *Q, real s, int residual, const real *g0,
                      const real *q0, long stride, const real *gout, real *gP, real *gQ) {
    if (L > MAX_LAYERS || H > MAX_HEADS) return 2;
    const long nw = (long)L * H * DD;
    vec *buf = aligned_alloc(VBYTES, sizeof(vec) * (size_t)(2 * nw + (long)L * STATE(H)));
    if (!buf) return 1;
    vec *aP = buf, *aQ = buf + nw, *keep = buf + 2 * nw;
    memset(aP, 0, sizeof(vec) * (size_t)(2 * nw));
    vec G[DD], q[DIM], y, S[DD], qb[DIM];
    for (long b0 = 0; b0 < count; b0 += W) {
        const int m = count - b0 < W ? (int)(count - b0) : W;
        NAME(load)(g0 + b0, stride, DD, m, G);
        NAME(load)(q0 + b0, stride, DIM, m, q);
        NAME(group_forward)(L, H, P, Q, s, residual, G, q, keep, &y);
        memset(qb, 0, sizeof qb);
        NAME(load)(gout + b0, 0, 1, m, qb + DIM - 1); /* lanes m … W − 1: zero adjoint */
        memset(S, 0, sizeof S);
        for (int l = L - 1; l >= 0; l--)
            NAME(layer_backward)(H, P + l * H * DD, Q + l * H * DD, s, keep + (long)l * STATE(H), qb, S, l < L - 1,
                                 l > 0, aP + l * H * DD, aQ + l * H * DD);
    }
    NAME(reduce)(aP, nw, gP);
    NAME(reduce)(aQ, nw, gQ);
    free(buf);
    return 0;
}

#endif
