/* The diagonal linear recurrence h_t = a_t * h_{t-1} + b_t along one block of a (B, T, D)
 * array, forward and backward, for the row tasks of nnkit/_ext/scan_cpu.py.
 *
 *   nnkit_scan_fwd_<type>(a, b, h0, h, T, stride, n, reverse, nt)
 *   nnkit_scan_bwd_<type>(dh, a, h, h0, da, db, dh0, T, stride, n, reverse, nt)
 *
 * Pointers are at (i, 0, d0) of their (B, T, D) array (h0, dh0 at (i, d0)); ``stride`` is
 * the distance between time steps (D), ``n`` the block's width, both in scalars; complex
 * types (c64, c128) are (re, im) pairs of floats/doubles, so n and stride count scalars
 * (2 per feature). Formulas and the conjugate convention are scan_cpu's (see there).
 *
 * The work is pure memory streaming (a few flops per element), so what counts is the bytes
 * moved. The state and the gradient carried from step to step live in a local buffer (L1);
 * each step's outputs are copied out of it with non-temporal stores when ``nt`` is set
 * (large arrays): a plain store first reads the line it writes (the backward's two outputs
 * would cost 7 array passes instead of 5), and a streamed line is not re-read. Blocks
 * wider than SR_CHUNK scalars are walked through T in chunks of that width.
 *
 * A walk down through T (the reverse scan, and the backward of the forward one) reads
 * each step's elements in descending order too, so that every input is one descending
 * stream: read ascending within a step and descending across steps, the hardware
 * prefetcher lost them (the reverse forward scan ran 4x slower, the backward 3x:
 * benchmarks/RESULTS.md, "Linear recurrences").
 *
 * With one feature (stride = n = one element) the kernels hand over to the scan
 * vectorised along T of scan_time_body.h: a single chain of multiply-adds would wait ~4 ns
 * a step.
 *
 * One source, compiled for AVX-512, AVX2+FMA and the baseline (isa_targets.h). */

#ifndef NNKIT_SCAN_ROWS_H
#define NNKIT_SCAN_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "isa_targets.h"

#ifdef NNKIT_X86_64
#include <emmintrin.h>
#endif

#define SR_CHUNK 512

#ifdef __GNUC__
#define SR_INLINE static inline __attribute__((always_inline))
#define SR_ALIGNED __attribute__((aligned(64)))
#else
#define SR_INLINE static inline
#define SR_ALIGNED
#endif

