/* The scan of one sequence contiguous in T (D = 1), vectorised along T: a part of
 * scan_rows_body.h, included by it for the same type and instruction set (it leaves
 * NNKIT_TYPE and NNKIT_ISA defined). A vector is one register of the set, NNKIT_VREG: ST_V
 * scalars (2, 4, 8 or 16), ST_K scalars an element (1 real, 2 complex as (re, im) pairs).
 *
 * With one feature, the row kernels walk a single dependency chain: one multiply-add per
 * step, each waiting for the latency of the last. Here each vector of ST_V / ST_K
 * consecutive steps is first composed in registers, independently of the state: after
 * log2(ST_V / ST_K) Hillis-Steele levels, lane i holds the affine map of steps 0..i of the
 * vector, h -> A_i h + H_i, with (A, H) o (A', H') = (A A', A H' + H) for the lanes s apart
 * (complex products of (re, im) pairs: two lane shuffles and a sign). Only h = A * h_prev +
 * H (one multiply-add and one lane broadcast per vector) waits for the previous vector, so
 * the loop runs at the speed of memory.
 *
 * The maps are products of up to ST_V consecutive coefficients: results equal the
 * sequential loop to rounding (a few ulps more), NaN still reaches every later step, but
 * an infinite coefficient can give NaN where the loop gives +-inf, and a product can
 * overflow where the loop's state stays finite (|a| > 1 over many steps with a tiny state).
 *
 * Written with GCC's vector extensions (__builtin_shuffle); scan_rows.h uses it only where
 * they exist. */

/* scalars per element (1 real, 2 complex) and per vector register */
#define ST_K (NNKIT_COMPLEX + 1)
#define ST_V (NNKIT_VBYTES / NNKIT_BYTES)

/* lane lists: F(i) for the ST_V scalar lanes i */
#if ST_V == 2
#define ST_LANES(F, s) {F(0, s), F(1, s)}
#elif ST_V == 4
#define ST_LANES(F, s) {F(0, s), F(1, s), F(2, s), F(3, s)}
#elif ST_V == 8
#define ST_LANES(F, s) {F(0, s), F(1, s), F(2, s), F(3, s), F(4, s), F(5, s), F(6, s), F(7, s)}
#else
#define ST_LANES(F, s)                                                                     \
    {F(0, s),  F(1, s),  F(2, s),  F(3, s),  F(4, s),  F(5, s),  F(6, s),  F(7, s),        \
     F(8, s),  F(9, s),  F(10, s), F(11, s), F(12, s), F(13, s), F(14, s), F(15, s)}
#endif
/* shuffle masks: lane i takes the lane s elements below (up: above) from the first operand,
 * or lane i of the second (the identity map) where that is outside the vector */
#define ST_UP(i, s) ((i) >= ST_K * (s) ? (i) - ST_K * (s) : ST_V + (i))
#define ST_DOWN(i, s) ((i) + ST_K * (s) < ST_V ? (i) + ST_K * (s) : ST_V + (i))
#define ST_LAST(i, s) (ST_V - ST_K + (i) % ST_K) /* broadcast the last element */
#define ST_FIRST(i, s) ((i) % ST_K)              /* broadcast the first element */
#define ST_ONE(i, s) ((i) % ST_K == 0)           /* 1 (complex 1 + 0i) */
#define ST_RE(i, s) ((i) - (i) % ST_K)           /* complex: (re, re), (im, im), swapped, */
#define ST_IM(i, s) ((i) - (i) % ST_K + 1)       /* and the signs of re * re - im * im */
#define ST_SWAP(i, s) ((i) ^ 1)
#define ST_SIGN(i, s) ((i) % 2 ? 1 : -1)
#define ST_CONJ_SIGN(i, s) ((i) % 2 ? -1 : 1)

#if ST_K == 1
#define ST_MUL(x, y) ((x) * (y))
#else
#define ST_MUL(x, y)                                                                       \
    (__builtin_shuffle(x, re) * (y) +                                                      \
     __builtin_shuffle(x, im) * __builtin_shuffle(y, swap) * sign)
#endif

/* one Hillis-Steele level, s elements apart (F: ST_UP for ascending time, ST_DOWN for
 * descending); levels of s >= the vector's elements are compiled away */
#define ST_LEVEL(F, s)                                                                     \
    if ((s) < ST_V / ST_K) {                                                               \
        const NNKIT_VMASK mask = ST_LANES(F, s);                                           \
        NNKIT_VREG Hs = __builtin_shuffle(H, zero, mask),                                  \
                   As = __builtin_shuffle(A, one, mask);                                   \
        H = ST_MUL(A, Hs) + H;                                                             \
        A = ST_MUL(A, As);                                                                 \
    }
