"""``nnkit.functional``: finite differences on every function (float64), equivalence with
``torch.nn.functional`` (values and gradients, float32 and float64), dropout statistics and
the numerical edge cases (cross-entropy at logits of +-1e4)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import import_torch

import nnkit as nk
import nnkit.functional as F

TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


def _away_from_zero(x, gap=0.1):
    return np.where(np.abs(x) < gap, np.where(x < 0, -gap, gap), x)


# ----- the cases: (nnkit call, torch call, differentiable inputs) ------------------------------
def _cases(rng):
    """name -> (nk_fn(*tensors), torch_fn(torch, *tensors), [float64 arrays])."""
    x34 = rng.normal(size=(3, 4))
    x234 = rng.normal(size=(2, 3, 4))
    w = rng.normal(size=(5, 4))
    b = rng.normal(size=5)
    logits = rng.normal(size=(5, 4)) * 2
    target = np.array([0, 3, 1, 1, 2])
    target_ign = np.array([0, -100, 3, -100, 2])
    target_ign1 = np.array([1, 0, 1, 3, 2])
    probs = rng.random((3, 4))
    bce_w = rng.random((3, 4)) + 0.5
    pos_w = rng.random(4) * 2 + 0.5
    ids = np.array([[0, 2, 2], [5, 0, 2]])
    emb = rng.normal(size=(6, 3))
    ln_w, ln_b = rng.normal(size=4), rng.normal(size=4)
    ln2_w, ln2_b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))

    def tt(torch, a):
        return torch.as_tensor(a)

    return {
        "linear": (lambda x, w_, b_: F.linear(x, w_, b_),
                   lambda T, x, w_, b_: T.nn.functional.linear(x, w_, b_), [x34, w, b]),
        "linear_no_bias": (lambda x, w_: F.linear(x, w_),
                           lambda T, x, w_: T.nn.functional.linear(x, w_), [x34, w]),
        "linear_3d": (lambda x, w_, b_: F.linear(x, w_, b_),
                      lambda T, x, w_, b_: T.nn.functional.linear(x, w_, b_), [x234, w, b]),
        "linear_1d": (lambda x, w_: F.linear(x, w_),
                      lambda T, x, w_: T.nn.functional.linear(x, w_), [x34[0], w]),
        "sigmoid": (F.sigmoid, lambda T, x: T.sigmoid(x), [x234 * 3]),
        "tanh": (F.tanh, lambda T, x: T.tanh(x), [x234]),
        "relu": (F.relu, lambda T, x: T.relu(x), [_away_from_zero(x234)]),
        "gelu": (F.gelu, lambda T, x: T.nn.functional.gelu(x), [x234 * 2]),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                      lambda T, x: T.nn.functional.gelu(x, approximate="tanh"), [x234 * 2]),
        "softmax": (F.softmax, lambda T, x: T.softmax(x, -1), [x234]),
        "softmax_axis0": (lambda x: F.softmax(x, axis=0), lambda T, x: T.softmax(x, 0), [x234]),
        "softmax_axis1": (lambda x: F.softmax(x, axis=1), lambda T, x: T.softmax(x, 1), [x234]),
        "log_softmax": (F.log_softmax, lambda T, x: T.log_softmax(x, -1), [x234]),
        "log_softmax_axis0": (lambda x: F.log_softmax(x, axis=0),
                              lambda T, x: T.log_softmax(x, 0), [x234]),
        "log_softmax_axis1": (lambda x: F.log_softmax(x, axis=1),
                              lambda T, x: T.log_softmax(x, 1), [x234]),
        "cross_entropy": (lambda x: F.cross_entropy(x, target),
                          lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target)),
                          [logits]),
        "cross_entropy_ignore": (
            lambda x: F.cross_entropy(x, target_ign),
            lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target_ign)), [logits]),
        "cross_entropy_ignore_1": (
            lambda x: F.cross_entropy(x, target_ign1, ignore_index=1),
            lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target_ign1), ignore_index=1),
            [logits]),
        "cross_entropy_sum": (
            lambda x: F.cross_entropy(x, target_ign, reduction="sum"),
            lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target_ign), reduction="sum"),
            [logits]),
        "cross_entropy_none": (
            lambda x: F.cross_entropy(x, target_ign, reduction="none"),
            lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target_ign), reduction="none"),
            [logits]),
        "cross_entropy_none_ignore_1": (
            lambda x: F.cross_entropy(x, target_ign1, ignore_index=1, reduction="none"),
            lambda T, x: T.nn.functional.cross_entropy(x, tt(T, target_ign1), ignore_index=1,
                                                       reduction="none"),
            [logits]),
        "mse_loss": (F.mse_loss, lambda T, p, t: T.nn.functional.mse_loss(p, t),
                     [x34, rng.normal(size=(3, 4))]),
        "mse_loss_sum": (lambda p, t: F.mse_loss(p, t, reduction="sum"),
                         lambda T, p, t: T.nn.functional.mse_loss(p, t, reduction="sum"),
                         [x34, rng.normal(size=(3, 4))]),
        "mse_loss_none": (lambda p, t: F.mse_loss(p, t, reduction="none"),
                          lambda T, p, t: T.nn.functional.mse_loss(p, t, reduction="none"),
                          [x34, rng.normal(size=(3, 4))]),
        "bce": (lambda x: F.binary_cross_entropy_with_logits(x, probs),
                lambda T, x: T.nn.functional.binary_cross_entropy_with_logits(
                    x, tt(T, probs).to(x.dtype)), [x34 * 3]),
        "bce_weight": (
            lambda x: F.binary_cross_entropy_with_logits(x, probs, weight=bce_w),
            lambda T, x: T.nn.functional.binary_cross_entropy_with_logits(
                x, tt(T, probs).to(x.dtype), weight=tt(T, bce_w).to(x.dtype)), [x34 * 3]),
        "bce_pos_weight": (
            lambda x: F.binary_cross_entropy_with_logits(x, probs, pos_weight=pos_w),
            lambda T, x: T.nn.functional.binary_cross_entropy_with_logits(
                x, tt(T, probs).to(x.dtype), pos_weight=tt(T, pos_w).to(x.dtype)), [x34 * 3]),
        "bce_both_sum": (
            lambda x: F.binary_cross_entropy_with_logits(x, probs, weight=bce_w,
                                                         pos_weight=pos_w, reduction="sum"),
            lambda T, x: T.nn.functional.binary_cross_entropy_with_logits(
                x, tt(T, probs).to(x.dtype), weight=tt(T, bce_w).to(x.dtype),
                pos_weight=tt(T, pos_w).to(x.dtype), reduction="sum"), [x34 * 3]),
        "bce_none": (
            lambda x: F.binary_cross_entropy_with_logits(x, probs, pos_weight=pos_w,
                                                         reduction="none"),
            lambda T, x: T.nn.functional.binary_cross_entropy_with_logits(
                x, tt(T, probs).to(x.dtype), pos_weight=tt(T, pos_w).to(x.dtype),
                reduction="none"), [x34 * 3]),
        "layer_norm": (lambda x: F.layer_norm(x, 4),
                       lambda T, x: T.nn.functional.layer_norm(x, (4,)), [x234]),
        "layer_norm_affine": (
            lambda x, w_, b_: F.layer_norm(x, (4,), w_, b_),
            lambda T, x, w_, b_: T.nn.functional.layer_norm(x, (4,), w_, b_),
            [x234, ln_w, ln_b]),
        "layer_norm_weight_only": (
            lambda x, w_: F.layer_norm(x, (4,), weight=w_),
            lambda T, x, w_: T.nn.functional.layer_norm(x, (4,), weight=w_), [x234, ln_w]),
        "layer_norm_bias_only": (
            lambda x, b_: F.layer_norm(x, (4,), bias=b_),
            lambda T, x, b_: T.nn.functional.layer_norm(x, (4,), bias=b_), [x234, ln_b]),
        "layer_norm_2d": (
            lambda x, w_, b_: F.layer_norm(x, (3, 4), w_, b_, eps=1e-3),
            lambda T, x, w_, b_: T.nn.functional.layer_norm(x, (3, 4), w_, b_, eps=1e-3),
            [x234, ln2_w, ln2_b]),
        "embedding": (lambda w_: F.embedding(ids, w_),
                      lambda T, w_: T.nn.functional.embedding(tt(T, ids), w_), [emb]),
    }


CASE_NAMES = sorted(_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_gradcheck(name):
    nk_fn, _, inputs = _cases(np.random.default_rng(1))[name]
    assert nk.gradcheck(nk_fn, inputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_matches_torch(name, dtype):
    torch = import_torch()
    rng = np.random.default_rng(2)
    nk_fn, t_fn, inputs = _cases(rng)[name]
    inputs = [a.astype(dtype) for a in inputs]
    nk_in = [nk.tensor(a, requires_grad=True) for a in inputs]
    t_in = [torch.tensor(a, requires_grad=True) for a in inputs]
    out = nk_fn(*nk_in)
    t_out = t_fn(torch, *t_in)
    assert out.dtype == dtype and out.shape == tuple(t_out.shape)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL[dtype])
    upstream = rng.normal(size=out.shape).astype(dtype)
    out.backward(upstream)
    t_out.backward(torch.as_tensor(upstream))
    for i, (a, t) in enumerate(zip(nk_in, t_in, strict=True)):
        assert a.grad is not None and a.grad.dtype == dtype, f"input {i}"
        np.testing.assert_allclose(a.grad, t.grad.numpy(), **TOL[dtype], err_msg=f"input {i}")


def test_functions_accept_plain_arrays_as_constants(rng):
    x = rng.normal(size=(2, 3))
    out = F.softmax(x)
    assert isinstance(out, nk.Tensor) and not out.requires_grad
    np.testing.assert_allclose(out.numpy().sum(axis=-1), 1.0)
    assert F.linear(x, rng.normal(size=(4, 3))).shape == (2, 4)


def test_linear_mixed_tensor_and_array(rng):
    w = rng.normal(size=(4, 3))
    assert nk.gradcheck(lambda x: F.linear(x, w, np.ones(4)), [rng.normal(size=(2, 3))])
    x = rng.normal(size=(2, 3))
    assert nk.gradcheck(lambda w_: F.linear(x, w_), [w])


def test_mse_loss_gradient_reaches_a_tensor_target_and_broadcasts(rng):
    assert nk.gradcheck(lambda p, t: F.mse_loss(p, t), [rng.normal(size=(3, 4)),
                                                       rng.normal(size=(4,))])
    with pytest.raises(ValueError, match="broadcast"):
        F.mse_loss(nk.tensor(np.ones((3, 4))), np.ones((3, 5)))


# ----- cross-entropy specifics -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_is_stable_at_huge_logits(dtype, reduction):
    logits = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4], [0.0, 0.0, -1e4]], dtype=dtype)
    target = np.array([1, 2, 0])
    x = nk.tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, target, reduction=reduction)
    expected_rows = np.array([2e4, np.log(2.0), np.log(2.0)])
    expected = {"mean": expected_rows.mean(), "sum": expected_rows.sum(),
                "none": expected_rows}[reduction]
    assert np.all(np.isfinite(loss.numpy()))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-6)
    loss.backward(np.ones(loss.shape, dtype=dtype))
    assert np.all(np.isfinite(x.grad))
    expected_grad = np.array([[1.0, -1.0, 0.0], [0.0, 0.5, -0.5], [-0.5, 0.5, 0.0]])
    scale = 1 / 3 if reduction == "mean" else 1.0
    np.testing.assert_allclose(x.grad, expected_grad * scale, atol=1e-6)


def test_cross_entropy_all_ignored(rng):
    logits = rng.normal(size=(2, 3))
    target = np.array([-100, -100])
    assert np.isnan(F.cross_entropy(logits, target).item())  # torch: NaN (0 / 0)
    np.testing.assert_array_equal(F.cross_entropy(logits, target, reduction="none").numpy(),
                                  [0.0, 0.0])
    assert F.cross_entropy(logits, target, reduction="sum").item() == 0.0


def test_cross_entropy_rejects_bad_targets(rng):
    logits = rng.normal(size=(3, 4))
    for reduction in ("mean", "sum", "none"):
        with pytest.raises(ValueError):
            F.cross_entropy(logits, np.array([0, 4, 1]), reduction=reduction)
        with pytest.raises(ValueError):
            F.cross_entropy(logits, np.array([0, -1, 1]), reduction=reduction)
    with pytest.raises(TypeError, match="integer"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="3 rows"):
        F.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(ValueError, match="2-D"):
        F.cross_entropy(logits[0], np.array([0]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, np.array([0, 1, 2]), reduction="avg")


# ----- dropout ------------------------------------------------------------------------------
def test_dropout_identity_in_eval_and_at_p_zero(rng):
    x = nk.tensor(rng.normal(size=(4, 5)), requires_grad=True)
    for out in (F.dropout(x, 0.5, training=False), F.dropout(x, 0.0)):
        np.testing.assert_array_equal(out.numpy(), x.numpy())
    assert np.all(F.dropout(x, 1.0).numpy() == 0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_dropout_mask_rate_and_scale(p):
    nk.manual_seed(0)
    n = 200_000
    x = nk.tensor(np.ones(n), requires_grad=True)
    out = F.dropout(x, p).numpy()
    dropped = np.mean(out == 0)
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(dropped - p) < 6 * sigma
    np.testing.assert_allclose(out[out != 0], 1 / (1 - p), rtol=1e-12)
    # the gradient is the same mask and scale
    F.dropout(x, p, rng=7).backward(np.ones(n))
    ref = F.dropout(nk.tensor(np.ones(n)), p, rng=7).numpy()
    np.testing.assert_array_equal(x.grad, ref)


def test_dropout_gradcheck_with_a_fixed_mask(rng):
    assert nk.gradcheck(lambda t: F.dropout(t, 0.4, rng=3), [rng.normal(size=(3, 5))])


def test_dropout_is_reproducible_under_manual_seed(rng):
    x = rng.normal(size=(6, 7)).astype(np.float32)
    nk.manual_seed(42)
    a = F.dropout(x, 0.5).numpy()
    b = F.dropout(x, 0.5).numpy()
    nk.manual_seed(42)
    a2 = F.dropout(x, 0.5).numpy()
    b2 = F.dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)
    assert a.dtype == np.float32


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), float("inf")])
def test_dropout_rejects_bad_p(p):
    with pytest.raises(ValueError, match="p"):
        F.dropout(np.ones(3), p)


# ----- embedding, layer_norm and gelu specifics ---------------------------------------------
def test_embedding_repeated_ids_accumulate():
    w = nk.tensor(np.zeros((4, 2)), requires_grad=True)
    F.embedding(np.array([[1, 1], [3, 1]]), w).sum().backward()
    np.testing.assert_array_equal(w.grad, [[0, 0], [3, 3], [0, 0], [1, 1]])


def test_embedding_rejects_bad_ids():
    w = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        F.embedding(np.array([4]), w)
    with pytest.raises(ValueError):
        F.embedding(np.array([-1]), w)
    with pytest.raises(TypeError, match="integer"):
        F.embedding(np.array([1.0]), w)


def test_layer_norm_rejects_a_wrong_trailing_shape():
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(np.ones((2, 3)), (4,))


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(np.ones(3), approximate="fast")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_finite_and_exact_far_from_zero(approximate):
    # gelu(x) -> x for large x and -> 0 for very negative x; no overflow warnings in float32
    x = nk.tensor(np.array([-1e30, -1e5, -50.0, 50.0, 1e5, 1e30], dtype=np.float32),
                  requires_grad=True)
    y = F.gelu(x, approximate=approximate)
    np.testing.assert_allclose(y.numpy(), np.where(x.numpy() > 0, x.numpy(), 0.0), rtol=1e-6,
                               atol=1e-6)
    y.backward(np.ones(6, dtype=np.float32))
    np.testing.assert_allclose(x.grad, [0, 0, 0, 1, 1, 1], atol=1e-6)
