/* |K| and |K|^{1/2} g for a batch of small symmetric matrices (iclab.core.symabs), by cyclic Jacobi rotations with
   L matrices side by side: element (i, j) of a group's matrices is one vector of L reals (GCC/Clang vector types:
   16 float32 or 8 float64 with AVX-512, half as many with AVX2), so every arithmetic step is one vector operation
   for L matrices. LAPACK's syevd, which torch.linalg.eigh calls once per matrix, spends most of its time on the call
   and workspace at 31 x 31 (Cheng et al.'s n = 30 GP prompts).

   Jacobi (Golub & Van Loan, Matrix Computations, 4th ed., Alg. 8.5.3, row-cyclic): the tangent of sym.schur2 written
   as t = 2 a_pq sgn(h) / (|h| + sqrt(h^2 + 4 a_pq^2)), h = a_qq - a_pp, c = 1 / sqrt(1 + t^2), s = t c; the
   rotation applied in Rutishauser's form x' = x - s (y + tau x), y' = y + s (x - tau y), tau = s / (1 + c) (as
   accurate as LAPACK in float32; the plain c x - s y was 5x less). A rotation is skipped in a lane (t = 0) when
   |a_pq| <= EPS ||K||_F; the sweeps stop when one rotates nothing in any lane (8 sweeps for a float32 K^relu at
   n = 30). The eigenvalues are then the diagonal, K = V D V^T with V's columns kept as rows of VT.

   Outputs, per matrix: y = V |D|^{1/2} V^T g (the symmetric square root of |K| applied to g: basis-free, so any
   solver gives the same y) and, when kp is not NULL, |K| = V |D| V^T (Cheng et al. Def. 3.3, K_+). With kp NULL
   (y alone) a Householder + QL pass runs instead (NAME(ql) below), Jacobi where it does not converge.
   Returns 0, or the number of groups whose sweeps did not converge (the caller then recomputes the batch with torch),
   or -1 (N over NMAX, no memory). Compiled once per real type: this file includes itself. */
#ifndef PER_REAL
#include <float.h>
#include <stdlib.h>
#include <immintrin.h>

#define MAX_SWEEPS 40
#if defined(__AVX512F__)
#define VBYTES 64 /* 16 float32 or 8 float64 matrices side by side */
#else
#define VBYTES 32 /* AVX2: 8 or 4 */
#endif
#define NMAX 64

#define PER_REAL 32
#include "_sym_abs.c"
#undef PER_REAL
#define PER_REAL 64
#include "_sym_abs.c"

int sa_nmax(void) { return NMAX; }

#else

#include "_per_real.h"
#undef ireal
#undef vec
#undef ivec
#undef L
#undef EPS
#undef TINY
#undef VSQRT
#undef ABSMASK
#if PER_REAL == 32
#define ireal int
#define vec vec_f32
#define ivec ivec_f32
#define L (VBYTES / 4)
#define EPS FLT_EPSILON
#define TINY FLT_MIN
#define ABSMASK 0x7fffffff
#if VBYTES == 64
#define VSQRT(x) ((vec)_mm512_sqrt_ps((__m512)(x)))
#else
#define VSQRT(x) ((vec)_mm256_sqrt_ps((__m256)(x)))
#endif
#else
#define ireal long long
#define vec vec_f64
#define ivec ivec_f64
#define L (VBYTES / 8)
#define EPS DBL_EPSILON
#define TINY DBL_MIN
#define ABSMASK 0x7fffffffffffffffLL
#if VBYTES == 64
#define VSQRT(x) ((vec)_mm512_sqrt_pd((__m512d)(x)))
#else
#define VSQRT(x) ((vec)_mm256_sqrt_pd((__m256d)(x)))
#endif
#endif
#define ZEROV ((vec){0})
/* (x, y) <- (c x - s y, s x + c y) in Rutishauser's form (tau = s / (1 + c)): small corrections when s is small */
#define ROTATE(x, y) do { vec a_ = (x), b_ = (y); (x) = a_ - s * (b_ + tau * a_); (y) = b_ + s * (a_ - tau * b_); } while (0)
typedef real vec __attribute__((vector_size(VBYTES))); /* one element of L matrices: one AVX(-512) vector */
typedef ireal ivec __attribute__((vector_size(VBYTES))); /* its lane masks (-1 true, 0 false) and bit patterns */

