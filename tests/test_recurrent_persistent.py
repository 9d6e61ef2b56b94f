"""The persistent recurrent kernels (``nnkit._ext.recurrent_cuda``): one launch per pass.

- Under Numba's CUDA simulator (a child process, as tests/test_recurrent.py): RNN (tanh and
  ReLU), LSTM and GRU forward and backward on the GPU route equal the CPU kernels and the
  naive twins (``nnkit.kernels.reference.recurrent``): outputs, final states, every gradient
  and the hidden-state gradients, over T in {1, 4, 32}, B in {1, 3}, H in {1, 5, 8}, D in
  {2, 3}, both directions, with and without biases, float32 and float64, in the three
  memory plans (state and W_hh in shared memory; W_hh from global memory; both global),
  with blocks of 4 threads over tiles of 2 rows (a partial tile at B = 3, several items per
  thread); each pass is exactly one launch.
- On a GPU, or the CuPy stand-in under the simulator (``cuda``; tests/test_gpu_stand_in.py):
  the launches of a forward and of a backward are the same at T = 4 and T = 32 and pinned,
  and on the stand-in so are the host's matrix products and all its device operations (the
  per-step loop made T launches and T GEMMs).
"""

import collections
import itertools
import sys

import numpy as np
import pytest
from helpers import assert_matches_reference, run_simulator_cases, simulator_outcomes

from nnkit.kernels import recurrent as K
from nnkit.kernels.reference import recurrent as R

GATES = {"rnn": 1, "lstm": 4, "gru": 3}
# (T, B, D, H): each cell meets every shape once, each (dtype, reverse, bias) once
SHAPES = [(1, 1, 2, 1), (4, 3, 3, 5), (32, 3, 2, 8), (4, 1, 3, 8), (32, 1, 2, 5),
          (1, 3, 3, 5), (4, 3, 2, 1), (32, 3, 3, 1)]
PLANS = ("on chip", "W_hh global", "all global")


def _weights(rng, cell, D, H, dtype, bias):
    G = GATES[cell]
    w = [rng.uniform(-0.6, 0.6, s).astype(dtype) for s in ((G * H, D), (G * H, H))]
    b = [rng.uniform(-0.6, 0.6, G * H).astype(dtype) for _ in range(2)] if bias else [
        None, None]
    return w + b


def _kernels(cell, x, h0, c0, params, dy, dh, dc, reverse, nonlinearity):
    """Outputs, gradients and hidden_grads of the public kernels, and the launches of the
    forward and of the backward."""
    from nnkit._ext._launch import count_launches

    states, douts = ((h0, c0), (dy, dh, dc)) if cell == "lstm" else ((h0,), (dy, dh))
    kw = {"nonlinearity": nonlinearity} if cell == "rnn" else {}
    hidden = np.empty(dy.shape, dy.dtype)
    with count_launches() as fwd:
        outs, cache = getattr(K, f"{cell}_forward")(x, *states, *params, reverse=reverse, **kw)
    with count_launches() as bwd:
        grads = getattr(K, f"{cell}_backward")(douts, cache, hidden_grads=hidden)
    return [*outs, *grads, hidden], dict(fwd), dict(bwd)


def _twin(cell, x, h0, c0, params, dy, dh, dc, reverse, nonlinearity):
    states, douts = ((h0, c0), (dy, dh, dc)) if cell == "lstm" else ((h0,), (dy, dh))
    kw = {"nonlinearity": nonlinearity} if cell == "rnn" else {}
    outs, cache = getattr(R, f"{cell}_forward")(x, *states, *params, reverse=reverse, **kw)
    return [*outs, *getattr(R, f"{cell}_backward")(douts, cache)]


