"""nk.optim: torch.optim equivalence, the formulas of notes §3.2-3.3, state_dict resumption,
gradient clipping and hyper-parameter validation.

Tests that need torch call ``import_torch()`` (they skip without it); the rest run on NumPy
alone: the heavy ball's closed form, Adam's first step, the sufficient-decrease inequality
of gradient descent, state_dict round trips, clip_grad_norm_ by hand, error messages.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from helpers import import_torch, tolerance
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nnkit as nk
from nnkit import optim

SHAPES = [(3, 4), (5,), (2, 3, 2), ()]
STEPS = 12


# ----- a torch-free twin of the update loop -------------------------------------------------
def _params(rng, dtype, shapes=SHAPES):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _grad_sequence(rng, dtype, steps=STEPS, shapes=SHAPES):
    """Random gradients; parameter 1 has no gradient on every third step (it is skipped)."""
    seq = []
    for t in range(steps):
        seq.append([None if (i == 1 and t % 3 == 2) else
                    rng.standard_normal(s).astype(dtype) for i, s in enumerate(shapes)])
    return seq


def _group_specs(n_params, groups):
    """Parameter groups as (indices, options); None: one group of everything."""
    return [(list(range(n_params)), {})] if groups is None else groups


def _run_nnkit(cls, kwargs, init, grads, groups=None, halve_lr_at=6):
    params = [nk.nn.Parameter(a.copy()) for a in init]
    specs = _group_specs(len(params), groups)
    arg = [{"params": [params[i] for i in idx], **opts} for idx, opts in specs]
    opt = cls(arg if groups is not None else params, **kwargs)
    for t, gs in enumerate(grads):
        if t == halve_lr_at:  # an lr schedule edits the groups
            for group in opt.param_groups:
                group["lr"] *= 0.5
        for p, g in zip(params, gs, strict=True):
            p.grad = None if g is None else g.copy()
        opt.step()
    return [p.data for p in params], opt


def _run_torch(torch_cls, kwargs, init, grads, groups=None, halve_lr_at=6):
    torch = import_torch()
    params = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
    specs = _group_specs(len(params), groups)
    arg = [{"params": [params[i] for i in idx], **opts} for idx, opts in specs]
    opt = torch_cls(arg if groups is not None else params, **kwargs, foreach=False)
    for t, gs in enumerate(grads):
        if t == halve_lr_at:
            for group in opt.param_groups:
                group["lr"] *= 0.5
        for p, g in zip(params, gs, strict=True):
            p.grad = None if g is None else torch.from_numpy(g.copy())
        opt.step()
    return [p.detach().numpy() for p in params], opt


def _assert_params_close(actual, expected, dtype, factor=64.0):
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_allclose(a, e, **tolerance(dtype, factor))


# ----- torch equivalence ------------------------------------------------------------------
SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    {"lr": 0.05, "momentum": 0.8, "nesterov": True},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05, "maximize": True},
    {"lr": 0.1, "maximize": True, "weight_decay": 0.2},
]
ADAGRAD_CASES = [
    {"lr": 0.1},
    {"lr": 0.1, "lr_decay": 0.05},
    {"lr": 0.1, "weight_decay": 0.1, "initial_accumulator_value": 0.5},
    {"lr": 0.1, "eps": 1e-6, "maximize": True, "lr_decay": 0.01},
]
ADAM_CASES = [
    {"lr": 0.01},
    {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6},
    {"lr": 0.01, "amsgrad": True},
    {"lr": 0.01, "weight_decay": 0.1},
    {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "maximize": True},
    {"lr": 0.01, "betas": (0.3, 0.5)},  # 1 - beta1 >= 0.5: torch's other lerp branch
    {"lr": 0.01, "betas": (0.0, 0.0)},
]
ADAMW_CASES = [
    {"lr": 0.01},
    {"lr": 0.01, "weight_decay": 0.3, "amsgrad": True},
    {"lr": 0.01, "weight_decay": 0.1, "maximize": True, "betas": (0.5, 0.9)},
]


def _cases():
    for kw in SGD_CASES:
        yield "SGD", kw
    for kw in ADAGRAD_CASES:
        yield "Adagrad", kw
    for kw in ADAM_CASES:
        yield "Adam", kw
    for kw in ADAMW_CASES:
        yield "AdamW", kw


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("name", "kwargs"), list(_cases()),
                         ids=[f"{n}-{kw}" for n, kw in _cases()])
def test_matches_torch(name, kwargs, dtype):
    torch = import_torch()
    rng = np.random.default_rng(zlib.crc32(f"{name}{kwargs}".encode()))
    init, grads = _params(rng, dtype), _grad_sequence(rng, dtype)
    ours, _ = _run_nnkit(getattr(optim, name), kwargs, init, grads)
    theirs, _ = _run_torch(getattr(torch.optim, name), kwargs, init, grads)
    _assert_params_close(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kwargs", [ADAM_CASES[4], ADAMW_CASES[1], ADAM_CASES[5]])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_array_path_matches_torch(name, kwargs, dtype, monkeypatch):
    """The ufunc path (CuPy's, and the debugging path) against torch, kernel switched off."""
    torch = import_torch()
    monkeypatch.setattr(optim, "_USE_NUMBA", False)
    rng = np.random.default_rng(7)
    init, grads = _params(rng, dtype), _grad_sequence(rng, dtype)
    ours, _ = _run_nnkit(getattr(optim, name), kwargs, init, grads)
    theirs, _ = _run_torch(getattr(torch.optim, name), kwargs, init, grads)
    _assert_params_close(ours, theirs, dtype)


GROUPS = [([0, 2], {"lr": 0.03}), ([1, 3], {"weight_decay": 0.2})]
GROUP_CASES = [
    ("SGD", {"lr": 0.1, "momentum": 0.9},
     [([0, 2], {"lr": 0.03, "nesterov": True}), ([1, 3], {"dampening": 0.5})]),
    # (not a per-group initial_accumulator_value: torch reads the constructor's, see Adagrad)
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.2},
     [([0, 2], {"lr_decay": 0.1}), ([1, 3], {"weight_decay": 0.2, "eps": 1e-6})]),
    ("Adam", {"lr": 0.01}, [([0, 2], {"amsgrad": True, "betas": (0.7, 0.9)}),
                            ([1, 3], {"weight_decay": 0.2, "maximize": True})]),
    ("AdamW", {"lr": 0.01}, GROUPS),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("name", "kwargs", "groups"), GROUP_CASES,
                         ids=[c[0] for c in GROUP_CASES])
