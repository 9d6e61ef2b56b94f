"""``nnkit tour``: the main job, one section per capability, a results table at the end.

One module per section, each a function ``section(ctx) -> list of result rows`` registered
in ``SECTIONS``; ``common`` holds what they share; ``report`` writes the results table and
the plots as one page, ``index.html``. A row (``common.tour_row``) is a dict with
'section', 'result', 'value', 'target' and 'ok': True or False for a row with a target,
"info" for a row that only informs. Plots go to ``ctx.out_dir`` when matplotlib is installed.
"""

from __future__ import annotations

import time
from pathlib import Path

from .approx import approx_section
from .bert import bert_section
from .cnn import cnn_section
from .common import TourContext, format_table, is_information, missed_targets, pyplot
from .distributed import distributed_section
from .hopfield import hopfield_section
from .mlp import mlp_section
from .perceptron import perceptron_section
from .persistence import persistence_section
from .recall import recall_section
from .report import write_index
from .rnn import rnn_section
from .scan import scan_section
from .translate import translate_section
from .vit import vit_section

__all__ = ["TourContext", "SECTIONS", "run_tour", "missed_targets", "format_table"]


SECTIONS = [mlp_section, perceptron_section, hopfield_section, approx_section, cnn_section,
            rnn_section, scan_section, recall_section, translate_section, vit_section, bert_section,
            persistence_section, distributed_section]


def run_tour(out_dir="nnkit-tour", quick: bool = False, seed: int = 0) -> list[dict]:
    """Run every section, print the results table, return its rows.

    Tunes glibc malloc first (``nk.tune_malloc()``: the ViT and BERT sections' training steps
    reuse their large temporaries); ``NNKIT_MALLOC_TUNING=0`` keeps glibc's defaults."""
    from .._malloc import tune

    print(f"malloc tuning: {tune()}")
    ctx = TourContext(out_dir=Path(out_dir), quick=quick, seed=seed)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    ctx.plots = pyplot() is not None
    started = time.time()
    rows = []
    for section in SECTIONS:
        rows.extend(section(ctx))
    print(format_table(rows, ["section", "result", "value", "target", "ok"]))
    verdict = _verdict(rows)
    print(verdict)
    plots = sorted(p for p in ctx.out_dir.glob("*.png") if p.stat().st_mtime >= started - 1)
    page = write_index(rows, ctx.out_dir, plots, verdict, quick)
    if ctx.plots:
        print(f"plots written to {ctx.out_dir.resolve()}/")
    else:
        print("matplotlib is not installed: no plots (pip install 'nnkit[plot]')")
    print(f"results and plots on one page: {page.resolve()}")
    return rows


def _verdict(rows: list[dict]) -> str:
    """The line under the table: how many targets were met, which were missed."""
    missed = missed_targets(rows)
    checked = sum(not is_information(row) for row in rows)
    line = (f"{checked - len(missed)} of {checked} targets met; "
            f"{len(rows) - checked} rows are information")
    return line + "".join(f"\nMISSED: {row['section']}: {row['result']} = {row['value']} "
                          f"(target {row['target']})" for row in missed)


