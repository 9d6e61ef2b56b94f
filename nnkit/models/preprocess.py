"""Image preprocessing for ViT checkpoints: resize, rescale, normalise (``vit_preprocess``).

A ViT checkpoint expects its images prepared as in training; its ``preprocessor_config.json``
says how (transformers' image processor fields): ``size`` (the height and width to resize
to), ``resample`` (2 = bilinear, 3 = bicubic, 0 = nearest, PIL's codes), ``rescale_factor``
(1/255: bytes to [0, 1]), ``image_mean`` and ``image_std`` (per channel), and ``do_resize``,
``do_rescale``, ``do_normalize`` switches.

Resizing is PIL's resampling, written with NumPy: for each output pixel a separable filter
(triangle for bilinear, Keys' cubic with a = -0.5 for bicubic) whose support widens with the
reduction factor, so a downscale averages over every input pixel it covers (antialiasing).
For uint8 images it is exact to the byte: PIL's 22-bit fixed-point coefficients, the
horizontal pass rounded to bytes before the vertical one; so the result equals transformers'
PIL-based image processor's. The integer sums stay below 2**53, so a float64 matrix product
computes them exactly. Float images are resampled with the same filter, without rounding.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import check_bool, check_scalar

__all__ = ["vit_preprocess", "resize", "IMAGENET_STANDARD"]

IMAGENET_STANDARD = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}  # ViT's checkpoints
_PRECISION_BITS = 32 - 8 - 2  # PIL's fixed point for 8-bit images
_FILTERS = {  # PIL's resample code -> (support, filter)
    2: (1.0, lambda x: np.maximum(0.0, 1.0 - np.abs(x))),
    3: (2.0, lambda x: _bicubic(np.abs(x))),
}


def _bicubic(x, a=-0.5):
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _coefficients(in_size: int, out_size: int, resample: int) -> np.ndarray:
    """(out_size, in_size) float64 weights of PIL's resampling along one axis."""
    scale = in_size / out_size
    if resample == 0:  # nearest: the input pixel under each output pixel's centre
        out = np.zeros((out_size, in_size))
        src = np.minimum(((np.arange(out_size) + 0.5) * scale).astype(np.int64), in_size - 1)
        out[np.arange(out_size), src] = 1.0
        return out
    support, kernel = _FILTERS[resample]
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


def _fixed_point(weights: np.ndarray) -> np.ndarray:
    """PIL's rounding of the weights to 22-bit fixed point (away from zero)."""
    scaled = weights * (1 << _PRECISION_BITS)
    return np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))


