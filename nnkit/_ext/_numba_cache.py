"""Where Numba caches nnkit's compiled kernels (``cache=True``).

In a source checkout (an editable install, a clone on ``sys.path``) the cache stays
Numba's default, ``__pycache__`` beside each module. In an installed copy it goes to the
user's cache folder (Numba's user-wide locator) instead of ``site-packages/nnkit``: pip
uninstalls only the files it installed, so cache files left there would keep a folder
``site-packages/nnkit`` without ``__init__.py`` alive, and a later editable install of
nnkit would then be shadowed by that empty namespace package. ``NUMBA_CACHE_DIR``, when
set, still wins.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # .../nnkit


def is_source_checkout() -> bool:
    """Whether the nnkit folder sits in a source tree (beside pyproject.toml)."""
    return (_PACKAGE.parent / "pyproject.toml").is_file()


def install_locator() -> None:
    """Put the installed-copy locator first among Numba's (after NUMBA_CACHE_DIR's); a no-op
    in a source checkout, or where this Numba lays out its caching module otherwise."""
    if is_source_checkout():
        return
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    user_wide = getattr(caching, "UserWideCacheLocator", None) or \
        getattr(caching, "_UserWideCacheLocator", None)
    classes = getattr(impl, "_locator_classes", None)
    if user_wide is None or not isinstance(classes, list):
        return
    if any(getattr(c, "_nnkit", False) for c in classes):
        return

    class InstalledNnkitLocator(user_wide):
        """nnkit's own modules, cached in the user's cache folder."""

        _nnkit = True

        @classmethod
        def from_function(cls, py_func, py_file):
            inside = os.path.commonpath([_PACKAGE, Path(py_file).resolve()]) == str(_PACKAGE)
            return super().from_function(py_func, py_file) if inside else None

    provided = [i for i, c in enumerate(classes) if "UserProvided" in c.__name__]
    classes.insert(provided[0] + 1 if provided else 0, InstalledNnkitLocator)
