"""Sphinx helpers for nnkit's site: the API pages from each module's ``__all__`` and the
Performance table from ``benchmarks/performance.json``."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

#: The modules with a page of their own, in the order of the API reference.
API_MODULES = (
    "nnkit",
    "nnkit.functional",
    "nnkit.nn",
    "nnkit.nn.init",
    "nnkit.optim",
    "nnkit.models",
    "nnkit.text",
    "nnkit.classic",
    "nnkit.approx",
    "nnkit.theory",
    "nnkit.signal",
    "nnkit.distributed",
    "nnkit.kernels",
    "nnkit.kernels.reference",
    "nnkit.datasets",
    "nnkit.training",
    "nnkit.analysis",
)


def _module_page(name: str) -> str:
    """The reST of one module's page: its docstring and an autosummary of its ``__all__``."""
    module = importlib.import_module(name)
    submodules, objects = [], []
    for public in module.__all__:
        value = getattr(module, public)
        if isinstance(value, types.ModuleType):
            submodules.append(value.__name__)
        else:
            objects.append(public)
    lines = [f"``{name}``", "=" * (len(name) + 4), "", f".. automodule:: {name}", "   :no-members:",
             "", f".. currentmodule:: {name}", ""]
    if objects:
        lines += [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
        lines += [f"   {public}" for public in objects] + [""]
    if submodules:
        lines += ["Submodules", "----------", ""]
        for sub in submodules:
            target = f":doc:`{sub}`" if sub in API_MODULES else f"``{sub}``"
            lines.append(f"- {target}")
        lines.append("")
    return "\n".join(lines)


def write_api_pages(app: Sphinx, config: object = None) -> None:
    """Write ``api/<module>.rst`` for every module of :data:`API_MODULES` (only when changed)."""
    folder = Path(app.srcdir) / "api"
    folder.mkdir(exist_ok=True)
    for name in API_MODULES:
        path = folder / f"{name}.rst"
        text = _module_page(name)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


class PerformanceTable(SphinxDirective):
    """``.. performance-table:: PATH``: the workloads of a performance.json as one table."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        _, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        self.env.note_dependency(path)
        data = json.loads(Path(path).read_text())
        rows = ["   * - workload", "     - nnkit", "     - peer", "     - peer / nnkit",
                "     - date and machine", "     - command"]
        for w in data["workloads"]:
            unit = w["unit"]
            peer = f"{w['peer']:g} {unit} ({w['peer_name']})"
            if w.get("note"):
                peer += f" [{w['note']}]"
            rows += [f"   * - {_cell(w['group'])}: {_cell(w['workload'])}",
                     f"     - {w['nnkit']:g} {unit}",
                     f"     - {_cell(peer)}",
                     f"     - {w['ratio']:.2f}",
                     f"     - {w['date']}, {_cell(w['machine'])}",
                     f"     - ``{w['command']}``"]
        text = [".. list-table::", "   :header-rows: 1", "   :widths: 30 12 24 8 14 22", ""]
        container = nodes.container()
        self.state.nested_parse(StringList(text + rows, source=path), self.content_offset,
                                container)
        return container.children


_PIPES = re.compile(r"(``.*?``)|\|")


def escape_bars(app: Sphinx, what: str, name: str, obj: object, options: object,
                lines: list[str]) -> None:
    """Read a bar as text: the docstrings write ``|x|`` for an absolute value, not reST's
    substitution references (the rows of reST tables stay)."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        table = stripped.startswith("+") or (stripped.startswith("|") and stripped.endswith("|"))
        if "|" in line and not table:
            lines[i] = _PIPES.sub(lambda m: m.group(1) or "\\|", line)


def skip_member(app: Sphinx, what: str, name: str, obj: object, skip: bool,
                options: object) -> bool | None:
    """Leave out the ``set_*_request`` methods scikit-learn adds to estimators."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def class_signature(app: Sphinx, what: str, name: str, obj: object, options: object,
                    signature: str | None, return_annotation: str | None):
    """A class's constructor signature as ``inspect.signature`` gives it: autodoc reads
    ``nn.Module.__new__(cls, *args, **kwargs)`` first and would show every layer as
    ``(*args, **kwargs)``."""
    if what != "class" or signature is None or "*args, **kwargs" not in signature:
        return None
    try:
        return str(inspect.signature(obj)), return_annotation
    except (TypeError, ValueError):
        return None


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("autodoc-process-docstring", escape_bars)
    app.connect("autodoc-skip-member", skip_member)
    app.connect("autodoc-process-signature", class_signature)
    app.connect("config-inited", write_api_pages)  # before Sphinx looks for the pages
    app.add_directive("performance-table", PerformanceTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
