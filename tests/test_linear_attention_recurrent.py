"""The linear-attention recurrence (linear attention, gated, delta rule, gated delta rule):
the naive twin against central differences, the Numba CPU kernels against the twin
(hypothesis, across the 64-step chunk edges), and properties of the recurrence."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nnkit._ext import linear_attention_cpu as K
from nnkit.kernels import reference as R

NAMES = ("q", "k", "v", "beta", "g", "initial_state")


def make_problem(seed, B, H, T, dk, dv, G, with_beta=True, with_S0=True, dtype=np.float64):
    """Inputs of a stable recurrence (|k_i| <= 0.5 / sqrt(dk), so |k| <= 0.5; beta in (0, 1);
    log-decays in (-0.5, 0)) and random upstream gradients (do, dfinal)."""
    rng = np.random.default_rng(seed)
    gate = {0: None, 1: (B, H, T), dk: (B, H, T, dk)}[G] if G else None
    args = {"q": rng.standard_normal((B, H, T, dk)),
            "k": rng.uniform(-0.5, 0.5, (B, H, T, dk)) / np.sqrt(dk),
            "v": rng.standard_normal((B, H, T, dv)),
            "beta": rng.uniform(0.05, 0.95, (B, H, T)) if with_beta else None,
            "g": None if gate is None else -rng.uniform(0.0, 0.5, gate),
            "initial_state": rng.standard_normal((B, H, dk, dv)) if with_S0 else None}
    up = {"do": rng.standard_normal((B, H, T, dv)), "dfinal": rng.standard_normal((B, H, dk, dv))}
    cast = {k: None if x is None else x.astype(dtype) for k, x in {**args, **up}.items()}
    return {k: cast[k] for k in args}, {k: cast[k] for k in up}


def run_kernels(args, up, scale, delta):
    """The CPU kernels on the (batch * heads) rows: (o, final, checkpoints), (dq, dk, dv,
    dbeta, dg, dS0), reshaped back to the user layout (dg to g's shape, or None)."""
    q, k, v = args["q"], args["k"], args["v"]
    B, H, T, dk = q.shape
    dv, dtype, BH = v.shape[3], q.dtype, B * H

    def rows(x, *shape):
        return np.ascontiguousarray(np.reshape(x, (BH, *shape)))

    def nans(*shape):  # every output must be overwritten
        return np.full(shape, np.nan, dtype)

    beta = np.ones((BH, T), dtype) if args["beta"] is None else rows(args["beta"], T)
    g = np.zeros((BH, T, 0), dtype) if args["g"] is None else rows(args["g"], T, -1)
    S0 = (np.zeros((BH, dk, dv), dtype) if args["initial_state"] is None
          else rows(args["initial_state"], dk, dv))
    q, k, v = rows(q, T, dk), rows(k, T, dk), rows(v, T, dv)
    o, final = nans(BH, T, dv), nans(BH, dk, dv)
    checkpoints = nans(BH, -(-T // K.CHUNK), dk, dv)
    K.recurrent_forward(q, k, v, beta, g, scale, S0, delta, o, final, checkpoints)
    grads = (nans(BH, T, dk), nans(BH, T, dk), nans(BH, T, dv), nans(BH, T), nans(*g.shape),
             nans(BH, dk, dv))
    K.recurrent_backward(rows(up["do"], T, dv), rows(up["dfinal"], dk, dv), q, k, v, beta, g,
                         scale, delta, checkpoints, *grads)
    shapes = [(B, H, T, dk), (B, H, T, dk), (B, H, T, dv), (B, H, T),
              None if args["g"] is None else args["g"].shape, (B, H, dk, dv)]
    grads = [None if s is None else x.reshape(s) for x, s in zip(grads, shapes, strict=True)]
    return (o.reshape(B, H, T, dv), final.reshape(B, H, dk, dv), checkpoints), grads


# ---- the twin against central differences ----------------------------------------------------

def _loss(args, up, scale, delta):
    o, final = R.linear_attention_steps(**args, scale=scale, delta=delta)
    return float((o * up["do"]).sum() + (final * up["dfinal"]).sum())


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize(("G", "with_beta", "with_S0"),
                         [(0, True, True), (1, True, True), (2, True, True), (0, False, False),
                          (2, False, True), (1, True, False)])
def test_twin_gradients_match_finite_differences(delta, G, with_beta, with_S0):
    args, up = make_problem(3, 1, 2, 4, 2, 3, G, with_beta, with_S0)
    scale, eps = 0.7, 1e-6
    grads = R.linear_attention_steps_backward(**up, **args, scale=scale, delta=delta)
    for name, grad in zip(NAMES, grads, strict=True):
        x = args[name]
        if x is None:
            assert grad is None, name
            continue
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            keep = x[idx]
            x[idx] = keep + eps
            plus = _loss(args, up, scale, delta)
            x[idx] = keep - eps
            minus = _loss(args, up, scale, delta)
            x[idx] = keep
            numeric[idx] = (plus - minus) / (2 * eps)
        assert grad.shape == x.shape, name
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7, err_msg=name)


def test_twin_without_upstream_final_gradient():
    """dfinal=None is zeros."""
    args, up = make_problem(4, 1, 1, 3, 2, 2, 1)
    zeros = R.linear_attention_steps_backward(up["do"], np.zeros_like(up["dfinal"]), **args,
                                              delta=True)
    none = R.linear_attention_steps_backward(up["do"], None, **args, delta=True)
    for a, b in zip(zeros, none, strict=True):
        np.testing.assert_array_equal(a, b)


# ---- the kernels against the twin ------------------------------------------------------------

def assert_close(actual, expected, tol, name):
    """|actual - expected| <= tol * (1 + the largest magnitude of expected)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
    if expected.size == 0:
        return
    err = np.abs(actual.astype(np.float64) - expected).max()
    assert err <= tol * (1.0 + np.abs(expected).max()), f"{name}: error {err:.3g}"


@st.composite
def problems(draw):
    dk = draw(st.integers(1, 9))
    return dict(seed=draw(st.integers(0, 2**16)), B=1, H=draw(st.integers(1, 3)),
                T=draw(st.sampled_from((1, 63, 64, 65, 130))), dk=dk, dv=draw(st.integers(1, 9)),
                G=draw(st.sampled_from((0, 1, dk))), with_beta=draw(st.booleans()),
                with_S0=draw(st.booleans()),
                dtype=draw(st.sampled_from((np.float32, np.float64))))


@settings(max_examples=30)
@given(p=problems(), delta=st.booleans())
@example(p=dict(seed=0, B=1, H=3, T=130, dk=9, dv=9, G=9, with_beta=True, with_S0=True,
                dtype=np.float32), delta=True)  # three chunks, per-key gates, widest rows
@example(p=dict(seed=1, B=1, H=2, T=65, dk=4, dv=3, G=1, with_beta=False, with_S0=True,
                dtype=np.float64), delta=False)  # a one-step second chunk
def test_kernels_match_twin(p, delta):
    args, up = make_problem(**p)
    scale = 0.5
    tol = 1e-4 if p["dtype"] == np.float32 else 1e-10
    (o, final, _), grads = run_kernels(args, up, scale, delta)
    o_ref, final_ref = R.linear_attention_steps(**args, scale=scale, delta=delta)
    assert_close(o, o_ref, tol, "o")
    assert_close(final, final_ref, tol, "final")
    refs = R.linear_attention_steps_backward(**up, **args, scale=scale, delta=delta)
    for name, grad, ref in zip(NAMES, grads, refs, strict=True):
        if ref is None:  # beta ones, S0 zeros in the kernels: their gradients still exist
            assert name != "g" or grad is None, name
            continue
        assert_close(grad, ref, tol, "d" + name)


# ---- properties ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_delta_rule_reads_back_what_it_wrote(dtype):
    """With beta = 1 and a unit key, S^T k = v right after the write, whatever the state
    before: o_t = scale v_t when q_t = k_t."""
    args, up = make_problem(5, 1, 2, 5, 4, 3, 0, dtype=dtype)
    k_last = np.random.default_rng(6).standard_normal(4)
    args["k"][:, :, -1] = k_last / np.linalg.norm(k_last)
    args["q"][:, :, -1] = args["k"][:, :, -1]
    args["beta"][:, :, -1] = 1.0
    (o, _, _), _ = run_kernels(args, up, 0.5, True)
    o_ref, _ = R.linear_attention_steps(**args, scale=0.5, delta=True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(o[:, :, -1], 0.5 * args["v"][:, :, -1], rtol=tol, atol=tol)
    np.testing.assert_allclose(o_ref[:, :, -1], 0.5 * args["v"][:, :, -1], rtol=tol, atol=tol)


def test_delta_rule_one_step_from_zero():
    """S0 = 0, one step, beta = 1, unit k, q = k: o_0 = scale v_0."""
    k = np.array([0.6, 0.0, 0.8]).reshape(1, 1, 1, 3)
    v = np.array([1.5, -2.0]).reshape(1, 1, 1, 2)
    args = {"q": k.copy(), "k": k, "v": v, "beta": np.ones((1, 1, 1)), "g": None,
            "initial_state": None}
    up = {"do": np.zeros((1, 1, 1, 2)), "dfinal": np.zeros((1, 1, 3, 2))}
    (o, _, _), _ = run_kernels(args, up, 2.0, True)
    np.testing.assert_allclose(o, 2.0 * v, rtol=1e-15)
    np.testing.assert_allclose(R.linear_attention_steps(**args, scale=2.0, delta=True)[0], 2.0 * v,
                               rtol=1e-15)


@pytest.mark.parametrize("delta", [False, True])
def test_zero_gates_agree(delta):
    """g = 0 as a scalar, as a per-key gate and absent give the same results; the scalar
    gate's gradient is the sum of the per-key one's."""
    args, up = make_problem(7, 1, 2, 70, 3, 4, 0)
    runs = {}
    for G, shape in ((0, None), (1, (1, 2, 70)), (3, (1, 2, 70, 3))):
        runs[G] = run_kernels({**args, "g": None if shape is None else np.zeros(shape)}, up,
                              0.5, delta)

    def results(G):  # o, final, dq, dk, dv, dbeta, dS0
        (o, final, _), grads = runs[G]
        return [o, final, *grads[:4], grads[5]]

    for G in (1, 3):
        for a, b in zip(results(G), results(0), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(runs[1][1][4], runs[3][1][4].sum(-1), rtol=1e-12, atol=1e-12)
    twin_scalar = R.linear_attention_steps_backward(**up, **{**args, "g": np.zeros((1, 2, 70))},
                                                    delta=delta)
    twin_vector = R.linear_attention_steps_backward(**up, **{**args, "g": np.zeros((1, 2, 70, 3))},
                                       delta=delta)
    np.testing.assert_allclose(twin_scalar[4], twin_vector[4].sum(-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("delta", [False, True])
def test_checkpoints_are_chunk_start_states(delta):
    """checkpoints[:, 0] == S0 and checkpoints[:, c] the state after c * CHUNK steps."""
    T = 2 * K.CHUNK + 3
    args, up = make_problem(8, 1, 2, T, 3, 2, 3)
    (_, _, checkpoints), _ = run_kernels(args, up, 1.0, delta)
    assert checkpoints.shape == (2, 3, 3, 2)
    np.testing.assert_array_equal(checkpoints[:, 0], args["initial_state"][0])
    for c in (1, 2):
        t = c * K.CHUNK
        head = {n: None if x is None else x[:, :, :t] for n, x in args.items()
                if n != "initial_state"}
        _, state = R.linear_attention_steps(**head, initial_state=args["initial_state"],
                                       delta=delta)
        np.testing.assert_allclose(checkpoints[:, c], state[0], rtol=1e-12, atol=1e-12)