#define ST_COMPOSE(F) ST_LEVEL(F, 1) ST_LEVEL(F, 2) ST_LEVEL(F, 4) ST_LEVEL(F, 8)

/* e = c s + x for one element (c conjugated when ``conj``) */
static NNKIT_INLINE void NNKIT_NAME(st_elem)(const NNKIT_T *c, const NNKIT_T *s,
                                             const NNKIT_T *x, NNKIT_T *e, int conj)
{
#if ST_K == 1
    (void)conj;
    e[0] = c[0] * s[0] + x[0];
#else
    NNKIT_T cr = c[0], ci = conj ? -c[1] : c[1], sr = s[0], si = s[1];
    e[0] = cr * sr - ci * si + x[0];
    e[1] = cr * si + ci * sr + x[1];
#endif
}

/* the walk's next element past the vectors: out = c s + x, and s becomes it */
static NNKIT_INLINE void NNKIT_NAME(st_tail)(const NNKIT_T *c, NNKIT_T *s, const NNKIT_T *x,
                                             NNKIT_T *out, int conj)
{
    NNKIT_NAME(st_elem)(c, s, x, out, conj);
    memcpy(s, out, ST_K * sizeof(NNKIT_T));
}

/* e = g conj(h) for one element */
static NNKIT_INLINE void NNKIT_NAME(st_mulconj)(const NNKIT_T *g, const NNKIT_T *h, NNKIT_T *e)
{
#if ST_K == 1
    e[0] = g[0] * h[0];
#else
    NNKIT_T gr = g[0], gi = g[1], hr = h[0], hi = h[1];
    e[0] = gr * hr + gi * hi;
    e[1] = gi * hr - gr * hi;
#endif
}

/* out_j = c_j * state + x_j for the elements j in [0, m), the state the previous out
 * (ascending j; descending when ``down``, the state then the next out), c conjugated when
 * ``conj``; *state holds the incoming state in every element of a vector, and the last
 * state comes back the same way (by pointer: vectors by value change the ABI) */
static NNKIT_INLINE void NNKIT_NAME(st_block)(const NNKIT_T *c, const NNKIT_T *x,
                                              NNKIT_VREG *state, NNKIT_T *out, ptrdiff_t m,
                                              int down, int conj)
{
    const NNKIT_VREG one = ST_LANES(ST_ONE, 0), zero = {0};
    const NNKIT_VMASK last = ST_LANES(ST_LAST, 0), first = ST_LANES(ST_FIRST, 0);
#if ST_K == 2
    const NNKIT_VMASK re = ST_LANES(ST_RE, 0), im = ST_LANES(ST_IM, 0),
                      swap = ST_LANES(ST_SWAP, 0);
    const NNKIT_VREG sign = ST_LANES(ST_SIGN, 0), conj_sign = ST_LANES(ST_CONJ_SIGN, 0);
#endif
    NNKIT_VREG A, H, S = *state;
    NNKIT_T s[ST_K];
    ptrdiff_t n = m * ST_K, j;
/* the vector of steps at j: composed (F: ST_UP or ST_DOWN), applied to the state S, stored;
 * S becomes its state at the walk's end of it (the lanes EDGE: last or first) */
#if ST_K == 2
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
        for (j = 0; j + ST_V <= n; j += ST_V) {
            ST_VECTOR(ST_UP, last)
        }
        memcpy(s, &S, sizeof s);
        for (; j < n; j += ST_K) NNKIT_NAME(st_tail)(c + j, s, x + j, out + j, conj);
    } else {
        for (j = n - ST_V; j >= 0; j -= ST_V) {
            ST_VECTOR(ST_DOWN, first)
        }
        memcpy(s, &S, sizeof s);
        for (j += ST_V - ST_K; j >= 0; j -= ST_K)
            NNKIT_NAME(st_tail)(c + j, s, x + j, out + j, conj);
    }
#undef ST_VECTOR
#undef ST_CONJUGATE
    memcpy(&S, s, sizeof s);
    *state = __builtin_shuffle(S, first);
}

