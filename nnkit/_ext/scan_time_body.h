/* The scan of one real sequence contiguous in T (D = 1), vectorised along T, included by
 * scan_rows.h with SR_T (float or double), SR_I (the integer of the same size), SR_V (the
 * vector width in elements: 2, 4, 8 or 16) and ST_NAME (the suffix, e.g. f32_v16).
 *
 * With one feature, the row kernels walk a single dependency chain: one multiply-add per
 * step, each waiting for the last (about 4 ns a step, 41 ms at T = 10^7). Here each vector
 * of SR_V consecutive steps is first composed in registers, independently of the state:
 * after log2(SR_V) Hillis-Steele levels, lane i holds the affine map of steps 0..i of the
 * vector, h -> A_i h + H_i, with (A, H) o (A', H') = (A A', A H' + H) for the lanes s
 * apart. Only h = A * h_prev + H (one multiply-add and one lane broadcast per SR_V steps)
 * waits for the previous vector, so the loop runs at the speed of memory.
 *
 * The maps are products of up to SR_V consecutive coefficients: results equal the
 * sequential loop to rounding (a few ulps more), NaN still reaches every later step, but
 * an infinite coefficient can give NaN where the loop gives +-inf, and a product can
 * overflow where the loop's state stays finite (|a| > 1 over many steps with a tiny state).
 *
 * Written with GCC's vector extensions (__builtin_shuffle); scan_rows.h uses it only where
 * they exist. */

#ifndef ST_CUTS
#define ST_CUTS
/* Blocks of the walk end where the output is 64-byte aligned (t = phase + k SR_CHUNK), so
 * the streamed stores of two blocks never share a cache line: partly streamed lines cost
 * (fresh NumPy arrays start 16 bytes into a line; 1-feature backward at T = 10^7 float32,
 * streamed 29.5 ms with misaligned blocks). */
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
#endif

#define ST_CAT_(x, y) x##y
#define ST_CAT(x, y) ST_CAT_(x, y)
#define ST_VEC ST_CAT(st_vec_, ST_NAME)
#define ST_MASK ST_CAT(st_mask_, ST_NAME)
#define ST_BLOCK ST_CAT(st_block_, ST_NAME)
#define ST_FWD ST_CAT(st_fwd_, ST_NAME)
#define ST_BWD ST_CAT(st_bwd_, ST_NAME)

typedef SR_T ST_VEC __attribute__((vector_size(SR_V * sizeof(SR_T))));
typedef SR_I ST_MASK __attribute__((vector_size(SR_V * sizeof(SR_T))));

/* shuffle masks: lane i takes lane i - s (up: i + s) of the first operand, or lane i of the
 * second (the identity map) where that is outside the vector */
#define ST_UP(i, s) ((i) >= (s) ? (i) - (s) : SR_V + (i))
#define ST_DOWN(i, s) ((i) + (s) < SR_V ? (i) + (s) : SR_V + (i))
#if SR_V == 2
#define ST_LANES(F, s) {F(0, s), F(1, s)}
#elif SR_V == 4
#define ST_LANES(F, s) {F(0, s), F(1, s), F(2, s), F(3, s)}
#elif SR_V == 8
#define ST_LANES(F, s) {F(0, s), F(1, s), F(2, s), F(3, s), F(4, s), F(5, s), F(6, s), F(7, s)}
#else
#define ST_LANES(F, s)                                                                     \
    {F(0, s),  F(1, s),  F(2, s),  F(3, s),  F(4, s),  F(5, s),  F(6, s),  F(7, s),        \
     F(8, s),  F(9, s),  F(10, s), F(11, s), F(12, s), F(13, s), F(14, s), F(15, s)}
#endif

/* one Hillis-Steele level, lanes s apart (F: ST_UP for ascending time, ST_DOWN for
 * descending); levels with s >= SR_V are compiled away */
#define ST_LEVEL(F, s)                                                                     \
    if ((s) < SR_V) {                                                                      \
        const ST_MASK mask = ST_LANES(F, s);                                               \
        ST_VEC Hs = __builtin_shuffle(H, zero, mask), As = __builtin_shuffle(A, one, mask); \
        H = A * Hs + H;                                                                    \
        A = A * As;                                                                        \
    }
#define ST_COMPOSE(F) ST_LEVEL(F, 1) ST_LEVEL(F, 2) ST_LEVEL(F, 4) ST_LEVEL(F, 8)

/* out[j] = c[j] * state + x[j] for j in [0, m), the state the previous out (ascending j;
 * descending when ``down``, the state then the next out), starting from ``s``; returns the
 * last state */
