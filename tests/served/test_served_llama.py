"""A model served by llama.cpp's ``llama-server`` (the xllamacpp wheel), validated by its tokens
against the Hugging Face model it was converted from, in float64: a correct GGUF passes at the
server's precision, a converter bug (a scaled tensor) fails, llama.cpp's float16 KV cache reads as
``consistent_with`` float16, a key-protected server works with the key and refuses without it (the
key nowhere in what is kept), an endpoint failing mid-run keeps what it answered, and every view
shows the served result. One tiny model and four servers per module, each started once."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest

from benchmarks.llama_server import serving
from debug_framework.cli import debug_validate

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = pytest.mark.slow  # four real llama-servers and a dozen validations (about 15 s together)

SECRET = "sk-served-test-5f3a9c-not-for-anyone"
KEY_VAR = "PIE_TEST_SERVED_KEY"  # the server reads its key from here; the client only from OPENAI_API_KEY


def _scaled_output(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """A converter bug: layer 1's attention output projection written twice too large."""
    return converted * 2.0 if name == "blk.1.attn_output.weight" else converted


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir) -> Iterator[dict[str, object]]:
    """The tiny model's HF directory and four servers: ``good`` (float32 throughout), ``bug`` (the
    scaled tensor, float32), ``f16kv`` (llama.cpp's defaults: float16 KV cache and flash attention),
    ``keyed`` (good, wanting the API key)."""
    from debug_framework.backends.llamacpp.convert import write_gguf

    root = tmp_path_factory.mktemp("served")
    hf = Path(tiny_llama_dir(root / "hf", vocab_size=96, max_positions=128, scale=0.3))
    good = write_gguf(hf, root / "good.gguf")
    bug = write_gguf(hf, root / "bug.gguf", transform=_scaled_output)
    with ExitStack() as stack:
        urls = {"good": stack.enter_context(serving(good)), "bug": stack.enter_context(serving(bug)),
                "f16kv": stack.enter_context(serving(good, f32=False)),
                "keyed": stack.enter_context(serving(good, api_key_from=KEY_VAR, env={KEY_VAR: SECRET}))}
        yield {"hf": hf, "db": root / "db.sqlite", **urls}


def _validate(served: dict[str, object], capsys: pytest.CaptureFixture[str], url: str, *args: str
              ) -> tuple[int, dict[str, object] | None, str]:
    code = debug_validate.run(["--model-path", str(served["hf"]), "--alternative-endpoint", url,
                               "--database", str(served["db"]), "--json", "--decode-steps", "2",
                               "--timeout", "60", *args])
    out = capsys.readouterr()
    doc = json.loads(out.out) if out.out.strip().startswith("{") else None
    return code, doc, out.out + out.err


def test_a_correct_conversion_passes_at_the_servers_precision(served, capsys):
    code, doc, text = _validate(served, capsys, str(served["good"]), "--dtype", "float32")
    assert code == 0, text
    assert doc["verdict"] == "passed" and doc["alternative_backend"] == "openai_server"
    assert [r["step"] for r in doc["results"]] == [0, 1, 2]
    assert all(r["judged_by"] == "calibration" and r["margin"] < 1 for r in doc["results"])
    tokens = doc["decode"]["token_metrics"]
    assert [t["step"] for t in tokens] == [0, 1, 2] and all(t["passed"] for t in tokens)
    assert tokens[0]["positions"] == 16 + 12  # 2 rows of 16 tokens, the second a quarter padded
    served_info = doc["decode"]["served"]
    assert served_info["protocol"] == "llama.cpp" and served_info["positions"] == served_info["asked"] == 32
    assert served_info["requests"] == 32 and not served_info["partial"]


def test_a_converter_bug_fails_at_the_first_position(served, capsys):
    code, doc, text = _validate(served, capsys, str(served["bug"]), "--dtype", "float32")
    assert code == 1, text
    first = doc["first_divergence"]
    assert first["checkpoint"] == "post_processing" and not first.get("step")
    assert doc["error_source"]["kind"] == "served" and str(served["bug"]) in doc["error_source"]["detail"]
    assert doc["results"][0]["judged_by"] == "token_metrics" and doc["results"][0]["margin"] > 100
    assert doc["consistent_with"] is None  # an error no lower precision explains


def test_llama_cpps_float16_kv_cache_is_consistent_with_float16(served, capsys):
    code, doc, text = _validate(served, capsys, str(served["f16kv"]), "--dtype", "float32")
    assert code == 1, text
    assert doc["consistent_with"] == "float16" and doc["precision_diagnosis"]["measured"] == ["float16", "bfloat16"]
    code, doc, text = _validate(served, capsys, str(served["f16kv"]), "--dtype", "float16",
                                "--decode-tokens", "5,9;7,7")
    assert code == 0, text  # judged at the precision it computes at, it is correct
    assert doc["decode"]["tokens"] == [[5, 9], [7, 7]] and doc["decode"]["tokens_from"] == "decode_tokens"


