/* Euler steps of gradient descent on Zhang, Singh, Latham, Saxe 2025's reduced separate-head attention (eq. S:
   ŷ_q = Σ_i Σ_r v_i βᵀ k_ir q_irᵀ x_q), for iclab.training.population, whose torch loop computes the same numbers
   up to the order of the sums.

   Per step, for every seed: W = Σ_ir v_i k_ir q_irᵀ (d, d), then G = −½ ∂L/∂W by
       population (eq. 57):  G = Λ² − E(Λ̂²) W Λ;
       moments:              G[a, b] = (c − M vec W)[b·d + a], vec W[b·d + a] = W[a, b] (columns stacked, as z);
   then the flows (eq. 84a-c) dv_i = Σ_r k_irᵀ G q_ir, dk_ir = v_i G q_ir, dq_ir = v_i Gᵀ k_ir, all from the
   parameters before the step, and θ += alpha · dθ. One call runs `steps` steps: the Python loop's ≈ 15 tensor
   operations a step (≈ 60 µs of dispatch for d ≤ 16) become a few hundred flops. Compiled as two instances by
   including itself: float32 (_f32) and float64 (_f64). */
#ifndef PER_REAL
#include <stdlib.h>

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else
#include "../core/_per_real.h"

/* W (d, d) of one seed's v (H), k, q (H·R rows of d). */
static void NAME(rf_matrix)(int HR, int R, int d, const real *v, const real *k, const real *q, real *W) {
    for (int i = 0; i < d * d; i++) W[i] = 0;
    for (int hr = 0; hr < HR; hr++) {
        const real *kr = k + (long)hr * d, *qr = q + (long)hr * d, vh = v[hr / R];
        for (int a = 0; a < d; a++) {
            const real s = vh * kr[a];
            for (int b = 0; b < d; b++) W[a * d + b] += s * qr[b];
        }
    }
}

/* The flows from G and θ += alpha · dθ; scratch: (H + 2·H·R·d) reals. */
static void NAME(rf_update)(int H, int R, int d, real alpha, const real *G, real *v, real *k, real *q, real *scratch) {
    const int HR = H * R;
    real *dv = scratch, *dk = scratch + H, *dq = dk + (long)HR * d;
    for (int h = 0; h < H; h++) dv[h] = 0;
    for (int hr = 0; hr < HR; hr++) {
        const real *kr = k + (long)hr * d, *qr = q + (long)hr * d, vh = v[hr / R];
        real *dkr = dk + (long)hr * d, *dqr = dq + (long)hr * d, acc = 0;
        for (int b = 0; b < d; b++) dqr[b] = 0;
        for (int a = 0; a < d; a++) {
            real gq = 0;
            for (int b = 0; b < d; b++) gq += G[a * d + b] * qr[b];
            acc += kr[a] * gq;
            dkr[a] = vh * gq;
            for (int b = 0; b < d; b++) dqr[b] += kr[a] * G[a * d + b];
        }
        for (int b = 0; b < d; b++) dqr[b] *= vh;
        dv[hr / R] += acc;
    }
    for (int h = 0; h < H; h++) v[h] += alpha * dv[h];
    for (long i = 0; i < (long)HR * d; i++) {
        k[i] += alpha * dk[i];
        q[i] += alpha * dq[i];
    }
}

/* `steps` population-flow steps of S seeds: v (S, H), k and q (S, H, R, d) updated in place; L2 = Λ², A = E(Λ̂²)
   and Lam = Λ (d, d), shared by the seeds. Returns 0, or 1 when the scratch cannot be allocated. */
int NAME(rf_population_steps)(long S, int H, int R, int d, long steps, real alpha, real *v, real *k, real *q,
                              const real *L2, const real *A, const real *Lam) {
    const int HR = H * R;
    real *W = malloc(sizeof(real) * ((size_t)3 * d * d + H + 2 * (size_t)HR * d));
    if (!W) return 1;
    real *T = W + d * d, *G = T + d * d, *scratch = G + d * d;
    for (long s = 0; s < S; s++) {
        real *vs = v + s * H, *ks = k + s * HR * d, *qs = q + s * HR * d;
        for (long t = 0; t < steps; t++) {
            NAME(rf_matrix)(HR, R, d, vs, ks, qs, W);
            for (int a = 0; a < d; a++) /* T = A W */
                for (int b = 0; b < d; b++) {
                    real acc = 0;
                    for (int j = 0; j < d; j++) acc += A[a * d + j] * W[j * d + b];
                    T[a * d + b] = acc;
                }
            for (int a = 0; a < d; a++) /* G = Λ² − T Λ */
                for (int b = 0; b < d; b++) {
                    real acc = 0;
                    for (int j = 0; j < d; j++) acc += T[a * d + j] * Lam[j * d + b];
                    G[a * d + b] = L2[a * d + b] - acc;
                }
            NAME(rf_update)(H, R, d, alpha, G, vs, ks, qs, scratch);
        }
    }
    free(W);
    return 0;
}

/* `steps` full-batch GD steps on the moments of z = vec(β x_qᵀ): M (d², d²) and c (d²) per seed at strides sM, sc
   (0: shared). Returns 0, or 1 when the scratch cannot be allocated. */
int NAME(rf_moment_steps)(long S, int H, int R, int d, long steps, real alpha, real *v, real *k, real *q,
                          const real *M, long sM, const real *c, long sc) {
    const int HR = H * R, D2 = d * d;
    real *W = malloc(sizeof(real) * ((size_t)3 * D2 + H + 2 * (size_t)HR * d));
    if (!W) return 1;
    real *w = W + D2, *G = w + D2, *scratch = G + D2;
    for (long s = 0; s < S; s++) {
        real *vs = v + s * H, *ks = k + s * HR * d, *qs = q + s * HR * d;
        const real *Ms = M + s * sM, *cs = c + s * sc;
        for (long t = 0; t < steps; t++) {
            NAME(rf_matrix)(HR, R, d, vs, ks, qs, W);
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) w[b * d + a] = W[a * d + b];
            for (int i = 0; i < D2; i++) { /* G[a, b] = (c − M w)[b·d + a] */
                real acc = 0;
                for (int j = 0; j < D2; j++) acc += Ms[(long)i * D2 + j] * w[j];
                G[(i % d) * d + i / d] = cs[i] - acc;
            }
            NAME(rf_update)(H, R, d, alpha, G, vs, ks, qs, scratch);
        }
    }
    free(W);
    return 0;
}
#endif
