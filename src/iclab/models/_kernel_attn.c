/* The L-layer kernel-attention stack of Cheng, Chen, Sra 2024 (eq. (2)-(5), (26)) with its backward, W prompts at a
   time in the lanes of AVX2 or AVX-512 vectors: iclab.models._kernel_fast runs it where it can be built, and computes the same
   numbers by torch code elsewhere.

   Prompt b holds tokens z_t = (x_t, y_t), t < n, and the query z_n = (x_q, 0); D = d + 1, T = n + 1. Layer l, head h:
       Δz_j = s Σ_{i<n} h̃(S_ji) [A x_i; r y_i],   S_ji = g_jᵀ x_i,   g_j = Kᵀ x_j,
   with K = K[l, h] (d x d, row-major [c][a]), A = A[l, h] (A == NULL: A ≡ 0, only the label row moves), r = r[l, h],
   s = scale, h̃ by acts[h]: 0 linear, 1 relu, 2 exp (exp(min(S, cap)) when has_cap), 3 softmax over the n sources.
   The last layer updates the query only. The output is the query's label slot of z_L.

   Each target row's scores, weights, mix and adjoints stay in registers and L1; a group's z_l, weights P and mixes
   U = Σ_i P_ji z_i live in one scratch buffer. ka_forward_* can keep the weights P of every group (ka_kept_*: that
   many reals), so that ka_backward_* replays only the products (z_l, U) before the backward; without them it replays
   the whole forward. The backward adds dL/dK, dL/dA, dL/dr for dL/d(out) = gout into gK, gA, gr: sums in lanes, then
   over lanes in a fixed order, so the result depends on the caller's split of the batch, not on its threads.
   ka_jacobian_* instead runs each group's backward inside the forward for dL/d(out) = 1 and writes every prompt's
   d out / d(K, A, r) (lanes, one row per group); ka_vjp_* is then the whole backward: no replay.

   The file is compiled as two instances by including itself: float32 (8 lanes, suffix _f32) and float64 (4 lanes,
   _f64), twice that with AVX-512 (-mavx512f where the CPU has it); exp is _avx_exp.h's. Denormals are flushed to zero
   inside the calls. Built by iclab.core.native.load() with cc -O3 -mavx2 -mfma. */
#ifndef PER_REAL
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "_avx_exp.h"

enum { LINEAR = 0, RELU = 1, EXP = 2, SOFTMAX = 3 };
enum { DMAX = 32, NMAX = 256 };
#define KA_INLINE static inline __attribute__((always_inline))
/* `call` (an expression in sp, the Spec it runs on) with sp = s, or where d = 5 (Cheng et al.'s experiments) on a
   copy of s whose d, and with A free and one head (any h̃) or the two heads (linear, exp) of Fig. 4's model also H,
   A != NULL and the h̃ of each head, are constants of the inlined code: the d-long loops over K's rows, g and the
   adjoints unroll into registers and the branches on h̃ and A leave the loops. The same operations in the same
   order: the same bits. */
#define KA_DISPATCH(s, call)                                                                                           \
    do {                                                                                                               \
        static const int one_[4][1] = {{LINEAR}, {RELU}, {EXP}, {SOFTMAX}}, linear_exp_[2] = {LINEAR, EXP};            \
        if ((s)->d == 5 && (s)->A && (((s)->H == 1 && (s)->acts[0] >= LINEAR && (s)->acts[0] <= SOFTMAX) ||            \
                                      ((s)->H == 2 && (s)->acts[0] == LINEAR && (s)->acts[1] == EXP))) {               \
            Spec c_ = *(s);                                                                                            \
            const Spec *sp = &c_;                                                                                      \
            c_.d = 5, c_.D = 6;                                                                                        \
            if (!c_.A) __builtin_unreachable();                                                                        \
            if (c_.H == 2) {                                                                                           \
                c_.H = 2, c_.acts = linear_exp_;                                                                       \
                call;                                                                                                  \
            } else if (c_.acts[0] == EXP) {                                                                            \
                c_.H = 1, c_.acts = one_[EXP];                                                                         \
                call;                                                                                                  \
            } else if (c_.acts[0] == RELU) {                                                                           \
                c_.H = 1, c_.acts = one_[RELU];                                                                        \
                call;                                                                                                  \
            } else if (c_.acts[0] == LINEAR) {                                                                         \
                c_.H = 1, c_.acts = one_[LINEAR];                                                                      \
                call;                                                                                                  \
            } else {                                                                                                   \
                c_.H = 1, c_.acts = one_[SOFTMAX];                                                                     \
                call;                                                                                                  \
            }                                                                                                          \
        } else if ((s)->d == 5) {                                                                                      \
            Spec c_ = *(s);                                                                                            \
            const Spec *sp = &c_;                                                                                      \
            c_.d = 5, c_.D = 6;                                                                                        \
            call;                                                                                                      \
        } else {                                                                                                       \
            const Spec *sp = (s);                                                                                      \
            call;                                                                                                      \
        }                                                                                                              \
    } while (0)

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else /* one instance of the kernel for the real type of PER_REAL */

