"""The tour's results as one web page: ``index.html`` beside the plots, the results table
and every plot of the run, so a reader looks at one page instead of scrolling a terminal.

Everything written into the page is escaped (the rows are the tour's own strings, but a page
that quotes them must not turn one into markup); the plots are referenced by file name,
relative to the page, so the folder can be moved or served as it is.
"""

from __future__ import annotations

import datetime
import html
import platform
from pathlib import Path

__all__ = ["write_index"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; }
th { background: #f4f4f4; }
td.met { color: #17692b; } td.missed { color: #b00020; font-weight: bold; }
td.info { color: #666; }
.plots { display: flex; flex-wrap: wrap; gap: 1.5em; margin-top: 1.5em; }
figure { margin: 0; max-width: 33em; } figure img { max-width: 100%; }
figcaption { font-size: 0.85em; color: #555; }
"""

COLUMNS = ("section", "result", "value", "target", "ok")


def _status(ok) -> tuple[str, str]:
    """A row's 'ok' as (css class, text)."""
    if ok is True:
        return "met", "met"
    if ok is False:
        return "missed", "MISSED"
    return "info", "info"


def _row_html(row: dict) -> str:
    css, text = _status(row.get("ok"))
    cells = "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in COLUMNS[:-1])
    return f"<tr>{cells}<td class=\"{css}\">{text}</td></tr>"


def write_index(rows: list[dict], out_dir, plots: list[Path], verdict: str,
                quick: bool) -> Path:
    """Write ``out_dir/index.html``: the table of ``rows`` (the tour's result rows), the
    ``verdict`` line and the images ``plots`` (files in ``out_dir``); returns its path."""
    out_dir = Path(out_dir)
    header = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "\n".join(_row_html(row) for row in rows)
    figures = "\n".join(
        f'<figure><img src="{html.escape(p.name, quote=True)}" alt="{html.escape(p.stem)}">'
        f"<figcaption>{html.escape(p.stem.replace('_', ' '))}</figcaption></figure>"
        for p in plots)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = f"{platform.node()}, {platform.machine()}, Python {platform.python_version()}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nnkit tour</title>
<style>{_STYLE}</style></head>
<body>
<h1>nnkit tour{' (quick)' if quick else ''}</h1>
<p>{html.escape(when)} &middot; {html.escape(machine)}</p>
<p><strong>{html.escape(verdict).replace(chr(10), '<br>')}</strong></p>
<table><thead><tr>{header}</tr></thead><tbody>
{body}
</tbody></table>
<div class="plots">
{figures}
</div>
</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
