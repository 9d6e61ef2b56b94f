/* The window convolution of one float type for one instruction set (see conv_window.h),
 * instantiated as isa_targets.h describes (NNKIT_TYPE f32 or f64, NNKIT_ISA). AVX-512 (32
 * vector registers): 8-row tiles of CW_NV = 3 vectors a row (48 float32 columns) and masked
 * stores; otherwise passes of 4 rows over tiles of CW_NVR of the set's registers a row (24
 * float32 columns with AVX2, 8 in the baseline). The weight gradient's
 * panels are NR = 2 NNKIT_L wide. Entry points: cw_fwd_<type>_<isa>, cw_bwd_<type>_<isa>. */

#if NNKIT_LEVEL == 2
#define CW_NV 3
#define CW_ROWS8
#if NNKIT_BYTES == 4
#define CW_MASK_STORE(p, mask, v) _mm512_mask_storeu_ps(p, (__mmask16)(mask), (__m512)(v))
#else
#define CW_MASK_STORE(p, mask, v) _mm512_mask_storeu_pd(p, (__mmask8)(mask), (__m512d)(v))
#endif
#define CW_FW (CW_NV * NNKIT_L)
#else
/* 16 vector registers (AVX2, baseline): 4-row tiles of CW_NVR of the set's own registers a
 * row (12 accumulators with AVX2); GCC moved 64-byte vectors through the stack there */
#define CW_NVR (NNKIT_LEVEL == 1 ? 3 : 2)
#define CW_V (NNKIT_VBYTES / NNKIT_BYTES)
#define CW_FW (CW_NVR * CW_V)
#endif

/* Every inner function carries the set's target (NNKIT_TARGET) besides NNKIT_INLINE: the
 * masked stores are AVX-512 intrinsics, which GCC inlines only into functions of that
 * target, and so on up to the entry points. */

/* xp (C, Hp, Wp) = the image x (C, H, W) at (pt, pl) in zeros, then ``slack`` zeros; only
 * the border is zeroed (a memset of the whole planes first doubled the bytes written) */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_pad)(const NNKIT_T *x, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W, ptrdiff_t pt,
                        ptrdiff_t pl, ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t slack, NNKIT_T *xp)
{
    ptrdiff_t rows = H < Hp - pt ? H : Hp - pt, cols = W < Wp - pl ? W : Wp - pl;  /* >= 1 */
    size_t t = sizeof(NNKIT_T);
    for (ptrdiff_t c = 0; c < C; c++) {
        NNKIT_T *plane = xp + c * Hp * Wp;
        memset(plane, 0, (size_t)(pt * Wp + pl) * t);  /* the rows above, then the left */
        for (ptrdiff_t h = 0; h < rows; h++) {
            NNKIT_T *row = plane + (pt + h) * Wp + pl;
            memcpy(row, x + (c * H + h) * W, (size_t)cols * t);
            /* the right border, and the next row's left one (the last: the rows below) */
            ptrdiff_t gap = h + 1 < rows ? Wp - cols : Wp - pl - cols + (Hp - pt - rows) * Wp;
            memset(row + cols, 0, (size_t)gap * t);
        }
    }
    memset(xp + C * Hp * Wp, 0, (size_t)slack * t);
}

