"""SGLang's and TGI's native ``/generate`` spoken by token id: the request plans and the answers read,
against small real HTTP servers started here that answer in the shapes the servers' source documents
(SGLang's ``meta_info`` triples; TGI's ``details.prefill`` and ``top_tokens``, its ``/info``). The
real SGLang and TGI are not run in CI (docs/served.md). Each test server computes its answers from a
next-token function of the prefix it was sent, so a position read one place off, an id read as text,
or a prompt tokenized differently shows."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from debug_framework.backends.openai_server.client import ClientLimits, EndpointClient, EndpointError
from debug_framework.backends.openai_server.protocols import Request, Sglang, Tgi, chains, detect_protocol
from debug_framework.comparison.topk import log_softmax, top_of
from debug_framework.jsonio import JsonObject

VOCAB = 24
K = 4
FAST = ClientLimits(connect_s=1.0, read_s=2.0, session_s=20.0, retries=0, concurrency=2)

#: a route: the request's JSON body -> (status, answer)
Route = Callable[[JsonObject], tuple[int, object]]


def logits_after(prefix: list[int]) -> np.ndarray:
    """The test servers' model: next-token logits after ``prefix`` (a deterministic function of it)."""
    return np.random.default_rng([7, *prefix]).normal(size=VOCAB) * 3.0


def expected(prefix: list[int]) -> tuple[list[int], list[float]]:
    ids, lp = top_of(logits_after(prefix)[None, :], K)
    return ids[0].tolist(), lp[0].tolist()


@pytest.fixture(scope="module")
def serve(loopback_http) -> Callable[[dict[str, Route]], str]:
    """``serve(routes) -> base URL`` (``http://127.0.0.1:PORT/v1``): a real HTTP server on a loopback
    port answering each path (``/v1/models``, ``/generate``, ``/info``) by its route, 404 elsewhere."""

    def start(routes: dict[str, Route]) -> str:
        def answer(request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
            route = routes.get(request.path)
            status, reply = route(json.loads(body or b"{}")) if route else (404, {"error": "not found"})
            return status, (reply if isinstance(reply, str) else json.dumps(reply)).encode()

        return loopback_http(answer)

    return start


# ---------------------------------------------------------------------------------------------- SGLang


def sglang_generate(body: JsonObject) -> tuple[int, object]:
    """SGLang's /generate with input_ids, return_logprob, top_logprobs_num, logprob_start_len 0 (its
    tokenizer_manager: each entry a [logprob, token id, text] triple, text None unless asked)."""
    ids, k = body["input_ids"], body["top_logprobs_num"]
    assert body["logprob_start_len"] == 0 and body["return_logprob"] is True
    assert body["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0}

    def top(prefix: list[int]) -> list[list[object]]:
        lp = log_softmax(logits_after(prefix)[None, :])[0]
        order = np.argsort(-lp)[:k]
        return [[float(lp[t]), int(t), None] for t in order]

    token_lp = [[None, ids[0], None]] + [[-1.0, t, None] for t in ids[1:]]
    nxt = top(ids)[0][1]
    return 200, {"text": "x", "meta_info": {
        "prompt_tokens": len(ids), "completion_tokens": 1, "input_token_logprobs": token_lp,
        "input_top_logprobs": [None] + [top(ids[:i]) for i in range(1, len(ids))],
        "output_token_logprobs": [[top(ids)[0][0], nxt, None]], "output_top_logprobs": [top(ids)]}}


def sglang_models(body: JsonObject) -> tuple[int, object]:
    return 200, {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "sglang"}]}


def test_sglang_is_detected_and_read_by_token_id(serve):
    url = serve({"/v1/models": sglang_models, "/generate": sglang_generate})
    client = EndpointClient(url, FAST)
    assert detect_protocol(client, client.get("/models")) == ("sglang", "tiny")
    tokens = (3, 9, 1, 17, 5)
    protocol = Sglang()
    (request,) = protocol.requests(0, tokens, (0, 2, 4))  # one request per row
    assert request == Request(0, 5, (0, 2, 4))
    got = protocol.ask(client, "tiny", tokens, request, K)
    for p in (0, 2, 4):
        ids, lp = expected(list(tokens[:p + 1]))
        assert got[p].ids.tolist() == ids and np.allclose(got[p].logprobs, lp)
    client.close()


@pytest.mark.parametrize("answer, what", [
    ({"text": "x"}, "input_token_logprobs"),
    ({"meta_info": {"input_token_logprobs": [[None, 3, None], [-1.0, 8, None]],
                    "input_top_logprobs": [None, []]}}, "ids sent"),  # it read other ids
    ({"meta_info": {"input_token_logprobs": [[None, 3, None], [-1.0, 9, None]],
                    "input_top_logprobs": [None]}}, "input_top_logprobs of 2"),
    ({"meta_info": {"input_token_logprobs": [[None, 3, None], [-1.0, 9, None]],
                    "input_top_logprobs": [None, [["-1", "7", "a"]]], "output_top_logprobs": [[]]}}, "position 0"),
    ("<html>502</html>", "not JSON"),
])
def test_a_malformed_sglang_answer_is_df005_naming_the_endpoint(serve, answer, what):
    url = serve({"/generate": lambda body: (200, answer)})
    client = EndpointClient(url, FAST)
    with pytest.raises(EndpointError, match=what) as info:
        Sglang().ask(client, "tiny", (3, 9), Request(0, 2, (0, 1)), K)
    assert info.value.code == "DF005" and f"{client.root}/generate" in str(info.value)
    client.close()


