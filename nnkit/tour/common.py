"""What every ``nnkit tour`` section shares: its context, its result rows, the table and plotting.

A row with a target carries its check: ``ok`` is True when the target is met and False when
it is missed. A row that only informs (a time, a size, a quick run's accuracy) carries
``ok = "info"``: it neither passes nor fails, and the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["INFO", "TourContext", "tour_row", "missed_targets", "is_information", "format_table",
           "pyplot"]

INFO = "info"


def tour_row(section: str, result: str, value: str, target: str = "", ok=INFO) -> dict:
    """A results row; ``ok`` is the target's check (anything ``bool`` takes) or ``INFO``.

    A check needs the target it checks: a row with ``ok`` other than ``INFO`` and no
    ``target`` is refused.
    """
    if isinstance(ok, str) and ok != INFO:
        raise ValueError(f"ok must be a check (True/False) or {INFO!r}, got {ok!r}")
    if not isinstance(ok, str):
        if not target:
            raise ValueError(f"the row {result!r} has a check but no target: state the target, "
                             f"or pass ok={INFO!r} for a row that only informs")
        ok = bool(ok)  # numpy bools too
    return {"section": section, "result": result, "value": value, "target": target, "ok": ok}


def missed_targets(rows: list[dict]) -> list[dict]:
    """The rows whose target was missed: every ``ok`` that is neither true nor ``INFO``."""
    return [row for row in rows if not is_information(row) and not row["ok"]]


def is_information(row: dict) -> bool:
    """Whether ``row`` only informs (its ``ok`` is ``INFO``) rather than checks a target."""
    return isinstance(row["ok"], str) and row["ok"] == INFO


@dataclass
class TourContext:
    """Where a section writes its plots, whether it runs the quick version, its seed, and
    whether matplotlib is there to plot."""

    out_dir: Path
    quick: bool = False
    seed: int = 0
    plots: bool = True


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``rows`` (dicts) with the given ``columns``."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None
