"""nnkit's scalar math for compiled kernels, in one place: exp, expm1, sigmoid, tanh, bit
casts, a NaN-propagating max and SplitMix64, as Numba CPU functions (callable from
``@njit`` code) and, for those the CUDA kernels need, CUDA device functions.

Why it exists. Numba compiles ``math.exp``/``math.tanh``/``np.exp`` on the CPU to scalar
libm calls (llvmlite has no SVML), so a loop that calls them runs one element at a time.
The functions here are branch-free arithmetic plus LLVM intrinsics (``bitcast``,
``llvm.ldexp``, ``llvm.maximum``), so every loop that calls them is a plain map or
reduction loop that LLVM vectorises (AVX-512 where the CPU has it). Each is a plain Python
function (the debugging path: it runs uncompiled under ``NUMBA_DISABLE_JIT=1``) compiled
with ``numba.njit(cache=True, ...)``.

CPU functions:

- ``f32_as_i32``, ``i32_as_f32``, ``f64_as_i64``, ``i64_as_f64``: reinterpret a value's bits
  (one LLVM ``bitcast``; integer sources of another width are truncated first).
- ``fmax(a, b)``: max propagating NaN (``llvm.maximum``; a compare-and-select max loop does
  not vectorise as a reduction).
- ``exp_approx(z)``: exp for float32 or float64 z (the dtype is kept), for the softmax and
  attention kernels: Cody-Waite range reduction ``z = n ln2 + r``, a polynomial for
  ``exp(r)`` on ``|r| <= ln2/2``, ``2**n`` by ``llvm.ldexp`` (one ``vscalef`` with AVX-512)
  or from exponent bits in two factors. Relative error against float64 ``exp``: float32
  <= 2 ulp (the Cephes ``expf`` minimax polynomial, degree 5 after ``1 + r``), float64 <= 2
  ulp (Taylor to degree 13). Full IEEE range: subnormal results, ``exp(-inf) = 0``,
  overflow gives ``inf``, NaN propagates. Compiled as a function of its own with
  ``fastmath={'contract'}`` (fused multiply-adds; no reassociation, so the reduction is
  evaluated as written, also when the caller is compiled with ``fastmath={'reassoc'}``).
- ``exp_normal32(z)``: ``exp_approx``'s float32 arithmetic for z in [-87, 88] (results
  normal): no clamps, 2**n one factor from exponent bits (GELU's Gaussian).
- ``mul_error(a, b, p)``: a * b - p exactly for p = fl(a * b): one ``llvm.fma`` where the
  CPU has FMA, Dekker's split otherwise (both paths tested against exact rationals).
- ``expm1_parts(x)`` (float64), ``expm1_parts32(x)`` (float32): ``(s, e)`` with
  ``exp(x) = s + e`` and ``expm1(x) = (s - 1) + e``, ``s = 2**k`` exact, for the gate
  nonlinearities: the same reduction with ``k = floor(x / ln2 + 1/2)``; float64: Taylor to
  degree 13, inputs clamped to [-708, 709] (no overflow, no subnormals), max error 1.01 ulp
  over [-700, 700]; float32: Taylor to degree 8, clamped to [-87, 88], max error 2 ulp over
  [-80, 80]. NaN propagates (every clamp keeps a NaN).
- ``fast_exp(x)`` (float64 ``s + e``; exp(+inf) is 8.2e307, the clamp), ``sigmoid(x)``
  (~2 ulp), ``tanh(x)`` (``-u / (u + 2)``, u = expm1(-2|x|); ~3 ulp), their float32 twins
  ``sigmoid32``/``tanh32`` (<= 2.5 ulp measured, tests/test_recurrent.py), and
  ``act_sigmoid``/``act_tanh``, which pick float32 or float64 math from the argument type.
  sigmoid and tanh reach their limits exactly (sigmoid(-inf) is 6e-39 in float32, the
  clamp's value, not 0). These are ``inline="always"``: Numba inlines them into the caller,
  so the caller's flags apply (the recurrent time loops: ``fastmath={'contract'}``,
  ``error_model='numpy'``, whose missing ZeroDivisionError branch keeps the loops vector).
- ``softplus(x)``: log(1 + exp(x)) in the precision of x, with torch's threshold (x when
  x > 20), for Mamba's step sizes: ``max(x, 0) + log1p(e)``, e = exp(-|x|) in (0, 1], and
  log1p(e) = 2 atanh(s) with s = e / (2 + e) in [0, 1/3] by its odd series (to s^31 in
  float64, s^13 in float32: truncation below 2e-17 and 2e-8 relative). Branch-free, so a
  loop over it vectorises; no log is called. NaN propagates.
- ``splitmix64(seed, n)``: SplitMix64's output number n + 1 for ``seed`` (Steele, Lea and
  Flood 2014), ``mix(seed + (n + 1) * SPLITMIX64_GAMMA)`` in wrapping uint64 arithmetic:
  one independent 64-bit hash per element, so draws need no generator state (dropout in
  the activation and attention kernels; ``splitmix64(state, 0)`` then ``state +=
  SPLITMIX64_GAMMA`` is the sequential generator of the Hopfield shuffles).
  ``uniform53(z)``: the top 53 bits of z as a float64 in [0, 1).

Why two exps. ``exp_approx`` and ``expm1_parts`` reduce and round differently (magic-number
rounding and Cephes' ln2 split vs floor and a finer split; different polynomials in float32;
full IEEE range vs clamps), so their last bits differ; each keeps the numbers its kernels
were validated and benchmarked with. They share the bit casts and the degree-13 Taylor
polynomial of the float64 versions.

CUDA device functions (``sigmoid_dev``, ``splitmix64_dev``, ``uniform53_dev``): made with
``numba.cuda.jit(device=True)`` from the plain Python functions here when a CUDA module
first asks for them, so importing this module on a CPU-only machine does not import
``numba.cuda``. ``sigmoid_dev`` is the overflow-free two-branch sigmoid on CUDA's
``math.exp``; exp and tanh on the device are CUDA's own ``math.exp``/``math.tanh`` (every
thread computes its own element: nothing to vectorise). SplitMix64 is the same function on
both targets, so a seed gives the same dropout mask on the CPU and on the GPU.

The plain-NumPy form of SplitMix64 (uint64 arrays, for the reference twins and the Python
side) is ``nnkit._random.splitmix64``; the C form of the Cython kernels is
``splitmix64.h``; the CuPy elementwise kernel's is
``nnkit._ext.elementwise_cuda._SPLITMIX_BODY``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import llvmlite.binding
import numba
import numpy as np
from llvmlite import ir
from numba import float64, types, uint64
from numba.extending import intrinsic, overload

__all__ = [
    "f32_as_i32",
    "i32_as_f32",
    "f64_as_i64",
    "i64_as_f64",
    "fmax",
    "mul_error",
    "exp_approx",
    "exp_normal32",
    "expm1_parts",
    "expm1_parts32",
    "fast_exp",
    "sigmoid",
    "tanh",
    "sigmoid32",
    "tanh32",
    "act_sigmoid",
    "act_tanh",
    "softplus",
    "SPLITMIX64_GAMMA",
    "splitmix64",
    "uniform53",
]  # and, made on first access (not in __all__: * would import numba.cuda), the _dev ones

# ---- bit casts: plain Python for the debugging path, an LLVM bitcast when compiled -----------


def _bitcast_intrinsic(src, dst, llvm_dst):
    """An intrinsic reinterpreting the bits of a ``src`` value as ``dst``. Integer sources
    of another width are truncated first (Numba widens int32 arithmetic to int64; LLVM
    narrows the arithmetic back before vectorising)."""

    @intrinsic
    def _cast(typingctx, v):
        if isinstance(src, types.Integer):
            if not isinstance(v, types.Integer):
                return None
        elif v != src:
            return None

        def codegen(context, builder, signature, args):
            value = args[0]
            if isinstance(src, types.Integer) and v.bitwidth != src.bitwidth:
                value = builder.trunc(value, ir.IntType(src.bitwidth))
            return builder.bitcast(value, llvm_dst)

        return dst(v), codegen

    return _cast


def _bit_cast(name, src, dst, llvm_dst):
    """The function ``name``(v): v's bits as a ``dst`` (NumPy's ``view`` uncompiled, the
    intrinsic above compiled)."""
    cast = _bitcast_intrinsic(src, dst, llvm_dst)
    src_np, dst_np = (np.dtype(t.name).type for t in (src, dst))

    def fn(v):
        return src_np(v).view(dst_np)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"The bits of v as {dst_np.__name__} (v converted to {src_np.__name__} first)."
    overload(fn)(lambda v: lambda v: cast(v))
    return fn


f32_as_i32 = _bit_cast("f32_as_i32", types.float32, types.int32, ir.IntType(32))
i32_as_f32 = _bit_cast("i32_as_f32", types.int32, types.float32, ir.FloatType())
f64_as_i64 = _bit_cast("f64_as_i64", types.float64, types.int64, ir.IntType(64))
i64_as_f64 = _bit_cast("i64_as_f64", types.int64, types.float64, ir.DoubleType())


def _ldexp(p, k):
    """p * 2**k: LLVM's ``llvm.ldexp`` when compiled (one ``vscalefps`` with AVX-512,
    exact, subnormal results and overflow included)."""
    return np.ldexp(p, int(k)).astype(type(p)) if isinstance(p, np.floating) else p * 2.0**k


@intrinsic
def _llvm_ldexp(typingctx, p, k):
    if not isinstance(p, types.Float) or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ll, i32 = args[0].type, ir.IntType(32)
        k = args[1] if k_bits == 32 else builder.trunc(args[1], i32)
        fnty = ir.FunctionType(ll, [ll, i32])
        fn = builder.module.declare_intrinsic("llvm.ldexp", [ll, i32], fnty)
        return builder.call(fn, [args[0], k])

    k_bits = k.bitwidth
    return p(p, k), codegen


@overload(_ldexp)
def _ov_ldexp(p, k):
    return lambda p, k: _llvm_ldexp(p, k)


# With AVX-512, 2**n is one vscalef (llvm.ldexp); elsewhere llvm.ldexp is a libm call, so
# 2**n is built from exponent bits instead (two factors, to reach the subnormal range).
_USE_LDEXP = "+avx512f" in llvmlite.binding.get_host_cpu_features().flatten()

# ---- max propagating NaN ---------------------------------------------------------------------


def fmax(a, b):
    """max(a, b) propagating NaN (LLVM's ``llvm.maximum``, which vectorises as a reduction;
    a compare-and-select max loop does not)."""
    if a != a or b != b:
        return a + b
    return a if a >= b else b


@intrinsic
def _llvm_maximum(typingctx, a, b):
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        ll = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maximum", [ll], ir.FunctionType(ll, [ll, ll]))
        return builder.call(fn, args)

    return a(a, b), codegen


@overload(fmax)
def _ov_fmax(a, b):
    return lambda a, b: _llvm_maximum(a, b)


# ---- the rounding error of a product ----------------------------------------------------------

_HAS_FMA = "+fma" in llvmlite.binding.get_host_cpu_features().flatten()


def mul_error(a, b, p):
    """a * b - p exactly, for p = a * b rounded (a and b of one float type, products not
    overflowing): one fused multiply-add where the CPU has FMA, Dekker's split otherwise."""
    if isinstance(a, np.float32):
        return np.float32(np.float64(a) * np.float64(b) - np.float64(p))
    return float(Fraction(a) * Fraction(b) - Fraction(p))


