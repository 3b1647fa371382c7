"""An endpoint's URL checked once where it enters (the session configuration, the backend), and the
one place the API key is read: ``OPENAI_API_KEY``, the convention of OpenAI-compatible clients.

Torch-free and httpx-free: :class:`~debug_framework.models.session_config.SessionConfig` checks the
URL with :func:`check_endpoint_url` before anything heavy is imported.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ...errors import ConfigurationError

__all__ = ["check_endpoint_url", "api_key", "API_KEY_VARIABLE"]

#: The environment variable the API key is read from (never an option: it would be recorded).
API_KEY_VARIABLE = "OPENAI_API_KEY"

_HINT = ("give the server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1 (no user name, password, "
         "query or fragment; the API key goes in OPENAI_API_KEY)")


def check_endpoint_url(url: object) -> str:
    """``url`` as the base of an OpenAI-compatible API (``http(s)://host[:port][/path]``, trailing
    ``/`` dropped). Credentials in the URL are refused: they would be recorded with the session.

    Raises:
        ConfigurationError: (DF005) anything else, naming what to give.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"alternative_endpoint must be a URL, got {url!r}", hint=_HINT)
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # a bad port raises here
    except ValueError as exc:
        raise ConfigurationError(f"alternative_endpoint is not a URL: {exc}", hint=_HINT) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError("alternative_endpoint must be an http:// or https:// URL with a host", hint=_HINT)
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError("alternative_endpoint must not carry a user name or password (it would be recorded "
                                 "with the session)", hint=_HINT)
    if parts.query or parts.fragment:
        raise ConfigurationError("alternative_endpoint must not have a query or a fragment", hint=_HINT)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}{parts.path.rstrip('/')}"


def api_key() -> str | None:
    """The API key of the endpoint (``OPENAI_API_KEY``; None where unset or empty)."""
    key = os.environ.get(API_KEY_VARIABLE, "").strip()
    return key or None