def test_param_groups_match_torch(name, kwargs, groups, dtype):
    torch = import_torch()
    rng = np.random.default_rng(3)
    init, grads = _params(rng, dtype), _grad_sequence(rng, dtype)
    ours, opt = _run_nnkit(getattr(optim, name), kwargs, init, grads, groups)
    theirs, topt = _run_torch(getattr(torch.optim, name), kwargs, init, grads, groups)
    _assert_params_close(ours, theirs, dtype)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam", "AdamW"])
def test_complex_parameters_match_torch(name):
    torch = import_torch()
    rng = np.random.default_rng(11)
    shapes = [(3, 2), (4,)]

    def draw():
        return [rng.standard_normal(s) + 1j * rng.standard_normal(s) for s in shapes]

    init = draw()
    grads = [draw() for _ in range(STEPS)]
    kwargs = {"lr": 0.05, "weight_decay": 0.1}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    ours, _ = _run_nnkit(getattr(optim, name), kwargs, init, grads)
    theirs, _ = _run_torch(getattr(torch.optim, name), kwargs, init, grads)
    _assert_params_close(ours, theirs, np.complex128)


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam"])
def test_torch_state_dict_loads_and_resumes(name):
    """5 torch steps, torch's state_dict into nnkit, 5 more steps each: the same parameters."""
    torch = import_torch()
    rng = np.random.default_rng(5)
    init, grads = _params(rng, np.float64), _grad_sequence(rng, np.float64, steps=10)
    kwargs = {"lr": 0.05, "momentum": 0.9} if name == "SGD" else {"lr": 0.05}
    if name == "Adam":
        kwargs["amsgrad"] = True
    _, topt = _run_torch(getattr(torch.optim, name), kwargs, init, grads[:5], halve_lr_at=-1)
    resumed = [nk.nn.Parameter(p.detach().numpy().copy())
               for p in topt.param_groups[0]["params"]]
    opt = getattr(optim, name)(resumed, **kwargs)
    opt.load_state_dict(topt.state_dict())
    for gs in grads[5:]:
        for p, g in zip(resumed, gs, strict=True):
            p.grad = None if g is None else g.copy()
        opt.step()
    theirs, _ = _run_torch(getattr(torch.optim, name), kwargs, init, grads, halve_lr_at=-1)
    _assert_params_close([p.data for p in resumed], theirs, np.float64)


# ----- notes §3.2-3.3, without torch -------------------------------------------------------
@given(beta=st.floats(0.0, 0.99), eta=st.floats(1e-3, 1.0),
       delta=hnp.arrays(np.float64, 4, elements=st.floats(-3, 3)),
       steps=st.integers(1, 25))
def test_heavy_ball_constant_gradient_closed_form(beta, eta, delta, steps):
    """On a constant gradient delta the step after t updates is -eta (sum_{tau<t} beta^tau) delta.

    (Notes §3.3 prints the sum from tau = 1 to t - 1; the plain gradient step tau = 0 belongs to
    it: with theta_{-1} = theta_0 the first step is -eta delta.)
    """
    theta = nk.nn.Parameter(np.zeros(4))
    opt = optim.SGD([theta], lr=eta, momentum=beta)
    previous = theta.data.copy()
    for t in range(1, steps + 1):
        theta.grad = delta.copy()
        opt.step()
        expected_step = -eta * sum(beta**tau for tau in range(t)) * delta
        np.testing.assert_allclose(theta.data - previous, expected_step, rtol=1e-10, atol=1e-12)
        previous = theta.data.copy()


