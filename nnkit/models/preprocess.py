"""Image preprocessing for ViT checkpoints: resize, rescale, normalise (``vit_preprocess``).

A ViT checkpoint expects its images prepared as in training; its ``preprocessor_config.json``
says how (transformers' image processor fields): ``size`` (the height and width to resize
to), ``resample`` (2 = bilinear, 3 = bicubic, 0 = nearest, PIL's codes), ``rescale_factor``
(1/255: bytes to [0, 1]), ``image_mean`` and ``image_std`` (per channel), and ``do_resize``,
``do_rescale``, ``do_normalize`` switches. ``preprocess_arguments`` checks those fields
without running anything (the file may be hostile) and turns them into ``vit_preprocess``
arguments.

Resizing is PIL's resampling, written with NumPy: for each output pixel a separable filter
(triangle for bilinear, Keys' cubic with a = -0.5 for bicubic) whose support widens with the
reduction factor, so a downscale averages over every input pixel it covers (antialiasing).
The filter is banded: output pixel i reads the inputs ``first[i] .. first[i] + taps - 1``
with ``weights[i]``, taps <= 2 support max(in/out, 1) + 1, so the coefficients hold
O(in + out) numbers (never in x out) and a pass costs taps times its output.
For uint8 images it is exact to the byte: PIL's 22-bit fixed-point coefficients, the
horizontal pass rounded to bytes before the vertical one; so the result equals transformers'
PIL-based image processor's (Pillow 13 runs the vertical pass first when the height shrinks
much more than the width, python-pillow/Pillow#9549: its bytes then differ by rounding).
The integer sums stay below 2**53, so float64 computes them exactly. Float images are
resampled with the same filter, without rounding.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._files import quote
from .._validation import check_bool, check_scalar

__all__ = ["vit_preprocess", "ViTImageProcessor", "resize", "IMAGENET_STANDARD"]

IMAGENET_STANDARD = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}  # ViT's checkpoints
_PRECISION_BITS = 32 - 8 - 2  # PIL's fixed point for 8-bit images
_FILTERS = {  # PIL's resample code -> (support, filter)
    2: (1.0, lambda x: np.maximum(0.0, 1.0 - np.abs(x))),
    3: (2.0, lambda x: _bicubic(np.abs(x))),
}
_BLOCK = 1 << 16  # coefficients computed this many at a time: temporaries stay small
_MAX_SIDE = 2**31 - 1  # PIL's image sides are C ints


def _bicubic(x, a=-0.5):
    """Keys' cubic convolution kernel at |x| (any shape), as PIL's bicubic filter."""
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _taps(in_size: int, out_size: int, resample: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL's resampling along one axis as a band: output pixel i is
    ``sum_k weights[i, k] * input[first[i] + k]``.

    Returns ``first`` (out_size,) int64 and ``weights`` (out_size, taps) float64, zero past
    each pixel's support: taps <= 2 support max(in/out, 1) + 1, so the band holds
    O(in_size + out_size) numbers, never in_size x out_size.
    """
    scale = in_size / out_size
    centers = (np.arange(out_size) + 0.5) * scale  # output pixel centres, in input pixels
    if resample == 0:  # nearest: the input pixel under the centre
        return np.minimum(centers.astype(np.int64), in_size - 1), np.ones((out_size, 1))
    support, kernel = _FILTERS[resample]
    filterscale = max(scale, 1.0)  # a downscale widens the filter (antialiasing)
    support *= filterscale
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)  # int(): toward 0
    stop = np.minimum((centers + support + 0.5).astype(np.int64), in_size)
    taps = int((stop - first).max())
    weights = np.empty((out_size, taps))
    step = max(1, _BLOCK // taps)
    for lo in range(0, out_size, step):  # blocks of rows, vectorised within
        rows = slice(lo, lo + step)
        index = first[rows, None] + np.arange(taps)
        w = np.where(index < stop[rows, None],
                     kernel((index - centers[rows, None] + 0.5) / filterscale), 0.0)
        total = np.cumsum(w, axis=1)[:, -1:]  # summed left to right, as PIL
        weights[rows] = np.divide(w, total, out=w, where=total != 0)
    return first, weights


def _fixed_point(weights: np.ndarray) -> np.ndarray:
    """PIL's rounding of the weights to 22-bit fixed point (away from zero)."""
    scaled = weights * (1 << _PRECISION_BITS)
    scaled += np.copysign(0.5, scaled)
    return np.trunc(scaled, out=scaled)


def _pass(x: np.ndarray, first: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    """One banded pass of ``x`` along ``axis``: in_size -> out_size = len(first), float64.

    A tap at a time (each output pixel's k-th input), summed left to right into the output
    through one buffer of its size; past the input's last pixel the weight is zero, so the
    index is clipped to a valid one (mode="clip" also spares take a buffered copy). The
    axis goes first, so each tap gathers whole contiguous slices.
    """
    x = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    weights = weights.reshape(weights.shape + (1,) * (x.ndim - 1))
    out = np.multiply(np.take(x, first, axis=0), weights[:, 0], dtype=np.float64)
    term = np.empty_like(out)
    taken = term if x.dtype == term.dtype else np.empty(term.shape, x.dtype)  # e.g. bytes
    for k in range(1, weights.shape[1]):
        np.take(x, first + k, axis=0, out=taken, mode="clip")
        out += np.multiply(taken, weights[:, k], out=term)
    return np.moveaxis(out, 0, axis)


def _round_bytes(sums: np.ndarray) -> np.ndarray:
    """PIL's fixed-point sums back to byte values (still float64), in place."""
    sums += 1 << (_PRECISION_BITS - 1)
    sums /= 1 << _PRECISION_BITS  # a power of two: exact
    np.floor(sums, out=sums)
    return np.clip(sums, 0, 255, out=sums)


def resize(images: np.ndarray, size, resample: int = 2) -> np.ndarray:
    """Resize channels-last images (B, H, W, C) to ``size`` (height, width) as PIL does.

    uint8 images come back uint8 (PIL's bytes exactly); float images float64. Costs
    O(taps) per output value and O(H + W + height + width) for the coefficients.
    """
    (H, W), (h, w) = images.shape[1:3], size
    if resample not in (0, *_FILTERS):
        raise ValueError(f"resample={resample!r}: nnkit resamples with PIL's codes 0 "
                         "(nearest), 2 (bilinear) and 3 (bicubic)")
    if H == 0 or W == 0:
        raise ValueError(f"images are {H} x {W} pixels: there is nothing to resize")
    if (H, W) == (h, w):
        return images if images.dtype == np.uint8 else images.astype(np.float64)
    as_bytes = images.dtype == np.uint8 and resample != 0
    x = images  # each pass gathers from its input: no float64 copy of the whole image
    for axis, n_in, n_out in ((2, W, w), (1, H, h)):  # horizontal first, as PIL
        if n_in == n_out:
            continue
        first, weights = _taps(n_in, n_out, resample)
        x = _round_bytes(_pass(x, first, _fixed_point(weights), axis)) if as_bytes else \
            _pass(x, first, weights, axis)
    return x.astype(np.uint8) if images.dtype == np.uint8 else x


def _as_batch(images) -> np.ndarray:
    """Images as one (B, H, W, C) array: a (H, W, C) or (H, W) image, a list of them (PIL
    images too), or a (B, H, W, C) array."""
    if isinstance(images, (list, tuple)):
        arrays = [np.asarray(im) for im in images]
        arrays = [a[..., None] if a.ndim == 2 else a for a in arrays]
        if not arrays:
            raise ValueError("images is an empty list")
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1 and len({a.shape[-1] for a in arrays}) > 1:
            raise ValueError(f"images have different channel counts: {sorted(shapes)}")
        return arrays  # resized one by one (their sizes may differ)
    x = np.asarray(images)
    if x.ndim == 2:
        x = x[..., None]
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4:
        raise ValueError(f"images must be (H, W), (H, W, C), (B, H, W, C) or a list of "
                         f"images, got shape {x.shape}")
    return list(x)


def vit_preprocess(images, size=224, mean=IMAGENET_STANDARD["mean"],
                   std=IMAGENET_STANDARD["std"], rescale_factor: float = 1 / 255,
                   resample: int = 2, do_resize: bool = True, do_rescale: bool = True,
                   do_normalize: bool = True, dtype=np.float32) -> np.ndarray:
    """Images -> ViT input (B, C, H, W): resize, rescale, normalise, channels first.

    Parameters
    ----------
    images : array (H, W, C), (H, W), (B, H, W, C), or a list of images
        Arrays or PIL images, sizes may differ; channels last, uint8 (0..255) or float.
    size : int or (height, width)
    mean, std : sequences of C floats
        ``(x - mean) / std`` per channel after rescaling.
    rescale_factor : float
        Multiplies the pixel values (1/255 maps bytes to [0, 1]).
    resample : 0, 2 or 3
        PIL's nearest, bilinear, bicubic.
    do_resize, do_rescale, do_normalize : bool
    dtype : float32 (default) or float64

    Returns
    -------
    ndarray (B, C, height, width) of ``dtype``
        With uint8 images and float32 it equals transformers' PIL-based ViT image
        processor's ``pixel_values``.

    Notes
    -----
    The resize's coefficients take O(H + W + height + width) memory; the output's size is
    the caller's choice.

    Examples
    --------
    >>> vit_preprocess(np.zeros((5, 7, 3), np.uint8), (2, 3)).shape
    (1, 3, 2, 3)
    """
    height, width = (size, size) if isinstance(size, numbers.Integral) else tuple(size)
    for value, name in ((height, "size"), (width, "size")):
        check_scalar(value, name=name, kind=numbers.Integral, low=1)
    check_scalar(rescale_factor, name="rescale_factor")
    for flag, name in ((do_resize, "do_resize"), (do_rescale, "do_rescale"),
                       (do_normalize, "do_normalize")):
        check_bool(flag, name=name)
    batch = _as_batch(images)
    out = None  # (B, C, height, width), filled image by image
    for i, image in enumerate(batch):
        if image.dtype.kind not in "uif" or image.ndim != 3:
            raise TypeError(f"images must be numeric (H, W, C) arrays, got dtype "
                            f"{image.dtype}, shape {image.shape}")
        if do_resize:
            image = resize(image[None], (height, width), resample)[0]
        elif image.shape[:2] != (height, width):
            raise ValueError(f"an image is {image.shape[0]} x {image.shape[1]} with "
                             f"do_resize=False; expected {height} x {width}")
        # rescaled and normalised in place: a copy of the caller's image, resize's own array
        x = image.astype(np.float64, copy=not do_resize)
        if do_rescale:
            x *= rescale_factor
        x = x.astype(dtype, copy=False)  # transformers rescales in float64, normalises in float32
        if do_normalize:
            m = np.asarray(mean, dtype=dtype)
            s = np.asarray(std, dtype=dtype)
            if m.shape != (x.shape[-1],) or s.shape != (x.shape[-1],):
                raise ValueError(f"mean and std need {x.shape[-1]} values (one per channel), "
                                 f"got {m.shape} and {s.shape}")
            if not (np.all(np.isfinite(s)) and np.all(s != 0)):
                raise ValueError(f"std must be finite and non-zero, got {std}")
            x -= m
            x /= s
        if out is None:
            out = np.empty((len(batch), x.shape[2], height, width), dtype)
        out[i] = x.transpose(2, 0, 1)
    return out


class ViTImageProcessor:
    """transformers' image-processor call: ``processor(images)["pixel_values"]``.

    Parameters
    ----------
    **options
        ``vit_preprocess``'s keyword arguments (``size``, ``mean``, ``std``,
        ``rescale_factor``, ``resample``, ``do_resize``, ``do_rescale``, ``do_normalize``,
        ``dtype``), checked at the first call.

    Notes
    -----
    Calling it on images returns ``{"pixel_values": ndarray (B, C, height, width)}``, so
    ``vit(**processor(images))`` runs a ``ViT`` on them (``ViT.image_processor()`` gives the
    processor of a loaded checkpoint).

    Examples
    --------
    >>> ViTImageProcessor(size=4)(np.zeros((5, 7, 3), np.uint8))["pixel_values"].shape
    (1, 3, 4, 4)
    """

    def __init__(self, **options):
        self.options = dict(options)

    def __call__(self, images, return_tensors: str | None = None) -> dict:
        """``{"pixel_values": vit_preprocess(images, **options)}``; ``return_tensors`` may be
        None or ``"np"`` (both give the NumPy array)."""
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got {return_tensors!r}")
        return {"pixel_values": vit_preprocess(images, **self.options)}

    def __repr__(self) -> str:
        return f"ViTImageProcessor({self.options})"


# ----- preprocessor_config.json --------------------------------------------------------------
_JSON_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "an object", type(None): "null"}
# the pipeline normalises in the model's float32: its largest and smallest normal numbers
_FLOAT32_MAX, _FLOAT32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)


