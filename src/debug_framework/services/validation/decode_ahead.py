"""The reference's decode run ahead in a child process (docs/validation.md, "Decode steps").

The reference of a greedy decode leads: its step ``s`` needs only its own token of step ``s - 1``,
never anything of the alternative's. Its passes can therefore be computed ahead while this process
runs the alternative's pass and judges the step before: :func:`decode_ahead` forks the process once
the reference is prepared (its weights, held conversions and code shared copy-on-write, nothing
loaded again), the child drives the reference's own decode stream and sends each
:class:`~debug_framework.backends.decode.DecodePass` back as it comes; :class:`AheadStream` is the
stream this process reads, the same passes in the same order. The two processes then share the
machine's cores: per step, the slower of the reference's pass and the rest (the alternative's pass
and the judgement) sets the pace instead of their sum.

Used only where it can hold (:func:`ahead_support`): a reference that declares
``capabilities.decode_ahead`` (an in-process computation on the CPU: a fork breaks device contexts,
server connections and engine threads), a platform with ``fork``, at least two CPUs for this
process, at least :data:`AHEAD_MIN_STEPS` steps. The child runs one intra-op thread; this process one
fewer than it had during the decode (restored after).

A pass crosses as bytes, never a pickle: one JSON header (checkpoint keys, dtypes, shapes, offsets)
and the tensors' raw bytes (:func:`encode_pass`, :func:`decode_pass`). Where the child fails (the
reference raised, or the child died), this process opens the reference's stream itself, runs it to
the step the child reached and goes on in process: a reference's error is raised here as the
reference's own, and a lost child costs time, never a verdict.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ...backends.decode import DecodePass
from ...capture.keys import Capture, CapturedTensor, CheckpointKey
from ...jsonio import JsonObject

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

__all__ = ["AheadStream", "decode_ahead", "ahead_support", "encode_pass", "decode_pass", "AHEAD_MIN_STEPS"]

#: the fewest decode steps for which a child is started (below it the fork costs more than it saves)
AHEAD_MIN_STEPS = 4
#: how often (seconds) a wait for the child's next pass returns to Python, so that the session's
#: time limit (``deadline.bounded``) can interrupt it
_POLL_S = 0.25
_HEADER = struct.Struct("<I")
#: how long a finished decode waits for the child's last word (its peak memory) before stopping it
_END_WAIT_S = 5.0


def ahead_support(declared: bool, steps: int, device: str) -> tuple[bool, str]:
    """Whether a reference's decode runs ahead in a child process, and why not where it does not."""
    if not declared:
        return False, "the reference does not declare decode_ahead"
    if device != "cpu":
        return False, f"the reference runs on {device}"
    if not hasattr(os, "fork"):
        return False, "this platform has no fork"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 2:
        return False, "this process may use one CPU only"
    if steps < AHEAD_MIN_STEPS:
        return False, f"fewer than {AHEAD_MIN_STEPS} decode steps"
    return True, ""


# -- the wire format -------------------------------------------------------------------------------
def _tensor_bytes(t: CapturedTensor) -> tuple[JsonObject, memoryview]:
    """One tensor's header entry (library, dtype, shape) and its bytes (a contiguous host copy)."""
    if isinstance(t, np.ndarray):
        a = np.ascontiguousarray(t)
        return {"lib": "numpy", "dtype": a.dtype.str, "shape": list(a.shape)}, _raw(a)
    import torch

    x = t.detach().to("cpu").contiguous()
    name = str(x.dtype).removeprefix("torch.")
    if x.dtype in (torch.bfloat16, torch.float16):  # bfloat16 has no NumPy dtype: its bits as int16
        raw = x.view(torch.int16).numpy()
    else:
        raw = x.numpy()
    return {"lib": "torch", "dtype": name, "shape": list(x.shape)}, _raw(raw)