#include "_simd.h"

typedef struct {
    int L, H, d, n, T, D, has_cap;
    const int *acts;
    const real *K, *A, *r;
    real scale, cap;
} NAME(Spec);
#define Spec NAME(Spec)

KA_INLINE int NAME(rows_of)(const Spec *s, int l) { return l == s->L - 1 ? 1 : s->T; }

/* A group's scratch: per layer z_l (l >= 1), then per head P (Tt x n) and U (D x Tt). Writes where layer l's heads
   and z_l start (heads, zs: L entries each; zs[0] unused) and returns its size in vectors: the one walk of the layout
   that forward_group follows. */
static long NAME(layout)(const Spec *s, long *heads, long *zs) {
    long v = 0;
    for (int l = 0; l < s->L; l++) {
        int Tt = NAME(rows_of)(s, l);
        if (l > 0) zs[l] = v, v += (long)s->D * s->T;
        heads[l] = v;
        v += (long)s->H * ((long)Tt * s->n + (long)s->D * Tt);
    }
    return v;
}

/* vectors kept per group between the calls: per layer and head P (Tt x n) */
static long NAME(kept_vectors)(const Spec *s) {
    long v = 0;
    for (int l = 0; l < s->L; l++) v += (long)s->H * NAME(rows_of)(s, l) * s->n;
    return v;
}

/* the weights P of a group, from its scratch (laid out by `heads`) into `kept` (to = 0) or back (to = 1) */
static void NAME(copy_kept)(const Spec *s, const long *heads, V *full, V *kept, int to) {
    for (int l = 0; l < s->L; l++) {
        long Tt = NAME(rows_of)(s, l), np = Tt * s->n;
        for (int h = 0; h < s->H; h++, kept += np) {
            V *P = full + heads[l] + h * (np + (long)s->D * Tt);
            memcpy(to ? P : kept, to ? kept : P, sizeof(V) * np);
        }
    }
}

/* z_0 of prompts b0 … b0 + nb - 1 (lanes past nb are 0) as D x T vectors; prompt b's x (n x d, rows contiguous), y
   (n) and xq (d) start at x + b sx, y + b sy, xq + b sq (strides in reals: views of a wider prompt need no copy) */
KA_INLINE void NAME(gather)(const Spec *s, const real *x, const real *y, const real *xq, const long *st, long b0,
                            int nb, V *z) {
    int d = s->d, n = s->n, T = s->T;
    real *f = (real *)z;
    memset(z, 0, sizeof(V) * s->D * T);
    for (int w = 0; w < nb; w++) {
        const real *xb = x + (b0 + w) * st[0], *yb = y + (b0 + w) * st[1], *qb = xq + (b0 + w) * st[2];
        for (int t = 0; t < n; t++) {
            for (int c = 0; c < d; c++) f[((long)c * T + t) * W + w] = xb[t * d + c];
            f[((long)d * T + t) * W + w] = yb[t];
        }
        for (int c = 0; c < d; c++) f[((long)c * T + n) * W + w] = qb[c];
    }
}

/* g = Kᵀ x_j (d) */
KA_INLINE void NAME(key_of)(const Spec *s, const real *K, const V *z, int j, V *g) {
    int d = s->d, T = s->T;
    for (int a = 0; a < d; a++) g[a] = ZERO;
    for (int c = 0; c < d; c++) {
        V xc = LD(z + c * T + j);
        for (int a = 0; a < d; a++) g[a] = FMA(SET1(K[c * d + a]), xc, g[a]);
    }
}

