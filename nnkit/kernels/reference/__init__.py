"""Naive twins of every kernel, written straight from the formula, one module per op family.

Plain loops over rows, computed in float64 (complex128 where complex) and cast back to
the input's dtype, with no stabilisation tricks beyond the textbook max-shift of softmax.
The tests hold ``nk.kernels`` to these; nothing here is meant to be fast. Where a twin
mirrors a kernel pair it follows the kernels' convention (``<op>_forward`` returns
``(out, cache)``, ``<op>_backward(dy, cache)`` the gradients), beside the plain formula. Families:
``softmax`` (softmax, log_softmax, cross-entropy), ``activation`` (GELU, dropout mask),
``layer_norm``, ``conv`` (convolution, pooling), ``scan`` (linear recurrence),
``selective_scan`` (Mamba's S6 recurrence), ``scan_tree``
(the same recurrence by Hillis-Steele and Blelloch tree scans),
``recurrent`` (RNN, LSTM, GRU), ``attention`` and ``linear_attention`` (the
linear-attention / gated / delta-rule recurrence).
"""

from __future__ import annotations

# The family modules, aliased: softmax, layer_norm, ... are also the twins' names.
from . import activation as _activation
from . import conv as _conv
from . import layer_norm as _layer_norm
from . import linear_attention as _linear_attention
from . import recurrent as _recurrent
from . import scan as _scan
from . import selective_scan as _selective_scan
from . import softmax as _softmax
from .activation import (
    dropout_mask,
    gelu,
    gelu_backward,
    gelu_forward,
    gelu_tanh,
)
from .attention import (
    attention_backward,
    attention_forward,
)
from .conv import (
    avg_pool2d,
    avg_pool2d_backward,
    avg_pool2d_forward,
    conv1d,
    conv1d_backward,
    conv1d_forward,
    conv2d,
    conv2d_backward,
    conv2d_forward,
    max_pool2d,
    max_pool2d_backward,
    max_pool2d_forward,
)
from .layer_norm import (
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
)
from .linear_attention import (
    delta_rule_backward,
    delta_rule_forward,
    gated_delta_rule_backward,
    gated_delta_rule_forward,
    gated_linear_attention_backward,
    gated_linear_attention_forward,
    linear_attention_backward,
    linear_attention_forward,
    linear_attention_steps,
    linear_attention_steps_backward,
)
from .recurrent import (
    gru,
    gru_backward,
    gru_forward,
    lstm,
    lstm_backward,
    lstm_forward,
    rnn,
    rnn_backward,
    rnn_forward,
)
from .scan import (
    linear_scan,
    linear_scan_backward,
    linear_scan_forward,
    log_linear_scan,
    log_linear_scan_backward,
    log_linear_scan_forward,
)
from .scan_tree import (
    blelloch_scan,
    hillis_steele_scan,
)
from .selective_scan import (
    selective_scan,
    selective_scan_backward,
    selective_scan_forward,
)
from .softmax import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_forward,
    log_softmax,
    log_softmax_backward,
    log_softmax_forward,
    softmax,
    softmax_backward,
    softmax_forward,
)

__all__ = [*_softmax.__all__, *_activation.__all__, *_layer_norm.__all__, *_conv.__all__,
           *_scan.__all__, *_selective_scan.__all__, "hillis_steele_scan", "blelloch_scan",
           *_recurrent.__all__, "attention_forward", "attention_backward",
           *_linear_attention.__all__]
