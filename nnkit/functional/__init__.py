"""Differentiable functions (``import nnkit.functional as F``), torch's names and semantics.

Every function takes ``nk.Tensor``s or plain arrays (wrapped as constants); integer
inputs (class targets, token ids) are plain arrays. The fused ones (softmax, log_softmax,
cross_entropy, layer_norm, linear) call a forward/backward pair from ``nnkit.kernels``;
the others compose Tensor ops.

One module per op family: ``core`` (activations, softmax and losses, layer norm,
linear, dropout, embedding), ``conv`` (convolution and pooling), ``scan`` (linear
recurrences, the selective scan) and ``attention``.
"""

from __future__ import annotations

from . import attention, conv, core, scan
from . import linear_attention as _linear_attention
from .attention import (
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)
from .conv import (
    avg_pool2d,
    conv1d,
    conv2d,
    max_pool2d,
)
from .core import (
    binary_cross_entropy_with_logits,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    mse_loss,
    relu,
    sigmoid,
    softmax,
    tanh,
)
from .linear_attention import (
    delta_rule,
    gated_delta_rule,
    gated_linear_attention,
    linear_attention,
)
from .scan import (
    linear_scan,
    log_linear_scan,
    selective_scan,
)

__all__ = [*core.__all__, *conv.__all__, *scan.__all__, *attention.__all__,
           *_linear_attention.__all__]
