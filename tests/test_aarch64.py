"""nnkit's C kernels (gemm_packed.h, conv_window.h, scan_rows.h) on aarch64 (Graviton, Apple
silicon), checked from an x86-64 machine: tests/aarch64_harness.c is cross-compiled with
Debian's aarch64 GCC (and Clang, Apple's compiler, when installed) and run under qemu-user.
There only the baseline build exists (isa_targets.h), with 16-byte NEON vectors.

The harness calls every entry point the .pyx modules use, through the same dispatch
functions, for f32, f64 (and c64, c128: the scan), on edge and tile-crossing shapes, the
convolution's batch on 1-4 part_threads.h runs; the outputs are held to the formulas in
float64 (anchored to nnkit.kernels.reference by a test below) within a rounding bound. The
same harness built natively (the CPU's build and the baseline) tells a harness bug from an
aarch64 one, and built for aarch64 without fused multiply-adds it must give the x86-64
baseline's outputs bit for bit. Skipped without the tools: apt-get install
gcc-aarch64-linux-gnu qemu-user (and clang for the Clang build).
"""

import functools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nnkit.kernels.reference import conv as RC
from nnkit.kernels.reference import scan as RS

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tests" / "aarch64_harness.c"
INCLUDE = ROOT / "nnkit" / "_ext"
SYSROOT = "/usr/aarch64-linux-gnu"
INSTALL = "apt-get install gcc-aarch64-linux-gnu qemu-user"

# Plain flags, and those of setup.py's build: Python's CFLAGS (-g and the warning flags
# aside), -fPIC, setup.py's -O3 and _GNU_SOURCE, which Python.h defines before the Cython
# module includes the headers (it turns on part_threads.h's CPU affinity); the compiler's
# default C standard.
PLAIN_FLAGS = ["-O3", "-std=gnu11", "-pthread"]
SETUP_FLAGS = ["-DNDEBUG", "-fwrapv", "-O3", "-Wall", "-fPIC", "-D_GNU_SOURCE", "-pthread"]
QEMU = ["qemu-aarch64", "-L", SYSROOT]
# build: (compiler command, flags, runner, ISA levels the cases run at: -1 is the .pyx's)
BUILDS = {
    "native": (["gcc"], PLAIN_FLAGS, [], (-1, 0)),
    "aarch64-gcc": (["aarch64-linux-gnu-gcc"], PLAIN_FLAGS, QEMU, (-1,)),
    "aarch64-gcc-setup": (["aarch64-linux-gnu-gcc"], SETUP_FLAGS, QEMU, (-1,)),
    "aarch64-clang": (["clang", "--target=aarch64-linux-gnu"], PLAIN_FLAGS, QEMU, (-1,)),
    # no multiply-adds fused: the same operations, in the same order, as x86-64's baseline
    "aarch64-gcc-nofma": (["aarch64-linux-gnu-gcc"], [*PLAIN_FLAGS, "-ffp-contract=off"], QEMU,
                          (-1,)),
}

MAGIC = 0x6E6E6B6974
OP_PROBE, OP_GEMM, OP_STREAM, OP_CONV_FWD, OP_CONV_BWD, OP_SCAN_FWD, OP_SCAN_BWD = range(7)
TYPE = {np.float32: 0, np.float64: 1, np.complex64: 2, np.complex128: 3}
NR = {np.float32: 32, np.float64: 16}  # panel widths: GEMM b, conv's weight gradient


def _missing(build):
    """Why ``build`` cannot be made here (None: it can)."""
    compiler, _, runner, _ = BUILDS[build]
    if not runner:
        return None if shutil.which(compiler[0]) else "no native gcc"
    if not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")
            and os.path.isdir(SYSROOT)):
        return f"needs the aarch64 cross compiler and qemu-user: {INSTALL}"
    if not shutil.which(compiler[0]):
        return f"needs {compiler[0]} (apt-get install {compiler[0]})"
    return None


# ---- the wire format of aarch64_harness.c ----------------------------------------------------

