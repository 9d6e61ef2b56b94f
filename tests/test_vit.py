"""nk.models.ViT: patching, shapes, [CLS] attention, errors, gradcheck, torch, training.

- ``patchify`` against a naive loop over the patch grid (hypothesis);
- shapes of the logits, of every layer's attention and of the [CLS] maps; flattened images;
- the [CLS] attention rows are probability distributions, and the attention path gives the
  same logits as the fused path;
- bad input: images not a multiple of the patch, a wrong size, wrong channel counts;
- float64 finite-difference gradcheck of a tiny ViT, inputs and every parameter;
- equality with the same model built from torch.nn layers after a state_dict copy (logits
  and every parameter gradient), when torch imports;
- a short training run on digits whose loss falls, and the tour section in quick mode.
Save/load round trips are in tests/test_persistence.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import import_torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nnkit as nk
import nnkit.functional as F
from nnkit.models.vit import ViT, patchify


def _tiny(dtype=np.float64, **kwargs):
    args = dict(image_size=4, patch_size=2, in_channels=2, num_classes=3, dim=4, depth=1,
                heads=2, mlp_dim=6, dtype=dtype)
    args.update(kwargs)
    return ViT(**args)


def _images(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ----- patching --------------------------------------------------------------------------------
def _patchify_loop(images, ph, pw):
    """Naive twin: one patch at a time, row-major over the grid, pixels in (c, y, x) order."""
    B, C, H, W = images.shape
    out = np.zeros((B, (H // ph) * (W // pw), C * ph * pw), dtype=images.dtype)
    for b in range(B):
        token = 0
        for i in range(H // ph):
            for j in range(W // pw):
                k = 0
                for c in range(C):
                    for y in range(ph):
                        for x in range(pw):
                            out[b, token, k] = images[b, c, i * ph + y, j * pw + x]
                            k += 1
                token += 1
    return out


@settings(max_examples=30)
@given(B=st.integers(1, 3), C=st.integers(1, 3), grid=st.tuples(st.integers(1, 3),
       st.integers(1, 3)), patch=st.tuples(st.integers(1, 3), st.integers(1, 3)))
def test_patchify_matches_naive_loop(B, C, grid, patch):
    (gh, gw), (ph, pw) = grid, patch
    images = _images((B, C, gh * ph, gw * pw), np.float64)
    np.testing.assert_array_equal(patchify(images, patch).numpy(),
                                  _patchify_loop(images, ph, pw))


def test_patchify_gradient_is_the_inverse_rearrangement():
    images = nk.tensor(_images((2, 3, 4, 6), np.float64), requires_grad=True)
    upstream = _images((2, 4, 18), np.float64, seed=1)  # (B, n, C ph pw)
    (patchify(images, (2, 3)) * upstream).sum().backward()
    expected = np.zeros_like(images.numpy())  # scatter the upstream back pixel by pixel
    for b in range(2):
        for i in range(2):
            for j in range(2):
                block = upstream[b, i * 2 + j].reshape(3, 2, 3)  # (C, ph, pw)
                expected[b, :, 2 * i:2 * i + 2, 3 * j:3 * j + 3] = block
    np.testing.assert_array_equal(images.grad, expected)


def test_patch_embedding_equals_a_stride_patch_convolution():
    nk.manual_seed(0)
    model = ViT(8, 4, 3, 5, dim=6, depth=1, heads=2, mlp_dim=8, dtype=np.float64)
    images = _images((2, 3, 8, 8), np.float64)
    tokens = model.patch_embed(patchify(images, 4)).numpy()  # (B, 4, D)
    weight = model.patch_embed.weight.numpy().reshape(6, 3, 4, 4)  # (D, C, p, p)
    conv = F.conv2d(images, weight, model.patch_embed.bias, stride=4).numpy()  # (B, D, 2, 2)
    np.testing.assert_allclose(tokens, conv.reshape(2, 6, 4).transpose(0, 2, 1), atol=1e-12)


# ----- shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_shapes(pool):
    nk.manual_seed(0)
    model = ViT((8, 12), (4, 2), 3, 7, dim=8, depth=2, heads=2, mlp_dim=16, pool=pool)
    assert model.num_patches == 12 and model.grid_size == (2, 6)
    images = _images((5, 3, 8, 12))
    assert model(images).shape == (5, 7)
    assert model(images.reshape(5, -1)).shape == (5, 7)  # flattened (B, C*H*W)
    logits, attention = model(images, return_attention=True)
    assert logits.shape == (5, 7)
    assert attention.shape == (2, 5, 2, 13, 13)  # (depth, B, heads, n + 1, n + 1)
    assert model.cls_attention(images).shape == (5, 2, 2, 6)  # (B, heads, Hp, Wp)
    assert model.embed(images).shape == (5, 13, 8)
    assert model.pos_embed.shape == (1, 13, 8) and model.cls_token.shape == (1, 1, 8)


def test_flattened_and_image_inputs_give_the_same_logits():
    nk.manual_seed(1)
    model = ViT(8, 2, 1, 10, dim=8, depth=1, heads=2, mlp_dim=16)
    images = _images((4, 1, 8, 8))
    np.testing.assert_array_equal(model(images).numpy(), model(images.reshape(4, 64)).numpy())


def test_layers_start_with_different_weights():
    nk.manual_seed(0)
    model = ViT(8, 2, 1, 10, dim=8, depth=3, heads=2, mlp_dim=16)
    first, second = model.encoder.layers[0], model.encoder.layers[1]
    assert not np.allclose(first.linear1.weight.numpy(), second.linear1.weight.numpy())
    assert not np.allclose(first.self_attn.in_proj_weight.numpy(),
                           second.self_attn.in_proj_weight.numpy())
    assert np.all(second.self_attn.out_proj.bias.numpy() == 0)  # torch's MHA init


# ----- attention --------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_attention_path_gives_the_fused_logits(pool):
    nk.manual_seed(2)
    model = ViT(8, 2, 1, 10, dim=16, depth=2, heads=4, mlp_dim=32, pool=pool)
    images = _images((3, 1, 8, 8))
    logits, _ = model(images, return_attention=True)
    np.testing.assert_allclose(logits.numpy(), model(images).numpy(), rtol=1e-5, atol=1e-5)


def test_cls_attention_rows_sum_to_one():
    nk.manual_seed(3)
    model = ViT(8, 2, 1, 10, dim=16, depth=2, heads=4, mlp_dim=32)
    images = _images((3, 1, 8, 8))
    _, attention = model(images, return_attention=True)
    weights = attention.numpy()  # (depth, B, heads, 17, 17)
    assert np.all(weights >= 0)
    np.testing.assert_allclose(weights[:, :, :, 0].sum(axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)  # every query row
    for layer in (0, 1, -1):
        maps = model.cls_attention(images, layer=layer)  # (B, heads, 4, 4), [CLS] left out
        to_cls = weights[layer][:, :, 0, 0]  # (B, heads)
        np.testing.assert_allclose(maps.sum(axis=(-2, -1)) + to_cls, 1.0, rtol=1e-5)
        np.testing.assert_allclose(maps.reshape(3, 4, 16), weights[layer][:, :, 0, 1:])


def test_cls_attention_runs_in_eval_mode_and_restores_training():
    nk.manual_seed(4)
    model = ViT(8, 2, 1, 10, dim=16, depth=1, heads=2, mlp_dim=32, dropout=0.5)
    images = _images((2, 1, 8, 8))
    first = model.cls_attention(images)
    assert model.training
    np.testing.assert_array_equal(first, model.cls_attention(images))  # no dropout


# ----- bad input --------------------------------------------------------------------------------
def test_image_size_not_a_multiple_of_the_patch_is_rejected():
    with pytest.raises(ValueError, match=r"image_size=\(8, 8\) is not a multiple of "
                                         r"patch_size=\(3, 3\)"):
        ViT(8, 3, 1, 10, dim=8, depth=1, heads=2, mlp_dim=16)
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        patchify(np.zeros((1, 1, 9, 8)), 2)


def test_wrong_image_size_is_rejected():
    model = ViT(8, 2, 1, 10, dim=8, depth=1, heads=2, mlp_dim=16)
    with pytest.raises(ValueError, match=r"9 x 9 .*image_size=\(8, 8\).*not even a multiple "
                                         r"of patch_size=\(2, 2\)"):
        model(np.zeros((2, 1, 9, 9), np.float32))
    with pytest.raises(ValueError, match=r"12 x 12 .*image_size=\(8, 8\)") as info:
        model(np.zeros((2, 1, 12, 12), np.float32))
    assert "multiple" not in str(info.value)  # 12 is a multiple of 2: only the size is wrong
    with pytest.raises(ValueError, match=r"65 values per row .*expected \(B, 64\)"):
        model(np.zeros((2, 65), np.float32))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\) or flattened"):
        model(np.zeros((1, 8, 8), np.float32))


def test_wrong_channel_count_is_rejected():
    model = ViT(8, 2, 3, 10, dim=8, depth=1, heads=2, mlp_dim=16)
    with pytest.raises(ValueError, match=r"images have 1 channels .*in_channels=3"):
        model(np.zeros((2, 1, 8, 8), np.float32))
    with pytest.raises(ValueError, match="in_channels=3"):
        model(np.zeros((2, 64), np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        model(np.zeros((2, 3, 8, 8), np.int64))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dim=6, heads=4), ValueError, "dim=6 is not divisible by heads=4"),
    (dict(depth=0), ValueError, "depth must be >= 1"),
    (dict(pool="max"), ValueError, "pool must be one of"),
    (dict(dropout=1.0), ValueError, "dropout must be < 1"),
    (dict(patch_size=(2, 2, 2)), ValueError, "patch_size must be an int or a pair"),
    (dict(in_channels=1.5), TypeError, "in_channels must be an integer"),
])
def test_bad_hyper_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        _tiny(**kwargs)


# ----- gradients --------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_gradcheck_tiny_vit(pool):
    nk.manual_seed(5)
    model = _tiny(pool=pool)
    images = nk.tensor(_images((2, 2, 4, 4), np.float64), requires_grad=True)
    nk.gradcheck(lambda x, *params: model(x), [images, *model.parameters()],
                 eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_through_the_attention_path():
    nk.manual_seed(6)
    model = _tiny(depth=2)
    images = nk.tensor(_images((2, 2, 4, 4), np.float64), requires_grad=True)
    nk.gradcheck(lambda x, *params: model(x, return_attention=True),
                 [images, *model.parameters()], eps=1e-6, atol=1e-7, rtol=1e-5)


# ----- torch ------------------------------------------------------------------------------------
def _torch_vit(torch, model: ViT):
    """The same model from torch.nn layers, with the same parameter names."""
    nn = torch.nn
    (ph, pw), D = model.patch_size, model.dim

    class TorchViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Linear(model.in_channels * ph * pw, D)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
            self.pos_embed = nn.Parameter(torch.zeros(1, model.num_patches + 1, D))
            self.dropout = nn.Dropout(0.0)
            layer = nn.TransformerEncoderLayer(D, model.heads, model.encoder.layers[0]
                                               .linear1.out_features, dropout=0.0,
                                               activation="gelu", batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, model.depth, norm=nn.LayerNorm(D),
                                                 enable_nested_tensor=False)
            self.head = nn.Linear(D, model.num_classes)

        def forward(self, images):  # (B, C, H, W)
            B, C, H, W = images.shape
            x = images.reshape(B, C, H // ph, ph, W // pw, pw).permute(0, 2, 4, 1, 3, 5)
            x = self.patch_embed(x.reshape(B, -1, C * ph * pw))  # (B, n, D)
            z = torch.cat([self.cls_token.expand(B, 1, D), x], dim=1) + self.pos_embed
            z = self.encoder(self.dropout(z))
            return self.head(z[:, 0] if model.pool == "cls" else z[:, 1:].mean(dim=1))

    return TorchViT()


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 2e-4)])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_equals_torch_after_state_dict_copy(dtype, tol, pool):
    torch = import_torch()
    nk.manual_seed(7)
    model = ViT((8, 6), (4, 2), 2, 5, dim=16, depth=2, heads=4, mlp_dim=24, pool=pool,
                dtype=dtype)
    reference = _torch_vit(torch, model).to(torch.float64 if dtype == np.float64
                                            else torch.float32)
    state = {name: torch.tensor(value) for name, value in model.state_dict().items()}
    reference.load_state_dict(state)  # strict: the names and shapes are torch's
    images = _images((3, 2, 8, 6), dtype)
    target = np.array([0, 3, 4])
    loss = F.cross_entropy(model(images), target)
    loss.backward()
    t_logits = reference(torch.tensor(images))
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.tensor(target))
    t_loss.backward()
    np.testing.assert_allclose(model(images).numpy(), t_logits.detach().numpy(), rtol=tol,
                               atol=tol)
    t_params = dict(reference.named_parameters())
    assert [name for name, _ in model.named_parameters()] == list(t_params)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, t_params[name].grad.numpy(), rtol=tol, atol=tol,
                                   err_msg=name)


# ----- training ---------------------------------------------------------------------------------
def test_short_training_run_lowers_the_loss():
    nk.manual_seed(8)
    data = nk.datasets.load_digits(random_state=0)
    X, y = data.X_train[:256], data.y_train[:256]
    model = ViT(8, 2, 1, 10, dim=32, depth=1, heads=4, mlp_dim=64)
    opt = nk.optim.Adam(model.parameters(), lr=3e-3)
    with nk.no_grad():
        before = F.cross_entropy(model(X), y).item()
    for _ in range(8):  # ~4 epochs on the ln(10) plateau while attention learns position
        for idx in nk.training.minibatches(len(X), 32):
            loss = F.cross_entropy(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with nk.no_grad():
        after = F.cross_entropy(model(X), y).item()
    assert after < 0.75 * before, (before, after)


def test_tour_section_quick(tmp_path):
    pytest.importorskip("matplotlib")
    from nnkit.tour import TourContext
    from nnkit.tour.vit import vit_section

    rows = vit_section(TourContext(tmp_path, quick=True))
    checks = [row for row in rows if row["ok"] != "info"]
    assert len(checks) == 4 and all(row["ok"] is True for row in checks), rows
    assert [row["ok"] for row in rows if row["result"].startswith("test accuracy")] == ["info"]
    assert {row["section"] for row in rows} == {"ViT on digits"}
    assert (tmp_path / "vit_attention.png").stat().st_size > 1000