/* One group: A (N, N) symmetric in its upper triangle (element (i, j) is A[min][max]), overwritten by its diagonal
   form; VT (N, N) = I on entry, V^T on exit; one vec per element. Returns 1 if every lane converged. (Tried: the
   round-robin order of Brent & Luk, a round's angles computed together: 1.3x slower, 23 vs 17.5 us a 31 x 31
   float32 matrix with AVX-512.) */
static int NAME(jacobi)(vec *restrict A, vec *restrict VT, int N) {
    vec thr = ZEROV;
    for (int i = 0; i < N; i++)
        for (int j = i; j < N; j++) thr += (real)(i == j ? 1 : 2) * A[i * N + j] * A[i * N + j];
    thr *= EPS * EPS; /* rotate where a_pq^2 > (EPS ||K||_F)^2 */
    for (int sweep = 0; sweep < MAX_SWEEPS; sweep++) {
        int rotated = 0;
        for (int p = 0; p < N - 1; p++) {
            for (int q = p + 1; q < N; q++) {
                vec apq = A[p * N + q], h = A[q * N + q] - A[p * N + p];
                ivec on = apq * apq > thr;
                int any = 0;
                for (int l = 0; l < L; l++) any |= (int)on[l];
                if (!any) continue;
                rotated = 1;
                vec ah = (vec)((ivec)h & ABSMASK);
                vec den = VSQRT(h * h + 4 * apq * apq) + ah + TINY;
                vec sgn = 1 + 2 * __builtin_convertvector(h < 0, vec); /* true is -1 */
                vec t = (vec)(on & (ivec)(2 * apq * sgn / den));  /* 0 in a lane that does not rotate */
                vec cv = 1 / VSQRT(1 + t * t);
                vec s = t * cv, tau = s / (1 + cv);
                A[p * N + p] -= t * apq;
                A[q * N + q] += t * apq;
                A[p * N + q] = (vec)(~on & (ivec)apq);
                for (int k = 0; k < p; k++) ROTATE(A[k * N + p], A[k * N + q]);
                for (int k = p + 1; k < q; k++) ROTATE(A[p * N + k], A[k * N + q]);
                for (int k = q + 1; k < N; k++) ROTATE(A[p * N + k], A[q * N + k]);
                vec *vp = VT + p * N, *vq = VT + q * N;
                for (int k = 0; k < N; k++) ROTATE(vp[k], vq[k]);
            }
        }
        if (!rotated) return 1;
    }
    return 0;
}

/* y = |K|^{1/2} g without |K| (sa_sample with kp NULL): Householder tridiagonalisation Q^T K Q = T (Golub & Van Loan
   4th ed., Alg. 8.3.1) with g <- Q^T g, then implicit QL with Wilkinson-like shifts on T = Z D Z^T (tql2 / Numerical
   Recipes' tqli), its rotations applied to g (w = Z^T Q^T g) and kept, w scaled by |D|^{1/2}, the rotations replayed
   backwards (Z) and the Householders (Q): about a seventh of Jacobi's flops at N = 31. The L matrices' QL runs in step:
   each eigenvalue l iterates until every lane has deflated it; a sweep runs from the largest lane's split point m, and
   a lane rotates only below its own m (elsewhere c = 1, s = 0 and its d, e are kept). A (N, N) full symmetric, G (N):
   g in, y out; V (N, N) and beta (N) scratch for the Householder vectors; rc, rs, ri room for maxrot rotations.
   Returns 1, or 0 when an eigenvalue takes over 30 sweeps or the rotations outgrow maxrot (the caller runs Jacobi). */
