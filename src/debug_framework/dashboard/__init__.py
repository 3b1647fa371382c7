"""The Streamlit dashboard over sessions, batch jobs, plugins and ``debug_module`` runs.

    debug-dashboard [--database PATH|URL] [--artifacts DIR] [--port N] [--host 127.0.0.1]
    python -m debug_framework.dashboard ...

:mod:`.__main__` starts ``streamlit run`` on :mod:`.app` with its settings in the environment
(:mod:`.settings`); the pages read the database opened read-only (:mod:`.data`); launching a
validation or a batch job writes a task to the database and starts a worker process
(:mod:`.launch`, :mod:`.worker`), never running the work inside Streamlit. Other packages add pages
through the entry-point group ``debug_framework.dashboard_pages`` (:mod:`.extensions`). See
``docs/dashboard.md``.
"""

from __future__ import annotations

__all__: list[str] = []
