/* Runs the C entry points of nnkit's kernel headers (gemm_packed.h, conv_window.h,
 * scan_rows.h) outside Python, for tests/test_aarch64.py: built with a cross compiler and run
 * under qemu-user, it checks the builds of other CPUs (aarch64) from an x86-64 machine, and
 * built natively it checks itself. It calls what the .pyx modules call, the way they call it:
 * the dispatch functions (gemm_select_*, gemm_variant, cw_forward_run / cw_backward_run,
 * scan_kernel) at the level they pick (nnkit_isa_level()) or at a given one, the batch of a
 * convolution split into runs on part_threads.h's workers, and the scan's row tasks as
 * nnkit/_ext/scan_cpu.py cuts them.
 *
 * stdin: int64 magic, int64 number of cases, then per case
 *     int64 op, type (0 f32, 1 f64, 2 c64, 3 c128), level (-1: the one the .pyx picks),
 *     shift (bytes from a 64-byte boundary to every array's first element),
 *     int64 number of parameters, the parameters (int64),
 *     int64 number of arrays, per array: int64 kind (0 float, 1 double), int64 count, data.
 * stdout: int64 magic, then per case int64 status (0 ok; < 0 an error, see below), int64
 * number of arrays, and every array after the call (kind, count, data; the probe's: one
 * int64 array, kind 2). The convolution's optional arrays (bias, wfp and dx, acc, db) are
 * passed as NULL when empty. Each array lies between two 64-byte guard zones; a write into
 * one is status -100 - the array's index. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_window.h"
#include "gemm_packed.h"
#include "scan_rows.h"

#define MAGIC 0x6e6e6b6974L /* "nnkit" */
#define GUARD 64
#define MAX_PARAMS 32
#define MAX_ARRAYS 12

enum { OP_PROBE, OP_GEMM, OP_STREAM, OP_CONV_FWD, OP_CONV_BWD, OP_SCAN_FWD, OP_SCAN_BWD };
enum { ST_NO_KERNEL = -50, ST_BAD_CASE = -60 };

typedef struct {
    const unsigned char *p, *end;
} reader;

typedef struct {
    int64_t kind, count;
    size_t bytes;
    unsigned char *base, *data;
} array;

static void die(const char *why)
{
    fprintf(stderr, "aarch64_harness: %s\n", why);
    exit(2);
}

static int64_t get(reader *r)
{
    int64_t v;
    if (r->end - r->p < 8) die("input truncated");
    memcpy(&v, r->p, 8);
    r->p += 8;
    return v;
}

static void put(const void *data, size_t bytes)
{
    if (bytes && fwrite(data, 1, bytes, stdout) != bytes) die("write failed");
}

static void put_i64(int64_t v) { put(&v, 8); }

static void read_array(reader *r, array *a, int64_t shift)
{
    a->kind = get(r);
    a->count = get(r);
    if (a->kind < 0 || a->kind > 1 || a->count < 0 || a->count > (1L << 32))
        die("bad array header");
    a->bytes = (size_t)a->count * (a->kind ? 8 : 4);
    if ((size_t)(r->end - r->p) < a->bytes) die("array truncated");
    size_t total = (2 * GUARD + (size_t)shift + a->bytes + 63) / 64 * 64;
    a->base = aligned_alloc(64, total);
    if (!a->base) die("out of memory");
    memset(a->base, 0xA5, total);
    a->data = a->base + GUARD + shift;
    if (a->count) memcpy(a->data, r->p, a->bytes);
    r->p += a->bytes;
}

/* whether the guard zones around the array are intact */
static int guards_intact(const array *a)
{
    const unsigned char *after = a->data + a->bytes;
    for (int i = 0; i < GUARD; i++)
        if (a->data[-1 - i] != 0xA5 || after[i] != 0xA5) return 0;
    return 1;
}

/* ---- the probe: what this build is, and what its dispatch tables hold ------------------ */

#define PROBE_LEVELS 5 /* -1 .. 3 */

