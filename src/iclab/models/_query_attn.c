/* The query row of one attention layer with softmax or ReLU scores and keys = the sources (W_K = I), prompts in the
   lanes of AVX2 or AVX-512 vectors: iclab.models._query_fast runs it for LinearAttention(query_only=True) where it
   can be built, and computes the same numbers as iclab.models.attention_core.attention_update (Zhang et al. 2025, eq. M with
   softmax scores, Sec. 7 / Fig. 5; Ahn et al. 2023, eq. 3 with ReLU scores).

   For every prompt, head h and the target t (the last token) over the sources s_1 … s_m (the first m tokens):
       q = Q_h t,   l_i = s_iᵀ q,   a = softmax(l) or relu(l),   u = Σ_i a_i s_i,   out = scale Σ_h P_h u.
   qa_forward_* writes out (B, D). qa_backward_* recomputes a group's forward and adds dL/dQ, dL/dP for dL/d(out) =
   gout (the sources are data: no input gradient): with du = scale P_hᵀ g,
       dP_h += scale g uᵀ,   dl_i = a_i (s_iᵀ du − uᵀ du) (softmax) or [l_i > 0] s_iᵀ du (ReLU),
       dQ_h += (Σ_i dl_i s_i) tᵀ,
   summed in lanes, then over lanes in a fixed order, so the result depends on the caller's split of the batch, not on
   its threads. qa_forward_factors is qa_forward that also runs that backward for dL/d(out) = e_col (one column, the
   label a model reads) and writes each group's u and dq per head; qa_factor_grads then gives the gradients for
   dL/d(out) = g e_col from them without reading the sources or running the forward again (dl is linear in du).
   A group is W prompts: its m x D sources are gathered once into vectors (L1-resident at Fig. 5's 32 x 5), every
   per-prompt quantity lives in a vector, and nothing of size B x H x m is ever written to memory (the torch pass
   writes the scores, the weights and their gradients: 4 x 160 MB at Fig. 5's P = 80 000, float64).

   The file is compiled as two instances by including itself: float32 (8 lanes, suffix _f32) and float64 (4 lanes,
   _f64), twice that with AVX-512 (-mavx512f where the CPU has it); exp is _avx_exp.h's. Denormals are flushed to zero inside the calls. Built by iclab.core.native.load() with
   cc -O3 -mavx2 -mfma -DDIM=<token width>, one library per width: with the width known, every loop over a token's
   entries unrolls (at DIM = 5: forward 59 -> 54 ms, backward 85 -> 72 ms against a run-time width, Fig. 5 sizes). */
#ifndef PER_REAL
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "_avx_exp.h"

enum { RELU = 1, SOFTMAX = 3 };
enum { MMAX = 1024 };
#ifndef DIM
#error "compile with -DDIM=<token width>: the kernel is specialised to it (iclab.core.native.load(defines=...))"
#endif

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else /* one instance of the kernel for the real type of PER_REAL */

#include "_simd.h"

/* prompts per vector */
int NAME(qa_lanes)(void) { return W; }

/* rows r … of prompts b0 … b0 + nb − 1 of x (B, rows, D) as vectors X[i * D + k] (rows i = 0 … count − 1, starting
   at row r); lanes past nb are 0 */
static void NAME(gather)(const real *x, long rows, long r, long count, int D, long b0, int nb, V *X) {
    real *f = (real *)X;
    memset(X, 0, sizeof(V) * count * D);
    for (int w = 0; w < nb; w++) {
        const real *xb = x + ((b0 + w) * rows + r) * D;
        for (long i = 0; i < count * D; i++) f[i * W + w] = xb[i];
    }
}

/* vector v's lanes 0 … nb − 1 into x[(b0 + w) * D + k] */
static void NAME(scatter)(const V *v, int D, long b0, int nb, real *x) {
    const real *f = (const real *)v;
    for (int w = 0; w < nb; w++)
        for (int k = 0; k < DIM; k++) x[(b0 + w) * D + k] = f[k * W + w];
}

