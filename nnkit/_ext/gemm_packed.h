/* Small matrix products against a pre-packed right-hand side, for the time loops of the
 * recurrent kernels (nnkit/_ext/recurrent_cpu.py): each step multiplies a few rows of h by
 * the same W_hh, so W_hh is packed once per sequence and every step's product runs from
 * registers and L1 (BLAS packs its B operand again at every call: at (16, 256) x (256, 1024)
 * that copy costs as much as the arithmetic).
 *
 *   nnkit_gemm_packed_f32 / _f64 (a, bp, c, M, K, N): c = a @ b, b packed as described in
 *   gemm_packed_body.h; a, c row-major contiguous. Panel widths: 32 floats, 16 doubles.
 *   nnkit_gemm_packed_ld_f32 / _f64 (a, bp, c, M, K, N, lda, acc): the same with a's rows
 *   lda elements apart (a block of columns of a wider matrix), and c += a @ b when acc.
 *   nnkit_stream_rows_f32 / _f64 (src, lds, dst, ldd, rows, cols): dst[i, :cols] =
 *   src[i, :cols], rows lds and ldd elements apart, with non-temporal stores (below).
 *   nnkit_stream_fence (): orders those stores before the caller's later ones.
 *
 * One source, compiled for AVX-512, AVX2+FMA and the baseline ISA on x86-64 (GCC, Clang),
 * chosen at run time by the CPU's features (gemm_select_*); elsewhere the baseline only
 * (isa_targets.h). The vectors are GCC vector extensions; compilers without them (or a
 * build with -DNNKIT_PLAIN) get plain loops. */

#ifndef NNKIT_GEMM_PACKED_H
#define NNKIT_GEMM_PACKED_H

#include <stddef.h>
#include <string.h>

#include "isa_targets.h"

/* Non-temporal stores write whole cache lines to memory without reading them first and
 * without evicting anything: for data the loop will not read again (the BPTT's packed dA,
 * read once by the weight-gradient product after the loop). Its 32 panels' rows, 1 MiB
 * apart, filled the same few cache sets at every step and pushed the step weights out of
 * L2: streamed, the LSTM's BPTT step ran faster (benchmarks/RESULTS.md, "The LSTM above
 * torch again"). SSE2, so
 * every x86-64 build; elsewhere a plain copy. A 16-byte piece of dst that is not aligned
 * is written with plain stores. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <emmintrin.h>
#include <stdint.h>
#define NNKIT_STREAM_ROWS(NAME, T, STREAM, LOADU)                                        \
    static void NAME(const T *src, ptrdiff_t lds, T *dst, ptrdiff_t ldd, ptrdiff_t rows,  \
                     ptrdiff_t cols)                                                     \
    {                                                                                    \
        enum { L = 16 / sizeof(T) };                                                     \
        for (ptrdiff_t i = 0; i < rows; i++) {                                           \
            const T *s = src + i * lds;                                                  \
            T *d = dst + i * ldd;                                                        \
            ptrdiff_t j = 0;                                                             \
            for (; j < cols && ((uintptr_t)(d + j) & 15); j++) d[j] = s[j];              \
            for (; j + L <= cols; j += L) STREAM(d + j, LOADU(s + j));                   \
            for (; j < cols; j++) d[j] = s[j];                                           \
        }                                                                                \
    }
NNKIT_STREAM_ROWS(stream_rows_f32, float, _mm_stream_ps, _mm_loadu_ps)
NNKIT_STREAM_ROWS(stream_rows_f64, double, _mm_stream_pd, _mm_loadu_pd)
static void stream_fence(void) { _mm_sfence(); }
#else
#define NNKIT_STREAM_ROWS(NAME, T)                                                       \
    static void NAME(const T *src, ptrdiff_t lds, T *dst, ptrdiff_t ldd, ptrdiff_t rows,  \
                     ptrdiff_t cols)                                                     \
    {                                                                                    \
        for (ptrdiff_t i = 0; i < rows; i++)                                             \
            memcpy(dst + i * ldd, src + i * lds, (size_t)cols * sizeof(T));              \
    }
NNKIT_STREAM_ROWS(stream_rows_f32, float)
NNKIT_STREAM_ROWS(stream_rows_f64, double)
static void stream_fence(void) {}
#endif

#define NNKIT_GEMM_NR_F32 32
#define NNKIT_GEMM_NR_F64 16

typedef void (*nnkit_gemm_f32_fn)(const float *, const float *, float *, ptrdiff_t, ptrdiff_t,
                                  ptrdiff_t);
typedef void (*nnkit_gemm_f64_fn)(const double *, const double *, double *, ptrdiff_t,
                                  ptrdiff_t, ptrdiff_t);

#if NNKIT_VECTORS

/* the kernels of each float type and instruction set (isa_targets.h): gemm_<type>_<isa>
 * (c = a @ b, a contiguous) and gemm_ld_<type>_<isa> (c (+)= a @ b, a's rows lda apart) */
