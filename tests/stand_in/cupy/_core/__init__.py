"""CuPy's ``_core`` as far as tests reach into it: ``syncdetect``."""

from . import syncdetect  # noqa: F401
