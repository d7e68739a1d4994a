/* The real type of one instance of a C kernel built once per type (iclab.core.native.per_real): the source includes
   itself twice, first with PER_REAL defined as 32, then as 64, and this header at the top of that second part:
   `real` is float or double and NAME(f) is f_f32 or f_f64. Its bytes are part of every kernel build's hash
   (iclab.core.native.SHARED_HEADERS). */
#undef real
#undef NAME
#if PER_REAL == 32
#define real float
#define NAME(f) f##_f32
#else
#define real double
#define NAME(f) f##_f64
#endif
