/* Convolution with no im2col and no gather: the "window" GEMM.
 *
 * With stride 1, the im2col row of tap r = (c, i, j) over the output pixels, laid out on
 * the zero-padded image's width Wp (Ho Wp columns: Wo real ones and Wp - Wo junk ones a
 * row), is the contiguous run xp[off(r) : off(r) + Ho Wp] of the flat padded planes,
 * off(r) = c Hp Wp + i dh Wp + j dw. So the GEMM y (K, Ho Wp) = W (K, R) @ cols reads its
 * right-hand panels (FW columns of one tap) straight from the padded image at a per-tap
 * offset: register tiles of 8 rows x FW columns (48 float32 with AVX-512, 24 with AVX2) whose
 * panel address is xp + off[r] + q0. The junk columns cost (kw - 1) dw / Wp of the
 * multiplies (2/58 at 56x56) and are dropped when a tile is stored. With stride s the
 * padded image is first split into its sh sw phase planes (cw_hq below), in which every
 * tap's row is again a contiguous run.
 *
 *   forward:        y[n] (K, Ho Wo) = W @ cols(x[n])        (+ bias)
 *   input gradient: dx[n] = the same kernel on dy[n] with the flipped, transposed weight
 *                   (C, K, kh, kw) and padding (kh - 1) dh - pt, (kw - 1) dw - pl
 *                   (stride 1 only)
 *   weight gradient: dW^T (R, K) += cols(x[n]) @ dy[n]^T, the rows of cols again read from
 *                   the planes (8 at a time, broadcast) and dy[n] packed once per image
 *                   into panels of NR channels on the planes' width (zeros in the junk
 *                   columns); the depth is walked in blocks of CW_QB pixels so that the
 *                   block's panels stay in L1 across the row tiles.
 *
 * The packed weight (``wp``): ceil(K / 8) tiles of (R, 8), wp[t, r, m] = W[8 t + m, r],
 * zeros for rows past K. The weight-gradient accumulator: ceil(R / 8) 8 rows of Kp NR
 * (Kp = ceil(K / NR), NR = 2 vectors), zero on the first call; rows past R and columns
 * past K are junk. A run over the batch splits it into runs of images on the threads of
 * part_threads.h.
 *
 * One source, compiled for AVX-512 (8-row tiles in 32 registers, masked stores), AVX2+FMA
 * and the baseline (passes of 4 rows), chosen at run time (isa_targets.h). GCC/Clang only
 * (vector extensions); callers check ``cw_available``. Nothing is validated here: the
 * Cython boundary (conv_window.pyx) checks shapes, dtypes, contiguity and the geometry
 * (every padding at most (k - 1) d). */

#ifndef NNKIT_CONV_WINDOW_H
#define NNKIT_CONV_WINDOW_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "isa_targets.h"
#include "part_threads.h"

#ifdef NNKIT_X86_64
#include <immintrin.h>
#endif

typedef struct {
    ptrdiff_t C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw;
} cw_geom;

/* The phase planes: with stride s the padded image is split into sh sw planes,
 * plane (a, b)[c, u, v] = xpad[c, sh u + a, sw v + b], each Hq x Wq; tap (i, j) reads plane
 * ((i dh) % sh, (j dw) % sw) shifted by ((i dh) / sh, (j dw) / sw), so its im2col row on
 * the planes' width is again a contiguous run (stride 1: one plane, the padded image). */
static inline ptrdiff_t cw_hq(const cw_geom *g) { return g->Ho + (g->kh - 1) * g->dh / g->sh; }
static inline ptrdiff_t cw_wq(const cw_geom *g) { return g->Wo + (g->kw - 1) * g->dw / g->sw; }

/* depth of the weight gradient's pixel blocks: 128 pixels of two float32 panels = 32 KiB */
#define CW_QB 128
/* pixels a block of dy's transpose (cw_pack_dy) */
#define CW_TB 16

/* zeros after the phase planes: the last tile reads up to nr - 1 + (kw - 1) dw / sw past */
static inline ptrdiff_t cw_slack(const cw_geom *g, ptrdiff_t nr)
{
    return 2 * nr + (g->kw - 1) * g->dw / g->sw;
}

static inline ptrdiff_t cw_xp_size(const cw_geom *g, ptrdiff_t nr)
{
    return g->sh * g->sw * g->C * cw_hq(g) * cw_wq(g) + cw_slack(g, nr);
}

/* off[r] for the taps r = (c, i, j): where tap r's run starts in the phase planes */
static inline void cw_offsets(const cw_geom *g, ptrdiff_t *off)
{
    ptrdiff_t plane = cw_hq(g) * cw_wq(g), r = 0;
    for (ptrdiff_t c = 0; c < g->C; c++)
        for (ptrdiff_t i = 0; i < g->kh; i++)
            for (ptrdiff_t j = 0; j < g->kw; j++) {
                ptrdiff_t a = i * g->dh % g->sh, b = j * g->dw % g->sw;
                off[r++] = ((a * g->sw + b) * g->C + c) * plane + i * g->dh / g->sh * cw_wq(g) +
                           j * g->dw / g->sw;
            }
}

