"""``nnkit.nn``: registration and names, ``state_dict`` round trips with torch, default
initialisation, modes, gradients, Residual and the layers' argument checks."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import import_torch

import nnkit as nk
from nnkit import nn


def _mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3))


def _torch_mlp(torch):
    tn = torch.nn
    return tn.Sequential(tn.Linear(4, 8), tn.ReLU(), tn.LayerNorm(8), tn.Linear(8, 3))


# ----- registration --------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.scale = nn.Parameter(np.ones(3, dtype=np.float32))
        self.layers = nn.ModuleList([nn.Linear(3, 2), nn.Sequential(nn.Tanh(), nn.Linear(2, 2))])
        self.note = "plain attributes are not registered"

    def forward(self, x):
        x = self.proj(x) * self.scale
        for layer in self.layers:
            x = layer(x)
        return x


def test_registration_order_and_dotted_names():
    names = [n for n, _ in Block().named_parameters()]
    # a module's own parameters first, then its children depth-first in assignment order
    assert names == ["scale", "proj.weight", "proj.bias", "layers.0.weight", "layers.0.bias",
                     "layers.1.1.weight", "layers.1.1.bias"]
    modules = [n for n, _ in Block().named_modules()]
    assert modules == ["", "proj", "layers", "layers.0", "layers.1", "layers.1.0", "layers.1.1"]
    assert [n for n, _ in Block().named_children()] == ["proj", "layers"]


def test_registration_order_matches_torch():
    torch = import_torch()
    tn = torch.nn

    class TBlock(tn.Module):
        def __init__(self):
            super().__init__()
            self.proj = tn.Linear(3, 3)
            self.scale = tn.Parameter(torch.ones(3))
            self.layers = tn.ModuleList([tn.Linear(3, 2), tn.Sequential(tn.Tanh(),
                                                                        tn.Linear(2, 2))])

    assert [n for n, _ in Block().named_parameters()] == [n for n, _ in
                                                         TBlock().named_parameters()]
    assert list(Block().state_dict()) == list(TBlock().state_dict())
    assert [n for n, _ in Block().named_modules()] == [n for n, _ in TBlock().named_modules()]


def test_shared_parameters_are_counted_once():
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert len(list(model.parameters())) == 2
    other = nn.Linear(3, 3)
    other.weight = lin.weight  # a tied weight in a different module
    model2 = nn.Sequential(lin, other)
    params = list(model2.parameters())
    assert len(params) == 3
    assert sum(p.numel() for p in params) == 9 + 3 + 3


def test_shared_module_state_dict_keys_match_torch():
    # torch lists a module registered twice under both names in state_dict, so that
    # load_state_dict(torch_model.state_dict()) round-trips
    torch = import_torch()
    lin, tlin = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    tmodel = torch.nn.Sequential(tlin, torch.nn.ReLU(), tlin)
    assert list(model.state_dict()) == list(tmodel.state_dict())
    model.load_state_dict(tmodel.state_dict())


def test_modules_and_parameters_reject_wrong_types():
    with pytest.raises(TypeError):
        nn.Sequential(nn.ReLU(), "relu")
    with pytest.raises(TypeError):
        nn.ModuleList([nn.ReLU(), 3])
    with pytest.raises(TypeError, match="floating-point"):
        nn.Parameter(np.arange(3))

    class Forgetful(nn.Module):
        def __init__(self):
            self.x = 1  # no super().__init__()

    with pytest.raises(AttributeError, match="super"):
        Forgetful()


def test_sequential_and_module_list_containers():
    seq = _mlp()
    assert len(seq) == 4 and isinstance(seq[0], nn.Linear) and isinstance(seq[-1], nn.Linear)
    assert isinstance(seq[1:3], nn.Sequential) and len(seq[1:3]) == 2
    seq.append(nn.Tanh())
    assert [n for n, _ in seq.named_children()] == ["0", "1", "2", "3", "4"]
    ml = nn.ModuleList().extend([nn.ReLU(), nn.Tanh()])
    assert len(ml) == 2 and len(ml[:1]) == 1
    assert "Linear(in_features=4, out_features=8, bias=True)" in repr(seq)


# ----- state_dict and torch ------------------------------------------------------------------
def _torch_models(torch):
    tn = torch.nn
    return {
        "linear": (lambda: nn.Linear(4, 3), lambda: tn.Linear(4, 3)),
        "linear_no_bias": (lambda: nn.Linear(4, 3, bias=False),
                           lambda: tn.Linear(4, 3, bias=False)),
        "embedding": (lambda: nn.Embedding(6, 4), lambda: tn.Embedding(6, 4)),
        "layer_norm": (lambda: nn.LayerNorm(4), lambda: tn.LayerNorm(4)),
        "layer_norm_2d": (lambda: nn.LayerNorm((3, 4), eps=1e-3),
                          lambda: tn.LayerNorm((3, 4), eps=1e-3)),
        "mlp": (_mlp, lambda: _torch_mlp(torch)),
        "nested": (lambda: nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.GELU()),
                                         nn.Linear(4, 2), nn.Sigmoid()),
                   lambda: tn.Sequential(tn.Sequential(tn.Linear(4, 4), tn.GELU()),
                                         tn.Linear(4, 2), tn.Sigmoid())),
    }


MODEL_NAMES = ["linear", "linear_no_bias", "embedding", "layer_norm", "layer_norm_2d", "mlp",
               "nested"]


def _input(name, torch, rng):
    if name == "embedding":
        ids = np.array([[0, 5, 2], [2, 2, 1]])
        return ids, torch.as_tensor(ids)
    shape = (2, 5, 3, 4) if name == "layer_norm_2d" else (2, 5, 4)
    x = rng.normal(size=shape).astype(np.float32)
    return x, torch.as_tensor(x)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_state_dict_keys_and_shapes_equal_torch(name):
    torch = import_torch()
    make, tmake = _torch_models(torch)[name]
    sd, tsd = make().state_dict(), tmake().state_dict()
    assert list(sd) == list(tsd)
    for k in sd:
        assert tuple(sd[k].shape) == tuple(tsd[k].shape), k
        assert sd[k].dtype == np.float32


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_load_torch_state_dict_then_same_outputs_and_gradients(name, rng):
    torch = import_torch()
    make, tmake = _torch_models(torch)[name]
    model, tmodel = make(), tmake()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for p in tmodel.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    missing, unexpected = model.load_state_dict(tmodel.state_dict())
    assert missing == [] and unexpected == []
    x, tx = _input(name, torch, rng)
    xin = x if x.dtype.kind == "i" else nk.tensor(x, requires_grad=True)
    if x.dtype.kind != "i":
        tx.requires_grad_(True)
    out, tout = model(xin), tmodel(tx)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    upstream = rng.normal(size=out.shape).astype(np.float32)
    out.backward(upstream)
    tout.backward(torch.as_tensor(upstream))
    named = dict(tmodel.named_parameters())
    for k, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, named[k].grad.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=k)
    if x.dtype.kind != "i":
        np.testing.assert_allclose(xin.grad, tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_load_state_dict_copies_and_accepts_nnkit_arrays():
    a, b = _mlp(), _mlp()
    b.load_state_dict(a.state_dict())
    for (ka, pa), (kb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert ka == kb
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
        assert pa.data is not pb.data  # copied, not aliased
    sd = a.state_dict()
    sd["0.weight"] = sd["0.weight"].astype(np.float64)  # cast to the module's dtype
    b.load_state_dict(sd)
    assert b[0].weight.dtype == np.float32


def test_strict_load_names_missing_and_unexpected_keys():
    model = _mlp()
    sd = model.state_dict()
    sd.pop("3.bias")
    sd["extra.weight"] = np.zeros(2, dtype=np.float32)
    with pytest.raises(KeyError, match=r"3\.bias.*extra\.weight"):
        model.load_state_dict(sd)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert missing == ["3.bias"] and unexpected == ["extra.weight"]


def test_shape_mismatch_raises_value_error_naming_key_and_shapes():
    model = _mlp()
    sd = model.state_dict()
    sd["0.weight"] = np.zeros((8, 5), dtype=np.float32)
    with pytest.raises(ValueError, match=r"0\.weight.*\(8, 5\).*\(8, 4\)"):
        model.load_state_dict(sd)
    with pytest.raises(ValueError, match=r"0\.weight"):
        model.load_state_dict(sd, strict=False)


@pytest.mark.parametrize("value", [np.array([[None, 1.0], [2.0, 3.0]], dtype=object),
                                   np.ones((2, 2)) * 1j, np.array([["a", "b"], ["c", "d"]])],
                         ids=["object", "complex", "str"])
def test_load_state_dict_rejects_non_real_arrays(value):
    # an object array with None would load NaN silently; complex would drop the imaginary part
    layer = nn.Linear(2, 2)
    before = layer.weight.numpy().copy()
    with pytest.raises(TypeError, match="weight"):
        layer.load_state_dict({"weight": value, "bias": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(layer.weight.numpy(), before)


# ----- initialisation and seeding ------------------------------------------------------------
def test_linear_default_init_matches_torch_distribution():
    nk.manual_seed(0)
    layer = nn.Linear(64, 256)
    bound = 1 / np.sqrt(64)
    for p in (layer.weight.numpy(), layer.bias.numpy()):
        assert p.dtype == np.float32
        assert np.all(np.abs(p) <= bound)
    w = layer.weight.numpy().ravel()
    # uniform on [-bound, bound]: mean 0, variance bound^2 / 3, flat histogram
    assert abs(w.mean()) < 4 * bound / np.sqrt(3 * w.size)
    np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.05)
    counts, _ = np.histogram(w, bins=8, range=(-bound, bound))
    np.testing.assert_allclose(counts / w.size, 1 / 8, atol=0.015)
    assert w.min() < -0.95 * bound and w.max() > 0.95 * bound


def test_linear_default_init_statistics_equal_torch():
    torch = import_torch()
    torch.manual_seed(0)
    nk.manual_seed(0)
    tw = torch.nn.Linear(32, 512).weight.detach().numpy().ravel()
    w = nn.Linear(32, 512).weight.numpy().ravel()
    np.testing.assert_allclose(w.std(), tw.std(), rtol=0.03)
    np.testing.assert_allclose([w.min(), w.max()], [tw.min(), tw.max()], atol=2e-3)


def test_embedding_and_layer_norm_default_init():
    nk.manual_seed(1)
    w = nn.Embedding(500, 64).weight.numpy()
    assert w.dtype == np.float32
    assert abs(w.mean()) < 0.02 and abs(w.std() - 1) < 0.02
    ln = nn.LayerNorm((3, 4))
    np.testing.assert_array_equal(ln.weight.numpy(), np.ones((3, 4)))
    np.testing.assert_array_equal(ln.bias.numpy(), np.zeros((3, 4)))
    assert nn.LayerNorm(4, elementwise_affine=False).state_dict() == {}
    assert list(nn.LayerNorm(4, bias=False).state_dict()) == ["weight"]


def test_manual_seed_reproducibility():
    nk.manual_seed(123)
    a = [p.numpy().copy() for p in _mlp().parameters()]
    emb_a = nn.Embedding(5, 3).weight.numpy().copy()
    nk.manual_seed(123)
    b = [p.numpy().copy() for p in _mlp().parameters()]
    emb_b = nn.Embedding(5, 3).weight.numpy().copy()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(emb_a, emb_b)
    assert not np.array_equal(a[0], nn.Linear(4, 8).weight.numpy())


def test_float64_layers():
    layer = nn.Linear(3, 2, dtype=np.float64)
    assert layer.weight.dtype == np.float64
    assert layer(np.ones((1, 3))).dtype == np.float64
    with pytest.raises(TypeError, match="dtype"):
        nn.Linear(3, 2, dtype=np.int32)
    model = _mlp().double()
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert nk.gradcheck(lambda x: model(x), [np.random.default_rng(0).normal(size=(2, 4))])


# ----- modes and gradients -------------------------------------------------------------------
def test_train_and_eval_propagate():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5), nn.ReLU()))
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    model.train(False)
    assert not model[1][0].training


def test_dropout_module_follows_the_mode():
    nk.manual_seed(0)
    drop = nn.Dropout(0.5)
    x = np.ones((50, 50), dtype=np.float32)
    assert np.any(drop(x).numpy() == 0)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x)
    with pytest.raises(ValueError, match="p"):
        nn.Dropout(1.5)


def test_zero_grad():
    model = _mlp()
    model(np.ones((2, 4), dtype=np.float32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_gradients_accumulate_over_two_backward_calls():
    model = nn.Linear(3, 1)
    x = np.ones((1, 3), dtype=np.float32)
    model(x).sum().backward()
    first = model.weight.grad.copy()
    model(x).sum().backward()
    np.testing.assert_allclose(model.weight.grad, 2 * first)


# ----- Residual ------------------------------------------------------------------------------
def _zero(module):
    for p in module.parameters():
        p.data[...] = 0
    return module


def test_residual_with_zero_parameters_is_the_identity(rng):
    block = _zero(nn.Residual(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 4),
                                            nn.Tanh())))
    x = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_array_equal(block(x).numpy(), x)  # F[0, 0] = Id
    np.testing.assert_array_equal(block(x[0]).numpy(), x[0])  # a single (unbatched) input


def test_residual_subtracts_fn_of_zero(rng):
    fn = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    block = nn.Residual(fn)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    zero_out = fn(np.zeros((1, 4), dtype=np.float32)).numpy()
    np.testing.assert_allclose(block(x).numpy(), x + fn(x).numpy() - zero_out, rtol=1e-6)
    np.testing.assert_allclose(block(np.zeros((2, 4), dtype=np.float32)).numpy(), 0, atol=1e-7)


def test_residual_with_projection_gives_v_x(rng):
    v = nn.Linear(4, 2, bias=False)
    block = nn.Residual(_zero(nn.Sequential(nn.Linear(4, 2), nn.Tanh())), projection=v)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(block(x).numpy(), x @ v.weight.numpy().T, rtol=1e-6)
    names = [n for n, _ in block.named_parameters()]
    assert names == ["fn.0.weight", "fn.0.bias", "projection.weight"]


def test_residual_without_subtract_origin(rng):
    fn = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    block = nn.Residual(fn, subtract_origin=False)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(block(x).numpy(), x + fn(x).numpy(), rtol=1e-6)


def test_residual_dimension_mismatch_without_projection_raises():
    block = nn.Residual(nn.Linear(4, 3))
    with pytest.raises(ValueError, match="projection"):
        block(np.ones((2, 4), dtype=np.float32))


def test_residual_gradcheck(rng):
    block = nn.Residual(nn.Sequential(nn.Linear(3, 3), nn.Tanh()),
                        projection=nn.Linear(3, 3, bias=False)).double()
    assert nk.gradcheck(lambda x: block(x), [rng.normal(size=(2, 3))])
    # the parameters enter through fn(x) and fn(0): both paths must be differentiated;
    # gradcheck perturbs the Parameters (float64 leaves) in place
    x = rng.normal(size=(2, 3))
    assert nk.gradcheck(lambda *ps: block(x), list(block.parameters()))


# ----- layer checks ---------------------------------------------------------------------------
def test_linear_rejects_wrong_in_features():
    layer = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="in_features=4"):
        layer(np.ones((3, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="in_features=4"):
        layer(nk.tensor(1.0))


@pytest.mark.parametrize("args", [(0, 2), (2, -1), (2.5, 3), (True, 2), (None, 2)])
def test_linear_rejects_bad_sizes(args):
    with pytest.raises((TypeError, ValueError)):
        nn.Linear(*args)


def test_embedding_padding_idx_gets_no_gradient_like_torch():
    torch = import_torch()
    emb = nn.Embedding(5, 3, padding_idx=1)
    temb = torch.nn.Embedding(5, 3, padding_idx=1)
    np.testing.assert_array_equal(emb.weight.numpy()[1], 0)
    emb.load_state_dict(temb.state_dict())
    ids = np.array([[1, 2, 1], [0, 1, 4]])
    out, tout = emb(ids), temb(torch.as_tensor(ids))
    np.testing.assert_array_equal(out.numpy(), tout.detach().numpy())
    upstream = np.random.default_rng(0).normal(size=out.shape).astype(np.float32)
    out.backward(upstream)
    tout.backward(torch.as_tensor(upstream))
    np.testing.assert_allclose(emb.weight.grad, temb.weight.grad.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(emb.weight.grad[1], 0)


def test_embedding_negative_padding_idx_and_bad_ids():
    emb = nn.Embedding(5, 3, padding_idx=-1)
    assert emb.padding_idx == 4
    with pytest.raises(ValueError):
        nn.Embedding(5, 3, padding_idx=5)
    with pytest.raises(ValueError, match="num_embeddings=5"):
        emb(np.array([5]))


def test_layer_norm_module_rejects_bad_shapes_and_eps():
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(4)(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="eps"):
        nn.LayerNorm(4, eps=0.0)


def test_activation_modules_match_functional(rng):
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    F = nk.functional
    pairs = [(nn.ReLU(), F.relu(x)), (nn.Sigmoid(), F.sigmoid(x)), (nn.Tanh(), F.tanh(x)),
             (nn.GELU(), F.gelu(x)), (nn.GELU("tanh"), F.gelu(x, "tanh")),
             (nn.Softmax(dim=1), F.softmax(x, axis=1)), (nn.Identity(), nk.tensor(x))]
    for module, expected in pairs:
        np.testing.assert_allclose(module(x).numpy(), expected.numpy(), err_msg=repr(module))
    assert nn.Flatten()(x).shape == (2, 12)
    assert nn.Flatten(0, 1)(x).shape == (6, 4)


def test_loss_modules_match_functional(rng):
    F = nk.functional
    logits = rng.normal(size=(4, 3))
    target = np.array([0, 2, -100, 1])
    np.testing.assert_allclose(nn.CrossEntropyLoss()(logits, target).item(),
                               F.cross_entropy(logits, target).item())
    np.testing.assert_allclose(nn.CrossEntropyLoss(reduction="sum")(logits, target).item(),
                               F.cross_entropy(logits, target, reduction="sum").item())
    y = rng.random((4, 3))
    np.testing.assert_allclose(nn.MSELoss()(logits, y).item(), F.mse_loss(logits, y).item())
    pw = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(nn.BCEWithLogitsLoss(pos_weight=pw)(logits, y).item(),
                               F.binary_cross_entropy_with_logits(logits, y,
                                                                  pos_weight=pw).item())


def test_loss_modules_check_reduction_in_init():
    # hyper-parameters are checked in __init__, not at the first forward
    for cls in (nn.MSELoss, nn.CrossEntropyLoss, nn.BCEWithLogitsLoss):
        with pytest.raises(ValueError, match="reduction"):
            cls(reduction="avg")
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")


def test_flatten_rejects_out_of_range_dims():
    # torch raises IndexError; nnkit should raise ValueError rather than wrap the index
    with pytest.raises(ValueError):
        nn.Flatten(5, 7)(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"end_dim=7 is out of range for a 2-dimensional"):
        nn.Flatten(1, 7)(np.ones((2, 3), dtype=np.float32))


def test_flatten_start_after_end_names_both_dims():
    # NumPy's "cannot reshape array of size 120 into shape (2,3,4,1,4,5)" came out before;
    # torch raises at the forward, nnkit already in __init__ when no input can fit
    for start, end in [(3, 1), (-1, -3)]:
        with pytest.raises(ValueError, match=rf"Flatten: start_dim={start} comes after "
                                             rf"end_dim={end}"):
            nn.Flatten(start, end)
    with pytest.raises(TypeError, match="start_dim must be an integer"):
        nn.Flatten(1.0)
    x = np.ones((2, 3, 4, 5), dtype=np.float32)
    flatten = nn.Flatten(2, -3)  # signs differ: it depends on the input's ndim
    with pytest.raises(ValueError, match=r"start_dim=2 comes after end_dim=-3 \(dim 1\) for "
                                         r"an input of shape \(2, 3, 4, 5\) \(4-dimensional\)"):
        flatten(x)
    assert flatten(np.ones((2, 3, 4, 5, 6, 7))).shape == (2, 3, 20, 6, 7)
    assert nn.Flatten(2, 2)(x).shape == x.shape  # a single dim: unchanged, as torch