/* xp = the phase planes of x (C, H, W) for g's stride (cw_hq), then ``slack`` zeros;
 * stride 1: cw_pad */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_phases)(const NNKIT_T *x, const cw_geom *g, ptrdiff_t slack, NNKIT_T *xp)
{
    ptrdiff_t Hq = cw_hq(g), Wq = cw_wq(g), C = g->C, H = g->H, W = g->W;
    if (g->sh == 1 && g->sw == 1) {
        NNKIT_NAME(cw_pad)(x, C, H, W, g->pt, g->pl, Hq, Wq, slack, xp);
        return;
    }
    NNKIT_T *row = xp;
    for (ptrdiff_t a = 0; a < g->sh; a++)
        for (ptrdiff_t b = 0; b < g->sw; b++) {
            /* columns v with 0 <= sw v + b - pl < W: [v0, v1) */
            ptrdiff_t v0 = g->pl > b ? (g->pl - b + g->sw - 1) / g->sw : 0;
            ptrdiff_t v1 = W - 1 + g->pl - b < 0 ? 0 : (W - 1 + g->pl - b) / g->sw + 1;
            v1 = v1 < Wq ? v1 : Wq;
            v0 = v0 < v1 ? v0 : v1;
            for (ptrdiff_t c = 0; c < C; c++)
                for (ptrdiff_t u = 0; u < Hq; u++, row += Wq) {
                    ptrdiff_t h = g->sh * u + a - g->pt;
                    if (h < 0 || h >= H) {
                        memset(row, 0, (size_t)Wq * sizeof(NNKIT_T));
                        continue;
                    }
                    const NNKIT_T *src = x + (c * H + h) * W;
                    for (ptrdiff_t v = 0; v < v0; v++) row[v] = 0;
                    for (ptrdiff_t v = v0; v < v1; v++) row[v] = src[g->sw * v + b - g->pl];
                    for (ptrdiff_t v = v1; v < Wq; v++) row[v] = 0;
                }
        }
    memset(row, 0, (size_t)slack * sizeof(NNKIT_T));
}

/* tmp (M, FW) = rows [m0, m0 + M) of wt (R, 8)^T @ [xq + off[r], + FW) for r < R, FW =
 * CW_NV vectors: M x CW_NV accumulators in registers (the loops unroll fully) */
#define CW_ROWS(NAME, M)                                                                   \
    static NNKIT_INLINE NNKIT_TARGET                                                       \
    void NNKIT_NAME(NAME)(const NNKIT_T *wt, const NNKIT_T *xq, const ptrdiff_t *off,      \
                          ptrdiff_t R, int m0, NNKIT_T *tmp)                               \
    {                                                                                      \
        NNKIT_V c[M][CW_NV];                                                               \
        for (int m = 0; m < M; m++)                                                        \
            for (int v = 0; v < CW_NV; v++) c[m][v] = (NNKIT_V){0};                        \
        for (ptrdiff_t r = 0; r < R; r++) {                                                \
            const NNKIT_T *s = xq + off[r], *a = wt + r * 8 + m0;                          \
            NNKIT_V b[CW_NV];                                                              \
            for (int v = 0; v < CW_NV; v++) b[v] = *(const NNKIT_V *)(s + v * NNKIT_L);    \
            for (int m = 0; m < M; m++)                                                    \
                for (int v = 0; v < CW_NV; v++) c[m][v] += a[m] * b[v];                    \
        }                                                                                  \
        memcpy(tmp, c, sizeof c);                                                          \
    }
#ifdef CW_ROWS8
CW_ROWS(cw_rows4, 4)
CW_ROWS(cw_rows8, 8)
#else
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_rows4)(const NNKIT_T *wt, const NNKIT_T *xq, const ptrdiff_t *off,
                          ptrdiff_t R, int m0, NNKIT_T *tmp)
{
    NNKIT_VREG c[4][CW_NVR];
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++)
#pragma GCC unroll 8
        for (int v = 0; v < CW_NVR; v++) c[m][v] = (NNKIT_VREG){0};
    for (ptrdiff_t r = 0; r < R; r++) {
        const NNKIT_T *s = xq + off[r], *a = wt + r * 8 + m0;
        NNKIT_VREG b[CW_NVR];
#pragma GCC unroll 8
        for (int v = 0; v < CW_NVR; v++) memcpy(&b[v], s + v * CW_V, sizeof b[v]);
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            NNKIT_T x = a[m];
#pragma GCC unroll 8
            for (int v = 0; v < CW_NVR; v++) c[m][v] += x * b[v];
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++)
#pragma GCC unroll 8
        for (int v = 0; v < CW_NVR; v++) {
            NNKIT_VREG t = c[m][v];
            memcpy(tmp + m * CW_FW + v * CW_V, &t, sizeof t);
        }
}
#endif
#undef CW_ROWS

