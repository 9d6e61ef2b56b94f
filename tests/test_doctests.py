"""Every ``>>>`` example in nnkit's docstrings runs and shows what the docstring says.

One test per module of the package (private and CUDA modules included: each must import
without a GPU): the standard library's doctest finder and runner over the module's
docstrings, with pytest's default flag (``ELLIPSIS``), and scipy-doctest's output checker
(as NumPy and SciPy check theirs): numbers, in text or array reprs, compare with a
tolerance (rtol 1e-6, atol 1e-8) instead of digit by digit, so an example holds on another
CPU's rounding; ``# may vary`` marks output that is not checked and ``# doctest: +SKIP`` an
example that needs what CI lacks (a Dask cluster). A failure prints doctest's own report:
where, what was run, the expected and the actual output. nnkit's global generator is
restored after each module, so the examples' draws and seeds leave the other tests' random
streams as they were.
"""

import doctest
import importlib
from pathlib import Path

import pytest
from scipy_doctest.impl import DTChecker, DTConfig

import nnkit
from nnkit._random import get_rng, set_rng

CHECKER = DTChecker(config=DTConfig(rtol=1e-6, atol=1e-8))
PACKAGE = Path(nnkit.__file__).parent
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(checker=CHECKER, optionflags=doctest.ELLIPSIS)
    report = []
    rng = get_rng()
    state = rng.bit_generator.state
    try:
        for test in doctest.DocTestFinder().find(module):
            if test.examples:
                runner.run(test, out=report.append)
    finally:
        rng.bit_generator.state = state
        set_rng(rng)
    if runner.failures:
        pytest.fail(f"{runner.failures} of {runner.tries} examples failed in {name}:\n"
                    + "".join(report), pytrace=False)


def test_every_module_is_found():
    """The walk sees the package's subpackages (a module missed is a doctest never run)."""
    assert {"nnkit", "nnkit.kernels.recurrent", "nnkit.approx.constructions",
            "nnkit.nn.module", "nnkit._ext.scan_cuda"} <= set(MODULES)


def test_the_checker_compares_numbers_with_a_tolerance():
    """1.0000001 passes for 1.0, 1.0001 does not; words still compare exactly."""
    flags = doctest.ELLIPSIS
    assert CHECKER.check_output("1.0\n", "1.0000001\n", flags)
    assert CHECKER.check_output("array([1., 2.])\n", "array([1.0000001, 2.])\n", flags)
    assert not CHECKER.check_output("1.0\n", "1.0001\n", flags)
    assert not CHECKER.check_output("'a'\n", "'b'\n", flags)
