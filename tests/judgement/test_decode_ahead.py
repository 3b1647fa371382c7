"""Decode at engine speed (issue 47): the reference's passes computed ahead in a worker thread, a
backend's failure there raised at its step; a long prefill's eager attention a block of query rows
at a time (the same arithmetic, a fraction of the scores held); the calibration's last-position cut of
a tensor of flattened tokens (a router's logits)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from debug_framework.backends import get_backend
from debug_framework.backends.capabilities import capabilities
from debug_framework.backends.decode import DecodePass
from debug_framework.capture.keys import Capture
from debug_framework.errors import BackendRuntimeError
from debug_framework.services.validation import decode_stage
from debug_framework.services.validation.decode_ahead import AHEAD, PassesAhead

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("SEEN", default="unset")


def _pass(step: int) -> DecodePass:
    return DecodePass(step, Capture(tensors={}, backend="b", dtype="float64"), {}, {}, np.ones((1, 1), np.int64))


def _stream(steps: int, fail_at: int | None, log: list[tuple[int, str, str]], closed: list[bool]) -> Iterator[DecodePass]:
    try:
        for s in range(steps + 1):
            if s == fail_at:
                raise BackendRuntimeError("the engine broke", backend="b", call=f"run_decode() step {s}")
            log.append((s, threading.current_thread().name, SEEN.get()))
            yield _pass(s)
    finally:
        closed.append(True)


def _take(stream: Iterator[DecodePass], step: int) -> DecodePass:
    got = next(stream, None)
    assert got is not None and got.step == step
    return got


def test_passes_come_in_order_from_a_worker_in_the_callers_context():
    log: list[tuple[int, str, str]] = []
    closed: list[bool] = []
    token = SEEN.set("the session's")
    try:
        ahead = PassesAhead(_stream(5, None, log, closed), 5, _take, "ref")
        steps = [ahead.next().step for _ in range(6)]
        ahead.close()
    finally:
        SEEN.reset(token)
    assert steps == list(range(6))
    assert {name for _, name, _ in log} == {"decode-ahead-ref"}  # every pass computed off this thread
    assert {seen for _, _, seen in log} == {"the session's"}  # in a copy of the caller's context
    assert closed == [True]


def test_a_failure_in_the_worker_is_raised_at_its_step_after_the_passes_before_it():
    log: list[tuple[int, str, str]] = []
    ahead = PassesAhead(_stream(6, 3, log, []), 6, _take, "ref")
    assert [ahead.next().step for _ in range(3)] == [0, 1, 2]
    with pytest.raises(BackendRuntimeError, match="step 3"):
        ahead.next()
    ahead.close()


def test_close_stops_a_worker_waiting_with_passes_ahead_and_closes_the_decode():
    log: list[tuple[int, str, str]] = []
    closed: list[bool] = []
    ahead = PassesAhead(_stream(1000, None, log, closed), 1000, _take, "ref")
    assert ahead.next().step == 0
    deadline = threading.Event()
    while len(log) < 1 + AHEAD and not deadline.wait(0.01):
        pass
    ahead.close()
    assert len(log) <= 2 + AHEAD  # it waited with AHEAD passes queued, never ran to the end
    assert closed == [True] and not ahead._thread.is_alive()


def test_a_session_decodes_its_reference_ahead_and_judges_as_it_would_in_turn(tiny_models, engine, monkeypatch):
    """The built-in references declare decode_ahead; a session run with the reference in a worker
    gives the same tokens, steps and verdicts as one that runs it in turn."""
    assert capabilities(get_backend("float64_eager")).decode_ahead
    assert capabilities(get_backend("python_reference")).decode_ahead
    cfg = {"decode_steps": 4, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 6], "pad_lengths": [0, 2]}
    threads: set[str] = set()
    real = decode_stage.DecodeStage._next

    def spy(backend, stream, step):  # noqa: ANN001, ANN202 - the stage's static method, watched
        threads.add(threading.current_thread().name)
        return real(backend, stream, step)

    monkeypatch.setattr(decode_stage.DecodeStage, "_next", staticmethod(spy))
    ahead = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert "decode-ahead-float64_eager" in threads
    monkeypatch.setattr(decode_stage, "capabilities", lambda b: capabilities(b).with_(decode_ahead=False))
    threads.clear()
    in_turn = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert threads == {threading.main_thread().name}
    assert ahead.passed and in_turn.passed
    assert ahead.decoded.info["tokens"] == in_turn.decoded.info["tokens"]
    assert [(r.key, r.step, r.comparison.max_abs_error, r.judgement.passed) for r in ahead.results] == \
        [(r.key, r.step, r.comparison.max_abs_error, r.judgement.passed) for r in in_turn.results]


def test_eager_attention_in_blocks_of_query_rows_is_the_same_computation(tiny_models, monkeypatch):
    """A padded prefill longer than a block: every checkpoint what eager attention computes at once
    (to a rounding of the products), and the reference says how it ran."""
    from debug_framework.backends import _attention_rows
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model

    monkeypatch.setattr(_attention_rows, "QUERY_ROWS", 3)
    model = load_model(tiny_models("llama", 0))
    ids = np.arange(2 * 10, dtype=np.int64).reshape(2, 10) % 50
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    inputs = ModelInputs(input_ids=ids, attention_mask=mask)
    runs = {}
    for blocks in (True, False):
        backend = get_backend("float64_eager")
        if not blocks:
            monkeypatch.setattr("debug_framework.backends.eager_reference.attention_in_row_blocks", lambda m: False)
        backend.prepare(model, "float32")
        assert backend.row_blocks is blocks
        assert ("query rows at a time" in backend.version_info()["attention"]) is blocks
        runs[blocks] = backend.run(inputs)
    assert runs[True].tensors.keys() == runs[False].tensors.keys()
    for key, value in runs[False].tensors.items():
        a, b = torch.as_tensor(runs[True].tensors[key]), torch.as_tensor(value)
        # the same arithmetic per row: products over fewer rows may take another kernel, a rounding apart
        assert float((a - b).abs().max()) <= 4 * torch.finfo(torch.float32).eps * float(b.abs().max()), key


def test_the_calibrations_last_position_of_flattened_tokens_is_each_rows_last_token():
    from debug_framework.services.validation.decode_calibration import _last_position

    logits = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2 * 5, 3)  # [batch * tokens, experts]
    assert torch.equal(_last_position(logits, 2), logits.reshape(2, 5, 3)[:, -1])
    hidden = torch.arange(2 * 5 * 4, dtype=torch.float32).reshape(2, 5, 4)
    assert torch.equal(_last_position(hidden, 2), hidden[:, -1:])


def test_the_from_math_reference_converts_each_layer_once_for_a_whole_decode(tiny_models):
    """A streamed reference holds its converted layers and LM head while it decodes (they were
    converted again at every step) and streams again afterwards."""
    from debug_framework.backends.decode import collect_run
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model

    backend = get_backend("python_reference")
    backend.prepare(load_model(tiny_models("llama", 0)), "float64")
    net = backend.reference
    assert net.layers.keep == 1 and not net.params.resident  # streamed
    ids = np.arange(12, dtype=np.int64).reshape(2, 6) % 50
    before = net.layers.conversions
    run = collect_run(backend.iter_decode(ModelInputs(input_ids=ids, attention_mask=np.ones_like(ids)), 4), 4)
    assert len(run.captures) == 5
    assert net.layers.conversions - before == len(net.layers)  # once each, not once per pass
    assert net.layers.keep == 1 and len(net.layers.resident_layers()) == 1 and not net.params._values
