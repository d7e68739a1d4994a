/* The vector macros of one instance of a kernel that is compiled once per real type by including itself
   (_kernel_attn.c, _query_attn.c): include it with PER_REAL defined as 32 or 64 (real and NAME come from
   ../core/_per_real.h). Vectors are AVX-512 where the kernel is built with -mavx512f (16 float32 / 8 float64 lanes),
   else AVX2 (8 / 4); exp is _avx_exp.h's.
   KEEP_LT(x, a, b): x where a < b, else 0; KEEP_GT likewise (masks: the exp cap, ReLU). Also the two helpers both
   kernels share, per instance: lanes_sum (a vector's lanes summed in lane order) and softmax_lanes (a softmax over
   m vectors in place, every lane its own prompt). No include guard: each instance redefines them. */
#include "_avx_exp.h"
#include "../core/_per_real.h"

#undef V
#undef W
#undef LD
#undef LOADU
#undef STOREU
#undef SET1
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef FMA
#undef MAX
#undef MIN
#undef KEEP_LT
#undef KEEP_GT
#undef ZERO
#undef VEXP
#if PER_REAL == 32
#if defined(__AVX512F__)
#define V __m512
#define W 16
#define LD(p) _mm512_load_ps((const float *)(p))
#define LOADU _mm512_loadu_ps
#define STOREU _mm512_storeu_ps
#define SET1 _mm512_set1_ps
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define DIV _mm512_div_ps
#define FMA _mm512_fmadd_ps
#define MAX _mm512_max_ps
#define MIN _mm512_min_ps
#define KEEP_LT(x, a, b) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), x)
#define KEEP_GT(x, a, b) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), x)
#define ZERO _mm512_setzero_ps()
#define VEXP exp512_ps
#else
#define V __m256
#define W 8
#define LD(p) _mm256_load_ps((const float *)(p))
#define LOADU _mm256_loadu_ps
#define STOREU _mm256_storeu_ps
#define SET1 _mm256_set1_ps
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define DIV _mm256_div_ps
#define FMA _mm256_fmadd_ps
#define MAX _mm256_max_ps
#define MIN _mm256_min_ps
#define KEEP_LT(x, a, b) _mm256_and_ps(x, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define KEEP_GT(x, a, b) _mm256_and_ps(x, _mm256_cmp_ps(a, b, _CMP_GT_OQ))
#define ZERO _mm256_setzero_ps()
#define VEXP exp_ps
#endif
#else
#if defined(__AVX512F__)
#define V __m512d
#define W 8
#define LD(p) _mm512_load_pd((const double *)(p))
#define LOADU _mm512_loadu_pd
#define STOREU _mm512_storeu_pd
#define SET1 _mm512_set1_pd
#define ADD _mm512_add_pd
#define SUB _mm512_sub_pd
#define MUL _mm512_mul_pd
#define DIV _mm512_div_pd
#define FMA _mm512_fmadd_pd
#define MAX _mm512_max_pd
#define MIN _mm512_min_pd
#define KEEP_LT(x, a, b) _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(a, b, _CMP_LT_OQ), x)
#define KEEP_GT(x, a, b) _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(a, b, _CMP_GT_OQ), x)
#define ZERO _mm512_setzero_pd()
#define VEXP exp512_pd
#else
#define V __m256d
#define W 4
#define LD(p) _mm256_load_pd((const double *)(p))
#define LOADU _mm256_loadu_pd
#define STOREU _mm256_storeu_pd
#define SET1 _mm256_set1_pd
#define ADD _mm256_add_pd
#define SUB _mm256_sub_pd
#define MUL _mm256_mul_pd
#define DIV _mm256_div_pd
#define FMA _mm256_fmadd_pd
#define MAX _mm256_max_pd
#define MIN _mm256_min_pd
#define KEEP_LT(x, a, b) _mm256_and_pd(x, _mm256_cmp_pd(a, b, _CMP_LT_OQ))
#define KEEP_GT(x, a, b) _mm256_and_pd(x, _mm256_cmp_pd(a, b, _CMP_GT_OQ))
#define ZERO _mm256_setzero_pd()
#define VEXP exp_pd
#endif
#endif
#define VALIGN ((int)sizeof(V))

/* the lanes of v summed in lane order (a fixed order: the same bits on any thread count) */
static inline real NAME(lanes_sum)(V v) {
    real f[W], t = 0;
    STOREU(f, v);
    for (int w = 0; w < W; w++) t += f[w];
    return t;
}

/* a[0 … m − 1] ← softmax over i of a[i], lane by lane (max subtracted, then normalised by the sum) */
static inline void NAME(softmax_lanes)(V *a, int m) {
    V mx = a[0], sum = ZERO;
    for (int i = 1; i < m; i++) mx = MAX(mx, a[i]);
    for (int i = 0; i < m; i++) sum = ADD(sum, a[i] = VEXP(SUB(a[i], mx)));
    V inv = DIV(SET1(1.0), sum);
    for (int i = 0; i < m; i++) a[i] = MUL(a[i], inv);
}
