"""Recurrent layers (Elman RNN, LSTM, GRU): fused kernels vs naive twins, gradcheck, torch.

- kernels (``nnkit.kernels.recurrent``) == per-step twins (``kernels.reference.recurrent``), forward
  and every gradient, hypothesis over T (including 1), batch, sizes, directions, dtypes;
- stacked / bidirectional modules == twins composed layer by layer (hypothesis);
- central differences in float64 through the modules;
- torch.nn.RNN/LSTM/GRU after a state_dict copy: outputs, final states, every parameter
  gradient and the input/initial-state gradients;
- the total hidden-state gradient (``nk.analysis.hidden_gradient_norms``) against torch's
  ``retain_grad`` on a hand-unrolled loop; properties (reverse == flip, vanishing bound);
- bad input: ValueError naming the shapes, and a fuzz of the boundary;
- the persistent CUDA kernels under Numba's simulator (a child process with
  NUMBA_ENABLE_CUDASIM=1, as tests/test_cuda_sim.py) against the CPU route (more shapes,
  modes and launch counts: tests/test_recurrent_persistent.py).
"""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    assert_matches_reference,
    import_torch,
    run_simulator_cases,
    simulator_outcomes,
)
from hypothesis import example, given
from hypothesis import strategies as st

import nnkit as nk
from nnkit._backend import array_module
from nnkit.analysis import hidden_gradient_norms
from nnkit.datasets.sequences import (
    ADDING_BASELINE_MSE,
    adding_problem,
    copy_task,
    copy_task_baseline,
)
from nnkit.kernels import recurrent as K
from nnkit.kernels.reference import recurrent as R
from nnkit.nn.recurrent import GRU, LSTM, RNN, record_hidden_grads

GATES = {"rnn": 1, "lstm": 4, "gru": 3}
MODULES = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}


def _weights(rng, cell, D, H, dtype, bias=True, scale=0.6):
    G = GATES[cell]
    w = [rng.uniform(-scale, scale, s).astype(dtype) for s in ((G * H, D), (G * H, H))]
    b = [rng.uniform(-scale, scale, G * H).astype(dtype) for _ in range(2)] if bias else [
        None, None]
    return w + b


def _run_pair(pairs, cell, x, h0, c0, params, dy, dh, dc, reverse, nonlinearity="tanh"):
    """Forward and backward of ``pairs``' (``K`` or ``R``) pair for ``cell``: outputs, then
    gradients, then the hidden-state gradients of every step, as one list."""
    states, douts = ((h0, c0), (dy, dh, dc)) if cell == "lstm" else ((h0,), (dy, dh))
    kw = {"nonlinearity": nonlinearity} if cell == "rnn" else {}
    outs, cache = getattr(pairs, f"{cell}_forward")(x, *states, *params, reverse=reverse, **kw)
    hidden = array_module(dy).empty(dy.shape, dtype=dy.dtype)
    grads = getattr(pairs, f"{cell}_backward")(douts, cache, hidden_grads=hidden)
    return [*outs, *grads, hidden]


def _run_kernel(*args, **kwargs):
    return _run_pair(K, *args, **kwargs)


def _run_twin(*args, **kwargs):
    return _run_pair(R, *args, **kwargs)


# ---- kernels == twins ----------------------------------------------------------------------

@given(cell=st.sampled_from(["rnn", "lstm", "gru"]), nonlinearity=st.sampled_from(["tanh", "relu"]),
       T=st.integers(1, 6), B=st.integers(1, 11), D=st.integers(1, 4), H=st.integers(1, 37),
       reverse=st.booleans(), bias=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
@example(cell="lstm", nonlinearity="tanh", T=1, B=1, D=1, H=1, reverse=True, bias=False,
         dtype=np.float64, seed=0)  # a single step visited backwards: h0 feeds dW_hh alone
def test_kernels_match_twins(cell, nonlinearity, T, B, D, H, reverse, bias, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, D)).astype(dtype)
    h0, c0, dh, dc = (rng.standard_normal((B, H)).astype(dtype) for _ in range(4))
    dy = rng.standard_normal((T, B, H)).astype(dtype)
    params = _weights(rng, cell, D, H, dtype, bias)
    got = _run_kernel(cell, x, h0, c0, params, dy, dh, dc, reverse, nonlinearity)
    want = _run_twin(cell, x, h0, c0, params, dy, dh, dc, reverse, nonlinearity)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None:  # no bias: no bias gradient
            assert not bias and w is None
            continue
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        assert_matches_reference(g / scale, w / scale, dtype, factor=256 * T,
                                 err_msg=f"{cell} output {i}")


