"""The reference's decode run ahead in a child process (services/validation/decode_ahead.py): a
pass crosses as bytes unchanged, a session judged with the child is the session judged without it,
and a child that fails or dies is taken over (a reference's own error still reads as its own)."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from debug_framework.backends import register_backend, unregister_backend
from debug_framework.backends.decode import DecodePass
from debug_framework.backends.eager_reference import EagerReferenceBackend
from debug_framework.capture.keys import Capture, CheckpointKey
from debug_framework.errors import BackendRuntimeError
from debug_framework.services.validation import decode_ahead
from debug_framework.services.validation.decode_ahead import ahead_support, receive_pass, send_pass

STEPS = 6
CONFIG = {"decode_steps": STEPS, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 5]}
needs_two = pytest.mark.skipif(not ahead_support(True, STEPS, "cpu")[0],
                               reason=f"no child process here: {ahead_support(True, STEPS, 'cpu')[1]}")


def test_a_pass_crosses_as_bytes_unchanged():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    p = DecodePass(
        step=7,
        capture=Capture(tensors={CheckpointKey("post_attention", 1): x[:, -1:],  # a view: sent as its own copy
                                 CheckpointKey("post_processing"): torch.randn(2, 1, 9, generator=g).bfloat16(),
                                 CheckpointKey("post_mlp", 0): np.arange(6, dtype=np.float32).reshape(2, 3),
                                 CheckpointKey("post_embedding"): torch.empty(2, 0, 4, dtype=torch.float16),
                                 CheckpointKey("post_mlp", 1): np.array(3.5)},  # 0-d: its shape kept
                        backend="float64_eager", dtype="float64", elapsed_s=0.25,
                        layer_inputs={0: x}, meta={"nested": {"a": [1, 2.5, None]}, "nan": float("nan")}),
        kv={0: (x, x * 2), 3: (np.ones((2, 2, 1, 4)), np.zeros((2, 2, 1, 4)))},
        span={0: "new", 3: "audit"},
        mask=np.array([[0, 1, 1], [1, 1, 1]], np.int64),
        token=np.array([5, 9], np.int64))
    got = _crossed(p)
    assert (got.step, got.span, got.capture.backend, got.capture.dtype, got.capture.elapsed_s) == \
        (7, p.span, "float64_eager", "float64", 0.25)
    assert list(got.capture.tensors) == list(p.capture.tensors)  # the order of execution kept
    assert got.capture.meta["nested"] == {"a": [1, 2.5, None]} and np.isnan(got.capture.meta["nan"])
    for key, want in p.capture.tensors.items():
        have = got.capture.tensors[key]
        assert type(have) is type(want) and have.dtype == want.dtype and tuple(have.shape) == tuple(want.shape)
        assert np.array_equal(np.asarray(torch.as_tensor(have).float()), np.asarray(torch.as_tensor(want).float()))
    assert torch.equal(got.capture.layer_inputs[0], x) and torch.equal(got.kv[0][1], x * 2)
    assert np.array_equal(got.kv[3][0], np.ones((2, 2, 1, 4)))
    assert np.array_equal(got.mask, p.mask) and got.mask.dtype == np.int64 and np.array_equal(got.token, p.token)
    got.kv[0][0].add_(1)  # writable, and its own memory
    assert not torch.equal(got.kv[0][0], x)
    assert _crossed(DecodePass(0, Capture(), {}, {}, np.zeros((2, 5), np.int64))).token is None


def _crossed(p: DecodePass) -> DecodePass:
    """``p`` sent through a pipe and received (as the child and the session's process do)."""
    theirs, ours = decode_ahead._channel()
    send_pass(ours, p)
    got = receive_pass(json.loads(theirs.recv_bytes()), theirs)
    assert not theirs.poll(0)  # every message read: nothing left over for the next pass
    return got


def _rows(result):
    decode = result.summary()["decode"]
    kv = [(r["step"], r["layer"], r["k"]["rmse"], r["v"]["rmse"]) for r in decode["kv_cache"]]
    tokens = [(r["step"], r["top1_agreement"]) for r in decode["token_metrics"]]
    return decode, kv, tokens


@needs_two
def test_a_session_with_the_child_is_the_session_without_it(tiny_models, engine, monkeypatch):
    path = tiny_models("llama")
    ahead = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    monkeypatch.setattr(decode_ahead, "AHEAD_MIN_STEPS", 10**6)
    here = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    (d1, kv1, t1), (d2, kv2, t2) = _rows(ahead), _rows(here)
    assert d1["reference_process"]["ahead"] is True and d1["reference_process"]["taken_over_at"] is None
    assert d1["reference_process"]["peak_rss_bytes"] > 0
    assert d2["reference_process"] == {"ahead": False, "why": f"fewer than {10**6} decode steps"}
    assert ahead.passed and here.passed and d1["tokens"] == d2["tokens"] and t1 == t2
    # the calibration's sampled prefills ran in the child and judged as those run here
    assert d1["reference_process"]["calibration_passes"] == len(d1["calibration_noise"]["sampled_steps"]) > 0
    assert [r["calibration"] for r in d1["token_metrics"]] == [r["calibration"] for r in d2["token_metrics"]]
    assert [r["k"]["noise_rmse"] for r in d1["kv_cache"]] == pytest.approx([r["k"]["noise_rmse"] for r in d2["kv_cache"]])
    assert [r[:2] for r in kv1] == [r[:2] for r in kv2]
    assert np.allclose([r[2:] for r in kv1], [r[2:] for r in kv2], rtol=1e-6, atol=0)


class _FailsAtStep3(EagerReferenceBackend):
    """``float64_eager`` whose decode raises at step 3: in its child process only (``child_only``),
    or wherever it runs."""

    decode_ahead = True  # a subclass declares it anew
    child_only = True
    parent = os.getpid()

    def iter_decode(self, *args, **kwargs):
        for p in super().iter_decode(*args, **kwargs):
            if p.step == 3 and (not self.child_only or os.getpid() != self.parent):
                raise RuntimeError("the reference broke at step 3")
            yield p


class _DiesAtStep2(EagerReferenceBackend):
    """``float64_eager`` whose child process is killed at step 2 (nothing said to the parent)."""

    decode_ahead = True
    parent = os.getpid()

    def iter_decode(self, *args, **kwargs):
        for p in super().iter_decode(*args, **kwargs):
            if p.step == 2 and os.getpid() != self.parent:
                os.kill(os.getpid(), signal.SIGKILL)
            yield p


@needs_two
@pytest.mark.parametrize("cls, at, said", [(_FailsAtStep3, 3, "RuntimeError: the reference broke at step 3"),
                                           (_DiesAtStep2, 2, "ended without a word")])
def test_a_child_that_fails_is_taken_over_at_its_step(tiny_models, engine, cls, at, said):
    register_backend("ahead_ref", cls, replace=True)
    try:
        result = engine.run(engine.create_session(tiny_models("llama"), CONFIG, "ahead_ref", "pytorch"))
    finally:
        unregister_backend("ahead_ref")
    record = result.summary()["decode"]["reference_process"]
    assert record["ahead"] is True and record["taken_over_at"] == at and said in record["child_error"]
    assert result.passed and len(result.summary()["decode"]["tokens"][0]) == STEPS  # every step judged


@needs_two
def test_a_references_own_error_still_reads_as_its_own(tiny_models, engine, monkeypatch):
    monkeypatch.setattr(_FailsAtStep3, "child_only", False)
    register_backend("ahead_ref", _FailsAtStep3, replace=True)
    try:
        with pytest.raises(BackendRuntimeError, match="the reference broke at step 3") as raised:
            engine.run(engine.create_session(tiny_models("llama"), CONFIG, "ahead_ref", "pytorch"))
    finally:
        unregister_backend("ahead_ref")
    assert raised.value.code == "DF005" and "step 3" in str(raised.value)


class _StuckAtStep2(EagerReferenceBackend):
    """``float64_eager`` whose child process waits for ever at step 2 (a lock held across the fork
    would look the same: alive, no CPU used)."""

    decode_ahead = True
    parent = os.getpid()

    def iter_decode(self, *args, **kwargs):
        for p in super().iter_decode(*args, **kwargs):
            if p.step == 2 and os.getpid() != self.parent:
                time.sleep(3600)
            yield p


class _OtherTokensInTheChild(EagerReferenceBackend):
    """``float64_eager`` whose child reports another token at step 1 than it runs here, then fails
    at step 3: the decode taken over here would go on from another token history."""

    decode_ahead = True
    parent = os.getpid()

    def iter_decode(self, *args, **kwargs):
        for p in super().iter_decode(*args, **kwargs):
            if os.getpid() != self.parent:
                if p.step == 1:
                    p.token = (np.asarray(p.token) + 1) % 64
                if p.step == 3:
                    raise RuntimeError("the reference broke at step 3")
            yield p


@needs_two
def test_a_stuck_child_is_taken_over_and_a_changed_token_history_is_refused(tiny_models, engine, monkeypatch):
    monkeypatch.setattr(decode_ahead, "_STUCK_S", 1.0)
    register_backend("ahead_ref", _StuckAtStep2, replace=True)
    try:
        result = engine.run(engine.create_session(tiny_models("llama"), CONFIG, "ahead_ref", "pytorch"))
        record = result.summary()["decode"]["reference_process"]
        assert record["taken_over_at"] == 2 and "stuck" in record["child_error"] and result.passed
        register_backend("ahead_ref", _OtherTokensInTheChild, replace=True)
        cfg = {**CONFIG, "calibrate": False}
        with pytest.raises(BackendRuntimeError, match="chose other tokens at decode step 1"):
            engine.run(engine.create_session(tiny_models("llama"), cfg, "ahead_ref", "pytorch"))
    finally:
        unregister_backend("ahead_ref")


@needs_two
def test_a_failed_fork_runs_the_reference_here(tiny_models, engine, monkeypatch):
    import multiprocessing.process

    def no_fork(self):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", no_fork)
    result = engine.run(engine.create_session(tiny_models("llama"), CONFIG, "float64_eager", "pytorch"))
    record = result.summary()["decode"]["reference_process"]
    assert result.passed and record["ahead"] is False and "the fork failed (OSError" in record["why"]


def test_only_a_class_that_declares_it_runs_ahead():
    from debug_framework.backends.capabilities import capabilities

    class Inherits(EagerReferenceBackend):
        pass
    assert capabilities(EagerReferenceBackend()).decode_ahead and not capabilities(Inherits()).decode_ahead


def test_a_pass_crosses_in_one_writev_and_survives_partial_writes_and_reads(monkeypatch):
    """The header and every tensor go in one ``writev``; where the pipe takes or gives a few bytes
    at a time, the rest follows from the first byte not moved (a pass larger than the pipe, from a
    thread, the same way)."""
    import threading

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    p = DecodePass(step=2, capture=Capture(tensors={CheckpointKey("post_mlp", 0): x,
                                                    CheckpointKey("post_processing"): x.half()}),
                   kv={0: (x, x + 1)}, span={0: "new"}, mask=np.ones((3, 2), np.int64), token=np.array([1, 2, 3]))
    writes = []
    writev, readv = os.writev, os.readv
    monkeypatch.setattr(decode_ahead.os, "writev", lambda fd, bufs: writes.append(len(bufs)) or writev(fd, bufs))
    got = _crossed(p)
    assert writes == [2 + len(p.capture.tensors) + 2 + 2]  # length, header, 4 tensors, mask, token
    assert torch.equal(got.capture.tensors[CheckpointKey("post_mlp", 0)], x) and torch.equal(got.kv[0][1], x + 1)

    def trickle(call):  # at most 7 bytes of the first buffer per call
        return lambda fd, bufs: call(fd, [bufs[0][:7]])
    monkeypatch.setattr(decode_ahead.os, "writev", trickle(writev))
    monkeypatch.setattr(decode_ahead.os, "readv", trickle(readv))
    got = _crossed(p)
    assert torch.equal(got.capture.tensors[CheckpointKey("post_processing")], x.half())
    assert np.array_equal(got.token, p.token) and np.array_equal(got.mask, p.mask)

    monkeypatch.setattr(decode_ahead.os, "writev", writev)
    monkeypatch.setattr(decode_ahead.os, "readv", readv)
    big = torch.randn(2, 300_000, generator=g, dtype=torch.float64)  # 4.8 MB: more than the pipe holds
    theirs, ours = decode_ahead._channel()
    sender = threading.Thread(target=send_pass, args=(ours, replace(p, kv={0: (big, big * 2)})))
    sender.start()
    got = receive_pass(json.loads(theirs.recv_bytes()), theirs)
    sender.join()
    assert torch.equal(got.kv[0][0], big) and torch.equal(got.kv[0][1], big * 2) and not theirs.poll(0)


@needs_two
def test_a_calibration_the_child_cannot_compute_is_computed_here(tiny_models, engine, monkeypatch):
    """What the child computes beside its passes fails: nothing sent, the session computes it itself."""
    from debug_framework.services.validation import decode_stage

    def broken(*_args):
        def at(p):
            raise RuntimeError("the calibration broke in the child")
        return at
    monkeypatch.setattr(decode_stage, "beside_calibration", broken)
    result = engine.run(engine.create_session(tiny_models("llama"), CONFIG, "float64_eager", "pytorch"))
    decode = result.summary()["decode"]
    assert result.passed and decode["reference_process"]["calibration_passes"] == 0
    assert decode["reference_process"]["taken_over_at"] is None
    assert all(r["calibration"] is not None for r in decode["token_metrics"])


def test_a_closed_channel_refuses_io():
    """After close its descriptor's number may be another file's: no read or write goes through."""
    reads, writes = decode_ahead._channel()
    writes.close()
    reads.close()
    with pytest.raises(ValueError):
        writes.send_bytes(b"x")
    with pytest.raises(ValueError):
        reads.recv_into([memoryview(bytearray(1))])
