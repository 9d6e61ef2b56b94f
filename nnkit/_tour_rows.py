"""One row of the ``nnkit tour`` results table, shared by every section.

A row with a target carries its check: ``ok`` is True when the target is met and False when
it is missed. A row that only informs (a time, a size, a quick run's accuracy) carries
``ok = "info"``: it neither passes nor fails, and the table says so.
"""

from __future__ import annotations

__all__ = ["INFO", "tour_row", "missed_targets", "is_information"]

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
