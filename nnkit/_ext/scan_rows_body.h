/* One scalar type's scan kernels, included by scan_rows.h with SR_T (float or double),
 * SR_COMPLEX (0 real, 1 (re, im) pairs) and SR_NAME (the type's suffix). Compiled inline
 * into each instruction set's build; the inner loops are left to the compiler's vectoriser
 * (the carried state is a local array, so nothing aliases it). */

#define SR_CAT_(x, y) x##y
#define SR_CAT(x, y) SR_CAT_(x, y)
#define SR_FWD SR_CAT(sr_fwd_, SR_NAME)
#define SR_BWD SR_CAT(sr_bwd_, SR_NAME)

/* for j over [0, m) in steps of w: ascending, or descending when ``down`` */
#define SR_FOR(j, m, w, down, BODY)                                                       \
    do {                                                                                  \
        if (down) {                                                                       \
            for (ptrdiff_t j = (m) - (w); j >= 0; j -= (w)) BODY                          \
        } else {                                                                          \
            for (ptrdiff_t j = 0; j < (m); j += (w)) BODY                                 \
        }                                                                                 \
    } while (0)

#if SR_COMPLEX
#define SR_W 2
/* s = a s + b */
#define SR_STEP_FWD(j)                                                                    \
    {                                                                                     \
        SR_T ar = at[j], ai = at[j + 1], sr = s[j], si = s[j + 1];                        \
        s[j] = ar * sr - ai * si + bt[j];                                                 \
        s[j + 1] = ar * si + ai * sr + bt[j + 1];                                         \
    }
/* d = g conj(h), g = dh + conj(a) g */
#define SR_STEP_BWD(j)                                                                    \
    {                                                                                     \
        SR_T gr = g[j], gi = g[j + 1], ar = a_old[j], ai = a_old[j + 1];                  \
        SR_T hr = h_t[j], hi = h_t[j + 1];                                                \
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
SR_INLINE void SR_FWD(const void *a_, const void *b_, const void *h0_, void *h_, ptrdiff_t T,
                      ptrdiff_t stride, ptrdiff_t n, int reverse, int nt)
{
    const SR_T *a = a_, *b = b_, *h0 = h0_;
    SR_T *h = h_;
    SR_T s[SR_CHUNK] SR_ALIGNED;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += SR_CHUNK) {
        ptrdiff_t m = n - c0 < SR_CHUNK ? n - c0 : SR_CHUNK;
        memcpy(s, h0 + c0, (size_t)m * sizeof(SR_T));
        for (ptrdiff_t k = 0; k < T; k++) {
            ptrdiff_t off = (reverse ? T - 1 - k : k) * stride + c0;
            const SR_T *at = a + off, *bt = b + off;
            SR_FOR(j, m, SR_W, reverse, SR_STEP_FWD(j));
            sr_store(h + off, s, (size_t)m * sizeof(SR_T), nt);
        }
    }
    sr_fence(nt);
}

/* backward (forward direction; reverse mirrors it): g_t = dh_t + conj(a_{t+1}) g_{t+1}
 * into db, da_t = g_t conj(h_{t-1}) (h_{-1} = h0), dh0 = conj(a_0) g_0 */
SR_INLINE void SR_BWD(
    const void *dh_, const void *a_, const void *h_, const void *h0_, void *da_, void *db_,
    void *dh0_, ptrdiff_t T, ptrdiff_t stride, ptrdiff_t n, int reverse, int nt)
{
    const SR_T *dh = dh_, *a = a_, *h = h_, *h0 = h0_;
    SR_T *da = da_, *db = db_, *dh0 = dh0_;
    SR_T g[SR_CHUNK] SR_ALIGNED, d[SR_CHUNK] SR_ALIGNED;
    if (T == 0) {
        memset(dh0, 0, (size_t)n * sizeof(SR_T));
        return;
    }
    ptrdiff_t step = reverse ? 1 : -1, last = reverse ? 0 : T - 1;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += SR_CHUNK) {
        ptrdiff_t m = n - c0 < SR_CHUNK ? n - c0 : SR_CHUNK;
        size_t bytes = (size_t)m * sizeof(SR_T);
        ptrdiff_t t = last;
        memcpy(g, dh + t * stride + c0, bytes);
        sr_store(db + t * stride + c0, g, bytes, nt);
        for (ptrdiff_t k = 1; k < T; k++) {
            ptrdiff_t old = t * stride + c0; /* the step whose g is in g[] */
            t += step;
            ptrdiff_t off = t * stride + c0;
            const SR_T *a_old = a + old, *dh_t = dh + off, *h_t = h + off;
            SR_FOR(j, m, SR_W, !reverse, SR_STEP_BWD(j));
            sr_store(db + off, g, bytes, nt);
            sr_store(da + old, d, bytes, nt);
        }
        ptrdiff_t off = t * stride + c0;
        const SR_T *a_t = a + off, *h_0 = h0 + c0;
        SR_T *da_t = da + off, *dh0_t = dh0 + c0;
#if SR_COMPLEX
        for (ptrdiff_t j = 0; j < m; j += 2) {
            SR_T gr = g[j], gi = g[j + 1];
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

#undef SR_FWD
#undef SR_FOR
#undef SR_W
#undef SR_STEP_FWD
#undef SR_STEP_BWD
#undef SR_BWD
#undef SR_CAT
#undef SR_CAT_
#undef SR_T
#undef SR_COMPLEX
#undef SR_NAME
