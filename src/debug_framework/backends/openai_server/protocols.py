"""What each server is asked, and how its answer is read: teacher-forced top-k log-probabilities.

Prompts are sent as token ids (no tokenizer can differ), but to TGI, which takes text only (its
tokenization checked); every answer is read by token id. A
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
* :class:`Sglang`: one request per row to SGLang's native ``/generate`` (at the server's root) with
  ``input_ids``, ``return_logprob``, ``top_logprobs_num`` k and ``logprob_start_len`` 0: the top-k
  at every prompt position as ``(logprob, token id, text)`` triples; the ids it read back must be the
  ids sent.
* :class:`Tgi`: TGI's native ``/generate`` takes text only, and gives its top tokens
  (``top_n_tokens``) for generated tokens only: one request per position, the prefix written as
  text with the model's own tokenizer (only where that tokenizer reads the text back as the same
  ids), and the ids TGI tokenized (``decoder_input_details``: its ``prefill``) must be the ids meant.

SGLang and TGI are written from their servers' source and documentation (docs/served.md cites them);
their real servers are not run in CI, only test servers answering in the documented shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...errors import ConfigurationError
from ...jsonio import JsonObject, JsonValue
from ..endpoints import TopK
from .client import EndpointClient, EndpointError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ...modelio.loader import LoadedModel

__all__ = ["TopK", "Request", "Protocol", "LlamaServer", "Vllm", "Sglang", "Tgi", "PROTOCOLS", "detect_protocol",
           "chains"]


@dataclass(frozen=True)
class Request:
    """One request: row ``row``'s first ``length`` tokens as the prompt (or their ``text``), answering ``positions``."""

    row: int
    length: int
    positions: tuple[int, ...]
    text: str | None = None  #: the prompt as text, for a server that takes text only (TGI)


class Protocol:
    """How one kind of server is asked for top-k log-probabilities (see the module's docstring)."""

    name: ClassVar[str] = "protocol"
    #: what the server's ``/models`` says its models are ``owned_by``
    owned_by: ClassVar[str] = ""

    @classmethod
    def for_model(cls, model: LoadedModel, url: str) -> Protocol:
        """The protocol made for validating ``model`` served at ``url`` (most need neither)."""
        return cls()

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


def _triples(entries: JsonValue) -> list[tuple[int, float]]:
    """SGLang's ``[logprob, token id, text]`` triples as ``(id, logprob)``; the malformed ones left out."""
    if not isinstance(entries, list):
        return []
    return [(e[1], lp) for e in entries if isinstance(e, list) and len(e) >= 2 and isinstance(e[1], int)
            and not isinstance(e[1], bool) and (lp := _number(e[0])) is not None]


class Sglang(Protocol):
    """SGLang: one request per row to its native ``/generate``, the top-k at every prompt position."""

    name = "sglang"
    owned_by = name  # sglang/srt/entrypoints/openai/protocol.py: ModelCard.owned_by = "sglang"

    def requests(self, row: int, tokens: tuple[int, ...], positions: tuple[int, ...]) -> list[Request]:
        return [Request(row, max(positions) + 1, tuple(sorted(positions)))] if positions else []

    def ask(self, client: EndpointClient, model: str, tokens: tuple[int, ...], request: Request, k: int) -> dict[int, TopK]:
        prompt = list(tokens[:request.length])
        doc = client.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                        "return_logprob": True, "top_logprobs_num": k, "logprob_start_len": 0,
                                        "return_text_in_logprobs": False}, native=True)
        return read_sglang(client, doc, prompt, request, k)