/* P (n) = h̃(S_j·): the weights of target j's sources */
KA_INLINE void NAME(weights)(const Spec *s, int act, const V *g, const V *z, V *P) {
    int d = s->d, n = s->n, T = s->T;
    for (int i = 0; i < n; i++) {
        V acc = MUL(g[0], LD(z + i));
        for (int a = 1; a < d; a++) acc = FMA(g[a], LD(z + a * T + i), acc);
        P[i] = acc;
    }
    if (act == SOFTMAX) {
        NAME(softmax_lanes)(P, n);
    } else if (act == EXP) {
        V cap = SET1(s->cap);
        for (int i = 0; i < n; i++) P[i] = VEXP(s->has_cap ? MIN(P[i], cap) : P[i]);
    } else if (act == RELU) {
        for (int i = 0; i < n; i++) P[i] = MAX(P[i], ZERO);
    }
}

/* a group through every layer: P (unless have_P: already in the scratch st), U and z_{l+1} into st; z_L in zn */
KA_INLINE void NAME(forward_group)(const Spec *s, const V *z, V *zn, V *st, int have_P) {
    int L = s->L, H = s->H, d = s->d, D = s->D, T = s->T, n = s->n;
    V g[DMAX], u[DMAX + 1];
    for (int l = 0; l < L; l++) {
        int Tt = NAME(rows_of)(s, l);
        memcpy(zn, z, sizeof(V) * D * T);
        for (int h = 0; h < H; h++) {
            const real *K = s->K + (long)(l * H + h) * d * d;
            const real *A = s->A ? s->A + (long)(l * H + h) * d * d : NULL;
            V rs = SET1(s->r[l * H + h] * s->scale), scale = SET1(s->scale);
            V *P = st, *U = st + (long)Tt * n;
            st += (long)Tt * n + (long)D * Tt;
            int c0 = A ? 0 : d;
            for (int jj = 0; jj < Tt; jj++) {
                int j = T - Tt + jj;
                V *Pj = P + (long)jj * n;
                if (!have_P) NAME(key_of)(s, K, z, j, g), NAME(weights)(s, s->acts[h], g, z, Pj);
                for (int c = c0; c < D; c++) {
                    V acc0 = MUL(Pj[0], LD(z + c * T)), acc1 = ZERO; /* two chains */
                    int i = 1;
                    for (; i + 1 < n; i += 2) {
                        acc1 = FMA(Pj[i], LD(z + c * T + i), acc1);
                        acc0 = FMA(Pj[i + 1], LD(z + c * T + i + 1), acc0);
                    }
                    if (i < n) acc1 = FMA(Pj[i], LD(z + c * T + i), acc1);
                    U[c * Tt + jj] = u[c] = ADD(acc0, acc1);
                }
                zn[d * T + j] = FMA(rs, u[d], zn[d * T + j]);
                if (A)
                    for (int c = 0; c < d; c++) {
                        V acc = ZERO;
                        for (int e = 0; e < d; e++) acc = FMA(SET1(A[c * d + e]), u[e], acc);
                        zn[c * T + j] = FMA(scale, acc, zn[c * T + j]);
                    }
            }
        }
        if (l + 1 < L) { /* z_{l+1} */
            memcpy(st, zn, sizeof(V) * D * T);
            z = st;
            st += (long)D * T;
        }
    }
}

