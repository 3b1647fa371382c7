"""Command-line interfaces of debug_framework: ``debug_validate``, ``session_report``, and
:mod:`~debug_framework.cli.framework`, the typer-based CLI framework every CLI of the project uses
(``inductor-debug`` included): exit codes 0 pass / 1 numerical failure / 2 usage or environment /
3 internal error, one-line failures, crash logs, strict JSON and literal user text."""