# ---------------------------------------------------------------------------------------------------- TGI


def word_tokenizer(bos: bool) -> Tokenizer:
    """A word-level tokenizer of ``VOCAB`` words (``w0`` .. ``w23``), ``<s>`` being ``w0`` and added in
    front of every text where ``bos``."""
    vocab = {"<s>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>"])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


def tgi(server_tokenizer: Tokenizer) -> dict[str, Route]:
    """TGI's routes: /v1/models (owned_by the model's id), /info (its router), /generate (text in; with
    decoder_input_details its prefill ids, top_n_tokens the top tokens of the generated token)."""

    def generate(body: JsonObject) -> tuple[int, object]:
        params = body["parameters"]
        assert params["details"] and params["decoder_input_details"] and params["max_new_tokens"] == 1
        if not body["inputs"]:
            return 422, {"error": "Input validation error: `inputs` cannot be empty", "error_type": "validation"}
        ids = server_tokenizer.encode(body["inputs"], add_special_tokens=True).ids
        want, lp = expected(ids)
        top = [{"id": t, "text": f"w{t}", "logprob": v, "special": False} for t, v in
               zip(want[:params["top_n_tokens"]], lp)]
        prefill = [{"id": t, "text": f"w{t}", "logprob": None if i == 0 else -1.0} for i, t in enumerate(ids)]
        return 200, {"generated_text": top[0]["text"], "details": {
            "finish_reason": "length", "generated_tokens": 1, "seed": None, "prefill": prefill,
            "tokens": [top[0]], "top_tokens": [top]}}

    return {"/v1/models": lambda b: (200, {"object": "list", "data": [{"id": "org/tiny", "owned_by": "org/tiny"}]}),
            "/info": lambda b: (200, {"model_id": "org/tiny", "router": "text-generation-router", "version": "3.3.6"}),
            "/generate": generate}


def test_tgi_is_detected_by_its_info_and_asked_in_text(serve):
    tok = word_tokenizer(bos=False)
    url = serve(tgi(tok))
    client = EndpointClient(url, FAST)
    assert detect_protocol(client, client.get("/models")) == ("tgi", "org/tiny")
    protocol = Tgi(tok, client.url)
    tokens = (3, 9, 1, 17)
    requests = protocol.requests(0, tokens, (0, 1, 2, 3))  # one request per position, the prefix as text
    assert [(r.length, r.text) for r in requests] == [(1, "w3"), (2, "w3 w9"), (3, "w3 w9 w1"), (4, "w3 w9 w1 w17")]
    got: dict[int, object] = {}
    for chain in chains(requests, 2):
        for r in chain:
            got.update(protocol.ask(client, "org/tiny", tokens, r, K))
    for p in range(4):
        ids, lp = expected(list(tokens[:p + 1]))
        assert got[p].ids.tolist() == ids and np.allclose(got[p].logprobs, lp)  # type: ignore[attr-defined]
    client.close()


def test_tgi_tokenizing_otherwise_is_refused(serve):
    """A TGI serving a tokenizer that adds a BOS reads ``w3 w9`` as three ids: DF005, not a wrong number."""
    url = serve(tgi(word_tokenizer(bos=True)))
    client = EndpointClient(url, FAST)
    protocol = Tgi(word_tokenizer(bos=False), client.url)
    (request,) = protocol.requests(0, (3, 9), (1,))
    with pytest.raises(EndpointError, match=r"tokenized the prompt's text as \[0, 3, 9\]") as info:
        protocol.ask(client, "org/tiny", (3, 9), request, K)
    assert info.value.cause == "tokenizer mismatch" and f"{client.root}/generate" in str(info.value)
    client.close()


def test_a_prefix_that_is_no_text_is_refused_before_anything_is_sent():
    protocol = Tgi(word_tokenizer(bos=True), "http://127.0.0.1:9/v1")
    assert protocol.requests(0, (0, 3, 9), (1, 2))[1].text == "w3 w9"  # the BOS is TGI's to add
    with pytest.raises(EndpointError, match="special tokens alone") as info:
        protocol.requests(0, (0, 3, 9), (0, 1, 2))  # position 0: after the BOS alone, an empty text
    assert info.value.code == "DF005" and "127.0.0.1:9/v1" in str(info.value)
    with pytest.raises(EndpointError, match="no text reads back"):
        protocol.requests(0, (3, 9), (1,))  # without the BOS this tokenizer always adds


def test_tgi_without_top_tokens_says_what_to_start_it_with(serve):
    tok = word_tokenizer(bos=False)

    def no_top(body: JsonObject) -> tuple[int, object]:
        return 200, {"generated_text": "", "details": {"prefill": [{"id": 3, "text": "w3", "logprob": None}],
                                                       "tokens": []}}

    client = EndpointClient(serve({"/generate": no_top}), FAST)
    protocol = Tgi(tok, client.url)
    with pytest.raises(EndpointError, match="--max-top-n-tokens"):
        protocol.ask(client, "org/tiny", (3,), protocol.requests(0, (3,), (0,))[0], K)
    client.close()


def test_an_unknown_server_is_still_refused(serve):
    url = serve({"/v1/models": lambda b: (200, {"data": [{"id": "m", "owned_by": "someone"}]})})
    client = EndpointClient(url, FAST)
    with pytest.raises(EndpointError, match="not one whose log-probabilities") as info:
        detect_protocol(client, client.get("/models"))  # its /info is a 404: not TGI
    assert "SGLang or TGI" in str(info.value.hint)
    client.close()