/* a group's adjoints from gz = dL/dz_L back to z_1, with the parameter gradients summed in accK, accA, accr */
KA_INLINE void NAME(backward_group)(const Spec *s, const V *z0, const V *st, const long *heads, const long *zs, V *gz,
                                 V *gin, V *accK, V *accA, V *accr) {
    int L = s->L, H = s->H, d = s->d, D = s->D, T = s->T, n = s->n;
    V g[DMAX], gu[DMAX + 1], gzj[DMAX + 1], gg[DMAX], gS[NMAX];
    for (int l = L - 1; l >= 0; l--) {
        int Tt = NAME(rows_of)(s, l), need_gin = l > 0; /* z_0 is data: it needs no adjoint */
        const V *z = l == 0 ? z0 : st + zs[l];
        if (need_gin) memcpy(gin, gz, sizeof(V) * D * T); /* the residual */
        for (int h = 0; h < H; h++) {
            int lh = l * H + h, act = s->acts[h];
            const real *K = s->K + (long)lh * d * d, *A = s->A ? s->A + (long)lh * d * d : NULL;
            V rs = SET1(s->r[lh] * s->scale), scale = SET1(s->scale), expcap = VEXP(SET1(s->cap));
            const V *P = st + heads[l] + (long)h * ((long)Tt * n + (long)D * Tt), *U = P + (long)Tt * n;
            V *aK = accK + (long)lh * d * d, *aA = accA + (long)lh * d * d;
            int c0 = A ? 0 : d;
            for (int jj = 0; jj < Tt; jj++) {
                int j = T - Tt + jj;
                const V *Pj = P + (long)jj * n;
                for (int c = c0; c < D; c++) gzj[c] = LD(gz + c * T + j);
                gu[d] = MUL(rs, gzj[d]);
                accr[lh] = FMA(gzj[d], U[d * Tt + jj], accr[lh]);
                if (A) /* Δx_j = s A u_j: dA += s gz_j u_jᵀ, gu = s Aᵀ gz_j */
                    for (int c = 0; c < d; c++) {
                        V acc = ZERO, uc = U[c * Tt + jj];
                        for (int e = 0; e < d; e++) {
                            acc = FMA(SET1(A[e * d + c]), gzj[e], acc);
                            aA[e * d + c] = FMA(gzj[e], uc, aA[e * d + c]);
                        }
                        gu[c] = MUL(scale, acc);
                    }
                V rowdot = ZERO; /* Σ_i P_ji dP_ji = Σ_c gu_c u_c (softmax) */
                if (act == SOFTMAX)
                    for (int c = c0; c < D; c++) rowdot = FMA(gu[c], U[c * Tt + jj], rowdot);
                int covs = need_gin && A; /* the sources' covariate adjoints through S too, in the same pass */
                if (covs) NAME(key_of)(s, K, z, j, g);
                for (int i = 0; i < n; i++) {
                    V acc = MUL(gu[c0], LD(z + c0 * T + i)), p = Pj[i]; /* dP_ji = gu · z_i */
                    for (int c = c0 + 1; c < D; c++) acc = FMA(gu[c], LD(z + c * T + i), acc);
                    if (act == SOFTMAX)
                        acc = MUL(SUB(acc, rowdot), p);
                    else if (act == EXP)
                        acc = s->has_cap ? KEEP_LT(MUL(acc, p), p, expcap) : MUL(acc, p);
                    else if (act == RELU)
                        acc = KEEP_GT(acc, p, ZERO);
                    gS[i] = acc;
                    if (covs) /* gin_ci += P_ji gu_c + dS_ji g_c: one pass over gin, the two sums in this order */
                        for (int c = 0; c < d; c++) gin[c * T + i] = FMA(acc, g[c], FMA(p, gu[c], gin[c * T + i]));
                    if (need_gin)
                        for (int c = covs ? d : c0; c < D; c++) gin[c * T + i] = FMA(p, gu[c], gin[c * T + i]);
                }
                for (int a = 0; a < d; a++) { /* gg = Σ_i dS_ji x_i: dK += x_j ggᵀ */
                    V acc0 = MUL(gS[0], LD(z + a * T)), acc1 = ZERO;
                    int i = 1;
                    for (; i + 1 < n; i += 2) {
                        acc1 = FMA(gS[i], LD(z + a * T + i), acc1);
                        acc0 = FMA(gS[i + 1], LD(z + a * T + i + 1), acc0);
                    }
                    if (i < n) acc1 = FMA(gS[i], LD(z + a * T + i), acc1);
                    gg[a] = ADD(acc0, acc1);
                }
                for (int c = 0; c < d; c++) {
                    V xc = LD(z + c * T + j);
                    for (int a = 0; a < d; a++) aK[c * d + a] = FMA(xc, gg[a], aK[c * d + a]);
                }
                if (covs) /* the target's covariate adjoint through g = Kᵀ x_j */
                    for (int c = 0; c < d; c++) {
                        V acc = gin[c * T + j];
                        for (int a = 0; a < d; a++) acc = FMA(SET1(K[c * d + a]), gg[a], acc);
                        gin[c * T + j] = acc;
                    }
            }
        }
        if (need_gin) {
            V *t = gz;
            gz = gin, gin = t;
        }
    }
}

static Spec NAME(spec)(int L, int H, int d, int n, const int *acts, const real *K, const real *A, const real *r,
                       real scale, int has_cap, real cap) {
    Spec s = {L, H, d, n, n + 1, d + 1, has_cap, acts, K, A, r, scale, cap};
    return s;
}

/* prompts per vector: the group size the Python side rounds a batch part up to when it sizes the Jacobian */
int NAME(ka_lanes)(void) { return W; }

/* reals kept for B prompts between ka_forward and ka_backward */
long NAME(ka_kept)(int B, int L, int H, int d, int n) {
    Spec s = NAME(spec)(L, H, d, n, NULL, NULL, NULL, NULL, 1, 0, 0);
    return ((long)B + W - 1) / W * NAME(kept_vectors)(&s) * W;
}