@intrinsic
def _llvm_fma(typingctx, a, b, c):
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ll = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ll], ir.FunctionType(ll, [ll] * 3))
        return builder.call(fn, args)

    return a(a, b, c), codegen


def _dekker_mul_error(a, b, p, split):
    """a * b - p with a and b split into halves whose products are exact (``split`` =
    2**ceil(digits / 2) + 1 of the type). Exact without FMA contraction; where the CPU has
    FMA, ``mul_error`` uses it instead."""
    ca, cb = split * a, split * b
    a_hi, b_hi = ca - (ca - a), cb - (cb - b)
    a_lo, b_lo = a - a_hi, b - b_hi
    return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


_dekker_jit = numba.njit(cache=True, inline="always")(_dekker_mul_error)


@overload(mul_error)
def _ov_mul_error(a, b, p):
    if not (isinstance(a, types.Float) and a == b == p):
        return None
    if _HAS_FMA:
        return lambda a, b, p: _llvm_fma(a, b, -p)
    split = np.float32(4097.0) if a == types.float32 else 134217729.0
    return lambda a, b, p: _dekker_jit(a, b, p, split)


# ---- the degree-13 Taylor polynomial of both float64 exps ------------------------------------


def _taylor13_tail(r):
    """sum_{k=2}^{13} r^(k-2) / k! by Horner, so exp(r) = 1 + r + r^2 * this; truncation
    below 1e-17 relative for |r| <= ln2/2. Inlined: the caller's fastmath flags apply."""
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    return p * r + 0.5


