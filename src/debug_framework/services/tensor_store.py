"""Old import path of the tensor store, kept while callers move to :mod:`debug_framework.storage.tensor_store`.

The content-addressed tensor store is storage (it sits below the records), so it lives in
``debug_framework.storage.tensor_store``; this module only re-exports it.
"""

from __future__ import annotations

from ..storage.tensor_store import *  # noqa: F403 - the whole public API, re-exported
from ..storage.tensor_store import __all__ as __all__
