/* Quadratic forms a_ih = s_iᵀ M_h s_i / 2 of N rows s_i (r wide, rows contiguous) under H symmetric r x r matrices
   M_h, and their backward: iclab.models._quad_form runs them for the rbf head of the Trained TF's first block
   (iclab.models._categorical_fast.first_block_kernel: the per-key term ‖K_h s_i‖²/2 with M_h = K_hᵀK_h), torch code
   computes the same where this is not built.

   Rows go W at a time into the lanes of a vector (16 float32 with AVX-512, else 8; doubles half that), so every
   product below is one vector FMA for W rows. With M symmetric,
       a_ih = Σ_k s_ik (M_h,kk s_ik / 2 + Σ_{l>k} M_h,kl s_il),
   and for the adjoint g_ih of a_ih:
       ∂/∂s_i = Σ_h g_ih M_h s_i,        ∂/∂M_h = Σ_i g_ih s_i s_iᵀ / 2 (symmetric: the upper triangle is summed in
   lanes, reduced in lane order at the end of the call, and mirrored).

   Compiled as two instances by including itself: float32 (suffix _f32) and float64 (_f64). Built by
   iclab.core.native.load(). */
#ifndef PER_REAL
#include <stdlib.h>
#include <string.h>

#include "_lanes.h" /* VBYTES */
#define MAX_R 64 /* the widest rows */

int qf_lanes_f32(void) { return VBYTES / 4; }
int qf_lanes_f64(void) { return VBYTES / 8; }

#define PER_REAL 32
#include __FILE__
#undef PER_REAL
#define PER_REAL 64
#include __FILE__

#else /* one instance for the real type of PER_REAL */

#include "../core/_per_real.h"
#include "_lanes.h" /* vec, W */

/* rows i0 … i0 + m − 1 of s (N x r) into S[k], lane l = row i0 + l; lanes m … W − 1 are zero */
static void NAME(rows_in)(const real *s, long i0, int m, int r, vec *S) {
    for (int k = 0; k < r; k++) {
        vec v = {0};
        for (int l = 0; l < m; l++) v[l] = s[(i0 + l) * r + k];
        S[k] = v;
    }
}

/* a (N x H) for the rows [n0, n1) */
int NAME(qf_forward)(long n0, long n1, int r, int H, const real *s, const real *M, real *a) {
    if (r > MAX_R) return 2;
    vec S[MAX_R];
    for (long i0 = n0; i0 < n1; i0 += W) {
        const int m = n1 - i0 < W ? (int)(n1 - i0) : W;
        NAME(rows_in)(s, i0, m, r, S);
        for (int h = 0; h < H; h++) {
            const real *Mh = M + (long)h * r * r;
            vec acc = {0};
            for (int k = 0; k < r; k++) {
                vec t = (Mh[k * r + k] / 2) * S[k];
                for (int l = k + 1; l < r; l++) t += Mh[k * r + l] * S[l];
                acc += S[k] * t;
            }
            for (int l = 0; l < m; l++) a[(i0 + l) * H + h] = acc[l];
        }
    }
    return 0;
}

/* for the rows [n0, n1) and adjoints g (N x H): gs (N x r) = ∂/∂s, written; gM (H x r x r) = ∂/∂M of these rows,
   written (the caller sums the parts) */
int NAME(qf_backward)(long n0, long n1, int r, int H, const real *s, const real *M, const real *g, real *gs,
                      real *gM) {
    if (r > MAX_R) return 2;
    const long tri = (long)r * (r + 1) / 2; /* upper-triangle entries per matrix */
    vec *acc = aligned_alloc(VBYTES, sizeof(vec) * (size_t)(H * tri));
    if (!acc) return 1;
    memset(acc, 0, sizeof(vec) * (size_t)(H * tri));
    vec S[MAX_R], G[MAX_R];
    for (long i0 = n0; i0 < n1; i0 += W) {
        const int m = n1 - i0 < W ? (int)(n1 - i0) : W;
        NAME(rows_in)(s, i0, m, r, S);
        for (int k = 0; k < r; k++) G[k] = (vec){0};
        for (int h = 0; h < H; h++) {
            const real *Mh = M + (long)h * r * r;
            vec gh = {0};
            for (int l = 0; l < m; l++) gh[l] = g[(i0 + l) * H + h];
            vec *ah = acc + h * tri;
            for (int k = 0; k < r; k++) {
                vec t = Mh[k * r] * S[0];
                for (int l = 1; l < r; l++) t += Mh[k * r + l] * S[l];
                G[k] += gh * t;
                const vec u = ((real)0.5 * gh) * S[k];
                for (int l = k; l < r; l++) *ah++ += u * S[l];
            }
        }
        for (int k = 0; k < r; k++)
            for (int l = 0; l < m; l++) gs[(i0 + l) * r + k] = G[k][l];
    }
    for (int h = 0; h < H; h++) {
        const vec *ah = acc + h * tri;
        real *gh = gM + (long)h * r * r;
        for (int k = 0; k < r; k++)
            for (int l = k; l < r; l++, ah++) {
                real t = 0;
                for (int j = 0; j < W; j++) t += (*ah)[j];
                gh[k * r + l] = t;
                gh[l * r + k] = t;
            }
    }
    free(acc);
    return 0;
}

#endif
