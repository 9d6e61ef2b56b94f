"""A ViT checkpoint's preprocessor_config.json is hostile input; resizing is banded.

- every field of a hostile file is refused at load with a ValueError that names the file and
  the field (its value, what was expected), statically: no image is resized at load;
- a ``size`` whose image would not fit in ``max_bytes`` is refused before anything is
  allocated (peak memory and time measured); ``max_bytes=None`` lifts the bound;
- a normal ViT file gives the arguments it always gave; a single ``image_mean`` number is
  broadcast to every channel, as transformers' ViTImageProcessor does;
- the banded resampling equals the dense one it replaced (transcribed below as the naive
  twin) to the byte for uint8 and to float64 rounding for floats, and PIL's passes to the
  byte (hypothesis); its coefficients are O(in + out), its time and memory linear.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import peak_and_seconds
from hypothesis import given
from hypothesis import strategies as st

from nnkit._budget import MAX_BYTES
from nnkit._files import read_json
from nnkit.models.preprocess import (
    _preprocess_bytes,
    _taps,
    preprocess_arguments,
    resize,
    vit_preprocess,
)

MB = 1 << 20


# ----- the dense resampling nnkit had before the banded one, transcribed ---------------------
_PRECISION_BITS = 32 - 8 - 2
_NAIVE_FILTERS = {
    2: (1.0, lambda x: np.maximum(0.0, 1.0 - np.abs(x))),
    3: (2.0, lambda x: _naive_bicubic(np.abs(x))),
}


def _naive_bicubic(x, a=-0.5):
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _naive_coefficients(in_size, out_size, resample):
    """(out_size, in_size) float64 weights, one output pixel at a time."""
    scale = in_size / out_size
    if resample == 0:
        out = np.zeros((out_size, in_size))
        src = np.minimum(((np.arange(out_size) + 0.5) * scale).astype(np.int64), in_size - 1)
        out[np.arange(out_size), src] = 1.0
        return out
    support, kernel = _NAIVE_FILTERS[resample]
    filterscale = max(scale, 1.0)
    support *= filterscale
    out = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        w = kernel((np.arange(lo, hi) - center + 0.5) / filterscale)
        total = w.sum()
        out[i, lo:hi] = w / total if total != 0 else w
    return out


def _naive_fixed_point(weights):
    scaled = weights * (1 << _PRECISION_BITS)
    return np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))


def _naive_resample_bytes(x, weights, axis):
    moved = np.moveaxis(x, axis, -1) @ _naive_fixed_point(weights).T
    moved = np.floor((moved + (1 << (_PRECISION_BITS - 1))) / (1 << _PRECISION_BITS))
    return np.moveaxis(np.clip(moved, 0, 255), -1, axis)


def _naive_resize(images, size, resample):
    (H, W), (h, w) = images.shape[1:3], size
    x = images.astype(np.float64)
    as_bytes = images.dtype == np.uint8 and resample != 0
    if (H, W) == (h, w):
        return images if images.dtype == np.uint8 else x
    for axis, n_in, n_out in ((2, W, w), (1, H, h)):
        if n_in == n_out:
            continue
        weights = _naive_coefficients(n_in, n_out, resample)
        x = _naive_resample_bytes(x, weights, axis) if as_bytes else \
            np.moveaxis(np.moveaxis(x, axis, -1) @ weights.T, -1, axis)
    return x.astype(np.uint8) if images.dtype == np.uint8 else x


# ----- the banded resampling against its twin and PIL ----------------------------------------
@st.composite
def _resize_cases(draw, max_in=24, max_out=30):
    """(images (B, H, W, C), (h, w), resample): small sides, 1 included, up and down."""
    B, H, W = draw(st.integers(1, 2)), draw(st.integers(1, max_in)), draw(st.integers(1, max_in))
    C = draw(st.sampled_from([1, 3]))
    size = (draw(st.integers(1, max_out)), draw(st.integers(1, max_out)))
    seed = draw(st.integers(0, 2**32 - 1))
    images = np.random.default_rng(seed).integers(0, 256, (B, H, W, C), dtype=np.uint8)
    return images, size, draw(st.sampled_from([0, 2, 3]))


@given(_resize_cases())
def test_banded_resize_equals_the_dense_twin(case):
    images, size, resample = case
    np.testing.assert_array_equal(resize(images, size, resample),
                                  _naive_resize(images, size, resample))
    floats = images / 51.0 - 2.5  # float images: the same filter, no rounding
    ours, theirs = resize(floats, size, resample), _naive_resize(floats, size, resample)
    assert ours.dtype == theirs.dtype == np.float64
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-13)


@given(_resize_cases().filter(lambda case: case[2] != 0))
def test_banded_resize_equals_pil_pass_by_pass(case):
    """PIL's bytes: its horizontal pass, then its vertical one (each a one-axis resize; Pillow
    13 may run a two-axis resize vertically first, python-pillow/Pillow#9549). Bilinear and
    bicubic only: PIL's nearest steps its source position by repeated addition, so a centre
    on an integer can fall one pixel short (nnkit, now as before, computes each centre)."""
    Image = pytest.importorskip("PIL.Image")
    images, (h, w), resample = case
    for image, ours in zip(images, resize(images, (h, w), resample), strict=True):
        pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
        pil = pil.resize((w, image.shape[0]), resample).resize((w, h), resample)
        np.testing.assert_array_equal(ours, np.asarray(pil).reshape(ours.shape))


@pytest.mark.parametrize("resample", [0, 2, 3])
@pytest.mark.parametrize("n_in, n_out", [(10**5, 10**5 + 1), (10**5 + 1, 10**5), (7, 10**5)])
def test_coefficients_are_a_band_not_a_matrix(n_in, n_out, resample):
    """The dense (out, in) matrix would be 80 GB here; the band holds a few taps a pixel."""
    (first, weights), peak, seconds = peak_and_seconds(_taps, n_in, n_out, resample)
    assert first.shape == (n_out,) and weights.shape[0] == n_out
    assert weights.shape[1] <= 2 * {0: 0, 2: 1, 3: 2}[resample] * 1.001 + 1
    assert peak < 10 * MB and seconds < 1.0
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-12)


def test_resize_to_a_long_row_is_linear_in_its_output():
    image = np.random.default_rng(0).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    out_bytes = 10**5 * 1 * 3 * 8  # the output, in float64
    result, peak, seconds = peak_and_seconds(vit_preprocess, image, (10**5, 1), resample=3)
    assert result.shape == (1, 3, 10**5, 1)
    assert seconds < 0.5 and peak < 8 * out_bytes
    twice, peak2, _ = peak_and_seconds(vit_preprocess, image, (2 * 10**5, 1), resample=3)
    assert peak2 < 2.5 * peak  # linear: twice the output, about twice the memory


@pytest.mark.parametrize("dtype, image_dtype", [(np.float32, np.uint8), (np.float64, np.float64)])
@pytest.mark.parametrize("size", [(300, 200), (20000, 1), (1, 20000), (64, 64), (1000, 1000)])
@pytest.mark.parametrize("resample", [0, 2, 3])
def test_the_load_time_estimate_bounds_what_preprocessing_allocates(size, resample, dtype,
                                                                     image_dtype):
    image = np.random.default_rng(0).integers(0, 256, (5, 3, 3)).astype(image_dtype)
    result, peak, _ = peak_and_seconds(vit_preprocess, image, size, resample=resample,
                                       dtype=dtype)
    assert result.shape == (1, 3, *size)
    assert peak <= _preprocess_bytes(*size, 3, resample)


# ----- hostile preprocessor_config.json ------------------------------------------------------
def _config_file(tmp_path, fields) -> str:
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(fields))  # NaN and Infinity written as JSON's extensions
    return str(path)


def _arguments(path, max_bytes=MAX_BYTES, num_channels=3):
    return preprocess_arguments(path, read_json(path, 1 << 20), num_channels=num_channels,
                                max_bytes=max_bytes)


_NAN, _INF = math.nan, math.inf
_HOSTILE = [  # (field, value)
    *[("size", v) for v in ["224", 2.5, None, 2**62, True, 0, -3, [224], [224, 224, 3],
                            [True, 2], {"height": 224}, {"height": 224, "width": 224, "d": 3},
                            {"height": "224", "width": 224}, {"height": 224.0, "width": 224},
                            {"height": 0, "width": 224}, {"shortest_edge": 224}]],
    *[("image_mean", v) for v in ["0.5", None, [], [[0.5], [0.5], [0.5]], [0.5, _NAN, 0.5],
                                  [0.5, _INF, 0.5], _NAN, True, [True, 0.5, 0.5],
                                  [0.5] * 5, [0.5, 0.5], 1e39, {"r": 0.5}]],
    *[("image_std", v) for v in [0, 0.0, [0.5, 0, 0.5], "0.5", None, [1e-300, 1, 1],
                                 [0.5, -_INF, 0.5], -_INF, [0.5] * 4]],
    *[("resample", v) for v in ["2", 2.0, True, 1, 4, 5, None, -1, [2]]],
    *[("rescale_factor", v) for v in ["0.1", None, True, _NAN, _INF, [1 / 255], 10**400]],
    *[("do_resize", v) for v in [1, "true", None]],
    *[("do_rescale", v) for v in [0, "false"]],
    *[("do_normalize", v) for v in [None, []]],
    *[("do_center_crop", v) for v in [True, "yes"]],
]


@pytest.mark.parametrize("field, value", _HOSTILE)
def test_a_hostile_field_is_refused_by_name(tmp_path, field, value):
    path = _config_file(tmp_path, {"image_processor_type": "ViTImageProcessor", field: value})
    error, peak, seconds = peak_and_seconds(_arguments, path)
    assert isinstance(error, ValueError), error
    assert str(error).startswith(f"'{path}': field '{field}' = "), error
    assert "expected" in str(error)
    assert peak < MB and seconds < 0.5


@pytest.mark.parametrize("size", [{"height": 10**9, "width": 10**9}, [20000, 20000],
                                  {"height": 10**9, "width": 1}, {"height": 10**7, "width": 1},
                                  2**31 - 1])
def test_a_size_past_max_bytes_is_refused_before_allocating(tmp_path, size):
    path = _config_file(tmp_path, {"size": size, "resample": 3})
    error, peak, seconds = peak_and_seconds(_arguments, path)
    assert isinstance(error, ValueError), error
    message = str(error)
    assert message.startswith(f"'{path}': field 'size' = ") and "max_bytes=None" in message
    needed = int(message.split("takes up to ")[1].split(" bytes")[0])
    assert needed > MAX_BYTES and f"max_bytes={MAX_BYTES}" in message
    assert peak < MB and seconds < 0.5


def test_max_bytes_none_lifts_the_bound_and_loading_still_allocates_nothing(tmp_path):
    path = _config_file(tmp_path, {"size": {"height": 10**7, "width": 1}})
    args, peak, seconds = peak_and_seconds(_arguments, path, None)
    assert args["size"] == (10**7, 1)
    assert peak < MB and seconds < 0.5
    just_enough = _preprocess_bytes(10**7, 1, 3, 2)
    assert _arguments(path, just_enough)["size"] == (10**7, 1)
    with pytest.raises(ValueError, match="field 'size'"):
        _arguments(path, just_enough - 1)


def test_a_normal_vit_file_gives_the_arguments_it_always_gave(tmp_path):
    fields = {"do_normalize": True, "do_rescale": True, "do_resize": True,
              "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor",
              "image_std": [0.5, 0.5, 0.5], "resample": 2,
              "rescale_factor": 0.00392156862745098, "size": {"height": 224, "width": 224},
              "processor_class": "ViTProcessor", "crop_size": {"height": 1, "width": 1}}
    expected = dict(size=(224, 224), mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5],
                    rescale_factor=0.00392156862745098, resample=2, do_resize=True,
                    do_rescale=True, do_normalize=True)
    args = _arguments(_config_file(tmp_path, fields))
    assert args == expected
    image = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    assert vit_preprocess(image, **args).shape == (1, 3, 224, 224)
    assert _arguments(_config_file(tmp_path, {})) == expected  # transformers' ViT defaults


def test_one_number_for_mean_and_std_is_every_channels(tmp_path):
    """transformers 5.24's ViTImageProcessor(Pil) normalises with a float image_mean as with
    that float for every channel (checked when this test was written); so does nnkit."""
    path = _config_file(tmp_path, {"image_mean": 0.25, "image_std": 2})
    args = _arguments(path, num_channels=2)
    assert args["mean"] == [0.25, 0.25] and args["std"] == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"field 'image_mean' = .*expected 2 numbers"):
        _arguments(_config_file(tmp_path, {"image_mean": [0.5, 0.5, 0.5]}), num_channels=2)
