"""The documentation site builds with no warnings (``-W``), and its main pages exist."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                       reason="needs the docs extra (pip install -e '.[docs]')"),
]


def test_site_builds_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (out / "index.html").is_file()
    assert (out / "api" / "generated" / "nnkit.nn.Linear.html").is_file()
    performance = _text((out / "performance.html").read_text())
    workloads = json.loads((ROOT / "benchmarks" / "performance.json").read_text())["workloads"]
    missing = [w["command"] for w in workloads if " ".join(w["command"].split()) not in
               performance]
    assert workloads and not missing, missing
    for page in ("index.html", "performance.html", "security.html", "parallel.html"):
        text = (out / page).read_text().lower()
        assert "todo" not in text and "coming soon" not in text, page


def _text(page: str) -> str:
    """A page's text: tags dropped, entities decoded, runs of white space as one space
    (Sphinx writes inline code one word per tag)."""
    words = html.unescape(re.sub(r"<[^>]+>", " ", page)).split()
    return " ".join(words)


def test_inventories_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "make_inventories.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
