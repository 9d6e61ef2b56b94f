/* The scan kernels of one type for one instruction set, instantiated by scan_rows.h as
 * isa_targets.h describes (NNKIT_TYPE f32, f64, c64 or c128; NNKIT_ISA). The row kernels'
 * inner loops are left to the compiler's vectoriser (the carried state is a local array, so
 * nothing aliases it); one feature goes to the time kernels of scan_time_body.h. Entry
 * points: sr_fwd_<type>_<isa>, sr_bwd_<type>_<isa>. */

/* for j over [0, m) in steps of w: ascending, or descending when ``down`` */
#define SR_FOR(j, m, w, down, BODY)                                                       \
    do {                                                                                  \
        if (down) {                                                                       \
            for (ptrdiff_t j = (m) - (w); j >= 0; j -= (w)) BODY                          \
        } else {                                                                          \
            for (ptrdiff_t j = 0; j < (m); j += (w)) BODY                                 \
        }                                                                                 \
    } while (0)

#if NNKIT_COMPLEX
#define SR_W 2
/* s = a s + b */
#define SR_STEP_FWD(j)                                                                    \
    {                                                                                     \
        NNKIT_T ar = at[j], ai = at[j + 1], sr = s[j], si = s[j + 1];                     \
        s[j] = ar * sr - ai * si + bt[j];                                                 \
        s[j + 1] = ar * si + ai * sr + bt[j + 1];                                         \
    }
/* d = g conj(h), g = dh + conj(a) g */
#define SR_STEP_BWD(j)                                                                    \
    {                                                                                     \
        NNKIT_T gr = g[j], gi = g[j + 1], ar = a_old[j], ai = a_old[j + 1];               \
        NNKIT_T hr = h_t[j], hi = h_t[j + 1];                                             \
        d[j] = gr * hr + gi * hi;                                                         \
        d[j + 1] = gi * hr - gr * hi;                                                     \
        g[j] = dh_t[j] + (ar * gr + ai * gi);                                             \
        g[j + 1] = dh_t[j + 1] + (ar * gi - ai * gr);                                     \
    }
#else
#define SR_W 1
#define SR_STEP_FWD(j) { s[j] = at[j] * s[j] + bt[j]; }
#define SR_STEP_BWD(j)                                                                    \
    {                                                                                     \
        d[j] = g[j] * h_t[j];                                                             \
        g[j] = dh_t[j] + a_old[j] * g[j];                                                 \
    }
#endif

/* forward: h_t = a_t h_{t-1} + b_t, t = 0..T-1 (reverse: T-1..0, h_{t+1}) */
static NNKIT_INLINE void NNKIT_NAME(sr_rows_fwd)(const void *a_, const void *b_,
                                                 const void *h0_, void *h_, ptrdiff_t T,
                                                 ptrdiff_t stride, ptrdiff_t n, int reverse,
                                                 int nt)
{
    const NNKIT_T *a = a_, *b = b_, *h0 = h0_;
    NNKIT_T *h = h_;
    NNKIT_T s[SR_CHUNK] NNKIT_ALIGNED(64);
    for (ptrdiff_t c0 = 0; c0 < n; c0 += SR_CHUNK) {
        ptrdiff_t m = n - c0 < SR_CHUNK ? n - c0 : SR_CHUNK;
        memcpy(s, h0 + c0, (size_t)m * sizeof(NNKIT_T));
        for (ptrdiff_t k = 0; k < T; k++) {
            ptrdiff_t off = (reverse ? T - 1 - k : k) * stride + c0;
            const NNKIT_T *at = a + off, *bt = b + off;
            SR_FOR(j, m, SR_W, reverse, SR_STEP_FWD(j));
            sr_store(h + off, s, (size_t)m * sizeof(NNKIT_T), nt);
        }
    }
    sr_fence(nt);
}

/* backward (forward direction; reverse mirrors it): g_t = dh_t + conj(a_{t+1}) g_{t+1}
 * into db, da_t = g_t conj(h_{t-1}) (h_{-1} = h0), dh0 = conj(a_0) g_0 */
