"""The ``openai_server`` backend: a model behind an OpenAI-compatible endpoint, on the engine seam
(a :class:`~debug_framework.backends.endpoints.LogprobBackend`).

It gives out no hidden states: :meth:`ServedBackend.run` refuses, and its capabilities say so. What
it gives is :meth:`ServedBackend.run_logprobs`: the top-k log-probabilities at every position asked
for, teacher-forced (each row's sequence sent as token ids), through :mod:`.protocols` and the
bounded :class:`~.client.EndpointClient`. A run cut short by the endpoint raises
:class:`~.client.EndpointError` with what it measured before (``exc.measured``), so a partial run
keeps it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ...capture.keys import Capture
from ...config import FLOAT_DTYPES
from ...errors import BackendInitializationError, ConfigurationError
from ..base import BaseBackend, Taps
from ..capabilities import Capabilities, Support
from .client import ClientLimits, EndpointClient, EndpointError
from ..endpoints import DEFAULT_TOP_K, LogprobRun, check_endpoint_url
from .protocols import PROTOCOLS, Protocol, Request, chains, detect_protocol

if TYPE_CHECKING:
    from ...jsonio import JsonObject
    from ...modelio.inputs import ModelInputs
    from ...modelio.loader import LoadedModel

__all__ = ["ServedBackend", "LogprobRun", "NO_HIDDEN_STATES", "DEFAULT_TOP_K"]

#: Why a served model has no checkpoints but its tokens' log-probabilities.
NO_HIDDEN_STATES = "gives out no hidden states, only token log-probabilities (a served model)"


class ServedBackend(BaseBackend):
    """A model served behind an OpenAI-compatible ``url`` (``http://host:8000/v1``).

    Args:
        url: the server's OpenAI-compatible base URL (``--alternative-endpoint``; without it the
            backend is not available).
        timeout: the whole session's limit on the endpoint, seconds (``--timeout``).
        concurrency: the most requests in flight (``--concurrency``).
        top_k: log-probabilities asked for per position.
        protocol: ``auto`` (from the server's ``/models``, or TGI's ``/info``) or one of
            :data:`~.protocols.PROTOCOLS` (``llama.cpp``, ``vllm``, ``sglang``, ``tgi``).
        read_timeout: one request's read timeout, seconds. connect_timeout: its connect timeout.
        retries: how many times a 429/5xx answer is retried (with exponential backoff).
    """

    name = "openai_server"
    supported_dtypes = FLOAT_DTYPES
    default_dtype = "float32"
    runs_onnx_files = False
    #: each row is sent as a request of its own, its real tokens only: a server's sliding windows
    #: count those (``backends.capabilities.WINDOW_COUNTS``), so the reference counts them too
    window_counts = "tokens"

    def __init__(self, url: str | None = None, timeout: float = 600.0, concurrency: int = 4, top_k: int = DEFAULT_TOP_K,
                 protocol: str = "auto", read_timeout: float = 60.0, connect_timeout: float = 5.0,
                 retries: int = 3) -> None:
        super().__init__()
        self.url = "" if url is None else check_endpoint_url(url)
        if protocol != "auto" and protocol not in PROTOCOLS:
            raise ConfigurationError(f"unknown protocol {protocol!r}", hint=f"use auto or one of {', '.join(PROTOCOLS)}")
        for option, value, low in (("timeout", timeout, 0.0), ("read_timeout", read_timeout, 0.0),
                                   ("connect_timeout", connect_timeout, 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
                raise ConfigurationError(f"{option} must be a positive number of seconds, got {value!r}")
        for option, value, low in (("concurrency", concurrency, 1), ("top_k", top_k, 1), ("retries", retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"{option} must be an integer >= {low}, got {value!r}")
        self.limits = ClientLimits(connect_s=float(connect_timeout), read_s=float(read_timeout),
                                   session_s=float(timeout), retries=retries, concurrency=concurrency)
        self.top_k = top_k
        self.protocol_name = protocol
        self.served_model = ""
        self._client: EndpointClient | None = None
        self._protocol: Protocol | None = None

    def __repr__(self) -> str:
        return f"ServedBackend({self.url!r})"

    def availability(self) -> tuple[bool, str]:
        try:
            import httpx  # noqa: F401
        except ImportError:
            return False, "httpx is not installed (pip install 'debug-framework[served]')"
        if not self.url:
            return False, "it validates a served model: give its URL (--alternative-endpoint http://host:port/v1)"
        return True, ""

    def capabilities(self) -> Capabilities:
        """What a served model can do: compute at the named dtype remotely, nothing else here."""
        return Capabilities(name=self.name, dtypes=self.supported_dtypes, default_dtype=self.default_dtype,
                            weights_memory="resident", decode=Support(False, NO_HIDDEN_STATES),
                            window_counts=self.window_counts, prepared=self.model is not None, device="remote")

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        """Connect: the server's kind and model from its ``/models`` (and TGI's ``/info``; EndpointError
        where it cannot be reached or answers garbage); its vocabulary, where it says, must be the model's."""
        self._check_prepare(model, dtype, device)
        self.device = "remote"
        self.release_session()
        client = EndpointClient(self.url, self.limits)
        models = client.get("/models")
        name, served = detect_protocol(client, models, self.protocol_name)
        self._check_vocabulary(models, model)
        self._client, self._protocol, self.served_model = client, PROTOCOLS[name].for_model(model, self.url), served
        self.protocol_name = name

    def _check_vocabulary(self, doc: JsonObject, model: LoadedModel) -> None:
        """A server whose ``/models`` answer ``doc`` says its vocabulary size (llama.cpp's
        ``meta.n_vocab``) must serve the model's (DF005 naming both)."""
        data = doc.get("data")
        meta = data[0].get("meta") if isinstance(data, list) and data and isinstance(data[0], dict) else None
        n_vocab = meta.get("n_vocab") if isinstance(meta, dict) else None
        expected = int(getattr(model.config, "vocab_size", 0) or 0)
        if isinstance(n_vocab, int) and expected and n_vocab != expected:
            raise ConfigurationError(f"the server at {self.url} serves a vocabulary of {n_vocab} tokens, the model "
                                     f"{model.path} has {expected}", hint="serve the model converted from --model-path",
                                     backend=self.name)

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        """Refused: a served model has no checkpoints (DF002); :meth:`run_logprobs` is what it gives."""
        raise BackendInitializationError(f"backend {self.name!r} {NO_HIDDEN_STATES}", backend=self.name,
                                         hint="validate it with --alternative-endpoint (judged by its tokens)")

    def run_logprobs(self, sequences: list[tuple[int, ...]], positions: list[tuple[int, ...]]) -> LogprobRun:
        """The top-k at ``positions[r]`` of each row ``r``'s ``sequences[r]`` (position ``p``: the
        next-token distribution after tokens ``[0, p]``), teacher-forced.

        Raises:
            EndpointError: the endpoint failed; ``exc.measured`` is the :class:`LogprobRun` of what
                was answered before.
        """
        client, protocol = self._client, self._protocol
        if client is None or protocol is None:
            raise BackendInitializationError("run_logprobs() called before prepare()", backend=self.name,
                                             hint="call backend.prepare(model) first")
        requests: list[Request] = []
        for row, (tokens, wanted) in enumerate(zip(sequences, positions)):
            requests += protocol.requests(row, tokens, wanted)
        run = LogprobRun(protocol=protocol.name, model=self.served_model, k=self.top_k)
        before, retried, started = client.requests, client.retried, time.perf_counter()

        stop = threading.Event()  # a chain that failed stops the others at their next request

        def run_chain(chain: list[Request]) -> None:
            try:
                for request in chain:
                    if stop.is_set():
                        return
                    answered = protocol.ask(client, self.served_model, sequences[request.row], request, self.top_k)
                    for p, top in answered.items():
                        run.top[(request.row, p)] = top  # one key per (row, position): no two chains write one
            except BaseException:
                stop.set()
                raise

        try:
            client.map(run_chain, chains(requests, self.limits.concurrency))
        except EndpointError as exc:
            exc.measured = self._finish(run, client, before, retried, started)
            raise
        return self._finish(run, client, before, retried, started)

    @staticmethod
    def _finish(run: LogprobRun, client: EndpointClient, before: int, retried: int, started: float) -> LogprobRun:
        run.requests, run.retried = client.requests - before, client.retried - retried
        run.seconds = time.perf_counter() - started
        return run

    def version_info(self) -> JsonObject:
        """The endpoint (its URL, never the key), the protocol, the served model and the limits."""
        info = super().version_info()
        info.update(runtime=self.protocol_name, endpoint=self.url, protocol=self.protocol_name, served_model=self.served_model,
                    top_k=self.top_k, timeout_s=self.limits.session_s, concurrency=self.limits.concurrency)
        return info

    def release_session(self) -> None:
        """Close the connections (opened again by :meth:`prepare`)."""
        if self._client is not None:
            self._client.close()
            self._client = None