def _raw(a: np.ndarray) -> memoryview:
    """An array's bytes, in order (empty arrays too)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def encode_pass(p: DecodePass) -> bytes:
    """One pass as bytes: a 4-byte header length, the JSON header, then every tensor's bytes."""
    entries: list[JsonObject] = []
    chunks: list[memoryview] = []
    offset = 0

    def put(t: CapturedTensor) -> int:
        nonlocal offset
        head, data = _tensor_bytes(t)
        head.update(offset=offset, nbytes=data.nbytes)
        entries.append(head)
        chunks.append(data)
        offset += data.nbytes
        return len(entries) - 1
    c = p.capture
    header: JsonObject = {
        "step": p.step,
        "capture": {"backend": c.backend, "dtype": c.dtype, "elapsed_s": c.elapsed_s, "meta": c.meta,
                    "tensors": [[k.name, k.layer, put(t)] for k, t in c.tensors.items()],
                    "layer_inputs": [[layer, put(t)] for layer, t in c.layer_inputs.items()]},
        "kv": [[layer, put(k), put(v)] for layer, (k, v) in p.kv.items()],
        "span": [[layer, span] for layer, span in p.span.items()],
        "mask": put(p.mask),
        "token": None if p.token is None else put(p.token),
    }
    header["tensors"] = entries
    text = json.dumps(header).encode()
    return b"".join([_HEADER.pack(len(text)), text, *chunks])


