/* The instruction sets nnkit's C kernels are built for, and the one way every kernel family
 * (conv_window, gemm_packed, scan_rows) is instantiated per float type and instruction set.
 *
 * Instruction sets. One source is compiled once per set with GCC/Clang target attributes,
 * and the build to run is chosen at run time by the CPU's features (nnkit_isa_level). Tags
 * and levels: base (0, the compiler's baseline), avx2 (1, AVX2 + FMA), avx512 (2, AVX-512F).
 * Elsewhere (other CPUs, other compilers) only base is built and nnkit_isa_level() is 0.
 *
 * Instantiation. A family is a header X.h (what every build shares, and the table of the
 * builds) and a body X_body.h (the kernels of one float type for one instruction set). X.h
 * has isa_instantiate.h include the body once per pair, which names the pair with two
 * macros:
 *
 *     #define NNKIT_TYPE f32      -- f32, f64, c64 or c128 (complex: (re, im) scalar pairs)
 *     #define NNKIT_ISA avx512    -- base, avx2 or avx512
 *     #include "X_body.h"
 *
 * The body undefines NNKIT_TYPE and NNKIT_ISA at its end, with every macro it defined
 * itself, so that each pair starts clean (a part it includes, scan_time_body.h, leaves the
 * pair's macros to it). Inside a body, for the current pair:
 *
 *     NNKIT_T          the scalar type: float (f32, c64) or double (f64, c128)
 *     NNKIT_BYTES      its size, 4 or 8 (usable in #if, like the next two)
 *     NNKIT_COMPLEX    1 for c64 and c128, else 0
 *     NNKIT_LEVEL      the set's level (2: AVX-512, 32 vector registers)
 *     NNKIT_NAME(x)    x_<type>_<isa>, e.g. gemm_f32_avx512: the name of every function
 *     NNKIT_TARGET     the set's target attribute (empty for base)
 *     NNKIT_V, NNKIT_L 64 bytes of NNKIT_T as a vector (nnkit_v16f, nnkit_v8d) and its lanes
 *     NNKIT_VREG       one vector register of the set as NNKIT_T's (NNKIT_VBYTES: 16, 32 or
 *                      64 bytes), NNKIT_VMASK the integers of NNKIT_T's size in that shape
 *
 * A body's entry points are `static NNKIT_TARGET` functions named NNKIT_NAME(...), which X.h
 * lists in its table per level; its inner functions are `static NNKIT_INLINE`, inlined into
 * the entry points and compiled with their target (a body whose inner functions call the
 * set's intrinsics, conv_window's, adds NNKIT_TARGET to them as well). Helpers shared by
 * every pair live in X.h.
 *
 * The vectors are GCC vector extensions (NNKIT_VECTORS); a compiler without them, or a build
 * with -DNNKIT_PLAIN, gets each family's plain fallback. */

#ifndef NNKIT_ISA_TARGETS_H
#define NNKIT_ISA_TARGETS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#define NNKIT_X86_64 1
#endif

