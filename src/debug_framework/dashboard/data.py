"""What every page shares: the settings, the database opened read-only (or a clear DF-coded message
on the page), markdown-safe text, and the session summaries.

User text (model paths, session ids, error messages, anything read from the database or the run
directories) reaches the page only through widgets that show text as text (``st.text``,
``st.code``, ``st.dataframe``, ``st.json``) or through :func:`literal`, which escapes Markdown;
no page passes ``unsafe_allow_html``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from ..errors import DebugFrameworkError
from ..jsonio import JsonObject
from ..reports import neutralise_bidi
from .settings import Settings

if TYPE_CHECKING:
    from ..storage.database import Database

__all__ = ["settings", "literal", "plain", "cells", "number_columns", "NUMBER_FORMAT", "viewer", "show_error", "session_items", "session_ids"]

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")
#: Where GitHub-flavoured Markdown starts a bare link (``http://``, ``https://``, ``www.``, an
#: e-mail's ``@``): Streamlit's renderer links these in the text it has already unescaped, so
#: escaping cannot stop it. A word joiner (U+2060, invisible) placed there does.
_AUTOLINK = re.compile(r"(?i)(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)")
WORD_JOINER = "\u2060"


def settings() -> Settings:
    """The app's settings (from the environment the launcher set)."""
    return Settings.from_environment()


def plain(text: object) -> str:
    """``text`` for ``st.text`` and table cells: every bidi control (the reports' one set,
    :data:`~debug_framework.reports._common.BIDI_CONTROLS`) shown by its name (``<U+202E>``), so
    user text cannot reorder what is around it."""
    return neutralise_bidi(str(text))


def literal(text: object) -> str:
    """``text`` for ``st.markdown``/titles/captions: bidi controls named (:func:`plain`), then every
    Markdown (and HTML) character escaped, and every place a bare link would start broken by an
    invisible :data:`WORD_JOINER`, so user text is shown as typed and never read as markup or links
    (a backend named ``http://evil.example`` is shown, not linked)."""
    return _MARKDOWN.sub(r"\\\1", _AUTOLINK.sub(WORD_JOINER, plain(text)))


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """A table for ``st.dataframe`` with the bidi controls of its text cells named (:func:`plain`)
    and empty text cells empty (never the word "None")."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            out[col] = out[col].map(_text_cell)
    return out


def _text_cell(value: object) -> object:
    """A text column's cell: text with bidi controls named, nothing (None, NaN) as ``""``."""
    if isinstance(value, str):
        return plain(value)
    return "" if value is None or (isinstance(value, float) and value != value) else value


#: How the dashboard's tables show a measured number: three significant digits in scientific
#: notation (``9.798e-05``), never fixed decimals that hide the precision ("0.000000002").
NUMBER_FORMAT = "%.3e"


def number_columns(frame: pd.DataFrame) -> dict[str, object]:
    """``st.dataframe``'s ``column_config`` for ``frame``: every float column as :data:`NUMBER_FORMAT`."""
    return {str(col): st.column_config.NumberColumn(str(col), format=NUMBER_FORMAT)
            for col in frame.columns if pd.api.types.is_float_dtype(frame[col])}


def show_error(exc: DebugFrameworkError, doing: str) -> None:
    """A framework error on the page: its code and message as plain text, never a traceback."""
    st.error(f"{exc.code}: could not {doing}")
    st.text(plain(exc))


@contextmanager
def viewer(s: Settings | None = None) -> Iterator[Database | None]:
    """The session database opened read-only (nothing on disk changes; an older schema is read
    through a migrated copy), or None after showing why it cannot be (missing, corrupt, newer)."""
    from ..cli.session_report import _open_db  # the one way a reader opens it (missing file: DF003)

    s = s or settings()
    try:
        db = _open_db(s.database)
    except DebugFrameworkError as exc:
        show_error(exc, "open the session database")
        st.caption("Start the dashboard with --database PATH (or set PIE_DEBUG_DATABASE) to the file "
                   "debug_validate wrote, or launch a validation on the Jobs page to create it.")
        yield None
        return
    try:
        yield db
    except DebugFrameworkError as exc:  # a damaged row, a server gone mid-read
        show_error(exc, "read the session database")
    finally:
        db.close()


def session_items(db: Database, limit: int = 500) -> list[JsonObject]:
    """One summary per session, newest first (``session_report --list``'s rows)."""
    from ..cli.session_report import _session_items

    return _session_items(db, None, None, limit)


def session_ids(db: Database, limit: int = 500) -> list[str]:
    return [str(s["session_id"]) for s in db.sessions.list(limit=limit)]