static void probe(void)
{
    int64_t v[16 + 14 * PROBE_LEVELS];
    int n = 0, isa = nnkit_isa_level();
    const char *name = gemm_isa();
#if defined(__aarch64__)
    v[n++] = 1;
#elif defined(__x86_64__)
    v[n++] = 2;
#else
    v[n++] = 0;
#endif
    v[n++] = nnkit_cpu_level();
    v[n++] = isa;
    v[n++] = NNKIT_VECTORS;
    v[n++] = cw_available;
    v[n++] = SR_TIME;
    v[n++] = NNKIT_GEMM_NR_F32;
    v[n++] = NNKIT_GEMM_NR_F64;
    v[n++] = PART_THREADS_MAX;
    v[n++] = !strcmp(name, "baseline") ? 0 : !strcmp(name, "avx2") ? 1
           : !strcmp(name, "avx512") ? 2 : !strcmp(name, "plain") ? 3 : -1;
    v[n++] = (int64_t)sizeof(ptrdiff_t);
    v[n++] = (void *)gemm_select_f32() == gemm_variant(isa, 0);
    v[n++] = (void *)gemm_select_f64() == gemm_variant(isa, 1);
    v[n++] = gemm_select_ld(0) != NULL;
    v[n++] = gemm_select_ld(1) != NULL;
    long spin = part_threads_set_spin(50000);
    v[n++] = part_threads_set_spin(spin) == 50000 ? spin : -1;
    for (int level = -1; level < PROBE_LEVELS - 1; level++) {
        for (int f64 = 0; f64 < 2; f64++) v[n++] = gemm_variant(level, f64) != NULL;
        for (int k = 0; k < 4; k++)
#if NNKIT_VECTORS
            v[n++] = cw_kernel(level, k) != NULL;
#else
            v[n++] = 0;
#endif
        for (int k = 0; k < 8; k++) v[n++] = scan_kernel(level, k) != NULL;
    }
    put_i64(0);
    put_i64(1);
    put_i64(2);
    put_i64(n);
    put(v, (size_t)n * 8);
}

/* ---- gemm_packed.h ---------------------------------------------------------------------- */

/* params M, K, N, lda, acc, ld; arrays a, bp (packed), c. ld 0: the entry point of
 * nnkit_gemm_packed_<type> (c = a @ b, lda = K), ld 1: nnkit_gemm_packed_ld_<type> */
static int gemm_case(int64_t type, int64_t level, const int64_t *P, int np, array *A, int na)
{
    if (np != 6 || na != 3 || type > 1) return ST_BAD_CASE;
    ptrdiff_t M = P[0], K = P[1], N = P[2], lda = P[3], acc = P[4], ld = P[5];
    ptrdiff_t nr = type ? NNKIT_GEMM_NR_F64 : NNKIT_GEMM_NR_F32;
    if (A[0].count < (M ? (M - 1) * lda + K : 0) || A[1].count < (N + nr - 1) / nr * K * nr ||
        A[2].count < M * N || (!ld && (lda != K || acc)))
        return ST_BAD_CASE;
    void *fn;
    if (level < 0)
        fn = ld ? gemm_select_ld((int)type)
                : type ? (void *)gemm_select_f64() : (void *)gemm_select_f32();
    else if (!ld)
        fn = gemm_variant((int)level, (int)type);
    else
#if NNKIT_VECTORS
        fn = gemm_kernel((int)level, 2 + (int)type);
#else
        fn = level == 0 ? gemm_select_ld((int)type) : NULL;
#endif
    if (!fn) return ST_NO_KERNEL;
    typedef void (*ld_f32)(const float *, const float *, float *, ptrdiff_t, ptrdiff_t,
                           ptrdiff_t, ptrdiff_t, ptrdiff_t);
    typedef void (*ld_f64)(const double *, const double *, double *, ptrdiff_t, ptrdiff_t,
                           ptrdiff_t, ptrdiff_t, ptrdiff_t);
    if (ld && type)
        ((ld_f64)fn)((const double *)A[0].data, (const double *)A[1].data,
                     (double *)A[2].data, M, K, N, lda, acc);
    else if (ld)
        ((ld_f32)fn)((const float *)A[0].data, (const float *)A[1].data, (float *)A[2].data,
                     M, K, N, lda, acc);
    else if (type)
        ((nnkit_gemm_f64_fn)fn)((const double *)A[0].data, (const double *)A[1].data,
                                (double *)A[2].data, M, K, N);
    else
        ((nnkit_gemm_f32_fn)fn)((const float *)A[0].data, (const float *)A[1].data,
                                (float *)A[2].data, M, K, N);
    return 0;
}

