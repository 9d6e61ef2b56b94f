"""sphinx-gallery hooks for nnkit's gallery: each example runs in its quick setting and the
plot it saves is shown on its page.

Every example in ``examples/`` takes ``--small`` (a setting that runs in seconds) and
``--out PATH`` (where it saves its figure with ``savefig``, closing it afterwards).
:func:`reset_argv` hands it both, ``PATH`` being the name sphinx-gallery gives the example's
first image; :func:`saved_figure_scraper` then shows that file. The examples run exactly as
a user runs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sphinx_gallery.scrapers import figure_rst

#: Further files an example writes, named here so that they go to the gallery's folder (the
#: examples run in ``examples/``, where a default relative name would land).
_MORE_ARGS = {"train_mpi.py": lambda out: ["--checkpoint", str(out.with_suffix(".nnk"))]}


def _first_image(script_vars: dict[str, Any]) -> Path:
    """The path sphinx-gallery gives an example's first image (``sphx_glr_<name>_001.png``)."""
    return Path(script_vars["image_path_iterator"].image_path.format(1))


def reset_argv(gallery_conf: dict[str, Any], script_vars: dict[str, Any]) -> list[str]:
    """The command-line arguments of an example run by the gallery: the quick setting, and
    its figure written where the page looks for it (a stale one is removed first). The paths
    are relative to the folder the example runs in, as a user would type them."""
    out = _first_image(script_vars)
    out.unlink(missing_ok=True)
    src = Path(script_vars["src_file"])
    rel = Path(os.path.relpath(out, src.parent))
    more = _MORE_ARGS[src.name](rel) if src.name in _MORE_ARGS else []
    return ["--small", "--out", str(rel), *more]


def saved_figure_scraper(block: Any, block_vars: dict[str, Any],
                         gallery_conf: dict[str, Any], **kwargs: Any) -> str:
    """The reST of the figure the example saved to ``--out``, or ``""`` when it saved none."""
    paths = block_vars["image_path_iterator"]
    out = _first_image(block_vars)
    if len(paths) or not out.is_file():
        return ""
    path = paths.next()
    assert Path(path) == out, (path, out)
    return figure_rst([path], gallery_conf["src_dir"])