taylor13_tail = numba.njit(cache=True, inline="always")(_taylor13_tail)

# ---- exp_approx: full-range exp for the softmax and attention kernels ------------------------

_F32_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer
_F32_MAGIC_BITS = np.int32(0x4B400000)
_F64_MAGIC = 6755399441055744.0  # 1.5 * 2**52
_F64_MAGIC_BITS = np.int64(0x4338000000000000)


def _expf_reduced(z):
    """(p, t) for float32 z: exp(z) = p * 2**n, n = round(z / ln2) held in the bits of t
    (Cephes expf's reduction and polynomial)."""
    t = z * np.float32(1.4426950408889634) + _F32_MAGIC  # n = round(z / ln2), in t's bits
    n = t - _F32_MAGIC
    r = z - n * np.float32(0.693359375)  # ln2 split in two (Cody-Waite); n * hi is exact
    r = r - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return p * r * r + r + np.float32(1.0), t


expf_reduced = numba.njit(cache=True, inline="always")(_expf_reduced)


def _exp_f32(z):
    """exp(z) for float32 z: Cephes expf's reduction and polynomial, 2**n in two steps."""
    z = np.float32(-104.0) if z < np.float32(-104.0) else z  # exp(-104) rounds to 0
    z = np.float32(89.0) if z > np.float32(89.0) else z  # exp(89) overflows to inf
    p, t = expf_reduced(z)
    k = f32_as_i32(t) - _F32_MAGIC_BITS  # n as an integer (NaN gives garbage, p stays NaN)
    if _USE_LDEXP:
        return _ldexp(p, k)
    h = k >> 1  # 2**n = 2**h * 2**(n - h): both factors normal for n in [-150, 129]
    return p * i32_as_f32((h + 127) << 23) * i32_as_f32((k - h + 127) << 23)


