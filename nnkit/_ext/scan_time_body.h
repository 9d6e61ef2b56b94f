/* The scan of one sequence contiguous in T (D = 1), vectorised along T, included by
 * scan_rows.h with SR_T (float or double), SR_K (scalars per element: 1 real, 2 complex as
 * (re, im) pairs), SR_I (the integer of SR_T's size), SR_V (the vector width in scalars:
 * 2, 4, 8 or 16) and ST_NAME (the suffix, e.g. f32_v16).
 *
 * With one feature, the row kernels walk a single dependency chain: one multiply-add per
 * step, each waiting for the last (about 4 ns a step). Here each vector
 * of SR_V / SR_K consecutive steps is first composed in registers, independently of the state:
 * after log2(SR_V / SR_K) Hillis-Steele levels, lane i holds the affine map of steps 0..i of the
 * vector, h -> A_i h + H_i, with (A, H) o (A', H') = (A A', A H' + H) for the lanes s
 * apart (complex products of (re, im) pairs: two lane shuffles and a sign). Only h = A * h_prev + H (one multiply-add and one lane broadcast per vector)
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
 * (fresh NumPy arrays start 16 bytes into a line; misaligned blocks made the 1-feature
 * backward about 3x slower: benchmarks/RESULTS.md, "Linear recurrences"). */
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
#define ST_ELEM ST_CAT(st_elem_, ST_NAME)
#define ST_TAIL ST_CAT(st_tail_, ST_NAME)
#define ST_MULCONJ ST_CAT(st_mulconj_, ST_NAME)
#define ST_BLOCK ST_CAT(st_block_, ST_NAME)
#define ST_FWD ST_CAT(st_fwd_, ST_NAME)
#define ST_BWD ST_CAT(st_bwd_, ST_NAME)

typedef SR_T ST_VEC __attribute__((vector_size(SR_V * sizeof(SR_T))));
typedef SR_I ST_MASK __attribute__((vector_size(SR_V * sizeof(SR_T))));

/* lane lists: F(i) for the SR_V scalar lanes i */
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
/* shuffle masks: lane i takes the lane s elements below (up: above) from the first operand,
 * or lane i of the second (the identity map) where that is outside the vector */
#define ST_UP(i, s) ((i) >= SR_K * (s) ? (i) - SR_K * (s) : SR_V + (i))
#define ST_DOWN(i, s) ((i) + SR_K * (s) < SR_V ? (i) + SR_K * (s) : SR_V + (i))
#define ST_LAST(i, s) (SR_V - SR_K + (i) % SR_K) /* broadcast the last element */
#define ST_FIRST(i, s) ((i) % SR_K)              /* broadcast the first element */
#define ST_ONE(i, s) ((i) % SR_K == 0)           /* 1 (complex 1 + 0i) */
#define ST_RE(i, s) ((i) - (i) % SR_K)           /* complex: (re, re), (im, im), swapped, */
#define ST_IM(i, s) ((i) - (i) % SR_K + 1)       /* and the signs of re * re - im * im */
#define ST_SWAP(i, s) ((i) ^ 1)
#define ST_SIGN(i, s) ((i) % 2 ? 1 : -1)
#define ST_CONJ_SIGN(i, s) ((i) % 2 ? -1 : 1)

#if SR_K == 1
#define ST_MUL(x, y) ((x) * (y))
#else
#define ST_MUL(x, y)                                                                       \
    (__builtin_shuffle(x, re) * (y) + __builtin_shuffle(x, im) * __builtin_shuffle(y, swap) * sign)
#endif

/* one Hillis-Steele level, s elements apart (F: ST_UP for ascending time, ST_DOWN for
 * descending); levels of s >= the vector's elements are compiled away */
#define ST_LEVEL(F, s)                                                                     \
    if ((s) < SR_V / SR_K) {                                                               \
        const ST_MASK mask = ST_LANES(F, s);                                               \
        ST_VEC Hs = __builtin_shuffle(H, zero, mask), As = __builtin_shuffle(A, one, mask); \
        H = ST_MUL(A, Hs) + H;                                                             \
        A = ST_MUL(A, As);                                                                 \
    }
#define ST_COMPOSE(F) ST_LEVEL(F, 1) ST_LEVEL(F, 2) ST_LEVEL(F, 4) ST_LEVEL(F, 8)

/* e = c s + x for one element (c conjugated when ``conj``) */
SR_INLINE void ST_ELEM(const SR_T *c, const SR_T *s, const SR_T *x, SR_T *e, int conj)
{
#if SR_K == 1
    (void)conj;
    e[0] = c[0] * s[0] + x[0];
#else
    SR_T cr = c[0], ci = conj ? -c[1] : c[1], sr = s[0], si = s[1];
    e[0] = cr * sr - ci * si + x[0];
    e[1] = cr * si + ci * sr + x[1];
#endif
}

