/* The packed-panel GEMM of one float type for one instruction set, instantiated by
 * gemm_packed.h as isa_targets.h describes (NNKIT_TYPE f32 or f64, NNKIT_ISA). Entry points:
 * gemm_<type>_<isa> (c = a @ b, a contiguous) and gemm_ld_<type>_<isa> (a's rows lda apart,
 * c += a @ b when acc). The panel width is NR = 2 NNKIT_L columns.
 *
 * c (M, N) = a (M, K) @ b (K, N), or c += a @ b with ``acc``; c row-major contiguous, a
 * row-major with ``lda`` elements from one row to the next (K for a contiguous a); b is
 * given packed:
 * ceil(N / NR) panels, panel p holding columns [p NR, p NR + NR) of b as K rows of NR
 * values (zero beyond column N). A tile of c keeps its accumulators in registers over the
 * whole k loop; the panel stays in cache across the row tiles of its column block.
 * (Blocking k by 256, to keep the panel in L1 when K is large, measured no faster at the
 * recurrent layers' shapes.)
 *
 * AVX-512 (GP_ROWS8; 32 registers of one 64-byte vector each): tiles of 8 rows x NR (16
 * accumulators, each panel row loaded once per 16 FMAs, a panel read half as often as with
 * 4 rows: the time loops' blocks are 8-16 rows, and a panel of K >= 384 rows no longer fits
 * L1 between two 4-row tiles), then 4 rows, then 1. AVX2 and the baseline (GP_HALF_ROWS; 16
 * registers of 32 or 16 bytes): each panel in two halves of L columns, tiles of 6 (baseline
 * 2) rows x a half in the set's own register type (12 AVX2 accumulators; tiles in 64-byte
 * vectors went through the stack there). Every element of c is the same k-ordered chain of
 * multiply-adds in any tile, so the results are identical.
 *
 * The panel is prefetched 16 of its rows (2 KiB in float32) ahead of the k loop: the
 * hardware's own prefetching left the loop waiting on L2 at the time loops' shapes, where a
 * panel is read once per call (the LSTM's step GEMM (8, 384) x (384, 1024) among them:
 * benchmarks/RESULTS.md, "The LSTM above torch again"). */

#if NNKIT_LEVEL == 2
#define GP_ROWS8
#elif NNKIT_LEVEL == 1
#define GP_HALF_ROWS 6
#else
#define GP_HALF_ROWS 2
#endif

/* dst[:width] = the row (lo, hi) of a tile */
#define GP_STORE(dst, lo, hi, width)                                                     \
    do {                                                                                 \
        NNKIT_V row_[2] = {lo, hi};                                                      \
        if ((width) == 2 * NNKIT_L) /* a fixed size: vector stores */                    \
            memcpy(dst, row_, sizeof row_);                                              \
        else                                                                             \
            memcpy(dst, row_, (size_t)(width) * sizeof(NNKIT_T));                        \
    } while (0)

/* (lo, hi) = the row src[:width] of a tile (zeros beyond width) when accumulating, else 0 */
#define GP_INIT(lo, hi, src, width)                                                      \
    do {                                                                                 \
        NNKIT_V row_[2] = {{0}, {0}};                                                    \
        if (acc) {                                                                       \
            if ((width) == 2 * NNKIT_L)                                                  \
                memcpy(row_, src, sizeof row_);                                          \
            else                                                                         \
                memcpy(row_, src, (size_t)(width) * sizeof(NNKIT_T));                    \
        }                                                                                \
        lo = row_[0];                                                                    \
        hi = row_[1];                                                                    \
    } while (0)

#ifdef GP_HALF_ROWS
/* c[r, :w] (+)= a[r] @ the panel half at pb (its rows NR apart), r < R, w <= L: Q registers
 * of the set's own type a row, R a constant where it is inlined (the loops over r and q
 * unroll) */
static NNKIT_INLINE void NNKIT_NAME(gemm_half_tile)(const NNKIT_T *a, ptrdiff_t lda,
                                                    const NNKIT_T *pb, NNKIT_T *c,
                                                    ptrdiff_t ldc, ptrdiff_t K, ptrdiff_t w,
                                                    int acc, const int R)
{
    enum { L = NNKIT_L, NR = 2 * NNKIT_L, V = NNKIT_VBYTES / NNKIT_BYTES, Q = L / V };
    NNKIT_VREG t[GP_HALF_ROWS][Q];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        NNKIT_T row[L] = {0};
        const NNKIT_T *src = c + r * ldc;
        if (acc && w < L) /* the edge: through a zero-padded row */
            src = memcpy(row, src, (size_t)w * sizeof(NNKIT_T));
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++) {
            NNKIT_VREG v = {0};
            if (acc)
                memcpy(&v, src + q * V, sizeof v);
            t[r][q] = v;
        }
    }
    for (ptrdiff_t k = 0; k < K; k++) {
        NNKIT_VREG b[Q];
        __builtin_prefetch(pb + (k + 16) * NR);
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++) memcpy(&b[q], pb + k * NR + q * V, sizeof b[q]);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            NNKIT_T x = a[r * lda + k];
#pragma GCC unroll 8
            for (int q = 0; q < Q; q++) t[r][q] += x * b[q];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        NNKIT_T row[L];
        NNKIT_T *dst = w == L ? c + r * ldc : row; /* the edge: through a row */
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++) {
            NNKIT_VREG v = t[r][q];
            memcpy(dst + q * V, &v, sizeof v);
        }
        if (w < L)
            memcpy(c + r * ldc, row, (size_t)w * sizeof(NNKIT_T));
    }
}