/* the input gradient's convolution (stride 1 only): dy (K, Ho, Wo) in, dx (C, H, W) out */
static inline cw_geom cw_transposed(const cw_geom *g)
{
    cw_geom t = {g->K, g->Ho, g->Wo, g->C, g->kh, g->kw, (g->kh - 1) * g->dh - g->pt,
                 (g->kw - 1) * g->dw - g->pl, g->dh, g->dw, g->H, g->W, 1, 1};
    return t;
}

/* one type's kernels on images [lo, hi), through untyped pointers (cw_kernel's table) */
typedef int (*cw_forward_fn)(const void *x, const void *wp, const void *bias, void *y,
                             const cw_geom *g, ptrdiff_t lo, ptrdiff_t hi);
typedef int (*cw_backward_fn)(const void *x, const void *dy, const void *wfp, void *dx,
                              void *acc, double *db, const cw_geom *g, ptrdiff_t lo,
                              ptrdiff_t hi);

#if NNKIT_VECTORS

/* the kernels of each float type and instruction set (isa_targets.h): cw_fwd_<type>_<isa>,
 * cw_bwd_<type>_<isa> */
#define NNKIT_BODY "conv_window_body.h"
#include "isa_instantiate.h"

static const int cw_available = 1;

/* cw_kernel(level, k): kernel k (0 forward f32, 1 forward f64, 2 backward f32, 3 backward
 * f64) of the build of instruction-set ``level`` (isa_targets.h) */
#define CW_TABLE(isa)                                                                       \
    {(void *)cw_fwd_f32_##isa, (void *)cw_fwd_f64_##isa, (void *)cw_bwd_f32_##isa,          \
     (void *)cw_bwd_f64_##isa}
NNKIT_ISA_TABLE(cw_kernel, 4, CW_TABLE)
#undef CW_TABLE

/* A run over the batch in ``parts`` runs of images, part p on images
 * [N p / parts, N (p + 1) / parts) (part_threads.h: the calling thread and the workers);
 * the backward's part p accumulates into its own acc (acc_size elements further each) and
 * db (K further each). */
typedef struct {
    cw_forward_fn fwd;
    cw_backward_fn bwd;
    const void *x, *wp, *bias, *dy, *wfp;
    void *y, *dx;
    char *acc;
    double *db;
    ptrdiff_t acc_bytes, N, parts;
    const cw_geom *g;
    volatile int failed;
} cw_job;

static void cw_part(void *ctx, ptrdiff_t p)
{
    cw_job *job = ctx;
    ptrdiff_t lo = job->N * p / job->parts, hi = job->N * (p + 1) / job->parts;
    int status;
    if (job->fwd)
        status = job->fwd(job->x, job->wp, job->bias, job->y, job->g, lo, hi);
    else
        status = job->bwd(job->x, job->dy, job->wfp, job->dx,
                          job->acc ? job->acc + p * job->acc_bytes : NULL,
                          job->db ? job->db + p * job->g->K : NULL, job->g, lo, hi);
    if (status) job->failed = 1;
}

/* 0, -1 out of memory, -2 no worker thread could be started */
static int cw_run(cw_job *job)
{
    if (part_threads_run(cw_part, job, job->parts)) return -2;
    return job->failed ? -1 : 0;
}

static int cw_forward_run(int which, int f64, const void *x, const void *wp, const void *bias,
                          void *y, const cw_geom *g, ptrdiff_t N, ptrdiff_t parts)
{
    cw_job job = {.fwd = (cw_forward_fn)cw_kernel(which, f64), .x = x, .wp = wp, .bias = bias,
                  .y = y, .g = g, .N = N, .parts = parts};
    return cw_run(&job);
}

static int cw_backward_run(int which, int f64, const void *x, const void *dy, const void *wfp,
                           void *dx, void *acc, ptrdiff_t acc_bytes, double *db,
                           const cw_geom *g, ptrdiff_t N, ptrdiff_t parts)
{
    cw_job job = {.bwd = (cw_backward_fn)cw_kernel(which, 2 + f64), .x = x, .dy = dy,
                  .wfp = wfp, .dx = dx, .acc = acc, .acc_bytes = acc_bytes, .db = db, .g = g,
                  .N = N, .parts = parts};
    return cw_run(&job);
}

#else /* no vector extensions: the caller keeps its other paths */

static const int cw_available = 0;
static int cw_forward_run(int which, int f64, const void *x, const void *wp, const void *bias,
                          void *y, const cw_geom *g, ptrdiff_t N, ptrdiff_t parts)
{
    return -3;
}
static int cw_backward_run(int which, int f64, const void *x, const void *dy, const void *wfp,
                           void *dx, void *acc, ptrdiff_t acc_bytes, double *db,
                           const cw_geom *g, ptrdiff_t N, ptrdiff_t parts)
{
    return -3;
}

#endif
#endif
