"""Approximation theory made executable (``nk.approx``).

Constructions (the sigmoid bins of appendix B, the ReLU interpolant of notes §2.5) that return real
``nn.Module`` objects with hand-set weights, the error predictions they are tested against,
activation regions of ReLU networks (exact in 1-D and for one hidden layer in 2-D), and
Barron's O(1/m) rate (notes §2.4, Theorem 2.7) measured on trained networks in several dimensions.
"""

from . import barron, constructions, regions
from .barron import (
    BarronResult,
    BarronTarget,
    barron_experiment,
    barron_target,
    train_width,
)
from .constructions import (
    bin_function,
    bin_means,
    bins_network,
    eval_sigmoid_net,
    fit,
    mean_squared_error,
    predicted_bin_mse,
    predicted_relu_mse,
    random_network,
    relu_interpolant,
    sigmoid_bins,
    step,
)
from .regions import (
    RegionCount,
    activation_patterns,
    count_linear_regions,
    montufar_network,
)

__all__ = [*constructions.__all__, *regions.__all__, *barron.__all__]