/* tmp (8, FW) = wt (R, 8)^T @ [xq + off[r], + FW) for r < R: one tile of the wide output,
 * of which the first ``rows`` are kept. 8 rows in one pass (AVX-512's 32 registers), else
 * passes of 4 rows over the same panel (one when rows <= 4). */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_tile)(const NNKIT_T *wt, const NNKIT_T *xq, const ptrdiff_t *off,
                         ptrdiff_t R, ptrdiff_t rows, NNKIT_T *tmp)
{
#ifdef CW_ROWS8
    if (rows > 4) {
        NNKIT_NAME(cw_rows8)(wt, xq, off, R, 0, tmp);
        return;
    }
#endif
    for (int m0 = 0; m0 < rows; m0 += 4)
        NNKIT_NAME(cw_rows4)(wt, xq, off, R, m0, tmp + m0 * CW_FW);
}

/* dst[:n] = src[:n] + b: masked vector stores (AVX-512), else a loop; src may be read up
 * to a vector past n */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_store)(NNKIT_T *dst, const NNKIT_T *src, ptrdiff_t n, NNKIT_T b)
{
#ifdef CW_MASK_STORE
    for (ptrdiff_t u = 0; u < n; u += NNKIT_L) {
        unsigned lanes = n - u < NNKIT_L ? (unsigned)(n - u) : NNKIT_L;
        CW_MASK_STORE(dst + u, (1u << lanes) - 1, *(const NNKIT_V *)(src + u) + b);
    }
#else
    for (ptrdiff_t u = 0; u < n; u++) dst[u] = src[u] + b;
#endif
}

/* y (K, Ho Wo) = the stride-1 convolution of one image x (C, H, W) with the packed weight
 * wp (ceil(K / 8), R, 8) (+ bias when not NULL); xp, off: workspace (cw_xp_size, R). */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_image)(const NNKIT_T *x, const NNKIT_T *wp, const NNKIT_T *bias, NNKIT_T *y,
                          const cw_geom *g, NNKIT_T *xp, ptrdiff_t *off)
{
    enum { FW = CW_FW };
    ptrdiff_t Wp = cw_wq(g), R = g->C * g->kh * g->kw, Q = g->Ho * Wp, P = g->Ho * g->Wo;
    NNKIT_T tmp[8 * FW + NNKIT_L] NNKIT_ALIGNED(64);  /* + a vector read past a row */
    NNKIT_NAME(cw_phases)(x, g, cw_slack(g, FW), xp);
    cw_offsets(g, off);
    for (ptrdiff_t q0 = 0; q0 < Q; q0 += FW) {
        for (ptrdiff_t k0 = 0; k0 < g->K; k0 += 8) {
            ptrdiff_t rows = g->K - k0 < 8 ? g->K - k0 : 8;
            NNKIT_NAME(cw_tile)(wp + k0 * R, xp + q0, off, R, rows, tmp);
            for (ptrdiff_t t = 0; t < FW && q0 + t < Q;) {  /* runs of one output row */
                ptrdiff_t oh = (q0 + t) / Wp, ow = (q0 + t) % Wp;
                ptrdiff_t seg = Wp - ow < FW - t ? Wp - ow : FW - t;
                ptrdiff_t valid = g->Wo - ow < seg ? g->Wo - ow : seg;
                for (ptrdiff_t m = 0; m < rows; m++)
                    NNKIT_NAME(cw_store)(y + (k0 + m) * P + oh * g->Wo + ow, tmp + m * FW + t,
                                    valid, bias ? bias[k0 + m] : 0);
                t += seg;
            }
        }
    }
}