def _exp_normal32(z):
    """exp(z) for float32 z in [-87, 88], whose exp is a normal number: ``exp_approx``'s
    arithmetic without its clamps, 2**n one factor from exponent bits."""
    p, t = expf_reduced(z)
    return p * i32_as_f32((f32_as_i32(t) - _F32_MAGIC_BITS + 127) << 23)


exp_normal32 = numba.njit(cache=True, inline="always")(_exp_normal32)


def _exp_f64(z):
    """exp(z) for float64 z: Cephes exp's ln2 split, Taylor to degree 13 on |r| <= ln2/2."""
    z = -746.0 if z < -746.0 else z
    z = 710.0 if z > 710.0 else z
    t = z * 1.4426950408889634 + _F64_MAGIC
    n = t - _F64_MAGIC
    r = z - n * 6.93145751953125e-1
    r = r - n * 1.42860682030941723212e-6
    p = taylor13_tail(r)
    p = p * r * r + r + 1.0
    k = f64_as_i64(t) - _F64_MAGIC_BITS
    if _USE_LDEXP:
        return _ldexp(p, k)
    h = k >> 1
    return p * i64_as_f64((h + 1023) << 52) * i64_as_f64((k - h + 1023) << 52)


def exp_approx(z):
    """Vectorisable exp for a float32 or float64 scalar (the dtype is kept)."""
    if isinstance(z, np.float32):
        return _exp_f32(z)
    return _exp_f64(np.float64(z))


# fastmath={'contract'} only: lets LLVM fuse a*b + c into one FMA (one rounding instead of
# two, and faster: benchmarks/RESULTS.md, "Figures moved from code comments"); no
# nnan/ninf/reassoc, so NaN and inf propagate and the Cody-Waite and magic-number steps are
# evaluated as written.
_exp_f32_jit = numba.njit(cache=True, fastmath={"contract"})(_exp_f32)
_exp_f64_jit = numba.njit(cache=True, fastmath={"contract"})(_exp_f64)


