/* Stride-1 convolution with no im2col and no gather: the "window" GEMM.
 *
 * With stride 1, the im2col row of tap r = (c, i, j) over the output pixels, laid out on
 * the zero-padded image's width Wp (Ho Wp columns: Wo real ones and Wp - Wo junk ones a
 * row), is the contiguous run xp[off(r) : off(r) + Ho Wp] of the flat padded planes,
 * off(r) = c Hp Wp + i dh Wp + j dw. So the GEMM y (K, Ho Wp) = W (K, R) @ cols reads its
 * right-hand panels (NR columns of one tap) straight from the padded image at a per-row
 * offset: the packed GEMM's register tiles (8 rows x NR columns, gemm_packed.h) with the
 * panel address replaced by xp + off[r] + q0. The junk columns cost (kw - 1) dw / Wp of
 * the multiplies (2/58 at 56x56) and are dropped when a tile is stored.
 *
 *   forward:        y[n] (K, Ho Wo) = W @ cols(x[n])        (+ bias)
 *   input gradient: dx[n] = the same kernel on dy[n] with the flipped, transposed weight
 *                   (C, K, kh, kw) and padding (kh - 1) dh - pt, (kw - 1) dw - pl
 *   weight gradient: dW^T (R, K) += cols(x[n]) @ dy[n]^T, the rows of cols again read from
 *                   the padded image (8 at a time, broadcast) and dy[n] packed once per
 *                   image into panels of NR channels on the padded width (zeros in the
 *                   junk columns); the depth is walked in blocks of CW_QB pixels so that
 *                   the block's panels stay in L1 across the row tiles.
 *
 * The packed weight (``wp``): ceil(K / 8) tiles of (R, 8), wp[t, r, m] = W[8 t + m, r],
 * zeros for rows past K. The weight-gradient accumulator: ceil(R / 8) 8 rows of Kp NR
 * (Kp = ceil(K / NR)), zero on the first call; rows past R and columns past K are junk.
 *
 * One source, compiled for AVX-512 (8-row tiles in 32 registers), AVX2+FMA and the
 * baseline (two passes of 4 rows), chosen at run time (isa_targets.h). GCC/Clang only
 * (vector extensions); callers check ``cw_available``. Nothing is validated here: the
 * Python caller (nnkit.kernels.conv) checks shapes, dtypes and contiguity, and that the
 * padding is at most (k - 1) d on every side. */

#ifndef NNKIT_CONV_WINDOW_H
#define NNKIT_CONV_WINDOW_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "isa_targets.h"

typedef struct {
    ptrdiff_t C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo;
} cw_geom;

/* depth of the weight gradient's pixel blocks: 128 pixels of two float32 panels = 32 KiB */
#define CW_QB 128
/* pixels a block of dy's transpose (cw_pack_dy) */
#define CW_TB 16

/* zeros after the padded planes: the last tile reads up to NR - 1 + (kw - 1) dw past them */
static inline ptrdiff_t cw_slack(const cw_geom *g, ptrdiff_t nr)
{
    return 2 * nr + (g->kw - 1) * g->dw;
}

static inline ptrdiff_t cw_xp_size(const cw_geom *g, ptrdiff_t nr)
{
    return g->C * (g->Ho + (g->kh - 1) * g->dh) * (g->Wo + (g->kw - 1) * g->dw) +
           cw_slack(g, nr);
}

/* the input gradient's convolution: dy (K, Ho, Wo) in, dx (C, H, W) out */
static inline cw_geom cw_transposed(const cw_geom *g)
{
    cw_geom t = {g->K, g->Ho, g->Wo, g->C, g->kh, g->kw, (g->kh - 1) * g->dh - g->pt,
                 (g->kw - 1) * g->dw - g->pl, g->dh, g->dw, g->H, g->W};
    return t;
}

typedef int (*cw_forward_f32_fn)(const float *, const float *, const float *, float *,
                                 const cw_geom *, ptrdiff_t, ptrdiff_t);
typedef int (*cw_forward_f64_fn)(const double *, const double *, const double *, double *,
                                 const cw_geom *, ptrdiff_t, ptrdiff_t);
