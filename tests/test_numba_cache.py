"""Where Numba caches nnkit's kernels: beside the source in a checkout, in the user's cache
folder for an installed copy (so pip uninstall leaves no ``site-packages/nnkit`` behind),
and package discovery that takes nnkit's packages only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A child process: nnkit's locator pointed at a stand-in package folder, then a cached
# njit function of a module in that folder compiled; prints where its cache files went.
CHILD = textwrap.dedent("""
    import importlib.util, os, sys
    from pathlib import Path
    import numba
    from nnkit._ext import _numba_cache
    package = Path(sys.argv[1])
    _numba_cache._PACKAGE = package
    _numba_cache.install_locator()
    spec = importlib.util.spec_from_file_location("kernel", package / "_ext" / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.twice(21) == 42
    for root in (package, Path(os.environ["XDG_CACHE_HOME"])):
        print(sorted(p.suffix for p in root.rglob("*.nb*")))
""")


def _stand_in(tmp_path, checkout: bool) -> Path:
    package = tmp_path / "tree" / "nnkit"
    (package / "_ext").mkdir(parents=True)
    (package / "_ext" / "kernel.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    if checkout:
        (package.parent / "pyproject.toml").write_text("")
    return package


@pytest.mark.skipif(sys.platform == "win32", reason="XDG_CACHE_HOME: POSIX cache folders")
@pytest.mark.parametrize("checkout", [False, True])
def test_an_installed_copy_caches_outside_its_package(tmp_path, checkout):
    package = _stand_in(tmp_path, checkout)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(package)], env=env, text=True,
                         capture_output=True, check=True, timeout=300).stdout.splitlines()
    inside, user_cache = out[-2:]
    cached = "['.nbc', '.nbi']"
    assert (inside, user_cache) == ((cached, "[]") if checkout else ("[]", cached))


def test_package_discovery_takes_nnkit_packages_only():
    """``nnkit*`` also matched folders such as the tour's output ``nnkit-tour``."""
    text = (ROOT / "pyproject.toml").read_text()
    find = text[text.index("[tool.setuptools.packages.find]"):].split("\n[")[0]
    lines = [line for line in find.splitlines()[1:] if line and not line.startswith("#")]
    assert lines == ['include = ["nnkit", "nnkit.*"]', "namespaces = false"]


def _cached_compilations(path: Path) -> list[int]:
    """Lines of ``path`` that call something with ``cache=True`` (a cached Numba compile)."""
    import ast

    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and any(
                k.arg == "cache" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords)]


def test_cached_kernels_live_in_ext_only():
    """Importing ``nnkit._ext`` installs the locator above; a cached kernel outside it would
    write its cache into an installed copy (the tour once did, and the folder it left behind
    shadowed the next editable install as an empty namespace package)."""
    package = ROOT / "nnkit"
    outside = {str(p.relative_to(ROOT)): lines for p in sorted(package.rglob("*.py"))
               if "_ext" not in p.relative_to(package).parts
               and (lines := _cached_compilations(p))}
    assert outside == {}
    assert _cached_compilations(package / "_ext" / "scan_cpu.py")  # the walk finds them


def test_the_walk_finds_a_cached_kernel(tmp_path):
    module = tmp_path / "kernel.py"
    module.write_text("import numba\n\n\n@numba.njit(parallel=True, cache=True)\n"
                      "def f(x):\n    return x\n")
    assert _cached_compilations(module) == [4]
