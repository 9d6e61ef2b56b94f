"""Build script for nnkit's compiled Cython kernels (everything else is in pyproject.toml)."""

import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    """build_ext compiling the extensions in parallel, one per core, unless ``-j`` says how
    many (pip passes no options: its builds were serial)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

# One Extension per .pyx in nnkit/_ext, named after the file; numpy's headers for the
# typed memoryviews; the C headers of nnkit/_ext (gemm_packed.h) as dependencies.
HEADERS = sorted(str(path) for path in Path("nnkit/_ext").glob("*.h"))
EXTENSIONS = [
    Extension(
        f"nnkit._ext.{path.stem}",
        [str(path)],
        include_dirs=[numpy.get_include(), "nnkit/_ext"],
        depends=HEADERS,
        extra_compile_args=["-O3"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for path in sorted(Path("nnkit/_ext").glob("*.pyx"))
]

setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=cythonize(
        EXTENSIONS,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
)
