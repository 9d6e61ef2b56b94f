"""The fused Adam/AdamW update: one pass over a parameter's flat array on the CPU
(``nnkit._ext.optim_cpu``, Numba) instead of a dozen in-place ufuncs.

``nk.optim.Adam`` calls it for flat C-contiguous NumPy arrays of one real dtype and checks
that layout itself (other arrays take its ufunc path), so nothing is validated here; a GPU
array is refused (these kernels run on the CPU only).
"""

from __future__ import annotations

from .._backend import kernels_for

__all__ = ["adam_update"]


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