def test_heavy_ball_is_the_notes_two_term_recurrence(rng):
    """theta_{t+1} = theta_t - eta grad h(theta_t) + beta (theta_t - theta_{t-1}), theta_{-1} =
    theta_0, on a quadratic (a non-constant gradient): torch's buffer form is the same."""
    A = rng.standard_normal((5, 5))
    A = A @ A.T / 5
    b = rng.standard_normal(5)
    eta, beta = 0.1, 0.8
    theta = nk.nn.Parameter(rng.standard_normal(5))
    opt = optim.SGD([theta], lr=eta, momentum=beta)
    cur = theta.data.copy()
    prev = cur.copy()
    for _ in range(30):
        theta.grad = A @ theta.data - b
        opt.step()
        cur, prev = cur - eta * (A @ cur - b) + beta * (cur - prev), cur
        np.testing.assert_allclose(theta.data, cur, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_first_step_is_lr_times_sign(cls, dtype, rng):
    """m_1 / sqrt(v_1) after bias correction is g / |g|: the first step is -lr sign(g)."""
    g = (rng.uniform(0.1, 10, size=(6, 3)) * rng.choice([-1, 1], size=(6, 3))).astype(dtype)
    g[0, 0] = 0  # a zero gradient does not move its coordinate
    theta = nk.nn.Parameter(rng.standard_normal((6, 3)).astype(dtype))
    before = theta.data.copy()
    opt = cls([theta], lr=0.01, weight_decay=0)
    theta.grad = g
    opt.step()
    np.testing.assert_allclose(theta.data - before, -0.01 * np.sign(g),
                               rtol=1e-5, atol=10 * float(np.finfo(dtype).eps))
    assert theta.data.dtype == np.dtype(dtype)


@st.composite
def _quadratics(draw):
    n = draw(st.integers(1, 5))
    elements = st.floats(-2, 2, allow_subnormal=False)
    M = draw(hnp.arrays(np.float64, (n, n), elements=elements))
    A = M.T @ M  # symmetric positive semi-definite
    b = draw(hnp.arrays(np.float64, n, elements=st.floats(-3, 3, allow_subnormal=False)))
    theta0 = draw(hnp.arrays(np.float64, n, elements=st.floats(-3, 3, allow_subnormal=False)))
    return A, b, theta0


@given(problem=_quadratics())
def test_gradient_descent_sufficient_decrease(problem):
    """Notes §3.2: on an L-smooth h, gradient descent with eta = 1/L decreases h by at
    least ||grad h||^2 / (2L) per step. Gradients by nnkit autograd, end to end."""
    A, b, theta0 = problem
    L = float(np.linalg.eigvalsh(A).max())
    assume(L > 1e-3)
    theta = nk.nn.Parameter(theta0.copy())
    A_t, b_t = nk.tensor(A), nk.tensor(b)
    opt = optim.SGD([theta], lr=1.0 / L)

    def h_and_grad():
        opt.zero_grad()
        h = 0.5 * (theta * (A_t @ theta)).sum() - (b_t * theta).sum()
        h.backward()
        return h.item(), theta.grad.copy()

    h, grad = h_and_grad()
    for _ in range(8):
        np.testing.assert_allclose(grad, A @ theta.data - b, rtol=1e-9, atol=1e-9)
        opt.step()
        h_next, grad_next = h_and_grad()
        decrease = float(grad @ grad) / (2 * L)
        slack = 1e-9 * (1 + abs(h) + decrease)
        assert h_next <= h - decrease + slack, (h_next, h, decrease)
        h, grad = h_next, grad_next


# ----- notes §3.2 on least squares: h(theta) = ||X theta - y||^2 / (2n) ----------------------
def _least_squares(seed=0, n=60, d=5, condition=10.0):
    """X (n, d) with singular values spread so that L / mu = ``condition`` (H = X^T X / n),
    y = X theta_true + noise (so h* > 0), theta* by nk.classic.LinearRegression, theta_0."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    X = U * np.sqrt(n * np.geomspace(1.0, condition, d)) @ V.T  # eigenvalues of H: 1..cond
    y = X @ rng.standard_normal(d) + 0.3 * rng.standard_normal(n)
    H = X.T @ X / n
    eig = np.linalg.eigvalsh(H)
    theta_star = nk.classic.LinearRegression(fit_intercept=False).fit(X, y).coef_
    return X, y, float(eig.max()), float(eig.min()), theta_star, 3.0 * rng.standard_normal(d)


def _gradient_descent(X, y, theta0, eta, steps):
    """nk.optim.SGD (no momentum) on h with nnkit autograd: (h_t, grad_t) for t = 0..steps."""
    theta = nk.nn.Parameter(theta0.copy())
    X_t, y_t, n = nk.tensor(X), nk.tensor(y), len(y)
    opt = optim.SGD([theta], lr=eta)
    hs, grads = [], []
    for t in range(steps + 1):
        opt.zero_grad()
        r = X_t @ theta - y_t
        h = (r * r).sum() / (2 * n)
        h.backward()
        hs.append(h.item())
        grads.append(theta.grad.copy())
        if t < steps:
            opt.step()
    return np.array(hs), np.array(grads)


def _h(X, y, theta):
    r = X @ theta - y
    return float(r @ r) / (2 * len(y))


def test_section_3_2_least_squares_sufficient_decrease_at_eta_one_over_L():
    """Notes §3.2: at eta = 1/L, h(theta_{t+1}) <= h(theta_t) - ||grad h(theta_t)||^2 / (2L),
    with L = lambda_max(X^T X / n); the gradients are nnkit autograd's, checked against
    X^T (X theta - y) / n."""
    X, y, L, _mu, _star, theta0 = _least_squares()
    hs, grads = _gradient_descent(X, y, theta0, 1.0 / L, 40)
    theta = theta0.copy()
    for t in range(40):
        np.testing.assert_allclose(grads[t], X.T @ (X @ theta - y) / len(y), rtol=1e-10,
                                   atol=1e-12)
        theta = theta - grads[t] / L
        decrease = float(grads[t] @ grads[t]) / (2 * L)
        assert hs[t + 1] <= hs[t] - decrease + 1e-12 * (1 + hs[t]), t


def test_lemma_3_4_pl_inequality_and_the_one_minus_mu_over_L_rate():
    """Definition 3.3 and Lemma 3.4: least squares with H = X^T X / n of full rank is mu-PL with
    mu = lambda_min(H), and gradient descent at eta = 1/L keeps
    h(theta_t) - h* <= (1 - mu/L)^t (h(theta_0) - h*). On a quadratic the rate is in fact the
    square, (1 - mu/L)^(2t): the error along H's smallest eigenvector shrinks by 1 - mu/L per
    step and h - h* is quadratic in the error; the measured per-step ratio approaches it."""
    X, y, L, mu, theta_star, theta0 = _least_squares()
    h_star = _h(X, y, theta_star)
    T = 80
    hs, grads = _gradient_descent(X, y, theta0, 1.0 / L, T)
    gap = hs - h_star
    assert gap[0] > 1.0
    half_sq_grad = 0.5 * (grads * grads).sum(axis=1)
    assert (half_sq_grad >= mu * gap - 1e-12).all()  # the PL inequality at every iterate
    t = np.arange(T + 1)
    rate = 1 - mu / L
    assert (gap <= rate ** t * gap[0] * (1 + 1e-9) + 1e-12).all()  # Lemma 3.4
    assert (gap <= rate ** (2 * t) * gap[0] * (1 + 1e-9) + 1e-12).all()  # the sharper rate
    np.testing.assert_allclose(gap[T] / gap[T - 1], rate ** 2, rtol=1e-3)


def test_lemma_3_2_steps_to_an_epsilon_critical_point():
    """Lemma 3.2: at eta = 1/L gradient descent reaches ||grad h|| <= epsilon within
    T = 2L (h(theta_0) - h*) / epsilon^2 steps. Its proof's sum form holds at every T:
    sum_{t<T} ||grad h(theta_t)||^2 <= 2L (h(theta_0) - h(theta_T))."""
    X, y, L, _mu, theta_star, theta0 = _least_squares(seed=1, condition=50.0)
    h_star = _h(X, y, theta_star)
    hs, grads = _gradient_descent(X, y, theta0, 1.0 / L, 400)
    norms = np.linalg.norm(grads, axis=1)
    for eps in (3.0, 1.0, 0.3, 0.1, 0.03):
        bound = 2 * L * (hs[0] - h_star) / eps**2
        first = int(np.argmax(norms <= eps))
        assert norms[first] <= eps and first <= bound, (eps, first, bound)
    cumulative = np.cumsum(norms[:-1] ** 2)  # sum over t < T, for T = 1..400
    assert (cumulative <= 2 * L * (hs[0] - hs[1:]) * (1 + 1e-9) + 1e-12).all()


def test_section_3_2_step_size_converges_at_1_9_over_L_and_diverges_at_2_1_over_L():
    """Notes §3.2: h strictly decreases when eta < 2/L. On least squares the error along H's
    top eigenvector is multiplied by 1 - eta L each step: |1 - 1.9| = 0.9 converges,
    |1 - 2.1| = 1.1 diverges (h - h* grows by 1.21 per step once that direction dominates)."""
    X, y, L, _mu, theta_star, theta0 = _least_squares()
    h_star = _h(X, y, theta_star)
    fast, _ = _gradient_descent(X, y, theta0, 1.9 / L, 300)
    assert fast[-1] - h_star < 1e-10 * (fast[0] - h_star)
    assert (np.diff(fast) <= 1e-12).all()  # monotone, as sufficient decrease promises
    slow, _ = _gradient_descent(X, y, theta0, 2.1 / L, 300)
    assert slow[-1] - h_star > 1e10 * (slow[0] - h_star)
    np.testing.assert_allclose((slow[-1] - h_star) / (slow[-2] - h_star), 1.1**2, rtol=1e-6)


# ----- the forms of Nesterov, AdaGrad and Adam in notes §3.3 beside torch's ---------------
def _quadratic_problem(seed=3, d=6):
    """h(theta) = theta^T A theta / 2 - b^T theta, A positive definite; gradient A theta - b."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((d, d))
    A = M @ M.T / d + 0.1 * np.eye(d)
    return A, rng.standard_normal(d), rng.standard_normal(d)


def _run(opt_cls, kwargs, grad, theta0, steps):
    """nnkit's iterates theta_0..theta_steps of ``opt_cls`` on the gradient field ``grad``."""
    theta = nk.nn.Parameter(theta0.copy())
    opt = opt_cls([theta], **kwargs)
    out = [theta.data.copy()]
    for _ in range(steps):
        theta.grad = grad(theta.data)
        opt.step()
        out.append(theta.data.copy())
    return np.array(out)


def _notes_nesterov(grad, theta0, eta, beta, steps):
    """Notes §3.3 as printed: chi^{t+1} = theta^t + beta (theta^t - theta^{t-1}),
    theta^{t+1} = chi^{t+1} - eta grad h(chi^{t+1}), theta^{-1} = theta^0.
    Returns (theta^0..theta^steps, chi^1..chi^{steps+1})."""
    prev, cur = theta0.copy(), theta0.copy()
    thetas, chis = [cur], []
    for _ in range(steps + 1):
        chi = cur + beta * (cur - prev)
        chis.append(chi)
        prev, cur = cur, chi - eta * grad(chi)
        thetas.append(cur)
    return np.array(thetas[:steps + 1]), np.array(chis)


def test_section_3_3_nesterov_torch_iterate_is_the_notes_extrapolated_point():
    """torch's (and nnkit's) SGD(nesterov=True) tracks the extrapolated point of notes §3.3: its
    parameter after t steps is chi^{t+1} = theta^t + beta (theta^t - theta^{t-1}), not theta^t.
    (With u_t = theta^{t+1} - theta^t, torch's buffer is b_t = -u_t / eta and its step
    p_{t+1} = p_t - eta (grad h(p_t) + beta b_t) is chi^{t+2} - chi^{t+1}.)"""
    A, b, theta0 = _quadratic_problem()
    grad = lambda th: A @ th - b  # noqa: E731
    eta, beta, T = 0.1, 0.9, 40
    ours = _run(optim.SGD, {"lr": eta, "momentum": beta, "nesterov": True}, grad, theta0, T)
    thetas, chis = _notes_nesterov(grad, theta0, eta, beta, T)
    np.testing.assert_allclose(ours, chis, rtol=1e-12, atol=1e-12)
    # the two sequences differ by beta (theta^t - theta^{t-1}), which is not small here
    assert np.abs(ours[1:] - thetas[1:]).max() > 0.1
    np.testing.assert_allclose(ours[1:] - thetas[1:], beta * (thetas[1:] - thetas[:-1]),
                               rtol=1e-10, atol=1e-12)


def _notes_adagrad(grad, theta0, eta, delta, steps):
    """Notes §3.3 as printed: gamma^t = gamma^{t-1} + (grad h)^2, gamma^{-1} = 0,
    theta^{t+1} = theta^t - eta / sqrt(gamma^t + delta) * grad h(theta^t)."""
    theta, gamma = theta0.copy(), np.zeros_like(theta0)
    out = [theta]
    for _ in range(steps):
        g = grad(theta)
        gamma = gamma + g * g
        theta = theta - eta / np.sqrt(gamma + delta) * g
        out.append(theta)
    return np.array(out)


def test_section_3_3_adagrad_is_torchs_with_delta_as_initial_accumulator():
    """Notes §3.3 puts delta inside the root, torch adds eps outside it: sqrt(gamma + delta) vs
    sqrt(sum) + eps. That form with delta is exactly nnkit's Adagrad with
    initial_accumulator_value = delta (sum_t = delta + gamma_t) and eps -> 0; nnkit's default
    (sum_0 = 0, eps = 1e-10) is the limit delta -> 0 of that form, the gap shrinking
    in proportion to delta."""
    A, b, theta0 = _quadratic_problem()
    grad = lambda th: A @ th - b  # noqa: E731
    eta, T = 0.3, 50
    for delta in (0.5, 1e-3):
        printed = _notes_adagrad(grad, theta0, eta, delta, T)
        ours = _run(optim.Adagrad, {"lr": eta, "initial_accumulator_value": delta,
                                    "eps": 1e-300}, grad, theta0, T)
        np.testing.assert_allclose(ours, printed, rtol=1e-12, atol=1e-13)
    default = _run(optim.Adagrad, {"lr": eta}, grad, theta0, T)
    gaps = [np.abs(_notes_adagrad(grad, theta0, eta, delta, T) - default).max()
            for delta in (1e-2, 1e-4, 1e-6, 1e-8)]
    assert gaps[0] > 1e-4  # a visible difference at delta = 0.01
    assert (np.array(gaps[1:]) < np.array(gaps[:-1]) / 30).all()
    assert gaps[-1] < 1e-6


def _notes_adam(grad, theta0, eta, beta, alpha, delta, steps, bias_correction=False):
    """Notes §3.3 as printed, with a base rate eta (its eta_t = 1 / sqrt(gamma + delta)
    has none): g_t = beta g_{t-1} + (1 - beta) grad, gamma_t = alpha gamma_{t-1} +
    (1 - alpha) grad^2 (both from 0), theta_{t+1} = theta_t - eta g_t / sqrt(gamma_t + delta).
    ``bias_correction`` multiplies the step t = 1, 2, ... by sqrt(1 - alpha^t) / (1 - beta^t)."""
    theta = theta0.copy()
    m, v = np.zeros_like(theta0), np.zeros_like(theta0)
    out = [theta]
    for t in range(1, steps + 1):
        g = grad(theta)
        m = beta * m + (1 - beta) * g
        v = alpha * v + (1 - alpha) * g * g
        rate = eta * np.sqrt(1 - alpha**t) / (1 - beta**t) if bias_correction else eta
        theta = theta - rate * m / np.sqrt(v + delta)
        out.append(theta)
    return np.array(out)


def test_section_3_3_adam_is_the_notes_form_with_kingmas_bias_correction():
    """The Adam of notes §3.3 has no bias correction: from g_0 = gamma_0 = 0 its first step is
    (1 - beta) / sqrt(1 - alpha) times larger (3.16x at beta = 0.9, alpha = 0.999) than
    Kingma and Ba's, whose step t is scaled by sqrt(1 - alpha^t) / (1 - beta^t). With that
    factor and delta = 0, eps -> 0 that form is nnkit's (torch's) Adam exactly."""
    A, b, theta0 = _quadratic_problem()
    grad = lambda th: A @ th - b  # noqa: E731
    eta, beta, alpha, T = 0.05, 0.9, 0.999, 60
    ours = _run(optim.Adam, {"lr": eta, "betas": (beta, alpha), "eps": 1e-300}, grad, theta0, T)
    corrected = _notes_adam(grad, theta0, eta, beta, alpha, 0.0, T, bias_correction=True)
    np.testing.assert_allclose(ours, corrected, rtol=1e-11, atol=1e-12)
    plain = _notes_adam(grad, theta0, eta, beta, alpha, 0.0, T)
    first = (1 - beta) / np.sqrt(1 - alpha)
    np.testing.assert_allclose(plain[1] - theta0, first * (ours[1] - theta0), rtol=1e-10)
    np.testing.assert_allclose(np.abs(ours[1] - theta0), eta, rtol=1e-10)  # lr sign(g)
    assert np.abs(plain[T] - ours[T]).max() > 1e-2  # the two trajectories differ visibly


# ----- state, groups, closures --------------------------------------------------------------
RESUME_CASES = [
    (optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    (optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}),
    (optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("cls", "kwargs"), RESUME_CASES, ids=[c[0].__name__ for c in RESUME_CASES])
def test_state_dict_round_trip_resumes_exactly(cls, kwargs, dtype):
    """5 steps, save, a fresh optimizer loads it, 5 more steps == 10 steps straight."""
    rng = np.random.default_rng(2)
    init, grads = _params(rng, dtype), _grad_sequence(rng, dtype, steps=10)
    straight, _ = _run_nnkit(cls, kwargs, init, grads, halve_lr_at=-1)

    params = [nk.nn.Parameter(a.copy()) for a in init]
    opt = cls(params, **kwargs)
    for gs in grads[:5]:
        for p, g in zip(params, gs, strict=True):
            p.grad = None if g is None else g.copy()
        opt.step()
    saved = opt.state_dict()
    assert sorted(saved["state"]) == list(range(len(params)))
    assert saved["param_groups"][0]["params"] == list(range(len(params)))
    for entry in saved["state"].values():
        for key, value in entry.items():
            assert isinstance(value, int) if key == "step" else isinstance(value, np.ndarray)
    snapshot = [p.data.copy() for p in params]
    opt.step()  # the saved dict holds copies: stepping on does not change it
    for p, s in zip(params, snapshot, strict=True):
        p.data[...] = s  # the model's own checkpoint
    resumed = cls(params, **kwargs)
    resumed.load_state_dict(saved)
    for gs in grads[5:]:
        for p, g in zip(params, gs, strict=True):
            p.grad = None if g is None else g.copy()
        resumed.step()
    for p, s in zip(params, straight, strict=True):
        np.testing.assert_array_equal(p.data, s)


def test_load_state_dict_checks_structure():
    p, q = nk.nn.Parameter(np.zeros(3)), nk.nn.Parameter(np.zeros(2))
    saved = optim.Adam([p, q]).state_dict()
    with pytest.raises(ValueError, match="2 parameters"):
        optim.Adam([p]).load_state_dict(saved)
    with pytest.raises(ValueError, match="parameter groups"):
        optim.Adam([{"params": [p]}, {"params": [q]}]).load_state_dict(saved)
    with pytest.raises(TypeError, match="state_dict"):
        optim.Adam([p, q]).load_state_dict({"state": {}})
    bad = {"state": {0: {"step": 1, "exp_avg": np.zeros(5), "exp_avg_sq": np.zeros(5)}},
           "param_groups": saved["param_groups"]}
    with pytest.raises(ValueError, match="shape"):
        optim.Adam([p, q]).load_state_dict(bad)
    groups = [{**saved["param_groups"][0], "lr": -1.0}]  # checked as the constructor's
    with pytest.raises(ValueError, match=r"lr \(param group 0 of the state_dict\)"):
        optim.Adam([p, q]).load_state_dict({"state": {}, "param_groups": groups})


def _stepped_state_dict(cls):
    """The state_dict of ``cls`` after one step on a parameter of shape (3,)."""
    p = nk.nn.Parameter(np.ones(3))
    opt = cls([p])
    p.grad = np.ones(3)
    opt.step()
    return opt.state_dict()


IMPOSSIBLE_STATES = [
    (optim.Adam, {"step": -1}, ValueError, r"\['step'\] must be >= 1, got -1"),
    (optim.Adam, {"step": 0}, ValueError, r"\['step'\] must be >= 1, got 0"),
    (optim.AdamW, {"step": 2.5}, TypeError, r"\['step'\] must be an integer, got 2.5"),
    (optim.Adam, {"step": True}, TypeError, r"\['step'\] must be an integer, got True"),
    (optim.Adam, {"step": "3"}, TypeError, r"\['step'\] must be an integer, got '3'"),
    (optim.Adam, {"step": np.array([1, 2])}, TypeError, r"\['step'\] must be .* shape \(2,\)"),
    (optim.Adagrad, {"step": -1}, ValueError, r"\['step'\] must be >= 0, got -1"),
    (optim.Adam, {"exp_avg": np.zeros(3, complex)}, TypeError,
     r"\['exp_avg'\] has dtype complex128, which does not cast to .* float64"),
    (optim.Adam, {"exp_avg_sq": [0.0, 0.0, 0.0]}, TypeError,
     r"\['exp_avg_sq'\] must be an array of shape \(3,\), got list"),
    (optim.Adagrad, {"sum": None}, TypeError, r"\['sum'\] must be an array .* got NoneType"),
]


@pytest.mark.parametrize(("cls", "entry", "exc", "match"), IMPOSSIBLE_STATES,
                         ids=["negative-step", "step-0-with-moments", "fractional-step",
                              "bool-step", "str-step", "array-step", "adagrad-negative-step",
                              "complex-moment", "list-moment", "missing-sum"])
def test_load_state_dict_refuses_impossible_states(cls, entry, exc, match):
    """A step count that is negative (Adam's next step would divide by 1 - beta1**0 = 0),
    not an integer, or 0 for Adam (whose state only exists after its first step), and
    buffers that are not arrays of the parameter's shape and kind, are refused by name;
    the optimizer is left as it was."""
    saved = _stepped_state_dict(cls)
    saved["state"][0].update(entry)
    opt = cls([nk.nn.Parameter(np.ones(3))])
    before = repr(opt.state_dict())
    with pytest.raises(exc, match=r"state_dict\['state'\]\[0\]" + match):
        opt.load_state_dict(saved)
    assert repr(opt.state_dict()) == before


@pytest.mark.parametrize("cls", [optim.Adam, optim.Adagrad])
def test_load_state_dict_needs_the_whole_state(cls):
    saved = _stepped_state_dict(cls)
    name = "exp_avg_sq" if cls is optim.Adam else "sum"
    del saved["state"][0][name]
    with pytest.raises(ValueError, match=rf"state_dict\['state'\]\[0\] lacks \['{name}'\]"):
        cls([nk.nn.Parameter(np.ones(3))]).load_state_dict(saved)
    with pytest.raises(TypeError, match=r"state_dict\['state'\] must be a dict"):
        cls([nk.nn.Parameter(np.ones(3))]).load_state_dict({**saved, "state": [1]})


def test_load_state_dict_takes_integral_steps_of_any_number_type():
    """torch saves ``step`` as a float tensor: an integral float or 0-d array is a step."""
    for step in (4.0, np.float32(4.0), np.array(4.0), np.int64(4)):
        saved = _stepped_state_dict(optim.Adam)
        saved["state"][0]["step"] = step
        p = nk.nn.Parameter(np.ones(3))
        opt = optim.Adam([p])
        opt.load_state_dict(saved)
        assert type(opt.state[p]["step"]) is int and opt.state[p]["step"] == 4


def test_add_param_group_and_lr_edit():
    p, q = nk.nn.Parameter(np.ones(2)), nk.nn.Parameter(np.ones(3))
    opt = optim.SGD([p], lr=0.1)
    opt.add_param_group({"params": q, "lr": 1.0})
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1.0]
    assert opt.param_groups[1]["momentum"] == 0  # defaults fill the rest
    p.grad, q.grad = np.ones(2), np.ones(3)
    opt.step()
    np.testing.assert_allclose(p.data, 0.9)
    np.testing.assert_allclose(q.data, 0.0)
    opt.param_groups[0]["lr"] = 0.5
    opt.step()
    np.testing.assert_allclose(p.data, 0.4)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [p]})
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [nk.nn.Parameter(np.ones(1))], "lr": -1.0})
    with pytest.raises(TypeError, match="dict"):
        opt.add_param_group([nk.nn.Parameter(np.ones(1))])
    with pytest.raises(TypeError, match="set"):
        opt.add_param_group({"params": {nk.nn.Parameter(np.ones(1))}})


