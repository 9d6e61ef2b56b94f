"""The linear-attention recurrence's CUDA kernels (``nnkit._ext.linear_attention_cuda``).

- In this process: the float64 NumPy loop of this file (the recurrence and its backward, as
  the kernels' spec writes them) against a central finite difference, so that the loop the
  kernels are held to is itself right.
- Under Numba's simulator (a child process), with blocks of 4 threads (several blocks, and
  threads past the last (row, column)): ``recurrent_forward`` (o, the final state, the
  checkpoints) and ``recurrent_backward`` (every gradient) against that loop, and against
  the CPU launchers of ``nnkit._ext.linear_attention_cpu`` where that module exists, for a
  scalar, per-key and no decay, with and without the delta rule, float32 and float64, T = 1
  and T across chunks (65, 130 > CHUNK = 64), and empty rows, T, dk and dv.
"""

import importlib.util
import sys

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes

CHUNK = 64

# (BH, T, dk, dv, G ("dk" for a per-key decay), delta, dtype)
CASES = [
    (2, 65, 3, 4, "dk", True, np.float32),
    (2, 65, 4, 3, 1, False, np.float64),
    (1, 65, 5, 5, 0, True, np.float64),
    (2, 1, 3, 5, "dk", False, np.float64),
    (1, 1, 4, 3, 1, True, np.float32),
    (2, 9, 3, 3, 0, False, np.float32),
    (1, 130, 2, 2, "dk", True, np.float64),
    (0, 5, 3, 3, 1, True, np.float32),  # no rows
    (2, 0, 3, 3, "dk", True, np.float64),  # T = 0
    (1, 5, 3, 0, 1, True, np.float64),  # dv = 0
    (2, 5, 0, 3, 0, True, np.float32),  # dk = 0
]


def make_problem(seed, BH, T, dk, dv, G, delta, dtype):
    """Kernel-layout inputs: unit keys and beta in (0, 1) (a stable delta rule), log-decays
    in (-0.5, 0)."""
    rng = np.random.default_rng(seed)
    G = dk if G == "dk" else G
    q = rng.standard_normal((BH, T, dk))
    k = rng.standard_normal((BH, T, dk))
    k /= np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-3)
    v = rng.standard_normal((BH, T, dv))
    beta = rng.uniform(0.1, 0.9, (BH, T))
    g = rng.uniform(-0.5, 0.0, (BH, T, G))
    S0 = rng.standard_normal((BH, dk, dv))
    scale = float(1.0 / np.sqrt(max(dk, 1)))
    arrays = [np.ascontiguousarray(a, dtype) for a in (q, k, v, beta, g, S0)]
    return (*arrays, scale, bool(delta))


