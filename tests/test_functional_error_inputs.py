"""The bad inputs of every public function of ``nk.functional``, from one table.

``OP_FACTS[name].error_inputs`` (tests/op_facts.py) lists, for each name of ``F.__all__``,
the calls that must be refused, in the spirit of PyTorch's OpInfo ``error_inputs``
(``torch.testing._internal.opinfo.core``'s ``ErrorInput``: a sample input, the error type, a
regex its message must match). A function added to ``F.__all__`` without at least three
hostile cases fails ``test_every_functional_has_error_inputs``.

Each case is one valid call (``OP_FACTS[name].valid``) with one or two arguments spoiled:
the wrong type of the main input (str, None, object, a list of str), wrong dtypes (int,
bool, complex where it has no meaning, float16 where the kernels take float32/float64 only,
object arrays), wrong ranks, shapes that do not match, out-of-range axes, invalid
hyper-parameters, and arguments
whose dtypes do not match. The error must be exactly the ``ValueError`` or ``TypeError``
given (an ``IndexError``, ``numpy.exceptions.AxisError`` or a Numba typing error is a bug),
and its message must name the argument (the project's rule: "a ValueError/TypeError naming
the argument, the expected and the received shape or dtype"); dtype cases also check that
the received dtype is named.

Not in the table, because nk.functional has no such thing today: an ``out=`` argument (no
public function of F takes one), a ``dim=`` alias of ``axis`` (F.softmax and F.log_softmax
take ``axis`` only; ``dim=`` is Python's "unexpected keyword argument"), GPU/CPU mixes (the
``cuda``-marked tests cover them) and ``is_causal=True`` with an ``attn_mask`` (accepted on
purpose, see the docstring of ``scaled_dot_product_attention``).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from op_facts import OP_FACTS

import nnkit as nk
import nnkit.functional as F

_CASES = [pytest.param(name, case, id=f"{name}-{case.desc}")
          for name, facts in OP_FACTS.items() for case in facts.error_inputs]


# ----- tests ---------------------------------------------------------------------------------
def test_every_functional_has_error_inputs():
    assert set(OP_FACTS) == set(F.__all__), "add the new function's facts to tests/op_facts.py"
    for name, facts in OP_FACTS.items():
        cases = facts.error_inputs
        assert len(cases) >= 3, f"{name} has only {len(cases)} error inputs"
        descs = [c.desc for c in cases]
        assert len(set(descs)) == len(descs), f"{name} has two cases of one description"


def test_reference_twins_are_forward_backward_pairs_of_one_op():
    """A twin pair is ``<op>_forward`` / ``<op>_backward`` of nnkit.kernels.reference."""
    for name, facts in OP_FACTS.items():
        if facts.forward_twin is None:
            assert facts.backward_twin is None, name
            continue
        stem = facts.forward_twin.__name__.removesuffix("_forward")
        assert facts.forward_twin.__name__ == f"{stem}_forward", name
        assert facts.backward_twin.__name__ == f"{stem}_backward", name
        assert facts.forward_twin.__module__.startswith("nnkit.kernels.reference."), name


@pytest.mark.parametrize("name", sorted(OP_FACTS))
def test_valid_base_call_works(name):
    """Each case spoils a call that works: its error is the spoiled argument's."""
    out = OP_FACTS[name].op(**OP_FACTS[name].valid())
    out = out[0] if isinstance(out, tuple) else out
    assert isinstance(out, nk.Tensor)


@pytest.mark.parametrize(("name", "case"), _CASES)
def test_error_input_keywords_are_parameters(name, case):
    """A renamed parameter must not leave a case testing a keyword the function lacks."""
    params = inspect.signature(OP_FACTS[name].op).parameters
    unknown = set(case.kwargs()) - set(params)
    assert not unknown, f"{name} has no parameter {sorted(unknown)}"


@pytest.mark.parametrize(("name", "case"), _CASES)
def test_error_input_is_refused(name, case):
    fn = OP_FACTS[name].op
    kwargs = case.kwargs()
    with pytest.raises(case.error_type, match=case.error_regex) as info:
        fn(**kwargs)
    # exactly the type: not a subclass such as numpy's AxisError (a ValueError and an
    # IndexError) or a library-specific error
    assert type(info.value) is case.error_type, (
        f"{name}({case.desc}): expected {case.error_type.__name__}, got "
        f"{type(info.value).__module__}.{type(info.value).__name__}: {info.value}")


def _as_dtype(kwargs: dict, dtype) -> dict:
    """The call with every floating-point array (and a ``dtype`` argument) cast to ``dtype``."""
    out = {}
    for k, v in kwargs.items():
        if k == "dtype" or (isinstance(v, np.ndarray) and v.dtype.kind == "f"):
            v = dtype if k == "dtype" else v.astype(dtype)
        out[k] = v
    return out


@pytest.mark.parametrize(("name", "dtype"), [
    pytest.param(name, dtype, id=f"{name}-{np.dtype(dtype).name}")
    for name, facts in OP_FACTS.items() for dtype in facts.dtypes["cpu"]])
def test_valid_call_works_in_every_cpu_dtype(name, dtype):
    """The dtypes OP_FACTS says the op takes on the CPU are taken, and kept."""
    out = OP_FACTS[name].op(**_as_dtype(OP_FACTS[name].valid(), dtype))
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == dtype
