"""Sphinx configuration of nnkit's site.

Build it with ``python -m sphinx -W -b html docs docs/_build/html`` (the ``docs`` extra). No
network: the intersphinx inventories are the small files in ``_inventories/``, written by
``make_inventories.py``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

import nnkit  # noqa: E402

project = "nnkit"
author = "the nnkit developers"
copyright = "the nnkit developers"
version = release = nnkit.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
    "nnkit_docs",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "_templates", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# API pages: docs/_ext/nnkit_docs.py writes api/<module>.rst from each module's __all__,
# autosummary writes one page a public name into api/generated/.
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_inherit_docstrings = False
add_module_names = False

# The docstrings are numpydoc; napoleon reads them.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True
napoleon_preprocess_types = True
napoleon_type_aliases = {
    "ndarray": "numpy.ndarray",
    "np.ndarray": "numpy.ndarray",
    "array": "numpy.ndarray",
    "Generator": "numpy.random.Generator",
    "np.random.Generator": "numpy.random.Generator",
    "dtype": "numpy.dtype",
    "np.dtype": "numpy.dtype",
    "Client": "distributed.Client",
}

# Inventories from the repository (make_inventories.py), with each project's real base URL:
# links point at the published documentation, nothing is fetched while building.
_INV = str(HERE / "_inventories")
intersphinx_mapping = {
    "numpy": ("https://numpy.org/doc/stable/", f"{_INV}/numpy.inv"),
    "scipy": ("https://docs.scipy.org/doc/scipy/", f"{_INV}/scipy.inv"),
    "sklearn": ("https://scikit-learn.org/stable/", f"{_INV}/sklearn.inv"),
    "torch": ("https://docs.pytorch.org/docs/stable/", f"{_INV}/torch.inv"),
    "dask": ("https://docs.dask.org/en/stable/", f"{_INV}/dask.inv"),
    "distributed": ("https://distributed.dask.org/en/stable/", f"{_INV}/distributed.inv"),
}

# The gallery: every script of examples/ runs at build time in its quick setting (--small, its
# figure saved where the page shows it: docs/_ext/nnkit_gallery.py), except the two that read
# a downloaded Hugging Face checkpoint, shown with their code only.
_NEEDS_A_DOWNLOAD = ("bert_fill_mask.py", "vit_classify.py")
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": re.escape(os.sep) + "(?!" + "|".join(map(re.escape, _NEEDS_A_DOWNLOAD))
                        + r")[^" + re.escape(os.sep) + r"]+\.py$",
    "reset_argv": "nnkit_gallery.reset_argv",
    "image_scrapers": ("nnkit_gallery.saved_figure_scraper",),
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "write_computation_times": False,  # its pages load scripts from CDNs (no network here)
}

html_theme = "pydata_sphinx_theme"
html_title = f"nnkit {release}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
# without a default, the theme logs "Got invalid theme mode" to the console on every page
html_context = {"default_mode": "auto"}
html_static_path: list[str] = []
