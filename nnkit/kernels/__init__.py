"""Validated NumPy-level forward/backward kernels with backend dispatch.

Each function checks its inputs once (``nnkit._validation``), picks the backend by array
type in one place (``nnkit._backend.kernels_for``: NumPy -> the compiled CPU kernels in
``nnkit._ext``, CuPy/device arrays -> the Numba CUDA kernels) and returns plain arrays.
One convention for every differentiable family: ``<op>_forward(inputs..., options...)``
returns ``(out, cache)`` (``out`` a tuple where there are several outputs, as an LSTM's
(y, h_T, c_T)); ``<op>_backward(douts, cache, needs=None)`` returns one gradient per
differentiable input in the forward's order (the array itself for one input), ``None``
where ``needs`` (``nnkit.autograd.apply_op``'s mask of the inputs that want one) says none
is wanted; it trusts the cache and checks only ``douts``. The pairs go to ``apply_op`` as
they are. ``nnkit.kernels.reference`` holds the naive twin of each. The layers above
(functional, optim, approx, classic) reach the compiled kernels only through this package;
the entry points of the optimizer, approximation and classic kernels (``adam_update``,
``window_sum``, ``perceptron_epochs``, the Hopfield dynamics) trust their callers'
validation.
"""

from . import reference
from .activation import dropout_backward, dropout_forward, gelu_backward, gelu_forward
from .approx import window_sum
from .attention import attention_backward, attention_forward
from .conv import (
    avg_pool2d_backward,
    avg_pool2d_forward,
    conv1d_backward,
    conv1d_forward,
    conv2d_backward,
    conv2d_forward,
    max_pool2d_backward,
    max_pool2d_forward,
)
from .hopfield import (
    dense_memory_async_run,
    hopfield_async_run,
    hopfield_async_run_patterns,
    hopfield_init_fields,
    hopfield_sync_run,
)
from .layer_norm import layer_norm_backward, layer_norm_forward
from .linear_attention import linear_attention_backward, linear_attention_forward
from .optim import adam_step, adam_update, fusable, sgd_step
from .perceptron import perceptron_epochs
from .recurrent import (
    gru_backward,
    gru_forward,
    lstm_backward,
    lstm_forward,
    rnn_backward,
    rnn_forward,
)
from .scan import (
    linear_scan_backward,
    linear_scan_forward,
    log_linear_scan_backward,
    log_linear_scan_forward,
)
from .scan_tree import TreeScanStats, tree_scan, tree_scan_counts
from .softmax import (
    cross_entropy_backward,
    cross_entropy_forward,
    log_softmax_backward,
    log_softmax_forward,
    softmax_backward,
    softmax_forward,
)

# The differentiable families, each an ``<op>_forward`` / ``<op>_backward`` pair.
PAIRS = ("attention", "softmax", "log_softmax", "cross_entropy", "layer_norm", "gelu", "dropout",
         "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "linear_scan", "log_linear_scan",
         "rnn", "lstm", "gru", "linear_attention")

__all__ = [
    "reference",
    *(f"{op}_{half}" for op in PAIRS for half in ("forward", "backward")),
    "tree_scan", "tree_scan_counts", "TreeScanStats",
    "adam_update", "adam_step", "sgd_step", "fusable",
    "window_sum", "perceptron_epochs",
    "hopfield_init_fields", "hopfield_async_run", "hopfield_async_run_patterns",
    "hopfield_sync_run", "dense_memory_async_run",
]
