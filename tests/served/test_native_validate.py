"""``debug_validate --alternative-endpoint`` against test servers speaking SGLang's and TGI's native
``/generate`` (the documented shapes; the real SGLang and TGI are not run in CI), which compute their
answers with the tiny Hugging Face model itself: a correct server passes (SGLang by ids, TGI by the
text of every prefix), one whose logits are off fails at the prompt, and TGI for a model without a
tokenizer is DF005 (exit 2), not a failed validation."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from debug_framework.cli import debug_validate
from debug_framework.comparison.topk import log_softmax
from debug_framework.jsonio import JsonObject

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

#: a loopback server's answer (conftest's ``loopback_http``): ``(request, body) -> (status, bytes)``
Answer = Callable[[object, bytes], "tuple[int, bytes]"]

pytestmark = pytest.mark.slow  # a tiny model and four validations (a few seconds together)


def _word_tokenizer() -> Tokenizer:
    """64 words ``w0`` .. ``w63``, no special token: every sequence of ids is a text."""
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _json_answer(answer: Callable[[str, JsonObject], object]) -> Answer:
    """``answer(path, body)`` as a loopback server's answer: its result as JSON (GET: an empty body)."""
    return lambda request, body: (200, json.dumps(answer(request.path, json.loads(body or b"{}"))).encode())


def _tgi_server(logits_of: Callable[[list[int]], np.ndarray], tokenizer: Tokenizer) -> Answer:
    """TGI's /v1/models (owned_by the model id), /info (its router) and native /generate (text in,
    tokenized with the served tokenizer; details.prefill and top_tokens out)."""

    def answer(path: str, body: JsonObject) -> object:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": "org/tiny", "object": "model", "owned_by": "org/tiny"}]}
        if path == "/info":
            return {"model_id": "org/tiny", "router": "text-generation-router"}
        ids = tokenizer.encode(body["inputs"], add_special_tokens=True).ids
        lp = log_softmax(logits_of(ids))[-1]
        top = [{"id": int(t), "text": f"w{t}", "logprob": float(lp[t]), "special": False}
               for t in np.argsort(-lp)[:body["parameters"]["top_n_tokens"]]]
        return {"generated_text": top[0]["text"], "details": {
            "finish_reason": "length", "generated_tokens": 1, "seed": None, "tokens": [top[0]], "top_tokens": [top],
            "prefill": [{"id": t, "text": f"w{t}", "logprob": None} for t in ids]}}

    return _json_answer(answer)


def _sglang_server(logits_of: Callable[[list[int]], np.ndarray]) -> Answer:
    """SGLang's /v1/models and native /generate (input_ids in; meta_info's [logprob, id, text] triples out)."""

    def answer(path: str, body: JsonObject) -> object:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "sglang"}]}
        ids, k = body["input_ids"], body["top_logprobs_num"]
        lp = log_softmax(logits_of(ids))  # [len(ids), vocab]: row i predicts token i + 1
        tops = [[[float(row[t]), int(t), None] for t in np.argsort(-row)[:k]] for row in lp]
        return {"text": "", "meta_info": {
            "prompt_tokens": len(ids), "input_token_logprobs": [[None, ids[0], None]] +
            [[float(lp[i - 1, t]), t, None] for i, t in enumerate(ids) if i],
            "input_top_logprobs": [None, *tops[:-1]], "output_top_logprobs": [tops[-1]],
            "output_token_logprobs": [tops[-1][0]]}}

    return _json_answer(answer)


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory, loopback_http, tiny_llama_dir) -> dict[str, str]:
    """The tiny model's directory (without a tokenizer) and a copy with one, and test servers computing
    with it in float64: SGLang ``good`` and ``off`` (its logits 1.5 times too large, as a wrong softmax
    scale would make them), and ``tgi``."""
    import torch
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("sglang")
    hf = Path(tiny_llama_dir(root / "hf"))
    with_tokenizer = root / "hf-tok"
    shutil.copytree(hf, with_tokenizer)
    _word_tokenizer().save(str(with_tokenizer / "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(str(hf), torch_dtype=torch.float64).eval()
    lock = threading.Lock()

    def logits(ids: list[int], scale: float) -> np.ndarray:
        with lock, torch.no_grad():
            return model(torch.tensor([ids])).logits[0].numpy() * scale

    answers = [_sglang_server(lambda ids: logits(ids, 1.0)), _sglang_server(lambda ids: logits(ids, 1.5)),
               _tgi_server(lambda ids: logits(ids, 1.0), _word_tokenizer())]
    return {"hf": str(hf), "hf-tok": str(with_tokenizer), "db": str(root / "db.sqlite"),
            **{name: loopback_http(a) for name, a in zip(("good", "off", "tgi"), answers)}}


def _validate(sglang: dict[str, str], capsys: pytest.CaptureFixture[str], url: str, *args: str,
              model: str = "hf") -> tuple[int, dict]:
    code = debug_validate.run(["--model-path", sglang[model], "--alternative-endpoint", url, "--database",
                               sglang["db"], "--json", "--decode-steps", "1", "--dtype", "float32", *args])
    return code, json.loads(capsys.readouterr().out)


def test_a_correct_sglang_server_passes(sglang, capsys):
    code, doc = _validate(sglang, capsys, sglang["good"])
    assert code == 0 and doc["verdict"] == "passed", doc
    served = doc["decode"]["served"]
    assert served["protocol"] == "sglang" and served["positions"] == served["asked"] > 0
    assert served["requests"] == len(doc["decode"]["tokens"])  # one per row: the prompt and the step at once


def test_an_sglang_server_with_its_logits_off_fails_at_the_prompt(sglang, capsys):
    code, doc = _validate(sglang, capsys, sglang["off"], "--backend-option", "protocol=sglang")
    assert code == 1 and doc["first_divergence"]["checkpoint"] == "post_processing", doc
    assert doc["error_source"]["kind"] == "served"


def test_a_correct_tgi_server_passes_asked_in_text(sglang, capsys):
    code, doc = _validate(sglang, capsys, sglang["tgi"], model="hf-tok")
    assert code == 0 and doc["verdict"] == "passed", doc
    served = doc["decode"]["served"]
    assert served["protocol"] == "tgi" and served["positions"] == served["asked"] == served["requests"] > 0


def test_tgi_for_a_model_without_a_tokenizer_is_df005(sglang, capsys):
    code, doc = _validate(sglang, capsys, sglang["good"], "--backend-option", "protocol=tgi")
    assert code == 2 and doc["error"]["code"] == "DF005" and "tokenizer.json" in doc["error"]["message"]
