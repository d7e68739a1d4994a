/* The labels of random polynomials (Sun, Jadbabaie, Azizan 2025, Sec. 2.1): y_bt = Σ_m w_bm x_bt^{a_m}, for
   iclab.tasks.polynomial.polynomial_values, which computes the same numbers by torch code elsewhere.

   Bit for bit the numbers of einsum("btm,bm->bt", monomials(x, a), w): each monomial is 1 · x_j^{p_j} · … over the
   variables j in order, x^p the product x^{p-1} · x; the sum runs over m in order, each product rounded before it is
   added (no fused multiply-add: contraction is off in this file). Tokens sit in the lanes of TB-long arrays, which
   the compiler vectorises. Compiled as two instances by including itself: float32 (_f32) and float64 (_f64). */
#ifndef PER_REAL
#pragma GCC optimize("fp-contract=off")
enum { TB = 16, MAXP = 16 }; /* tokens per block; the highest exponent (more: the torch code) */

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else
#include "../core/_per_real.h"

/* out[b * T + t] for the (B, T, d) points x (entry (b, t, j) at x[b * sxb + t * d + j]), the (B, M) coefficients w
   (row-major) and the (M, d) exponents a (each at most MAXP). Returns 0, or 1 for an exponent above MAXP or d above
   64 (nothing written). */
int NAME(pv_values)(long B, int T, int d, int M, const int *a, const real *x, long sxb, const real *w, real *out) {
    int top = 0;
    for (int i = 0; i < M * d; i++) top = a[i] > top ? a[i] : top;
    if (top > MAXP || d > 64) return 1;
    const int rows = top > 1 ? top + 1 : 2; /* x^1 is always loaded */
    real pw[rows * d * TB], v[TB], acc[TB]; /* at most (MAXP + 1) x 64 x TB: 139 KB for doubles */
    for (long b = 0; b < B; b++) {
        const real *xb = x + b * sxb, *wb = w + b * (long)M;
        for (int t0 = 0; t0 < T; t0 += TB) {
            const int c = T - t0 < TB ? T - t0 : TB;
            for (int j = 0; j < d; j++) { /* pw[(p * d + j) * TB + l] = x_j^p of token t0 + l */
                real *p1 = pw + (d + j) * TB;
                for (int l = 0; l < TB; l++) p1[l] = l < c ? xb[(long)(t0 + l) * d + j] : 0;
                for (int p = 2; p <= top; p++) {
                    const real *lo = pw + ((p - 1) * d + j) * TB;
                    real *hi = pw + (p * d + j) * TB;
                    for (int l = 0; l < TB; l++) hi[l] = lo[l] * p1[l];
                }
            }
            for (int m = 0; m < M; m++) {
                for (int l = 0; l < TB; l++) v[l] = 1;
                for (int j = 0; j < d; j++) {
                    const int p = a[m * d + j];
                    if (!p) continue;
                    const real *q = pw + (p * d + j) * TB;
                    for (int l = 0; l < TB; l++) v[l] = v[l] * q[l];
                }
                const real wm = wb[m];
                if (m == 0)
                    for (int l = 0; l < TB; l++) acc[l] = v[l] * wm;
                else
                    for (int l = 0; l < TB; l++) acc[l] = acc[l] + v[l] * wm;
            }
            for (int l = 0; l < c; l++) out[b * T + t0 + l] = acc[l];
        }
    }
    return 0;
}
#endif
