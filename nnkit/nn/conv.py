"""Convolution and pooling layers: Conv1d, Conv2d, MaxPool2d, AvgPool2d.

Constructor arguments, parameter names (``weight``, ``bias``), shapes and default
initialisation are torch's, so ``load_state_dict(torch_module.state_dict())`` works:
weight ~ kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and bias ~
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), with fan_in = in_channels / groups * prod(kernel_size).
"""

from __future__ import annotations

import math
import numbers

from .._validation import check_bool, check_int_tuple, check_scalar
from ..autograd import as_tensor
from ..functional import conv as FC
from ..kernels import conv as KC
from . import init
from .layers import _add_weight_and_bias, _dtype
from .module import Module

__all__ = ["Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d"]


class _ConvNd(Module):
    _nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", dtype=None):
        super().__init__()
        n = self._nd
        self.in_channels = check_scalar(in_channels, name="in_channels",
                                        kind=numbers.Integral, low=1)
        self.out_channels = check_scalar(out_channels, name="out_channels",
                                         kind=numbers.Integral, low=1)
        self.groups = check_scalar(groups, name="groups", kind=numbers.Integral, low=1)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        if padding_mode != "zeros":
            raise ValueError(f"padding_mode must be 'zeros' (the only mode nnkit implements), "
                             f"got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.kernel_size = check_int_tuple(kernel_size, n, name="kernel_size", low=1)
        self.stride = check_int_tuple(stride, n, name="stride", low=1)
        self.dilation = check_int_tuple(dilation, n, name="dilation", low=1)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"padding must be 'same', 'valid' or ints, got {padding!r}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' needs stride 1 (as torch)")
            self.padding = padding
        else:
            self.padding = check_int_tuple(padding, n, name="padding", low=0)
        dtype = _dtype(dtype)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        _add_weight_and_bias(self, shape, bias, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's default: kaiming_uniform(a=sqrt(5)) weight, U(+-1/sqrt(fan_in)) bias."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def _check_input(self, x):
        """``x`` as a Tensor (N, C, *spatial) or unbatched (C, *spatial), as torch takes."""
        x = as_tensor(x)
        nd = self._nd
        dims = "H, W" if nd == 2 else "L"
        name = type(self).__name__
        if x.ndim not in (nd + 1, nd + 2):
            raise ValueError(f"x must be {nd + 1}-D (C, {dims}) unbatched or {nd + 2}-D "
                             f"(N, C, {dims}) for {name}, got shape {x.shape}")
        channels = x.shape[-nd - 1]
        if channels != self.in_channels:
            layout = f"unbatched (C, {dims})" if x.ndim == nd + 1 else f"(N, C, {dims})"
            raise ValueError(f"x has {channels} channels (shape {x.shape}, {layout}) but "
                             f"{name} was built with in_channels={self.in_channels}; expected "
                             f"shape ({self.in_channels}, {dims}) or "
                             f"(N, {self.in_channels}, {dims})")
        return x

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self._nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv2d(_ConvNd):
    """2-D convolution layer (cross-correlation, as torch): (N, C, H, W) -> (N, K, Ho, Wo).

    An unbatched (C, H, W) input gives (K, Ho, Wo), as torch.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size, stride, dilation : int or (int, int)
    padding : int, (int, int), 'valid' or 'same'
    groups : int dividing both channel counts
    bias : bool
    padding_mode : 'zeros'
    dtype : float32 (default) or float64

    Attributes
    ----------
    weight : Parameter (out_channels, in_channels / groups, kh, kw)
    bias : Parameter (out_channels,) or None

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> from nnkit.nn.conv import Conv2d
    >>> Conv2d(1, 4, 3, padding=1)(np.zeros((2, 1, 8, 8), np.float32)).shape
    (2, 4, 8, 8)
    """

    _nd = 2

    def forward(self, x):
        return FC.conv2d(self._check_input(x), self.weight, self.bias, self.stride,
                         self.padding, self.dilation, self.groups)


class Conv1d(_ConvNd):
    """1-D convolution layer: (N, C, L) -> (N, K, Lo); torch's arguments and parameters.

    An unbatched (C, L) input gives (K, Lo), as torch.

    Attributes
    ----------
    weight : Parameter (out_channels, in_channels / groups, k)
    bias : Parameter (out_channels,) or None
    """

    _nd = 1

    def forward(self, x):
        padding = self.padding if isinstance(self.padding, str) else self.padding[0]
        return FC.conv1d(self._check_input(x), self.weight, self.bias, self.stride[0],
                         padding, self.dilation[0], self.groups)


class MaxPool2d(Module):
    """Max pooling over windows (``F.max_pool2d``): (N, C, H, W) -> (N, C, Ho, Wo), or
    unbatched (C, H, W) -> (C, Ho, Wo).

    torch's arguments in torch's order; stride defaults to kernel_size, padding is at most
    half the kernel. With ``return_indices`` the forward returns (y, indices), indices int64
    (N, C, Ho, Wo) into each flattened (H, W) plane.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = KC.pool_params(
            kernel_size, stride, padding, dilation)
        self.return_indices = check_bool(return_indices, name="return_indices")
        self.ceil_mode = check_bool(ceil_mode, name="ceil_mode")

    def forward(self, x):
        return FC.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                             self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Average pooling over windows (``F.avg_pool2d``): (N, C, H, W) -> (N, C, Ho, Wo), or
    unbatched (C, H, W) -> (C, Ho, Wo).

    torch's arguments in torch's order; stride defaults to kernel_size; divisor_override, a
    nonzero int, replaces every window's divisor.
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding, _ = KC.pool_params(kernel_size, stride,
                                                                        padding)
        self.ceil_mode = check_bool(ceil_mode, name="ceil_mode")
        self.count_include_pad = check_bool(count_include_pad, name="count_include_pad")
        KC.check_divisor(divisor_override)
        self.divisor_override = divisor_override

    def forward(self, x):
        return FC.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