def read_sglang(client: EndpointClient, doc: JsonObject, prompt: list[int], request: Request, k: int) -> dict[int, TopK]:
    """The top-k of ``request``'s positions in SGLang's ``/generate`` answer: position ``p`` < last from
    ``meta_info.input_top_logprobs[p + 1]`` (the distribution that predicted token ``p + 1``), the last
    from ``output_top_logprobs[0]``. ``input_token_logprobs`` must hold the ids sent, in order."""
    meta = _path(doc, "meta_info")
    read = _path(meta, "input_token_logprobs")
    ids = [e[1] if isinstance(e, list) and len(e) >= 2 else None for e in read] if isinstance(read, list) else None
    if ids != prompt:
        raise client.answer_error("/generate", f"meta_info.input_token_logprobs holding the {len(prompt)} ids sent "
                                  "(logprob_start_len 0)", doc, native=True)
    prompt_top = _path(meta, "input_top_logprobs")
    if not isinstance(prompt_top, list) or len(prompt_top) != request.length:
        raise client.answer_error("/generate", f"meta_info.input_top_logprobs of {request.length} entries", doc,
                                  native=True)
    out: dict[int, TopK] = {}
    last = request.length - 1
    for p in request.positions:
        entries = _triples(prompt_top[p + 1] if p < last else _path(meta, "output_top_logprobs", 0))
        if not entries:
            raise client.answer_error("/generate", f"the top-k (logprob, token id, text) of position {p}", doc,
                                      native=True)
        out[p] = _top(entries, k)
    return out


class Tgi(Protocol):
    """TGI: one request per position to its native ``/generate``, the prefix as text (see the module)."""

    name = "tgi"
    owned_by = ""  # TGI's /v1/models says the model's id: it is told by /info's ``router`` (see detect_protocol)

    def __init__(self, tokenizer: Tokenizer | None = None, url: str = "") -> None:
        self.tokenizer = tokenizer
        self.url = url

    @classmethod
    def for_model(cls, model: LoadedModel, url: str) -> Protocol:
        """TGI reads text: the model's tokenizer writes it (DF005 where the model has none)."""
        if model.tokenizer is None:
            raise ConfigurationError(f"TGI at {url} takes prompts as text, and the model {model.path} has no "
                                     "tokenizer.json to write the token ids as text",
                                     hint="give the model directory with its tokenizer.json, or serve the model with "
                                          "vLLM, SGLang or llama.cpp (they take token ids)")
        return cls(model.tokenizer, url)

    def requests(self, row: int, tokens: tuple[int, ...], positions: tuple[int, ...]) -> list[Request]:
        out = []
        for p in sorted(positions):
            text = self.text_of(tokens[:p + 1])
            if text is None:
                raise self._not_text(row, tokens[:p + 1])
            out.append(Request(row, p + 1, (p,), text))
        return out

    def _not_text(self, row: int, prefix: tuple[int, ...]) -> EndpointError:
        """The error of a prefix no text stands for (DF005), raised before anything is sent."""
        assert self.tokenizer is not None
        why = ("they are special tokens alone (a BOS): their text is empty, which TGI refuses"
               if not self.tokenizer.decode(list(prefix), skip_special_tokens=True) else
               "no text reads back as those ids with the model's tokenizer (adding its special tokens, as TGI does)")
        return EndpointError(f"row {row}'s first {len(prefix)} token id(s) cannot be sent to TGI at {self.url}, which "
                             f"takes text: {why}", endpoint=self.url, cause="not expressible as text",
                             hint="serve the model with vLLM, SGLang or llama.cpp (they take token ids), or validate "
                                  "prompts whose every prefix is text (a model without a BOS token)")

    def text_of(self, prefix: tuple[int, ...]) -> str | None:
        """A non-empty text the tokenizer reads back (adding its special tokens, as TGI does) as
        exactly ``prefix``; None where there is none."""
        assert self.tokenizer is not None
        for skip in (True, False):
            text = self.tokenizer.decode(list(prefix), skip_special_tokens=skip)
            if text and self.tokenizer.encode(text, add_special_tokens=True).ids == list(prefix):
                return text
        return None

    def ask(self, client: EndpointClient, model: str, tokens: tuple[int, ...], request: Request, k: int) -> dict[int, TopK]:
        doc = client.post("/generate", {"inputs": request.text or "", "parameters": {
            "max_new_tokens": 1, "do_sample": False, "details": True, "decoder_input_details": True,
            "top_n_tokens": k}}, native=True)
        return read_tgi(client, doc, list(tokens[:request.length]), request, k)


