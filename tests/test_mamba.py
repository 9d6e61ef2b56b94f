"""Mamba: ``nn.Mamba``, ``nn.RMSNorm``, ``nk.models.MambaModel`` / ``MambaForCausalLM``.

- ``nn.Mamba``: finite-difference gradients in float64 through the input and every
  parameter; token-by-token ``step`` equals the full forward (1e-10, float64) and goes on from
  ``forward(return_state=True)``; mamba_ssm's initialisation; bad inputs named.
- ``nn.RMSNorm`` equals ``torch.nn.RMSNorm`` (outputs and gradients).
- With transformers (a test-only dependency), tiny random checkpoints built by transformers
  and saved by its ``save_pretrained`` load into nnkit: hidden states and logits equal
  transformers' to 1e-5 of their largest magnitude (float32 models and float64 ones:
  transformers' Mamba computes its norms and scan in float32 whatever the model's dtype,
  so float64 is checked against
  nnkit's own float32-free paths above instead); nnkit's ``save_pretrained`` loads back into
  transformers with the same logits; greedy ``generate`` gives transformers' tokens.
- Refusals: an activation other than SiLU (by name), a config that disagrees with the
  weights, a Mamba loader given a BERT folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import edit_config, import_transformers, peak_and_seconds

import nnkit as nk
from nnkit.models import MambaConfig, MambaForCausalLM, MambaModel
from nnkit.models.pretrained import NewlyInitializedWarning

TINY = dict(vocab_size=50, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
            conv_kernel=4)
VARIANT = dict(TINY, use_bias=True, use_conv_bias=False, time_step_rank=3, conv_kernel=3,
               layer_norm_epsilon=1e-3, tie_word_embeddings=False, state_size=6)


def _ids(batch=2, length=9, vocab=50, seed=0):
    return np.random.default_rng(seed).integers(1, vocab, (batch, length))


def _randomise(model, seed=0, scale=0.3):
    """Larger random weights (a fresh Mamba is nearly linear and its greedy tokens repeat)."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] += scale * rng.standard_normal(p.shape).astype(p.dtype)
    return model


def _perturb(torch, model, seed=0, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.eval()


def _close(ours, theirs, tol=1e-5):
    """Equal to ``tol`` relative to the largest magnitude (float32 sums in another order
    differ by a few ulps of that, wherever the element is small)."""
    ours = ours.numpy() if isinstance(ours, nk.Tensor) else np.asarray(ours)
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(1.0, float(np.abs(theirs).max(initial=0.0)))
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol * scale)


