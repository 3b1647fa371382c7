"""Terminal tables that fit the terminal: numbers and ids are never cut, labels wrap or are
abbreviated, and columns that do not fit are left out and named in the caption.

Every CLI table of the framework is built by :func:`fitted_table` from :class:`Column` descriptions
and rows of plain strings. It sizes each column itself (rich would otherwise shrink every column
evenly, cutting ``9.80e-05`` to ``9.…``):

1. a number column is exactly as wide as its widest cell (or its header's longest word); an id
   column (``Column.key``: a session or run id a user passes back to a command) too, and it is
   never left out, so every list shows each id whole at any width;
2. when the natural widths do not fit, label columns with an abbreviation (``Column.short``) use it;
3. while the number columns and the labels' minimum widths still do not fit, the column with the
   lowest ``keep`` rank is left out (the caption says which, and that a wider terminal shows them);
4. label columns share what is left, each folded within its width (never cut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..termtext import terminal_safe

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Column", "fitted_table", "short_op", "common_prefix"]


@dataclass(frozen=True)
class Column:
    """One column of a :func:`fitted_table`.

    Args:
        header: the column's name (its words may wrap; a number column is at least as wide as the
            longest word).
        number: a number column: never cut, never wrapped;
            right-aligned unless ``left``.
        keep: rank for leaving columns out when the terminal is narrow; the lowest goes first. ``None``
            never goes.
        min_width: a label column's narrowest width (it folds below its natural width).
        short: a label's abbreviation, used when the natural widths do not fit.
        short_note: what the abbreviation does, for the caption (when it was used).
        key: an id a user passes back to a command (``--session-id``, ``--run``): never cut, never
            wrapped, never left out (``keep`` is ignored), left-aligned.
    """

    header: str
    number: bool = False
    left: bool = False
    keep: int | None = None
    min_width: int = 6
    short: Callable[[str], str] | None = None
    short_note: str | None = None
    key: bool = False

    @property
    def whole(self) -> bool:
        """Whether the column's cells are shown whole (a number or an id): never cut or wrapped."""
        return self.number or self.key

    @property
    def droppable(self) -> bool:
        """Whether the column may be left out on a narrow terminal (an id never is)."""
        return self.keep is not None and not self.key


def _natural(col: Column, cells: list[str]) -> int:
    """The width a column wants: its widest cell line and its header's longest word."""
    words = max((len(w) for w in col.header.split()), default=1)
    cell = max((len(line) for c in cells for line in c.splitlines() or [""]), default=1)
    return max(words, cell, 1)


def _minimum(col: Column) -> int:
    """A label column's narrowest width: its ``min_width``, and its header's longest word."""
    return max(col.min_width, max((len(w) for w in col.header.split()), default=1))


def _chrome(n: int) -> int:
    """Borders and padding of an ``n``-column rich table with the default box (padding 1 a side)."""
    return 3 * n + 1


def _share(wanted: list[int], minimum: list[int], room: int) -> list[int]:
    """Widths of label columns sharing ``room``: each gets what it wants when all fit, else the
    narrowest wants are met first and the rest split evenly (never below ``minimum``)."""
    if sum(wanted) <= room:
        return list(wanted)
    widths = list(minimum)
    left = room - sum(widths)
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    for pos, i in enumerate(order):
        share = left // (len(order) - pos) if left > 0 else 0
        extra = min(wanted[i] - widths[i], share)
        widths[i] += max(extra, 0)
        left -= max(extra, 0)
    return widths


def fitted_table(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
                 *, styles: Sequence[str | None] | None = None, caption: str | None = None,
                 title_markup: bool = False) -> Table:
    """A rich table of ``rows`` (one string per column) that fits in ``width`` terminal columns.

    ``styles`` gives a style per row; ``caption`` is printed under the table, followed by the
    ``short_note`` of each abbreviated column and by the names of columns left out. User text is
    never read as markup (``title`` only when ``title_markup``).
    """
    from rich.table import Table
    from rich.text import Text

    cols = list(columns)
    # control and bidi characters shown escaped; a cell's own line breaks stay line breaks
    data = [[terminal_safe(str(c), multiline=True) for c in r] for r in rows]
    keep = list(range(len(cols)))

    def fixed(idx: list[int], cells: list[list[str]]) -> tuple[int, int]:
        """(width of number columns + labels' minimums + chrome, natural total) of the columns idx."""
        need = nat = _chrome(len(idx))
        for i in idx:
            w = _natural(cols[i], [r[i] for r in cells])
            nat += w
            need += w if cols[i].whole else min(w, _minimum(cols[i]))
        return need, nat

    abbreviated = fixed(keep, data)[1] > width
    if abbreviated:  # abbreviate the labels that can be
        data = [[cols[i].short(c) if cols[i].short and not cols[i].whole else c for i, c in enumerate(r)]
                for r in data]
    dropped: list[str] = []
    while fixed(keep, data)[0] > width:
        candidates = [i for i in keep if cols[i].droppable]
        if not candidates:
            break
        gone = min(candidates, key=lambda i: (cols[i].keep or 0, -i))
        keep.remove(gone)
        dropped.append(cols[gone].header)
    labels = [i for i in keep if not cols[i].whole]
    numbers = sum(_natural(cols[i], [r[i] for r in data]) for i in keep if cols[i].whole)
    room = width - _chrome(len(keep)) - numbers
    wanted = [_natural(cols[i], [r[i] for r in data]) for i in labels]
    shares = dict(zip(labels, _share(wanted, [min(w, _minimum(cols[i])) for i, w in zip(labels, wanted)],
                                     room), strict=True))
    t = Table(title=title if title_markup or title is None else Text(terminal_safe(title)))
    for i in keep:
        col = cols[i]
        w = _natural(col, [r[i] for r in data]) if col.whole else shares[i]
        right = col.number and not col.left and not col.key
        t.add_column(col.header, justify="right" if right else "left", width=w, overflow="fold")
    for n, r in enumerate(data):
        t.add_row(*(Text(r[i]) for i in keep), style=None if styles is None else styles[n])
    notes = [caption] if caption else []
    if abbreviated:
        notes += [cols[i].short_note for i in keep if cols[i].short and cols[i].short_note]
    if dropped:
        notes.append(f"left out at {width} columns: {', '.join(dropped)} (a wider terminal or --json shows them)")
    if notes:
        t.caption = Text("; ".join(notes))
    return t


def short_op(op: str) -> str:
    """``aten._softmax.default`` -> ``_softmax``; ``aten.pow.Tensor_Scalar`` -> ``pow.Tensor_Scalar``."""
    name = op[5:] if op.startswith("aten.") else op
    return name[: -len(".default")] if name.endswith(".default") else name


def common_prefix(paths: Sequence[str]) -> str:
    """The dotted module prefix every path in ``paths`` extends (``model.layers.1.``), or ``""``."""
    parts = [p.split(".") for p in paths if p and p != "-"]
    if not parts:
        return ""
    prefix: list[str] = []
    for segment in zip(*parts, strict=False):
        if len(set(segment)) != 1:
            break
        prefix.append(segment[0])
    if any(len(p) <= len(prefix) for p in parts):  # some path IS the prefix: keep one level
        prefix = prefix[:-1]
    return ".".join(prefix) + "." if prefix else ""

