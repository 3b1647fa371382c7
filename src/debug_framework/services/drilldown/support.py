"""Re-export of :mod:`debug_framework.backends.drilldown.support`, where the drill-down's support moved (down
to the engines' layer, so that an engine's package holds its own strategy): the import path
``debug_framework.services.drilldown.support`` that the docs and ``debug_module`` use keeps working."""

from ...backends.drilldown.support import *  # noqa: F401,F403
from ...backends.drilldown.support import __all__  # noqa: F401