/* u (D) = Σ_i c_i s_i over the m sources, as two interleaved sums (even and odd i) so that twice as many
   independent FMA chains are in flight (DIM = 5 chains alone leave the FMA units idle for most of their latency) */
static inline void NAME(mix)(int m, const V *c, const V *S, V *u) {
    V even[DIM], odd[DIM];
    for (int k = 0; k < DIM; k++) even[k] = odd[k] = ZERO;
    int i = 0;
    for (; i + 1 < m; i += 2) {
        const V *s0 = S + (long)i * DIM, *s1 = s0 + DIM;
        for (int k = 0; k < DIM; k++) even[k] = FMA(c[i], s0[k], even[k]), odd[k] = FMA(c[i + 1], s1[k], odd[k]);
    }
    if (i < m)
        for (int k = 0; k < DIM; k++) even[k] = FMA(c[i], S[(long)i * DIM + k], even[k]);
    for (int k = 0; k < DIM; k++) u[k] = ADD(even[k], odd[k]);
}

/* one head's forward on a group: q = Q t, a (m) = the weights, u = Σ_i a_i s_i */
static void NAME(head)(int m, int act, const real *Q, const V *S, const V *t, V *q, V *a, V *u) {
    for (int k = 0; k < DIM; k++) {
        V acc = ZERO;
        for (int j = 0; j < DIM; j++) acc = FMA(SET1(Q[k * DIM + j]), t[j], acc);
        q[k] = acc;
    }
    for (int i = 0; i < m; i++) {
        const V *s = S + (long)i * DIM;
        V l = MUL(q[0], s[0]);
        for (int k = 1; k < DIM; k++) l = FMA(q[k], s[k], l);
        a[i] = l;
    }
    if (act == SOFTMAX) {
        NAME(softmax_lanes)(a, m);
    } else {
        for (int i = 0; i < m; i++) a[i] = MAX(a[i], ZERO);
    }
    NAME(mix)(m, a, S, u);
}

/* one head's backward on a group from its forward (a, u) for du = dL/du: c = uᵀ du, a becomes
   dl_i = a_i (s_iᵀ du − c) (softmax) or [l_i > 0] s_iᵀ du (ReLU), and dq = Σ_i dl_i s_i */
static void NAME(head_back)(int m, int act, const V *S, V *a, const V *u, const V *du, V *dq) {
    V c = ZERO;
    for (int k = 0; k < DIM; k++) c = FMA(u[k], du[k], c);
    for (int i = 0; i < m; i++) {
        const V *s = S + (long)i * DIM;
        V da = MUL(du[0], s[0]);
        for (int k = 1; k < DIM; k++) da = FMA(du[k], s[k], da);
        a[i] = act == SOFTMAX ? MUL(a[i], SUB(da, c)) : KEEP_GT(da, a[i], ZERO);
    }
    NAME(mix)(m, a, S, dq);
}

static int NAME(bad)(int m, int D, int act) {
    return D != DIM || m < 1 || m > MMAX || (act != RELU && act != SOFTMAX);
}

/* out (B, D) from z (B, T, D): the sources are rows 0 … m − 1, the target row T − 1; Q, P (H, D, D). 0, 1 if out of
   memory, 2 for a shape or activation the kernel does not take */
int NAME(qa_forward)(int B, int T, int m, int D, int H, int act, real scale, const real *z, const real *Q,
                     const real *P, real *out) {
    if (NAME(bad)(m, D, act)) return 2;
    V *buf = aligned_alloc(VALIGN, sizeof(V) * ((long)m * D + m + 4 * DIM));
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    V *S = buf, *a = S + (long)m * D, *t = a + m, *q = t + DIM, *u = q + DIM, *o = u + DIM;
    for (long b0 = 0; b0 < B; b0 += W) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(z, T, 0, m, D, b0, nb, S);
        NAME(gather)(z, T, T - 1, 1, D, b0, nb, t);
        for (int e = 0; e < DIM; e++) o[e] = ZERO;
        for (int h = 0; h < H; h++) {
            const real *Ph = P + (long)h * DIM * DIM;
            NAME(head)(m, act, Q + (long)h * DIM * DIM, S, t, q, a, u);
            for (int e = 0; e < DIM; e++) {
                V acc = o[e];
                for (int k = 0; k < DIM; k++) acc = FMA(SET1(scale * Ph[e * DIM + k]), u[k], acc);
                o[e] = acc;
            }
        }
        NAME(scatter)(o, D, b0, nb, out);
    }
    free(buf), _mm_setcsr(csr);
    return 0;
}

