"""Multi-tensor optimizer steps on NVIDIA GPUs: one Numba CUDA launch updates many parameters.

The CuPy path of ``nnkit.optim`` ran a dozen in-place ufuncs per parameter and step (Adam:
13, AdamW: 14, SGD with momentum: 4), each a kernel: 616 of the 922 kernels of a digits-ViT
training step (benchmarks/RESULTS.md, "Fewer launches per step"). Here one launch takes a
list of parameters, as torch's ``foreach``/``fused`` optimizers do (``multi_tensor_apply``):
the parameters, gradients and state buffers are passed as tuples of flat 1-D arrays (Numba's
ABI passes a tuple of arrays as its arrays one after the other; ``_launch`` packs them), the
grid's y index picks the tensor and its x blocks stride over that tensor's elements.

Numba's kernel parameters may take 4 KiB (CUDA's limit before 12.1), 56 bytes per 1-D
array: a launch takes at most ``per_launch(k)`` tensors of k arrays each (Adam: 4 arrays,
17 tensors; AMSGrad 5, 13; SGD 3, 22), so the 44 parameters of the digits ViT take 3
launches. The parameters of one launch share a dtype (float32 or float64) and, for Adam,
a step count (its bias corrections); the caller groups them.

Each update is the CuPy path's, operation for operation, in the parameters' dtype (the
coefficients are passed as scalars of that dtype, as CuPy casts Python floats): under the
simulator the results are bit for bit the CuPy path's; on a GPU the compiler may fuse a
multiply and an add into an FMA, an ulp or so apart.

Launchers take CuPy arrays (NumPy arrays under ``NUMBA_ENABLE_CUDASIM=1``), flat and
C-contiguous, and launch through ``_launch.launch`` on CuPy's current stream. ``adam_step``
has the signature of ``nnkit._ext.optim_cpu.adam_step`` (``nnkit._backend.kernels_for``
picks one of them).
"""

from __future__ import annotations

import math

from numba import cuda

from ._launch import kernel_factory, launch
from .launchers import launchers

__all__ = [*launchers("optim_cpu", "optim_cuda"), "sgd_step", "per_launch"]

FUSED = ("adam", "sgd")  # the steps this module fuses (``nnkit.kernels.optim.fusable``)

threads = 256  # threads per block (the CuPy stand-in's tests lower it)
max_blocks = 512  # blocks per tensor along x; threads stride over the rest
PARAM_BYTES = 4096 - 256  # kernel parameter space for the tuples (the scalars take the rest)
_ARRAY_BYTES = 56  # a 1-D array: meminfo, parent, nitems, itemsize, data, shape, stride


def per_launch(arrays_per_tensor: int) -> int:
    """Tensors one launch takes when each passes ``arrays_per_tensor`` 1-D arrays."""
    return PARAM_BYTES // (_ARRAY_BYTES * arrays_per_tensor)


@kernel_factory
def _adam_kernel(amsgrad: bool):
    """The Adam/AdamW step over tuples of flat arrays (AMSGrad: with the running maxima)."""

    def update(p, g, m, v, vmax, i, wd, decay, w1, one_minus_w1, beta2, c2, bc2_sqrt, eps,
               neg_step, small_weight, maximize, coupled, decoupled):
        gi = g[i]
        if maximize:
            gi = -gi
        pi = p[i]
        if decoupled:
            pi = pi * decay  # param.mul_(1 - lr * weight_decay)
        elif coupled:
            gi = gi + pi * wd  # grad = grad.add(param, alpha=weight_decay)
        mi = m[i]
        if small_weight:  # exp_avg.lerp_(grad, 1 - beta1)
            mi = mi + (gi - mi) * w1
        else:
            mi = gi - (gi - mi) * one_minus_w1
        m[i] = mi
        vi = v[i] * beta2 + gi * c2 * gi  # exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
        v[i] = vi
        if amsgrad:  # torch.maximum(max_exp_avg_sq, exp_avg_sq): NaN propagates
            vm = vmax[i]
            if vi > vm or vi != vi:
                vm = vi
            vmax[i] = vm
            vi = vm
        # denom = (v.sqrt() / bias_correction2_sqrt).add_(eps), in the arrays' dtype (the
        # simulator's double root rounds to it at the division: a float32 root, exactly)
        denom = math.sqrt(vi) / bc2_sqrt + eps
        p[i] = pi + mi / denom * neg_step  # param.addcdiv_(exp_avg, denom, -step_size)

    update = cuda.jit(device=True)(update)

    if amsgrad:
        def kernel(params, grads, exp_avgs, exp_avg_sqs, max_sqs, wd, decay, w1, one_minus_w1,
                   beta2, c2, bc2_sqrt, eps, neg_step, small_weight, maximize, coupled,
                   decoupled):
            t = cuda.blockIdx.y
            p, g, m, v, vmax = params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], max_sqs[t]
            for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
                update(p, g, m, v, vmax, i, wd, decay, w1, one_minus_w1, beta2, c2, bc2_sqrt,
                       eps, neg_step, small_weight, maximize, coupled, decoupled)
    else:
        def kernel(params, grads, exp_avgs, exp_avg_sqs, wd, decay, w1, one_minus_w1, beta2,
                   c2, bc2_sqrt, eps, neg_step, small_weight, maximize, coupled, decoupled):
            t = cuda.blockIdx.y
            p, g, m, v = params[t], grads[t], exp_avgs[t], exp_avg_sqs[t]
            for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
                update(p, g, m, v, v, i, wd, decay, w1, one_minus_w1, beta2, c2, bc2_sqrt,
                       eps, neg_step, small_weight, maximize, coupled, decoupled)

    kernel.__qualname__ = "adam_amsgrad" if amsgrad else "adam"
    return cuda.jit(kernel)


