"""The one place the API key is read: ``OPENAI_API_KEY``, the convention of OpenAI-compatible clients.
The URL is checked by :func:`debug_framework.backends.endpoints.check_endpoint_url`."""

from __future__ import annotations

import os

__all__ = ["api_key", "API_KEY_VARIABLE"]

#: The environment variable the API key is read from (never an option: it would be recorded).
API_KEY_VARIABLE = "OPENAI_API_KEY"


def api_key() -> str | None:
    """The API key of the endpoint (``OPENAI_API_KEY``; None where unset or empty)."""
    key = os.environ.get(API_KEY_VARIABLE, "").strip()
    return key or None