/* params rows, cols, lds, ldd; arrays src, dst: stream_rows_<type>, then stream_fence */
static int stream_case(int64_t type, const int64_t *P, int np, array *A, int na)
{
    if (np != 4 || na != 2 || type > 1) return ST_BAD_CASE;
    ptrdiff_t rows = P[0], cols = P[1], lds = P[2], ldd = P[3];
    if (rows && (A[0].count < (rows - 1) * lds + cols || A[1].count < (rows - 1) * ldd + cols))
        return ST_BAD_CASE;
    if (type)
        stream_rows_f64((const double *)A[0].data, lds, (double *)A[1].data, ldd, rows, cols);
    else
        stream_rows_f32((const float *)A[0].data, lds, (float *)A[1].data, ldd, rows, cols);
    stream_fence();
    return 0;
}

/* ---- conv_window.h ---------------------------------------------------------------------- */

/* params: the geometry (C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw), N, threads.
 * forward: arrays x, wp, bias (count 0: none), y. backward: x, dy, wfp, dx, acc, db (count
 * 0: none; db double): acc holds ``threads`` accumulators, as conv_window.pyx sizes it. */
static int conv_case(int64_t op, int64_t type, int64_t level, const int64_t *P, int np,
                     array *A, int na)
{
    if (np != 16 || type > 1 || na != (op == OP_CONV_FWD ? 4 : 6)) return ST_BAD_CASE;
    cw_geom g = {P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], P[10], P[11],
                 P[12], P[13]};
    ptrdiff_t N = P[14], threads = P[15], f64 = type;
    ptrdiff_t parts = threads < N ? threads : N;
    parts = parts > 1 ? parts : 1;
    int which = level < 0 ? nnkit_isa_level() : (int)level;
#if NNKIT_VECTORS
    if (!cw_kernel(which, (op == OP_CONV_FWD ? 0 : 2) + (int)f64)) return ST_NO_KERNEL;
#endif
    ptrdiff_t R = g.C * g.kh * g.kw, nr = f64 ? 16 : 32;
    ptrdiff_t acc_size = (R + 7) / 8 * 8 * ((g.K + nr - 1) / nr * nr);
    if (A[0].count != N * g.C * g.H * g.W) return ST_BAD_CASE;
    if (op == OP_CONV_FWD) {
        if (A[1].count != (g.K + 7) / 8 * 8 * R || (A[2].count && A[2].count != g.K) ||
            A[3].count != N * g.K * g.Ho * g.Wo)
            return ST_BAD_CASE;
        return cw_forward_run(which, (int)f64, A[0].data, A[1].data,
                              A[2].count ? A[2].data : NULL, A[3].data, &g, N, parts);
    }
    if (A[1].count != N * g.K * g.Ho * g.Wo ||
        (A[3].count && (A[3].count != N * g.C * g.H * g.W || g.sh != 1 || g.sw != 1 ||
                        A[2].count != (g.C + 7) / 8 * 8 * g.K * g.kh * g.kw)) ||
        (A[4].count && A[4].count != threads * acc_size) ||
        (A[5].count && (A[5].count != threads * g.K || A[5].kind != 1)))
        return ST_BAD_CASE;
    return cw_backward_run(which, (int)f64, A[0].data, A[1].data,
                           A[3].count ? A[2].data : NULL, A[3].count ? A[3].data : NULL,
                           A[4].count ? A[4].data : NULL, acc_size * (f64 ? 8 : 4),
                           A[5].count ? (double *)A[5].data : NULL, &g, N, parts);
}

/* ---- scan_rows.h ------------------------------------------------------------------------ */

/* params B, T, D, block, reverse, nt; forward: arrays a, b, h0, h; backward: dh, a, h, h0,
 * da, db, dh0 ((B, T, D) and (B, D), complex as (re, im) pairs). The tasks of scan_cpu's
 * _scan_rows: one batch row and ``block`` features each, pointers at (i, 0, d0). */
