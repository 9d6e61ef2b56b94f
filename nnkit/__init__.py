"""nnkit: neural networks from first principles at compiled speed.

``import nnkit as nk``. Layers of the package (nothing imports upward):
``nnkit._ext`` (compiled kernels) <- ``nk.kernels`` (validated forward/backward kernels and
their naive twins in ``nk.kernels.reference``) <- ``nk.Tensor`` and autograd,
``nk.functional``, ``nk.nn``, ``nk.optim`` <- models, estimators and the ``nnkit`` command.

The formulas come from two texts, named here once and cited everywhere else by section:
"notes §5.2" is section 5.2 of ``NOTES``, "appendix eq. E.B.2" an equation of ``APPENDIX``.
"""

__version__ = "0.1.0"


from . import (
    _malloc,
    analysis,
    approx,
    autograd,
    classic,
    datasets,
    distributed,
    functional,
    kernels,
    models,
    nn,
    optim,
    signal,
    text,
    theory,
    training,
)
from ._random import get_rng, manual_seed, set_rng
from .autograd import (
    Tensor,
    complex,
    concat,
    enable_grad,
    imag,
    is_grad_enabled,
    maximum,
    no_grad,
    real,
    stack,
    tensor,
    where,
)
from .gradcheck import GradcheckError, gradcheck
from .persistence import load, save

tune_malloc = _malloc.tune  # opt-in, process-wide: glibc keeps freed memory for reuse
_malloc.tune_from_environment()  # only under NNKIT_MALLOC_TUNING=1 (see nnkit/_malloc.py)

NOTES = ("C. Perez Jensen, Deep Learning: notes on the lecture course at ETH Zurich "
         "(31 December 2024)")
APPENDIX = ("S. Scardapane, Alice's Adventures in a Differentiable Wonderland (2024), "
            "appendix B: 1D universal approximation")

__all__ = [
    "__version__", "NOTES", "APPENDIX", *autograd.USER_API, "gradcheck", "GradcheckError",
    "manual_seed", "get_rng", "set_rng", "tune_malloc", "save", "load",
    "datasets", "distributed", "analysis", "approx", "classic", "theory", "signal", "text",
    "functional", "training", "kernels", "models", "nn", "optim",
]
