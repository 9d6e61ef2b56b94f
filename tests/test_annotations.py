"""Every public function of ``nnkit.functional`` and ``nnkit.kernels`` (the names in their
``__all__``) annotates each parameter and its return, and the annotations resolve."""

from __future__ import annotations

import inspect
import typing

import pytest

import nnkit.functional as F
import nnkit.kernels as K
import nnkit.kernels.reference as R


def _public_functions():
    for module in (K, F, R):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield pytest.param(module.__name__, name, obj, id=f"{module.__name__}.{name}")


@pytest.mark.parametrize(("module", "name", "fn"), list(_public_functions()))
def test_public_function_is_annotated(module, name, fn):
    sig = inspect.signature(fn)
    missing = [p for p, v in sig.parameters.items() if v.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    assert not missing, f"{module}.{name} lacks annotations for {missing}"
    typing.get_type_hints(fn)  # every annotation names something that exists
