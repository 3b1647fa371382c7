"""``python -m debug_module``: the ``inductor-debug`` CLI."""

from .cli import main

main()
