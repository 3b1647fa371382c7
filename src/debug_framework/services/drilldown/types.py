"""Re-export of :mod:`debug_framework.backends.drilldown.types`, where the drill-down's types moved (down
to the engines' layer, so that an engine's package holds its own strategy): the import path
``debug_framework.services.drilldown.types`` that the docs and ``debug_module`` use keeps working."""

from ...backends.drilldown.types import *  # noqa: F401,F403
from ...backends.drilldown.types import __all__  # noqa: F401