def test_adagrad_group_initial_accumulator_value():
    """Each group's own initial_accumulator_value fills its accumulators (torch: the
    constructor's for all groups)."""
    p, q = nk.nn.Parameter(np.zeros(2)), nk.nn.Parameter(np.zeros(3))
    opt = optim.Adagrad([{"params": [p]}, {"params": [q], "initial_accumulator_value": 3.0}],
                        initial_accumulator_value=1.0)
    np.testing.assert_array_equal(opt.state[p]["sum"], 1.0)
    np.testing.assert_array_equal(opt.state[q]["sum"], 3.0)


def test_updates_in_place_and_keeps_dtype():
    layer = nk.nn.Linear(4, 3)
    arrays = [p.data for p in layer.parameters()]
    opt = optim.Adam(layer.parameters(), lr=0.1)
    x = nk.tensor(np.ones((2, 4), dtype=np.float32))
    layer(x).sum().backward()
    opt.step()
    for p, a in zip(layer.parameters(), arrays, strict=True):
        assert p.data is a and p.data.dtype == np.float32


def test_zero_grad():
    p = nk.nn.Parameter(np.ones(3))
    opt = optim.SGD([p], lr=0.1)
    p.grad = np.ones(3)
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and not p.grad.any()
    opt.zero_grad()
    assert p.grad is None
    opt.step()  # no gradient: nothing moves
    np.testing.assert_array_equal(p.data, 1.0)


