"""Markdown tables: the one shape in which the evaluation's reports and the benchmarks print their figures."""

from __future__ import annotations

from typing import Iterable, Sequence


def table(head: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """The lines of a table: the header, its separator, a line per row.  Cells are written as ``str`` gives them
    (callers format their numbers); a row of another length than the header is a caller's mistake."""
    lines = [_line(head), "|" + "---|" * len(head)]
    for row in rows:
        if len(row) != len(head):
            raise ValueError(f"a table row has {len(row)} cells for {len(head)} columns: {list(row)!r}")
        lines.append(_line(row))
    return lines


def _line(cells: Sequence) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