@cuda.jit
def _sgd_kernel(params, grads, bufs, lr, wd, momentum, dampening_w, maximize, decay,
                has_momentum, first, dampened, nesterov):  # dampening_w = 1 - dampening
    t = cuda.blockIdx.y
    p, g, b = params[t], grads[t], bufs[t]
    for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
        gi = g[i]
        if maximize:
            gi = -gi
        if decay:
            gi = gi + p[i] * wd  # grad = grad.add(param, alpha=weight_decay)
        if has_momentum:
            if first:
                bi = gi  # buf = torch.clone(grad)
            else:
                bi = b[i] * momentum  # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                bi = bi + gi * dampening_w if dampened else bi + gi
            b[i] = bi
            gi = gi + bi * momentum if nesterov else bi
        p[i] = p[i] - gi * lr  # param.add_(grad, alpha=-lr)


def _grid(tensors):
    n = max(int(p.shape[0]) for p in tensors)
    return (min(max_blocks, (n + threads - 1) // threads), len(tensors)), threads


def _chunks(n, size):
    return [slice(s, min(n, s + size)) for s in range(0, n, size)]


def adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, lr, beta1, beta2,
              eps, weight_decay, step, maximize, decoupled):
    """One Adam (``decoupled``: AdamW) step of every tensor, as ``nnkit.optim.Adam``'s CuPy
    path: lists of flat C-contiguous arrays of one float dtype, all at step count ``step``
    (after this step's increment); ``max_exp_avg_sqs`` None without AMSGrad."""
    dtype = params[0].dtype.type
    w1 = 1 - beta1
    coef = [dtype(c) for c in (weight_decay, 1 - lr * weight_decay, w1, 1 - w1, beta2,
                               1 - beta2, (1 - beta2**step) ** 0.5, eps,
                               -(lr / (1 - beta1**step)))]
    flags = (w1 < 0.5, bool(maximize), weight_decay != 0 and not decoupled,
             weight_decay != 0 and bool(decoupled))
    amsgrad = max_exp_avg_sqs is not None
    kernel = _adam_kernel(amsgrad)
    for part in _chunks(len(params), per_launch(5 if amsgrad else 4)):
        tensors = [tuple(a[part]) for a in (params, grads, exp_avgs, exp_avg_sqs)]
        if amsgrad:
            tensors.append(tuple(max_exp_avg_sqs[part]))
        grid, block = _grid(tensors[0])
        launch(kernel, grid, block, *tensors, *coef, *flags)


def sgd_step(params, grads, bufs, *, lr, momentum, dampening, weight_decay, nesterov,
             maximize, first):
    """One SGD step of every tensor, as ``nnkit.optim.SGD``'s CuPy path: lists of flat
    C-contiguous arrays of one float dtype; ``bufs`` the momentum buffers (None without
    momentum), written with the gradient when ``first`` (torch's first step)."""
    dtype = params[0].dtype.type
    scalars = [dtype(c) for c in (lr, weight_decay, momentum, 1.0 - dampening)]
    flags = (bool(maximize), weight_decay != 0, momentum != 0, bool(first), dampening != 0,
             bool(nesterov))
    bufs = params if bufs is None else bufs  # not read without momentum
    for part in _chunks(len(params), per_launch(3)):
        tensors = [tuple(a[part]) for a in (params, grads, bufs)]
        grid, block = _grid(tensors[0])
        launch(_sgd_kernel, grid, block, *tensors, *scalars, *flags)
