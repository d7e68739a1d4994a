/* exp on AVX2 vectors, shared by the package's C kernels (_kv_softmax.c, _kernel_attn.c, _query_attn.c): Cephes
   polynomial (float32) and rational (float64) approximations, ~1 ulp; 0 below the smallest normal result (no
   denormals), +inf above log of the largest finite value. Where the kernel is built with AVX-512, the same two
   approximations on 512-bit vectors (exp512_ps, exp512_pd), step for step. */
#ifndef ICLAB_AVX_EXP_H
#define ICLAB_AVX_EXP_H
#include <immintrin.h>

static inline __m256 exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    k = _mm256_min_ps(k, _mm256_set1_ps(127.0f)); /* 2^k finite; the polynomial covers the rest */
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    y = _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
}

static inline __m256d exp_pd(__m256d x) {
    const __m256d lo = _mm256_set1_pd(-708.3964185322641), hi = _mm256_set1_pd(709.782712893384);
    __m256d under = _mm256_cmp_pd(x, lo, _CMP_LT_OQ), over = _mm256_cmp_pd(x, hi, _CMP_GT_OQ);
    x = _mm256_min_pd(_mm256_max_pd(x, lo), hi);
    __m256d k = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634073599)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    k = _mm256_min_pd(k, _mm256_set1_pd(1023.0));
    x = _mm256_fnmadd_pd(k, _mm256_set1_pd(6.93145751953125E-1), x);
    x = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.42860682030941723212E-6), x);
    __m256d xx = _mm256_mul_pd(x, x);
    __m256d px = _mm256_fmadd_pd(_mm256_fmadd_pd(_mm256_set1_pd(1.26177193074810590878E-4), xx,
                                                 _mm256_set1_pd(3.02994407707441961300E-2)),
                                 xx, _mm256_set1_pd(9.99999999999999999910E-1));
    px = _mm256_mul_pd(px, x);
    __m256d qx = _mm256_fmadd_pd(
        _mm256_fmadd_pd(_mm256_fmadd_pd(_mm256_set1_pd(3.00198505138664455042E-6), xx,
                                        _mm256_set1_pd(2.52448340349684104192E-3)),
                        xx, _mm256_set1_pd(2.27265548208155028766E-1)),
        xx, _mm256_set1_pd(2.00000000000000000009E0));
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(2.0), _mm256_div_pd(px, _mm256_sub_pd(qx, px)), _mm256_set1_pd(1.0));
    /* 2^k: k + 1.5 * 2^52 holds k in its low mantissa bits; (k + 1023) << 52 is the exponent field */
    __m256i kb = _mm256_castpd_si256(_mm256_add_pd(k, _mm256_set1_pd(6755399441055744.0)));
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(kb, _mm256_set1_epi64x(1023)), 52);
    y = _mm256_andnot_pd(under, _mm256_mul_pd(y, _mm256_castsi256_pd(e)));
    return _mm256_blendv_pd(y, _mm256_set1_pd(__builtin_inf()), over);
}

#if defined(__AVX512F__)
static inline __m512 exp512_ps(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    k = _mm512_min_ps(k, _mm512_set1_ps(127.0f));
    x = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    y = _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
    return _mm512_mask_blend_ps(over, y, _mm512_set1_ps(__builtin_inff()));
}

static inline __m512d exp512_pd(__m512d x) {
    const __m512d lo = _mm512_set1_pd(-708.3964185322641), hi = _mm512_set1_pd(709.782712893384);
    __mmask8 under = _mm512_cmp_pd_mask(x, lo, _CMP_LT_OQ), over = _mm512_cmp_pd_mask(x, hi, _CMP_GT_OQ);
    x = _mm512_min_pd(_mm512_max_pd(x, lo), hi);
    __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634073599)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    k = _mm512_min_pd(k, _mm512_set1_pd(1023.0));
    x = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.93145751953125E-1), x);
    x = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.42860682030941723212E-6), x);
    __m512d xx = _mm512_mul_pd(x, x);
    __m512d px = _mm512_fmadd_pd(_mm512_fmadd_pd(_mm512_set1_pd(1.26177193074810590878E-4), xx,
                                                 _mm512_set1_pd(3.02994407707441961300E-2)),
                                 xx, _mm512_set1_pd(9.99999999999999999910E-1));
    px = _mm512_mul_pd(px, x);
    __m512d qx = _mm512_fmadd_pd(
        _mm512_fmadd_pd(_mm512_fmadd_pd(_mm512_set1_pd(3.00198505138664455042E-6), xx,
                                        _mm512_set1_pd(2.52448340349684104192E-3)),
                        xx, _mm512_set1_pd(2.27265548208155028766E-1)),
        xx, _mm512_set1_pd(2.00000000000000000009E0));
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(2.0), _mm512_div_pd(px, _mm512_sub_pd(qx, px)), _mm512_set1_pd(1.0));
    __m512i kb = _mm512_castpd_si512(_mm512_add_pd(k, _mm512_set1_pd(6755399441055744.0)));
    __m512i e = _mm512_slli_epi64(_mm512_add_epi64(kb, _mm512_set1_epi64(1023)), 52);
    y = _mm512_maskz_mov_pd((__mmask8)~under, _mm512_mul_pd(y, _mm512_castsi512_pd(e)));
    return _mm512_mask_blend_pd(over, y, _mm512_set1_pd(__builtin_inf()));
}
#endif
#endif
