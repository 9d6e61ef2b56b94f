"""Write the intersphinx inventories of docs/_inventories/ without a network.

The site links to NumPy, SciPy, scikit-learn, PyTorch and Dask. Their full inventories would
be fetched from the web; instead this script lists the objects nnkit's docstrings and
signatures reference (found by scanning them), each with its page in that project's
published documentation (the table below), and writes one small ``objects.inv`` per project
with sphobjinv. Run it again after docstrings start referencing new objects:

    python docs/make_inventories.py          # writes docs/_inventories/*.inv
    python docs/make_inventories.py --check  # fails if the files are out of date
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import sphobjinv as soi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from nnkit_docs import API_MODULES  # noqa: E402

# project -> (title, version, {object name: (role, page relative to the base URL)}).
# "$" at the end of a page stands for the object's name, as in Sphinx's own inventories.
_G = "reference/generated/"
TABLE: dict[str, tuple[str, str, dict[str, tuple[str, str]]]] = {
    "numpy": ("NumPy", "2", {
        "numpy.ndarray": ("class", _G + "numpy.ndarray.html#$"),
        "numpy.dtype": ("class", _G + "numpy.dtype.html#$"),
        "numpy.random.Generator": ("class", "reference/random/generator.html#$"),
        "numpy.random.default_rng": ("function", "reference/random/generator.html#$"),
        "numpy.random": ("module", "reference/random/index.html#module-$"),
        "numpy.float32": ("attribute", "reference/arrays.scalars.html#$"),
        "numpy.float64": ("attribute", "reference/arrays.scalars.html#$"),
        "numpy.uint8": ("attribute", "reference/arrays.scalars.html#$"),
        **{f"numpy.{f}": ("function", _G + f"numpy.{f}.html#$") for f in (
            "array", "zeros", "ones", "full", "arange", "eye", "round", "convolve",
            "correlate", "log", "exp", "sin", "abs", "all", "allclose", "array_split",
            "transpose", "concatenate", "stack", "sort_complex", "result_type", "ones_like")},
        "numpy.linalg.eig": ("function", _G + "numpy.linalg.eig.html#$"),
        "numpy.linalg.lstsq": ("function", _G + "numpy.linalg.lstsq.html#$"),
    }),
    "scipy": ("SciPy", "1", {
        "scipy.fft": ("module", "reference/fft.html#module-$"),
        "scipy.special": ("module", "reference/special.html#module-$"),
        "scipy.signal.convolve": ("function", "reference/generated/$.html#$"),
        "scipy.signal.correlate": ("function", "reference/generated/$.html#$"),
    }),
    "sklearn": ("scikit-learn", "1", {
        "sklearn.linear_model.SGDClassifier": ("class", "modules/generated/$.html#$"),
        "sklearn.linear_model.Perceptron": ("class", "modules/generated/$.html#$"),
        "sklearn.linear_model.LinearRegression": ("class", "modules/generated/$.html#$"),
        "sklearn.linear_model.LogisticRegression": ("class", "modules/generated/$.html#$"),
        "sklearn.datasets.load_digits": ("function", "modules/generated/$.html#$"),
    }),
    "torch": ("PyTorch", "2", {
        "torch.optim": ("module", "optim.html#module-$"),
        **{name: ("function", "generated/$.html#$") for name in (
            "torch.complex", "torch.real", "torch.imag", "torch.nn.functional.conv1d",
            "torch.nn.functional.conv2d", "torch.nn.functional.max_pool2d",
            "torch.nn.functional.avg_pool2d",
            "torch.nn.functional.scaled_dot_product_attention")},
        **{name: ("class", "generated/$.html#$") for name in (
            "torch.nn.RMSNorm", "torch.optim.Adam", "torch.optim.AdamW", "torch.nn.Module",
            "torch.nn.parallel.DistributedDataParallel")},
    }),
    "dask": ("Dask", "2024", {
        "dask.delayed": ("function", "delayed-api.html#dask.delayed.delayed"),
        "dask.distributed": ("module", "deploying.html#module-$"),
    }),
    "distributed": ("Dask.distributed", "2024", {
        "distributed.Client": ("class", "api.html#$"),
        "distributed.LocalCluster": ("class", "api.html#$"),
        "distributed.Future": ("class", "api.html#$"),
    }),
}

_REF = re.compile(r"\b(numpy|np|scipy|sklearn|torch|dask|distributed)\.[A-Za-z_][\w.]*\w")
_ALIASES = {"np": "numpy"}
# Referenced without a dotted name in the docstrings' types (docs/conf.py's type aliases),
# or in the prose ("scikit-learn's SGDClassifier").
ALWAYS = {"numpy.ndarray", "numpy.dtype", "numpy.random.Generator", "distributed.Client",
          "sklearn.linear_model.SGDClassifier", "sklearn.datasets.load_digits",
          "torch.nn.Module"}


def _texts(obj: object, seen: set[int]) -> list[str]:
    """The docstrings and annotations of ``obj`` and, for a class, of its public members."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    out = [inspect.getdoc(obj) or ""]
    if callable(obj):
        try:
            out.append(str(inspect.signature(obj)))
        except (TypeError, ValueError):
            pass
    if inspect.isclass(obj):
        for key, value in vars(obj).items():
            if not key.startswith("_") or key in ("__init__", "__call__"):
                out += _texts(getattr(value, "__func__", value), seen)
    return out


def referenced() -> set[str]:
    """The dotted names of other projects that nnkit's public docstrings and signatures use."""
    names: set[str] = set()
    seen: set[int] = set()
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for text in _texts(module, seen):
            names.update(m.group(0) for m in _REF.finditer(text))
        for public in module.__all__:
            value = getattr(module, public)
            if isinstance(value, types.ModuleType):
                continue
            for text in _texts(value, seen):
                names.update(m.group(0) for m in _REF.finditer(text))
    own = set(importlib.import_module("nnkit.distributed").__all__)
    out = set()
    for name in names:
        head, _, rest = name.partition(".")
        if head == "distributed" and rest in own:  # nnkit's own nk.distributed
            continue
        out.add(f"{_ALIASES.get(head, head)}.{rest}")
    return out


def inventory(project: str, names: set[str]) -> bytes:
    """The compressed objects.inv of ``project`` holding ``names`` (those in the table)."""
    title, version, table = TABLE[project]
    inv = soi.Inventory()
    inv.project, inv.version = title, version
    for name in sorted(names & set(table)):
        role, uri = table[name]
        inv.objects.append(soi.DataObjStr(name=name, domain="py", role=role, priority="1",
                                          uri=uri, dispname="-"))
    return soi.compress(inv.data_file(contract=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    names = referenced() | ALWAYS
    known = set().union(*(table for _, _, table in TABLE.values()))
    unknown = sorted(n for n in names if n not in known)
    if unknown:
        print("referenced, not in the table (no link):", ", ".join(unknown))
    folder = HERE / "_inventories"
    folder.mkdir(exist_ok=True)
    stale = []
    for project in TABLE:
        data = inventory(project, names)
        path = folder / f"{project}.inv"
        if args.check:
            if not path.exists() or soi.decompress(path.read_bytes()) != soi.decompress(data):
                stale.append(path.name)
        else:
            path.write_bytes(data)
    if stale:
        print("out of date:", ", ".join(stale), "(run python docs/make_inventories.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