/* the walk's next element past the vectors: out = c s + x, and s becomes it */
SR_INLINE void ST_TAIL(const SR_T *c, SR_T *s, const SR_T *x, SR_T *out, int conj)
{
    ST_ELEM(c, s, x, out, conj);
    memcpy(s, out, SR_K * sizeof(SR_T));
}

/* e = g conj(h) for one element */
SR_INLINE void ST_MULCONJ(const SR_T *g, const SR_T *h, SR_T *e)
{
#if SR_K == 1
    e[0] = g[0] * h[0];
#else
    SR_T gr = g[0], gi = g[1], hr = h[0], hi = h[1];
    e[0] = gr * hr + gi * hi;
    e[1] = gi * hr - gr * hi;
#endif
}

/* out_j = c_j * state + x_j for the elements j in [0, m), the state the previous out
 * (ascending j; descending when ``down``, the state then the next out), c conjugated when
 * ``conj``; *state holds the incoming state in every element of a vector, and the last
 * state comes back the same way (by pointer: vectors by value change the ABI) */
SR_INLINE void ST_BLOCK(const SR_T *c, const SR_T *x, ST_VEC *state, SR_T *out, ptrdiff_t m,
                        int down, int conj)
{
    const ST_VEC one = ST_LANES(ST_ONE, 0), zero = {0};
    const ST_MASK last = ST_LANES(ST_LAST, 0), first = ST_LANES(ST_FIRST, 0);
#if SR_K == 2
    const ST_MASK re = ST_LANES(ST_RE, 0), im = ST_LANES(ST_IM, 0), swap = ST_LANES(ST_SWAP, 0);
    const ST_VEC sign = ST_LANES(ST_SIGN, 0), conj_sign = ST_LANES(ST_CONJ_SIGN, 0);
#endif
    ST_VEC A, H, S = *state;
    SR_T s[SR_K];
    ptrdiff_t n = m * SR_K, j;
/* the vector of steps at j: composed (F: ST_UP or ST_DOWN), applied to the state S, stored;
 * S becomes its state at the walk's end of it (the lanes EDGE: last or first) */
#if SR_K == 2
#define ST_CONJUGATE if (conj) A *= conj_sign;
#else
#define ST_CONJUGATE
#endif
#define ST_VECTOR(F, EDGE)                                                                 \
    memcpy(&A, c + j, sizeof A);                                                           \
    memcpy(&H, x + j, sizeof H);                                                           \
    ST_CONJUGATE                                                                           \
    ST_COMPOSE(F)                                                                          \
    H = ST_MUL(A, S) + H;                                                                  \
    memcpy(out + j, &H, sizeof H);                                                         \
    S = __builtin_shuffle(H, EDGE);
    if (!down) {
        for (j = 0; j + SR_V <= n; j += SR_V) {
            ST_VECTOR(ST_UP, last)
        }
        memcpy(s, &S, sizeof s);
        for (; j < n; j += SR_K) ST_TAIL(c + j, s, x + j, out + j, conj);
    } else {
        for (j = n - SR_V; j >= 0; j -= SR_V) {
            ST_VECTOR(ST_DOWN, first)
        }
        memcpy(s, &S, sizeof s);
        for (j += SR_V - SR_K; j >= 0; j -= SR_K) ST_TAIL(c + j, s, x + j, out + j, conj);
    }
#undef ST_VECTOR
#undef ST_CONJUGATE
    memcpy(&S, s, sizeof s);
    *state = __builtin_shuffle(S, first);
}

/* the forward kernel of scan_rows_body.h for one feature (stride = n = SR_K scalars) */
SR_INLINE void ST_FWD(const SR_T *a, const SR_T *b, const SR_T *h0, SR_T *h, ptrdiff_t T,
                      int reverse, int nt)
{
    const ST_MASK first = ST_LANES(ST_FIRST, 0);
    SR_T buf[SR_CHUNK * SR_K] SR_ALIGNED;
    ST_VEC S = {0};
    memcpy(&S, h0, SR_K * sizeof(SR_T));
    S = __builtin_shuffle(S, first);
    ptrdiff_t phase = st_phase(h, SR_K * sizeof(SR_T));
    if (!reverse) {
        for (ptrdiff_t t0 = 0, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            ST_BLOCK(a + t0 * SR_K, b + t0 * SR_K, &S, buf, t1 - t0, 0, 0);
            sr_store(h + t0 * SR_K, buf, (size_t)((t1 - t0) * SR_K) * sizeof(SR_T), nt);
        }
    } else {
        for (ptrdiff_t t1 = T, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            ST_BLOCK(a + t0 * SR_K, b + t0 * SR_K, &S, buf, t1 - t0, 1, 0);
            sr_store(h + t0 * SR_K, buf, (size_t)((t1 - t0) * SR_K) * sizeof(SR_T), nt);
        }
    }
    sr_fence(nt);
}

