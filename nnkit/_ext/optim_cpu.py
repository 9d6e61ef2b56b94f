"""Fused optimizer updates (Numba CPU): one pass over a parameter's flat array.

One pass instead of the dozen array passes of in-place ufuncs: an Adam step of a small MLP
runs several times faster than NumPy's ufuncs and torch.optim.Adam
(benchmarks/RESULTS.md, "Foundation" and "Figures moved from docstrings").
error_model="numpy" matters: Python's division semantics (a ZeroDivisionError check per
element) keep LLVM from vectorising the loop, which then runs several times slower. The
kernel vectorises without fastmath (no reductions).

``adam_step`` takes a list of parameters, as ``nnkit._ext.optim_cuda.adam_step`` (the same
name and signature, picked by ``nnkit._backend.kernels_for``), and runs the pass on each.
``FUSED`` names the steps fused here: Adam only; SGD's update is already one in-place ufunc
per operation on the CPU, so ``nnkit.optim`` keeps it.
"""

import numba
import numpy as np

from .launchers import launchers

__all__ = [*launchers("optim_cpu", "optim_cuda"), "adam_update_cpu"]

FUSED = ("adam",)  # the steps this module fuses (``nnkit.kernels.optim.fusable``)


def _adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, coef, small_weight,
                 amsgrad, maximize, coupled_decay, decoupled_decay):
    """One Adam step on flat C-contiguous arrays of one dtype, in a single pass.

    ``coef`` (same dtype as the arrays, so float32 math stays float32 as in torch) holds
    [weight_decay, 1 - lr*weight_decay, 1 - beta1, beta1, beta2, 1 - beta2,
    sqrt(1 - beta2^t), eps, -lr / (1 - beta1^t)]. Each line is the torch op it mirrors.
    """
    wd = coef[0]
    decay = coef[1]
    w1 = coef[2]
    one_minus_w1 = coef[3]
    beta2 = coef[4]
    c2 = coef[5]
    bc2_sqrt = coef[6]
    eps = coef[7]
    neg_step = coef[8]
    for i in range(param.shape[0]):
        g = grad[i]
        if maximize:
            g = -g
        p = param[i]
        if decoupled_decay:
            p = p * decay  # param.mul_(1 - lr * weight_decay)
        elif coupled_decay:
            g = g + wd * p  # grad = grad.add(param, alpha=weight_decay)
        m = exp_avg[i]
        if small_weight:  # exp_avg.lerp_(grad, 1 - beta1)
            m = m + w1 * (g - m)
        else:
            m = g - (g - m) * one_minus_w1
        exp_avg[i] = m
        v = exp_avg_sq[i] * beta2 + c2 * g * g  # exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
        exp_avg_sq[i] = v
        if amsgrad:  # torch.maximum(max_exp_avg_sq, exp_avg_sq), NaN propagating
            vmax = max_exp_avg_sq[i]
            if v > vmax or v != v:
                vmax = v
            max_exp_avg_sq[i] = vmax
            v = vmax
        denom = np.sqrt(v) / bc2_sqrt + eps  # (v.sqrt() / bias_correction2_sqrt).add_(eps)
        param[i] = p + neg_step * m / denom  # param.addcdiv_(exp_avg, denom, -step_size)


adam_update_cpu = numba.njit(cache=True, error_model="numpy")(_adam_update)


def adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, lr, beta1, beta2,
              eps, weight_decay, step, maximize, decoupled):
    """One Adam (``decoupled``: AdamW) step of every tensor, one ``adam_update_cpu`` pass
    each: lists of flat C-contiguous NumPy arrays of one float dtype, all at step count
    ``step`` (after this step's increment); ``max_exp_avg_sqs`` None without AMSGrad."""
    w1 = 1 - beta1
    coef = np.array([weight_decay, 1 - lr * weight_decay, w1, 1 - w1, beta2, 1 - beta2,
                     (1 - beta2**step) ** 0.5, eps, -(lr / (1 - beta1**step))],
                    dtype=params[0].dtype)
    amsgrad = max_exp_avg_sqs is not None
    flags = (w1 < 0.5, amsgrad, bool(maximize), weight_decay != 0 and not decoupled,
             weight_decay != 0 and bool(decoupled))
    vmaxes = max_exp_avg_sqs if amsgrad else exp_avg_sqs  # not read without AMSGrad
    for p, g, m, v, vmax in zip(params, grads, exp_avgs, exp_avg_sqs, vmaxes, strict=True):
        adam_update_cpu(p, g, m, v, vmax, coef, *flags)