/* adds dL/dQ, dL/dP (H, D, D) for dL/d(out) = gout (B, D) into gQ, gP; arguments and codes as qa_forward */
int NAME(qa_backward)(int B, int T, int m, int D, int H, int act, real scale, const real *z, const real *Q,
                      const real *P, const real *gout, real *gQ, real *gP) {
    if (NAME(bad)(m, D, act)) return 2;
    long dd = (long)DIM * DIM;
    V *buf = aligned_alloc(VALIGN, sizeof(V) * ((long)m * D + m + 5 * DIM + 2 * H * dd));
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    V *S = buf, *a = S + (long)m * D, *t = a + m, *q = t + DIM, *u = q + DIM, *g = u + DIM;
    V *du = g + DIM;
    V *accQ = du + DIM, *accP = accQ + H * dd;
    for (long i = 0; i < 2 * H * dd; i++) accQ[i] = ZERO;
    for (long b0 = 0; b0 < B; b0 += W) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(z, T, 0, m, D, b0, nb, S);
        NAME(gather)(z, T, T - 1, 1, D, b0, nb, t);
        NAME(gather)(gout, 1, 0, 1, D, b0, nb, g);
        for (int h = 0; h < H; h++) {
            const real *Ph = P + (long)h * dd;
            V *aQ = accQ + h * dd, *aP = accP + h * dd;
            NAME(head)(m, act, Q + h * dd, S, t, q, a, u);
            for (int k = 0; k < DIM; k++) {
                V acc = ZERO;
                for (int e = 0; e < DIM; e++) acc = FMA(SET1(scale * Ph[e * DIM + k]), g[e], acc);
                du[k] = acc;
            }
            for (int e = 0; e < DIM; e++) {
                V ge = MUL(SET1(scale), g[e]);
                for (int k = 0; k < DIM; k++) aP[e * DIM + k] = FMA(ge, u[k], aP[e * DIM + k]);
            }
            NAME(head_back)(m, act, S, a, u, du, q); /* q becomes dq = Σ_i dl_i s_i */
            for (int k = 0; k < DIM; k++)
                for (int j = 0; j < DIM; j++) aQ[k * DIM + j] = FMA(q[k], t[j], aQ[k * DIM + j]);
        }
    }
    for (long i = 0; i < H * dd; i++) gQ[i] += NAME(lanes_sum)(accQ[i]), gP[i] += NAME(lanes_sum)(accP[i]);
    free(buf), _mm_setcsr(csr);
    return 0;
}

/* qa_forward's out and, for a gradient on out[:, col] alone, each group's factors of dL/dQ and dL/dP: F holds, per
   group of W prompts (the last one padded) and head, the vectors u (DIM) and dq = Σ_i dl_i s_i (DIM) for
   dL/d(out) = e_col (du = scale P_hᵀ e_col, the same for every prompt), lanes as the prompts: 2 H DIM W reals a group,
   stored as the kernel holds them. dl is linear in du, so for dL/d(out) = g e_col, dL/dP_h = scale Σ_b g_b e_col u_bᵀ
   and dL/dQ_h = Σ_b g_b dq_b t_bᵀ (qa_factor_grads): one pass over the prompts gives the value and what the backward
   needs, which then reads 2 H D numbers a prompt instead of its m + 1 tokens and does not run the forward again.
   Codes as qa_forward */