#define QL_SWEEPS 30
static int NAME(ql)(vec *restrict A, vec *restrict G, int N, vec *restrict V, vec *restrict beta, vec *restrict rc,
                    vec *restrict rs, int *restrict ri, int maxrot) {
    const ivec signbit = ~((ivec){0} + ABSMASK); /* the sign bit of each lane */
    for (int k = 0; k < N - 2; k++) { /* H_k zeroes column k below its subdiagonal: A <- H A H, g <- H g */
        vec *v = V + k * N, s2 = ZEROV, p[NMAX], kk = ZEROV, dot = ZEROV;
        for (int i = k + 1; i < N; i++) {
            v[i] = A[i * N + k];
            s2 += v[i] * v[i];
        }
        vec alpha = (vec)(((ivec)VSQRT(s2) & ABSMASK) | (~((ivec)v[k + 1] & signbit) & signbit)); /* -sgn(x0)||x|| */
        vec vn = s2 - 2 * alpha * v[k + 1] + alpha * alpha; /* ||x - alpha e1||^2 */
        v[k + 1] -= alpha;
        ivec ok = vn > TINY;
        vec b = (vec)(ok & (ivec)(2 / (vec)((ok & (ivec)vn) | (~ok & (ivec)(ZEROV + 1)))));
        beta[k] = b;
        for (int i = k + 1; i < N; i++) {
            vec acc = ZEROV;
            for (int j = k + 1; j < N; j++) acc += A[i * N + j] * v[j];
            p[i] = b * acc;
            kk += v[i] * p[i];
        }
        kk *= b * (real)0.5;
        for (int i = k + 1; i < N; i++) p[i] -= kk * v[i];
        for (int i = k + 1; i < N; i++)
            for (int j = k + 1; j < N; j++) A[i * N + j] -= v[i] * p[j] + p[i] * v[j];
        A[(k + 1) * N + k] = (vec)((ok & (ivec)alpha) | (~ok & (ivec)A[(k + 1) * N + k]));
        for (int i = k + 1; i < N; i++) dot += v[i] * G[i];
        dot *= b;
        for (int i = k + 1; i < N; i++) G[i] -= dot * v[i];
    }
    vec d[NMAX], e[NMAX];
    for (int i = 0; i < N; i++) {
        d[i] = A[i * N + i];
        e[i] = i < N - 1 ? A[(i + 1) * N + i] : ZEROV;
    }
    int nrot = 0;
    for (int l = 0; l < N; l++) {
        for (int sweep = 0;; sweep++) {
            int ml[L], M = l;
            for (int a = 0; a < L; a++) { /* a lane's split point: the first m >= l with a negligible e[m] */
                int m = l;
                for (; m < N - 1; m++) {
                    real dd = (d[m][a] < 0 ? -d[m][a] : d[m][a]) + (d[m + 1][a] < 0 ? -d[m + 1][a] : d[m + 1][a]);
                    if ((e[m][a] < 0 ? -e[m][a] : e[m][a]) <= EPS * dd) break;
                }
                ml[a] = m;
                M = m > M ? m : M;
            }
            if (M == l) break;
            if (sweep == QL_SWEEPS) return 0;
            vec mv, dm;
            for (int a = 0; a < L; a++) {
                mv[a] = (real)ml[a];
                dm[a] = d[ml[a]][a];
            }
            vec g = (d[l + 1] - d[l]) / (2 * e[l]), r = VSQRT(g * g + 1);
            g = dm - d[l] + e[l] / (g + (vec)(((ivec)r & ABSMASK) | ((ivec)g & signbit)));
            vec s = ZEROV + 1, c = ZEROV + 1, p = ZEROV;
            for (int i = M - 1; i >= l; i--) {
                if (nrot == maxrot) return 0;
                ivec on = ZEROV + (real)i < mv; /* below this lane's split point */
                vec f = s * e[i], b = c * e[i], rr = VSQRT(f * f + g * g);
                ivec nz = on & (rr > 0);
                vec inv = 1 / (vec)((nz & (ivec)rr) | (~nz & (ivec)(ZEROV + 1)));
                vec sn = (vec)(nz & (ivec)(f * inv)), cn = (vec)((nz & (ivec)(g * inv)) | (~nz & (ivec)(ZEROV + 1)));
                vec g2 = d[i + 1] - p, r2 = (d[i] - g2) * sn + 2 * cn * b, pn = sn * r2;
                e[i + 1] = (vec)((on & (ivec)rr) | (~on & (ivec)e[i + 1]));
                d[i + 1] = (vec)((on & (ivec)(g2 + pn)) | (~on & (ivec)d[i + 1]));
                g = (vec)((on & (ivec)(cn * r2 - b)) | (~on & (ivec)g));
                p = (vec)((on & (ivec)pn) | (~on & (ivec)p));
                s = (vec)((on & (ivec)sn) | (~on & (ivec)s));
                c = (vec)((on & (ivec)cn) | (~on & (ivec)c));
                vec zi = G[i], zj = G[i + 1]; /* w <- G_i^T w (a row of Z's update) */
                G[i + 1] = sn * zi + cn * zj;
                G[i] = cn * zi - sn * zj;
                rc[nrot] = cn;
                rs[nrot] = sn;
                ri[nrot++] = i;
            }
            ivec on = ZEROV + (real)l < mv;
            d[l] = (vec)((on & (ivec)(d[l] - p)) | (~on & (ivec)d[l]));
            e[l] = (vec)((on & (ivec)g) | (~on & (ivec)e[l]));
            for (int a = 0; a < L; a++)
                if (ml[a] > l) e[ml[a]][a] = 0;
        }
    }
    for (int i = 0; i < N; i++) G[i] *= VSQRT((vec)((ivec)d[i] & ABSMASK));
    for (int t = nrot - 1; t >= 0; t--) { /* u <- G_t u, the last rotation first: Z u */
        int i = ri[t];
        vec ui = G[i], uj = G[i + 1];
        G[i] = rc[t] * ui + rs[t] * uj;
        G[i + 1] = rc[t] * uj - rs[t] * ui;
    }
    for (int k = N - 3; k >= 0; k--) { /* Q u = H_0 ... H_{N-3} u */
        vec *v = V + k * N, dot = ZEROV;
        for (int i = k + 1; i < N; i++) dot += v[i] * G[i];
        dot *= beta[k];
        for (int i = k + 1; i < N; i++) G[i] -= dot * v[i];
    }
    return 1;
}