def test_a_dead_endpoint_is_exit_2_at_once(served, capsys):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # bound, not listening: refused
        started = time.monotonic()
        code, doc, text = _validate(served, capsys, url)
    assert code == 2 and time.monotonic() - started < 30
    assert doc["error"]["code"] == "DF005" and doc["error"]["context"]["cause"] == "connection refused"
    assert doc["error"]["context"]["endpoint"] == url


def test_the_api_key_works_and_is_never_kept(served, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, doc, text = _validate(served, capsys, str(served["keyed"]))
    assert code == 2 and "HTTP 401" in text and "OPENAI_API_KEY is not set" in text
    assert doc["error"]["code"] == "DF005" and doc["error"]["context"]["endpoint"] == str(served["keyed"])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    code, _, text = _validate(served, capsys, str(served["keyed"]))
    assert code == 2 and "was refused" in text and "sk-wrong" not in text
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    html = tmp_path / "report.html"
    code, doc, text = _validate(served, capsys, str(served["keyed"]), "--output-file", str(html))
    assert code == 0, text
    from debug_framework.storage.database import Database

    db = Database(str(served["db"]))
    kept = json.dumps([db.sessions.get(doc["session_id"]), db.checkpoints.for_session(doc["session_id"])], default=str)
    assert SECRET not in kept + text + html.read_text()
    assert str(served["keyed"]) in html.read_text() and 'id="served"' in html.read_text()


@pytest.fixture
def failing_after(served: dict[str, object], loopback_http) -> Callable[[int], str]:
    """``proxy(n) -> URL``: a real HTTP proxy to the good server that forwards its first ``n``
    requests and answers HTTP 500 to every one after (a server falling over mid-run)."""
    import httpx

    def proxy(n: int) -> str:
        count = iter(range(10 ** 6))
        target = str(served["good"]).removesuffix("/v1")

        def forward(request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
            if next(count) >= n:
                return 500, b'{"error": "the server fell over"}'
            answer = httpx.request(request.command, target + request.path, content=body or None,
                                   headers={"Content-Type": "application/json"}, timeout=30)
            return answer.status_code, answer.content

        return loopback_http(forward)

    return proxy


def test_an_endpoint_failing_mid_run_keeps_what_it_answered(served, capsys, failing_after):
    from debug_framework.storage.database import Database

    # one request at a time: /models, row 0's 16 prompt positions and 2 steps, row 1's 12 prompt
    # positions; then the server fails: the prompt (step 0) is answered whole, the steps are not
    url = failing_after(1 + 18 + 12)
    code, doc, text = _validate(served, capsys, url, "--concurrency", "1", "--backend-option", "retries=1")
    assert code == 2 and "HTTP 500" in text and url in text and "after 1 retry" in text
    db = Database(str(served["db"]))
    session = db.sessions.list(limit=1)[0]
    rows = db.checkpoints.for_session(session["session_id"])
    assert session["status"] == "error" and [(r["checkpoint"], r["step"]) for r in rows] == [("post_processing", 0)]
    assert rows[0]["passed"]


def test_every_view_shows_the_served_result(served, capsys, tmp_path):
    from debug_framework.cli import session_report

    code = debug_validate.run(["--model-path", str(served["hf"]), "--alternative-endpoint", str(served["bug"]),
                               "--database", str(served["db"]), "--decode-steps", "1"])
    text = capsys.readouterr()
    terminal = " ".join((text.out + text.err).split())
    assert code == 1 and "source: the served model" in terminal and f"served: {served['bug']}" in terminal
    assert "first divergence at post_processing@0" in terminal
    sid = terminal.split("session ")[-1].split()[0]
    out = tmp_path / "report.html"
    assert session_report.main(["--session-id", sid, "--database", str(served["db"]), "-f", "html",
                               "--output-file", str(out)]) == 0
    page = out.read_text()
    assert "the served model" in page and f"served: {served['bug']}" in page and "KL mean" in page
    assert session_report.main(["--session-id", sid, "--database", str(served["db"])]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["session"]["results"]["decode"]["served"]["url"] == str(served["bug"])
    assert stored["verdict"] == "failed" and stored["first_divergence"]["id"] == "post_processing@0"
    assert stored["performance_metrics"]["alternative"]["requests"] == 28 + 2
