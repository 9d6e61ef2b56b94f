"""Shared pytest setup: hypothesis profiles, the ``cuda`` marker, torch availability.

Profiles: ``dev`` (default, 50 examples), ``ci`` (selected when the CI variable is set:
fewer examples, derandomized so a CI run is reproducible), ``thorough`` (1000 examples,
for a long fuzzing run: ``HYPOTHESIS_PROFILE=thorough pytest``). Every profile has
``deadline=None``: the first call of a Numba kernel compiles it.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _has_real_gpu() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import cupy  # noqa: F401
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_real_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with CuPy (cuda marker)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A seeded generator, fresh for every test."""
    return np.random.default_rng(12345)