/* dyp (Kp, Q, NR) = dy (K, Ho, Wo) laid out on the padded width Wp (zeros in the columns
 * ow >= Wo and for channels k >= K), NR channels a panel: transposed through a tile of
 * CW_TB pixels x NR channels in L1 (stores NR apart straight into dyp, one cache line
 * each, ran the weight gradient of small layers much slower: benchmarks/RESULTS.md,
 * "Convolution: the window GEMM") */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_pack_dy)(const NNKIT_T *dy, ptrdiff_t K, ptrdiff_t Ho, ptrdiff_t Wo,
                            ptrdiff_t Wp, ptrdiff_t Kp, NNKIT_T *dyp)
{
    enum { NR = 2 * NNKIT_L };
    ptrdiff_t Q = Ho * Wp;
    NNKIT_T tile[CW_TB * NR] NNKIT_ALIGNED(64);
    for (ptrdiff_t p = 0; p < Kp; p++) {
        ptrdiff_t k0 = p * NR, width = K - k0 < NR ? K - k0 : NR;
        NNKIT_T *panel = dyp + p * Q * NR;
        for (ptrdiff_t oh = 0; oh < Ho; oh++) {
            for (ptrdiff_t ow0 = 0; ow0 < Wo; ow0 += CW_TB) {
                ptrdiff_t n = Wo - ow0 < CW_TB ? Wo - ow0 : CW_TB;
                if (width < NR) memset(tile, 0, sizeof tile);
                for (ptrdiff_t t = 0; t < width; t++) {
                    const NNKIT_T *src = dy + ((k0 + t) * Ho + oh) * Wo + ow0;
                    for (ptrdiff_t u = 0; u < n; u++) tile[u * NR + t] = src[u];
                }
                memcpy(panel + (oh * Wp + ow0) * NR, tile, (size_t)(n * NR) * sizeof(NNKIT_T));
            }
            memset(panel + (oh * Wp + Wo) * NR, 0, (size_t)((Wp - Wo) * NR) * sizeof(NNKIT_T));
        }
    }
}

/* acc rows [r0, r0 + 8) (each Kp NR wide) += sum over q in [qa, qb) of
 * xp[off[r] + q] dyp[p, q, :] for every panel p: the weight gradient's tile */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_dw_tile)(const NNKIT_T *const *a, const NNKIT_T *dyp, ptrdiff_t Q,
                            ptrdiff_t Kp, ptrdiff_t qa, ptrdiff_t qb, NNKIT_T *acc)
{
    enum { L = NNKIT_L, NR = 2 * NNKIT_L };
    ptrdiff_t ld = Kp * NR;
    for (ptrdiff_t p = 0; p < Kp; p++) {
        const NNKIT_T *panel = dyp + p * Q * NR;
#ifdef CW_ROWS8
        NNKIT_V c[16];
        for (int m = 0; m < 8; m++) {
            c[2 * m] = *(const NNKIT_V *)(acc + m * ld + p * NR);
            c[2 * m + 1] = *(const NNKIT_V *)(acc + m * ld + p * NR + L);
        }
        NNKIT_V c00 = c[0], c01 = c[1], c10 = c[2], c11 = c[3], c20 = c[4], c21 = c[5];
        NNKIT_V c30 = c[6], c31 = c[7], c40 = c[8], c41 = c[9], c50 = c[10], c51 = c[11];
        NNKIT_V c60 = c[12], c61 = c[13], c70 = c[14], c71 = c[15];
        for (ptrdiff_t q = qa; q < qb; q++) {
            NNKIT_V b0 = *(const NNKIT_V *)(panel + q * NR),
                    b1 = *(const NNKIT_V *)(panel + q * NR + L);
            NNKIT_T x0 = a[0][q], x1 = a[1][q], x2 = a[2][q], x3 = a[3][q];
            NNKIT_T x4 = a[4][q], x5 = a[5][q], x6 = a[6][q], x7 = a[7][q];
            c00 += x0 * b0; c01 += x0 * b1; c10 += x1 * b0; c11 += x1 * b1;
            c20 += x2 * b0; c21 += x2 * b1; c30 += x3 * b0; c31 += x3 * b1;
            c40 += x4 * b0; c41 += x4 * b1; c50 += x5 * b0; c51 += x5 * b1;
            c60 += x6 * b0; c61 += x6 * b1; c70 += x7 * b0; c71 += x7 * b1;
        }
        NNKIT_V out[16] = {c00, c01, c10, c11, c20, c21, c30, c31,
                           c40, c41, c50, c51, c60, c61, c70, c71};
        for (int m = 0; m < 8; m++) {
            *(NNKIT_V *)(acc + m * ld + p * NR) = out[2 * m];
            *(NNKIT_V *)(acc + m * ld + p * NR + L) = out[2 * m + 1];
        }
#else
        /* 4 rows x 2 of the set's registers a pass: 8 accumulators (16 registers) */
        enum { V = NNKIT_VBYTES / NNKIT_BYTES };
        for (int half = 0; half < 8; half += 4)
            for (int v0 = 0; v0 < NR; v0 += 2 * V) {
                const NNKIT_T *const *ah = a + half;
                NNKIT_T *acch = acc + half * ld + p * NR + v0;
                NNKIT_VREG c[4][2];
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    memcpy(&c[m][0], acch + m * ld, sizeof c[m][0]);
                    memcpy(&c[m][1], acch + m * ld + V, sizeof c[m][1]);
                }
                for (ptrdiff_t q = qa; q < qb; q++) {
                    NNKIT_VREG b0, b1;
                    memcpy(&b0, panel + q * NR + v0, sizeof b0);
                    memcpy(&b1, panel + q * NR + v0 + V, sizeof b1);
#pragma GCC unroll 4
                    for (int m = 0; m < 4; m++) {
                        NNKIT_T x = ah[m][q];
                        c[m][0] += x * b0;
                        c[m][1] += x * b1;
                    }
                }
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    NNKIT_VREG t0 = c[m][0], t1 = c[m][1];
                    memcpy(acch + m * ld, &t0, sizeof t0);
                    memcpy(acch + m * ld + V, &t1, sizeof t1);
                }
            }
