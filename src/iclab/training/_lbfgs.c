/* The L-BFGS two-loop recursion (Nocedal & Wright 2006, Algorithm 7.4) over a ring buffer of curvature pairs, for
   iclab.training.lbfgs.LBFGS, whose torch code computes the same numbers up to the order of the dot products' sums.

   d = −H g, H the inverse-Hessian estimate of the stored pairs (s_i, y_i), ρ_i = 1 / (y_iᵀ s_i), on H₀ = γ I:
       q = −g; for i newest … oldest: α_i = ρ_i s_iᵀ q, q −= α_i y_i
       q *= γ;  for i oldest … newest: β = ρ_i y_iᵀ q,  q += (α_i − β) s_i
   A product α_i, β is rounded to the working precision (float32 or float64), as in torch.optim.LBFGS; the dot products
   add in double, four partial sums. One call replaces 4·m small tensor operations of the Python loop (m pairs: up to
   the history size, 600 in Ahn et al.'s L-BFGS presets). Compiled as two instances by including itself: float32
   (_f32) and float64 (_f64). */
#ifndef PER_REAL

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else
#include "../core/_per_real.h"

static double NAME(lb_dot)(long p, const real *a, const real *b) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    long k = 0;
    for (; k + 4 <= p; k += 4) {
        s0 += (double)a[k] * b[k];
        s1 += (double)a[k + 1] * b[k + 1];
        s2 += (double)a[k + 2] * b[k + 2];
        s3 += (double)a[k + 3] * b[k + 3];
    }
    for (; k < p; k++) s0 += (double)a[k] * b[k];
    return (s0 + s1) + (s2 + s3);
}

/* q (p values) holds the gradient g on entry and the direction −H g on return. S and Y: (cap, p) row-major, rho:
   (cap); the pairs in age order are the rows (first + k) % cap, k = 0 … count − 1. al: (cap) scratch, α by row.
   Returns 0. */
int NAME(lbfgs_direction)(long p, long cap, long first, long count, const real *S, const real *Y, const real *rho,
                          real gamma, real *al, real *q) {
    for (long k = 0; k < p; k++) q[k] = -q[k];
    for (long j = count - 1; j >= 0; j--) {
        const long i = (first + j) % cap;
        const real a = (real)NAME(lb_dot)(p, S + i * p, q) * rho[i];
        const real *y = Y + i * p;
        al[i] = a;
        for (long k = 0; k < p; k++) q[k] = q[k] - a * y[k];
    }
    for (long k = 0; k < p; k++) q[k] = q[k] * gamma;
    for (long j = 0; j < count; j++) {
        const long i = (first + j) % cap;
        const real b = (real)NAME(lb_dot)(p, Y + i * p, q) * rho[i];
        const real c = al[i] - b, *s = S + i * p;
        for (long k = 0; k < p; k++) q[k] = q[k] + c * s[k];
    }
    return 0;
}
#endif
