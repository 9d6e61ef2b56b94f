"""The documentation site: it builds with no warnings (``-W``), its main pages, the gallery
and the Performance table exist, and pages open in headless Chromium as a reader sees them.

The browser part: the index, one API page, one gallery page (with its plot loaded) and the
search page (its results list filled in by the search script) render without a console
error or an uncaught page error; the gallery page's screenshot is written to the test's
tmp_path (its path printed and recorded as the ``screenshot`` property, ``pytest -rA``).
The site is served over http://127.0.0.1 by a threaded ``http.server`` (search needs http,
not file://). It needs Playwright's Python package (the ``docs`` extra) and a Chromium: the
system's (``apt-get install chromium``; ``NNKIT_CHROMIUM=<path>`` names another), not
Playwright's downloaded browsers; each is skipped with its reason when missing.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = "api/generated/nnkit.nn.Linear.html"
TIMEOUT_MS = 30_000

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                       reason="needs the docs extra (pip install -e '.[docs]')"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once for this module with warnings as errors (sphinx-gallery writes
    into docs/auto_examples, so two builds must not run at once: every test that needs the
    site is in this file, which runs on one worker), or ``NNKIT_DOCS_HTML``, a site already
    built there."""
    given = os.environ.get("NNKIT_DOCS_HTML")
    if given:
        out = Path(given)
        assert (out / "index.html").is_file(), f"NNKIT_DOCS_HTML={given} holds no index.html"
        return out
    tmp = tmp_path_factory.mktemp("docs")
    out = tmp / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
         "-d", str(tmp / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def test_site_builds_without_warnings(site: Path) -> None:
    out = site
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
    _check_gallery(out / "auto_examples")


def _check_gallery(folder: Path) -> None:
    """An executed example's page shows the figure it saved and what it printed; an example
    on a downloaded checkpoint is shown without running."""
    page = (folder / "cnn_digits.html").read_text()
    images = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert any("sphx_glr_cnn_digits_001" in src and (folder / src).is_file() for src in images), \
        images
    printed = re.findall(r'class="sphx-glr-script-out[^"]*">(.*?)</div>', page, re.S)
    assert "test accuracy after 2 epochs" in _text(" ".join(printed)), printed
    unrun = (folder / "bert_fill_mask.html").read_text()
    assert "sphx-glr-script-out" not in unrun and "Not run when the documentation" in unrun


def _text(page: str) -> str:
    """A page's text: tags dropped, entities decoded, runs of white space as one space
    (Sphinx writes inline code one word per tag)."""
    words = html.unescape(re.sub(r"<[^>]+>", " ", page)).split()
    return " ".join(words)


def test_inventories_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "make_inventories.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----- as a reader sees it: headless Chromium --------------------------------------------
def _chromium() -> str | None:
    """The Chromium to drive: ``NNKIT_CHROMIUM``, else the system's, else None."""
    named = os.environ.get("NNKIT_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """http://127.0.0.1:<port>/, serving the built site from a thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium launched by Playwright (skips when no Chromium is installed)."""
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("needs Playwright's Python package (pip install -e '.[docs]')")
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    if executable is None:
        pytest.skip("needs a Chromium: apt-get install chromium (or NNKIT_CHROMIUM=<path>)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def open_page(browser: Any, base_url: str) -> Iterator[Callable[[str], tuple[Any, list[str]]]]:
    """``open_page(path)``: the page loaded (network idle) and its list of console errors and
    uncaught exceptions, which keeps filling while the test goes on."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)

    def _open(path: str) -> tuple[Any, list[str]]:
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(f"console.error: {m.text} ({m.location})")
                if m.type == "error" and not _favicon_probe(m.location, base_url) else None)
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        response = page.goto(base_url + path, wait_until="load")
        assert response is not None and response.status == 200, (path, response)
        page.wait_for_load_state("networkidle")
        return page, errors

    try:
        yield _open
    finally:
        context.close()


def _favicon_probe(location: dict, base_url: str) -> bool:
    """Whether a console error is Chromium's own request for /favicon.ico (made when a page
    declares no icon), which no page asked for; an icon a page declares is still checked."""
    return location.get("url") == base_url + "favicon.ico"


def _screenshot(page: Any, path: Path, record_property: Callable[[str, object], None]) -> Path:
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    page.screenshot(path=str(path), full_page=True)
    assert path.is_file() and path.stat().st_size > 1000, path
    print(f"screenshot: {path}")
    record_property("screenshot", str(path))
    return path


def _gallery_page(site: Path) -> str | None:
    """The first page under auto_examples/ (an example's own page before the gallery's
    index) that shows an image, as a path relative to the site; None without a gallery."""
    folder = site / "auto_examples"
    if not folder.is_dir():
        return None
    pages = sorted(folder.rglob("*.html"), key=lambda p: (p.name == "index.html", str(p)))
    for page in pages:
        if "<img" in page.read_text(encoding="utf-8", errors="replace"):
            return page.relative_to(site).as_posix()
    pytest.fail(f"the gallery ({folder}) has no page with an <img>: "
                f"{[p.relative_to(site).as_posix() for p in pages][:10]}")


def test_index_renders(open_page: Callable, tmp_path: Path,
                       record_property: Callable[[str, object], None]) -> None:
    page, errors = open_page("index.html")
    assert "nnkit" in page.title().lower(), page.title()
    assert page.locator("h1").first.is_visible()
    assert page.locator("a[href$='.html']").count() > 5
    _screenshot(page, tmp_path / "index.png", record_property)
    assert not errors, errors


def test_api_page_renders(open_page: Callable) -> None:
    page, errors = open_page(API_PAGE)
    assert "Linear" in page.locator("h1").first.inner_text()
    assert page.locator("dl.py.class > dt[id='nnkit.nn.Linear']").is_visible()
    assert page.get_by_text("in_features", exact=True).first.is_visible()
    assert not errors, errors


def test_gallery_page_renders_with_its_image(
        open_page: Callable, site: Path, tmp_path: Path,
        record_property: Callable[[str, object], None]) -> None:
    path = _gallery_page(site)
    assert path is not None, f"the built site has no gallery ({site / 'auto_examples'})"
    page, errors = open_page(path)
    images = page.locator("article img, main img, div.body img")
    assert images.count() > 0, path
    image = images.first
    image.scroll_into_view_if_needed()
    assert image.is_visible(), path
    loaded = image.evaluate("img => img.complete && img.naturalWidth > 0 && img.naturalHeight > 0")
    assert loaded, f"{path}: {image.get_attribute('src')} did not load"
    _screenshot(page, tmp_path / "gallery.png", record_property)
    assert not errors, errors


def test_search_fills_its_results(open_page: Callable) -> None:
    page, errors = open_page("search.html?q=Linear")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(state="attached", timeout=TIMEOUT_MS)
    assert results.count() > 0
    links = [results.nth(i).locator("a").first.inner_text()
             for i in range(min(results.count(), 50))]
    assert any("Linear" in text for text in links), links
    assert not errors, errors