def test_step_with_closure_reevaluates_the_loss():
    theta = nk.nn.Parameter(np.array([3.0, -1.0]))
    opt = optim.SGD([theta], lr=0.25)
    calls = []

    def closure():
        opt.zero_grad()
        loss = (theta * theta).sum()
        loss.backward()
        calls.append(loss.item())
        return loss

    with nk.no_grad():  # the closure runs with gradients enabled regardless
        loss = opt.step(closure)
    assert calls == [10.0] and loss.item() == 10.0
    np.testing.assert_allclose(theta.data, [1.5, -0.5])
    with pytest.raises(TypeError, match="closure"):
        opt.step(closure=3)


def test_non_contiguous_parameter_uses_the_array_path(rng):
    """A transposed-view parameter still updates in place, equal to a contiguous copy's."""
    base = rng.standard_normal((4, 3))
    g = rng.standard_normal((3, 4))
    a = nk.nn.Parameter(base.T)  # (3, 4) F-ordered view
    b = nk.nn.Parameter(np.ascontiguousarray(base.T))
    oa, ob = optim.Adam([a], lr=0.1, amsgrad=True), optim.Adam([b], lr=0.1, amsgrad=True)
    for _ in range(3):
        a.grad, b.grad = g.copy(), g.copy()
        oa.step()
        ob.step()
    np.testing.assert_allclose(a.data, b.data, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(base.T, a.data)  # the original array was updated


def test_gradient_shape_mismatch_is_an_error():
    p = nk.nn.Parameter(np.ones(3))
    opt = optim.SGD([p], lr=0.1)
    p.grad = np.ones(4)
    with pytest.raises(ValueError, match="shape"):
        opt.step()


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_adam_refuses_float16_parameters_naming_them(cls):
    # torch.optim.Adam takes float16; nnkit's fused kernel does not (it raised numba's
    # "NotImplementedError: float16" at the first step)
    ok = nk.nn.Parameter(np.zeros(2, np.float32))
    half = nk.nn.Parameter(np.zeros((2, 3), np.float16))
    with pytest.raises(TypeError, match=rf"{cls.__name__}: parameter 1 \(param group 0, shape "
                                        r"\(2, 3\)\) has dtype float16; .*float32, float64, "
                                        r"complex64 or complex128.*astype\(np.float32\)"):
        cls([ok, half])
    opt = cls([ok])
    with pytest.raises(TypeError, match=r"parameter 1 \(param group 1, shape \(2, 3\)\)"):
        opt.add_param_group({"params": [half]})
    # cast after the optimizer was made: refused at the step, before anything is updated
    ok.data = ok.data.astype(np.float16)
    ok.grad = np.ones(2, np.float16)
    with pytest.raises(TypeError, match=r"parameter 0 .* has dtype float16"):
        opt.step()
    assert not opt.state[ok]
    big_endian = nk.nn.Parameter(np.zeros(2, ">f8"))  # made native, so updated as float64
    assert big_endian.dtype == np.float64 and big_endian.dtype.isnative
    cls([big_endian])


def test_sgd_and_adagrad_still_take_float16():
    for cls in (optim.SGD, optim.Adagrad):
        p = nk.nn.Parameter(np.zeros(2, np.float16))
        opt = cls([p], lr=0.5)
        p.grad = np.ones(2, np.float16)
        opt.step()
        assert p.data.dtype == np.float16 and (p.data < 0).all()


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adagrad, optim.Adam, optim.AdamW])
def test_read_only_parameters_are_refused_naming_them(cls):
    # Adam raised a long numba TypingError, SGD NumPy's "output array is read-only"
    frozen = np.zeros(3)
    frozen.setflags(write=False)
    ok, ro = nk.nn.Parameter(np.zeros(3)), nk.nn.Parameter(frozen)
    with pytest.raises(ValueError, match=rf"{cls.__name__}: parameter 1 \(param group 0, "
                                         r"shape \(3,\)\) is read-only.*p.data = p.data.copy\(\)"):
        cls([ok, ro], lr=0.1)
    opt = cls([ok], lr=0.1)
    ok.data = np.broadcast_to(np.zeros(1), (3,))  # a read-only view, swapped in later
    ok.grad = np.ones(3)
    with pytest.raises(ValueError, match=r"parameter 0 .* is read-only"):
        opt.step()


