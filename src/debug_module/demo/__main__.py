"""``python -m debug_module.demo``: the guided tour (see :mod:`debug_module.demo`)."""

from . import main

raise SystemExit(main())