/* g's rows b0 … b0 + m − 1 into the lanes of G (N vecs; lanes past m are 0), and back: Y's lanes into y's rows */
static void NAME(gather)(vec *G, const real *g, int b0, int m, int N) {
    for (int i = 0; i < N; i++)
        for (int l = 0; l < L; l++) G[i][l] = l < m ? g[(size_t)(b0 + l) * N + i] : 0;
}

static void NAME(scatter)(real *y, const vec *Y, int b0, int m, int N) {
    for (int l = 0; l < m; l++)
        for (int i = 0; i < N; i++) y[(size_t)(b0 + l) * N + i] = Y[i][l];
}

/* k (B, N, N), g (B, N) -> y (B, N) and, unless kp is NULL, kp (B, N, N); all contiguous. */
int NAME(sa_sample)(int B, int N, const real *k, const real *g, real *y, real *kp) {
    if (N < 1 || N > NMAX) return -1;
    int maxrot = kp == NULL ? 8 * N * N : 0; /* room for the QL rotations (about N^2 / 2 at N = 31); past it, Jacobi */
    vec *A = aligned_alloc(64, ((size_t)2 * N * N + 3 * N + 2 * (size_t)maxrot) * sizeof(vec));
    int *ri = malloc(((size_t)maxrot + 1) * sizeof(int));
    if (A == NULL || ri == NULL) {
        free(A);
        free(ri);
        return -1;
    }
    vec *VT = A + N * N, *G = VT + N * N, *W = G + N, *Y = W + N, *rc = Y + N, *rs = rc + maxrot;
    int failed = 0;
    for (int b0 = 0; b0 < B; b0 += L) {
        int m = B - b0 < L ? B - b0 : L;
        for (int i = 0; i < N * N; i++)
            for (int l = 0; l < L; l++) A[i][l] = l < m ? k[(size_t)(b0 + l) * N * N + i] : (i % (N + 1) == 0);
        NAME(gather)(G, g, b0, m, N);
        if (kp == NULL) {
            if (NAME(ql)(A, G, N, VT, W, rc, rs, ri, maxrot)) {
                NAME(scatter)(y, G, b0, m, N);
                continue;
            }
            for (int i = 0; i < N * N; i++) /* QL did not converge in this group: Jacobi, from the start */
                for (int l = 0; l < L; l++) A[i][l] = l < m ? k[(size_t)(b0 + l) * N * N + i] : (i % (N + 1) == 0);
            NAME(gather)(G, g, b0, m, N);
        }
        for (int i = 0; i < N * N; i++) VT[i] = i % (N + 1) == 0 ? ZEROV + 1 : ZEROV;
        if (!NAME(jacobi)(A, VT, N)) {
            failed++;
            continue;
        }
        for (int i = 0; i < N; i++) Y[i] = ZEROV;
        for (int p = 0; p < N; p++) {
            const vec *v = VT + p * N;
            vec proj = ZEROV, d = (vec)((ivec)A[p * N + p] & ABSMASK);
            for (int i = 0; i < N; i++) proj += v[i] * G[i];
            W[p] = d;
            proj *= VSQRT(d);
            for (int i = 0; i < N; i++) Y[i] += v[i] * proj;
        }
        NAME(scatter)(y, Y, b0, m, N);
        if (kp == NULL) continue;
        for (int i = 0; i < N; i++) {
            for (int j = i; j < N; j++) {
                vec acc = ZEROV;
                for (int p = 0; p < N; p++) acc += W[p] * VT[p * N + i] * VT[p * N + j];
                for (int l = 0; l < m; l++) {
                    kp[(size_t)(b0 + l) * N * N + i * N + j] = acc[l];
                    kp[(size_t)(b0 + l) * N * N + j * N + i] = acc[l];
                }
            }
        }
    }
    free(A);
    free(ri);
    return failed;
}

