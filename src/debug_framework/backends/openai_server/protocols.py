"""What each server is asked, and how its answer is read: teacher-forced top-k log-probabilities.

Prompts are sent as token ids (no tokenizer can differ); every answer is read by token id. A
*position* ``p`` of a row's sequence is the next-token distribution after its tokens ``[0, p]``.

* :class:`LlamaServer` (llama.cpp's ``llama-server``): it has no prompt log-probabilities (``echo`` is
  refused), so one ``/completions`` request per position: the prefix as the prompt, ``max_tokens``
  1, ``logprobs`` k (its ``n_probs``: the top-k of the full-vocabulary softmax of the raw logits, each
  with its ``id``), ``temperature`` 0 and ``cache_prompt`` (its extension: the next, one token
  longer, prefix reuses the cached one, so a row of n positions computes each token once). The
  answer's ``usage.prompt_tokens`` must equal the ids sent (a server adding a BOS is refused).
* :class:`Vllm`: one request per row with its ``prompt_logprobs`` extension (the top-k at every
  prompt position) and ``return_tokens_as_token_ids``; the last position from the generated token's
  ``top_logprobs``. Written from vLLM's documented API; not run in CI (docs/served.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...jsonio import JsonObject, JsonValue
from ..endpoints import TopK
from .client import EndpointClient

__all__ = ["TopK", "Request", "Protocol", "LlamaServer", "Vllm", "PROTOCOLS", "detect_protocol", "chains"]


@dataclass(frozen=True)
class Request:
    """One request: row ``row``'s first ``length`` tokens as the prompt, answering ``positions``."""

    row: int
    length: int
    positions: tuple[int, ...]


class Protocol:
    """How one kind of server is asked for top-k log-probabilities (see the module's docstring)."""

    name: ClassVar[str] = "protocol"
    #: what the server's ``/models`` says its models are ``owned_by``
    owned_by: ClassVar[str] = ""

    def requests(self, row: int, tokens: tuple[int, ...], positions: tuple[int, ...]) -> list[Request]:
        """The requests that answer ``positions`` of row ``row`` (its tokens ``tokens``), in order."""
        raise NotImplementedError

    def ask(self, client: EndpointClient, model: str, tokens: tuple[int, ...], request: Request, k: int) -> dict[int, TopK]:
        """Send ``request`` and read the top-k of each of its positions."""
        raise NotImplementedError


def _top(entries: list[tuple[int, float]], k: int) -> TopK:
    entries = sorted(entries, key=lambda e: -e[1])[:k]
    return TopK(np.array([e[0] for e in entries], dtype=np.int64), np.array([e[1] for e in entries], dtype=np.float64))


def _number(value: JsonValue) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _path(doc: JsonValue, *keys: str | int) -> JsonValue:
    """``doc[k0][k1]...``, None where any step is missing or of the wrong kind."""
    for key in keys:
        if isinstance(key, int):
            doc = doc[key] if isinstance(doc, list) and -len(doc) <= key < len(doc) else None
        else:
            doc = doc.get(key) if isinstance(doc, Mapping) else None
    return doc