# ----- clip_grad_norm_ ---------------------------------------------------------------------
def _grads_with_params(rng, dtype, scale):
    params = [nk.nn.Parameter(np.zeros(s, dtype=dtype)) for s in [(3, 4), (5,), (2, 2)]]
    for p in params:
        p.grad = (scale * rng.standard_normal(p.shape)).astype(dtype)
    params.append(nk.nn.Parameter(np.zeros(2, dtype=dtype)))  # no gradient: ignored
    return params


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0, 3.0])
@pytest.mark.parametrize("scale", [0.01, 10.0])  # under and over max_norm
def test_clip_grad_norm_matches_torch(norm_type, scale, dtype, rng):
    torch = import_torch()
    params = _grads_with_params(rng, dtype, scale)
    tparams = [torch.nn.Parameter(torch.from_numpy(p.data.copy())) for p in params]
    for p, q in zip(params, tparams, strict=True):
        q.grad = None if p.grad is None else torch.from_numpy(p.grad.copy())
    total = optim.clip_grad_norm_(params, max_norm=1.5, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(tparams, max_norm=1.5, norm_type=norm_type)
    assert isinstance(total, float)
    np.testing.assert_allclose(total, float(ttotal), **tolerance(dtype, 16))
    for p, q in zip(params, tparams, strict=True):
        if p.grad is None:
            assert q.grad is None
        else:
            np.testing.assert_allclose(p.grad, q.grad.numpy(), **tolerance(dtype, 16))


@pytest.mark.parametrize("norm_type", [2.0, math.inf, "inf"])
def test_clip_grad_norm_by_hand(norm_type, rng):
    params = _grads_with_params(rng, np.float64, 10.0)
    flat = np.concatenate([p.grad.ravel() for p in params if p.grad is not None])
    expected = np.abs(flat).max() if norm_type != 2.0 else np.sqrt((flat**2).sum())
    before = [p.grad.copy() for p in params if p.grad is not None]
    total = optim.clip_grad_norm_(params, max_norm=1.0, norm_type=norm_type)
    np.testing.assert_allclose(total, expected, rtol=1e-12)
    coef = 1.0 / (expected + 1e-6)
    for g0, p in zip(before, params, strict=False):
        np.testing.assert_allclose(p.grad, g0 * coef, rtol=1e-12)
    # under the limit nothing changes
    total2 = optim.clip_grad_norm_(params[0], max_norm=1e6)
    np.testing.assert_allclose(total2, np.linalg.norm(params[0].grad), rtol=1e-12)
    np.testing.assert_allclose(params[0].grad, before[0] * coef, rtol=1e-12)


def test_clip_grad_norm_edge_cases():
    p = nk.nn.Parameter(np.zeros(2))
    assert optim.clip_grad_norm_([p], 1.0) == 0.0  # no gradients at all
    p.grad = np.array([np.nan, 1.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm_([p], -1.0)
    with pytest.raises(ValueError, match="norm_type"):
        optim.clip_grad_norm_([p], 1.0, norm_type=0)
    with pytest.raises(TypeError, match="norm_type"):
        optim.clip_grad_norm_([p], 1.0, norm_type=None)


# ----- validation ----------------------------------------------------------------------------
BAD = [
    (optim.SGD, {"lr": -0.1}, ValueError, "lr"),
    (optim.SGD, {"lr": float("nan")}, ValueError, "lr"),
    (optim.SGD, {"lr": "0.1"}, TypeError, "lr"),
    (optim.SGD, {"lr": None}, TypeError, "lr"),
    (optim.SGD, {"momentum": -0.5}, ValueError, "momentum"),
    (optim.SGD, {"dampening": float("inf")}, ValueError, "dampening"),
    (optim.SGD, {"weight_decay": -1e-4}, ValueError, "weight_decay"),
    (optim.SGD, {"nesterov": True}, ValueError, "nesterov"),
    (optim.SGD, {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, ValueError, "nesterov"),
    (optim.SGD, {"maximize": 1}, TypeError, "maximize"),
    (optim.Adagrad, {"lr": -1}, ValueError, "lr"),
    (optim.Adagrad, {"lr_decay": -0.1}, ValueError, "lr_decay"),
    (optim.Adagrad, {"weight_decay": -1}, ValueError, "weight_decay"),
    (optim.Adagrad, {"initial_accumulator_value": -1}, ValueError, "initial_accumulator_value"),
    (optim.Adagrad, {"eps": 0.0}, ValueError, "eps"),
    (optim.Adam, {"lr": -1e-3}, ValueError, "lr"),
    (optim.Adam, {"betas": (1.0, 0.999)}, ValueError, r"betas\[0\]"),
    (optim.Adam, {"betas": (0.9, -0.1)}, ValueError, r"betas\[1\]"),
    (optim.Adam, {"betas": 0.9}, TypeError, "betas"),
    (optim.Adam, {"betas": (0.9, 0.99, 0.9)}, TypeError, "betas"),
    (optim.Adam, {"betas": ("a", 0.9)}, TypeError, "betas"),
    (optim.Adam, {"eps": 0.0}, ValueError, "eps"),
    (optim.Adam, {"eps": -1e-8}, ValueError, "eps"),
    (optim.Adam, {"weight_decay": -0.1}, ValueError, "weight_decay"),
    (optim.Adam, {"amsgrad": "yes"}, TypeError, "amsgrad"),
    (optim.AdamW, {"weight_decay": -0.1}, ValueError, "weight_decay"),
    (optim.AdamW, {"betas": (0.9, 1.0)}, ValueError, r"betas\[1\]"),
]


@pytest.mark.parametrize(("cls", "kwargs", "exc", "match"), BAD,
                         ids=[f"{c.__name__}-{kw}" for c, kw, _, _ in BAD])
def test_bad_hyper_parameters(cls, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cls([nk.nn.Parameter(np.ones(2))], **kwargs)


def test_bad_params():
    p = nk.nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="Parameters"):
        optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(TypeError, match="wrap it in a list"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(TypeError, match="iterable"):
        optim.SGD(3, lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.Adam([p * 2])
    with pytest.raises(ValueError, match="twice"):
        optim.Adam([p, p])
    with pytest.raises(ValueError, match="more than one"):
        optim.Adam([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="lr"):
        optim.Adam([{"params": [p], "lr": -1.0}])
    with pytest.raises(ValueError, match="params"):
        optim.Adam([{"lr": 0.1}])


_WILD = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 10),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.tuples(st.floats(-2, 2), st.floats(-2, 2)),
    st.lists(st.floats(0, 1), max_size=3),
)
_ARGS = {
    optim.SGD: ["lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize"],
    optim.Adagrad: ["lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
                    "maximize"],
    optim.Adam: ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"],
    optim.AdamW: ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"],
}


@given(data=st.data(), cls=st.sampled_from(list(_ARGS)))
def test_constructor_fuzz_raises_only_value_or_type_errors(data, cls):
    names = data.draw(st.lists(st.sampled_from(_ARGS[cls]), unique=True, max_size=4))
    kwargs = {name: data.draw(_WILD, label=name) for name in names}
    p = nk.nn.Parameter(np.linspace(-1, 1, 6).reshape(2, 3))
    try:
        opt = cls([p], **kwargs)
    except (ValueError, TypeError):
        return
    for _ in range(2):  # a valid optimizer steps, whatever the (finite) values
        p.grad = np.full((2, 3), 0.5)
        opt.step()


# ----- GPU -----------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam", "AdamW"])
def test_cupy_parameters_match_numpy(name):
    import cupy

    rng = np.random.default_rng(4)
    init, grads = _params(rng, np.float32), _grad_sequence(rng, np.float32)
    kwargs = {"lr": 0.05, "weight_decay": 0.1}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    ours, _ = _run_nnkit(getattr(optim, name), kwargs, init, grads)
    params = [nk.nn.Parameter(cupy.asarray(a)) for a in init]
    opt = getattr(optim, name)(params, **kwargs)
    for t, gs in enumerate(grads):
        if t == 6:
            for group in opt.param_groups:
                group["lr"] *= 0.5
        for p, g in zip(params, gs, strict=True):
            p.grad = None if g is None else cupy.asarray(g)
        opt.step()
    for entry in opt.state_dict()["state"].values():  # host copies of the device state
        assert all(isinstance(v, int if k == "step" else np.ndarray) for k, v in entry.items())
    _assert_params_close([p.data.get() for p in params], ours, np.float32)
