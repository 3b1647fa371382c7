"""Re-export of :mod:`debug_framework.backends.drilldown.paths`, where the drill-down's paths moved (down
to the engines' layer, so that an engine's package holds its own strategy): the import path
``debug_framework.services.drilldown.paths`` that the docs and ``debug_module`` use keeps working."""

from ...backends.drilldown.paths import *  # noqa: F401,F403
from ...backends.drilldown.paths import __all__  # noqa: F401
