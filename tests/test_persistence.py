"""nk.save / nk.load: round trips, checkpoint resume, atomic writes, damaged files."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nk
from nnkit import functional as F
from nnkit import nn
from nnkit._safetensors import FileFormatError, read_file, write_file


def _first_tensor(out):
    if isinstance(out, tuple):
        return out[0]
    return out if isinstance(out, nk.Tensor) else next(
        v for v in vars(out).values() if isinstance(v, nk.Tensor))  # a model's output record


def _outputs_equal(a, b, *inputs):
    a.eval()
    b.eval()
    with nk.no_grad():
        ya, yb = _first_tensor(a(*inputs)), _first_tensor(b(*inputs))
    np.testing.assert_array_equal(ya.numpy(), yb.numpy())


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def _round_trip(obj, tmp_path, **kw):
    path = tmp_path / "obj.safetensors"
    nk.save(obj, path)
    return nk.load(path, **kw)


_tokens = np.random.default_rng(0).integers(3, 40, size=(2, 7))
MODULES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)),
            lambda: (np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32),)),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(4 * 4 * 4, 3)),
            lambda: (np.random.default_rng(1).normal(size=(2, 1, 8, 8)).astype(np.float32),)),
    "lstm": (lambda: nn.LSTM(3, 5, num_layers=2, bidirectional=True),
             lambda: (np.random.default_rng(1).normal(size=(6, 2, 3)).astype(np.float32),)),
    "gru": (lambda: nn.GRU(3, 4, batch_first=True),
            lambda: (np.random.default_rng(1).normal(size=(2, 6, 3)).astype(np.float32),)),
    "mingru": (lambda: nn.MinGRU(3, 4),
               lambda: (np.random.default_rng(1).normal(size=(2, 6, 3)).astype(np.float32),)),
    "lru": (lambda: nn.LRU(3, 4, r_min=0.5, r_max=0.9),
            lambda: (np.random.default_rng(1).normal(size=(2, 6, 3)).astype(np.float32),)),
    "encoder": (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
                lambda: (np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32),)),
    "bert": (lambda: nk.models.BertForPreTraining(40, 16, 2, 2, 32, max_position=16),
             lambda: (_tokens,)),
    "bert-classifier": (lambda: nk.models.BertForSequenceClassification(
                            nk.models.Bert(40, 16, 1, 2, 32, max_position=16), 3),
                        lambda: (_tokens,)),
    "vit": (lambda: nk.models.ViT(8, 4, 1, 10, 16, 1, 2, 32),
            lambda: (np.random.default_rng(1).normal(size=(2, 1, 8, 8)).astype(np.float32),)),
    "translator": (lambda: nk.models.TransformerTranslator(40, 40, d_model=16, nhead=2,
                                                           num_encoder_layers=1,
                                                           num_decoder_layers=1,
                                                           dim_feedforward=32),
                   lambda: (_tokens, _tokens[:, :5])),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_module_round_trip(name, tmp_path):
    make, inputs = MODULES[name]
    nk.manual_seed(0)
    model = make()
    nk.manual_seed(1)  # a different initialisation: equality must come from the file
    loaded = _round_trip(model, tmp_path)
    assert type(loaded) is type(model)
    _same_state(model, loaded)
    _outputs_equal(model, loaded, *inputs())


def test_module_keeps_dtype_mode_and_appended_children(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4)).double()
    model.append(nn.Tanh()).append(nn.Linear(4, 2).double())
    model.eval()
    loaded = _round_trip(model, tmp_path)
    assert len(loaded) == 3 and not loaded.training and not loaded[2].training
    assert all(p.dtype == np.float64 for p in loaded.parameters())
    _same_state(model, loaded)


def test_saved_module_is_a_plain_state_dict_for_other_readers(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    model = MODULES["lstm"][0]()
    path = tmp_path / "lstm.safetensors"
    nk.save(model, path)
    plain = safetensors.load_file(str(path))
    assert set(plain) == set(model.state_dict())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(plain[k], v)


def test_foreign_safetensors_file_loads_as_a_dict(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    model = nn.Linear(3, 2)
    path = tmp_path / "foreign.safetensors"
    safetensors.save_file({k: np.ascontiguousarray(v) for k, v in model.state_dict().items()},
                          str(path))
    state = nk.load(path)
    fresh = nn.Linear(3, 2)
    fresh.load_state_dict(state)
    _same_state(model, fresh)


def test_tied_weights_stay_tied(tmp_path):
    model = nk.models.BertForPreTraining(40, 16, 1, 2, 32, max_position=16)
    loaded = _round_trip(model, tmp_path)
    assert loaded.decoder_weight is loaded.bert.embeddings.word_embeddings.weight
    opt = nk.optim.SGD(loaded.parameters(), lr=0.1)
    out = loaded(_tokens, mlm_labels=_tokens, next_sentence_labels=np.array([0, 1]))
    out.loss.backward()
    opt.step()
    assert loaded.decoder_weight is loaded.bert.embeddings.word_embeddings.weight


def test_complex_and_nested_values(tmp_path):
    z = (np.arange(6) + 1j * np.arange(6)[::-1]).astype(np.complex128).reshape(2, 3)
    obj = {"z": z, "z64": z.astype(np.complex64), "t": (1, 2.5, float("inf"), None, "s"),
           "dt": np.float32, "n": np.int16(7), 3: [True, {"x": np.arange(3)}]}
    out = _round_trip(obj, tmp_path)
    assert out["z"].dtype == np.complex128 and out["z64"].dtype == np.complex64
    np.testing.assert_array_equal(out["z"], z)
    assert out["t"] == (1, 2.5, float("inf"), None, "s")
    assert out["dt"] == np.dtype(np.float32)
    assert out["n"] == 7 and out["n"].dtype == np.int16
    assert out[3][0] is True
    np.testing.assert_array_equal(out[3][1]["x"], np.arange(3))


# ----- shared modules and parameters, tensor names ------------------------------------------
def _extra_metadata(path):
    return {k: v for k, v in read_file(path)[1].items() if k not in ("nnkit", "nnkit_crc32")}


def test_module_used_twice_comes_back_as_one(tmp_path):
    layer = nn.Linear(2, 2)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    path = tmp_path / "m.safetensors"
    nk.save(model, path)
    loaded = nk.load(path)
    assert loaded[0] is loaded[2] and loaded[0] is not loaded[1]
    assert len(list(loaded.parameters())) == len(list(model.parameters())) == 2
    _same_state(model, loaded)
    # stored once under the first state_dict name, the other names recorded (as safetensors)
    assert list(read_file(path)[0]) == ["0.weight", "0.bias"]
    assert _extra_metadata(path) == {"2.weight": "0.weight", "2.bias": "0.bias"}


def _tied_lm():
    """An embedding and an output projection sharing one Parameter (weight tying)."""
    model = nn.Sequential(nn.Embedding(12, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 12,
                                                                                    bias=False))
    model[3].weight = model[0].weight
    return model


def test_parameter_shared_by_two_modules_stays_shared(tmp_path):
    model = _tied_lm()
    assert len(list(model.parameters())) == 3
    path = tmp_path / "m.safetensors"
    nk.save(model, path)
    loaded = nk.load(path)
    assert loaded[3].weight is loaded[0].weight and loaded[3] is not loaded[0]
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in model.named_parameters()]
    _same_state(model, loaded)
    assert "3.weight" not in read_file(path)[0]
    assert _extra_metadata(path) == {"3.weight": "0.weight"}
    opt = nk.optim.SGD(loaded.parameters(), lr=0.5)
    F.cross_entropy(loaded(np.array([1, 2, 3])), np.array([3, 2, 1])).backward()
    opt.step()
    assert loaded[3].weight is loaded[0].weight
    np.testing.assert_array_equal(loaded.state_dict()["3.weight"], loaded[0].weight.data)


def test_parameter_shared_between_checkpoint_entries_stays_shared(tmp_path):
    """An embedding and an output layer saved as two entries of a checkpoint, one weight:
    one Parameter after loading, which the optimizer steps for both."""
    emb, out = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
    out.weight = emb.weight
    path = tmp_path / "ck.safetensors"
    nk.save({"emb": emb, "out": out, "opt": nk.optim.SGD(emb.parameters(), lr=0.5)}, path)
    ck = nk.load(path)
    assert ck["out"].weight is ck["emb"].weight
    assert ck["opt"].param_groups[0]["params"][0] is ck["emb"].weight
    F.cross_entropy(ck["out"](ck["emb"](np.array([1, 2]))), np.array([2, 1])).backward()
    before = ck["emb"].weight.data.copy()
    ck["opt"].step()
    assert not np.array_equal(ck["out"].weight.data, before)


class TiedNet(nn.Module):
    """Ties in its constructor: out.weight is emb.weight, head is out."""

    def __init__(self, n, d):
        super().__init__()
        self.emb = nn.Embedding(n, d)
        self.out = nn.Linear(d, n, bias=False)
        self.out.weight = self.emb.weight
        self.head = self.out


def test_sharing_undone_after_construction_stays_undone(tmp_path):
    model = TiedNet(6, 3)
    model.out.weight = nn.Parameter(model.emb.weight.data + 1)  # untied after construction
    loaded = _round_trip(model, tmp_path, classes=[TiedNet])
    assert loaded.out.weight is not loaded.emb.weight and loaded.head is loaded.out
    _same_state(model, loaded)
    model.head = nn.Linear(3, 6, bias=False)
    loaded = _round_trip(model, tmp_path, classes=[TiedNet])
    assert loaded.head is not loaded.out and loaded.out.weight is not loaded.emb.weight
    assert len(list(loaded.parameters())) == 3
    _same_state(model, loaded)
    fresh = TiedNet(6, 3)  # and a model saved as constructed stays tied
    loaded = _round_trip(fresh, tmp_path, classes=[TiedNet])
    assert loaded.out.weight is loaded.emb.weight and loaded.head is loaded.out


def test_module_shared_between_checkpoint_entries(tmp_path):
    model = nk.models.BertForPreTraining(40, 16, 1, 2, 32, max_position=16)
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    layer.linear1.weight.data[...] = 0.5  # its own state, not that of the encoder's copies
    encoder = nn.TransformerEncoder(layer, 2)
    out = _round_trip({"model": model, "embeddings": model.bert.embeddings, "again": model,
                       "encoder": encoder, "layer": layer}, tmp_path)
    assert out["again"] is out["model"]
    assert out["embeddings"] is out["model"].bert.embeddings
    _same_state(model, out["model"])
    _same_state(encoder, out["encoder"])
    _same_state(layer, out["layer"])


def test_optimizer_of_tied_model_resumes_exactly(tmp_path):
    """Tied module + tied Parameter + Adam: resume from a checkpoint as if never stopped."""
    def build():
        model = _tied_lm()
        shared = nn.Linear(8, 8)
        return nn.Sequential(model[0], shared, nn.Tanh(), shared, nn.Tanh(), model[3])

    data = np.random.default_rng(3)
    X = data.integers(0, 12, size=64)
    y = data.integers(0, 12, size=64)
    nk.manual_seed(0)
    model = build()
    assert model[5].weight is model[0].weight and model[1] is model[3]
    opt = nk.optim.Adam(model.parameters(), lr=1e-2)
    batches = np.random.default_rng(9)
    _train(model, opt, X, y, 3, batches)
    path = tmp_path / "ckpt.safetensors"
    nk.save({"model": model, "optimizer": opt, "batches": batches}, path)
    _train(model, opt, X, y, 4, batches)  # the run that never stopped

    ckpt = nk.load(path)
    loaded, lopt = ckpt["model"], ckpt["optimizer"]
    assert loaded[5].weight is loaded[0].weight and loaded[1] is loaded[3]
    assert lopt.param_groups[0]["params"] == list(loaded.parameters())
    assert len(lopt.param_groups[0]["params"]) == len(list(model.parameters())) == 3
    _train(loaded, lopt, X, y, 4, ckpt["batches"])
    _same_state(model, loaded)
    assert loaded[5].weight is loaded[0].weight and loaded[1] is loaded[3]


NAMED = {
    "residual": (lambda: nn.Residual(nn.Sequential(nn.Linear(4, 3), nn.Sigmoid()),
                                     projection=nn.Linear(4, 3, bias=False)),
                 lambda: (np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32),)),
    "transformer-encoder": (
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
                                      norm=nn.LayerNorm(8)),
        lambda: (np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32),)),
    "nested-sequential": (
        lambda: nn.Sequential(nn.Linear(8, 8),
                              nn.Sequential(nn.Residual(nn.Linear(8, 8)), nn.GELU()),
                              nn.TransformerEncoder(nn.TransformerEncoderLayer(
                                  8, 2, 16, batch_first=True), 1)),
        lambda: (np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32),)),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_tensor_names_are_the_state_dict_keys(name, tmp_path):
    make, inputs = NAMED[name]
    nk.manual_seed(0)
    model = make()
    path = tmp_path / "m.safetensors"
    nk.save(model, path)
    tensors = read_file(path)[0]
    assert list(tensors) == list(model.state_dict())
    assert _extra_metadata(path) == {}
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(tensors[k], v)
    nk.manual_seed(1)
    loaded = nk.load(path)
    _same_state(model, loaded)
    _outputs_equal(model, loaded, *inputs())
    safetensors = pytest.importorskip("safetensors.numpy")
    assert set(safetensors.load_file(str(path))) == set(model.state_dict())


def test_checkpoint_tensor_names_and_name_clashes(tmp_path):
    model = nn.Sequential(nn.Residual(nn.Linear(3, 3)), nn.ReLU())
    out = _round_trip({"model": model, "a.b": np.arange(2), "a": {"b": np.arange(3)}}, tmp_path)
    assert list(read_file(tmp_path / "obj.safetensors")[0]) == [
        "model/0.fn.weight", "model/0.fn.bias", "a.b", "a.b#2"]
    np.testing.assert_array_equal(out["a.b"], np.arange(2))
    np.testing.assert_array_equal(out["a"]["b"], np.arange(3))
    _same_state(model, out["model"])


def _format_1_checkpoint(path):
    """{'model', 'optimizer', 'step'} written as nnkit format 1 wrote it (the layout of the
    nnkit before format 2, built here by hand): the Linear given to Residual has its own
    tensors 'model.0.args.0/weight', which the model's state refers to."""
    nk.manual_seed(0)
    model = nn.Sequential(nn.Residual(nn.Linear(3, 3)), nn.ReLU(), nn.Linear(3, 2))
    opt = nk.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(np.ones((2, 3), np.float32)).sum().backward()
    opt.step()
    names = {"0.fn.weight": "model.0.args.0/weight", "0.fn.bias": "model.0.args.0/bias",
             "2.weight": "model/2.weight", "2.bias": "model/2.bias"}
    tensors = {names[k]: np.array(v) for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        tensors[f"optimizer.state.{i}.momentum_buffer"] = np.array(
            opt.state[p]["momentum_buffer"])

    def linear(n_in, n_out, state=None):
        node = {"class": "nnkit.nn.layers:Linear", "training": True, "args": [n_in, n_out],
                "kwargs": {}}
        return {**node, "state": state} if state else node

    ref = {k: {"__tensor__": v} for k, v in names.items()}
    hyper = [["lr", 0.1], ["momentum", 0.9], ["dampening", 0], ["weight_decay", 0],
             ["nesterov", False], ["maximize", False]]
    residual = {"class": "nnkit.nn.layers:Residual", "training": True, "kwargs": {},
                "args": [{"__module__": linear(3, 3, {"weight": ref["0.fn.weight"],
                                                      "bias": ref["0.fn.bias"]})}]}
    sequential = {"class": "nnkit.nn.module:Sequential", "training": True, "state": ref,
                  "children": [["0", residual], ["1", {"class": "nnkit.nn.layers:ReLU",
                                                       "training": True, "args": [],
                                                       "kwargs": {}}],
                               ["2", linear(3, 2)]]}
    momentum = {"__dict__": [[i, {"__dict__": [["momentum_buffer", {
        "__tensor__": f"optimizer.state.{i}.momentum_buffer"}]]}] for i in range(4)]}
    optimizer = {"class": "nnkit.optim:SGD", "defaults": {"__dict__": hyper},
                 "state_dict": {"__dict__": [["state", momentum], ["param_groups", [
                     {"__dict__": [*hyper, ["params", [0, 1, 2, 3]]]}]]]},
                 "params": [["model", k] for k in names]}
    config = {"format": "nnkit", "format_version": 1, "nnkit_version": nk.__version__,
              "object": {"__dict__": [["model", {"__module__": sequential}],
                                      ["optimizer", {"__optimizer__": optimizer}],
                                      ["step", 1]]},
              "complex": [],
              "tensors": {n: [a.dtype.str, list(a.shape), zlib.crc32(a.reshape(-1).view(np.uint8))]
                          for n, a in tensors.items()}}
    text = json.dumps(config)
    write_file(path, tensors, {"nnkit": text, "nnkit_crc32": str(zlib.crc32(text.encode()))})
    return model, opt


def test_format_1_files_still_load(tmp_path):
    path = tmp_path / "v1.safetensors"
    model, opt = _format_1_checkpoint(path)
    assert "model.0.args.0/weight" in read_file(path)[0]
    ckpt = nk.load(path)
    assert ckpt["step"] == 1 and isinstance(ckpt["model"][0], nn.Residual)
    _same_state(model, ckpt["model"])
    assert ckpt["optimizer"].param_groups[0]["params"] == list(ckpt["model"].parameters())
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    for m, o in ((model, opt), (ckpt["model"], ckpt["optimizer"])):
        for _ in range(3):
            o.zero_grad()
            (m(x) ** 2).sum().backward()
            o.step()
    _same_state(model, ckpt["model"])
    nk.save(ckpt, path)  # written again: format 2, state_dict names
    assert list(read_file(path)[0])[:2] == ["model/0.fn.weight", "model/0.fn.bias"]
    _same_state(model, nk.load(path)["model"])


# ----- estimators ---------------------------------------------------------------------------
def test_estimators_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = (X @ np.array([1.0, -2.0, 0.5, 1.0]) > 0).astype(int)
    for est in (nk.classic.Perceptron(max_epochs=50).fit(X, y),
                nk.classic.LogisticRegression(max_epochs=5, random_state=0).fit(X, y),
                nk.classic.LinearRegression().fit(X, X @ np.arange(4.0))):
        loaded = _round_trip(est, tmp_path)
        assert loaded.get_params() == est.get_params()
        np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
        np.testing.assert_array_equal(loaded.coef_, est.coef_)


def test_associative_memories_round_trip(tmp_path):
    xi = np.random.default_rng(0).choice([-1, 1], size=(3, 64))
    noisy = xi[0].copy()
    noisy[:12] *= -1
    for net in (nk.classic.Hopfield(64).store(xi),
                nk.classic.DenseAssociativeMemory(degree=3).store(xi)):
        loaded = _round_trip(net, tmp_path)
        np.testing.assert_array_equal(loaded.run(noisy, random_state=0).states,
                                      net.run(noisy, random_state=0).states)
    modern = nk.classic.ModernHopfield(beta=4.0).store(xi.astype(float))
    loaded = _round_trip(modern, tmp_path)
    np.testing.assert_array_equal(loaded.retrieve(noisy.astype(float)),
                                  modern.retrieve(noisy.astype(float)))
    unit = nk.classic.McCullochPitts(np.array([1, 1, -1]), 1.5)
    loaded = _round_trip(unit, tmp_path)
    states = np.array([[1, 1, 0], [1, 0, 1], [1, 1, 1]])
    np.testing.assert_array_equal(loaded.predict(states), unit.predict(states))


# ----- optimizers and resuming --------------------------------------------------------------
def _train(model, opt, X, y, steps, rng):
    for _ in range(steps):
        idx = rng.choice(len(X), size=16, replace=False)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()


def _classifier():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))