# ----- nn.Mamba and nn.RMSNorm ---------------------------------------------------------------
def test_mamba_gradients_match_finite_differences():
    layer = nk.nn.Mamba(2, d_state=2, d_conv=2, expand=2, dtype=np.float64, bias=True)
    _randomise(layer, scale=0.2)
    x = nk.tensor(np.random.default_rng(1).standard_normal((2, 4, 2)), requires_grad=True)
    params = list(layer.parameters())
    assert len(params) == 11  # in/out projection biases and the conv bias included
    assert nk.gradcheck(lambda x, *_: layer(x), [x, *params], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("d_conv, length", [(4, 13), (3, 2), (1, 6)])
def test_step_by_step_equals_the_full_forward(d_conv, length):
    layer = _randomise(nk.nn.Mamba(8, d_state=5, d_conv=d_conv, dt_rank=3,
                                   dtype=np.float64), seed=2)
    x = np.random.default_rng(3).standard_normal((3, length, 8))
    full, last = layer(x, return_state=True)
    state, outs = None, []
    for t in range(length):
        y, state = layer.step(x[:, t], state)
        outs.append(y)
    np.testing.assert_allclose(np.stack(outs, 1), full.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(state.ssm, last.ssm, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.conv, last.conv, rtol=1e-12, atol=1e-12)
    # the state of a prefix's forward continues with step: the suffix's outputs
    cut = length // 2
    _, state = layer(x[:, :cut], return_state=True)
    for t in range(cut, length):
        y, state = layer.step(x[:, t], state)
        np.testing.assert_allclose(y, full.numpy()[:, t], rtol=1e-10, atol=1e-10)
    assert state.ssm.shape == (3, 16, 5) and state.conv.shape == (3, 16, d_conv)


def test_mamba_initialisation_is_mamba_ssms():
    nk.manual_seed(0)
    layer = nk.nn.Mamba(40, d_state=6, dt_min=0.01, dt_max=0.05)
    E, R = 80, 3  # expand 2; dt_rank "auto" = ceil(40 / 16)
    state = layer.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes == {"in_proj.weight": (2 * E, 40), "conv1d.weight": (E, 1, 4),
                      "conv1d.bias": (E,), "x_proj.weight": (R + 12, E),
                      "dt_proj.weight": (E, R), "dt_proj.bias": (E,), "A_log": (E, 6),
                      "D": (E,), "out_proj.weight": (40, E)}
    np.testing.assert_allclose(np.exp(state["A_log"]), np.tile(np.arange(1, 7), (E, 1)),
                               rtol=1e-6)
    assert (state["D"] == 1).all()
    dt = np.log1p(np.exp(state["dt_proj.bias"].astype(np.float64)))  # softplus
    assert dt.min() >= 0.01 * (1 - 1e-5) and dt.max() <= 0.05 * (1 + 1e-5)
    assert np.abs(state["dt_proj.weight"]).max() <= R ** -0.5
    constant = nk.nn.Mamba(16, dt_init="constant", dt_scale=2.0)
    assert np.allclose(constant.dt_proj.weight.numpy(), 2.0)  # dt_rank 1


def test_mamba_refuses_bad_arguments_and_inputs():
    layer = nk.nn.Mamba(8, d_state=2)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, L, d_model=8\)"):
        layer(np.zeros((2, 8), np.float32))
    with pytest.raises(TypeError, match="x"):
        layer(np.zeros((1, 3, 8), np.float64))
    with pytest.raises(ValueError, match="x_t must have shape"):
        layer.step(np.zeros((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match="state must be a MambaState"):
        layer.step(np.zeros((2, 8), np.float32), layer.initial_state(3))
    with pytest.raises(ValueError, match="dt_rank"):
        nk.nn.Mamba(8, dt_rank="full")
    with pytest.raises(ValueError, match="dt_init"):
        nk.nn.Mamba(8, dt_init="normal")


@pytest.mark.parametrize("shape, eps, affine", [(16, None, True), ((3, 4), 1e-3, True),
                                                (5, 1e-6, False)])
def test_rms_norm_equals_torch(shape, eps, affine):
    torch = pytest.importorskip("torch")
    ours = nk.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine, dtype=np.float64)
    theirs = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine, dtype=torch.float64)
    dims = (shape,) if isinstance(shape, int) else shape
    rng = np.random.default_rng(0)
    if affine:
        w = rng.standard_normal(dims)
        ours.weight.data[...] = w
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(w))
    x = rng.standard_normal((2, 3, *dims))
    xt = torch.tensor(x, requires_grad=True)
    xn = nk.tensor(x, requires_grad=True)
    g = rng.standard_normal(x.shape)
    out_t = theirs(xt)
    out_n = ours(xn)
    np.testing.assert_allclose(out_n.numpy(), out_t.detach().numpy(), rtol=1e-12, atol=1e-12)
    (out_t * torch.tensor(g)).sum().backward()
    (out_n * nk.tensor(g)).sum().backward()
    np.testing.assert_allclose(xn.grad, xt.grad.numpy(), rtol=1e-10, atol=1e-10)
    if affine:
        np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-10,
                                   atol=1e-10)