def read_tgi(client: EndpointClient, doc: JsonObject, prompt: list[int], request: Request, k: int) -> dict[int, TopK]:
    """The top-k of ``request``'s one position in TGI's ``/generate`` answer: ``details.top_tokens[0]``
    (``{id, logprob}`` entries), once ``details.prefill`` (the ids TGI made of the text) is ``prompt``."""
    prefill = _path(doc, "details", "prefill")
    if not isinstance(prefill, list):
        raise client.answer_error("/generate", "details.prefill (decoder_input_details)", doc, native=True)
    read = [_path(e, "id") for e in prefill]
    if read != prompt:
        raise client.error(
            f"{client.where('/generate', True)} tokenized the prompt's text as {client.quote(str(read))}, not as "
            f"the {len(prompt)} id(s) meant {client.quote(str(prompt))}: it serves another tokenizer than the "
            "model's", "tokenizer mismatch", "serve the model directory given as --model-path (its tokenizer.json)")
    top = _path(doc, "details", "top_tokens", 0)
    entries = [(e["id"], lp) for e in top if isinstance(e, Mapping) and isinstance(e.get("id"), int)
               and (lp := _number(e.get("logprob"))) is not None] if isinstance(top, list) else []
    if not entries:
        raise client.answer_error("/generate", "details.top_tokens[0] with token ids (start TGI with "
                                  "--max-top-n-tokens >= k; see docs/served.md)", doc, native=True)
    return {request.positions[0]: _top(entries, k)}


#: The protocols by name (``--backend-option protocol=NAME``; ``auto`` asks the server's ``/models``).
PROTOCOLS: dict[str, type[Protocol]] = {p.name: p for p in (LlamaServer, Vllm, Sglang, Tgi)}
#: ``owned_by`` of a server's ``/models`` -> its protocol
_OWNERS = {p.owned_by: name for name, p in PROTOCOLS.items() if p.owned_by}
#: what TGI's ``/info`` says its ``router`` is (router/src/lib.rs, ``Info``)
TGI_ROUTER = "text-generation-router"


def detect_protocol(client: EndpointClient, doc: JsonObject, given: str = "auto") -> tuple[str, str]:
    """``(protocol name, model id)`` from the server's ``/models`` answer ``doc`` (its first
    model's ``owned_by``, or TGI where that names no known server and the root answers TGI's
    ``/info``; ``given`` where not ``auto``).

    Raises:
        EndpointError: the server cannot be reached, answers garbage, or is of a kind whose
            log-probabilities carry no token ids (DF005, naming the server and what to do).
    """
    model = _path(doc, "data", 0, "id")
    owner = _path(doc, "data", 0, "owned_by")
    if not isinstance(model, str):
        raise client.answer_error("/models", "data[0].id (the served model's name)", doc)
    name = given if given != "auto" else _OWNERS.get(owner if isinstance(owner, str) else "")
    if name is None and _is_tgi(client):
        name = Tgi.name
    if name is None:
        raise client.error(
            f"the server at {client.url} (owned_by {owner!r}) is not one whose log-probabilities are read by token id "
            f"here: {', '.join(PROTOCOLS)}", "unknown server",
            "serve the model with llama.cpp's llama-server, vLLM, SGLang or TGI, or name the protocol with "
            f"--backend-option protocol=NAME (one of {', '.join(PROTOCOLS)}) where the server speaks it (docs/served.md)")
    return name, model


def _is_tgi(client: EndpointClient) -> bool:
    """Whether the server's root answers TGI's ``/info`` (its ``router``); False where it answers anything else."""
    try:
        info = client.get("/info", native=True)
    except EndpointError as exc:
        if exc.cause.startswith("HTTP 4") or exc.cause == "garbage answer":
            return False  # no such route here: not TGI
        raise
    return _path(info, "router") == TGI_ROUTER


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
