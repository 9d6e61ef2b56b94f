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
 * prefetcher lost them (the reverse forward scan and the backward ran several times
 * slower: benchmarks/RESULTS.md, "Linear recurrences").
 *
 * With one feature (stride = n = one element) the kernels hand over to the scan
 * vectorised along T of scan_time_body.h: a single chain of multiply-adds would wait for
 * the latency of each step's multiply-add (benchmarks/RESULTS.md, "Figures moved from
 * docstrings").
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

/* dst[0:bytes) = src[0:bytes); the 16-byte-aligned body with non-temporal stores when nt */
static NNKIT_INLINE void sr_store(void *dst, const void *src, size_t bytes, int nt)
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
#else
    (void)nt;  /* non-temporal stores are x86's; elsewhere a plain copy */
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

/* One feature (stride = n = 1 scalar, or 2 for complex types): the scan vectorised along
 * T of scan_time_body.h, one vector register wide (GCC's vector extensions; other compilers
 * keep the row kernels for it). */
#if NNKIT_VECTORS && !defined(__clang__)
#define SR_TIME 1
#else
#define SR_TIME 0
#endif

/* Blocks of the time kernels' walk end where the output is 64-byte aligned (t = phase + k
 * SR_CHUNK), so the streamed stores of two blocks never share a cache line: partly streamed
 * lines cost (fresh NumPy arrays start 16 bytes into a line; misaligned blocks made the
 * 1-feature backward several times slower: benchmarks/RESULTS.md, "Linear recurrences"). */
static inline ptrdiff_t st_phase(const void *out, size_t size)
{
    return (ptrdiff_t)(((64 - (uintptr_t)out % 64) % 64) / size);
}
/* the first cut above t (ascending walk) and the last cut below t (descending) */
static inline ptrdiff_t st_cut_above(ptrdiff_t t, ptrdiff_t phase)
{
    return t < phase ? phase : phase + ((t - phase) / SR_CHUNK + 1) * SR_CHUNK;
}
static inline ptrdiff_t st_cut_below(ptrdiff_t t, ptrdiff_t phase)
{
    return t - 1 >= phase ? phase + ((t - 1 - phase) / SR_CHUNK) * SR_CHUNK : 0;
}

/* the kernels of each type and instruction set (isa_targets.h): sr_fwd_<type>_<isa>,
 * sr_bwd_<type>_<isa> */
#define NNKIT_BODY "scan_rows_body.h"
#define NNKIT_WITH_COMPLEX 1
#include "isa_instantiate.h"

typedef void (*nnkit_scan_fwd_fn)(const void *, const void *, const void *, void *, ptrdiff_t,
                                  ptrdiff_t, ptrdiff_t, int, int);
typedef void (*nnkit_scan_bwd_fn)(const void *, const void *, const void *, const void *,
                                  void *, void *, void *, ptrdiff_t, ptrdiff_t, ptrdiff_t,
                                  int, int);

/* scan_kernel(level, k): kernel k of the build of instruction-set ``level`` (isa_targets.h),
 * k = 2 * type + direction, types f32, f64, c64, c128, directions forward, backward */
#define SR_TABLE(ISA)                                                                      \
    {(void *)sr_fwd_f32_##ISA, (void *)sr_bwd_f32_##ISA, (void *)sr_fwd_f64_##ISA,         \
     (void *)sr_bwd_f64_##ISA, (void *)sr_fwd_c64_##ISA, (void *)sr_bwd_c64_##ISA,         \
     (void *)sr_fwd_c128_##ISA, (void *)sr_bwd_c128_##ISA}
NNKIT_ISA_TABLE(scan_kernel, 8, SR_TABLE)
#undef SR_TABLE

#endif