/* the forward kernel of scan_rows_body.h for one feature (stride = n = ST_K scalars) */
static NNKIT_INLINE void NNKIT_NAME(st_fwd)(const NNKIT_T *a, const NNKIT_T *b,
                                            const NNKIT_T *h0, NNKIT_T *h, ptrdiff_t T,
                                            int reverse, int nt)
{
    const NNKIT_VMASK first = ST_LANES(ST_FIRST, 0);
    NNKIT_T buf[SR_CHUNK * ST_K] NNKIT_ALIGNED(64);
    NNKIT_VREG S = {0};
    memcpy(&S, h0, ST_K * sizeof(NNKIT_T));
    S = __builtin_shuffle(S, first);
    ptrdiff_t phase = st_phase(h, ST_K * sizeof(NNKIT_T));
    if (!reverse) {
        for (ptrdiff_t t0 = 0, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            NNKIT_NAME(st_block)(a + t0 * ST_K, b + t0 * ST_K, &S, buf, t1 - t0, 0, 0);
            sr_store(h + t0 * ST_K, buf, (size_t)((t1 - t0) * ST_K) * sizeof(NNKIT_T), nt);
        }
    } else {
        for (ptrdiff_t t1 = T, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            NNKIT_NAME(st_block)(a + t0 * ST_K, b + t0 * ST_K, &S, buf, t1 - t0, 1, 0);
            sr_store(h + t0 * ST_K, buf, (size_t)((t1 - t0) * ST_K) * sizeof(NNKIT_T), nt);
        }
    }
    sr_fence(nt);
}

/* the backward kernel of scan_rows_body.h for one feature. Forward direction: g_{T-1} =
 * dh_{T-1}, then g_t = dh_t + conj(a_{t+1}) g_{t+1} down to t = 0 (a scan of the
 * coefficients a + 1, conjugated), db = g, da_t = g_t conj(h_{t-1}) (h_{-1} = h0), dh0 =
 * conj(a_0) g_0; reverse mirrors it. Pointers and offsets count scalars (K per element). */
static NNKIT_INLINE void NNKIT_NAME(st_bwd)(const NNKIT_T *dh, const NNKIT_T *a,
                                            const NNKIT_T *h, const NNKIT_T *h0, NNKIT_T *da,
                                            NNKIT_T *db, NNKIT_T *dh0, ptrdiff_t T,
                                            int reverse, int nt)
{
    const ptrdiff_t K = ST_K;
    NNKIT_T g[SR_CHUNK * ST_K] NNKIT_ALIGNED(64), d[SR_CHUNK * ST_K] NNKIT_ALIGNED(64),
            s[ST_K];
    if (T == 0) {
        memset(dh0, 0, sizeof s);
        return;
    }
    ptrdiff_t start = reverse ? 0 : T - 1; /* where the walk starts: g = dh there */
    memcpy(db + start * K, dh + start * K, sizeof s);
    NNKIT_NAME(st_mulconj)(dh + start * K, T == 1 ? h0 : h + (reverse ? 1 : T - 2) * K,
                           da + start * K);
    NNKIT_VREG S = {0};
    memcpy(&S, dh + start * K, sizeof s);
    S = __builtin_shuffle(S, (NNKIT_VMASK)ST_LANES(ST_FIRST, 0));
    ptrdiff_t phase = st_phase(db, sizeof s);
    if (!reverse) {
        for (ptrdiff_t t1 = T - 1, t0; t1 > 0; t1 = t0) {
            t0 = st_cut_below(t1, phase);
            ptrdiff_t m = t1 - t0;
            NNKIT_NAME(st_block)(a + (t0 + 1) * K, dh + t0 * K, &S, g, m, 1, 1);
            for (ptrdiff_t j = m - 1; j >= 1; j--) /* descending: one stream */
                NNKIT_NAME(st_mulconj)(g + j * K, h + (t0 + j - 1) * K, d + j * K);
            NNKIT_NAME(st_mulconj)(g, t0 == 0 ? h0 : h + (t0 - 1) * K, d);
            sr_store(db + t0 * K, g, (size_t)(m * K) * sizeof(NNKIT_T), nt);
            sr_store(da + t0 * K, d, (size_t)(m * K) * sizeof(NNKIT_T), nt);
        }
    } else {
        for (ptrdiff_t t0 = 1, t1; t0 < T; t0 = t1) {
            t1 = st_cut_above(t0, phase) < T ? st_cut_above(t0, phase) : T;
            ptrdiff_t m = t1 - t0;
            NNKIT_NAME(st_block)(a + (t0 - 1) * K, dh + t0 * K, &S, g, m, 0, 1);
            for (ptrdiff_t j = 0; j + 1 < m; j++)
                NNKIT_NAME(st_mulconj)(g + j * K, h + (t0 + j + 1) * K, d + j * K);
            NNKIT_NAME(st_mulconj)(g + (m - 1) * K, t1 == T ? h0 : h + t1 * K,
                                   d + (m - 1) * K);
            sr_store(db + t0 * K, g, (size_t)(m * K) * sizeof(NNKIT_T), nt);
            sr_store(da + t0 * K, d, (size_t)(m * K) * sizeof(NNKIT_T), nt);
        }
    }
    memcpy(s, &S, sizeof s); /* g at the walk's end */
    NNKIT_NAME(st_mulconj)(s, a + (reverse ? T - 1 : 0) * K, dh0);
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
#undef ST_V
#undef ST_K