# ----- the models without transformers -------------------------------------------------------
def test_model_step_equals_the_full_forward_and_greedy_equals_recomputing():
    nk.manual_seed(1)
    lm = _randomise(MambaForCausalLM(TINY, dtype=np.float64), seed=4)
    ids = _ids(length=7)
    hidden = lm.backbone(ids).numpy()
    states, steps = None, []
    for t in range(ids.shape[1]):
        h, states = lm.backbone.step(ids[:, t], states)
        steps.append(h)
    np.testing.assert_allclose(np.stack(steps, 1), hidden, rtol=1e-10, atol=1e-10)
    out = lm.generate(ids, max_new_tokens=6, eos_token_id=None)
    slow = ids
    for _ in range(6):  # the whole sequence again for every token
        slow = np.concatenate([slow, lm(slow).numpy()[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, slow)
    assert len(set(out[:, ids.shape[1]:].ravel().tolist())) > 1


def test_generate_stops_at_eos_and_pads():
    nk.manual_seed(2)
    lm = _randomise(MambaForCausalLM(TINY, dtype=np.float64), seed=5)
    ids = _ids(batch=3, length=4, seed=6)
    free = lm.generate(ids, max_new_tokens=5, eos_token_id=None)
    eos = int(free[0, 5])  # sequence 0 ends on its second new token
    out = lm.generate(ids, max_new_tokens=5, eos_token_id=eos, pad_token_id=49)
    for row, full in zip(out, free, strict=True):
        new = full[4:].tolist()
        if eos in new:
            k = new.index(eos) + 1
            assert row[4:4 + k].tolist() == new[:k] and set(row[4 + k:].tolist()) <= {49}
        else:
            assert row[4:].tolist() == new[:len(row) - 4]
    assert lm.generate(ids, max_new_tokens=0).shape == ids.shape


def test_nnkit_round_trip_and_nk_save(tmp_path):
    lm = _randomise(MambaForCausalLM(VARIANT), seed=7)
    ids = _ids()
    lm.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "mamba" and config["architectures"] == ["MambaForCausalLM"]
    back = MambaForCausalLM.from_pretrained(tmp_path / "hf")
    np.testing.assert_array_equal(back(ids).numpy(), lm(ids).numpy())
    assert back.config == lm.config
    nk.save(lm, tmp_path / "lm.nk")
    again = nk.load(tmp_path / "lm.nk")
    np.testing.assert_array_equal(again(ids).numpy(), lm(ids).numpy())


def test_config_takes_fields_dicts_and_refuses_other_activations():
    assert MambaConfig.of({"hidden_size": 40}, state_size=8).time_step_rank == 3
    with pytest.raises(ValueError, match="hidden_act must be 'silu'.*'gelu'"):
        MambaConfig(hidden_act="gelu")
    with pytest.raises(TypeError, match="heads"):
        MambaModel(TINY, heads=2)


# ----- checkpoints built by transformers -----------------------------------------------------
@pytest.fixture(scope="module")
def hf_mamba(tmp_path_factory):
    """{name: (folder, transformers model in eval mode)}: the LM, its backbone saved as a
    MambaModel, and an LM with biases, no conv bias, an explicit time-step rank and an
    untied head."""
    transformers = import_transformers()
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("mamba")
    lm = _perturb(torch, transformers.MambaForCausalLM(transformers.MambaConfig(**TINY)))
    variant = _perturb(torch, transformers.MambaForCausalLM(
        transformers.MambaConfig(**VARIANT)), seed=1)
    out = {}
    for name, model in (("lm", lm), ("backbone", lm.backbone), ("variant", variant)):
        model.save_pretrained(root / name)
        out[name] = (root / name, model)
    return out


def _hf_logits(torch, hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["lm", "variant"])
def test_transformers_lm_checkpoints_give_its_logits(hf_mamba, name, dtype):
    import torch

    folder, hf = hf_mamba[name]
    lm = MambaForCausalLM.from_pretrained(folder, dtype=dtype)
    assert not lm.training and lm.backbone.embeddings.weight.dtype == dtype
    ids = _ids(length=11)
    _close(lm(ids), _hf_logits(torch, hf, ids))
    with torch.no_grad():
        hidden = hf.backbone(torch.tensor(ids)).last_hidden_state
    _close(lm.backbone(ids), hidden)


def test_transformers_backbone_checkpoint_gives_its_hidden_states(hf_mamba):
    import torch

    folder, hf = hf_mamba["backbone"]
    model = MambaModel.from_pretrained(folder)
    ids = _ids(batch=3, length=6, seed=2)
    with torch.no_grad():
        _close(model(ids), hf(torch.tensor(ids)).last_hidden_state)
    # the LM loads from the backbone's file with its (tied) head: nothing is missing
    lm, info = MambaForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": []}


def test_greedy_generation_gives_transformers_tokens(hf_mamba):
    import torch

    for name in ("lm", "variant"):
        folder, hf = hf_mamba[name]
        lm = MambaForCausalLM.from_pretrained(folder)
        ids = _ids(batch=2, length=5, seed=3)
        with torch.no_grad():
            theirs = hf.generate(torch.tensor(ids), max_new_tokens=8, do_sample=False,
                                 attention_mask=torch.ones(ids.shape, dtype=torch.long))
        np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=8), theirs.numpy())


@pytest.mark.parametrize("config", [TINY, VARIANT], ids=["tied", "variant"])
def test_save_pretrained_loads_in_transformers(tmp_path, config):
    transformers = import_transformers()
    import torch

    lm = _randomise(MambaForCausalLM(config), seed=8)
    lm.save_pretrained(tmp_path)
    hf = transformers.MambaForCausalLM.from_pretrained(tmp_path).eval()
    ids = _ids(seed=4)
    _close(lm(ids), _hf_logits(torch, hf, ids))


