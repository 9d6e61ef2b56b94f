"""Every ``>>>`` example in nnkit's docstrings runs and shows what the docstring says.

One test per module of the package (private and CUDA modules included: each must import
without a GPU): the standard library's doctest finder and runner over the module's
docstrings, with pytest's default flag (``ELLIPSIS``), so ``python -m pytest
--doctest-modules nnkit`` agrees. ``# doctest: +SKIP`` marks an example that needs what CI
lacks (a Dask cluster). A failure prints doctest's own report: where, what was run, the
expected and the actual output. nnkit's global generator is restored after each module, so
the examples' draws and seeds leave the other tests' random streams as they were.
"""

import doctest
import importlib
from pathlib import Path

import pytest

import nnkit
from nnkit._random import get_rng, set_rng

PACKAGE = Path(nnkit.__file__).parent
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
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
