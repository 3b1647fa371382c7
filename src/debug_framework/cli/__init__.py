"""Command-line interfaces of debug_framework (debug_validate, session_report)."""