static int scan_case(int64_t op, int64_t type, int64_t level, const int64_t *P, int np,
                     array *A, int na)
{
    int bwd = op == OP_SCAN_BWD;
    if (np != 6 || type < 0 || type > 3 || na != (bwd ? 7 : 4)) return ST_BAD_CASE;
    ptrdiff_t B = P[0], T = P[1], D = P[2], block = P[3];
    int reverse = (int)P[4], nt = (int)P[5];
    ptrdiff_t k = type >= 2 ? 2 : 1, size = type == 0 || type == 2 ? 4 : 8;
    if (B < 1 || T < 1 || D < 1 || block < 1) return ST_BAD_CASE;
    for (int i = 0; i < na; i++) {
        int small = bwd ? i == 3 || i == 6 : i == 2; /* h0, dh0: (B, D) */
        if (A[i].count != (small ? B * D * k : B * T * D * k) || A[i].kind != (size == 8))
            return ST_BAD_CASE;
    }
    void *fn = scan_kernel(level < 0 ? nnkit_isa_level() : (int)level, 2 * (int)type + bwd);
    if (!fn) return ST_NO_KERNEL;
    ptrdiff_t nblk = (D + block - 1) / block;
    for (ptrdiff_t task = 0; task < B * nblk; task++) {
        ptrdiff_t i = task / nblk, d0 = task % nblk * block;
        ptrdiff_t n = (D < d0 + block ? D : d0 + block) - d0;
        size_t row = (size_t)((i * T * D + d0) * k * size), one = (size_t)((i * D + d0) * k * size);
        if (bwd)
            ((nnkit_scan_bwd_fn)fn)(A[0].data + row, A[1].data + row, A[2].data + row,
                                    A[3].data + one, A[4].data + row, A[5].data + row,
                                    A[6].data + one, T, k * D, k * n, reverse, nt);
        else
            ((nnkit_scan_fwd_fn)fn)(A[0].data + row, A[1].data + row, A[2].data + one,
                                    A[3].data + row, T, k * D, k * n, reverse, nt);
    }
    return 0;
}

/* ---- the cases -------------------------------------------------------------------------- */

static void run_case(reader *r)
{
    int64_t op = get(r), type = get(r), level = get(r), shift = get(r), np = get(r);
    int64_t P[MAX_PARAMS];
    array A[MAX_ARRAYS];
    if (np < 0 || np > MAX_PARAMS || shift < 0 || shift > 4096) die("bad case header");
    for (int i = 0; i < np; i++) P[i] = get(r);
    int64_t na = get(r);
    if (na < 0 || na > MAX_ARRAYS) die("bad case header");
    for (int i = 0; i < na; i++) read_array(r, &A[i], shift);
    int64_t status;
    switch (op) {
    case OP_PROBE:
        probe();
        return;
    case OP_GEMM:
        status = gemm_case(type, level, P, (int)np, A, (int)na);
        break;
    case OP_STREAM:
        status = stream_case(type, P, (int)np, A, (int)na);
        break;
    case OP_CONV_FWD:
    case OP_CONV_BWD:
        status = conv_case(op, type, level, P, (int)np, A, (int)na);
        break;
    case OP_SCAN_FWD:
    case OP_SCAN_BWD:
        status = scan_case(op, type, level, P, (int)np, A, (int)na);
        break;
    default:
        die("unknown op");
    }
    for (int i = 0; i < na && !status; i++)
        if (!guards_intact(&A[i])) status = -100 - i;
    put_i64(status);
    put_i64(na);
    for (int i = 0; i < na; i++) {
        put_i64(A[i].kind);
        put_i64(A[i].count);
        put(A[i].data, A[i].bytes);
        free(A[i].base);
    }
}

int main(void)
{
    size_t cap = 1 << 20, len = 0, got;
    unsigned char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, stdin)) > 0)
        if ((len += got) == cap) buf = realloc(buf, cap *= 2);
    if (!buf) die("out of memory");
    reader r = {buf, buf + len};
    if (get(&r) != MAGIC) die("bad magic");
    int64_t cases = get(&r);
    put_i64(MAGIC);
    for (int64_t c = 0; c < cases; c++) run_case(&r);
    if (r.p != r.end) die("trailing input");
    free(buf);
    return fflush(stdout) ? 2 : 0;
}