SR_INLINE SR_T ST_BLOCK(const SR_T *c, const SR_T *x, SR_T s, SR_T *out, ptrdiff_t m,
                        int down)
{
    const ST_VEC one = (ST_VEC){0} + 1, zero = {0};
    ST_VEC A, H;
    ptrdiff_t j;
    if (!down) {
        for (j = 0; j + SR_V <= m; j += SR_V) {
            memcpy(&A, c + j, sizeof A);
            memcpy(&H, x + j, sizeof H);
            ST_COMPOSE(ST_UP)
            H = A * s + H;
            memcpy(out + j, &H, sizeof H);
            s = H[SR_V - 1];
        }
        for (; j < m; j++) out[j] = s = c[j] * s + x[j];
    } else {
        for (j = m - SR_V; j >= 0; j -= SR_V) {
            memcpy(&A, c + j, sizeof A);
            memcpy(&H, x + j, sizeof H);
            ST_COMPOSE(ST_DOWN)
            H = A * s + H;
            memcpy(out + j, &H, sizeof H);
            s = H[0];
        }
        for (j += SR_V - 1; j >= 0; j--) out[j] = s = c[j] * s + x[j];
    }
    return s;
}

/* the forward kernel of scan_rows_body.h for stride = n = 1 */
SR_INLINE void ST_FWD(const SR_T *a, const SR_T *b, const SR_T *h0, SR_T *h, ptrdiff_t T,
                      int reverse, int nt)
{
    SR_T buf[SR_CHUNK] SR_ALIGNED, s = *h0;
    ptrdiff_t phase = st_phase(h, sizeof(SR_T));
    if (!reverse) {
        for (ptrdiff_t t0 = 0, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            s = ST_BLOCK(a + t0, b + t0, s, buf, t1 - t0, 0);
            sr_store(h + t0, buf, (size_t)(t1 - t0) * sizeof(SR_T), nt);
        }
    } else {
        for (ptrdiff_t t1 = T, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            s = ST_BLOCK(a + t0, b + t0, s, buf, t1 - t0, 1);
            sr_store(h + t0, buf, (size_t)(t1 - t0) * sizeof(SR_T), nt);
        }
    }
    sr_fence(nt);
}

/* the backward kernel of scan_rows_body.h for stride = n = 1. Forward direction: g_{T-1} =
 * dh_{T-1}, then g_t = dh_t + a_{t+1} g_{t+1} down to t = 0 (a scan of the coefficients
 * a + 1), db = g, da_t = g_t h_{t-1} (h_{-1} = h0), dh0 = a_0 g_0; reverse mirrors it. */
SR_INLINE void ST_BWD(const SR_T *dh, const SR_T *a, const SR_T *h, const SR_T *h0,
                      SR_T *da, SR_T *db, SR_T *dh0, ptrdiff_t T, int reverse, int nt)
{
    SR_T g[SR_CHUNK] SR_ALIGNED, d[SR_CHUNK] SR_ALIGNED;
    if (T == 0) {
        *dh0 = 0;
        return;
    }
    ptrdiff_t first = reverse ? 0 : T - 1; /* where the walk starts: g = dh there */
    SR_T s = dh[first];
    db[first] = s;
    da[first] = s * (T == 1 ? *h0 : h[reverse ? 1 : T - 2]);
    ptrdiff_t phase = st_phase(db, sizeof(SR_T));
    if (!reverse) {
        for (ptrdiff_t t1 = T - 1, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            ptrdiff_t m = t1 - t0;
            s = ST_BLOCK(a + t0 + 1, dh + t0, s, g, m, 1);
            for (ptrdiff_t j = m - 1; j >= 1; j--) d[j] = g[j] * h[t0 + j - 1]; /* descending: one stream */
            d[0] = g[0] * (t0 == 0 ? *h0 : h[t0 - 1]);
            sr_store(db + t0, g, (size_t)m * sizeof(SR_T), nt);
            sr_store(da + t0, d, (size_t)m * sizeof(SR_T), nt);
        }
        *dh0 = a[0] * s;
    } else {
        for (ptrdiff_t t0 = 1, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            ptrdiff_t m = t1 - t0;
            s = ST_BLOCK(a + t0 - 1, dh + t0, s, g, m, 0);
            for (ptrdiff_t j = 0; j + 1 < m; j++) d[j] = g[j] * h[t0 + j + 1];
            d[m - 1] = g[m - 1] * (t1 == T ? *h0 : h[t1]);
            sr_store(db + t0, g, (size_t)m * sizeof(SR_T), nt);
            sr_store(da + t0, d, (size_t)m * sizeof(SR_T), nt);
        }
        *dh0 = a[T - 1] * s;
    }
    sr_fence(nt);
}

#undef ST_COMPOSE
#undef ST_LEVEL
#undef ST_LANES
#undef ST_DOWN
#undef ST_UP
#undef ST_BWD
#undef ST_FWD
#undef ST_BLOCK
#undef ST_MASK
#undef ST_VEC
#undef ST_CAT
#undef ST_CAT_
#undef ST_NAME
#undef SR_V
#undef SR_I
#undef SR_T