static NNKIT_INLINE void NNKIT_NAME(sr_rows_bwd)(const void *dh_, const void *a_,
                                                 const void *h_, const void *h0_, void *da_,
                                                 void *db_, void *dh0_, ptrdiff_t T,
                                                 ptrdiff_t stride, ptrdiff_t n, int reverse,
                                                 int nt)
{
    const NNKIT_T *dh = dh_, *a = a_, *h = h_, *h0 = h0_;
    NNKIT_T *da = da_, *db = db_, *dh0 = dh0_;
    NNKIT_T g[SR_CHUNK] NNKIT_ALIGNED(64), d[SR_CHUNK] NNKIT_ALIGNED(64);
    if (T == 0) {
        memset(dh0, 0, (size_t)n * sizeof(NNKIT_T));
        return;
    }
    ptrdiff_t step = reverse ? 1 : -1, last = reverse ? 0 : T - 1;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += SR_CHUNK) {
        ptrdiff_t m = n - c0 < SR_CHUNK ? n - c0 : SR_CHUNK;
        size_t bytes = (size_t)m * sizeof(NNKIT_T);
        ptrdiff_t t = last;
        memcpy(g, dh + t * stride + c0, bytes);
        sr_store(db + t * stride + c0, g, bytes, nt);
        for (ptrdiff_t k = 1; k < T; k++) {
            ptrdiff_t old = t * stride + c0; /* the step whose g is in g[] */
            t += step;
            ptrdiff_t off = t * stride + c0;
            const NNKIT_T *a_old = a + old, *dh_t = dh + off, *h_t = h + off;
            SR_FOR(j, m, SR_W, !reverse, SR_STEP_BWD(j));
            sr_store(db + off, g, bytes, nt);
            sr_store(da + old, d, bytes, nt);
        }
        ptrdiff_t off = t * stride + c0;
        const NNKIT_T *a_t = a + off, *h_0 = h0 + c0;
        NNKIT_T *da_t = da + off, *dh0_t = dh0 + c0;
#if NNKIT_COMPLEX
        for (ptrdiff_t j = 0; j < m; j += 2) {
            NNKIT_T gr = g[j], gi = g[j + 1];
            da_t[j] = gr * h_0[j] + gi * h_0[j + 1];
            da_t[j + 1] = gi * h_0[j] - gr * h_0[j + 1];
            dh0_t[j] = a_t[j] * gr + a_t[j + 1] * gi;
            dh0_t[j + 1] = a_t[j] * gi - a_t[j + 1] * gr;
        }
#else
        for (ptrdiff_t j = 0; j < m; j++) {
            da_t[j] = g[j] * h_0[j];
            dh0_t[j] = a_t[j] * g[j];
        }
#endif
    }
    sr_fence(nt);
}

#if SR_TIME
#include "scan_time_body.h"
#endif

/* the entry points: one feature (stride = n = SR_W scalars) to the time kernels */
static NNKIT_TARGET void NNKIT_NAME(sr_fwd)(const void *a, const void *b, const void *h0,
                                            void *h, ptrdiff_t T, ptrdiff_t stride,
                                            ptrdiff_t n, int reverse, int nt)
{
#if SR_TIME
    if (stride == SR_W && n == SR_W) {
        NNKIT_NAME(st_fwd)(a, b, h0, h, T, reverse, nt);
        return;
    }
#endif
    NNKIT_NAME(sr_rows_fwd)(a, b, h0, h, T, stride, n, reverse, nt);
}

static NNKIT_TARGET void NNKIT_NAME(sr_bwd)(const void *dh, const void *a, const void *h,
                                            const void *h0, void *da, void *db, void *dh0,
                                            ptrdiff_t T, ptrdiff_t stride, ptrdiff_t n,
                                            int reverse, int nt)
{
#if SR_TIME
    if (stride == SR_W && n == SR_W) {
        NNKIT_NAME(st_bwd)(dh, a, h, h0, da, db, dh0, T, reverse, nt);
        return;
    }
#endif
    NNKIT_NAME(sr_rows_bwd)(dh, a, h, h0, da, db, dh0, T, stride, n, reverse, nt);
}

#undef SR_FOR
#undef SR_W
#undef SR_STEP_FWD
#undef SR_STEP_BWD
#undef NNKIT_TYPE
#undef NNKIT_ISA