def loop_forward(q, k, v, beta, g, scale, S0, delta):
    """(o, final, checkpoints, states) in float64 by the recurrence; states[:, t] after step
    t."""
    q, k, v, beta, g, S0 = (np.asarray(a, np.float64) for a in (q, k, v, beta, g, S0))
    BH, T, dk = q.shape
    dv = v.shape[2]
    o = np.zeros((BH, T, dv))
    states = np.zeros((BH, T, dk, dv))
    checkpoints = np.zeros((BH, -(-T // CHUNK), dk, dv))
    final = S0.copy()
    for b in range(BH):
        S = S0[b].copy()
        for t in range(T):
            if t % CHUNK == 0:
                checkpoints[b, t // CHUNK] = S
            S = _decayed(S, g[b, t])
            r = v[b, t] - S.T @ k[b, t] if delta else v[b, t]
            S = S + beta[b, t] * np.outer(k[b, t], r)
            states[b, t] = S
            o[b, t] = scale * S.T @ q[b, t]
        final[b] = S
    return o, final, checkpoints, states


def _decayed(S, gt):
    if gt.size == 0:
        return S
    return np.exp(gt)[:, None] * S if gt.size > 1 else np.exp(gt[0]) * S


def loop_backward(do, dfinal, q, k, v, beta, g, scale, S0, delta):
    """(dq, dk, dv, dbeta, dg, dS0) in float64, reverse mode over the stored states."""
    q, k, v, beta, g, S0, do, dfinal = (np.asarray(a, np.float64)
                                        for a in (q, k, v, beta, g, S0, do, dfinal))
    *_, states = loop_forward(q, k, v, beta, g, scale, S0, delta)
    BH, T, dk = q.shape
    dq, dk_, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dbeta, dg, dS0 = np.zeros_like(beta), np.zeros_like(g), np.zeros_like(S0)
    for b in range(BH):
        Gm = dfinal[b].copy()
        for t in range(T - 1, -1, -1):
            Gm = Gm + scale * np.outer(q[b, t], do[b, t])
            dq[b, t] = scale * states[b, t] @ do[b, t]
            Sp = _decayed(states[b, t - 1] if t else S0[b], g[b, t])
            r = v[b, t] - Sp.T @ k[b, t] if delta else v[b, t]
            Gk = Gm.T @ k[b, t]
            dbeta[b, t] = Gk @ r
            dr = beta[b, t] * Gk
            dv[b, t] = dr
            dk_[b, t] = beta[b, t] * Gm @ r
            if delta:
                dk_[b, t] -= Sp @ dr
                Gm = Gm - np.outer(k[b, t], dr)
            if g.shape[2] == 1:
                dg[b, t, 0] = np.sum(Gm * Sp)
            elif g.shape[2] > 1:
                dg[b, t] = np.sum(Gm * Sp, axis=1)
            Gm = _decayed(Gm, g[b, t])
        dS0[b] = Gm
    return dq, dk_, dv, dbeta, dg, dS0


@pytest.mark.parametrize("G", [0, 1, "dk"])
@pytest.mark.parametrize("delta", [False, True])
def test_loop_backward_matches_finite_differences(G, delta):
    """The loop's backward against central differences of L = sum(o do) + sum(final dfinal)."""
    q, k, v, beta, g, S0, scale, delta = make_problem(3, 2, 5, 3, 2, G, delta, np.float64)
    rng = np.random.default_rng(4)
    do = rng.standard_normal(v.shape)
    dfinal = rng.standard_normal(S0.shape)
    inputs = [q, k, v, beta, g, S0]

    def loss(arrays):
        o, final, _, _ = loop_forward(*arrays[:5], scale, arrays[5], delta)
        return np.sum(o * do) + np.sum(final * dfinal)

    dq, dk, dv, dbeta, dg, dS0 = loop_backward(do, dfinal, q, k, v, beta, g, scale, S0, delta)
    for name, x, grad in zip("q k v beta g S0".split(), range(6), (dq, dk, dv, dbeta, dg, dS0),
                             strict=True):
        numeric = np.zeros_like(inputs[x])
        for idx in np.ndindex(inputs[x].shape):
            plus = [a.copy() for a in inputs]
            minus = [a.copy() for a in inputs]
            plus[x][idx] += 1e-6
            minus[x][idx] -= 1e-6
            numeric[idx] = (loss(plus) - loss(minus)) / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6, err_msg=name)


def assert_close(actual, expected, dtype, factor, name):
    """Within ``factor`` ulps of ``dtype`` of the largest magnitude of the expected result."""
    actual, expected = np.asarray(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == np.dtype(dtype), f"{name}: dtype {actual.dtype}"
    scale = 1.0 + (np.abs(expected).max() if expected.size else 0.0)
    err = np.abs(actual - expected).max() if expected.size else 0.0
    assert err <= factor * np.finfo(dtype).eps * scale, f"{name}: error {err:.3g}"


def _case(BH, T, dk, dv, G, delta, dtype):
    """Both launchers against the loop (and the CPU launchers where they exist)."""
    from nnkit._ext import linear_attention_cuda as gpu

    problem = make_problem(BH * 1000 + T * 10 + dk + dv, BH, T, dk, dv, G, delta, dtype)
    q, k, v, beta, g, S0, scale, delta = problem
    o, final, checkpoints, _ = loop_forward(q, k, v, beta, g, scale, S0, delta)
    go, gfinal = np.full(o.shape, np.nan, dtype), np.full(final.shape, np.nan, dtype)
    gck = np.full(checkpoints.shape, np.nan, dtype)
    gpu.recurrent_forward(q, k, v, beta, g, scale, S0, delta, go, gfinal, gck)
    factor = 64 + 4 * T
    assert_close(go, o, dtype, factor, "o")
    assert_close(gfinal, final, dtype, factor, "final")
    assert_close(gck, checkpoints, dtype, factor, "checkpoints")

    rng = np.random.default_rng(T + 1)
    do = rng.standard_normal(o.shape).astype(dtype)
    dfinal = rng.standard_normal(final.shape).astype(dtype)
    want = loop_backward(do, dfinal, q, k, v, beta, g, scale, S0, delta)
    got = [np.full(a.shape, np.nan, dtype) for a in want]
    gpu.recurrent_backward(do, dfinal, q, k, v, beta, g, scale, delta, gck, *got)
    names = ("dq", "dk", "dv", "dbeta", "dg", "dS0")
    for name, a, w in zip(names, got, want, strict=True):
        assert_close(a, w, dtype, 4 * factor, name)

    if importlib.util.find_spec("nnkit._ext.linear_attention_cpu") is None:
        return  # the CPU twin is compared once it exists
    from nnkit._ext import linear_attention_cpu as cpu

    co, cfinal, cck = np.empty_like(go), np.empty_like(gfinal), np.empty_like(gck)
    cpu.recurrent_forward(q, k, v, beta, g, scale, S0, delta, co, cfinal, cck)
    for name, a, w in (("cpu o", go, co), ("cpu final", gfinal, cfinal), ("cpu ck", gck, cck)):
        assert_close(a, w, dtype, 2 * factor, name)
    cgot = [np.full(a.shape, np.nan, dtype) for a in want]
    cpu.recurrent_backward(do, dfinal, q, k, v, beta, g, scale, delta, cck, *cgot)
    for name, a, w in zip(names, got, cgot, strict=True):
        assert_close(a, w, dtype, 8 * factor, f"cpu {name}")


def _cases():
    from nnkit._ext import linear_attention_cuda as gpu

    gpu.threads = 4  # several blocks, and threads past the last (row, column)
    for case in CASES:
        _case(*case)


def test_cuda_kernels_under_simulator(tmp_path):
    outcome = simulator_outcomes(__file__, tmp_path)["linear_attention"]
    assert outcome == "ok", outcome



@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("op", ["gated_linear_attention_per_key", "gated_delta_rule"])
@pytest.mark.parametrize("packed", [False, True])
def test_public_linear_attention_on_gpu_matches_cpu(op, mode, packed):
    """F.gated_delta_rule / F.gated_linear_attention on CuPy arrays (the chunked form through
    CuPy's array calls, the recurrent one through these kernels), forward and backward, the
    final state too, against the CPU (float64)."""
    cupy = pytest.importorskip("cupy")
    from test_linear_attention import make_problem, run

    import nnkit as nk

    kw = make_problem(op, 1, 2, 67, 3, 2)
    rng = np.random.default_rng(4)
    n_states = 3 if packed else 1  # sequences 0:30, 30:30 (empty), 30:67
    kw["initial_state"] = rng.standard_normal((n_states, 2, 3, 2))
    do, dfinal = rng.standard_normal((1, 2, 67, 2)), rng.standard_normal((n_states, 2, 3, 2))
    results = []
    for put in (np.asarray, cupy.asarray):
        tensors = {n: nk.tensor(put(a), requires_grad=True) for n, a in kw.items()}
        o, final = run(op, tensors, mode=mode, chunk_size=16,
                       cu_seqlens=np.array([0, 30, 30, 67]) if packed else None)
        ((o * nk.tensor(put(do))).sum() + (final * nk.tensor(put(dfinal))).sum()).backward()
        results.append([o.data, final.data, *(tensors[n].grad for n in kw)])
    for name, got, want in zip(("o", "final", *kw), results[1], results[0], strict=True):
        assert isinstance(got, cupy.ndarray), name
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-9, atol=1e-11,
                                   err_msg=name)

if __name__ == "__main__":
    run_simulator_cases({"linear_attention": _cases}, sys.argv[1])
