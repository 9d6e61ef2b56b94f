"""The selective scan (Mamba's S6): the fused kernels against the naive twin (hypothesis, over
shapes, layouts of B and C, options and dtypes), the twin and F.selective_scan against a
torch transcription of mamba_ssm's ``selective_scan_ref``, gradients by finite differences,
long sequences in float32 against float64, and bad input."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import nnkit as nk
import nnkit.functional as F
from nnkit.kernels import reference as R
from nnkit.kernels import selective_scan as K

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_selective_scan import torch_selective_scan_ref  # noqa: E402

NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def _layout(rng, rank, batch, dim, N, L, G):
    shape = {2: (dim, N), 3: (batch, N, L), 4: (batch, G, N, L)}[rank]
    return rng.standard_normal(shape)


def make_problem(seed, batch, dim, L, N, B_rank=3, C_rank=3, G=1, with_D=True, with_z=True,
                 with_bias=True, softplus=True, dtype=np.float64):
    """Inputs of a stable scan: A < 0, and without softplus the raw steps in (0, 1)."""
    rng = np.random.default_rng(seed)
    delta = (rng.standard_normal((batch, dim, L)) if softplus
             else rng.uniform(0.0, 1.0, (batch, dim, L)))
    args = {"u": rng.standard_normal((batch, dim, L)), "delta": delta,
            "A": -np.exp(0.5 * rng.standard_normal((dim, N))),
            "B": _layout(rng, B_rank, batch, dim, N, L, G),
            "C": _layout(rng, C_rank, batch, dim, N, L, G),
            "D": rng.standard_normal(dim) if with_D else None,
            "z": rng.standard_normal((batch, dim, L)) if with_z else None,
            "delta_bias": (0.3 * rng.standard_normal(dim) if with_bias and softplus
                           else rng.uniform(0.0, 0.2, dim) if with_bias else None)}
    args = {k: None if v is None else v.astype(dtype) for k, v in args.items()}
    return args, softplus


def assert_close(actual, expected, dtype, factor, name):
    """Within ``factor`` ulps of ``dtype`` of the largest magnitude of the twin's result."""
    actual, expected = np.asarray(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape and actual.dtype == np.dtype(dtype), name
    scale = 1.0 + (np.abs(expected).max() if expected.size else 0.0)
    err = np.abs(actual - expected).max() if expected.size else 0.0
    assert err <= factor * np.finfo(dtype).eps * scale, f"{name}: error {err:.3g}"


@st.composite
def problems(draw):
    dim = draw(st.integers(1, 6))
    G = draw(st.sampled_from([g for g in (1, 2, 3, 6) if dim % g == 0]))
    return dict(seed=draw(st.integers(0, 2**16)), batch=draw(st.integers(0, 3)), dim=dim,
                L=draw(st.one_of(st.sampled_from((0, 1, 63, 64, 65, 129)),
                                 st.integers(1, 140))),
                N=draw(st.integers(1, 5)), B_rank=draw(st.sampled_from((2, 3, 4))),
                C_rank=draw(st.sampled_from((2, 3, 4))), G=G, with_D=draw(st.booleans()),
                with_z=draw(st.booleans()), with_bias=draw(st.booleans()),
                softplus=draw(st.booleans()),
                dtype=draw(st.sampled_from((np.float32, np.float64))))


@given(p=problems())
@example(p=dict(seed=0, batch=2, dim=4, L=130, N=3, B_rank=4, C_rank=2, G=2, with_D=True,
                with_z=True, with_bias=True, softplus=True, dtype=np.float32))  # 3 chunks
@example(p=dict(seed=1, batch=1, dim=1, L=0, N=1, B_rank=3, C_rank=3, G=1, with_D=False,
                with_z=False, with_bias=False, softplus=False, dtype=np.float64))  # empty
def test_kernels_match_twin(p):
    args, softplus = make_problem(**p)
    dtype = p["dtype"]
    factor = 64 + 4 * p["L"]  # rounding grows along the chain
    (y, last), cache = K.selective_scan_forward(**args, delta_softplus=softplus,
                                                return_last_state=True)
    ry, rlast = R.selective_scan(**args, delta_softplus=softplus, return_last_state=True)
    assert_close(y, ry, dtype, factor, "y")
    assert_close(last, rlast, dtype, factor, "last_state")
    rng = np.random.default_rng(p["seed"] + 1)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dlast = rng.standard_normal(last.shape).astype(dtype)
    grads = K.selective_scan_backward((dy, dlast), cache)
    twin = R.selective_scan_backward(dy, R.selective_scan_forward(
        **args, delta_softplus=softplus)[1], dlast)
    for name, g, r in zip(NAMES, grads, twin, strict=True):
        assert (g is None) == (args[name] is None), name
        if g is not None:
            assert_close(g, r, dtype, 4 * factor, f"d{name}")


@pytest.mark.parametrize("B_rank, C_rank", [(2, 2), (3, 3), (4, 4), (3, 2)])
@pytest.mark.parametrize("softplus", [True, False])
def test_gradcheck(B_rank, C_rank, softplus):
    args, _ = make_problem(3, 2, 4, 7, 3, B_rank, C_rank, G=2, softplus=softplus)
    names = [n for n in NAMES if args[n] is not None]

    def fn(*xs):
        y, last = F.selective_scan(**dict(zip(names, xs, strict=True)),
                                   delta_softplus=softplus, return_last_state=True)
        return y, last

    assert nk.gradcheck(fn, [args[n] for n in names])


def test_gradients_reach_only_what_requires_them():
    """Only u requires grad: it gets the kernels' du, the constant tensors get none."""
    args, _ = make_problem(4, 1, 2, 5, 2)
    u = nk.tensor(args["u"], requires_grad=True)
    rest = {n: nk.tensor(args[n]) for n in NAMES[1:]}
    y = F.selective_scan(u, **rest, delta_softplus=True)
    y.backward(np.ones(y.shape))
    _, cache = K.selective_scan_forward(**args, delta_softplus=True)
    np.testing.assert_allclose(u.grad, K.selective_scan_backward(np.ones(y.shape), cache)[0],
                               rtol=1e-14)
    assert all(t.grad is None for t in rest.values())


def test_chunk_boundaries_do_not_change_the_states():
    """The backward restarts each chunk of 64 steps from the saved state: the same gradients
    whether L ends just before, at or after a boundary (checked against the twin above);
    here the saved states themselves are the forward's states."""
    args, _ = make_problem(5, 1, 2, 3 * K.CHUNK + 1, 2)
    _, cache = K.selective_scan_forward(**args, delta_softplus=True)
    for c in range(4):
        head = {k: (v[..., : c * K.CHUNK] if k in ("u", "delta", "z") or
                    (k in ("B", "C") and v.ndim > 2) else v) for k, v in args.items()}
        _, state = R.selective_scan(**head, delta_softplus=True, return_last_state=True) \
            if c else (None, np.zeros((1, 2, 2)))
        np.testing.assert_allclose(cache.checkpoints[:, :, c], state, rtol=1e-12, atol=1e-14)


def test_long_sequence_float32_tracks_float64():
    """T = 65536 with decays near 1 (the regime where a product of gates would underflow):
    the float32 scan stays within 1e-3 relative of the float64 one."""
    args, _ = make_problem(6, 1, 2, 65536, 4, with_z=False)
    args["delta"] = (args["delta"] - 4).astype(np.float64)  # softplus(-4 +- 1): small steps
    y64 = K.selective_scan_forward(**args, delta_softplus=True)[0]
    y32 = K.selective_scan_forward(**{k: None if v is None else v.astype(np.float32)
                                      for k, v in args.items()}, delta_softplus=True)[0]
    assert np.isfinite(y32).all()
    err = np.abs(y32 - y64).max() / np.abs(y64).max()
    assert err < 1e-3, err


# ---- against torch: mamba_ssm's selective_scan_ref (benchmarks/bench_selective_scan.py) -------

@pytest.mark.parametrize("B_rank, C_rank, G", [(3, 3, 1), (4, 4, 2), (2, 2, 1), (4, 3, 4)])
def test_matches_torch_reference(B_rank, C_rank, G):
    torch = pytest.importorskip("torch")
    args, _ = make_problem(7, 2, 4, 33, 3, B_rank, C_rank, G=G)
    tt = {k: torch.tensor(v, requires_grad=True) for k, v in args.items()}
    expected = torch_selective_scan_ref(**tt, delta_softplus=True)
    upstream = np.random.default_rng(8).standard_normal(expected.shape)
    (expected * torch.tensor(upstream)).sum().backward()
    ours = {k: nk.tensor(v, requires_grad=True) for k, v in args.items()}
    y = F.selective_scan(**ours, delta_softplus=True)
    (y * upstream).sum().backward()
    np.testing.assert_allclose(y.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name in NAMES:
        np.testing.assert_allclose(ours[name].grad, tt[name].grad.numpy(), rtol=1e-10,
                                   atol=1e-10, err_msg=name)


# ---- bad input ---------------------------------------------------------------------------------

def _valid():
    return make_problem(9, 2, 4, 5, 3, B_rank=4, C_rank=3, G=2, dtype=np.float32)[0]


@pytest.mark.parametrize("change, error, match", [
    ({"u": np.zeros((2, 4))}, ValueError, r"u must be .*3"),
    ({"delta": np.zeros((2, 4, 6), np.float32)}, ValueError, r"delta must have shape"),
    ({"delta": np.zeros((2, 4, 5), np.float64)}, TypeError, r"delta must have u's dtype"),
    ({"A": np.zeros((3, 3), np.float32)}, ValueError, r"A must have shape \(dim, N\)"),
    ({"A": np.zeros((4, 3), np.complex64)}, TypeError, r"A"),
    ({"B": np.zeros((2, 3, 3, 5), np.float32)}, ValueError, r"B has 3 groups"),
    ({"B": np.zeros((2, 2, 4, 5), np.float32)}, ValueError,
     r"B must have shape \(batch, G, N, L\)"),
    ({"C": np.zeros((4, 2), np.float32)}, ValueError,
     r"C must have shape \(dim, N\) = \(4, 3\) \(rank 2"),
    ({"C": np.zeros((2, 3, 5, 1, 1), np.float32)}, ValueError, r"C"),
    ({"D": np.zeros(3, np.float32)}, ValueError, r"D must have shape \(dim,\)"),
    ({"z": np.zeros((2, 4, 5), np.int64)}, TypeError, r"z"),
    ({"delta_bias": "abc"}, TypeError, r"delta_bias"),
    ({"u": "abc"}, TypeError, r"u"),
])
def test_bad_input_is_refused_with_the_argument_named(change, error, match):
    args = {**_valid(), **change}
    with pytest.raises(error, match=match):
        F.selective_scan(**args)


@pytest.mark.parametrize("flag", ["delta_softplus", "return_last_state"])
def test_flags_must_be_booleans(flag):
    with pytest.raises(TypeError, match=flag):
        F.selective_scan(**_valid(), **{flag: "yes"})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softplus_is_torch_s_within_three_ulp(dtype):
    """simd_math.softplus (the kernels' step sizes): torch's threshold (x above 20), and
    log(1 + e^x) within 3 ulp down to tiny values; NaN and +-inf as log1p(exp(x))."""
    import numba

    from nnkit._ext.simd_math import softplus

    @numba.njit
    def apply(x, out):
        for i in range(x.size):
            out[i] = softplus(x[i])

    x = np.linspace(-80, 30, 100001).astype(dtype)
    out = np.empty_like(x)
    apply(x, out)
    wide = x.astype(np.float64)
    exact = np.where(wide > 20, wide, np.log1p(np.exp(wide)))
    assert (np.abs(out - exact) / exact).max() <= 3 * np.finfo(dtype).eps
    special = np.array([np.nan, np.inf, -np.inf], dtype)
    apply(special, out[:3])
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 0


PER_STEP = ("u", "delta", "z")  # (batch, dim, L); B and C of rank 3 and 4 too


def _sequence(args, lo, hi):
    """One sequence's inputs: the steps lo:hi of every time-varying input."""
    out = {}
    for name, a in args.items():
        if a is None or (name in ("B", "C") and a.ndim == 2) or name in ("A", "D",
                                                                          "delta_bias"):
            out[name] = a
        else:
            out[name] = a[..., lo:hi]
    return out


@pytest.mark.parametrize("B_rank, C_rank", [(3, 4), (2, 3)])
@pytest.mark.parametrize("softplus", [True, False])
def test_packed_sequences_give_what_each_gives_alone(B_rank, C_rank, softplus):
    """cu_seqlens: sequences of lengths 4, 0, 1, 70, 3 packed along L; each one's outputs,
    last state and input gradients equal to the sequence run alone (a pad step has dt = 0)."""
    lengths = [4, 0, 1, 70, 3]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    args, _ = make_problem(12, 1, 4, int(cu[-1]), 3, B_rank, C_rank, G=2, softplus=softplus)
    rng = np.random.default_rng(13)
    dy = rng.standard_normal((1, 4, int(cu[-1])))
    dlast = rng.standard_normal((len(lengths), 4, 3))

    def run(kw, dy, dlast, **options):
        tensors = {k: None if v is None else nk.tensor(v, requires_grad=True)
                   for k, v in kw.items()}
        y, last = F.selective_scan(**tensors, delta_softplus=softplus, return_last_state=True,
                                   **options)
        ((y * dy).sum() + (last * dlast).sum()).backward()
        return y.numpy(), last.numpy(), {k: t.grad for k, t in tensors.items() if t is not None}

    y, last, grads = run(args, dy, dlast, cu_seqlens=cu)
    shared = {name: 0.0 for name in ("A", "D", "delta_bias") if args[name] is not None}
    for n, (lo, hi) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        y_n, last_n, grads_n = run(_sequence(args, lo, hi), dy[..., lo:hi], dlast[n:n + 1])
        np.testing.assert_allclose(y[..., lo:hi], y_n, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(last[n:n + 1], last_n, rtol=1e-10, atol=1e-12)
        for name, g in grads_n.items():
            if name in shared:
                shared[name] = shared[name] + g
            elif name in ("B", "C") and args[name].ndim == 2:
                shared[name] = shared.get(name, 0.0) + g
            else:
                np.testing.assert_allclose(grads[name][..., lo:hi], g, rtol=1e-9, atol=1e-12,
                                           err_msg=f"d{name}, sequence {n}")
    for name, g in shared.items():  # the parameters: the sum over the sequences
        np.testing.assert_allclose(grads[name], g, rtol=1e-9, atol=1e-12, err_msg=f"d{name}")


def test_packed_refusals():
    args, _ = make_problem(1, 2, 4, 6, 3)
    with pytest.raises(ValueError, match="u must have shape"):
        F.selective_scan(**args, cu_seqlens=np.array([0, 6]))
    args, _ = make_problem(1, 1, 4, 6, 3)
    with pytest.raises(ValueError, match="cu_seqlens"):
        F.selective_scan(**args, cu_seqlens=np.array([0, 7]))
    with pytest.raises(TypeError, match="cu_seqlens"):
        F.selective_scan(**args, cu_seqlens=np.array([0.0, 6.0]))