def _refusal(path, name: str, value, expected: str) -> ValueError:
    """The error for field ``name`` of the file ``path``: its value (short, escaped), its
    JSON kind, and what was expected."""
    kind = _JSON_KINDS.get(type(value), type(value).__name__)
    return ValueError(f"'{path}': field '{name}' = {quote(value)} ({kind}): expected "
                      f"{expected}")


def _is_int(value) -> bool:
    """A JSON integer (a boolean is not one)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    """A JSON number (not a boolean) finite as a float64 (JSON's 1e999 and NaN are not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer past float64's range
        return False


def _size(path, value) -> tuple[int, int]:
    """``size`` as (height, width): {"height": h, "width": w}, [h, w] or one int."""
    if isinstance(value, dict) and "shortest_edge" in value:
        raise _refusal(path, "size", value, '{"height": h, "width": w}: resizing the '
                       "shortest edge (then cropping) is not ViT's preprocessing; nnkit "
                       "resizes to a fixed height and width")
    if isinstance(value, dict):
        sides = [value["height"], value["width"]] if set(value) == {"height", "width"} \
            else None
    elif isinstance(value, list):
        sides = value if len(value) == 2 else None
    else:
        sides = [value, value]
    if sides is None or not all(_is_int(v) and 1 <= v <= _MAX_SIDE for v in sides):
        raise _refusal(path, "size", value, '{"height": h, "width": w}, [h, w] or one int, '
                       f"with integers from 1 to {_MAX_SIDE} (PIL's limit)")
    return int(sides[0]), int(sides[1])


def _per_channel(path, name: str, value, num_channels: int, nonzero: bool) -> list:
    """``image_mean`` or ``image_std`` as ``num_channels`` floats: a list of them, or one
    number for every channel (as transformers broadcasts it)."""
    expected = (f"{num_channels} numbers (one per input channel of the model) or one number "
                "for every channel")
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = [value] * num_channels  # checked below
    elif not isinstance(value, list):
        raise _refusal(path, name, value, expected)
    elif len(value) != num_channels:
        raise _refusal(path, name, value, f"{expected}; got {len(value)} values")
    else:
        values = value
    for v in values:
        if not _is_finite(v) or abs(v) > _FLOAT32_MAX:
            raise _refusal(path, name, value, f"{expected}, finite in float32; got {quote(v)}")
        if nonzero and abs(v) < _FLOAT32_TINY:
            raise _refusal(path, name, value, f"{expected}, none of them zero (each divides "
                           f"a channel), |value| >= {_FLOAT32_TINY:.2g}; got {quote(v)}")
    return [float(v) for v in values]


def _preprocess_bytes(height: int, width: int, channels: int, resample: int) -> int:
    """An upper bound of the bytes ``vit_preprocess`` allocates for one image upscaled to
    (height, width, channels): three float64 copies of it (the resize's sum and tap, the
    rescaled copy), and per output row and column the band's weights, their fixed-point
    copy and the pass's indices (a downscale's wider band is the size of the caller's image)."""
    taps = 1 if resample == 0 else 2 * int(_FILTERS[resample][0]) + 1
    return 8 * (3 * height * width * channels + (height + width) * (5 * taps + 6)
                + 10 * _BLOCK)


def preprocess_arguments(path, config: dict, *, num_channels: int,
                         max_bytes: int | None) -> dict:
    """``vit_preprocess`` keyword arguments from a preprocessor_config.json's fields.

    Every field is checked without preprocessing anything (the file may be hostile): a
    ValueError names ``path``, the field, its value and what was expected. ``num_channels``
    is the model's ``in_channels`` (the length of ``image_mean`` and ``image_std``);
    ``max_bytes`` bounds what preprocessing one image at ``size`` may allocate (None: no
    bound, for a trusted folder). Other fields (``image_processor_type``, ...) are ignored.

    >>> preprocess_arguments("p.json", {"size": {"height": 8, "width": 8}, "image_mean": 0.5},
    ...                      num_channels=3, max_bytes=None)["mean"]
    [0.5, 0.5, 0.5]
    """
    check_scalar(num_channels, name="num_channels", kind=numbers.Integral, low=1)
    if max_bytes is not None:
        check_scalar(max_bytes, name="max_bytes", kind=numbers.Integral, low=0)
    size = _size(path, config.get("size", 224))
    flags = {}
    for name, default in (("do_resize", True), ("do_rescale", True), ("do_normalize", True),
                          ("do_center_crop", False)):
        flags[name] = config.get(name, default)
        if not isinstance(flags[name], bool):
            raise _refusal(path, name, flags[name], "true or false")
    if flags["do_center_crop"]:
        raise _refusal(path, "do_center_crop", True, "false: nnkit's vit_preprocess does "
                       "not crop")
    resample = config.get("resample", 2)
    if not (_is_int(resample) and resample in (0, *_FILTERS)):
        raise _refusal(path, "resample", resample, "PIL's code 0 (nearest), 2 (bilinear) or "
                       "3 (bicubic); nnkit implements no other filter")
    rescale_factor = config.get("rescale_factor", 1 / 255)
    if not _is_finite(rescale_factor):
        raise _refusal(path, "rescale_factor", rescale_factor, "a finite number (1/255 maps "
                       "bytes to [0, 1])")
    need = _preprocess_bytes(*size, num_channels, resample)
    if max_bytes is not None and need > max_bytes:
        raise _refusal(path, "size", config.get("size", 224), f"a size whose images fit in "
                       f"max_bytes={max_bytes}: preprocessing one {size[0]} x {size[1]} x "
                       f"{num_channels} image takes up to {need} bytes; pass max_bytes=None "
                       "if you trust the folder")
    return dict(size=size, mean=_per_channel(path, "image_mean", config.get(
                    "image_mean", IMAGENET_STANDARD["mean"][0]), num_channels, False),
                std=_per_channel(path, "image_std", config.get(
                    "image_std", IMAGENET_STANDARD["std"][0]), num_channels, True),
                rescale_factor=float(rescale_factor), resample=int(resample),
                do_resize=flags["do_resize"], do_rescale=flags["do_rescale"],
                do_normalize=flags["do_normalize"])