#define NNKIT_BODY "gemm_packed_body.h"
#include "isa_instantiate.h"

/* gemm_kernel(level, k): entry point k (0 gemm f32, 1 gemm f64, 2 gemm_ld f32, 3 gemm_ld
 * f64) of the build of instruction-set ``level`` (isa_targets.h) */
#define GP_TABLE(isa)                                                                       \
    {(void *)gemm_f32_##isa, (void *)gemm_f64_##isa, (void *)gemm_ld_f32_##isa,             \
     (void *)gemm_ld_f64_##isa}
NNKIT_ISA_TABLE(gemm_kernel, 4, GP_TABLE)
#undef GP_TABLE
/* the build of level ``which`` (0 baseline, 1 AVX2+FMA, 2 AVX-512), NULL when not built or
 * not supported by this CPU */
static void *gemm_variant(int which, int f64) { return gemm_kernel(which, f64); }
static nnkit_gemm_f32_fn gemm_select_f32(void)
{
    return (nnkit_gemm_f32_fn)gemm_kernel(nnkit_isa_level(), 0);
}
static nnkit_gemm_f64_fn gemm_select_f64(void)
{
    return (nnkit_gemm_f64_fn)gemm_kernel(nnkit_isa_level(), 1);
}
/* the strided/accumulating entry points (``_ld``) of this CPU's build */
static void *gemm_select_ld(int f64) { return gemm_kernel(nnkit_isa_level(), 2 + f64); }
static const char *gemm_isa(void) { return nnkit_isa_name(nnkit_isa_level()); }

#else /* no vector extensions: plain loops over the same packed layout */

#define GP_PLAIN(SUFFIX, T, NR)                                                            \
    static void gemm_ld_##SUFFIX(const T *a, const T *bp, T *c, ptrdiff_t M, ptrdiff_t K,  \
                                 ptrdiff_t N, ptrdiff_t lda, ptrdiff_t acc)                \
    {                                                                                      \
        for (ptrdiff_t i = 0; i < M; i++)                                                  \
            for (ptrdiff_t n = 0; n < N; n++) {                                            \
                const T *col = bp + (n / NR) * K * NR + n % NR;                            \
                T s = acc ? c[i * N + n] : 0;                                              \
                for (ptrdiff_t k = 0; k < K; k++) s += a[i * lda + k] * col[k * NR];       \
                c[i * N + n] = s;                                                          \
            }                                                                              \
    }                                                                                      \
    static void gemm_##SUFFIX(const T *a, const T *bp, T *c, ptrdiff_t M, ptrdiff_t K,     \
                              ptrdiff_t N)                                                 \
    {                                                                                      \
        gemm_ld_##SUFFIX(a, bp, c, M, K, N, K, 0);                                         \
    }
GP_PLAIN(f32_base, float, NNKIT_GEMM_NR_F32)
GP_PLAIN(f64_base, double, NNKIT_GEMM_NR_F64)
static void *gemm_select_ld(int f64)
{
    return f64 ? (void *)gemm_ld_f64_base : (void *)gemm_ld_f32_base;
}
static nnkit_gemm_f32_fn gemm_select_f32(void) { return gemm_f32_base; }
static nnkit_gemm_f64_fn gemm_select_f64(void) { return gemm_f64_base; }
static void *gemm_variant(int which, int f64)
{
    if (which == 0) return f64 ? (void *)gemm_f64_base : (void *)gemm_f32_base;
    return NULL;
}
static const char *gemm_isa(void) { return "plain"; }

#endif
#endif