def _planned(plan, plans_seen):
    """``recurrent_cuda._plan`` with the shared-memory limit that gives ``plan``."""
    from nnkit._ext import recurrent_cuda as rc

    original = rc._plan

    def planned(B, state_per_row, w, items_per_row):
        rows = -(-B // rc.max_blocks)
        rc.shared_limit = {"on chip": 48 * 1024, "W_hh global": w.itemsize * state_per_row * rows,
                           "all global": 0}[plan]
        out = original(B, state_per_row, w, items_per_row)
        _, w_on_chip, state_on_chip, _ = out[3]
        plans_seen.append({(True, True): "on chip", (False, True): "W_hh global",
                           (False, False): "all global"}[w_on_chip, state_on_chip])
        return out

    return original, planned


def _close(got, want, dtype, factor, bias, msg):
    """got == want within ``factor`` ulps of their largest entry (at least 1); no bias, no
    bias gradients (None)."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None or w is None:
            assert not bias and g is None and w is None, f"output {i} {msg}"
            continue
        scale = max(1.0, float(np.abs(w).max()))
        assert_matches_reference(g / scale, w / scale, dtype, factor=factor,
                                  err_msg=f"output {i} {msg}")


def _case_cells(cell):
    def case():
        from nnkit._backend import numpy_on_gpu_route
        from nnkit._ext import recurrent_cuda as rc

        rng = np.random.default_rng(23)
        saved = (rc.threads, rc.max_blocks, rc.shared_limit)
        rc.threads, rc.max_blocks = 4, 2  # tiles of 2 rows: B = 3 leaves a partial one
        combos = list(itertools.product((np.float32, np.float64), (False, True),
                                        (True, False)))
        offset = list(GATES).index(cell) * 3
        try:
            for i, (dtype, reverse, bias) in enumerate(combos):
                T, B, D, H = SHAPES[(i + offset) % len(SHAPES)]
                plan = PLANS[(i + offset) % len(PLANS)]
                nonlinearity = "relu" if cell == "rnn" and i % 2 else "tanh"
                x = rng.standard_normal((T, B, D)).astype(dtype)
                h0, c0, dh, dc = (rng.standard_normal((B, H)).astype(dtype) for _ in range(4))
                dy = rng.standard_normal((T, B, H)).astype(dtype)
                args = (cell, x, h0, c0, _weights(rng, cell, D, H, dtype, bias), dy, dh, dc,
                        reverse, nonlinearity)
                want, *_ = _kernels(*args)
                seen = []
                original, rc._plan = _planned(plan, seen)
                try:
                    with numpy_on_gpu_route():  # NumPy arrays down the GPU route
                        got, fwd, bwd = _kernels(*args)
                finally:
                    rc._plan = original
                msg = (f"{cell} {nonlinearity} (T, B, D, H)={(T, B, D, H)} "
                       f"{np.dtype(dtype).name} reverse={reverse} bias={bias} {plan}")
                assert seen == [plan, plan], f"{seen} {msg}"
                name = f"recurrent_cuda._{cell}_seq_"
                assert (fwd, bwd) == ({name + "fwd": 1}, {name + "bwd": 1}), msg
                _close(got, want, dtype, 16 * T + 32, bias, f"vs the CPU kernels: {msg}")
                _close(got[:-1], _twin(*args), dtype, 256 * T, bias, f"vs the twins: {msg}")
        finally:
            rc.threads, rc.max_blocks, rc.shared_limit = saved

    return case


SIM_CASES = {f"{cell}_matches_cpu_and_twins": _case_cells(cell) for cell in GATES}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_persistent"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_persistent_kernels_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


# ---- launches per pass, on a GPU or the CuPy stand-in ------------------------------------------

def _device_op_counter(cupy, monkeypatch):
    """On the stand-in, a Counter of the host's device operations ("matmul" and "other":
    ufuncs, operators, CuPy functions and array methods); None on real CuPy."""
    if not cupy.__version__.endswith("stand-in"):
        return None
    ops = collections.Counter()
    ufunc, device_function = cupy.ndarray.__array_ufunc__, cupy._device_function

    def counted_ufunc(self, uf, method, *args, **kwargs):
        ops["matmul" if uf is np.matmul else "other"] += 1
        return ufunc(self, uf, method, *args, **kwargs)

    def counted_function(fn):
        run = device_function(fn)

        def counted(*args, **kwargs):
            ops["matmul" if fn is np.matmul else "other"] += 1
            return run(*args, **kwargs)
        return counted

    monkeypatch.setattr(cupy.ndarray, "__array_ufunc__", counted_ufunc)
    monkeypatch.setattr(cupy, "_device_function", counted_function)
    return ops


@pytest.mark.cuda
def test_persistent_launches_do_not_grow_with_T(monkeypatch):
    """One forward and one backward of each cell at T = 4 and T = 32: one launch each
    (pinned), and on the stand-in the same matrix products (the input projection; dx, dW_ih
    and dW_hh in two) and device operations at both lengths."""
    cupy = pytest.importorskip("cupy")
    from nnkit._ext._launch import count_launches

    ops = _device_op_counter(cupy, monkeypatch)
    rng = np.random.default_rng(0)
    B, D, H = 3, 2, 5
    per_T = {}

    def randn(*shape):
        return cupy.asarray(rng.standard_normal(shape).astype(np.float32))

    for cell, G in GATES.items():
        for T in (4, 32):
            x, dy = randn(T, B, D), randn(T, B, H)
            w = [randn(G * H, D), randn(G * H, H), randn(G * H), randn(G * H)]
            states = (None, None) if cell == "lstm" else (None,)
            counts = []
            for run in ("forward", "backward"):
                if ops is not None:
                    ops.clear()
                with count_launches() as launches:
                    if run == "forward":
                        _, cache = getattr(K, f"{cell}_forward")(x, *states, *w)
                    else:
                        getattr(K, f"{cell}_backward")((dy, *states), cache)
                counts.append((dict(launches), None if ops is None else dict(ops)))
            per_T[cell, T] = counts
        name = f"recurrent_cuda._{cell}_seq_"
        assert [c[0] for c in per_T[cell, 4]] == [{name + "fwd": 1}, {name + "bwd": 1}], cell
        assert per_T[cell, 4] == per_T[cell, 32], (cell, per_T[cell, 4], per_T[cell, 32])
        if ops is not None:
            assert [c[1]["matmul"] for c in per_T[cell, 4]] == [1, 4], (cell, per_T[cell, 4])


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
