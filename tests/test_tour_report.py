"""The tour's index.html: the results table and the run's plots on one page, escaped."""

from __future__ import annotations

from html.parser import HTMLParser

from nnkit import tour
from nnkit.tour.report import write_index


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.cells, self.scripts = [], [], [], 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self.scripts += tag == "script"

    def handle_data(self, data):
        if self.tags and self.tags[-1] == "td":
            self.cells.append(data)


def test_the_page_holds_the_table_and_the_plots_escaped(tmp_path):
    plot = tmp_path / "mlp_digits.png"
    plot.write_bytes(b"\x89PNG")
    rows = [{"section": "mlp", "result": "accuracy <b>", "value": "0.97", "target": ">= 0.95",
             "ok": True},
            {"section": "x", "result": "<script>alert(1)</script>", "value": "1", "target": "",
             "ok": "info"},
            {"section": "y", "result": "z", "value": "0.1", "target": ">= 0.5", "ok": False}]
    path = write_index(rows, tmp_path, [plot], "2 of 3 targets met\nMISSED: y", quick=True)
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    assert page.scripts == 0  # the row's markup stays text
    assert "<script>alert(1)</script>" in page.cells and "accuracy <b>" in page.cells
    assert page.images == ["mlp_digits.png"]
    assert ["met", "info", "MISSED"] == [c for c in page.cells if c in ("met", "info",
                                                                        "MISSED")]


def test_run_tour_writes_the_page_with_this_runs_plots(tmp_path, monkeypatch, capsys):
    old = tmp_path / "from_an_earlier_run.png"
    old.write_bytes(b"\x89PNG")
    import os

    os.utime(old, (0, 0))

    def section(ctx):
        (ctx.out_dir / "new_plot.png").write_bytes(b"\x89PNG")
        return [{"section": "s", "result": "r", "value": "1", "target": "", "ok": "info"}]

    monkeypatch.setattr(tour, "SECTIONS", [section])
    tour.run_tour(tmp_path, quick=True)
    page = _Page()
    page.feed((tmp_path / "index.html").read_text(encoding="utf-8"))
    assert page.images == ["new_plot.png"]
    assert "index.html" in capsys.readouterr().out