/* A call's scratch: `before` vectors, then one group's scratch laid out by `heads` (L + L offsets, allocated here);
   NULL (nothing left allocated) if out of memory */
static V *NAME(scratch)(const Spec *s, long **heads, long before) {
    *heads = malloc(sizeof(long) * s->L * 2);
    if (!*heads) return NULL;
    V *buf = aligned_alloc(VALIGN, sizeof(V) * (before + NAME(layout)(s, *heads, *heads + s->L)));
    if (!buf) free(*heads);
    return buf;
}

/* ka_forward's groups in the scratch z0, zn (2 D x T vectors at buf) and full */
KA_INLINE void NAME(forward_groups)(const Spec *s, const long *heads, V *buf, long kv, int B, const real *x,
                                    const real *y, const real *xq, const long *strides, real *out, real *kept) {
    long zv = (long)s->D * s->T;
    V *z0 = buf, *zn = buf + zv, *full = buf + 2 * zv;
    for (long b0 = 0, gi = 0; b0 < B; b0 += W, gi++) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(s, x, y, xq, strides, b0, nb, z0);
        NAME(forward_group)(s, z0, zn, full, 0);
        if (kept) NAME(copy_kept)(s, heads, full, (V *)kept + gi * kv, 0);
        real o[W];
        STOREU(o, zn[s->d * s->T + s->n]);
        for (int w = 0; w < nb; w++) out[b0 + w] = o[w];
    }
}

/* out (B) from x (B x n x d), y (B x n), xq (B x d) (prompt strides: gather), and (kept != NULL) the weights for
   ka_backward; 0, 1 if out of memory, 2 if d > DMAX or n > NMAX */
int NAME(ka_forward)(int B, int L, int H, int d, int n, const int *acts, const real *K, const real *A, const real *r,
                     real scale, int has_cap, real cap, const real *x, const real *y, const real *xq,
                     const long *strides, real *out, real *kept) {
    if (d > DMAX || n > NMAX) return 2;
    Spec s = NAME(spec)(L, H, d, n, acts, K, A, r, scale, has_cap, cap);
    long *heads, kv = NAME(kept_vectors)(&s), zv = (long)s.D * s.T;
    V *buf = NAME(scratch)(&s, &heads, 2 * zv);
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    KA_DISPATCH(&s, NAME(forward_groups)(sp, heads, buf, kv, B, x, y, xq, strides, out, kept));
    free(heads), free(buf), _mm_setcsr(csr);
    return 0;
}

/* Every group forward (from the kept weights when kept != NULL) and back, in the scratch z0, zn, gz, gin (4 D x T
   vectors at buf) and full. gout != NULL: dL/d(out) = gout, the lanes' gradients summed into acc (K, A, r:
   2 L H d² + L H vectors); gout == NULL: dL/d(out) = 1 in every used lane, each group's into its own row of acc, and
   out written. */
KA_INLINE void NAME(groups_body)(const Spec *s, const long *heads, V *buf, V *full, int B, const real *x, const real *y,
                                const real *xq, const long *strides, const real *kept, const real *gout, real *out,
                                V *acc) {
    int L = s->L, d = s->d, n = s->n, T = s->T;
    long zv = (long)s->D * T, kv = NAME(kept_vectors)(s), pv = (long)L * s->H * d * d, nw = 2 * pv + L * s->H;
    V *z0 = buf, *zn = buf + zv, *gz = buf + 2 * zv, *gin = buf + 3 * zv;
    for (long b0 = 0, gi = 0; b0 < B; b0 += W, gi++) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(s, x, y, xq, strides, b0, nb, z0);
        if (kept) NAME(copy_kept)(s, heads, full, (V *)kept + gi * kv, 1);
        NAME(forward_group)(s, z0, zn, full, kept != NULL);
        real seed[W] = {0}, o[W];
        V *to = acc;
        if (gout) {
            for (int w = 0; w < nb; w++) seed[w] = gout[b0 + w];
        } else {
            STOREU(o, zn[d * T + n]);
            for (int w = 0; w < nb; w++) out[b0 + w] = o[w], seed[w] = 1;
            to = acc + gi * nw;
            memset(to, 0, sizeof(V) * nw);
        }
        memset(gz, 0, sizeof(V) * zv);
        gz[d * T + n] = LOADU(seed);
        NAME(backward_group)(s, z0, full, heads, heads + L, gz, gin, to, to + pv, to + 2 * pv);
    }
}