def _tensor_from(entry: JsonObject, body: bytearray) -> CapturedTensor:
    shape = tuple(int(n) for n in entry["shape"])  # type: ignore[union-attr]
    start, size = int(entry["offset"]), int(entry["nbytes"])  # type: ignore[arg-type]
    if entry["lib"] == "numpy":
        dt = np.dtype(str(entry["dtype"]))
        return np.frombuffer(body, dt, size // dt.itemsize if dt.itemsize else 0, start).reshape(shape)
    import torch

    dtype = getattr(torch, str(entry["dtype"]))
    stored = torch.int16 if dtype in (torch.bfloat16, torch.float16) else dtype
    if not size:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(body, dtype=stored, count=size // stored.itemsize, offset=start)
    return (flat.view(dtype) if stored is not dtype else flat).reshape(shape)


def decode_pass(message: bytes) -> DecodePass:
    """The pass :func:`encode_pass` wrote (its tensors views of one writable copy of ``message``)."""
    (n,) = _HEADER.unpack_from(message, 0)
    header = json.loads(message[_HEADER.size:_HEADER.size + n])
    body = bytearray(memoryview(message)[_HEADER.size + n:])
    entries = header["tensors"]

    def get(i: int) -> CapturedTensor:
        return _tensor_from(entries[i], body)
    c = header["capture"]
    capture = Capture(tensors={CheckpointKey(name, layer): get(i) for name, layer, i in c["tensors"]},
                      backend=c["backend"], dtype=c["dtype"], elapsed_s=float(c["elapsed_s"]),
                      layer_inputs={int(layer): get(i) for layer, i in c["layer_inputs"]}, meta=c["meta"])
    return DecodePass(step=int(header["step"]), capture=capture,
                      kv={int(layer): (get(k), get(v)) for layer, k, v in header["kv"]},
                      span={int(layer): str(span) for layer, span in header["span"]},
                      mask=np.asarray(get(header["mask"])),
                      token=None if header["token"] is None else np.asarray(get(header["token"])))


# -- the child and the stream this process reads ----------------------------------------------------
def _serve(open_stream: Callable[[], Iterator[DecodePass]], conn: Connection) -> None:
    """The child: the reference's decode, each pass sent as it comes; then ``end``, or ``error``
    with the step it failed at (what this process needs to take over)."""
    import torch

    torch.set_num_threads(1)
    step = 0
    try:
        for p in open_stream():
            step = p.step + 1
            conn.send_bytes(encode_pass(p))
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        conn.send_bytes(_control({"kind": "end", "peak_rss_bytes": peak}))
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which runs the step itself
        try:
            conn.send_bytes(_control({"kind": "error", "step": step, "error": f"{type(exc).__name__}: {exc}"}))
        except OSError:
            pass
    finally:
        conn.close()


def _control(obj: JsonObject) -> bytes:
    """A message that is not a pass: header length 0, then JSON."""
    return _HEADER.pack(0) + json.dumps(obj).encode()


class AheadStream(Iterator[DecodePass]):
    """The reference's passes as its child process sends them (see the module); where the child
    fails, the rest from the reference's own stream opened in this process. :attr:`taken_over`
    says at which step that happened (None while the child serves), :attr:`child_error` what the
    child reported, :attr:`peak_rss_bytes` the child's peak resident memory (once it has ended)."""

    def __init__(self, open_stream: Callable[[], Iterator[DecodePass]], passes: int, process: BaseProcess,
                 conn: Connection, threads: tuple[int, int] | None) -> None:
        self._open, self._process, self._conn, self._threads = open_stream, process, conn, threads
        #: the passes the decode yields (the prefill and its steps)
        self.passes = passes
        self._local: Iterator[DecodePass] | None = None
        self._next_step = 0
        self.taken_over: int | None = None
        self.child_error: str | None = None
        self.peak_rss_bytes: int | None = None
        self.pid = process.pid

    def __iter__(self) -> AheadStream:
        return self

    def __next__(self) -> DecodePass:
        if self._local is not None:
            return self._from_local()
        message = self._receive()
        if message is None:
            return self._take_over("the reference's decode process ended without a word")
        if _HEADER.unpack_from(message, 0)[0] == 0:
            said = json.loads(message[_HEADER.size:])
            self._stop()
            if said.get("kind") == "end":
                self.peak_rss_bytes = int(said.get("peak_rss_bytes") or 0)
                raise StopIteration
            return self._take_over(str(said.get("error")))
        p = decode_pass(message)
        self._next_step = p.step + 1
        return p

    def _receive(self) -> bytes | None:
        """The child's next message; None where it is gone (waits return to Python every
        :data:`_POLL_S`: the session's time limit interrupts a wait)."""
        try:
            while not self._conn.poll(_POLL_S):
                if not self._process.is_alive() and not self._conn.poll(0):
                    return None
            return self._conn.recv_bytes()
        except (EOFError, OSError):
            return None

    def _take_over(self, why: str) -> DecodePass:
        """The reference's own stream opened here, run to the step the child reached: its error is
        raised as the reference's own, or the decode goes on in this process."""
        self.child_error, self.taken_over = why, self._next_step
        self._stop()
        local = self._open()
        for _ in range(self._next_step):
            next(local)
        self._local = local
        return self._from_local()

    def _from_local(self) -> DecodePass:
        assert self._local is not None
        p = next(self._local)
        self._next_step = p.step + 1
        return p

    def _stop(self) -> None:
        """The child ended (killed where still running) and this process's threads restored."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=10)
        self._conn.close()
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads[0])
            self._threads = None

    def close(self) -> None:
        """End the child: its last word read where every pass was taken (its peak memory), else
        stopped (a decode ended early, at its first divergence or on an error)."""
        if self._local is None and self._next_step == self.passes and not self._conn.closed:
            try:
                last = self._conn.recv_bytes() if self._conn.poll(_END_WAIT_S) else b""
            except (EOFError, OSError):
                last = b""
            if len(last) >= _HEADER.size and _HEADER.unpack_from(last, 0)[0] == 0:
                said = json.loads(last[_HEADER.size:])
                self.peak_rss_bytes = int(said.get("peak_rss_bytes") or 0) or None
        if self._threads is not None or self._process.is_alive() or not self._conn.closed:
            self._stop()
        close = getattr(self._local, "close", None)
        if callable(close):
            close()


def decode_ahead(open_stream: Callable[[], Iterator[DecodePass]], steps: int) -> AheadStream:
    """The reference's decode of ``steps`` steps (``open_stream()``, opened in the child) run ahead
    in a forked child process: the stream of its passes (see the module). This process keeps one
    intra-op thread fewer while the child runs."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_serve, args=(open_stream, theirs), name="reference-decode", daemon=True)
    with warnings.catch_warnings():  # Python 3.12+ warns of fork in a threaded process: the child runs torch only
        warnings.simplefilter("ignore", DeprecationWarning)
        process.start()
    theirs.close()
    had = torch.get_num_threads()
    threads = None
    if had > 1:
        torch.set_num_threads(had - 1)
        threads = (had, had - 1)
    return AheadStream(open_stream, steps + 1, process, ours, threads)