/* y = L g with L L^T = K (Cholesky; the law N(0, K) of a positive definite kernel's labels): k (B, N, N), g (B, N)
   -> y (B, N), bad (B,) = 1 where a pivot is not positive (K not numerically positive definite: the caller draws
   that prompt by sa_sample), else 0. Row-oriented Cholesky-Banachiewicz on the lower triangle, L matrices at once. */
int NAME(sa_cholesky)(int B, int N, const real *k, const real *g, real *y, int *bad) {
    if (N < 1 || N > NMAX) return -1;
    vec *A = aligned_alloc(64, ((size_t)N * N + 2 * N) * sizeof(vec));
    if (A == NULL) return -1;
    vec *G = A + N * N, *Y = G + N;
    for (int b0 = 0; b0 < B; b0 += L) {
        int m = B - b0 < L ? B - b0 : L;
        for (int i = 0; i < N; i++)
            for (int j = 0; j <= i; j++)
                for (int l = 0; l < L; l++) A[i * N + j][l] = l < m ? k[(size_t)(b0 + l) * N * N + i * N + j] : (i == j);
        NAME(gather)(G, g, b0, m, N);
        ivec fail = {0};
        for (int i = 0; i < N; i++) {
            vec *ri = A + i * N;
            for (int j = 0; j < i; j++) {
                vec *rj = A + j * N, acc = ri[j];
                for (int t = 0; t < j; t++) acc -= ri[t] * rj[t];
                ri[j] = acc / rj[j];
            }
            vec d = ri[i];
            for (int t = 0; t < i; t++) d -= ri[t] * ri[t];
            ivec off = ~(ivec)(d > 0); /* also NaN */
            fail |= off;
            d = (vec)((~off & (ivec)d) | (off & (ivec)(ZEROV + 1)));  /* a failed lane goes on with 1: finite */
            ri[i] = VSQRT(d);
        }
        for (int i = 0; i < N; i++) {
            vec acc = ZEROV;
            for (int j = 0; j <= i; j++) acc += A[i * N + j] * G[j];
            Y[i] = acc;
        }
        NAME(scatter)(y, Y, b0, m, N);
        for (int l = 0; l < m; l++) bad[b0 + l] = fail[l] != 0;
    }
    free(A);
    return 0;
}

#endif
