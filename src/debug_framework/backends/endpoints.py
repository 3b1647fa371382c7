"""What every engine of a model behind a server shares, whatever the server: its URL checked once where
it enters (:func:`check_endpoint_url`: the session configuration, the engine), the top-k answers
(:class:`TopK`, :class:`LogprobRun`), the :class:`LogprobBackend` protocol of a backend that gives out
only token log-probabilities, and :class:`LogprobRunCut`, the error of a run cut short that keeps
what was measured before.

Torch-free and httpx-free: :class:`~debug_framework.models.session_config.SessionConfig` checks the
URL here before anything heavy is imported. The validation's served stage reads a backend through
this module alone (``capabilities.offers(backend, "run_logprobs")``), never an engine's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import urlsplit

import numpy as np

from ..errors import BackendRuntimeError, ConfigurationError

if TYPE_CHECKING:
    from ..jsonio import JsonObject

__all__ = ["check_endpoint_url", "TopK", "LogprobRun", "LogprobBackend", "LogprobRunCut", "DEFAULT_TOP_K"]

#: How many log-probabilities per position are asked for (OpenAI's and vLLM's default limit is 20).
DEFAULT_TOP_K = 20

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


@dataclass(frozen=True)
class TopK:
    """The top-k of one next-token distribution: token ids and their log-probabilities, most likely first."""

    ids: np.ndarray  #: int64 [k]
    logprobs: np.ndarray  #: float64 [k]


@dataclass
class LogprobRun:
    """What a server answered: the top-k per ``(row, position)``, and how it was asked."""

    top: dict[tuple[int, int], TopK] = field(default_factory=dict)
    protocol: str = ""
    model: str = ""
    requests: int = 0
    retried: int = 0
    seconds: float = 0.0
    k: int = DEFAULT_TOP_K

    def to_dict(self) -> JsonObject:
        """The record of the run (no token data): protocol, model, k, requests, retries, seconds, positions."""
        return {"protocol": self.protocol, "model": self.model, "top_k": self.k, "requests": self.requests,
                "retried": self.retried, "seconds": self.seconds, "positions": len(self.top)}


@runtime_checkable
class LogprobBackend(Protocol):
    """A backend that gives out only token log-probabilities (a model behind a server)."""

    name: str
    url: str  #: where it is served (never with credentials)

    def run_logprobs(self, sequences: list[tuple[int, ...]], positions: list[tuple[int, ...]]) -> LogprobRun:
        """The top-k at ``positions[r]`` of each row ``r``'s ``sequences[r]`` (position ``p``: the
        next-token distribution after tokens ``[0, p]``), teacher-forced; :class:`LogprobRunCut`
        where the run is cut short."""
        ...


class LogprobRunCut(BackendRuntimeError):
    """A log-probability run cut short (DF005): ``measured`` is what was answered before (None: nothing)."""

    title = "The served model's endpoint failed"

    def __init__(self, message: str, *, backend: str, call: str, hint: str | None = None, **context: object) -> None:
        #: what the run measured before it was cut short (set by the backend; None: nothing yet)
        self.measured: LogprobRun | None = None
        super().__init__(message, backend=backend, call=call, hint=hint, **context)
