"""The endpoint client's failure modes against real sockets and real (tiny) HTTP servers: a dead
port, a silent socket, garbage, 401, 429/5xx with bounded retries, the session limit; the key never
shown; the URL checked; and the top-k token metrics and vLLM's answer read by token id."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest

from debug_framework.backends.endpoints import check_endpoint_url
from debug_framework.backends.openai_server.client import ClientLimits, EndpointClient, EndpointError
from debug_framework.backends.openai_server.protocols import Request, chains, read_vllm
from debug_framework.comparison.topk import top_of, topk_token_metrics
from debug_framework.errors import ConfigurationError

SECRET = "sk-test-0123456789-never-shown"
FAST = ClientLimits(connect_s=1.0, read_s=0.5, session_s=5.0, retries=2, backoff_s=0.01, concurrency=2)

#: an answer script: (status, body) per request, the last repeated
Script = list[tuple[int, str]]


@pytest.fixture
def http_server(loopback_http) -> Callable[[Script], str]:
    """``serve(script) -> base URL``: a real HTTP server on a loopback port answering POST/GET with
    the script's (status, body) in turn; it echoes the request's Authorization header where a body
    says ``{auth}`` (a server that leaks what it was sent)."""

    def serve(script: Script) -> str:
        calls = iter(range(10 ** 6))

        def answer(request: BaseHTTPRequestHandler, _body: bytes) -> tuple[int, bytes]:
            status, body = script[min(next(calls), len(script) - 1)]
            return status, body.replace("{auth}", request.headers.get("Authorization", "")).encode()

        return loopback_http(answer)

    return serve


def _fails(url: str, limits: ClientLimits = FAST, path: str = "/models") -> tuple[EndpointError, float]:
    client = EndpointClient(url, limits)
    started = time.monotonic()
    with pytest.raises(EndpointError) as info:
        client.post(path, {"prompt": [1, 2]})
    client.close()
    return info.value, time.monotonic() - started


def test_dead_port_is_refused_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        err, took = _fails(f"http://127.0.0.1:{port}/v1")
    assert err.code == "DF005" and err.cause == "connection refused" and took < 2.0
    assert f"127.0.0.1:{port}/v1" in str(err) and "start the server" in str(err)


def test_silent_socket_ends_within_the_read_timeout():
    with socket.socket() as s:  # accepts (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        err, took = _fails(f"http://127.0.0.1:{s.getsockname()[1]}/v1")
    assert err.cause == "silent server" and took < 2.0 and "sent no answer within 0.5 s" in str(err)


def test_garbage_and_http_errors_name_the_cause(http_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    err, _ = _fails(http_server([(200, "<html>not json {auth}</html>")]))
    assert err.cause == "garbage answer" and "not JSON" in str(err)
    assert SECRET not in str(err) and SECRET not in json.dumps(err.to_dict())  # the server echoed the key
    err, _ = _fails(http_server([(401, '{"error": "bad key"}')]))
    assert err.cause == "HTTP 401" and "OPENAI_API_KEY was refused" in str(err) and SECRET not in str(err)
    err, _ = _fails(http_server([(400, '{"error": "no such field"}')]))
    assert err.cause == "HTTP 400" and "no such field" in str(err)


def test_missing_key_is_named(http_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    err, _ = _fails(http_server([(403, "{}")]))
    assert "OPENAI_API_KEY is not set" in str(err)


def test_5xx_and_429_are_retried_with_backoff_then_given_up(http_server):
    client = EndpointClient(http_server([(503, "{}"), (429, "{}"), (200, '{"ok": true}')]), FAST)
    assert client.post("/completions", {}) == {"ok": True}
    assert client.requests == 3 and client.retried == 2
    err, took = _fails(http_server([(500, "overloaded")]))
    assert err.cause == "HTTP 500" and "after 2 retries" in str(err) and took < 2.0


def test_the_session_limit_bounds_a_slow_server(http_server):
    url = http_server([(503, "{}")])
    limits = ClientLimits(connect_s=1.0, read_s=1.0, session_s=0.3, retries=50, backoff_s=0.2, max_backoff_s=0.2)
    err, took = _fails(url, limits)
    assert err.cause == "session limit" and took < 1.5 and "--timeout" in str(err)


def test_a_dripping_server_cannot_outlast_the_session_limit():
    """A server that answers one byte every 0.1 s never trips the read timeout; the session limit
    still ends the request."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        stop = threading.Event()

        def drip() -> None:
            conn, _ = s.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                while not stop.wait(0.1):
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        return

        threading.Thread(target=drip, daemon=True).start()
        limits = ClientLimits(connect_s=1.0, read_s=0.5, session_s=1.0, retries=0)
        try:
            err, took = _fails(f"http://127.0.0.1:{s.getsockname()[1]}/v1", limits)
        finally:
            stop.set()
    assert err.cause == "session limit" and "still answering" in str(err) and took < 3.0


