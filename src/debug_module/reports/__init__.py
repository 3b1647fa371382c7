"""debug_module's own report: one self-contained HTML page (and its JSON twin) over run directories,
built with the project's one HTML toolkit (``debug_framework.reports._html``)."""

from .generator import (
    BENCHMARK_SCHEMA,
    REPORT_SCHEMA,
    build_report,
    collect_run,
    find_runs,
    is_run_dir,
    load_benchmarks,
    render_html,
    save_guard_report,
    write_report,
)

__all__ = ["build_report", "collect_run", "find_runs", "is_run_dir", "load_benchmarks", "render_html", "write_report",
           "save_guard_report", "REPORT_SCHEMA", "BENCHMARK_SCHEMA"]
