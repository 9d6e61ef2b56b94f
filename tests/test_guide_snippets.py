"""The user guide's code runs and prints what the guide says it prints.

Every ``.. code-block:: python`` of ``docs/guide/*.rst`` runs, the blocks of one page in
order in one fresh namespace (one namespace per page). A python block followed directly by
a ``.. code-block:: text`` block prints that text: the words must match exactly and the
numbers to a relative 2% (or 1e-6 absolute; integers exactly), so that the last digits of a BLAS
reduction do not fail the test while a wrong count or value does. Every test named in the guide as
``tests/<file>.py::<test>`` must exist.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide"
PAGES = sorted(GUIDE.glob("*.rst"))

_DIRECTIVE = re.compile(r"^\.\. code-block:: *(\w+)\s*$")
_NUMBER = re.compile(r"[-+]?(?:inf|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_TEST_REF = re.compile(r"tests/(test_\w+)\.py::(test_\w+)")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every ``.. code-block::`` of ``text``, in order, dedented."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if not match:
            i += 1
            continue
        i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        blocks.append((match.group(1), "\n".join(line[3:] for line in body)))
    return blocks


def runs(blocks: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """(python code, the text block right after it or None) for every python block."""
    out = []
    for j, (language, code) in enumerate(blocks):
        if language == "python":
            nxt = blocks[j + 1] if j + 1 < len(blocks) else None
            out.append((code, nxt[1] if nxt is not None and nxt[0] == "text" else None))
    return out


def same_output(got: str, expected: str) -> bool:
    """Equal words, integers equal, other numbers equal to rtol 2% / atol 1e-6."""
    got_words = _NUMBER.split(" ".join(got.split()))
    exp_words = _NUMBER.split(" ".join(expected.split()))
    got_nums, exp_nums = _NUMBER.findall(got), _NUMBER.findall(expected)
    if got_words != exp_words or len(got_nums) != len(exp_nums):
        return False
    for a, b in zip(got_nums, exp_nums, strict=True):
        if a.lstrip("+-").isdigit() or b.lstrip("+-").isdigit():
            if int(float(a)) != int(float(b)) or float(a) != float(b):
                return False
            continue
        x, y = float(a), float(b)
        if math.isnan(x) and math.isnan(y):
            continue
        if not math.isclose(x, y, rel_tol=0.02, abs_tol=1e-6):
            return False
    return True


def test_the_guide_has_pages_with_code():
    assert len(PAGES) >= 12, PAGES
    for page in PAGES:
        if page.name != "index.rst":
            assert runs(code_blocks(page.read_text())), f"{page.name} has no python block"


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_snippets_run_and_print_what_the_page_shows(page):
    namespace: dict = {"__name__": f"guide_{page.stem}"}
    for k, (code, expected) in enumerate(runs(code_blocks(page.read_text()))):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, f"{page.name}[block {k}]", "exec"), namespace)  # noqa: S102
        if expected is not None:
            assert same_output(buffer.getvalue(), expected), (
                f"{page.name} block {k} printed\n{buffer.getvalue()}\nthe page shows\n{expected}")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_tests_a_page_names_exist(page):
    tests = Path(__file__).resolve().parent
    for module, name in _TEST_REF.findall(page.read_text()):
        source = (tests / f"{module}.py").read_text()
        assert re.search(rf"^\s*def {name}\(", source, re.M), f"{page.name}: {module}::{name}"


def test_same_output_tolerates_rounding_only():
    assert same_output("0.1235 True [1 2]", "0.1234  True\n[1 2]")
    assert not same_output("114 <= 2453", "115 <= 2453")
    assert not same_output("True", "False")
    assert not same_output("1.0 2.0", "1.0")
    assert same_output("[-inf 0.]", "[-inf 0.]")
    assert not same_output("0.50", "0.60")