@given(cell=st.sampled_from(["lstm", "gru"]), T=st.integers(1, 6), B=st.integers(1, 11),
       D=st.integers(1, 4), H=st.integers(1, 37), reverse=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_forward_without_cache_is_the_same_forward(cell, T, B, D, H, reverse, dtype, seed):
    """keep_cache=False (one step's gates and cell state held, updated in place) gives
    bit-identical outputs and no cache."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, D)).astype(dtype)
    h0, c0 = (rng.standard_normal((B, H)).astype(dtype) for _ in range(2))
    params = _weights(rng, cell, D, H, dtype)
    states = (h0, c0) if cell == "lstm" else (h0,)
    forward = getattr(K, f"{cell}_forward")
    want, cache = forward(x, *states, *params, reverse=reverse)
    got, no_cache = forward(x, *states, *params, reverse=reverse, keep_cache=False)
    assert no_cache is None and cache is not None
    assert len(got) == len(states) + 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("reverse", [False, True])
def test_backward_computes_only_what_needs_asks_for(cell, reverse, rng):
    """``needs`` (apply_op's mask over the forward's inputs): None where not wanted, the
    others bit-identical to a backward that computes everything; without dx the kernels
    skip its product, without any parameter gradient the weight products."""
    T, B, D, H = 4, 5, 3, 6
    x = rng.standard_normal((T, B, D))
    h0, c0, dh, dc = (rng.standard_normal((B, H)) for _ in range(4))
    dy = rng.standard_normal((T, B, H))
    params = _weights(rng, cell, D, H, np.float64)
    states, douts = ((h0, c0), (dy, dh, dc)) if cell == "lstm" else ((h0,), (dy, dh))
    outs, cache = getattr(K, f"{cell}_forward")(x, *states, *params, reverse=reverse)
    backward = getattr(K, f"{cell}_backward")
    full = backward(douts, cache)
    n = len(full)
    for needs in [(False,) + (True,) * (n - 1), (True,) * (n - 4) + (False,) * 4,
                  (False,) * (n - 4) + (True, False, False, True), (False,) * n]:
        got = backward(douts, cache, needs=needs)
        for i, (g, w, need) in enumerate(zip(got, full, needs, strict=True)):
            if need:
                np.testing.assert_array_equal(g, w, err_msg=f"{needs}: gradient {i}")
            else:
                assert g is None, f"{needs}: gradient {i}"
    with pytest.raises(ValueError, match=rf"needs has 2 entries; {cell}_backward expects {n}"):
        backward(douts, cache, needs=(True, True))
    with pytest.raises(TypeError, match=r"douts must be a tuple \(dy, dh_T.*got ndarray"):
        backward(dy, cache)


def test_output_gradients_given_as_none_are_zeros(rng):
    """douts entries None are zeros: (None, None, None) gives zero gradients, and dh_T alone
    is the gradient of h_T alone."""
    T, B, D, H = 3, 2, 3, 4
    x = rng.standard_normal((T, B, D))
    params = _weights(rng, "lstm", D, H, np.float64)
    _, cache = K.lstm_forward(x, None, None, *params)
    for g in K.lstm_backward((None, None, None), cache):
        assert not g.any()
    dh = rng.standard_normal((B, H))
    got = K.lstm_backward((None, dh, None), cache)
    want = K.lstm_backward((np.zeros((T, B, H)), dh, np.zeros((B, H))), cache)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


_KERNELS = [f"{cell}_{way}_cpu" for cell in GATES for way in ("forward", "backward")]


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("reverse", [False, True])
def test_row_blocks_on_threads_give_identical_results(cell, reverse, monkeypatch):
    """The CPU kernels run blocks of batch rows on separate threads: every split (serial and
    parallel builds, 1-5 blocks, uneven ones) gives bit-identical outputs and gradients."""
    from nnkit._ext import recurrent_cpu

    rng = np.random.default_rng(7)
    T, B, D, H = 5, 13, 3, 9
    x = rng.standard_normal((T, B, D))
    h0, c0, dh, dc = (rng.standard_normal((B, H)) for _ in range(4))
    dy = rng.standard_normal((T, B, H))
    params = _weights(rng, cell, D, H, np.float64)
    results = {}
    for build, blocks in [("serial", 1), ("serial", 3), ("parallel", 2), ("parallel", 5)]:
        for name in _KERNELS:
            kernel = getattr(getattr(recurrent_cpu, name), build)
            monkeypatch.setattr(recurrent_cpu, name,
                                lambda *args, _k=kernel, _n=blocks: _k(*args, _n))
        results[build, blocks] = _run_kernel(cell, x, h0, c0, params, dy, dh, dc, reverse)
        monkeypatch.undo()
    first = results["serial", 1]
    for key, got in results.items():
        for i, (g, w) in enumerate(zip(got, first, strict=True)):
            np.testing.assert_array_equal(g, w, err_msg=f"{key}: output {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_gradients_from_packed_steps_equal_the_products(dtype, monkeypatch):
    """The CPU weight gradients: [x; h_prev]^T (transposed_inputs, both builds, reverse too,
    h_prev at any row offset) times dA given packed (panel tails, one panel, one row),
    serial and parallel builds, the sum over steps in one block or in small ones == the
    plain products, identical to each other; a row of ones gives dA's column sums (the bias
    gradient)."""
    from nnkit._ext import recurrent_cpu
    from nnkit._ext.gemm_cpu import pack_panels

    rng = np.random.default_rng(11)
    for T, B, D, H, GH in [(5, 3, 4, 3, 12), (1, 1, 1, 2, 1), (3, 7, 5, 6, 70)]:
        x = rng.standard_normal((T, B, D)).astype(dtype)
        y, h0 = rng.standard_normal((T, B, H)).astype(dtype), rng.standard_normal((B, H))
        h0 = h0.astype(dtype)
        dA = rng.standard_normal((T * B, GH)).astype(dtype)
        for reverse in (False, True):
            prev = np.concatenate([y[1:], h0[None]]) if reverse else np.concatenate(
                [h0[None], y[:-1]])
            want_at = np.concatenate([x.reshape(T * B, D), prev.reshape(T * B, H)], 1).T
            for build in ("serial", "parallel"):
                at = np.full((D + H + 2, T * B), 7, dtype)
                getattr(recurrent_cpu.transposed_inputs_cpu, build)(
                    x.reshape(T * B, D), y, h0, reverse, at, D + 1)
                got = np.delete(at, [D, D + H + 1], axis=0)
                np.testing.assert_array_equal(got, want_at, err_msg=f"{build} {reverse}")
                assert (at[D] == 7).all() and (at[-1] == 7).all()  # other rows untouched
        at = np.concatenate([want_at, np.ones((1, T * B), dtype)])  # F-ordered, as it comes
        whole = None
        for flops, block in ((0, None), (1 << 62, 256), (0, 2), (1 << 62, 3)):
            # the parallel build, then the serial one; the sum over T B in the machine's
            # block (256 columns on a 512 KiB L2) and in one of 256, then in blocks of 2 and
            # 3 columns (accumulated into the tile between blocks)
            monkeypatch.setattr(recurrent_cpu, "MIN_PARALLEL_FLOPS", flops)
            dw = recurrent_cpu.packed_weight_grads(at, pack_panels(dA), block=block)
            assert dw.shape[1] == D + H + 1 and not dw[GH:].any()  # zero padding rows
            assert_matches_reference(dw[:GH, :-1], (want_at @ dA).T, dtype, factor=4 * T * B,
                                     err_msg=f"product, {T, B, D, H, GH}")
            assert_matches_reference(dw[:GH, -1], dA.astype(np.float64).sum(0).astype(dtype),
                                     dtype, factor=4 * T * B, err_msg="column sums")
            # the same chain of multiply-adds however the sum is blocked or split
            whole = dw if whole is None else whole
            np.testing.assert_array_equal(dw, whole, err_msg=f"blocks of {block}")


@pytest.mark.parametrize("dtype, bound", [
    (np.float32, 2.5),
    pytest.param(np.float64, 3.0, marks=pytest.mark.skipif(
        np.finfo(np.longdouble).nmant <= 52, reason="long double is double here: no "
        "reference more precise than float64")),
])
def test_gate_nonlinearities_are_within_a_few_ulps(dtype, bound):
    """simd_math.act_sigmoid / act_tanh compiled as recurrent_cpu's time loops are
    (``JIT_OPTIONS``, fused multiply-adds allowed), against long-double references: within
    the ulps that the docstrings state, over the range where the results are normal numbers,
    tiny arguments and the limits included; NaN propagates."""
    import numba

    from nnkit._ext import recurrent_cpu, simd_math

    @numba.njit(**recurrent_cpu.JIT_OPTIONS)
    def apply(x, sig, th):
        for i in range(x.size):
            sig[i] = simd_math.act_sigmoid(x[i])
            th[i] = simd_math.act_tanh(x[i])

    half = np.concatenate([np.linspace(0, 87, 400_001), np.geomspace(1e-30, 30, 100_001)])
    x = np.concatenate([half, -half, [np.inf, -np.inf, np.nan]]).astype(dtype)
    sig, th = np.empty_like(x), np.empty_like(x)
    apply(x, sig, th)
    exact = x[:-3].astype(np.longdouble)
    want_sig, want_th = 1 / (1 + np.exp(-exact)), np.tanh(exact)
    normal = want_sig > 4 * np.finfo(dtype).tiny
    for got, want, name in ((sig[:-3][normal], want_sig[normal], "sigmoid"),
                            (th[:-3], want_th, "tanh")):
        ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(dtype))
        assert float(ulps.max()) <= bound, f"{name}: {float(ulps.max()):.2f} ulps"
    # the limits: sigmoid(-inf) is the clamp's value, below the smallest normal number
    assert sig[-3] == 1 and 0 < sig[-2] < np.finfo(dtype).tiny
    assert th[-3] == 1 and th[-2] == -1
    assert np.isnan(sig[-1]) and np.isnan(th[-1])


def test_hidden_grads_are_the_total_state_gradients(rng):
    """The kernels' hidden_grads[t] = dL/dh_t, checked with torch's retain_grad."""
    torch = import_torch()
    T, B, D, H = 5, 2, 3, 4
    x = rng.standard_normal((T, B, D))
    params = _weights(rng, "rnn", D, H, np.float64)
    dy = rng.standard_normal((T, B, H))
    _, cache = K.rnn_forward(x, None, *params)
    hidden = np.empty((T, B, H))
    K.rnn_backward((dy, None), cache, hidden_grads=hidden)
    w_ih, w_hh, b_ih, b_hh = (torch.tensor(p, requires_grad=True) for p in params)
    h, hs = torch.zeros(B, H, dtype=torch.float64), []
    for t in range(T):
        h = torch.tanh(torch.tensor(x[t]) @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        h.retain_grad()
        hs.append(h)
    (torch.stack(hs) * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(hidden, np.stack([h.grad.numpy() for h in hs]), rtol=1e-12,
                               atol=1e-12)


# ---- modules == twins composed layer by layer -----------------------------------------------

def _module_twin(model, x, h0, c0):
    """Stacked / bidirectional layers composed from the per-step twins, (T, B, F) layout."""
    cell = type(model).__name__.lower()
    inp, hs, cs = x, [], []
    for k in range(model.num_layers):
        outs = []
        for d, sfx in enumerate(model._suffixes()):
            idx = k * model.num_directions + d
            params = [p.data for p in model._layer_params(k, sfx)] + (
                [] if model.bias else [None, None])
            if cell == "lstm":
                y, h, c = R.lstm(inp, h0[idx], c0[idx], *params, reverse=d == 1)
                cs.append(c)
            elif cell == "gru":
                y, h = R.gru(inp, h0[idx], *params, reverse=d == 1)
            else:
                y, h = R.rnn(inp, h0[idx], *params, model.nonlinearity, d == 1)
            outs.append(y)
            hs.append(h)
        inp = np.concatenate(outs, axis=-1)
    return inp, np.stack(hs), (np.stack(cs) if cs else None)


@given(mode=st.sampled_from(["RNN", "LSTM", "GRU"]), T=st.integers(1, 5), B=st.integers(1, 3),
       F=st.integers(1, 3), H=st.integers(1, 4), layers=st.integers(1, 3),
       bidirectional=st.booleans(), seed=st.integers(0, 2**16))
def test_stacked_modules_match_composed_twins(mode, T, B, F, H, layers, bidirectional, seed):
    nk.manual_seed(seed)
    model = MODULES[mode](F, H, num_layers=layers, bidirectional=bidirectional,
                          dtype=np.float64)
    rng = np.random.default_rng(seed)
    L = layers * model.num_directions
    x = rng.standard_normal((T, B, F))
    h0, c0 = rng.standard_normal((L, B, H)), rng.standard_normal((L, B, H))
    out = model(x, (h0, c0)) if mode == "LSTM" else model(x, h0)
    y, h, c = _module_twin(model, x, h0, c0)
    np.testing.assert_allclose(out[0].numpy(), y, rtol=1e-12, atol=1e-12)
    h_n = out[1][0] if mode == "LSTM" else out[1]
    np.testing.assert_allclose(h_n.numpy(), h, rtol=1e-12, atol=1e-12)
    if mode == "LSTM":
        np.testing.assert_allclose(out[1][1].numpy(), c, rtol=1e-12, atol=1e-12)
    with nk.no_grad():  # the kernels keep no cache: the same numbers
        inference = model(x, (h0, c0)) if mode == "LSTM" else model(x, h0)
    assert not inference[0].requires_grad
    for got, want in zip(_flat(inference), _flat(out), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _flat(output):
    """(out, h_n) or (out, (h_n, c_n)) -> a list of tensors."""
    out, states = output
    return [out, *(states if isinstance(states, tuple) else [states])]


def test_reverse_direction_is_the_forward_one_on_the_flipped_sequence(rng):
    x = rng.standard_normal((6, 2, 3))
    params = _weights(rng, "gru", 3, 4, np.float64)
    (y_rev, h_rev), _ = K.gru_forward(x, None, *params, reverse=True)
    (y, h), _ = K.gru_forward(x[::-1], None, *params)
    np.testing.assert_allclose(y_rev, y[::-1], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(h_rev, h, rtol=1e-14, atol=1e-14)


# ---- finite differences ------------------------------------------------------------------

@pytest.mark.parametrize("mode,kw", [("RNN", {}), ("RNN", {"nonlinearity": "relu"}),
                                     ("LSTM", {"bidirectional": True}),
                                     ("GRU", {"num_layers": 2, "bias": False})])
def test_gradcheck(mode, kw):
    nk.manual_seed(0)
    model = MODULES[mode](2, 3, dtype=np.float64, **kw)
    rng = np.random.default_rng(1)
    L = model.num_layers * model.num_directions
    x = nk.tensor(rng.standard_normal((4, 2, 2)), requires_grad=True)
    h0 = nk.tensor(rng.standard_normal((L, 2, 3)), requires_grad=True)
    c0 = nk.tensor(rng.standard_normal((L, 2, 3)), requires_grad=True)
    params = list(model.parameters())
    if mode == "LSTM":
        def fn(x, h0, c0, *ps):
            out, (h, c) = model(x, (h0, c0))
            return out, h, c
        inputs = [x, h0, c0, *params]
    else:
        def fn(x, h0, *ps):
            return model(x, h0)
        inputs = [x, h0, *params]
    assert nk.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- torch equivalence -------------------------------------------------------------------

CONFIGS = [
    ("RNN", {}), ("RNN", {"nonlinearity": "relu", "num_layers": 2}),
    ("RNN", {"bidirectional": True, "batch_first": True}),
    ("LSTM", {}), ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"batch_first": True, "bias": False}),
    ("GRU", {}), ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {"bias": False}),
]


def _torch_pair(torch, mode, kw, dtype):
    torch.manual_seed(0)
    tm = getattr(torch.nn, mode)(4, 5, **kw)
    tm = tm.double() if dtype == np.float64 else tm
    nm = MODULES[mode](4, 5, dtype=dtype, **kw)
    nm.load_state_dict(tm.state_dict())
    return tm, nm


def _loss(out, states, lib_sum):
    loss = lib_sum(out * out)
    for k, s in enumerate(states):
        loss = loss + lib_sum(s * (k + 2.0))
    return loss


@pytest.mark.parametrize("given_states", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode,kw", CONFIGS)
def test_matches_torch(mode, kw, dtype, given_states):
    torch = import_torch()
    tm, nm = _torch_pair(torch, mode, kw, dtype)
    rng = np.random.default_rng(2)
    T, B = 7, 3
    x = rng.standard_normal((B, T, 4) if kw.get("batch_first") else (T, B, 4)).astype(dtype)
    L = nm.num_layers * nm.num_directions
    states = [rng.standard_normal((L, B, 5)).astype(dtype) for _ in range(2 if mode == "LSTM"
                                                                            else 1)]
    xt = torch.tensor(x, requires_grad=True)
    xn = nk.tensor(x, requires_grad=True)
    st_t = [torch.tensor(s, requires_grad=True) for s in states]
    st_n = [nk.tensor(s, requires_grad=True) for s in states]
    if mode == "LSTM":
        args_t = (tuple(st_t),) if given_states else ()
        args_n = (tuple(st_n),) if given_states else ()
        out_t, fin_t = tm(xt, *args_t)
        out_n, fin_n = nm(xn, *args_n)
    else:
        out_t, fin_t = tm(xt, *(st_t if given_states else ()))
        out_n, fin_n = nm(xn, *(st_n if given_states else ()))
        fin_t, fin_n = (fin_t,), (fin_n,)
    _loss(out_t, fin_t, torch.sum).backward()
    _loss(out_n, fin_n, lambda a: a.sum()).backward()
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}
    np.testing.assert_allclose(out_n.numpy(), out_t.detach().numpy(), **tol)
    for a, b in zip(fin_n, fin_t, strict=True):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), **tol)
    np.testing.assert_allclose(xn.grad, xt.grad.numpy(), **tol)
    if given_states:
        for a, b in zip(st_n, st_t, strict=True):
            np.testing.assert_allclose(a.grad, b.grad.numpy(), **tol)
    torch_params = dict(tm.named_parameters())
    assert [n for n, _ in nm.named_parameters()] == list(torch_params)
    for name, p in nm.named_parameters():
        np.testing.assert_allclose(p.grad, torch_params[name].grad.numpy(), err_msg=name, **tol)


def test_unbatched_input_matches_torch():
    torch = import_torch()
    tm, nm = _torch_pair(torch, "LSTM", {"num_layers": 2}, np.float64)
    x = np.random.default_rng(3).standard_normal((6, 4))
    out_t, (h_t, c_t) = tm(torch.tensor(x))
    out_n, (h_n, c_n) = nm(x)
    assert out_n.shape == (6, 5) and h_n.shape == (2, 5)
    np.testing.assert_allclose(out_n.numpy(), out_t.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(c_n.numpy(), c_t.detach().numpy(), rtol=1e-12)


def test_parameters_shapes_and_default_init():
    model = GRU(3, 16, num_layers=2, bidirectional=True)
    names = [n for n, _ in model.named_parameters()]
    assert names[:4] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert names[4] == "weight_ih_l0_reverse" and len(names) == 16
    assert model.weight_ih_l1.shape == (48, 32) and model.weight_hh_l1_reverse.shape == (48, 16)
    values = np.concatenate([p.data.ravel() for p in model.parameters()])
    assert values.dtype == np.float32
    assert np.abs(values).max() <= 0.25 and np.abs(values).max() > 0.24  # U(-1/4, 1/4)


# ---- hidden-state gradients --------------------------------------------------------------

def test_hidden_gradient_norms_follow_the_spectral_bound():
    """Loss on the last state: ||dL/dz_t|| <= ||dL/dz_T|| (alpha sigma_1(U))^(T-t)."""
    nk.manual_seed(0)
    T = 30
    rnn = RNN(2, 8, dtype=np.float64)
    rnn.weight_hh_l0.data *= 0.5
    x = np.random.default_rng(0).standard_normal((T, 1, 2))
    norms = hidden_gradient_norms(rnn, x, lambda out: out[0][-1].sum())
    sigma = np.linalg.norm(rnn.weight_hh_l0.data, 2)  # alpha = 1 for tanh
    bound = norms[-1] * sigma ** (T - 1 - np.arange(T))
    assert np.all(norms <= bound * (1 + 1e-9))
    assert norms[0] < 1e-3 * norms[-1]  # vanished
    assert rnn.weight_hh_l0.grad is None  # the model's gradients are left alone


def test_recorded_hidden_grads_are_registered_by_the_forward():
    """A layer run forward inside ``record_hidden_grads`` registers zeros (T, B, H) for
    each layer-direction (no gradient reached it yet); its backward fills them, even when
    it runs after the block, with what the kernels' ``hidden_grads`` give."""
    nk.manual_seed(0)
    lstm = LSTM(3, 4, num_layers=2, bidirectional=True, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((5, 2, 3))
    with record_hidden_grads() as store:
        out, _ = lstm(x)
    assert sorted(store) == [(id(lstm), k, d) for k in range(2) for d in range(2)]
    assert all(g.shape == (5, 2, 4) and not g.any() for g in store.values())
    out[-1].sum().backward()  # a loss on the last step's output, after the block
    top = store[id(lstm), 1, 0]
    assert top[-1].any() and np.all(top[-1] == 1)  # dL/dh_{T-1}: the direct part alone
    assert all(g.any() for g in store.values())
    with record_hidden_grads() as store:
        lstm(x)
    assert all(not g.any() for g in store.values())  # no backward: zeros


def test_hidden_gradient_norms_need_a_recurrent_layer():
    with pytest.raises(TypeError, match="nn.RNN"):
        hidden_gradient_norms(nk.nn.Linear(2, 2), np.zeros((2, 2), np.float32),
                              lambda y: y.sum())


# ---- bad input ---------------------------------------------------------------------------

def test_wrong_feature_size_names_input_size():
    with pytest.raises(ValueError, match=r"input_size=4.*\(T, B, 4\)"):
        LSTM(4, 3)(np.zeros((5, 2, 3), np.float32))


def test_wrong_state_shapes():
    model = LSTM(4, 3, num_layers=2)
    x = np.zeros((5, 2, 4), np.float32)
    good = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(ValueError, match=r"h0 has shape \(1, 2, 3\) but expected \(2, 2, 3\)"):
        model(x, (np.zeros((1, 2, 3), np.float32), good))
    with pytest.raises(ValueError, match=r"c0 has shape \(2, 3, 3\)"):
        model(x, (good, np.zeros((2, 3, 3), np.float32)))
    with pytest.raises(ValueError, match=r"h0 has shape"):
        GRU(4, 3)(x, np.zeros((1, 2, 4), np.float32))


def test_empty_sequence():
    with pytest.raises(ValueError, match=r"\(0, 2, 4\): an empty sequence"):
        RNN(4, 3)(np.zeros((0, 2, 4), np.float32))
    with pytest.raises(ValueError, match="empty sequence"):
        K.lstm_forward(np.zeros((0, 1, 1)), None, None, np.zeros((4, 1)), np.zeros((4, 1)))


def test_bad_hyper_parameters_and_dtypes():
    with pytest.raises(ValueError, match="nonlinearity"):
        RNN(2, 3, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="hidden_size"):
        GRU(2, 0)
    with pytest.raises(TypeError, match="float64"):
        GRU(2, 3)(np.zeros((2, 1, 2)))  # float64 x, float32 parameters
    with pytest.raises(TypeError, match=r"tuple \(h0, c0\)"):
        LSTM(2, 3)(np.zeros((2, 1, 2), np.float32), np.zeros((1, 1, 3), np.float32))


BACKWARD = {"rnn": lambda cache, dy=None: K.rnn_backward((dy, None), cache),
            "lstm": lambda cache, dy=None: K.lstm_backward((dy, None, None), cache),
            "gru": lambda cache, dy=None: K.gru_backward((dy, None), cache)}


def _cache(cell, rng, T=4, B=2, D=3, H=2):
    x = rng.standard_normal((T, B, D))
    params = _weights(rng, cell, D, H, np.float64)
    if cell == "lstm":
        return K.lstm_forward(x, None, None, *params)[-1]
    return getattr(K, f"{cell}_forward")(x, None, *params)[-1]


@pytest.mark.parametrize("cell", list(GATES))
def test_backward_refuses_a_foreign_cache(cell, rng):
    """A cache of another cell, of no forward, or whose arrays do not fit together (a batch
    of 1 saved for a forward of batch 2, float32 weights for float64 x) is named, not read
    out of bounds by the kernels or met with a bare KeyError."""
    backward = BACKWARD[cell]
    for other in GATES:
        if other != cell:
            with pytest.raises(ValueError, match=rf"cache comes from {other}_forward; "
                                                 rf"{cell}_backward needs"):
                backward(_cache(other, rng))
    with pytest.raises(TypeError, match=rf"cache must be the RecurrentCache returned by "
                                        rf"{cell}_forward, got tuple"):
        backward((1, 2))
    cache = _cache(cell, rng)
    cache.saved["y"] = cache.saved["y"][:, :1]
    with pytest.raises(ValueError, match=r"cache.saved\['y'\] must be a float64 array of "
                                         r"shape \(4, 2, 2\) .* got float64 array of shape "
                                         r"\(4, 1, 2\)"):
        backward(cache)
    cache = _cache(cell, rng)
    cache.weight_hh = cache.weight_hh.astype(np.float32)
    with pytest.raises(ValueError, match=r"cache.weight_hh must be a float64 array .* got "
                                         r"float32"):
        backward(cache)
    cache = _cache(cell, rng)
    del cache.saved["y"]
    with pytest.raises(ValueError, match=r"cache.saved\['y'\] must be .* got nothing"):
        backward(cache)
    with pytest.raises(ValueError, match=r"dy has shape \(4, 2, 3\); expected \(4, 2, 2\)"):
        backward(_cache(cell, rng), dy=np.zeros((4, 2, 3)))


@given(mode=st.sampled_from(["RNN", "LSTM", "GRU"]),
       x_shape=st.lists(st.integers(0, 3), min_size=0, max_size=4),
       h_shape=st.lists(st.integers(0, 3), min_size=0, max_size=4),
       layers=st.integers(1, 2), bidirectional=st.booleans(), batch_first=st.booleans())
def test_fuzz_boundary_only_value_or_type_errors(mode, x_shape, h_shape, layers, bidirectional,
                                                  batch_first):
    model = MODULES[mode](2, 3, num_layers=layers, bidirectional=bidirectional,
                          batch_first=batch_first)
    x = np.zeros(x_shape, np.float32)
    h = np.zeros(h_shape, np.float32)
    state = (h, h) if mode == "LSTM" else h
    try:
        out, _ = model(x, state)
    except (ValueError, TypeError):
        return
    assert out.shape[-1] == 3 * model.num_directions


# ---- sequence tasks ------------------------------------------------------------------------

@given(n=st.integers(1, 20), T=st.integers(2, 40), seed=st.integers(0, 2**16))
def test_adding_problem_structure(n, T, seed):
    X, y = adding_problem(n, T, random_state=seed)
    assert X.shape == (n, T, 2) and y.shape == (n,) and X.dtype == np.float32
    markers, values = X[..., 1], X[..., 0]
    assert np.all(markers.sum(axis=1) == 2)
    assert np.all(markers[:, : T // 2].sum(axis=1) == 1)  # one marker in each half
    np.testing.assert_allclose(y, (markers * values).sum(axis=1), rtol=1e-6)
    assert np.all((values >= 0) & (values < 1))
    X2, y2 = adding_problem(n, T, random_state=seed)
    np.testing.assert_array_equal(X, X2)


def test_adding_baseline_is_the_variance_of_the_target():
    _, y = adding_problem(200_000, 10, random_state=0, dtype=np.float64)
    assert abs(np.mean((y - 1.0) ** 2) - ADDING_BASELINE_MSE) < 3e-3


@given(n=st.integers(1, 5), delay=st.integers(1, 12), k=st.integers(1, 9),
       length=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_copy_task_structure(n, delay, k, length, seed):
    X, y = copy_task(n, delay, n_symbols=k, length=length, random_state=seed)
    L = 2 * length + delay
    assert X.shape == y.shape == (n, L)
    np.testing.assert_array_equal(y[:, -length:], X[:, :length])
    assert np.all((X[:, :length] >= 1) & (X[:, :length] <= k))
    assert np.all(X[:, length + delay - 1] == k + 1)
    assert np.all(y[:, : length + delay] == 0)
    assert copy_task_baseline(delay, k, length) == pytest.approx(length * np.log(k) / L)


@pytest.mark.parametrize("call, error", [
    (lambda: adding_problem(0, 10), ValueError), (lambda: adding_problem(5, 1), ValueError),
    (lambda: adding_problem(5, 10.0), TypeError), (lambda: adding_problem(5, 10, dtype=int),
                                                   TypeError),
    (lambda: copy_task(5, 0), ValueError), (lambda: copy_task(5, 3, n_symbols=0), ValueError),
])
def test_sequence_task_arguments(call, error):
    with pytest.raises(error):
        call()


# ---- CUDA kernels under the simulator -----------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
SIM_SHAPES = [(1, 1, 1, 1), (3, 2, 3, 5), (2, 3, 2, 9)]  # (T, B, D, H); H 9 > 2 threads of 4


def _case_gpu_route():
    """The GPU route (one persistent CUDA launch per pass, ``recurrent_cuda.*_gpu``) through
    the public kernels, against the CPU route on the same arrays: outputs and all gradients;
    small blocks (4 threads, 2 rows) with ReLU, default blocks with tanh."""
    from helpers import assert_matches_reference

    from nnkit._backend import numpy_on_gpu_route
    from nnkit._ext import recurrent_cuda

    rng = np.random.default_rng(5)
    for small in (True, False):
        recurrent_cuda.threads, recurrent_cuda.max_blocks = (4, 2) if small else (256, 128)
        for (T, B, D, H), dtype, cell, reverse in itertools.product(
                SIM_SHAPES, (np.float32, np.float64), ("rnn", "lstm", "gru"), (False, True)):
            x = rng.standard_normal((T, B, D)).astype(dtype)
            h0, c0, dh, dc = (rng.standard_normal((B, H)).astype(dtype) for _ in range(4))
            dy = rng.standard_normal((T, B, H)).astype(dtype)
            params = _weights(rng, cell, D, H, dtype)
            args = (cell, x, h0, c0, params, dy, dh, dc, reverse, "relu" if small else "tanh")
            want = _run_kernel(*args)
            with numpy_on_gpu_route():  # NumPy arrays down the GPU route
                got = _run_kernel(*args)
            msg = f"{cell} {(T, B, D, H)} {np.dtype(dtype).name} reverse={reverse}"
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_matches_reference(g, w, dtype, factor=64, err_msg=f"output {i} {msg}")
            hidden = [_hidden_grads(cell, x, h0, c0, params, dy, reverse)]
            with numpy_on_gpu_route():
                hidden.append(_hidden_grads(cell, x, h0, c0, params, dy, reverse))
            assert_matches_reference(hidden[1], hidden[0], dtype, factor=64,
                                     err_msg=f"hidden_grads {msg}")


def _hidden_grads(cell, x, h0, c0, params, dy, reverse):
    """The kernels' hidden_grads output (the total dL/dh_t of every step)."""
    hidden = np.empty(dy.shape, dy.dtype)
    states = (h0, c0) if cell == "lstm" else (h0,)
    _, cache = getattr(K, f"{cell}_forward")(x, *states, *params, reverse=reverse)
    getattr(K, f"{cell}_backward")((dy,) + (None,) * len(states), cache, hidden_grads=hidden)
    return hidden


def _case_needs_on_gpu_route():
    """The GPU route's backward honours ``needs`` as the CPU's: None where not wanted (the
    dx and weight GEMMs skipped), the rest identical to a backward computing everything."""
    from nnkit._backend import numpy_on_gpu_route

    rng = np.random.default_rng(6)
    T, B, D, H = 3, 2, 2, 3
    x = rng.standard_normal((T, B, D))
    for cell in GATES:
        params = _weights(rng, cell, D, H, np.float64)
        states = (None, None) if cell == "lstm" else (None,)
        with numpy_on_gpu_route():
            outs, cache = getattr(K, f"{cell}_forward")(x, *states, *params)
            douts = tuple(rng.standard_normal(o.shape) for o in outs)
            backward = getattr(K, f"{cell}_backward")
            full = backward(douts, cache)
            n = len(full)
            for needs in [(False,) + (True,) * (n - 1), (True,) * (n - 4) + (False,) * 4]:
                for g, w, need in zip(backward(douts, cache, needs=needs), full, needs,
                                      strict=True):
                    assert (g is None) != need, (cell, needs)
                    if need:
                        np.testing.assert_array_equal(g, w, err_msg=f"{cell} {needs}")


SIM_CASES = {"gpu_route_through_time": _case_gpu_route,
             "needs_on_gpu_route": _case_needs_on_gpu_route}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_rnn"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_cuda_cells_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


@pytest.mark.cuda
@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(128, 32, 64, 128), (7, 3, 5, 33)])
@pytest.mark.parametrize("reverse", [False, True])
def test_public_kernels_on_gpu_match_cpu(cell, dtype, shape, reverse):
    """The recurrent kernels on CuPy arrays (real GPU) against the CPU route: outputs,
    final states and every gradient."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(11)
    T, B, D, H = shape
    x = rng.standard_normal((T, B, D)).astype(dtype)
    h0, c0, dh, dc = (rng.standard_normal((B, H)).astype(dtype) for _ in range(4))
    dy = rng.standard_normal((T, B, H)).astype(dtype)
    params = _weights(rng, cell, D, H, dtype, scale=1 / np.sqrt(H))
    want = _run_kernel(cell, x, h0, c0, params, dy, dh, dc, reverse)
    on_gpu = [cupy.asarray(v) for v in (x, h0, c0)]
    got = _run_kernel(cell, *on_gpu, [cupy.asarray(p) for p in params], cupy.asarray(dy),
                      cupy.asarray(dh), cupy.asarray(dc), reverse)
    # weight gradients sum T*B terms of size ~100 that cancel: tolerances are relative to the
    # largest entry of each output (float64 GPU/CPU summation orders differ by ~1e-13 of it)
    tol = 4 * T * np.finfo(dtype).eps
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=tol, atol=tol * np.abs(w).max(),
                                   err_msg=f"output {i} of {cell} {shape}")


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