class LlamaServer(Protocol):
    """llama.cpp's ``llama-server``: one request per position, its prompt cache reused."""

    name = "llama.cpp"
    owned_by = name.replace(".", "")  # llama-server's /models: its project's name without the dot

    def requests(self, row: int, tokens: tuple[int, ...], positions: tuple[int, ...]) -> list[Request]:
        return [Request(row, p + 1, (p,)) for p in sorted(positions)]

    def ask(self, client: EndpointClient, model: str, tokens: tuple[int, ...], request: Request, k: int) -> dict[int, TopK]:
        prompt = list(tokens[:request.length])
        doc = client.post("/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                                           "logprobs": k, "cache_prompt": True})
        sent = _path(doc, "usage", "prompt_tokens")
        if isinstance(sent, int) and sent != len(prompt):
            raise client.answer_error("/completions", f"the prompt as sent: it counted {sent} prompt token(s) for "
                                      f"{len(prompt)} id(s) (it added or dropped tokens, e.g. a BOS)", doc)
        top = _path(doc, "choices", 0, "logprobs", "content", 0, "top_logprobs")
        entries = [(e["id"], lp) for e in top if isinstance(e, Mapping) and isinstance(e.get("id"), int)
                   and (lp := _number(e.get("logprob"))) is not None] if isinstance(top, list) else []
        if not entries:
            raise client.answer_error("/completions", "choices[0].logprobs.content[0].top_logprobs with token ids", doc)
        return {request.positions[0]: _top(entries, k)}


_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class Vllm(Protocol):
    """vLLM: one request per row, ``prompt_logprobs`` for the prompt's positions."""

    name = "vllm"
    owned_by = name

    def requests(self, row: int, tokens: tuple[int, ...], positions: tuple[int, ...]) -> list[Request]:
        return [Request(row, max(positions) + 1, tuple(sorted(positions)))] if positions else []

    def ask(self, client: EndpointClient, model: str, tokens: tuple[int, ...], request: Request, k: int) -> dict[int, TopK]:
        prompt = list(tokens[:request.length])
        doc = client.post("/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                                           "logprobs": k, "prompt_logprobs": k, "return_tokens_as_token_ids": True})
        return read_vllm(client, doc, request, k)


def read_vllm(client: EndpointClient, doc: JsonObject, request: Request, k: int) -> dict[int, TopK]:
    """The top-k of ``request``'s positions in a vLLM completion: position ``p`` < last from
    ``prompt_logprobs[p + 1]`` (entries ranked 1..k), the last from the generated token's ``top_logprobs``."""
    prompt = _path(doc, "choices", 0, "prompt_logprobs")
    if not isinstance(prompt, list) or len(prompt) != request.length:
        raise client.answer_error("/completions", f"choices[0].prompt_logprobs of {request.length} entries "
                                  "(start vLLM with --max-logprobs >= k; see docs/served.md)", doc)
    out: dict[int, TopK] = {}
    last = request.length - 1
    for p in request.positions:
        if p < last:
            entry = prompt[p + 1]
            entries = [(int(t), lp) for t, e in entry.items() if t.isdigit() and isinstance(e, Mapping)
                       and isinstance(e.get("rank"), int) and e["rank"] <= k
                       and (lp := _number(e.get("logprob"))) is not None] if isinstance(entry, Mapping) else []
        else:
            top = _path(doc, "choices", 0, "logprobs", "top_logprobs", 0)
            entries = [(int(m.group(1)), lp) for t, v in top.items() if (m := _TOKEN_ID.match(t))
                       and (lp := _number(v)) is not None] if isinstance(top, Mapping) else []
        if not entries:
            raise client.answer_error("/completions", f"the top-k log-probabilities of position {p} by token id", doc)
        out[p] = _top(entries, k)
    return out


#: The protocols by name (``--backend-option protocol=NAME``; ``auto`` asks the server's ``/models``).
PROTOCOLS: dict[str, type[Protocol]] = {LlamaServer.name: LlamaServer, Vllm.name: Vllm}
#: ``owned_by`` of a server's ``/models`` -> its protocol
_OWNERS = {p.owned_by: name for name, p in PROTOCOLS.items()}


def detect_protocol(client: EndpointClient, doc: JsonObject, given: str = "auto") -> tuple[str, str]:
    """``(protocol name, model id)`` from the server's ``/models`` answer ``doc`` (its first
    model's ``owned_by``; ``given`` where not ``auto``).

    Raises:
        EndpointError: the server cannot be reached, answers garbage, or is of a kind whose
            log-probabilities carry no token ids (DF005, naming the server and what to do).
    """
    model = _path(doc, "data", 0, "id")
    owner = _path(doc, "data", 0, "owned_by")
    if not isinstance(model, str):
        raise client.answer_error("/models", "data[0].id (the served model's name)", doc)
    name = given if given != "auto" else _OWNERS.get(owner if isinstance(owner, str) else "")
    if name is None:
        raise client.error(
            f"the server at {client.url} (owned_by {owner!r}) is not one whose log-probabilities are read by token id "
            f"here: {', '.join(PROTOCOLS)}", "unknown server",
            "serve the model with llama.cpp's llama-server or vLLM, or name the protocol with --backend-option "
            f"protocol=NAME (one of {', '.join(PROTOCOLS)}) where the server speaks it (docs/served.md)")
    return name, model


def chains(requests: list[Request], concurrency: int) -> list[list[Request]]:
    """The requests as chains run one after another (a chain keeps a row's prefixes in order, so each
    request reuses the one before it in the server's prompt cache); rows run side by side, and where
    there are fewer rows than ``concurrency`` a row's requests are cut into contiguous chains."""
    by_row: dict[int, list[Request]] = {}
    for r in requests:
        by_row.setdefault(r.row, []).append(r)
    rows = list(by_row.values())
    if not rows:
        return []
    per_row = max(1, concurrency // len(rows))
    out: list[list[Request]] = []
    for reqs in rows:
        size = -(-len(reqs) // per_row)
        out += [reqs[i:i + size] for i in range(0, len(reqs), size)]
    return out