/* the backward kernel of scan_rows_body.h for one feature. Forward direction: g_{T-1} =
 * dh_{T-1}, then g_t = dh_t + conj(a_{t+1}) g_{t+1} down to t = 0 (a scan of the
 * coefficients a + 1, conjugated), db = g, da_t = g_t conj(h_{t-1}) (h_{-1} = h0), dh0 =
 * conj(a_0) g_0; reverse mirrors it. Pointers and offsets count scalars (K per element). */
SR_INLINE void ST_BWD(const SR_T *dh, const SR_T *a, const SR_T *h, const SR_T *h0,
                      SR_T *da, SR_T *db, SR_T *dh0, ptrdiff_t T, int reverse, int nt)
{
    const ptrdiff_t K = SR_K;
    SR_T g[SR_CHUNK * SR_K] SR_ALIGNED, d[SR_CHUNK * SR_K] SR_ALIGNED, s[SR_K];
    if (T == 0) {
        memset(dh0, 0, sizeof s);
        return;
    }
    ptrdiff_t start = reverse ? 0 : T - 1; /* where the walk starts: g = dh there */
    memcpy(db + start * K, dh + start * K, sizeof s);
    ST_MULCONJ(dh + start * K, T == 1 ? h0 : h + (reverse ? 1 : T - 2) * K, da + start * K);
    ST_VEC S = {0};
    memcpy(&S, dh + start * K, sizeof s);
    S = __builtin_shuffle(S, (ST_MASK)ST_LANES(ST_FIRST, 0));
    ptrdiff_t phase = st_phase(db, sizeof s);
    if (!reverse) {
        for (ptrdiff_t t1 = T - 1, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            ptrdiff_t m = t1 - t0;
            ST_BLOCK(a + (t0 + 1) * K, dh + t0 * K, &S, g, m, 1, 1);
            for (ptrdiff_t j = m - 1; j >= 1; j--) /* descending: one stream */
                ST_MULCONJ(g + j * K, h + (t0 + j - 1) * K, d + j * K);
            ST_MULCONJ(g, t0 == 0 ? h0 : h + (t0 - 1) * K, d);
            sr_store(db + t0 * K, g, (size_t)(m * K) * sizeof(SR_T), nt);
            sr_store(da + t0 * K, d, (size_t)(m * K) * sizeof(SR_T), nt);
        }
    } else {
        for (ptrdiff_t t0 = 1, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            ptrdiff_t m = t1 - t0;
            ST_BLOCK(a + (t0 - 1) * K, dh + t0 * K, &S, g, m, 0, 1);
            for (ptrdiff_t j = 0; j + 1 < m; j++)
                ST_MULCONJ(g + j * K, h + (t0 + j + 1) * K, d + j * K);
            ST_MULCONJ(g + (m - 1) * K, t1 == T ? h0 : h + t1 * K, d + (m - 1) * K);
            sr_store(db + t0 * K, g, (size_t)(m * K) * sizeof(SR_T), nt);
            sr_store(da + t0 * K, d, (size_t)(m * K) * sizeof(SR_T), nt);
        }
    }
    memcpy(s, &S, sizeof s); /* g at the walk's end */
    ST_MULCONJ(s, a + (reverse ? T - 1 : 0) * K, dh0);
    sr_fence(nt);
}

#undef ST_COMPOSE
#undef ST_LEVEL
#undef ST_MUL
#undef ST_CONJ_SIGN
#undef ST_SIGN
#undef ST_SWAP
#undef ST_IM
#undef ST_RE
#undef ST_ONE
#undef ST_FIRST
#undef ST_LAST
#undef ST_DOWN
#undef ST_UP
#undef ST_LANES
#undef ST_BWD
#undef ST_FWD
#undef ST_BLOCK
#undef ST_MULCONJ
#undef ST_TAIL
#undef ST_ELEM
#undef ST_MASK
#undef ST_VEC
#undef ST_CAT
#undef ST_CAT_
#undef ST_NAME
#undef SR_V
#undef SR_I
#undef SR_K
#undef SR_T