class Case:
    """One call: op, dtype, ISA level, byte shift of the arrays, int parameters, arrays (in
    order; complex as (re, im) pairs), and ``check(outs)`` -> the error messages (the arrays
    after the call, as flat float arrays)."""

    def __init__(self, name, op, dtype, params, arrays, check, shift=0):
        self.name, self.op, self.dtype, self.params = name, op, dtype, params
        self.arrays, self.check, self.shift = arrays, check, shift

    def encode(self, level):
        parts = [np.array([self.op, TYPE.get(self.dtype, 0), level, self.shift,
                           len(self.params), *self.params, len(self.arrays)], np.int64)]
        for a in self.arrays:
            flat = np.ascontiguousarray(a).reshape(-1)
            if flat.dtype.kind == "c":
                flat = flat.view(flat.real.dtype)
            parts += [np.array([flat.itemsize == 8, flat.size], np.int64), flat]
        return b"".join(p.tobytes() for p in parts)


def _run(build, exe, cases, level):
    """The harness's outputs per case: (status, [arrays])."""
    data = b"".join([np.array([MAGIC, len(cases)], np.int64).tobytes(),
                     *(case.encode(level) for case in cases)])
    env = {k: v for k, v in os.environ.items() if k != "NNKIT_ISA"}  # the CPU's own level
    proc = subprocess.run([*BUILDS[build][2], str(exe)], input=data, capture_output=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"{build}: harness exit {proc.returncode}: {proc.stderr!r}"
    out, pos = proc.stdout, 8
    assert np.frombuffer(out, np.int64, 1)[0] == MAGIC, f"{build}: bad output"
    results = []
    for _ in cases:
        status, count = np.frombuffer(out, np.int64, 2, pos)
        pos += 16
        arrays = []
        for _ in range(count):
            kind, n = np.frombuffer(out, np.int64, 2, pos)
            dtype = (np.float32, np.float64, np.int64)[kind]
            arrays.append(np.frombuffer(out, dtype, n, pos + 16))
            pos += 16 + n * np.dtype(dtype).itemsize
        results.append((int(status), arrays))
    assert pos == len(out), f"{build}: {len(out) - pos} trailing bytes"
    return results


# ---- checking -----------------------------------------------------------------------------

def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _within(name, got, want, bound):
    """Messages unless |got - want| <= bound elementwise (NaN fails), shapes as want's."""
    got = np.asarray(got).reshape(np.shape(want))
    err = np.abs(got.astype(want.dtype) - want)
    bound = np.broadcast_to(bound, err.shape)
    bad = ~(err <= bound)
    if not bad.any():
        return []
    ratio = np.nan_to_num(err / np.maximum(bound, 1e-300), nan=np.inf)
    i = np.unravel_index(np.argmax(np.where(bad, ratio, 0)), bad.shape)
    return [f"{name}: {bad.sum()} of {bad.size} off, the worst at {tuple(int(v) for v in i)}: "
            f"got {got[i].item()!r}, want {want[i].item()!r} (bound {bound[i]:.3g})"]


def _same(name, got, want):
    """Messages unless got equals want bit for bit (an input left as it was, a copy)."""
    got = np.asarray(got).reshape(-1)
    want = np.ascontiguousarray(want).reshape(-1).view(got.dtype)
    bits = np.dtype(f"u{got.itemsize}")
    if got.size != want.size:
        return [f"{name}: {got.size} elements, want {want.size}"]
    differ = got.view(bits) != want.view(bits)
    if not differ.any():
        return []
    i = int(np.argmax(differ))
    return [f"{name}: not the expected bits, the first at flat index {i} "
            f"(got {got[i].item()!r}, want {want[i].item()!r})"]


def _as(out, dtype, shape):
    """A flat harness output as ``dtype`` (complex from (re, im) pairs) of ``shape``."""
    return out.view(dtype).reshape(shape) if np.dtype(dtype).kind == "c" else out.reshape(shape)


# ---- gemm_packed.h ------------------------------------------------------------------------

def _pack_panels(b, nr):
    """b (K, N) -> (ceil(N / nr), K, nr), zeros past N (gemm_packed_body.h's layout)."""
    K, N = b.shape
    panels = np.zeros((-(-N // nr), K, nr), b.dtype)
    for p in range(panels.shape[0]):
        panels[p, :, :min(nr, N - p * nr)] = b[:, p * nr:(p + 1) * nr]
    return panels


def _gemm_case(rng, dtype, M, K, N, mode, shift):
    """c = a @ b (mode "gemm"), through the strided entry (a's rows lda > K apart, the
    padding NaN: never read) with c overwritten ("ld") or added to ("ld+acc")."""
    lda = K if mode == "gemm" else K + 3
    acc = mode == "ld+acc"
    a = np.full((M, lda), np.nan, dtype)
    a[:, :K] = rng.standard_normal((M, K))
    b = rng.standard_normal((K, N)).astype(dtype)
    c0 = rng.standard_normal((M, N)).astype(dtype) if acc else np.full((M, N), np.nan, dtype)

    def check(outs):
        a64, b64 = a[:, :K].astype(np.float64), b.astype(np.float64)
        base = c0.astype(np.float64) if acc else 0.0
        want = a64 @ b64 + base
        bound = (K + 2) * _eps(dtype) * (np.abs(a64) @ np.abs(b64) + np.abs(base))
        return (_within("c", outs[2], want, bound) + _same("a", outs[0], a)
                + _same("bp", outs[1], bp))

    bp = _pack_panels(b, NR[dtype])
    return Case(f"gemm {mode} {np.dtype(dtype).name} M={M} K={K} N={N}", OP_GEMM, dtype,
                [M, K, N, lda, int(acc), int(mode != "gemm")], [a, bp, c0], check, shift)


# M: 0, 1, tails of the 2/4/6/8-row tiles; K: 0, 1, long k loops (past the prefetch distance);
# N: 0, 1, around the 16-, 32-column panels and their 8/16-column halves
GEMM_SHAPES = [(0, 5, 7), (3, 0, 5), (2, 3, 0), (1, 1, 1), (1, 1, 33), (5, 1, 33), (2, 3, 16),
               (2, 3, 17), (7, 13, 31), (6, 70, 45), (8, 17, 100), (13, 384, 70),
               (32, 128, 64), (3, 600, 45), (9, 40, 8)]


def _gemm_cases(rng):
    return [_gemm_case(rng, dtype, M, K, N, mode, (0, 16, 4, 48)[i % 4])
            for dtype in (np.float32, np.float64)
            for i, (M, K, N) in enumerate(GEMM_SHAPES)
            for mode in ("gemm", "ld", "ld+acc")]


def _stream_cases(rng):
    """stream_rows_<type>: dst's block = src's, rows lds, ldd apart; the rest of dst kept."""
    cases = []
    for dtype in (np.float32, np.float64):
        for i, (rows, cols, lds, ldd) in enumerate([(1, 1, 1, 1), (3, 7, 9, 8), (4, 33, 40, 35),
                                                    (2, 0, 3, 3), (5, 64, 64, 67)]):
            src = rng.standard_normal(max(0, (rows - 1) * lds + cols)).astype(dtype)
            dst = rng.standard_normal(max(0, (rows - 1) * ldd + cols)).astype(dtype)

            def check(outs, src=src, dst=dst, rows=rows, cols=cols, lds=lds, ldd=ldd):
                want = dst.copy()
                for r in range(rows):
                    want[r * ldd:r * ldd + cols] = src[r * lds:r * lds + cols]
                return _same("dst", outs[1], want) + _same("src", outs[0], src)

            cases.append(Case(f"stream {np.dtype(dtype).name} {rows}x{cols} lds={lds} "
                              f"ldd={ldd}", OP_STREAM, dtype, [rows, cols, lds, ldd],
                              [src, dst], check, (0, 4, 16, 8, 0)[i]))
    return cases


# ---- conv_window.h ------------------------------------------------------------------------

def _cols(x, g):
    """cols (N, C kh kw, Ho Wo) of x (N, C, H, W), float64: the zero-padded windows."""
    C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = g
    N = x.shape[0]
    xp = np.zeros((N, C, max(pt + H, (Ho - 1) * sh + (kh - 1) * dh + 1),
                   max(pl + W, (Wo - 1) * sw + (kw - 1) * dw + 1)))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    cols = np.empty((N, C, kh, kw, Ho, Wo))
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh:i * dh + (Ho - 1) * sh + 1:sh,
                                  j * dw:j * dw + (Wo - 1) * sw + 1:sw]
    return cols.reshape(N, C * kh * kw, Ho * Wo), xp.shape


def _conv(x, w, b, g):
    """y (N, K, Ho, Wo) = the cross-correlation, float64."""
    cols, _ = _cols(x, g)
    y = np.einsum("kr,nrp->nkp", w.reshape(w.shape[0], -1), cols)
    y = y + (0.0 if b is None else b[:, None])
    return y.reshape(x.shape[0], w.shape[0], g[10], g[11])


def _conv_grads(x, w, dy, g):
    """(dx, dW^T (R, K) per image (N, R, K), db per image (N, K)) of ``_conv``, float64."""
    C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = g
    N = x.shape[0]
    cols, padded = _cols(x, g)
    dy = dy.reshape(N, K, Ho * Wo)
    dwt = np.einsum("nrp,nkp->nrk", cols, dy)
    dcols = np.einsum("kr,nkp->nrp", w.reshape(K, -1), dy).reshape(N, C, kh, kw, Ho, Wo)
    dxp = np.zeros(padded)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh:i * dh + (Ho - 1) * sh + 1:sh,
                j * dw:j * dw + (Wo - 1) * sw + 1:sw] += dcols[:, :, i, j]
    return dxp[:, :, pt:pt + H, pl:pl + W], dwt, dy.sum(axis=2)


def _pack_rows8(w2):
    """w2 (M, R) -> (ceil(M / 8), R, 8), zeros past M (conv_window.h's packed weight)."""
    M, R = w2.shape
    packed = np.zeros((-(-M // 8) * 8, R), w2.dtype)
    packed[:M] = w2
    return np.ascontiguousarray(packed.reshape(-1, 8, R).transpose(0, 2, 1))


def _geometry(C, H, W, K, k, pads, dilation=(1, 1), stride=(1, 1)):
    """The 14-tuple of conv_window.pyx; pads (top, bottom, left, right), each <= (k - 1) d."""
    (kh, kw), (pt, pb, pl, pr), (dh, dw), (sh, sw) = k, pads, dilation, stride
    assert max(pt, pb) <= (kh - 1) * dh and max(pl, pr) <= (kw - 1) * dw
    Ho = (H + pt + pb - (kh - 1) * dh - 1) // sh + 1
    Wo = (W + pl + pr - (kw - 1) * dw - 1) // sw + 1
    assert Ho >= 1 and Wo >= 1
    return (C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw)


# (N, threads, bias, geometry): 1x1 everything; 8-row tails and 2 accumulator panels (K 37,
# 40); 5x5 taps 3 apart; strides through the phase planes; tiles and CW_QB pixel blocks of
# the larger ones; fewer images than threads (runs left idle), more threads than cores
CONV_CASES = [
    (1, 1, True, _geometry(1, 1, 1, 1, (1, 1), (0, 0, 0, 0))),
    (2, 2, True, _geometry(3, 5, 6, 1, (3, 3), (1, 1, 1, 1))),
    (2, 2, True, _geometry(2, 4, 5, 40, (3, 3), (1, 1, 1, 1))),
    (2, 1, True, _geometry(1, 3, 7, 37, (2, 5), (0, 1, 4, 0))),
    (3, 2, False, _geometry(2, 6, 3, 19, (3, 3), (0, 2, 2, 1))),
    (2, 2, True, _geometry(20, 2, 2, 5, (5, 5), (12, 0, 0, 12), (3, 3))),
    (2, 2, True, _geometry(3, 11, 12, 9, (3, 3), (1, 0, 1, 1), stride=(2, 2))),
    (3, 3, True, _geometry(2, 12, 12, 33, (5, 4), (8, 3, 0, 3), (2, 1), (3, 2))),
    (5, 3, True, _geometry(8, 20, 20, 40, (3, 3), (1, 1, 1, 1))),
    (3, 4, False, _geometry(16, 14, 14, 24, (3, 3), (2, 2, 2, 2), (2, 2))),
    (1, 2, True, _geometry(4, 9, 13, 12, (3, 2), (2, 0, 1, 1))),
]


def _conv_cases(rng):
    cases = []
    for dtype in (np.float32, np.float64):
        eps = _eps(dtype)
        for i, (N, threads, with_bias, g) in enumerate(CONV_CASES):
            C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = g
            R, shift = C * kh * kw, (0, 16, 8, 48)[i % 4]
            x = rng.standard_normal((N, C, H, W)).astype(dtype)
            w = rng.standard_normal((K, C, kh, kw)).astype(dtype)
            b = rng.standard_normal(K).astype(dtype) if with_bias else np.zeros(0, dtype)
            dy = rng.standard_normal((N, K, Ho, Wo)).astype(dtype)
            name = f"{np.dtype(dtype).name} N={N} threads={threads} geometry={g}"
            y0 = np.full((N, K, Ho, Wo), np.nan, dtype)

            def check_fwd(outs, x=x, w=w, b=b, g=g, dtype=dtype):
                bias = b.astype(np.float64) if b.size else None
                want = _conv(x.astype(np.float64), w.astype(np.float64), bias, g)
                bound = _conv(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                              None if bias is None else np.abs(bias), g)
                return _within("y", outs[3], want, (g[0] * g[4] * g[5] + 2) * _eps(dtype)
                               * bound)

            cases.append(Case(f"conv forward {name}", OP_CONV_FWD, dtype,
                              [*g, N, threads], [x, _pack_rows8(w.reshape(K, R)), b, y0],
                              check_fwd, shift))
            # the backward: every output, then dW alone, then dx alone (stride 1)
            for wants in ("all", "dw", "dx"):
                if wants == "dx" and (sh, sw) != (1, 1):
                    continue
                has_dx = wants in ("all", "dx") and (sh, sw) == (1, 1)
                has_acc, has_db = wants in ("all", "dw"), wants == "all"
                flipped = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
                wfp = _pack_rows8(flipped.reshape(C, -1)) if has_dx else np.zeros(0, dtype)
                dx0 = np.full(x.shape, np.nan, dtype) if has_dx else np.zeros(0, dtype)
                shape = (threads, -(-R // 8) * 8, -(-K // NR[dtype]) * NR[dtype])
                acc0 = (rng.standard_normal(shape).astype(dtype) if has_acc
                        else np.zeros(0, dtype))
                db0 = rng.standard_normal((threads, K)) if has_db else np.zeros(0)

                def check_bwd(outs, x=x, w=w, dy=dy, g=g, N=N, threads=threads, acc0=acc0,
                              db0=db0, has_dx=has_dx, eps=eps):
                    C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = g
                    R, parts = C * kh * kw, max(1, min(threads, N))
                    x64, w64, dy64 = (v.astype(np.float64) for v in (x, w, dy))
                    dx, dwt, db = _conv_grads(x64, w64, dy64, g)
                    bdx, bdwt, bdb = _conv_grads(np.abs(x64), np.abs(w64), np.abs(dy64), g)
                    errors = _same("x", outs[0], x) + _same("dy", outs[1], dy)
                    if has_dx:
                        errors += _within("dx", outs[3], dx, (K * kh * kw + 2) * eps * bdx)
                    acc, dbs = (_as(outs[4], acc0.dtype, acc0.shape),
                                _as(outs[5], np.float64, db0.shape))
                    for p in range(threads):  # part p: images [N p / parts, N (p+1) / parts)
                        lo, hi = N * p // parts, N * (p + 1) // parts
                        if p >= parts:
                            errors += _same(f"acc[{p}]", acc[p] if acc.size else acc,
                                            acc0[p] if acc0.size else acc0)
                            errors += _same(f"db[{p}]", dbs[p] if dbs.size else dbs,
                                            db0[p] if db0.size else db0)
                            continue
                        if acc0.size:
                            want = acc0[p, :R, :K] + dwt[lo:hi].sum(axis=0)
                            bound = ((hi - lo) * Ho * (Wo + (kw - 1) * dw // sw) + 2) * eps * (
                                np.abs(acc0[p, :R, :K]) + bdwt[lo:hi].sum(axis=0))
                            errors += _within(f"acc[{p}]", acc[p, :R, :K], want, bound)
                        if db0.size:
                            want = db0[p] + db[lo:hi].sum(axis=0)
                            bound = ((hi - lo) * Ho * Wo + 2) * _eps(np.float64) * (
                                np.abs(db0[p]) + bdb[lo:hi].sum(axis=0))
                            errors += _within(f"db[{p}]", dbs[p], want, bound)
                    return errors

                cases.append(Case(f"conv backward ({wants}) {name}", OP_CONV_BWD, dtype,
                                  [*g, N, threads], [x, dy, wfp, dx0, acc0, db0], check_bwd,
                                  shift))
    return cases


# ---- scan_rows.h --------------------------------------------------------------------------

def _order(T, reverse):
    return range(T - 1, -1, -1) if reverse else range(T)


def _scan(a, b, h0, reverse):
    """h_t = a_t h_{t-1} + b_t along T of (B, T, D) (reverse: h_{t+1}), vectorised over B, D."""
    h, state = np.empty_like(a), h0.copy()
    for t in _order(a.shape[1], reverse):
        state = a[:, t] * state + b[:, t]
        h[:, t] = state
    return h


def _scan_grads(dh, a, h, h0, reverse):
    """(da, db, dh0) of ``_scan`` (scan_rows.h's formulas, conjugate convention)."""
    T = a.shape[1]
    order = list(_order(T, reverse))
    da, db, g = np.empty_like(a), np.empty_like(a), np.zeros_like(h0)
    for k in range(T - 1, -1, -1):
        t = order[k]
        g = dh[:, t] + (np.conj(a[:, order[k + 1]]) * g if k + 1 < T else 0)
        db[:, t] = g
        da[:, t] = g * np.conj(h[:, order[k - 1]] if k else h0)
    return da, db, np.conj(a[:, order[0]]) * g


def _random(rng, dtype, shape, scale=1.0):
    if np.dtype(dtype).kind == "c":
        return (scale * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
                / np.sqrt(2)).astype(dtype)
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _coefficients(rng, dtype, shape):
    """|a| <= 0.95: the state stays bounded (real: signs mixed; complex: any phase)."""
    r = rng.uniform(-0.95, 0.95, shape)
    if np.dtype(dtype).kind == "c":
        r = np.abs(r) * np.exp(2j * np.pi * rng.uniform(0, 1, shape))
    return r.astype(dtype)


SCAN_FACTOR = 32  # roundings a step's error may reach, in ulps of the bound's magnitudes


def _scan_case(rng, dtype, B, T, D, block, reverse, nt, shift, backward):
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    eps = SCAN_FACTOR * _eps(np.finfo(dtype).dtype)
    a = _coefficients(rng, dtype, (B, T, D))
    h0 = _random(rng, dtype, (B, D))
    name = (f"scan {'backward' if backward else 'forward'} {np.dtype(dtype).name} B={B} T={T} "
            f"D={D} block={block} reverse={reverse} nt={nt} shift={shift}")
    params = [B, T, D, block, int(reverse), int(nt)]
    if not backward:
        b = _random(rng, dtype, (B, T, D))
        h = np.full((B, T, D), np.nan, dtype)

        def check(outs):
            a64, b64, h064 = (v.astype(wide) for v in (a, b, h0))
            want = _scan(a64, b64, h064, reverse)
            bound = _scan(np.abs(a64), np.abs(b64), np.abs(h064), reverse)
            return (_within("h", _as(outs[3], dtype, h.shape), want, eps * bound)
                    + _same("a", outs[0], a) + _same("h0", outs[2], h0))

        return Case(name, OP_SCAN_FWD, dtype, params, [a, b, h0, h], check, shift)
    dh = _random(rng, dtype, (B, T, D))
    hs = _random(rng, dtype, (B, T, D))
    nan = np.full((B, T, D), np.nan, dtype)

    def check_bwd(outs):
        dh64, a64, h64, h064 = (v.astype(wide) for v in (dh, a, hs, h0))
        da, db, dh0 = _scan_grads(dh64, a64, h64, h064, reverse)
        bda, bdb, bdh0 = _scan_grads(*(np.abs(v) for v in (dh64, a64, h64, h064)), reverse)
        return (_within("da", _as(outs[4], dtype, da.shape), da, eps * bda)
                + _within("db", _as(outs[5], dtype, db.shape), db, eps * bdb)
                + _within("dh0", _as(outs[6], dtype, dh0.shape), dh0, eps * bdh0)
                + _same("dh", outs[0], dh) + _same("h", outs[2], hs))

    return Case(name, OP_SCAN_BWD, dtype, params, [dh, a, hs, h0, nan, nan.copy(),
                                                   np.full((B, D), np.nan, dtype)],
                check_bwd, shift)


# One feature (the time kernels of scan_time_body.h): T from 1 past the vectors' lanes and
# the SR_CHUNK blocks (512 steps, cut where the output is 64-byte aligned: ``shift``). Rows:
# blocks of D (a last block of 1 feature stays a row kernel), features past SR_CHUNK scalars.
SCAN_TIME_T = [1, 2, 3, 5, 8, 9, 17, 100, 1100]
SCAN_ROWS = [(1, 1, 2, 2), (2, 5, 3, 3), (2, 7, 65, 64), (1, 3, 700, 700), (3, 9, 130, 64),
             (2, 4, 300, 300)]


def _scan_cases(rng):
    cases = []
    for dtype in (np.float32, np.float64, np.complex64, np.complex128):
        for backward in (False, True):
            for i, T in enumerate(SCAN_TIME_T):
                for reverse in (False, True):
                    shift = (0, 16, 4, 48, 8)[(i + reverse) % 5]
                    shift -= shift % np.finfo(dtype).dtype.itemsize
                    cases.append(_scan_case(rng, dtype, 1 + i % 2, T, 1, 1, reverse, i % 2,
                                            shift, backward))
            for i, (B, T, D, block) in enumerate(SCAN_ROWS):
                for reverse in (False, True):
                    cases.append(_scan_case(rng, dtype, B, T, D, block, reverse,
                                            (i + reverse) % 2, 16 * (i % 2), backward))
    return cases


# ---- the builds and their runs --------------------------------------------------------------

FAMILIES = ("gemm", "stream", "conv", "scan")
PROBE = Case("probe", OP_PROBE, np.float32, [], [], None)


@functools.cache
def _cases():
    """{family: [Case]}, the same inputs in every build."""
    rng = np.random.default_rng(20240)
    return {"gemm": _gemm_cases(rng), "stream": _stream_cases(rng), "conv": _conv_cases(rng),
            "scan": _scan_cases(rng)}


def _family(results, family):
    """(case, (status, arrays)) of ``family`` in a run's results (the probe first)."""
    cases = _cases()
    start = 1 + sum(len(cases[f]) for f in FAMILIES[:FAMILIES.index(family)])
    return zip(cases[family], results[start:start + len(cases[family])], strict=True)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every build that can be made here, compiled at once (the native one takes longest):
    {build: (compiler process, executable, command)}."""
    folder = tmp_path_factory.mktemp("aarch64")
    started = {}
    for build, (compiler, flags, _, _) in BUILDS.items():
        if _missing(build):
            continue
        exe = folder / build
        command = [*compiler, *flags, f"-I{INCLUDE}", str(HARNESS), "-o", str(exe), "-lm"]
        started[build] = (subprocess.Popen(command, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT), exe, command)
    yield started
    for process, _, _ in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def outputs(compiled):
    """outputs(build) -> {level: [(status, arrays) of PROBE, then of every family's cases in
    FAMILIES' order]}, run once."""
    done = {}

    def get(build):
        if build not in done:
            why = _missing(build)
            if why:
                pytest.skip(why)
            process, exe, command = compiled[build]
            log = process.communicate(timeout=300)[0].decode(errors="replace")
            assert process.returncode == 0, f"{' '.join(command)} failed:\n{log}"
            cases = [PROBE, *(case for family in FAMILIES for case in _cases()[family])]
            done[build] = {level: _run(build, exe, cases, level) for level in BUILDS[build][3]}
        return done[build]

    return get


# ---- the tests ----------------------------------------------------------------------------

@pytest.mark.parametrize("build", BUILDS)
def test_dispatch(build, outputs):
    """What the .pyx modules select: on aarch64 the baseline build, and only it (level 0 in
    every table; the levels above it, and -1, NULL), the vector kernels (not the plain
    fallbacks), panels of 32 / 16, the scan's time kernels with GCC only (SR_TIME); natively,
    the tables up to the CPU's level."""
    status, (probe,) = outputs(build)[-1][0]
    assert status == 0
    (arch, cpu, isa, vectors, cw, sr_time, nr32, nr64, pt_max, gemm_isa, ptr, select32,
     select64, ld32, ld64, spin), tables = probe[:16], probe[16:].reshape(5, 14)
    assert (vectors, cw, nr32, nr64, pt_max, ptr, spin) == (1, 1, 32, 16, 256, 8, 100000)
    assert select32 == select64 == ld32 == ld64 == 1
    assert sr_time == (0 if "clang" in build else 1)
    if build.startswith("aarch64"):
        assert (arch, cpu, isa, gemm_isa) == (1, 0, 0, 0)
    else:
        assert arch == 2 and 0 <= isa <= cpu <= 2 and gemm_isa == isa
    for level, row in zip(range(-1, 4), tables, strict=True):
        assert list(row) == [int(0 <= level <= cpu)] * 14, f"level {level}: {row}"


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_match_formulas(build, family, outputs):
    """Every case of the family (gemm_packed.h's products and row copies, conv_window.h's
    forward and backward, scan_rows.h's forward and backward) at the level the .pyx picks
    (and natively also the baseline): status 0, no write outside the arrays, the outputs
    within a rounding bound of the float64 formula, the inputs untouched."""
    failures = []
    for level, results in outputs(build).items():
        for case, (status, outs) in _family(results, family):
            errors = [f"status {status}"] if status else case.check(outs)
            failures += [f"[level {level}] {case.name}: {e}" for e in errors]
    assert not failures, f"{build}: {len(failures)} failures\n" + "\n".join(failures[:40])


def test_formulas_are_the_twins():
    """The float64 formulas above equal nnkit.kernels.reference's naive twins (conv2d with
    stride, dilation and asymmetric padding, and its gradients; the linear scan forward and
    backward, real and complex, both directions)."""
    rng = np.random.default_rng(7)
    for N, _, _, g in (CONV_CASES[3], CONV_CASES[7], CONV_CASES[9]):
        C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = g
        x, w = rng.standard_normal((N, C, H, W)), rng.standard_normal((K, C, kh, kw))
        b, dy = rng.standard_normal(K), rng.standard_normal((N, K, Ho, Wo))
        pb = max(0, (Ho - 1) * sh + (kh - 1) * dh + 1 - H - pt)
        pr = max(0, (Wo - 1) * sw + (kw - 1) * dw + 1 - W - pl)
        y, cache = RC.conv2d_forward(x, w, b, (sh, sw), (pt, pb, pl, pr), (dh, dw))
        np.testing.assert_allclose(_conv(x, w, b, g), y, rtol=1e-12, atol=1e-12)
        dx, dwt, db = _conv_grads(x, w, dy, g)
        rdx, rdw, rdb = RC.conv2d_backward(dy, cache)
        np.testing.assert_allclose(dx, rdx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dwt.sum(axis=0).T.reshape(w.shape), rdw, rtol=1e-12,
                                   atol=1e-12)
        np.testing.assert_allclose(db.sum(axis=0), rdb, rtol=1e-12, atol=1e-12)
    for dtype in (np.float64, np.complex128):
        for reverse in (False, True):
            a, b = _coefficients(rng, dtype, (2, 6, 3)), _random(rng, dtype, (2, 6, 3))
            h0, dh = _random(rng, dtype, (2, 3)), _random(rng, dtype, (2, 6, 3))
            h, cache = RS.linear_scan_forward(a, b, h0, reverse)
            np.testing.assert_allclose(_scan(a, b, h0, reverse), h, rtol=1e-12, atol=1e-12)
            for mine, twin in zip(_scan_grads(dh, a, h, h0, reverse),
                                  RS.linear_scan_backward(dh, cache), strict=True):
                np.testing.assert_allclose(mine, twin, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_aarch64_without_fma_is_the_x86_baseline(family, outputs):
    """Built with -ffp-contract=off, the aarch64 kernels do the x86-64 baseline's operations in
    its order (16-byte vectors both, no fused multiply-adds), so every output equals the
    native baseline's bit for bit: a difference is no rounding but a divergence of the
    aarch64 build (its own code paths, or a compiler's reading of the vector code)."""
    mine, native = outputs("aarch64-gcc-nofma")[-1], outputs("native")[0]
    differ = [case.name for (case, (s1, a1)), (_, (s2, a2))
              in zip(_family(mine, family), _family(native, family), strict=True)
              if (s1, [a.tobytes() for a in a1]) != (s2, [a.tobytes() for a in a2])]
    assert not differ, f"{len(differ)} cases differ:\n" + "\n".join(differ[:20])
