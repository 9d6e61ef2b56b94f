"""Fused optimizer steps over a list of parameters: Adam/AdamW as one Numba pass per
parameter on the CPU (``nnkit._ext.optim_cpu``) instead of a dozen in-place ufuncs, and
Adam/AdamW and SGD in one launch per chunk of parameters on the GPU
(``nnkit._ext.optim_cuda``, multi-tensor, as torch's ``fused``); the module is picked by
``nnkit._backend.kernels_for`` from the first parameter.

``nk.optim`` asks ``fusable`` which parameters a device's fused step takes (flat,
C-contiguous, one real dtype), groups them by dtype and step count, and runs the rest
through its ufunc path; nothing else is validated here. ``adam_update`` is the CPU pass on
one parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._backend import kernels_for
from .._types import Array

__all__ = ["adam_update", "fusable", "adam_step", "sgd_step"]


def _kernels(param):
    """``optim_cpu`` for a NumPy parameter, ``optim_cuda`` for a GPU one."""
    return kernels_for("optim_cpu", "optim_cuda", param, name="param")


def adam_update(param: Array, grad: Array, exp_avg: Array, exp_avg_sq: Array,
                max_exp_avg_sq: Array, coef: Array, small_weight: bool, amsgrad: bool,
                maximize: bool, coupled_decay: bool, decoupled_decay: bool) -> None:
    """One Adam step in place on flat (n,) C-contiguous NumPy arrays of one dtype.

    ``coef`` (the arrays' dtype) holds [weight_decay, 1 - lr weight_decay, 1 - beta1, beta1,
    beta2, 1 - beta2, sqrt(1 - beta2^t), eps, -lr / (1 - beta1^t)]; ``max_exp_avg_sq`` is
    read and written only with ``amsgrad``. The flags pick torch's variants: the lerp form
    of the first moment for a small weight, the sign of the gradient, L2 (Adam) or
    decoupled (AdamW) weight decay.
    """
    kernels_for("optim_cpu", None, param, name="param").adam_update_cpu(
        param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, coef, small_weight, amsgrad,
        maximize, coupled_decay, decoupled_decay)


def fusable(step: str, data: Array, grad: Array | None, *buffers: Array | None) -> bool:
    """Whether the fused ``step`` ('adam' or 'sgd') of ``data``'s device takes a parameter:
    float32/float64 ``data``, and a gradient and state buffers (None: made by the step) of
    its array type, dtype and shape, all C-contiguous. SGD is fused on the GPU only."""
    if data.dtype.kind != "f" or step not in _kernels(data).FUSED:
        return False
    return all(b is None or (type(b) is type(data) and b.dtype == data.dtype and
                             b.shape == data.shape and b.flags.c_contiguous)
               for b in (data, grad, *buffers))


def adam_step(params: Sequence[Array], grads: Sequence[Array], exp_avgs: Sequence[Array],
              exp_avg_sqs: Sequence[Array], max_exp_avg_sqs: Sequence[Array] | None,
              **hyper: float | int | bool) -> None:
    """One Adam/AdamW step in place on lists of flat arrays of one dtype and device that
    ``fusable`` takes (the keywords of ``nnkit._ext.optim_cuda.adam_step``: lr, beta1,
    beta2, eps, weight_decay, step, maximize, decoupled); ``max_exp_avg_sqs`` None without
    AMSGrad."""
    _kernels(params[0]).adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                  **hyper)


def sgd_step(params: Sequence[Array], grads: Sequence[Array], bufs: Sequence[Array | None],
             **hyper: float | bool) -> None:
    """One SGD step in place on lists of flat GPU arrays of one dtype that ``fusable`` takes
    (the keywords of ``nnkit._ext.optim_cuda.sgd_step``: lr, momentum, dampening,
    weight_decay, nesterov, maximize, first)."""
    _kernels(params[0]).sgd_step(params, grads, bufs, **hyper)