/* dst[0:bytes) = src[0:bytes); the 16-byte-aligned body with non-temporal stores when nt */
SR_INLINE void sr_store(void *dst, const void *src, size_t bytes, int nt)
{
#ifdef NNKIT_X86_64
    if (nt) {
        char *d = dst;
        const char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        if (head > bytes) head = bytes;
        memcpy(d, s, head);
        d += head, s += head, bytes -= head;
        for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
        memcpy(d, s, bytes);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

static inline void sr_fence(int nt)
{
#ifdef NNKIT_X86_64
    if (nt) _mm_sfence(); /* streamed stores visible before the task ends */
#endif
    (void)nt;
}

#define SR_T float
#define SR_COMPLEX 0
#define SR_NAME f32
#include "scan_rows_body.h"
#define SR_T double
#define SR_COMPLEX 0
#define SR_NAME f64
#include "scan_rows_body.h"
#define SR_T float
#define SR_COMPLEX 1
#define SR_NAME c64
#include "scan_rows_body.h"
#define SR_T double
#define SR_COMPLEX 1
#define SR_NAME c128
#include "scan_rows_body.h"

/* One feature (stride = n = 1 scalar, or 2 for complex types): the scan vectorised along
 * T of scan_time_body.h, one vector width per instruction set (GCC's vector extensions;
 * other compilers keep the row kernels for it). */
#if defined(__GNUC__) && !defined(__clang__)
#define SR_TIME 1
#define SR_T float
#define SR_I int32_t
#define SR_K 1
#define SR_V 4
#define ST_NAME f32_v4
#include "scan_time_body.h"
#define SR_T float
#define SR_I int32_t
#define SR_K 1
#define SR_V 8
#define ST_NAME f32_v8
#include "scan_time_body.h"
#define SR_T float
#define SR_I int32_t
#define SR_K 1
#define SR_V 16
#define ST_NAME f32_v16
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 1
#define SR_V 2
#define ST_NAME f64_v2
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 1
#define SR_V 4
#define ST_NAME f64_v4
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 1
#define SR_V 8
#define ST_NAME f64_v8
#include "scan_time_body.h"
#define SR_T float
#define SR_I int32_t
#define SR_K 2
#define SR_V 4
#define ST_NAME c64_v4
#include "scan_time_body.h"
#define SR_T float
#define SR_I int32_t
#define SR_K 2
#define SR_V 8
#define ST_NAME c64_v8
#include "scan_time_body.h"
#define SR_T float
#define SR_I int32_t
#define SR_K 2
#define SR_V 16
#define ST_NAME c64_v16
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 2
#define SR_V 2
#define ST_NAME c128_v2
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 2
#define SR_V 4
#define ST_NAME c128_v4
#include "scan_time_body.h"
#define SR_T double
#define SR_I int64_t
#define SR_K 2
#define SR_V 8
#define ST_NAME c128_v8
#include "scan_time_body.h"
#else
#define SR_TIME 0
#endif

typedef void (*nnkit_scan_fwd_fn)(const void *, const void *, const void *, void *, ptrdiff_t,
                                  ptrdiff_t, ptrdiff_t, int, int);
typedef void (*nnkit_scan_bwd_fn)(const void *, const void *, const void *, const void *,
                                  void *, void *, void *, ptrdiff_t, ptrdiff_t, ptrdiff_t,
                                  int, int);

/* one build of every kernel per instruction set; TIME: the suffix of the type's
 * time-vectorised kernels for this set */
#define SR_BUILD(ISA, TARGET, NAME, TIME)                                                  \
    TARGET static void sr_fwd_##NAME##_##ISA(const void *a, const void *b, const void *h0,  \
                                             void *h, ptrdiff_t T, ptrdiff_t stride,       \
                                             ptrdiff_t n, int reverse, int nt)             \
    {                                                                                      \
        SR_IF_TIME(TIME, stride, n, st_fwd_##TIME(a, b, h0, h, T, reverse, nt); return;)    \
        sr_fwd_##NAME(a, b, h0, h, T, stride, n, reverse, nt);                             \
    }                                                                                      \
    TARGET static void sr_bwd_##NAME##_##ISA(const void *dh, const void *a, const void *h,  \
                                             const void *h0, void *da, void *db,           \
                                             void *dh0, ptrdiff_t T, ptrdiff_t stride,     \
                                             ptrdiff_t n, int reverse, int nt)             \
    {                                                                                      \
        SR_IF_TIME(TIME, stride, n,                                                        \
                   st_bwd_##TIME(dh, a, h, h0, da, db, dh0, T, reverse, nt); return;)      \
        sr_bwd_##NAME(dh, a, h, h0, da, db, dh0, T, stride, n, reverse, nt);               \
    }
/* BODY when the block is one feature (K scalars) and the time kernels exist */
#if SR_TIME
#define SR_IF_TIME(TIME, stride, n, BODY) SR_TIME_##TIME(stride, n, BODY)
#define SR_ONE_FEATURE(K, stride, n, BODY)                                                 \
    if ((stride) == (K) && (n) == (K)) {                                                   \
        BODY                                                                               \
    }
#define SR_REAL(stride, n, BODY) SR_ONE_FEATURE(1, stride, n, BODY)
#define SR_CPLX(stride, n, BODY) SR_ONE_FEATURE(2, stride, n, BODY)
#define SR_TIME_f32_v4 SR_REAL
#define SR_TIME_f32_v8 SR_REAL
#define SR_TIME_f32_v16 SR_REAL
#define SR_TIME_f64_v2 SR_REAL
#define SR_TIME_f64_v4 SR_REAL
#define SR_TIME_f64_v8 SR_REAL
#define SR_TIME_c64_v4 SR_CPLX
#define SR_TIME_c64_v8 SR_CPLX
#define SR_TIME_c64_v16 SR_CPLX
#define SR_TIME_c128_v2 SR_CPLX
#define SR_TIME_c128_v4 SR_CPLX
#define SR_TIME_c128_v8 SR_CPLX
#else
#define SR_IF_TIME(TIME, stride, n, BODY)
#endif
#define SR_BUILD_ALL(ISA, TARGET, F32, F64, C64, C128)                                     \
    SR_BUILD(ISA, TARGET, f32, F32) SR_BUILD(ISA, TARGET, f64, F64)                        \
    SR_BUILD(ISA, TARGET, c64, C64) SR_BUILD(ISA, TARGET, c128, C128)

SR_BUILD_ALL(base, , f32_v4, f64_v2, c64_v4, c128_v2)
#ifdef NNKIT_X86_64
SR_BUILD_ALL(avx2, NNKIT_TARGET_AVX2, f32_v8, f64_v4, c64_v8, c128_v4)
SR_BUILD_ALL(avx512, NNKIT_TARGET_AVX512, f32_v16, f64_v8, c64_v16, c128_v8)
#endif

/* kernel k of build ``level`` (0 baseline, 1 AVX2, 2 AVX-512; NULL if not built):
 * k = 2 * type + direction, types f32, f64, c64, c128, directions forward, backward */
static void *scan_kernel(int level, int k)
{
#define SR_TABLE(ISA)                                                                      \
    {(void *)sr_fwd_f32_##ISA, (void *)sr_bwd_f32_##ISA, (void *)sr_fwd_f64_##ISA,         \
     (void *)sr_bwd_f64_##ISA, (void *)sr_fwd_c64_##ISA, (void *)sr_bwd_c64_##ISA,         \
     (void *)sr_fwd_c128_##ISA, (void *)sr_bwd_c128_##ISA}
    static void *const base[8] = SR_TABLE(base);
#ifdef NNKIT_X86_64
    static void *const avx2[8] = SR_TABLE(avx2);
    static void *const avx512[8] = SR_TABLE(avx512);
    if (level == 2) return avx512[k];
    if (level == 1) return avx2[k];
#endif
#undef SR_TABLE
    return level == 0 ? base[k] : NULL;
}

#endif