def _resample_bytes(x: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    """One pass over uint8 values held in float64 (..., n, ...) -> bytes again, as PIL."""
    moved = np.moveaxis(x, axis, -1) @ _fixed_point(weights).T  # exact integer sums
    moved = np.floor((moved + (1 << (_PRECISION_BITS - 1))) / (1 << _PRECISION_BITS))
    return np.moveaxis(np.clip(moved, 0, 255), -1, axis)


def resize(images: np.ndarray, size, resample: int = 2) -> np.ndarray:
    """Resize channels-last images (B, H, W, C) to ``size`` (height, width) as PIL does.

    uint8 images come back uint8 (PIL's bytes exactly); float images float64.
    """
    (H, W), (h, w) = images.shape[1:3], size
    if resample not in (0, *_FILTERS):
        raise ValueError(f"resample={resample!r}: nnkit resamples with PIL's codes 0 "
                         "(nearest), 2 (bilinear) and 3 (bicubic)")
    x = images.astype(np.float64)
    as_bytes = images.dtype == np.uint8 and resample != 0
    if (H, W) == (h, w):
        return images if images.dtype == np.uint8 else x
    for axis, n_in, n_out in ((2, W, w), (1, H, h)):  # horizontal first, as PIL
        if n_in == n_out:
            continue
        weights = _coefficients(n_in, n_out, resample)
        x = _resample_bytes(x, weights, axis) if as_bytes else \
            np.moveaxis(np.moveaxis(x, axis, -1) @ weights.T, -1, axis)
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
    images : array (H, W, C), (H, W), (B, H, W, C), or a list of images (arrays or PIL
        images, sizes may differ); channels last, uint8 (0..255) or float.
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
    ndarray (B, C, height, width) of ``dtype``. With uint8 images and float32 it equals
    transformers' PIL-based ViT image processor's ``pixel_values``.
    """
    height, width = (size, size) if isinstance(size, numbers.Integral) else tuple(size)
    for value, name in ((height, "size"), (width, "size")):
        check_scalar(value, name=name, kind=numbers.Integral, low=1)
    check_scalar(rescale_factor, name="rescale_factor")
    for flag, name in ((do_resize, "do_resize"), (do_rescale, "do_rescale"),
                       (do_normalize, "do_normalize")):
        check_bool(flag, name=name)
    out = []
    for image in _as_batch(images):
        if image.dtype.kind not in "uif" or image.ndim != 3:
            raise TypeError(f"images must be numeric (H, W, C) arrays, got dtype "
                            f"{image.dtype}, shape {image.shape}")
        if do_resize:
            image = resize(image[None], (height, width), resample)[0]
        elif image.shape[:2] != (height, width):
            raise ValueError(f"an image is {image.shape[0]} x {image.shape[1]} with "
                             f"do_resize=False; expected {height} x {width}")
        x = image.astype(np.float64)
        if do_rescale:
            x = x * rescale_factor
        x = x.astype(dtype)  # transformers rescales in float64, normalises in float32
        if do_normalize:
            m = np.asarray(mean, dtype=dtype)
            s = np.asarray(std, dtype=dtype)
            if m.shape != (x.shape[-1],) or s.shape != (x.shape[-1],):
                raise ValueError(f"mean and std need {x.shape[-1]} values (one per channel), "
                                 f"got {m.shape} and {s.shape}")
            if not (np.all(np.isfinite(s)) and np.all(s != 0)):
                raise ValueError(f"std must be finite and non-zero, got {std}")
            x = (x - m) / s
        out.append(x.transpose(2, 0, 1))  # (C, H, W)
    return np.ascontiguousarray(np.stack(out), dtype=dtype)


def preprocess_arguments(path, config: dict) -> dict:
    """``vit_preprocess`` keyword arguments from a preprocessor_config.json's fields."""
    def field(name, default):
        return config.get(name, default)

    size = field("size", 224)
    if isinstance(size, dict):
        if "height" in size and "width" in size:
            size = (size["height"], size["width"])
        elif "shortest_edge" in size:
            raise ValueError(f"'{path}': field 'size' = {size!r:.100}: resizing the shortest "
                             "edge (then cropping) is not ViT's preprocessing; nnkit resizes "
                             "to a fixed height and width")
        else:
            raise ValueError(f"'{path}': field 'size' = {size!r:.100}: expected "
                             "{'height': h, 'width': w} or an int")
    if field("do_center_crop", False):
        raise ValueError(f"'{path}': field 'do_center_crop' = true: nnkit's vit_preprocess "
                         "does not crop")
    args = dict(size=size, mean=field("image_mean", IMAGENET_STANDARD["mean"]),
                std=field("image_std", IMAGENET_STANDARD["std"]),
                rescale_factor=field("rescale_factor", 1 / 255),
                resample=field("resample", 2), do_resize=field("do_resize", True),
                do_rescale=field("do_rescale", True), do_normalize=field("do_normalize", True))
    try:  # check every field now, on a tiny image
        vit_preprocess(np.zeros((2, 2, len(args["mean"])), np.uint8),
                       **{**args, "size": args["size"] if args["do_resize"] else (2, 2)})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"'{path}': {exc}") from None
    if any(not math.isfinite(v) for v in (*args["mean"], *args["std"])):
        raise ValueError(f"'{path}': fields 'image_mean' and 'image_std' must be finite")
    return args