#endif
    }
}

/* images [lo, hi): y[n] = conv(x[n]) (see cw_image); 0, or -1 when out of memory */
static NNKIT_INLINE NNKIT_TARGET
int NNKIT_NAME(cw_forward)(const NNKIT_T *x, const NNKIT_T *wp, const NNKIT_T *bias,
                           NNKIT_T *y, const cw_geom *g, ptrdiff_t lo, ptrdiff_t hi)
{
    NNKIT_T *xp = malloc((size_t)cw_xp_size(g, CW_FW) * sizeof(NNKIT_T));
    ptrdiff_t *off = malloc((size_t)(g->C * g->kh * g->kw) * sizeof(ptrdiff_t));
    int status = xp && off ? 0 : -1;
    for (ptrdiff_t n = lo; n < hi && !status; n++)
        NNKIT_NAME(cw_image)(x + n * g->C * g->H * g->W, wp, bias,
                             y + n * g->K * g->Ho * g->Wo, g, xp, off);
    free(xp);
    free(off);
    return status;
}

/* db[k] += sum of dy (K, P)'s row k, in double, 8 partial sums (a single chain of
 * dependent adds would take 4 cycles an element) */
static NNKIT_INLINE NNKIT_TARGET
void NNKIT_NAME(cw_bias_grad)(const NNKIT_T *dy, ptrdiff_t K, ptrdiff_t P, double *db)
{
    for (ptrdiff_t k = 0; k < K; k++) {
        const NNKIT_T *row = dy + k * P;
        double part[8] = {0};
        ptrdiff_t i = 0;
        for (; i + 8 <= P; i += 8)
            for (int u = 0; u < 8; u++) part[u] += row[i + u];
        for (; i < P; i++) part[0] += row[i];
        db[k] += ((part[0] + part[1]) + (part[2] + part[3])) +
                 ((part[4] + part[5]) + (part[6] + part[7]));
    }
}

/* images [lo, hi): acc (ceil(R / 8) 8, Kp NR) += cols(x[n]) @ dy[n]^T on the padded width
 * when acc is not NULL (the weight gradient, transposed), and db (K,) += the sums of dy[n]
 * when db is not NULL; dx[n] = the stride-1 convolution of dy[n] with the flipped,
 * transposed weight wfp (packed like cw_image's, C rows) when dx is not NULL. 0, or -1
 * when out of memory. */