/* The 16-register builds (AVX2, baseline): each panel in two halves of L columns, each half
 * in tiles of GP_HALF_ROWS rows, then 4, 2, 1 */
static NNKIT_INLINE void NNKIT_NAME(gemm_halves)(const NNKIT_T *a, const NNKIT_T *bp,
                                                 NNKIT_T *c, ptrdiff_t M, ptrdiff_t K,
                                                 ptrdiff_t N, ptrdiff_t lda, int acc)
{
    enum { L = NNKIT_L, NR = 2 * NNKIT_L };
    ptrdiff_t npanels = (N + NR - 1) / NR;
    for (ptrdiff_t p = 0; p < npanels; p++) {
        for (ptrdiff_t n0 = p * NR; n0 < N && n0 < p * NR + NR; n0 += L) {
            const NNKIT_T *pb = bp + p * K * NR + (n0 - p * NR);
            ptrdiff_t w = N - n0 < L ? N - n0 : L, i = 0;
            for (; i + GP_HALF_ROWS <= M; i += GP_HALF_ROWS)
                NNKIT_NAME(gemm_half_tile)(a + i * lda, lda, pb, c + i * N + n0, N, K, w,
                                           acc, GP_HALF_ROWS);
#if GP_HALF_ROWS > 4
            if (M - i >= 4) {
                NNKIT_NAME(gemm_half_tile)(a + i * lda, lda, pb, c + i * N + n0, N, K, w,
                                           acc, 4);
                i += 4;
            }
#endif
#if GP_HALF_ROWS > 2
            if (M - i >= 2) {
                NNKIT_NAME(gemm_half_tile)(a + i * lda, lda, pb, c + i * N + n0, N, K, w,
                                           acc, 2);
                i += 2;
            }
#endif
            if (M - i >= 1)
                NNKIT_NAME(gemm_half_tile)(a + i * lda, lda, pb, c + i * N + n0, N, K, w,
                                           acc, 1);
        }
    }
}
#endif

