/* The lane vector of a kernel written with GCC's vector extensions and compiled once per real type by including
   itself (_moment_attn.c, _bilinear.c, _quad_form.c). Included before the instances (PER_REAL not yet defined) it
   sets VBYTES, the vector's bytes: 64 where the kernel is built with -mavx512f, else 32 (AVX2). Included in an
   instance, after ../core/_per_real.h, it makes `vec` a vector of W numbers of that instance's real type (16 float32
   or 8 float64 lanes with AVX-512, half as many with AVX2). No include guard: each instance redefines vec and W. */
#ifndef PER_REAL
#if defined(__AVX512F__)
#define VBYTES 64
#else
#define VBYTES 32
#endif
#else
#undef vec
#undef W
#define W (VBYTES / (int)sizeof(real))
typedef real NAME(vec_t) __attribute__((vector_size(VBYTES), aligned(VBYTES)));
#define vec NAME(vec_t)
#endif