/* the best set this CPU runs: 2: AVX-512F, 1: AVX2 + FMA, 0: the baseline */
static inline int nnkit_cpu_level(void)
{
#ifdef NNKIT_X86_64
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

static inline const char *nnkit_isa_name(int level)
{
    return level == 2 ? "avx512" : level == 1 ? "avx2" : "baseline";
}

/* the set the kernels run with: the CPU's best, or the lower one that the environment
 * variable NNKIT_ISA names (baseline, avx2 or avx512; checked by nnkit._ext at import, which
 * refuses other values and sets this CPU cannot run) */
static inline int nnkit_isa_level(void)
{
    int level = nnkit_cpu_level();
    const char *asked = getenv("NNKIT_ISA");
    for (int want = 0; asked && want < level; want++)
        if (strcmp(asked, nnkit_isa_name(want)) == 0) return want;
    return level;
}

/* NNKIT_ISA_TABLE(fn, n, TABLE) defines a family's dispatch, ``static void *fn(int level,
 * int k)``: entry k of the build of instruction-set ``level``, NULL when that build is not
 * compiled or this CPU cannot run it (or k is not below n). TABLE(isa) is the braced list
 * of the family's n entry points of one set, cast to void *, in the same order for every
 * set. */
#ifdef NNKIT_X86_64
#define NNKIT_ISA_BUILDS(TABLE) {TABLE(base), TABLE(avx2), TABLE(avx512)}
#else
#define NNKIT_ISA_BUILDS(TABLE) {TABLE(base)}
#endif
#define NNKIT_ISA_TABLE(fn, n, TABLE)                                                       \
    static void *fn(int level, int k)                                                       \
    {                                                                                       \
        static void *const builds[][n] = NNKIT_ISA_BUILDS(TABLE);                           \
        enum { built = sizeof builds / sizeof builds[0] };                                  \
        if (level < 0 || level >= built || level > nnkit_cpu_level() || k < 0 || k >= (n)) \
            return NULL;                                                                    \
        return builds[level][k];                                                            \
    }

#define NNKIT_CAT_(a, b) a##b
#define NNKIT_CAT(a, b) NNKIT_CAT_(a, b)

/* the instruction sets: target attribute, level, bytes of a vector register */
#define NNKIT_TARGET_base
#define NNKIT_LEVEL_base 0
#define NNKIT_VBYTES_base 16
#ifdef NNKIT_X86_64
#define NNKIT_TARGET_avx2 __attribute__((target("avx2,fma")))
#define NNKIT_TARGET_avx512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#endif
#define NNKIT_LEVEL_avx2 1
#define NNKIT_LEVEL_avx512 2
#define NNKIT_VBYTES_avx2 32
#define NNKIT_VBYTES_avx512 64

/* the float types: their scalar (f32 or f64) and whether complex */
#define NNKIT_REAL_f32 f32
#define NNKIT_REAL_f64 f64
#define NNKIT_REAL_c64 f32
#define NNKIT_REAL_c128 f64
#define NNKIT_COMPLEX_f32 0
#define NNKIT_COMPLEX_f64 0
#define NNKIT_COMPLEX_c64 1
#define NNKIT_COMPLEX_c128 1
/* the scalars: C type, size, 64-byte vector, integer of the same size */
#define NNKIT_T_f32 float
#define NNKIT_T_f64 double
#define NNKIT_BYTES_f32 4
#define NNKIT_BYTES_f64 8
#define NNKIT_V_f32 nnkit_v16f
#define NNKIT_V_f64 nnkit_v8d
#define NNKIT_INT_f32 i32
#define NNKIT_INT_f64 i64

/* the current pair's (see the top of this file) */
#define NNKIT_NAME(x) \
    NNKIT_CAT(x, NNKIT_CAT(NNKIT_CAT(_, NNKIT_TYPE), NNKIT_CAT(_, NNKIT_ISA)))
#define NNKIT_REAL NNKIT_CAT(NNKIT_REAL_, NNKIT_TYPE)
#define NNKIT_COMPLEX NNKIT_CAT(NNKIT_COMPLEX_, NNKIT_TYPE)
#define NNKIT_T NNKIT_CAT(NNKIT_T_, NNKIT_REAL)
#define NNKIT_BYTES NNKIT_CAT(NNKIT_BYTES_, NNKIT_REAL)
#define NNKIT_V NNKIT_CAT(NNKIT_V_, NNKIT_REAL)
#define NNKIT_L (64 / NNKIT_BYTES)
#define NNKIT_LEVEL NNKIT_CAT(NNKIT_LEVEL_, NNKIT_ISA)
#define NNKIT_VBYTES NNKIT_CAT(NNKIT_VBYTES_, NNKIT_ISA)
#define NNKIT_VREG NNKIT_CAT(nnkit_, NNKIT_CAT(NNKIT_REAL, NNKIT_CAT(_, NNKIT_ISA)))
#define NNKIT_VMASK \
    NNKIT_CAT(nnkit_, NNKIT_CAT(NNKIT_CAT(NNKIT_INT_, NNKIT_REAL), NNKIT_CAT(_, NNKIT_ISA)))
#define NNKIT_TARGET NNKIT_CAT(NNKIT_TARGET_, NNKIT_ISA)

#ifdef __GNUC__
#define NNKIT_INLINE inline __attribute__((always_inline))
#define NNKIT_ALIGNED(n) __attribute__((aligned(n)))
#else
#define NNKIT_INLINE inline
#define NNKIT_ALIGNED(n)
#endif

#if defined(__GNUC__) && !defined(NNKIT_PLAIN)
#define NNKIT_VECTORS 1
/* 64 bytes of floats or doubles read and written at any element's address: the tiles of
 * conv_window and gemm_packed (GCC splits them into the registers of each set) */
typedef float nnkit_v16f __attribute__((vector_size(64), aligned(4)));
typedef double nnkit_v8d __attribute__((vector_size(64), aligned(8)));
/* one vector register of each set, as floats, doubles and integers of their sizes
 * (scan_time_body.h) */
typedef float nnkit_f32_base __attribute__((vector_size(16)));
typedef float nnkit_f32_avx2 __attribute__((vector_size(32)));
typedef float nnkit_f32_avx512 __attribute__((vector_size(64)));
typedef double nnkit_f64_base __attribute__((vector_size(16)));
typedef double nnkit_f64_avx2 __attribute__((vector_size(32)));
typedef double nnkit_f64_avx512 __attribute__((vector_size(64)));
typedef int32_t nnkit_i32_base __attribute__((vector_size(16)));
typedef int32_t nnkit_i32_avx2 __attribute__((vector_size(32)));
typedef int32_t nnkit_i32_avx512 __attribute__((vector_size(64)));
typedef int64_t nnkit_i64_base __attribute__((vector_size(16)));
typedef int64_t nnkit_i64_avx2 __attribute__((vector_size(32)));
typedef int64_t nnkit_i64_avx512 __attribute__((vector_size(64)));
#else
#define NNKIT_VECTORS 0
#endif

#endif
