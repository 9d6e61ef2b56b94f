"""Diagnostics of trained or untrained networks: gradient flow through time.

``hidden_gradient_norms`` measures dL/dz_t of notes §5: the total gradient of the
loss with respect to the hidden state at every step, direct part plus everything that flows
back through later steps. For an Elman RNN notes §5 bounds how it decays with the distance
i - t from where the loss is taken::

    || dz_i / dz_t ||_2 <= (alpha sigma_1(U))^(i - t),   alpha = sup |phi'|

so a loss on the last state gives norms that shrink geometrically backwards in time when
alpha sigma_1(U) < 1 (vanishing) and may grow when sigma_1(U) is large (exploding). Notes §5
print the vanishing condition with its inequality reversed ("vanish if sigma_1(U) >= 1/alpha");
the bound forces vanishing when sigma_1(U) < 1/alpha.
"""

from __future__ import annotations

import numpy as np

from ._backend import to_host
from .autograd import Tensor
from .nn.recurrent import GRU, LSTM, RNN, record_hidden_grads

__all__ = ["hidden_gradient_norms"]


def _recurrent_layer(model):
    for m in model.modules():
        if isinstance(m, (RNN, LSTM, GRU)):
            return m
    raise TypeError(f"model must be or contain an nn.RNN, nn.LSTM or nn.GRU; got "
                    f"{type(model).__name__}")


def hidden_gradient_norms(model, x, loss_fn):
    """||dL/dh_t|| for every time step t of the last recurrent layer's hidden state h_t.

    Parameters
    ----------
    model : Module
        An ``nn.RNN``/``nn.LSTM``/``nn.GRU``, or a module containing one (the first found in
        ``model.modules()`` is measured: its last layer, forward direction).
    x : array_like or Tensor
        The input ``model(x)`` takes.
    loss_fn : callable
        ``loss_fn(model(x)) -> scalar Tensor``.

    Returns
    -------
    ndarray (T,), float64
        ``norms[t] = || dL/dh_t ||_F`` over the batch and hidden features, where h_t is the
        hidden state (z_t of notes §5; zeta_t for the LSTM) after step t, and the gradient
        is total (through every later step). The model's ``.grad`` fields are left as they
        were.

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> rnn = nk.nn.RNN(2, 8)
    >>> x = np.ones((20, 1, 2), np.float32)
    >>> norms = nk.analysis.hidden_gradient_norms(rnn, x, lambda out: out[0][-1].sum())
    >>> norms.shape, bool(norms[0] < norms[-1])
    ((20,), True)
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    layer = _recurrent_layer(model)
    saved = [(p, p.grad) for p in model.parameters()]
    try:
        with record_hidden_grads() as store:
            loss = loss_fn(model(x))
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise ValueError("loss_fn must return a one-element Tensor, got "
                                 f"{type(loss).__name__} of shape {getattr(loss, 'shape', ())}")
            loss.backward()
    finally:
        for p, g in saved:
            p.grad = g
    key = (id(layer), layer.num_layers - 1, 0)
    if key not in store:
        raise ValueError(f"model's forward did not run its {type(layer).__name__} (the "
                         "first recurrent layer in model.modules()), whose gradients are "
                         "measured")
    # zeros where no gradient reached the layer (record_hidden_grads)
    g = to_host(store[key]).astype(np.float64)  # (T, B, H)
    return np.sqrt((g * g).sum(axis=(1, 2)))