static void NAME(groups_backward)(const Spec *s, const long *heads, V *buf, V *full, int B, const real *x,
                                  const real *y, const real *xq, const long *strides, const real *kept,
                                  const real *gout, real *out, V *acc) {
    KA_DISPATCH(s, NAME(groups_body)(sp, heads, buf, full, B, x, y, xq, strides, kept, gout, out, acc));
}

/* gK, gA (L x H x d x d; A == NULL: not touched), gr (L x H) += the gradients of Σ_b gout_b out_b, the forward
   replayed per group from the kept weights (only the products) or in full (kept == NULL); 0, 1 if out of memory,
   2 if d > DMAX or n > NMAX */
int NAME(ka_backward)(int B, int L, int H, int d, int n, const int *acts, const real *K, const real *A, const real *r,
                      real scale, int has_cap, real cap, const real *x, const real *y, const real *xq,
                      const long *strides, const real *kept, const real *gout, real *gK, real *gA, real *gr) {
    if (d > DMAX || n > NMAX) return 2;
    Spec s = NAME(spec)(L, H, d, n, acts, K, A, r, scale, has_cap, cap);
    long *heads, zv = (long)s.D * s.T, pv = (long)L * H * d * d, nw = 2 * pv + L * H;
    V *buf = NAME(scratch)(&s, &heads, 4 * zv + nw);
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    V *acc = buf + 4 * zv;
    memset(acc, 0, sizeof(V) * nw);
    NAME(groups_backward)(&s, heads, buf, acc + nw, B, x, y, xq, strides, kept, gout, NULL, acc);
    for (long i = 0; i < pv; i++) gK[i] += NAME(lanes_sum)(acc[i]);
    if (A)
        for (long i = 0; i < pv; i++) gA[i] += scale * NAME(lanes_sum)(acc[pv + i]);
    for (int i = 0; i < L * H; i++) gr[i] += scale * NAME(lanes_sum)(acc[2 * pv + i]);
    free(heads), free(buf), _mm_setcsr(csr);
    return 0;
}

/* out (B) and every prompt's d out / d(K, A, r) in lanes, J (ceil(B / W) groups x (2 L H d² + L H) x W reals: K, A, r
   in ka_backward's layout, A's and r's without the factor s, which ka_vjp applies), so that ka_vjp is the whole
   backward of a step, with no replay. 0, 1 if out of memory, 2 if d > DMAX or n > NMAX */
int NAME(ka_jacobian)(int B, int L, int H, int d, int n, const int *acts, const real *K, const real *A, const real *r,
                      real scale, int has_cap, real cap, const real *x, const real *y, const real *xq,
                      const long *strides, real *out, real *J) {
    if (d > DMAX || n > NMAX) return 2;
    Spec s = NAME(spec)(L, H, d, n, acts, K, A, r, scale, has_cap, cap);
    long *heads, zv = (long)s.D * s.T;
    V *buf = NAME(scratch)(&s, &heads, 4 * zv);
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    NAME(groups_backward)(&s, heads, buf, buf + 4 * zv, B, x, y, xq, strides, NULL, NULL, out, (V *)J);
    free(heads), free(buf), _mm_setcsr(csr);
    return 0;
}

/* gK, gA (A == 0: not touched), gr += Σ_b gout_b d out_b / d(K, A, r) from ka_jacobian's J: over groups in order,
   then over lanes. 0, 1 if out of memory */
int NAME(ka_vjp)(int B, int L, int H, int d, int has_A, real scale, const real *J, const real *gout, real *gK,
                 real *gA, real *gr) {
    long pv = (long)L * H * d * d, nw = 2 * pv + L * H;
    V *acc = aligned_alloc(VALIGN, sizeof(V) * nw);
    if (!acc) return 1;
    memset(acc, 0, sizeof(V) * nw);
    for (long b0 = 0, gi = 0; b0 < B; b0 += W, gi++) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        real go[W] = {0};
        for (int w = 0; w < nb; w++) go[w] = gout[b0 + w];
        V g = LOADU(go);
        const V *Jg = (const V *)J + gi * nw;
        for (long i = 0; i < nw; i++) acc[i] = FMA(Jg[i], g, acc[i]);
    }
    for (long i = 0; i < pv; i++) gK[i] += NAME(lanes_sum)(acc[i]);
    if (has_A)
        for (long i = 0; i < pv; i++) gA[i] += scale * NAME(lanes_sum)(acc[pv + i]);
    for (int i = 0; i < L * H; i++) gr[i] += scale * NAME(lanes_sum)(acc[2 * pv + i]);
    free(acc);
    return 0;
}

#undef Spec
#endif
