"""An HTTP client a user can trust with a production server: :class:`EndpointClient`.

* The API key comes from ``OPENAI_API_KEY`` (:func:`.endpoint.api_key`) and lives in the client's
  ``Authorization`` header alone: never in a message, a log line, a row or the recorded
  configuration (every text taken from an answer is cut short, made terminal-safe and stripped of
  the key before it goes into an error).
* Every request has a connect and a read timeout, and the whole client a session limit
  (``timeout``): no request outlives it (an answer is read in chunks, the limit checked between
  them, at most :data:`MAX_ANSWER_BYTES`), so a silent or dripping server ends the run in bounded time.
* 429 and 5xx answers (and a connection dropped mid-answer) are retried at most ``retries`` times
  with exponential backoff (``Retry-After`` honoured, within the session limit); a refused
  connection, a read timeout, 401/403 and a garbage answer are not.
* :meth:`EndpointClient.map` keeps at most ``concurrency`` requests in flight.

Every failure is an :class:`EndpointError` (DF005, exit 2 from a CLI) naming the endpoint and the cause.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ...jsonio import JsonObject, JsonValue
from ...termtext import terminal_safe
from ..endpoints import LogprobRunCut, check_endpoint_url
from .endpoint import API_KEY_VARIABLE, api_key

if TYPE_CHECKING:
    import httpx

__all__ = ["ClientLimits", "EndpointClient", "EndpointError", "MAX_ANSWER_BYTES"]

T = TypeVar("T")
R = TypeVar("R")

#: the most characters of a server's answer quoted in an error
_QUOTED = 120
#: the most bytes one answer may hold (a completion of one token with its top-k is a few kB)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class EndpointError(LogprobRunCut):
    """The served model's endpoint failed (DF005): down, silent, refusing the key, answering garbage,
    overloaded past the retries, or past the session limit. ``endpoint`` and ``cause`` name them;
    ``measured`` is what a run answered before (:class:`~debug_framework.backends.endpoints.LogprobRunCut`)."""

    default_hint = "check that the server is up at that URL and answers OpenAI-compatible completions"

    def __init__(self, message: str, *, endpoint: str, cause: str, hint: str | None = None) -> None:
        self.endpoint = endpoint
        self.cause = cause
        super().__init__(message, backend="openai_server", call="completions", hint=hint, endpoint=endpoint,
                         cause=cause)


@dataclass(frozen=True)
class ClientLimits:
    """How long and how hard the client tries.

    Attributes:
        connect_s: the connect timeout of each request.
        read_s: the read timeout of each request (a server that accepts and never answers).
        session_s: the whole client's limit (``--timeout``): no request starts or runs past it.
        retries: how many times a 429/5xx answer (or a dropped connection) is retried.
        backoff_s: the first retry's wait, doubled at each retry (at most ``max_backoff_s``).
        concurrency: the most requests in flight (``--concurrency``).
    """

    connect_s: float = 5.0
    read_s: float = 60.0
    session_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.25
    max_backoff_s: float = 8.0
    concurrency: int = 4


class EndpointClient:
    """JSON over HTTP to one OpenAI-compatible base URL (``http://host:8000/v1``), within :class:`ClientLimits`.

    ``requests`` counts the requests answered (retries included); the key is read from
    ``OPENAI_API_KEY`` when the client is made and is never shown (``repr`` names the URL only).
    """

    def __init__(self, base_url: str, limits: ClientLimits | None = None) -> None:
        import httpx

        self.url = check_endpoint_url(base_url)
        #: the server's root, where its own (not OpenAI-compatible) routes are: the URL without its ``/v1``
        self.root = self.url.removesuffix("/v1")
        self.limits = limits or ClientLimits()
        self._key = api_key()
        headers = {"Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        lim = self.limits
        self._http = httpx.Client(
            headers=headers, follow_redirects=False, trust_env=False,
            timeout=httpx.Timeout(lim.read_s, connect=lim.connect_s),
            limits=httpx.Limits(max_connections=max(1, lim.concurrency), max_keepalive_connections=max(1, lim.concurrency)))
        self._deadline = time.monotonic() + lim.session_s
        self._lock = threading.Lock()
        self.requests = 0
        self.retried = 0

    def __repr__(self) -> str:
        return f"EndpointClient({self.url!r})"

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # ------------------------------------------------------------------ requests

    def get(self, path: str, *, native: bool = False) -> JsonObject:
        """GET ``base + path`` as a JSON object (``native``: the server's own route, at :attr:`root`)."""
        return self._request("GET", self.where(path, native), None)

    def post(self, path: str, body: Mapping[str, JsonValue], *, native: bool = False) -> JsonObject:
        """POST ``body`` as JSON to ``base + path`` (``native``: to ``root + path``); the answer as a JSON object."""
        return self._request("POST", self.where(path, native), body)

    def where(self, path: str, native: bool = False) -> str:
        """The URL of ``path``: under the OpenAI-compatible base, or (``native``) under :attr:`root`,
        where servers keep their own routes (SGLang's and TGI's ``/generate``, TGI's ``/info``)."""
        return (self.root if native else self.url) + path

    def remaining_s(self) -> float:
        """Seconds left of the session limit."""
        return self._deadline - time.monotonic()

    def _request(self, method: str, where: str, body: Mapping[str, JsonValue] | None) -> JsonObject:
        import httpx

        attempt = 0
        while True:
            left = self.remaining_s()
            if left <= 0:
                raise self.error(f"the session limit of {self.limits.session_s:g} s (--timeout) was reached after "
                                  f"{self.requests} request(s)", "session limit",
                                  "raise --timeout, lower --concurrency's load on the server, or ask fewer positions")
            timeout = httpx.Timeout(min(self.limits.read_s, left), connect=min(self.limits.connect_s, left))
            try:
                status, headers, data = self._exchange(method, where, body, timeout)
            except httpx.ConnectTimeout as exc:
                raise self.error(f"connecting to {where} timed out", "connect timeout") from exc
            except httpx.ConnectError as exc:
                raise self.error(f"cannot connect to {where}: {self.quote(str(exc))}", "connection refused",
                                  "start the server, or check the host and port of --alternative-endpoint") from exc
            except httpx.ReadTimeout as exc:
                raise self.error(f"{where} accepted the connection but sent no answer within "
                                  f"{min(self.limits.read_s, left):.3g} s", "silent server",
                                  "check that the server is serving (not stuck loading); raise --timeout for a slow "
                                  "one") from exc
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if attempt < self.limits.retries:
                    attempt += 1
                    self._back_off(attempt, None)
                    continue
                raise self.error(f"{where} dropped the connection: {self.quote(str(exc))}", "dropped connection") from exc
            except httpx.HTTPError as exc:
                raise self.error(f"request to {where} failed: {type(exc).__name__}: {self.quote(str(exc))}",
                                  "transport error") from exc
            with self._lock:
                self.requests += 1
            if (status == 429 or status >= 500) and attempt < self.limits.retries:
                attempt += 1
                self._back_off(attempt, headers.get("retry-after"))
                continue
            return self._parse(status, data, where, attempt)

    def _exchange(self, method: str, where: str, body: Mapping[str, JsonValue] | None,
                  timeout: httpx.Timeout) -> tuple[int, httpx.Headers, bytes]:
        """One request: ``(status, headers, body)``, the body read in chunks so that a server that
        drips its answer cannot outlast the session limit, nor send more than :data:`MAX_ANSWER_BYTES`."""
        with self._http.stream(method, where, json=body, timeout=timeout) as answer:
            data = bytearray()
            for chunk in answer.iter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise self.error(f"{where} answered more than {MAX_ANSWER_BYTES} bytes", "oversized answer")
                if self.remaining_s() <= 0:
                    raise self.error(f"{where} was still answering when the session limit of "
                                     f"{self.limits.session_s:g} s (--timeout) was reached", "session limit",
                                     "raise --timeout, or check the server: it answers very slowly")
            return answer.status_code, answer.headers, bytes(data)

    def _back_off(self, attempt: int, retry_after: str | None) -> None:
        """Wait before retry ``attempt``: ``Retry-After`` where the server gives seconds, else the
        doubling backoff; never past the session limit."""
        with self._lock:
            self.retried += 1
        wait_s = min(self.limits.backoff_s * 2 ** (attempt - 1), self.limits.max_backoff_s)
        try:
            if retry_after is not None:
                wait_s = min(max(float(retry_after), 0.0), self.limits.max_backoff_s)
        except ValueError:
            pass  # an HTTP date: the doubling backoff
        time.sleep(max(0.0, min(wait_s, self.remaining_s())))

    def _parse(self, status: int, data: bytes, where: str, retries: int) -> JsonObject:
        text = data.decode("utf-8", errors="replace")
        if status in (401, 403):
            given = ("the API key in OPENAI_API_KEY was refused" if self._key else
                     f"the server wants an API key and {API_KEY_VARIABLE} is not set")
            raise self.error(f"{where} answered HTTP {status}: {given}", f"HTTP {status}",
                              f"set {API_KEY_VARIABLE} to the server's API key")
        if status == 429 or status >= 500:
            raise self.error(f"{where} answered HTTP {status} after {retries} retr{'y' if retries == 1 else 'ies'}: "
                              f"{self.quote(text)}", f"HTTP {status}",
                              "the server is overloaded or failing: lower --concurrency, or try again later")
        if status >= 400:
            raise self.error(f"{where} answered HTTP {status}: {self.quote(text)}", f"HTTP {status}",
                              "the server refused the request: it may not offer this API or these parameters "
                              "(see docs/served.md for what each server needs)")
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise self.error(f"{where} answered something that is not JSON: {self.quote(text)}",
                              "garbage answer") from exc
        if not isinstance(doc, dict):
            raise self.error(f"{where} answered JSON that is not an object: {self.quote(text)}", "garbage answer")
        return doc

    # ------------------------------------------------------------------ concurrency

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(item) for item in items]`` with at most ``concurrency`` running at once, in order.
        The first failure stops what has not started and is raised (what finished stays done: ``fn``
        keeps its own results)."""
        todo = list(items)
        if self.limits.concurrency <= 1 or len(todo) <= 1:
            return [fn(item) for item in todo]
        with ThreadPoolExecutor(max_workers=min(self.limits.concurrency, len(todo)),
                                thread_name_prefix="endpoint") as pool:
            futures: list[Future[R]] = [pool.submit(fn, item) for item in todo]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:
                for f in futures:
                    f.cancel()
                raise failed.exception()  # type: ignore[misc]
            return [f.result() for f in futures]

    # ------------------------------------------------------------------ errors

    def quote(self, text: str) -> str:
        """A server's text as an error may quote it: the key removed, cut short, terminal-safe."""
        if self._key:
            text = text.replace(self._key, "[OPENAI_API_KEY]")
        text = " ".join(text.split())
        return terminal_safe(text[:_QUOTED] + ("..." if len(text) > _QUOTED else "")) or "(empty)"

    def error(self, message: str, cause: str, hint: str | None = None) -> EndpointError:
        """The :class:`EndpointError` naming this endpoint and ``cause`` (the key never in it)."""
        if self._key:
            message = message.replace(self._key, "[OPENAI_API_KEY]")
        return EndpointError(message, endpoint=self.url, cause=cause, hint=hint)

    def answer_error(self, path: str, what: str, doc: JsonValue, *, native: bool = False) -> EndpointError:
        """The error of an answer that parsed as JSON but is not what ``path`` answers (``what`` is missing)."""
        return self.error(f"{self.where(path, native)} answered without {what}: {self.quote(json.dumps(doc)[:400])}",
                           "garbage answer", "check that the URL is an OpenAI-compatible server's /v1 base "
                                             "(docs/served.md lists the servers and their flags)")
