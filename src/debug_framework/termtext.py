"""The one terminal-safe form of user-controlled text (paths, session ids, backend names, messages).

A string the user (or a file, a model, a plugin) controls may hold ESC sequences (colours, cursor
moves, OSC 8 links, window titles), BEL, NUL, backspaces, carriage returns, or Unicode's bidi
overrides that make ``evil\\u202ecod.exe`` read as ``evilexe.doc``. Written raw to a terminal they
change what the user sees. :func:`terminal_safe` shows every such character escaped, as Python
writes it in a string literal (``\\x1b``, ``\\x07``, ``\\u202e``), and leaves all other text (accents,
CJK, emoji) as it is. Every CLI path that prints user text goes through it: DF error lines, tables,
progress descriptions and the pytest plugin's summary. No heavy imports.
"""

from __future__ import annotations

import unicodedata

__all__ = ["terminal_safe", "is_unsafe_char", "BIDI_CONTROLS"]

#: Unicode's explicit direction controls (embeddings, overrides, isolates, marks): category Cf, but
#: they reorder what follows on screen.
BIDI_CONTROLS: frozenset[str] = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
#: Separators a terminal treats as line breaks, and the zero-width characters that hide text.
_INVISIBLE: frozenset[str] = frozenset("\u2028\u2029\u200b\u200c\u200d\u2060\ufeff")


def is_unsafe_char(ch: str, *, multiline: bool = False) -> bool:
    """Whether ``ch`` must be shown escaped: a C0/C1 control or DEL (``\\n`` and ``\\t`` are kept when
    ``multiline``), a bidi control, a line/paragraph separator, a zero-width character, or a
    surrogate (a file name that is not valid UTF-8)."""
    if multiline and ch in "\n\t":
        return False
    if ch in BIDI_CONTROLS or ch in _INVISIBLE:
        return True
    cat = unicodedata.category(ch)
    return cat in ("Cc", "Cs")


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal_safe(value: object, *, multiline: bool = False) -> str:
    """``str(value)`` with every character :func:`is_unsafe_char` calls unsafe written as an escape
    (``\\x1b``, ``\\u202e`` ...) and a backslash that would make an escape ambiguous left as is.

    ``multiline=True`` keeps newlines and tabs (a cell or a help text of several lines); the
    default escapes them too, for a text that must stay on one line.
    """
    text = value if isinstance(value, str) else str(value)
    if all(ch.isprintable() and ch not in BIDI_CONTROLS for ch in text) and not any(
            ch in _INVISIBLE for ch in text):
        return text  # the common case: nothing to escape
    return "".join(_escape(ch) if is_unsafe_char(ch, multiline=multiline) else ch for ch in text)