#ifndef GP_HALF_ROWS
/* the AVX-512 builds (32 vector registers): 8 and 4 rows x NR columns */
static NNKIT_INLINE void NNKIT_NAME(gemm_panels)(const NNKIT_T *a, const NNKIT_T *bp,
                                                 NNKIT_T *c, ptrdiff_t M, ptrdiff_t K,
                                                 ptrdiff_t N, ptrdiff_t lda, int acc)
{
    enum { L = NNKIT_L, NR = 2 * NNKIT_L };
    ptrdiff_t npanels = (N + NR - 1) / NR;
    for (ptrdiff_t p = 0; p < npanels; p++) {
        const NNKIT_T *panel = bp + p * K * NR;
        ptrdiff_t n0 = p * NR, width = N - n0 < NR ? N - n0 : NR;
        ptrdiff_t i = 0;
#ifdef GP_ROWS8
        for (; i + 8 <= M; i += 8) {
            const NNKIT_T *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            const NNKIT_T *a4 = a3 + lda, *a5 = a4 + lda, *a6 = a5 + lda, *a7 = a6 + lda;
            NNKIT_T *c0 = c + i * N + n0;
            NNKIT_V c00, c01, c10, c11, c20, c21, c30, c31;
            NNKIT_V c40, c41, c50, c51, c60, c61, c70, c71;
            GP_INIT(c00, c01, c0, width);
            GP_INIT(c10, c11, c0 + N, width);
            GP_INIT(c20, c21, c0 + 2 * N, width);
            GP_INIT(c30, c31, c0 + 3 * N, width);
            GP_INIT(c40, c41, c0 + 4 * N, width);
            GP_INIT(c50, c51, c0 + 5 * N, width);
            GP_INIT(c60, c61, c0 + 6 * N, width);
            GP_INIT(c70, c71, c0 + 7 * N, width);
            for (ptrdiff_t k = 0; k < K; k++) {
                NNKIT_V b0, b1;
                __builtin_prefetch(panel + (k + 16) * NR);
                __builtin_prefetch(panel + (k + 16) * NR + L);
                memcpy(&b0, panel + k * NR, sizeof b0);
                memcpy(&b1, panel + k * NR + L, sizeof b1);
                NNKIT_T x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
                NNKIT_T x4 = a4[k], x5 = a5[k], x6 = a6[k], x7 = a7[k];
                c00 += x0 * b0; c01 += x0 * b1;
                c10 += x1 * b0; c11 += x1 * b1;
                c20 += x2 * b0; c21 += x2 * b1;
                c30 += x3 * b0; c31 += x3 * b1;
                c40 += x4 * b0; c41 += x4 * b1;
                c50 += x5 * b0; c51 += x5 * b1;
                c60 += x6 * b0; c61 += x6 * b1;
                c70 += x7 * b0; c71 += x7 * b1;
            }
            GP_STORE(c0, c00, c01, width);
            GP_STORE(c0 + N, c10, c11, width);
            GP_STORE(c0 + 2 * N, c20, c21, width);
            GP_STORE(c0 + 3 * N, c30, c31, width);
            GP_STORE(c0 + 4 * N, c40, c41, width);
            GP_STORE(c0 + 5 * N, c50, c51, width);
            GP_STORE(c0 + 6 * N, c60, c61, width);
            GP_STORE(c0 + 7 * N, c70, c71, width);
        }
#endif
        for (; i + 4 <= M; i += 4) {
            const NNKIT_T *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            NNKIT_T *c0 = c + i * N + n0;
            NNKIT_V c00, c01, c10, c11, c20, c21, c30, c31;
            GP_INIT(c00, c01, c0, width);
            GP_INIT(c10, c11, c0 + N, width);
            GP_INIT(c20, c21, c0 + 2 * N, width);
            GP_INIT(c30, c31, c0 + 3 * N, width);
            for (ptrdiff_t k = 0; k < K; k++) {
                NNKIT_V b0, b1;
                __builtin_prefetch(panel + (k + 16) * NR);
                __builtin_prefetch(panel + (k + 16) * NR + L);
                memcpy(&b0, panel + k * NR, sizeof b0);
                memcpy(&b1, panel + k * NR + L, sizeof b1);
                NNKIT_T x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
                c00 += x0 * b0; c01 += x0 * b1;
                c10 += x1 * b0; c11 += x1 * b1;
                c20 += x2 * b0; c21 += x2 * b1;
                c30 += x3 * b0; c31 += x3 * b1;
            }
            GP_STORE(c0, c00, c01, width);
            GP_STORE(c0 + N, c10, c11, width);
            GP_STORE(c0 + 2 * N, c20, c21, width);
            GP_STORE(c0 + 3 * N, c30, c31, width);
        }
        for (; i < M; i++) {
            const NNKIT_T *a0 = a + i * lda;
            NNKIT_V c00, c01;
            GP_INIT(c00, c01, c + i * N + n0, width);
            for (ptrdiff_t k = 0; k < K; k++) {
                NNKIT_V b0, b1;
                memcpy(&b0, panel + k * NR, sizeof b0);
                memcpy(&b1, panel + k * NR + L, sizeof b1);
                c00 += a0[k] * b0; c01 += a0[k] * b1;
            }
            GP_STORE(c + i * N + n0, c00, c01, width);
        }
    }
}

#endif

/* the entry points (gemm_packed.h's table): c = a @ b, a contiguous; c (+)= a @ b, a's rows
 * lda apart */
static NNKIT_TARGET void NNKIT_NAME(gemm)(const NNKIT_T *a, const NNKIT_T *bp, NNKIT_T *c,
                                          ptrdiff_t M, ptrdiff_t K, ptrdiff_t N)
{
#ifdef GP_HALF_ROWS
    NNKIT_NAME(gemm_halves)(a, bp, c, M, K, N, K, 0);
#else
    NNKIT_NAME(gemm_panels)(a, bp, c, M, K, N, K, 0);
#endif
}

static NNKIT_TARGET void NNKIT_NAME(gemm_ld)(const NNKIT_T *a, const NNKIT_T *bp, NNKIT_T *c,
                                             ptrdiff_t M, ptrdiff_t K, ptrdiff_t N,
                                             ptrdiff_t lda, ptrdiff_t acc)
{
#ifdef GP_HALF_ROWS
    if (acc)
        NNKIT_NAME(gemm_halves)(a, bp, c, M, K, N, lda, 1);
    else
        NNKIT_NAME(gemm_halves)(a, bp, c, M, K, N, lda, 0);
#else
    if (acc)
        NNKIT_NAME(gemm_panels)(a, bp, c, M, K, N, lda, 1);
    else
        NNKIT_NAME(gemm_panels)(a, bp, c, M, K, N, lda, 0);
#endif
}

#undef GP_STORE
#undef GP_INIT
#undef GP_ROWS8
#undef GP_HALF_ROWS
#undef NNKIT_TYPE
#undef NNKIT_ISA