int NAME(qa_forward_factors)(int B, int T, int m, int D, int H, int act, real scale, const real *z, const real *Q,
                             const real *P, int col, real *out, real *F) {
    if (NAME(bad)(m, D, act) || col < 0 || col >= DIM) return 2;
    long dd = (long)DIM * DIM;
    V *buf = aligned_alloc(VALIGN, sizeof(V) * ((long)m * D + m + 5 * DIM));
    if (!buf) return 1;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    V *S = buf, *a = S + (long)m * D, *t = a + m, *q = t + DIM, *u = q + DIM, *o = u + DIM, *du = o + DIM;
    real *Fg = F;
    for (long b0 = 0; b0 < B; b0 += W) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(z, T, 0, m, D, b0, nb, S);
        NAME(gather)(z, T, T - 1, 1, D, b0, nb, t);
        for (int e = 0; e < DIM; e++) o[e] = ZERO;
        for (int h = 0; h < H; h++, Fg += 2 * DIM * W) {
            const real *Ph = P + h * dd;
            NAME(head)(m, act, Q + h * dd, S, t, q, a, u);
            for (int e = 0; e < DIM; e++) {
                V acc = o[e];
                for (int k = 0; k < DIM; k++) acc = FMA(SET1(scale * Ph[e * DIM + k]), u[k], acc);
                o[e] = acc;
            }
            for (int k = 0; k < DIM; k++) du[k] = SET1(scale * Ph[col * DIM + k]), STOREU(Fg + k * W, u[k]);
            NAME(head_back)(m, act, S, a, u, du, q); /* q becomes dq */
            for (int k = 0; k < DIM; k++) STOREU(Fg + (DIM + k) * W, q[k]);
        }
        NAME(scatter)(o, D, b0, nb, out);
    }
    free(buf), _mm_setcsr(csr);
    return 0;
}

/* adds dL/dQ, dL/dP (H, D, D) for dL/d(out) = g e_col from qa_forward_factors' F and the targets z[:, T − 1];
   gout (B, D) is read at column col only. Summed in lanes, then over lanes in a fixed order */
int NAME(qa_factor_grads)(int B, int T, int D, int H, int col, real scale, const real *z, const real *F,
                          const real *gout, real *gQ, real *gP) {
    if (D != DIM || col < 0 || col >= DIM) return 2;
    long dd = (long)DIM * DIM;
    V *buf = aligned_alloc(VALIGN, sizeof(V) * (2 * DIM + H * dd + H * DIM));
    if (!buf) return 1;
    V *t = buf, *g = t + DIM, *accQ = g + DIM, *accP = accQ + H * dd;
    for (long i = 0; i < H * dd + H * DIM; i++) accQ[i] = ZERO;
    const real *Fg = F;
    for (long b0 = 0; b0 < B; b0 += W) {
        int nb = B - b0 < W ? (int)(B - b0) : W;
        NAME(gather)(z, T, T - 1, 1, D, b0, nb, t);
        NAME(gather)(gout, 1, 0, 1, D, b0, nb, g);
        for (int h = 0; h < H; h++, Fg += 2 * DIM * W) {
            V *aQ = accQ + h * dd, *aP = accP + h * DIM;
            for (int k = 0; k < DIM; k++) {
                aP[k] = FMA(g[col], LOADU(Fg + k * W), aP[k]);
                V gq = MUL(g[col], LOADU(Fg + (DIM + k) * W));
                for (int j = 0; j < DIM; j++) aQ[k * DIM + j] = FMA(gq, t[j], aQ[k * DIM + j]);
            }
        }
    }
    for (int h = 0; h < H; h++) {
        for (long i = 0; i < dd; i++) gQ[h * dd + i] += NAME(lanes_sum)(accQ[h * dd + i]);
        for (int k = 0; k < DIM; k++) gP[h * dd + col * DIM + k] += scale * NAME(lanes_sum)(accP[h * DIM + k]);
    }
    free(buf);
    return 0;
}

#endif
