"""The command line's tables: columns defined once, rendered the same way by every command.

By default a table shows its short set of columns and fits the terminal (80 columns in the usual case), as
kubectl and squeue do; `-o wide` shows every column. Headers and "keep" values (names, ids, numbers) are
never cut: when they alone are wider than the terminal the lines run past its edge (the terminal wraps them)
rather than being squeezed into unreadable stubs. Only free-text columns give up room, by ending in an
ellipsis ("cut") or folding onto more lines ("wrap").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

Row = TypeVar("Row")
Fit = Literal["keep", "cut", "wrap"]

GAP = 2  # spaces between two columns
# A free-text column keeps at least this many characters (or its header, or its longest value if shorter).
MIN_FLEXIBLE = 8
EMPTY = "-"


@dataclass(frozen=True, slots=True)
class Column(Generic[Row]):
    header: str
    value: Callable[[Row], Any]
    wide: bool = False  # shown with -o wide only
    right: bool = False  # numbers, aligned on the right
    fit: Fit = "keep"  # keep: never cut; cut: one line ending in "…"; wrap: folded onto more lines


def cell_text(value: Any) -> str:
    """A value as a cell shows it: nothing (None, "") is "-", a flag yes or no."""
    if value is None or value == "":
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def shown_columns(columns: Sequence[Column[Row]], wide: bool) -> list[Column[Row]]:
    return [c for c in columns if wide or not c.wide]


def cells(columns: Sequence[Column[Row]], rows: Sequence[Row], wide: bool = False) -> list[list[str]]:
    """The text of every cell, row by row, of the columns shown."""
    shown = shown_columns(columns, wide)
    return [[cell_text(c.value(row)) for c in shown] for row in rows]


def _shrink(widths: list[int], floors: list[int], flexible: list[int], excess: int) -> list[int]:
    """Take `excess` characters from the flexible columns, the widest first, none below its floor."""
    widths = list(widths)
    while excess > 0:
        shrinkable = [i for i in flexible if widths[i] > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: (widths[i], -i))  # ties: the leftmost first
        widths[widest] -= 1
        excess -= 1
    return widths


def column_widths(columns: Sequence[Column[Row]], body: list[list[str]], width: int | None) -> list[int]:
    """Each column's width: its header or longest value, less what the free-text columns give up so that the
    table fits `width` (None: no limit)."""
    natural = [max([cell_len(c.header), *(cell_len(r[i]) for r in body)]) for i, c in enumerate(columns)]
    if width is None:
        return natural
    excess = sum(natural) + GAP * (len(columns) - 1) - width
    flexible = [i for i, c in enumerate(columns) if c.fit != "keep"]
    floors = [min(n, max(cell_len(c.header), MIN_FLEXIBLE)) for n, c in zip(natural, columns, strict=True)]
    return _shrink(natural, floors, flexible, excess) if excess > 0 else natural


def build_table(title: str | None, columns: Sequence[Column[Row]], rows: Sequence[Row], wide: bool = False,
                width: int | None = 80) -> Table:
    """The table of `rows`: the short set of columns fitted to `width`, or (wide) every column, uncut."""
    shown = shown_columns(columns, wide)
    body = cells(columns, rows, wide)
    widths = column_widths(shown, body, None if wide else width)
    table = Table(title=title, box=None, padding=(0, GAP // 2), pad_edge=False, header_style="bold",
                  title_justify="left")
    for column, w in zip(shown, widths, strict=True):
        table.add_column(column.header, width=w, justify="right" if column.right else "left",
                         no_wrap=column.fit != "wrap", overflow="fold" if column.fit == "wrap" else "ellipsis")
    for r in body:
        table.add_row(*(Text(v) for v in r))  # Text: a value is never read as rich markup
    return table


def table_width(table: Table) -> int:
    """The characters a line of the table takes."""
    return sum(c.width or 0 for c in table.columns) + GAP * max(len(table.columns) - 1, 0)


def print_table(title: str | None, columns: Sequence[Column[Row]], rows: Sequence[Row], wide: bool = False,
                console: Console | None = None) -> None:
    """Print the table on standard output (or `console`), fitted to its width unless wide. The title goes on a line
    of its own: as the table's caption rich would fold it at the table's width, however narrow the table."""
    out = console or Console()
    terminal = out.width
    if title:
        out.print(Text(title), soft_wrap=True)
    table = build_table(None, columns, rows, wide, terminal)
    needed = table_width(table)
    if needed <= terminal:
        out.print(table)
        return
    # Wider than the terminal (wide, or names that cannot give way): print it whole on longer lines rather
    # than let rich squeeze every column down to a few letters.
    out.width = needed
    try:
        out.print(table)
    finally:
        out.width = terminal