@overload(exp_approx)
def _ov_exp_approx(z):
    if z == types.float32:
        return lambda z: _exp_f32_jit(z)
    if z == types.float64:
        return lambda z: _exp_f64_jit(z)
    return None


# ---- expm1_parts: exp and expm1 as s + e, for sigmoid and tanh -------------------------------
# Several times faster than math.exp, whose libm calls had cost the LSTM cell more than
# its arithmetic (benchmarks/RESULTS.md, "Figures moved from docstrings" and "Figures moved
# from code comments").

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 split so that k * _LN2_HI is exact for |k| <= 1024
_LN2_LO = 1.9082149292705877e-10


def _expm1_parts(x):
    """(s, e) with exp(x) = s + e and expm1(x) = (s - 1) + e, s = 2^k exact, x float64."""
    x = x if not (x > 709.0) else 709.0
    x = x if not (x < -708.0) else -708.0
    k = math.floor(x * _LOG2E + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    q = 1.0 + r * taylor13_tail(r)  # exp(r) = 1 + r q
    s = i64_as_f64((np.int64(k) + 1023) << 52)
    return s, s * (r * q)


expm1_parts = numba.njit(cache=True, inline="always", error_model="numpy")(_expm1_parts)


def _fast_exp(x):
    s, e = expm1_parts(float(x))
    return s + e


def _fast_sigmoid(x):
    """1 / (1 + exp(-x)), float64; relative error ~2 ulp."""
    s, e = expm1_parts(-float(x))
    return 1.0 / (1.0 + (s + e))


def _fast_tanh(x):
    """tanh(x) = -u / (u + 2) with u = expm1(-2|x|), float64; relative error ~3 ulp."""
    a = float(x)
    s, e = expm1_parts(-2.0 * abs(a))
    u = (s - 1.0) + e  # in (-1, 0]
    t = abs(u) / (u + 2.0)
    return t if a >= 0 else -t


fast_exp = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_exp)
sigmoid = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_sigmoid)
tanh = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_tanh)

# float32 twins, for float32 arrays: twice the SIMD lanes. Same reduction, inputs clamped to
# [-87, 88], the Taylor series to degree 8 (truncation < 3e-9 relative), 2^k from float32
# bits.
_F = np.float32
_LOG2E_F = _F(1.4426950408889634)
_LN2_HI_F = _F(0.693145751953125)  # 11 significant bits: k * _LN2_HI_F exact for |k| < 2^13
_LN2_LO_F = _F(1.4286068203094172e-06)


def _expm1_parts32(x):
    """(s, e) with exp(x) = s + e, s = 2^k exact; x and the results float32."""
    x = x if not (x > _F(88.0)) else _F(88.0)
    x = x if not (x < _F(-87.0)) else _F(-87.0)
    k = np.floor(x * _LOG2E_F + _F(0.5))
    r = (x - k * _LN2_HI_F) - k * _LN2_LO_F
    q = _F(1.0 / 40320.0)
    q = _F(1.0 / 5040.0) + r * q
    q = _F(1.0 / 720.0) + r * q
    q = _F(1.0 / 120.0) + r * q
    q = _F(1.0 / 24.0) + r * q
    q = _F(1.0 / 6.0) + r * q
    q = _F(0.5) + r * q
    q = _F(1.0) + r * q
    s = i32_as_f32((np.int32(k) + np.int32(127)) << np.int32(23))
    return s, s * (r * q)


expm1_parts32 = numba.njit(cache=True, inline="always", error_model="numpy")(_expm1_parts32)


def _sigmoid32(x):
    s, e = expm1_parts32(-x)
    return _F(1.0) / (_F(1.0) + (s + e))


def _tanh32(x):
    s, e = expm1_parts32(_F(-2.0) * abs(x))
    u = (s - _F(1.0)) + e  # in (-1, 0]
    t = abs(u) / (u + _F(2.0))
    return t if x >= 0 else -t


sigmoid32 = numba.njit(cache=True, inline="always", error_model="numpy")(_sigmoid32)
tanh32 = numba.njit(cache=True, inline="always", error_model="numpy")(_tanh32)


