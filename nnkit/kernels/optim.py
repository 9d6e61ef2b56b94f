"""Fused optimizer steps: Adam/AdamW over one parameter's flat array on the CPU
(``nnkit._ext.optim_cpu``, Numba) instead of a dozen in-place ufuncs, and Adam/AdamW and SGD
over a list of parameters in one launch per chunk on the GPU (``nnkit._ext.optim_cuda``,
multi-tensor, as torch's ``fused``).

``nk.optim`` calls them for flat C-contiguous arrays of one real dtype and checks that
layout itself (other arrays take its ufunc path), so nothing is validated here; each refuses
arrays of the other device (TypeError).
"""

from __future__ import annotations

from .._backend import kernels_for

__all__ = ["adam_update", "adam_step_gpu", "sgd_step_gpu"]


def adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, coef, small_weight,
                amsgrad, maximize, coupled_decay, decoupled_decay):
    """One Adam step in place on flat (n,) C-contiguous arrays of one dtype.

    ``coef`` (the arrays' dtype) holds [weight_decay, 1 - lr weight_decay, 1 - beta1, beta1,
    beta2, 1 - beta2, sqrt(1 - beta2^t), eps, -lr / (1 - beta1^t)]; ``max_exp_avg_sq`` is
    read and written only with ``amsgrad``. The flags pick torch's variants: the lerp form
    of the first moment for a small weight, the sign of the gradient, L2 (Adam) or
    decoupled (AdamW) weight decay.
    """
    kernels_for("optim_cpu", None, param, name="param").adam_update_cpu(
        param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, coef, small_weight, amsgrad,
        maximize, coupled_decay, decoupled_decay)


def adam_step_gpu(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, **hyper):
    """One Adam/AdamW step in place on lists of flat CuPy arrays of one dtype (the keywords
    of ``nnkit._ext.optim_cuda.adam_step``: lr, beta1, beta2, eps, weight_decay, step,
    maximize, decoupled)."""
    kernels_for(None, "optim_cuda", params[0], name="params[0]").adam_step(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, **hyper)


def sgd_step_gpu(params, grads, bufs, **hyper):
    """One SGD step in place on lists of flat CuPy arrays of one dtype (the keywords of
    ``nnkit._ext.optim_cuda.sgd_step``: lr, momentum, dampening, weight_decay, nesterov,
    maximize, first)."""
    kernels_for(None, "optim_cuda", params[0], name="params[0]").sgd_step(
        params, grads, bufs, **hyper)