@pytest.mark.parametrize("make_opt", [
    lambda p: nk.optim.Adam(p, lr=1e-2, betas=(0.8, 0.99), weight_decay=1e-3),
    lambda p: nk.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    lambda p: nk.optim.AdamW(p, lr=1e-2),
    lambda p: nk.optim.Adagrad(p, lr=0.1),
])
def test_resume_from_checkpoint_is_exact(make_opt, tmp_path):
    data = np.random.default_rng(5)
    X = data.normal(size=(64, 8)).astype(np.float32)
    y = data.integers(0, 3, size=64)
    nk.manual_seed(0)
    model = _classifier()
    opt = make_opt(model.parameters())
    batches = np.random.default_rng(9)
    _train(model, opt, X, y, 5, batches)
    path = tmp_path / "ckpt.safetensors"
    nk.save({"model": model, "optimizer": opt, "batches": batches, "rng": nk.get_rng(),
             "step": 5}, path)
    _train(model, opt, X, y, 5, batches)  # the run that never stopped

    ckpt = nk.load(path)
    nk.set_rng(ckpt["rng"])
    assert ckpt["step"] == 5 and type(ckpt["optimizer"]) is type(opt)
    assert ckpt["optimizer"].param_groups[0]["params"][0] is ckpt["model"][0].weight
    _train(ckpt["model"], ckpt["optimizer"], X, y, 5, ckpt["batches"])
    _same_state(model, ckpt["model"])