static NNKIT_INLINE NNKIT_TARGET
int NNKIT_NAME(cw_backward)(const NNKIT_T *x, const NNKIT_T *dy, const NNKIT_T *wfp,
                            NNKIT_T *dx, NNKIT_T *acc, double *db, const cw_geom *g,
                            ptrdiff_t lo, ptrdiff_t hi)
{
    enum { NR = 2 * NNKIT_L };
    ptrdiff_t Wp = cw_wq(g), R = g->C * g->kh * g->kw, Q = g->Ho * Wp;
    ptrdiff_t Kp = (g->K + NR - 1) / NR, Rt = (R + 7) / 8 * 8;
    cw_geom gt = cw_transposed(g);
    ptrdiff_t xp_size = cw_xp_size(g, NR), xt_size = cw_xp_size(&gt, CW_FW);
    ptrdiff_t Rmax = R > g->K * g->kh * g->kw ? R : g->K * g->kh * g->kw;
    NNKIT_T *xp = malloc((size_t)(xp_size > xt_size ? xp_size : xt_size) * sizeof(NNKIT_T));
    NNKIT_T *dyp = acc ? malloc((size_t)(Kp * Q * NR) * sizeof(NNKIT_T)) : NULL;
    ptrdiff_t *off = malloc((size_t)Rmax * sizeof(ptrdiff_t));
    int status = xp && off && (dyp || !acc) ? 0 : -1;
    for (ptrdiff_t n = lo; n < hi && !status; n++) {
        const NNKIT_T *dyn = dy + n * g->K * g->Ho * g->Wo;
        if (db) NNKIT_NAME(cw_bias_grad)(dyn, g->K, g->Ho * g->Wo, db);
        if (acc) {
            NNKIT_NAME(cw_phases)(x + n * g->C * g->H * g->W, g, cw_slack(g, NR), xp);
            NNKIT_NAME(cw_pack_dy)(dyn, g->K, g->Ho, g->Wo, Wp, Kp, dyp);
            cw_offsets(g, off);
            for (ptrdiff_t qa = 0; qa < Q; qa += CW_QB) {
                ptrdiff_t qb = qa + CW_QB < Q ? qa + CW_QB : Q;
                for (ptrdiff_t r0 = 0; r0 < Rt; r0 += 8) {
                    const NNKIT_T *a[8];
                    for (int m = 0; m < 8; m++)  /* rows past R repeat the last (not kept) */
                        a[m] = xp + off[r0 + m < R ? r0 + m : R - 1];
                    NNKIT_NAME(cw_dw_tile)(a, dyp, Q, Kp, qa, qb, acc + r0 * Kp * NR);
                }
            }
        }
        if (dx)
            NNKIT_NAME(cw_image)(dyn, wfp, NULL, dx + n * g->C * g->H * g->W, &gt, xp, off);
    }
    free(xp);
    free(dyp);
    free(off);
    return status;
}

/* the entry points, through untyped pointers (conv_window.h's table) */
static NNKIT_TARGET int NNKIT_NAME(cw_fwd)(const void *x, const void *wp, const void *bias,
                                           void *y, const cw_geom *g, ptrdiff_t lo,
                                           ptrdiff_t hi)
{
    return NNKIT_NAME(cw_forward)(x, wp, bias, y, g, lo, hi);
}
static NNKIT_TARGET int NNKIT_NAME(cw_bwd)(const void *x, const void *dy, const void *wfp,
                                           void *dx, void *acc, double *db, const cw_geom *g,
                                           ptrdiff_t lo, ptrdiff_t hi)
{
    return NNKIT_NAME(cw_backward)(x, dy, wfp, dx, acc, db, g, lo, hi);
}

#undef CW_FW
#undef CW_NV
#undef CW_NVR
#undef CW_V
#undef CW_ROWS8
#undef CW_MASK_STORE
#undef NNKIT_TYPE
#undef NNKIT_ISA