typedef int (*cw_backward_f32_fn)(const float *, const float *, const float *, float *,
                                  float *, const cw_geom *, ptrdiff_t, ptrdiff_t);
typedef int (*cw_backward_f64_fn)(const double *, const double *, const double *, double *,
                                  double *, const cw_geom *, ptrdiff_t, ptrdiff_t);

#if defined(__GNUC__) && !defined(NNKIT_GEMM_PLAIN)
#define GP_INLINE inline __attribute__((always_inline))

typedef float cw_v16f __attribute__((vector_size(64), aligned(4)));
typedef double cw_v8d __attribute__((vector_size(64), aligned(8)));

#define CW_T float
#define CW_V cw_v16f
#define CW_L 16
#define CW_SUF f32_4
#include "conv_window_body.h"
#undef CW_SUF
#define CW_ROWS8
#define CW_SUF f32_8
#include "conv_window_body.h"
#undef CW_SUF
#undef CW_ROWS8
#undef CW_T
#undef CW_V
#undef CW_L

#define CW_T double
#define CW_V cw_v8d
#define CW_L 8
#define CW_SUF f64_4
#include "conv_window_body.h"
#undef CW_SUF
#define CW_ROWS8
#define CW_SUF f64_8
#include "conv_window_body.h"
#undef CW_SUF
#undef CW_ROWS8
#undef CW_T
#undef CW_V
#undef CW_L

#define CW_VARIANT(NAME, TARGET, T, SUF)                                                \
    TARGET static int NAME##_fwd(const T *x, const T *wp, const T *bias, T *y,         \
                                 const cw_geom *g, ptrdiff_t lo, ptrdiff_t hi)          \
    {                                                                                   \
        return cw_forward_##SUF(x, wp, bias, y, g, lo, hi);                             \
    }                                                                                   \
    TARGET static int NAME##_bwd(const T *x, const T *dy, const T *wfp, T *dx, T *acc, \
                                 const cw_geom *g, ptrdiff_t lo, ptrdiff_t hi)          \
    {                                                                                   \
        return cw_backward_##SUF(x, dy, wfp, dx, acc, g, lo, hi);                       \
    }

CW_VARIANT(cw_base_f32, , float, f32_4)
CW_VARIANT(cw_base_f64, , double, f64_4)
#ifdef NNKIT_X86_64
CW_VARIANT(cw_avx512_f32, NNKIT_TARGET_AVX512, float, f32_8)
CW_VARIANT(cw_avx512_f64, NNKIT_TARGET_AVX512, double, f64_8)
CW_VARIANT(cw_avx2_f32, NNKIT_TARGET_AVX2, float, f32_4)
CW_VARIANT(cw_avx2_f64, NNKIT_TARGET_AVX2, double, f64_4)
#endif

static const int cw_available = 1;

/* kernel ``k`` (0 forward f32, 1 forward f64, 2 backward f32, 3 backward f64) of
 * instruction-set level ``which`` (isa_targets.h); NULL when this CPU cannot run it */
static void *cw_kernel(int which, int k)
{
    if (which > nnkit_isa_level()) return NULL;
#ifdef NNKIT_X86_64
    if (which == 2) {
        void *t[4] = {(void *)cw_avx512_f32_fwd, (void *)cw_avx512_f64_fwd,
                      (void *)cw_avx512_f32_bwd, (void *)cw_avx512_f64_bwd};
        return t[k];
    }
    if (which == 1) {
        void *t[4] = {(void *)cw_avx2_f32_fwd, (void *)cw_avx2_f64_fwd,
                      (void *)cw_avx2_f32_bwd, (void *)cw_avx2_f64_bwd};
        return t[k];
    }
#endif
    {
        void *t[4] = {(void *)cw_base_f32_fwd, (void *)cw_base_f64_fwd,
                      (void *)cw_base_f32_bwd, (void *)cw_base_f64_bwd};
        return t[k];
    }
}

#else /* no vector extensions: the caller keeps its other paths */

static const int cw_available = 0;
static void *cw_kernel(int which, int k)
{
    (void)which;
    (void)k;
    return NULL;
}

#endif
#endif
