"""Finite-difference gradient checks (``nk.gradcheck``), float64.

The analytic gradient of ``L = sum(v * f(inputs))`` for a random upstream ``v`` (backward)
is compared with central differences ``(L(x + eps e_j) - L(x - eps e_j)) / (2 eps)`` for
every element ``j`` of every input that requires grad. For a complex input the numerical
gradient is ``dL/dRe + i dL/dIm`` (the convention nnkit's complex backward rules use,
as torch's), with ``L = Re sum(conj(v) * f)``.
"""

from __future__ import annotations

import numpy as np

from .autograd import Tensor, no_grad, real

__all__ = ["gradcheck", "GradcheckError"]


class GradcheckError(AssertionError):
    """The analytic and numerical gradients disagree."""


def _as_double(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _outputs(result):
    return result if isinstance(result, (tuple, list)) else (result,)


def _objective(fn, inputs, upstream):
    with no_grad():
        outs = _outputs(fn(*inputs))
        total = 0.0
        for out, v in zip(outs, upstream, strict=True):
            if out is None:
                continue
            total += float(np.real(np.sum(np.conj(v) * np.asarray(out.data))))
    return total


def gradcheck(fn, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              seed: int = 0, raise_exception: bool = True) -> bool:
    """Check ``fn``'s backward against central finite differences.

    Parameters
    ----------
    fn : callable
        ``fn(*inputs)`` -> Tensor or tuple of Tensors.
    inputs : sequence of Tensor or array
        Arrays are wrapped as float64 tensors requiring grad; Tensors are used as given
        (those with ``requires_grad`` are checked) and must be float64 or complex128.
    eps, atol, rtol : float
        Step and tolerances: passes when ``|analytic - numeric| <= atol + rtol |numeric|``.
    seed : int
        Seed of the random upstream gradient.
    raise_exception : bool
        Raise ``GradcheckError`` on a mismatch (default) instead of returning False.

    Returns
    -------
    bool
        True when every checked gradient matches.
    """
    tensors = [x if isinstance(x, Tensor) else Tensor(_as_double(x), requires_grad=True)
               for x in inputs]
    checked = [i for i, t in enumerate(tensors) if t.requires_grad]
    if not checked:
        raise ValueError("gradcheck needs at least one input with requires_grad=True")
    for i in checked:
        if tensors[i].dtype not in (np.float64, np.complex128):
            raise TypeError(
                f"gradcheck needs float64 (or complex128) inputs for accurate finite "
                f"differences; input {i} has dtype {tensors[i].dtype}"
            )
    rng = np.random.default_rng(seed)
    for t in tensors:
        t.grad = None
    outs = _outputs(fn(*tensors))
    upstream = []
    for out in outs:
        if out is None:
            upstream.append(None)
            continue
        v = rng.standard_normal(out.shape)
        if np.iscomplexobj(out.data):
            v = v + 1j * rng.standard_normal(out.shape)
        upstream.append(v.astype(out.dtype))
    loss = None
    for out, v in zip(outs, upstream, strict=True):
        if out is not None and out.requires_grad:
            term = (out * Tensor(np.conj(v))).sum()
            if np.iscomplexobj(term.data):
                term = real(term)
            loss = term if loss is None else loss + term
    if loss is None:
        raise ValueError("gradcheck: no output of fn requires grad")
    loss.backward()

    for i in checked:
        x = tensors[i].data
        analytic = tensors[i].grad if tensors[i].grad is not None else np.zeros_like(x)
        numeric = np.zeros_like(x)
        steps = (1.0, 1j) if np.iscomplexobj(x) else (1.0,)
        for j in np.ndindex(x.shape):  # index x itself: reshape(-1) may copy a strided x
            original = x[j]
            for step in steps:
                x[j] = original + eps * step
                plus = _objective(fn, tensors, upstream)
                x[j] = original - eps * step
                minus = _objective(fn, tensors, upstream)
                x[j] = original
                numeric[j] += step * (plus - minus) / (2 * eps)
        err = np.abs(analytic - numeric)
        bad = err > atol + rtol * np.abs(numeric)
        if bad.any():
            j = int(np.argmax(np.where(bad, err, -1).reshape(-1)))
            message = (
                f"gradient of input {i} (shape {x.shape}) disagrees with finite differences at "
                f"{np.unravel_index(j, x.shape)}: analytic {analytic.reshape(-1)[j]!r}, numeric "
                f"{numeric.reshape(-1)[j]!r}; max abs error {err.max():.3g} "
                f"({int(bad.sum())} of {x.size} elements outside atol={atol}, rtol={rtol})"
            )
            if raise_exception:
                raise GradcheckError(message)
            return False
    return True