def act_sigmoid(x):
    """sigmoid in the precision of x: float32 math for float32, float64 otherwise."""
    return 1.0 / (1.0 + math.exp(-x))


def act_tanh(x):
    """tanh in the precision of x: float32 math for float32, float64 otherwise."""
    return math.tanh(x)


@overload(act_sigmoid)
def _act_sigmoid(x):
    if x == types.float32:
        return lambda x: sigmoid32(x)
    return lambda x: sigmoid(x)


@overload(act_tanh)
def _act_tanh(x):
    if x == types.float32:
        return lambda x: tanh32(x)
    return lambda x: tanh(x)


# ---- softplus -------------------------------------------------------------------------------

def _softplus64(x):
    """torch's softplus for float64 x (see the module docstring)."""
    e = _exp_f64_jit(-abs(x))
    s = e / (2.0 + e)
    s2 = s * s
    p = 1.0 / 31.0
    for k in range(29, 1, -2):  # unrolled by LLVM: Horner in s^2 down to 1/3, then 1
        p = p * s2 + 1.0 / k
    p = p * s2 + 1.0
    v = max(x, 0.0) + 2.0 * s * p
    return x if x > 20.0 else v


def _softplus32(x):
    """torch's softplus for float32 x (see the module docstring)."""
    e = _exp_f32_jit(-abs(x))
    s = e / (_F(2.0) + e)
    s2 = s * s
    p = _F(1.0 / 13.0)
    p = p * s2 + _F(1.0 / 11.0)
    p = p * s2 + _F(1.0 / 9.0)
    p = p * s2 + _F(1.0 / 7.0)
    p = p * s2 + _F(1.0 / 5.0)
    p = p * s2 + _F(1.0 / 3.0)
    p = p * s2 + _F(1.0)
    v = max(x, _F(0.0)) + _F(2.0) * s * p
    return x if x > _F(20.0) else v


softplus64 = numba.njit(cache=True, inline="always", fastmath={"contract"})(_softplus64)
softplus32 = numba.njit(cache=True, inline="always", fastmath={"contract"})(_softplus32)


def softplus(x):
    """log(1 + exp(x)) (x when x > 20) in the precision of x."""
    return x if x > 20.0 else math.log1p(math.exp(x))


@overload(softplus)
def _ov_softplus(x):
    if x == types.float32:
        return lambda x: softplus32(x)
    return lambda x: softplus64(x)


# ---- SplitMix64 (one body for the CPU and the CUDA kernels) ----------------------------------
# Written with Numba's type casts (uint64(...), float64(...)), which compile on both targets
# and run as NumPy scalars uncompiled.

SPLITMIX64_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(seed, n):
    """SplitMix64's output number n + 1 for ``seed``, a uint64 (wrapping arithmetic)."""
    z = uint64(seed) + (uint64(n) + uint64(1)) * uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


def _uniform53(z):
    """The top 53 bits of the uint64 z as a float64 in [0, 1)."""
    return float64(z >> uint64(11)) * (1.0 / 9007199254740992.0)  # 53 bits / 2**53


splitmix64 = numba.njit(cache=True, inline="always")(_splitmix64)
uniform53 = numba.njit(cache=True, inline="always")(_uniform53)

# ---- CUDA device functions, made when first imported (see the module docstring) --------------


def _sigmoid_stable(a):
    """1 / (1 + exp(-a)) without overflow: exp of a non-positive argument only."""
    if a >= 0:
        return 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    return e / (1.0 + e)


_DEVICE_SOURCES = {"sigmoid_dev": _sigmoid_stable, "splitmix64_dev": _splitmix64,
                   "uniform53_dev": _uniform53}


def __getattr__(name):
    source = _DEVICE_SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from numba import config, cuda

    if config.ENABLE_CUDASIM:  # NumPy scalars there warn where the device's uint64 wraps
        source = _quiet_overflow(source)
    device_fn = globals()[name] = cuda.jit(device=True)(source)
    return device_fn


def _quiet_overflow(fn):
    """``fn`` with NumPy's overflow warning off: under the simulator a device function runs on
    NumPy scalars, whose uint64 products warn where the hardware wraps silently."""
    def quiet(*args):
        with np.errstate(over="ignore"):
            return fn(*args)

    return quiet