# ----- refusals ---------------------------------------------------------------------------
@pytest.fixture
def lm_folder(tmp_path):
    folder = tmp_path / "lm"
    MambaForCausalLM(TINY).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("fields, match", [
    ({"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu': .*SiLU"),
    ({"time_step_rank": 0}, r"field 'time_step_rank' = 0: must be >= 1"),
    ({"use_bias": True}, r"describes an encoder of 5424 parameters .* holds 5264"),
    ({"use_conv_bias": False}, r"holds the tensor 'backbone\.layers\.0\.mixer\.conv1d\.bias'"),
    ({"num_hidden_layers": 3}, r"field 'num_hidden_layers' = 3: but .* holds 2"),
    ({"state_size": 3}, r"tensor 'backbone\.layers\.0\.mixer\.x_proj\.weight' has shape "
                        r"\(9, 32\) but .*state_size=3.* needs \(7, 32\)"),
    ({"model_type": "bert"}, r"field 'model_type' = 'bert'.*reads 'mamba'"),
    ({"state_size": 10 ** 9}, r"describes an encoder of \d+ parameters"),
])
def test_configs_nnkit_cannot_run_or_that_disagree_with_the_weights_are_refused(
        lm_folder, fields, match):
    edit_config(lm_folder, **fields)
    with pytest.raises(ValueError, match=match):
        MambaForCausalLM.from_pretrained(lm_folder)


@pytest.mark.parametrize("fields", [{"vocab_size": 10 ** 9}, {"num_hidden_layers": 10 ** 8},
                                    {"expand": 10 ** 6, "state_size": 10 ** 4}])
def test_huge_configs_are_refused_before_they_allocate(lm_folder, fields):
    edit_config(lm_folder, **fields)
    result, peak, seconds = peak_and_seconds(MambaForCausalLM.from_pretrained, lm_folder)
    assert isinstance(result, ValueError) and "config.json" in str(result)
    assert peak < 4 << 20 and seconds < 2


def test_untied_checkpoint_without_a_head_initialises_it(lm_folder):
    edit_config(lm_folder, tie_word_embeddings=False)
    with pytest.warns(NewlyInitializedWarning, match="lm_head.weight"):
        lm = MambaForCausalLM.from_pretrained(lm_folder)
    assert lm.lm_head.weight.shape == (50, 16)


def test_num_labels_is_refused(lm_folder):
    with pytest.raises(ValueError, match="num_labels is for classifiers"):
        MambaForCausalLM.from_pretrained(lm_folder, num_labels=3)


def test_older_embedding_name_loads(hf_mamba, tmp_path):
    """Older checkpoints call the embedding ``embedding.weight`` (transformers' load hook)."""
    from nnkit._safetensors import read_file, write_file

    folder, _ = hf_mamba["backbone"]
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    tensors = read_file(folder / "model.safetensors")[0]
    tensors["embedding.weight"] = tensors.pop("embeddings.weight")
    write_file(tmp_path / "model.safetensors", tensors, {"format": "pt"})
    ids = _ids()
    new = MambaModel.from_pretrained(folder)(ids).numpy()
    np.testing.assert_array_equal(MambaModel.from_pretrained(tmp_path)(ids).numpy(), new)


# ----- GPU -------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_mamba_lm_on_gpu_matches_cpu():
    """The LM's logits and gradients, ``step`` and greedy tokens on CuPy arrays equal the
    CPU's (float64)."""
    cupy = pytest.importorskip("cupy")
    nk.manual_seed(3)
    lm = _randomise(MambaForCausalLM(dict(TINY, num_hidden_layers=1), dtype=np.float64), seed=9)
    ids = _ids(length=5)
    cpu_logits = lm(ids)
    cpu_logits.sum().backward()
    cpu_grads = {k: p.grad.copy() for k, p in lm.named_parameters()}
    cpu_tokens = lm.generate(ids, max_new_tokens=3, eos_token_id=None)
    lm.cuda()
    logits = lm(cupy.asarray(ids))
    logits.sum().backward()
    np.testing.assert_allclose(cupy.asnumpy(logits.data), cpu_logits.numpy(), rtol=1e-10,
                               atol=1e-10)
    for name, p in lm.named_parameters():
        np.testing.assert_allclose(cupy.asnumpy(p.grad), cpu_grads[name], rtol=1e-8,
                                   atol=1e-10, err_msg=name)
    tokens = lm.generate(cupy.asarray(ids), max_new_tokens=3, eos_token_id=None)
    np.testing.assert_array_equal(cupy.asnumpy(tokens), cpu_tokens)
