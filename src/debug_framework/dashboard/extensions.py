"""Pages other packages add to the dashboard, through the entry-point group
``debug_framework.dashboard_pages``.

An entry point names a callable that draws the page with Streamlit, taking one
:class:`PageContext` (the database and the artifacts root the dashboard was started with); its
optional ``title`` attribute is the page's title (default: the entry point's name, which is also
its URL path). This is how ``debug_module`` shows its run directories without ``debug_framework``
importing ``debug_module`` (the lower package never imports the upper one)::

    [project.entry-points."debug_framework.dashboard_pages"]
    runs = "debug_module.dashboard_page:runs_page"

A page that fails to load, or is named like a built-in page (:data:`RESERVED`), is named with its
error in the sidebar instead of breaking the app.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

__all__ = ["GROUP", "RESERVED", "PageContext", "ContributedPage", "contributed_pages"]

GROUP = "debug_framework.dashboard_pages"
#: The built-in pages' URL paths: a contributed page may not take one (Streamlit refuses two pages
#: on one path, which would take the whole app down).
RESERVED = frozenset({"sessions", "session", "diff", "jobs", "plugins"})
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")


@dataclass(frozen=True)
class PageContext:
    """What a contributed page is given."""

    database: Path | str
    artifacts: Path


@dataclass(frozen=True)
class ContributedPage:
    name: str  # the entry point's name: the page's URL path
    title: str
    render: Callable[[PageContext], None] | None
    error: str | None = None  # why it could not be loaded


def contributed_pages() -> list[ContributedPage]:
    """The installed pages, by name (one per name; an unusable name or a failing import is reported)."""
    pages: dict[str, ContributedPage] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in pages:
            continue
        if not _NAME.fullmatch(ep.name):
            pages[ep.name] = ContributedPage(ep.name, ep.name, None, "page names are lower-case letters, digits, - _")
            continue
        if ep.name in RESERVED:
            pages[ep.name] = ContributedPage(ep.name, ep.name, None, f"the name {ep.name!r} is a built-in page's; "
                                             "register the page under another name")
            continue
        try:
            fn = ep.load()
        except Exception as exc:  # noqa: BLE001 - another package's bug must not take the dashboard down
            pages[ep.name] = ContributedPage(ep.name, ep.name, None, f"{type(exc).__name__}: {exc}")
            continue
        pages[ep.name] = ContributedPage(ep.name, str(getattr(fn, "title", ep.name)), fn)
    return sorted(pages.values(), key=lambda p: p.name)
