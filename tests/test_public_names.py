"""Each package's ``__all__`` (composed from its submodules' lists) names exactly what the
package imports for its users: every name resolves, none twice, and no public import that the
package does not use itself is left out of ``__all__`` (ruff's unused-import check is off in
``__init__.py`` files; this is it)."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import nnkit

PACKAGE_ROOT = pathlib.Path(nnkit.__file__).parent
INITS = sorted(PACKAGE_ROOT.rglob("__init__.py"))


def _module_name(init: pathlib.Path) -> str:
    return ".".join(("nnkit", *init.parent.relative_to(PACKAGE_ROOT).parts))


def _unused_public_imports(init: pathlib.Path) -> set[str]:
    """The public names that the package's relative imports bind and its own code never reads
    (what ruff's unused-import check would report)."""
    tree = ast.parse(init.read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            imported.update(alias.asname or alias.name for alias in node.names)
    read = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    read |= {node.value.id for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    return {name for name in imported - read if not name.startswith("_")}


@pytest.mark.parametrize("init", INITS, ids=_module_name)
def test_all_resolves_without_repeats(init):
    module = importlib.import_module(_module_name(init))
    exported = list(getattr(module, "__all__", []))
    assert len(exported) == len(set(exported)), f"{module.__name__}.__all__ repeats a name"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module.__name__}.__all__ names {missing}, which do not exist"


@pytest.mark.parametrize("init", INITS, ids=_module_name)
def test_every_public_import_is_exported(init):
    module = importlib.import_module(_module_name(init))
    if not hasattr(module, "__all__"):
        return
    left_out = _unused_public_imports(init) - set(module.__all__)
    assert not left_out, f"{module.__name__} imports {sorted(left_out)}, not in its __all__"