def test_map_keeps_at_most_concurrency_in_flight_and_stops_at_a_failure():
    client = EndpointClient("http://127.0.0.1:9/v1", ClientLimits(concurrency=3))
    lock, running, peak = threading.Lock(), [0], [0]

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        if i == 5:
            raise client.error("boom", "test")
        return i

    assert client.map(work, range(5)) == list(range(5)) and peak[0] == 3
    with pytest.raises(EndpointError, match="boom"):
        client.map(work, range(12))


@pytest.mark.parametrize("url", ["ftp://h/v1", "http://user:pw@h/v1", "http:///v1", "http://h/v1?key=x", "", 3])
def test_bad_urls_are_refused(url):
    with pytest.raises(ConfigurationError):
        check_endpoint_url(url)


def test_url_is_normalised():
    assert check_endpoint_url(" http://Host:8000/v1/ ") == "http://host:8000/v1"


def test_chains_keep_rows_in_order_and_fill_the_concurrency():
    reqs = [Request(0, p + 1, (p,)) for p in range(6)] + [Request(1, p + 1, (p,)) for p in range(2)]
    got = chains(reqs, 4)
    assert [[r.positions[0] for r in c] for c in got] == [[0, 1, 2], [3, 4, 5], [0], [1]]
    assert chains(reqs, 1) == [reqs[:6], reqs[6:]]


def test_vllm_answer_is_read_by_token_id():
    """vLLM's documented completion with prompt_logprobs and return_tokens_as_token_ids."""
    doc = {"choices": [{"prompt_logprobs": [
        None,
        {"7": {"logprob": -0.1, "rank": 1}, "3": {"logprob": -2.5, "rank": 2}, "9": {"logprob": -9.0, "rank": 40}},
        {"4": {"logprob": -0.7, "rank": 1}, "2": {"logprob": -0.9, "rank": 2}}],
        "logprobs": {"top_logprobs": [{"token_id:5": -0.2, "token_id:8": -1.9}]}}]}
    client = EndpointClient("http://127.0.0.1:9/v1")
    got = read_vllm(client, doc, Request(0, 3, (0, 1, 2)), k=2)
    assert got[0].ids.tolist() == [7, 3] and got[1].ids.tolist() == [4, 2] and got[2].ids.tolist() == [5, 8]
    assert got[2].logprobs.tolist() == [-0.2, -1.9]
    with pytest.raises(EndpointError, match="prompt_logprobs"):
        read_vllm(client, {"choices": [{}]}, Request(0, 3, (0,)), k=2)


def test_topk_metrics_see_a_shift_and_a_flip():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(6, 50)) * 3
    ids, lp = top_of(ref, 5)
    same = topk_token_metrics(ref, ids, lp, [(0, i) for i in range(6)])
    assert same.kl_divergence["max"] < 1e-12 and same.top1_agreement == 1.0 and same.topk_overlap == 1.0
    assert same.delta_p["max_abs"] < 1e-12
    noisy = ref + rng.normal(size=ref.shape) * 0.05
    shifted = topk_token_metrics(ref, *top_of(noisy, 5), [(0, i) for i in range(6)])
    assert 1e-6 < shifted.kl_divergence["mean"] < 1e-2
    flipped = ref.copy()
    flipped[2, int(np.argsort(-ref[2])[1])] += 100.0  # the second token of position 2 wins
    flips = topk_token_metrics(ref, *top_of(flipped, 5), [(0, i) for i in range(6)]).flips
    assert [f.index for f in flips] == [(0, 2)] and flips[0].reference_token == int(np.argmax(ref[2]))


def test_a_served_row_is_its_own_sequence_so_the_reference_counts_its_windows_in_tokens():
    """Each row goes to the server as a request of its own: the engine declares ``window_counts:
    tokens`` and a reference prepared beside it follows (a right-padded Gemma row's decode steps)."""
    from debug_framework.backends.capabilities import capabilities, count_windows_as
    from debug_framework.backends.openai_server.backend import ServedBackend
    from debug_framework.backends.python_reference import PythonReferenceBackend

    served = ServedBackend("http://127.0.0.1:9/v1")
    assert capabilities(served).window_counts == "tokens"
    assert count_windows_as(PythonReferenceBackend(), served) == "tokens"