def test_optimizer_saved_alone_loads_as_its_state_dict(tmp_path):
    model = nn.Linear(3, 2)
    opt = nk.optim.Adam(model.parameters(), lr=0.01)
    model(np.ones((2, 3), np.float32)).sum().backward()
    opt.step()
    state = _round_trip(opt, tmp_path)
    fresh = nk.optim.Adam(model.parameters(), lr=0.5)
    fresh.load_state_dict(state)
    assert fresh.param_groups[0]["lr"] == 0.01
    np.testing.assert_array_equal(fresh.state[model.weight]["exp_avg"],
                                  opt.state[model.weight]["exp_avg"])


# ----- bad input, damaged files ----------------------------------------------------------------
def test_save_into_missing_folder_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        nk.save(nn.Linear(2, 2), tmp_path / "nope" / "m.safetensors")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(IsADirectoryError):
        nk.save(nn.Linear(2, 2), tmp_path)


def test_unsavable_object_leaves_previous_file_intact(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    nk.save({"w": np.arange(3)}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="'extra.fn'"):
        nk.save({"w": np.arange(4), "extra": {"fn": lambda x: x}}, path)
    with pytest.raises(TypeError, match="'args.0'"):
        nk.save(_ModuleWithFunction(print), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]


class _ModuleWithFunction(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(2, width)

    def forward(self, x):
        return self.fc(x)


def test_classes_outside_nnkit_need_permission(tmp_path):
    path = tmp_path / "net.safetensors"
    net = Net(3)
    nk.save(net, path)
    with pytest.raises(TypeError, match=r"not one of nnkit's public classes; if it is yours, "
                                        r"pass classes=\[Net\]"):
        nk.load(path)
    _same_state(net, nk.load(path, classes=[Net]))
    _same_state(net, nk.load(path, classes={"Net": Net}))
    with pytest.raises(TypeError, match="classes must be"):
        nk.load(path, classes=Net)


def _rewrite_config(path, edit):
    tensors, meta = read_file(path)
    config = json.loads(meta["nnkit"])
    edit(config, tensors)
    text = json.dumps(config)
    write_file(path, tensors, {"nnkit": text, "nnkit_crc32": str(zlib.crc32(text.encode()))})


def test_mismatched_file_names_the_tensors(tmp_path):
    path = tmp_path / "m.safetensors"
    nk.save(nn.Linear(3, 4), path)

    def widen(config, tensors):
        config["object"]["__module__"]["args"] = [5, 4]
    _rewrite_config(path, widen)
    with pytest.raises(ValueError, match=r"does not match Linear.*'weight'\] has shape \(4, 3\)"):
        nk.load(path)

    nk.save(nn.Linear(3, 4), path)

    def drop_bias(config, tensors):
        config["object"]["__module__"]["kwargs"] = {"bias": False}
    _rewrite_config(path, drop_bias)
    with pytest.raises(ValueError, match=r"unexpected tensors \['bias'\]"):
        nk.load(path)


@pytest.mark.parametrize("edit, where", [
    (lambda node: node.update(args=[10**12, 4]), "args.0"),
    (lambda node: node.update(args=[3], kwargs={"out_features": 10**12}),
     "args.out_features"),
    (lambda node: node.update({"class": "nnkit.nn.conv:Conv2d", "args": [1, 4],
                               "kwargs": {"kernel_size": {"__tuple__": [3, 10**12]}}}),
     "args.kernel_size.1"),
], ids=["positional", "keyword", "in-a-tuple"])
def test_huge_constructor_argument_is_refused_before_building(edit, where, tmp_path,
                                                             monkeypatch):
    """A config asking for far more than the file holds (a Linear of 10**12 inputs) is
    refused by name before the module allocates anything."""
    path = tmp_path / "m.safetensors"
    nk.save(nn.Linear(3, 4), path)
    _rewrite_config(path, lambda config, tensors: edit(config["object"]["__module__"]))

    def build(self):
        raise AssertionError("a module was built")

    monkeypatch.setattr(nn.Module, "__init__", build)
    with pytest.raises(FileFormatError, match=rf"'{where}' is 1000000000000, more than the "
                                              r"4112 allowed"):
        nk.load(path)


class SeededNet(nn.Module):
    def __init__(self, width, seed, *, init_seed=0):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.seed, self.init_seed = seed, init_seed


@pytest.mark.parametrize("args, kwargs", [((2, 2**40), {}), ((2,), {"seed": 2**40}),
                                          ((2, 1), {"init_seed": 2**63 - 1})])
def test_seeds_of_any_size_load(args, kwargs, tmp_path):
    """A seed sizes nothing: the bound on int arguments leaves it alone, by position or by
    name."""
    net = SeededNet(*args, **kwargs)
    loaded = _round_trip(net, tmp_path, classes=[SeededNet])
    assert (loaded.seed, loaded.init_seed) == (net.seed, net.init_seed)
    _same_state(net, loaded)


def test_newer_format_and_foreign_metadata_are_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    nk.save(nn.Linear(3, 4), path)
    _rewrite_config(path, lambda config, t: config.update(format_version=99))
    with pytest.raises(FileFormatError, match="format 99"):
        nk.load(path)
    _rewrite_config(path, lambda config, t: config.update(format_version=0))
    with pytest.raises(FileFormatError, match="format 0 .* reads formats 1 to 2"):
        nk.load(path)
    write_file(path, {"a": np.zeros(2)},
               {"nnkit": "{not json", "nnkit_crc32": str(zlib.crc32(b"{not json"))})
    with pytest.raises(FileFormatError, match="not valid JSON"):
        nk.load(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        nk.load(tmp_path / "missing.safetensors")


def test_corrupted_tensor_fails_its_checksum(tmp_path):
    path = tmp_path / "m.safetensors"
    nk.save(nn.Linear(30, 40), path)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(FileFormatError, match="tensor '(weight|bias)' fails its check"):
        nk.load(path)


def _handmade(header, data=b""):
    """The bytes of a safetensors file with this header (a dict, or the JSON text)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _with_config(obj):
    """A file whose nnkit config (valid CRC32, no tensors) holds ``obj`` as the object."""
    text = json.dumps({"format": "nnkit", "format_version": 2, "nnkit_version": "0",
                       "object": {"__dict__": [["model", obj]]}, "complex": [], "tensors": {}})
    return _handmade({"__metadata__": {"nnkit": text,
                                       "nnkit_crc32": str(zlib.crc32(text.encode()))}})


def _linear_node(**fields):
    node = {"class": "nnkit.nn:Linear", "training": True, "args": [2, 3], "kwargs": {}}
    return {"__module__": {**node, **fields}}


_F32 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}


@pytest.mark.parametrize("raw, problem", [
    (_handmade(b'{"a":' * 50_000 + b"1" + b"}" * 50_000), "nested too deeply"),
    (_handmade({"w": {**_F32, "dtype": ["F32"]}}, b"\0" * 4), r"dtype \['F32'\]"),
    (_handmade({"w": {**_F32, "shape": [2**70]}}, b"\0" * 4), "shape must be a list of int"),
    (_handmade({"w": {**_F32, "shape": [True]}}, b"\0" * 4), "shape must be a list of int"),
    (_handmade({"w": {**_F32, "shape": [2**32, 2**32], "data_offsets": [0, 0]}}),
     r"needs 73786976294838206464 bytes but its offsets \[0, 0\] span 0"),
    (_handmade({"__metadata__": {"nnkit": 5}}), "value of 'nnkit' is a int, not a string"),
    (_with_config({"__scalar__": []}), r"'model' is malformed: __scalar__ holds \[\]"),
    (_with_config(_linear_node(args=5)), "'model' is malformed: the module's 'args' is 5"),
    (_with_config(_linear_node(kwargs=[])), r"'model' is malformed: the module's 'kwargs' is \[\]"),
    (_with_config(_linear_node(**{"class": 5})), "'model' is malformed: the module's 'class' is 5"),
], ids=["deep-json", "dtype-list", "huge-dim", "bool-dim", "wrapping-size", "int-metadata",
        "scalar-node", "args-int", "kwargs-list", "class-int"])
def test_hostile_file_is_refused_by_name(raw, problem, tmp_path):
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(raw)
    with pytest.raises(FileFormatError, match=problem):
        nk.load(path)


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "m.safetensors"
    nk.manual_seed(0)
    nk.save({"model": nn.Linear(5, 3), "step": 3}, path)
    return path.read_bytes()


@given(cut=st.integers(0, 10_000))
def test_every_truncation_is_refused(valid_file, cut, tmp_path_factory):
    cut = cut % len(valid_file)
    path = tmp_path_factory.mktemp("cut") / "m.safetensors"
    path.write_bytes(valid_file[:cut])
    with pytest.raises(FileFormatError):
        nk.load(path)


@given(pos=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_flipped_byte_is_refused_or_harmless(valid_file, pos, flip, tmp_path_factory):
    raw = bytearray(valid_file)
    pos = pos % len(raw)
    raw[pos] ^= flip
    path = tmp_path_factory.mktemp("flip") / "m.safetensors"
    path.write_bytes(bytes(raw))
    original = tmp_path_factory.mktemp("orig") / "m.safetensors"
    original.write_bytes(valid_file)
    try:
        out = nk.load(path)
    except (ValueError, TypeError, KeyError) as exc:  # FileFormatError is a ValueError
        assert str(exc)
        return
    # a flip the format cannot see (JSON whitespace/padding, an equivalent spelling)
    expected = nk.load(original)
    assert out["step"] == expected["step"]
    _same_state(out["model"], expected["model"])


_WRITER = """
import sys, time, numpy as np, nnkit as nk
path = sys.argv[1]
nk.save({"version": 1, "w": np.zeros(10)}, path)
print("saved v1", flush=True)
nk.save({"version": 2, "w": np.ones(50_000_000)}, path)  # 400 MB: killed while writing
print("saved v2", flush=True)
"""


def test_killed_writer_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(nk.__file__).parents[1])})
    try:
        assert proc.stdout.readline().strip() == "saved v1"
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".*.tmp")):  # the temporary file of v2 appeared
            assert time.monotonic() < deadline and proc.poll() is None, "writer never wrote"
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    ckpt = nk.load(path)
    assert ckpt["version"] == 1
    np.testing.assert_array_equal(ckpt["w"], np.zeros(10))
    assert len(list(tmp_path.glob(".*.tmp"))) == 1  # the killed writer's
    nk.save({"version": 3}, path)  # the next save to that path removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]
    assert nk.load(path)["version"] == 3


def test_live_writers_temporary_files_are_kept(tmp_path):
    """Only a dead writer's temporary file is garbage: a live one's, or another host's,
    may still become the file."""
    from nnkit._files import _HOST

    live = tmp_path / f".ckpt.safetensors.{_HOST}-{os.getpid()}-00000000.tmp"
    other_host = tmp_path / ".ckpt.safetensors.otherhost-1-00000000.tmp"
    other_file = tmp_path / f".other.safetensors.{_HOST}-999999999-00000000.tmp"
    for p in (live, other_host, other_file):
        p.write_bytes(b"partial")
    nk.save({"version": 1}, tmp_path / "ckpt.safetensors")
    assert all(p.exists() for p in (live, other_host, other_file))


# ----- class names from a file are keys, never code (issue: nk.load ran code) --------------
def _with_object(obj):
    """A file whose nnkit config holds ``obj`` as the whole object (no tensors)."""
    text = json.dumps({"format": "nnkit", "format_version": 2, "nnkit_version": "0",
                       "object": obj, "complex": [], "tensors": {}})
    return _handmade({"__metadata__": {"nnkit": text,
                                       "nnkit_crc32": str(zlib.crc32(text.encode()))}})


def _estimator(cls, **params):
    return {"__estimator__": {"class": cls, "params": params, "fitted": {}}}


def _module(cls, *args, **kwargs):
    return {"__module__": {"class": cls, "training": True, "args": list(args),
                           "kwargs": kwargs}}


def _optimizer(cls):
    return {"__dict__": [
        ["model", _module("nnkit.nn:Linear", 2, 3)],
        ["opt", {"__optimizer__": {"class": cls, "defaults": {"__dict__": []},
                                   "state_dict": {"__dict__": [
                                       ["state", {"__dict__": []}],
                                       ["param_groups", [{"__dict__": [["params", [0, 1]]]}]]]},
                                   "params": [["model", "weight"], ["model", "bias"]]}}]]}


_MARKER = "nnkit-hostile-marker"
HOSTILE = {  # what the file names -> the node that names it
    "shell through nnkit.text's numpy": _estimator(
        "nnkit.text:np.f2py.subprocess.Popen", args=["sh", "-c", f"touch {_MARKER}"]),
    "any shared library": _estimator("nnkit._malloc:ctypes.CDLL", name="libc.so.6"),
    "a builtin": _estimator("builtins:eval", source="__import__('os')"),
    "os.system": _estimator("os:system", command=f"touch {_MARKER}"),
    "subprocess": _module("subprocess:Popen", ["sh", "-c", f"touch {_MARKER}"]),
    "a module object": _estimator("nnkit:np"),
    "a module of nnkit": _estimator("nnkit:persistence"),
    "a private class": _estimator("nnkit.persistence:_Decoder", path="x", tensors={},
                                  classes={}),
    "a private module": _module("nnkit._budget:BudgetExceeded"),
    "a function": _estimator("nnkit.cli:main", argv=["tour"]),
    "type via a class": _estimator("nnkit.nn:Linear.__class__", name="X"),
    "object via a base": _estimator("nnkit.optim:Optimizer.__base__"),
    "globals of a method": _estimator("nnkit.classic:Hopfield.__init__.__globals__"),
    "an import at the class's module": _module("nnkit.nn.module:np.lib.format.open_memmap",
                                               f"{_MARKER}.npy", mode="w+", shape=[9]),
    "a module not in nnkit": _module("numpy:memmap", f"{_MARKER}.bin", mode="w+", shape=[9]),
    "an optimizer that is not": _optimizer("os:system"),
    "a module named as an estimator": _estimator("nnkit.nn:Linear", in_features=2,
                                                 out_features=3),
    "an estimator named as a module": _module("nnkit.classic:Perceptron"),
    "a module named as an optimizer": _optimizer("nnkit.nn:Linear"),
}


@pytest.mark.parametrize("node", HOSTILE.values(), ids=HOSTILE)
def test_hostile_class_names_are_refused_without_side_effects(node, tmp_path, monkeypatch):
    """Whatever a file names, loading imports nothing, builds nothing outside nnkit's
    public classes and runs nothing: each of these is a FileFormatError."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(_with_object(node))
    modules = set(sys.modules)
    with pytest.raises(FileFormatError):
        nk.load(path)
    time.sleep(0.2)  # a shell started by the load would have touched its file by now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.safetensors"]
    assert set(sys.modules) == modules, "loading imported a module"


def test_every_public_class_loads_by_its_names():
    """The table holds each public module, optimizer and estimator under its public name
    and under the name ``save`` writes; nothing in it is private or outside nnkit."""
    from nnkit.persistence import _nnkit_classes

    table = _nnkit_classes()
    for name in ("nnkit.nn:Linear", "nnkit.nn.layers:Linear", "nnkit.optim:AdamW",
                 "nnkit.classic:Hopfield", "nnkit.models:ViT", "nnkit.nn:LSTM",
                 "nnkit.models.bert:BertEmbeddings"):
        assert name in table, name
    for name, (_cls, kind) in table.items():
        module, qualname = name.split(":")
        assert module.startswith("nnkit.") and "._" not in module, name
        assert not qualname.startswith("_") and "." not in qualname, name
        assert kind in ("module", "optimizer", "estimator")


def test_unknown_class_error_is_both_file_format_and_type_error(tmp_path):
    """Files of your own classes, loaded without ``classes``, keep raising TypeError."""
    from nnkit.persistence import UnknownClassError

    assert issubclass(UnknownClassError, FileFormatError)
    assert issubclass(UnknownClassError, TypeError)


# ----- constructor arguments from a file allocate only what the file pays for --------------
def _hopfield_file(tmp_path, n, name="hop.safetensors"):
    net = nk.classic.Hopfield(n, storage="patterns").store(np.ones((1, n), np.int8))
    net.storage = "dense"  # a 16 KB file that asks for n^2 couplings
    path = tmp_path / name
    nk.save(net, path)
    return path


def test_dense_hopfield_from_a_small_file_is_refused_by_name(tmp_path):
    path = _hopfield_file(tmp_path, 16000)
    assert path.stat().st_size < 20_000
    with pytest.raises(FileFormatError, match=r"Hopfield\(n_neurons=16000, storage='dense', "
                                              r"bias=None\).* 1024000000 bytes for the "
                                              r"couplings of "
                                              r"n_neurons=16000.*max_bytes=268435456"):
        nk.load(path)


def test_max_bytes_is_the_callers_limit(tmp_path):
    path = _hopfield_file(tmp_path, 1000)  # 4 MB of couplings
    assert nk.load(path).couplings_.shape == (1000, 1000)
    with pytest.raises(FileFormatError, match="4000000 bytes .*max_bytes=1000000"):
        nk.load(path, max_bytes=1_000_000)
    assert nk.load(path, max_bytes=None).couplings_.shape == (1000, 1000)
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(TypeError, match="max_bytes must be an int >= 0 or None"):
            nk.load(path, max_bytes=bad)


@pytest.mark.parametrize("node, what", [
    (_module("nnkit.nn:Conv2d", 4000, 4000, 4000),
     r"Conv2d\(4000, 4000, 4000\).* 1024000000000000 bytes for a parameter of shape "
     r"\(4000, 4000, 4000, 4000\)"),
    (_module("nnkit.nn:LayerNorm", [4000, 4000, 4000]),
     r"256000000000 bytes for normalized_shape=\(4000, 4000, 4000\)"),
    (_module("nnkit.nn:LRU", 4000, 4000), "512000000 bytes for input_size=4000, state_size"),
    (_module("nnkit.nn:Linear", 4000, 4000), r"64000000 bytes for a parameter of shape"),
    (_module("nnkit.nn:LSTM", 4000, 4000), r"256000000 bytes for a parameter of shape"),
], ids=["conv2d", "layer-norm", "lru", "linear", "lstm"])
def test_modules_are_refused_before_they_allocate(node, what, tmp_path):
    """Each int argument is within the per-argument bound; together they would allocate
    far more than the file holds: refused before the memory is touched (a MemoryError or
    a machine out of memory otherwise)."""
    path = tmp_path / "big.safetensors"
    path.write_bytes(_with_object(node))
    with pytest.raises(FileFormatError, match=what):
        nk.load(path, max_bytes=1_000_000)


# ----- whatever save writes, load reads back -----------------------------------------------
class ScalarNet(nn.Module):
    """A module with a 0-d Parameter (a learnable temperature)."""

    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(np.array(2.5))


ROUND_TRIPS = {
    "big-endian float64": np.arange(5, dtype=">f8"),
    "big-endian int32": np.arange(-2, 3, dtype=">i4"),
    "big-endian complex128": np.arange(3, dtype=">c16") * (1 - 2j),
    "big-endian in a dict": {"w": np.ones((2, 3), dtype=">f4")},
    "0-d float64": np.array(2.5),
    "0-d int64": np.array(-7),
    "0-d bool": np.array(True),
    "0-d complex64": np.array(1 + 2j, dtype=np.complex64),
    "0-d Parameter": nn.Parameter(np.array(3.0)),
    "safetensors' reserved name as a key": {"__metadata__": np.ones(2), "x": np.zeros(3)},
    "reserved names of the config": {"nnkit": np.ones(1), "nnkit_crc32": np.ones(2),
                                     "__metadata__": 5},
    "nested reserved name": {"a": {"__metadata__": np.arange(3)}},
    "a non-contiguous view": np.arange(12.0).reshape(3, 4)[:, ::2],
    "deep but within the limit": {"k": [{"k": (np.ones(1),)}] * 3},
}


@pytest.mark.parametrize("obj", ROUND_TRIPS.values(), ids=ROUND_TRIPS)
def test_what_save_writes_load_reads_back_equal(obj, tmp_path):
    """Values, shapes (0-d included) and kinds come back; a big-endian array comes back
    in native (little-endian) byte order, as safetensors stores it."""
    loaded = _round_trip(obj, tmp_path)

    def same(a, b):
        if isinstance(a, dict):
            assert isinstance(b, dict) and list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        elif isinstance(a, (np.ndarray, nk.Tensor)):
            a = a.data if isinstance(a, nk.Tensor) else a
            assert isinstance(b, np.ndarray) and b.shape == a.shape, (a, b)
            assert b.dtype == a.dtype.newbyteorder("="), (a.dtype, b.dtype)
            np.testing.assert_array_equal(b, a)
        else:
            assert a == b

    same(obj, loaded)


def test_a_0d_parameter_of_a_module_keeps_its_shape(tmp_path):
    net = ScalarNet()
    loaded = _round_trip(net, tmp_path, classes=[ScalarNet])
    assert loaded.temperature.shape == () and float(loaded.temperature.data) == 2.5


def test_nesting_that_load_refuses_is_refused_at_save(tmp_path):
    path = tmp_path / "deep.safetensors"
    nk.save({"version": 1}, path)
    for depth in (100, 5000):  # past the config's depth limit; past Python's recursion
        deep = np.ones(1)
        for _ in range(depth):
            deep = {"k": deep}
        with pytest.raises(ValueError, match="nests too deeply"):
            nk.save(deep, path)
    assert nk.load(path) == {"version": 1}  # nothing was replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.safetensors"]
    deepest = 1
    for _ in range(60):
        deepest = {"k": deepest}
    assert _round_trip(deepest, tmp_path) == deepest


def test_a_file_that_would_not_read_back_never_replaces_the_old_one(tmp_path, monkeypatch):
    """The written header is read back before the rename; a broken writer (here: offsets
    one byte short) raises, the previous file stays, no temporary file is left."""
    from nnkit import _safetensors

    path = tmp_path / "ckpt.safetensors"
    nk.save({"version": 1}, path)
    header = _safetensors._header

    def broken_header(tensors, metadata):
        raw, order = header(tensors, metadata)
        return raw.replace(b'"data_offsets":[0,16]', b'"data_offsets":[0,15]'), order

    monkeypatch.setattr(_safetensors, "_header", broken_header)
    with pytest.raises(ValueError, match="would not read back"):
        nk.save({"w": np.ones(2)}, path)
    assert nk.load(path) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]


def test_write_file_refuses_the_reserved_tensor_name(tmp_path):
    with pytest.raises(ValueError, match="tensor named '__metadata__'"):
        write_file(tmp_path / "x.safetensors", {"__metadata__": np.ones(1)})
    assert list(tmp_path.iterdir()) == []
