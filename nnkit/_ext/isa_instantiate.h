/* Compiles a family's body once per float type and instruction set (isa_targets.h):
 *
 *     #define NNKIT_BODY "X_body.h"
 *     #define NNKIT_WITH_COMPLEX 1    -- optional: c64 and c128 too
 *     #include "isa_instantiate.h"
 *
 * The types f32 and f64 (and c64, c128), each for base and, on x86-64, avx2 and avx512.
 * The body undefines NNKIT_TYPE and NNKIT_ISA at its end; this file undefines NNKIT_BODY and
 * NNKIT_WITH_COMPLEX at its own. No include guard: each family includes it once. */

#ifndef NNKIT_WITH_COMPLEX
#define NNKIT_WITH_COMPLEX 0
#endif

#define NNKIT_TYPE f32
#define NNKIT_ISA base
#include NNKIT_BODY
#define NNKIT_TYPE f64
#define NNKIT_ISA base
#include NNKIT_BODY
#if NNKIT_WITH_COMPLEX
#define NNKIT_TYPE c64
#define NNKIT_ISA base
#include NNKIT_BODY
#define NNKIT_TYPE c128
#define NNKIT_ISA base
#include NNKIT_BODY
#endif

#ifdef NNKIT_X86_64
#define NNKIT_TYPE f32
#define NNKIT_ISA avx2
#include NNKIT_BODY
#define NNKIT_TYPE f64
#define NNKIT_ISA avx2
#include NNKIT_BODY
#if NNKIT_WITH_COMPLEX
#define NNKIT_TYPE c64
#define NNKIT_ISA avx2
#include NNKIT_BODY
#define NNKIT_TYPE c128
#define NNKIT_ISA avx2
#include NNKIT_BODY
#endif

#define NNKIT_TYPE f32
#define NNKIT_ISA avx512
#include NNKIT_BODY
#define NNKIT_TYPE f64
#define NNKIT_ISA avx512
#include NNKIT_BODY
#if NNKIT_WITH_COMPLEX
#define NNKIT_TYPE c64
#define NNKIT_ISA avx512
#include NNKIT_BODY
#define NNKIT_TYPE c128
#define NNKIT_ISA avx512
#include NNKIT_BODY
#endif
#endif

#undef NNKIT_BODY
#undef NNKIT_WITH_COMPLEX
