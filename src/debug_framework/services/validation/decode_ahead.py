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

A pass crosses as bytes, never a pickle: one JSON header (checkpoint keys, dtypes, shapes, sizes),
then each tensor's raw bytes, received straight into memory of its own (:func:`send_pass`,
:func:`receive_pass`). Where the child fails (the
reference raised, or the child died), this process opens the reference's stream itself, runs it to
the step the child reached and goes on in process: a reference's error is raised here as the
reference's own, and a lost child costs time, never a verdict.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import struct
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ...backends.decode import DecodePass
from ...capture.keys import Capture, CapturedTensor, CheckpointKey
from ...jsonio import JsonObject

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

__all__ = ["AheadStream", "decode_ahead", "ahead_support", "send_pass", "receive_pass", "AHEAD_MIN_STEPS"]

#: the fewest decode steps for which a child is started (below it the fork costs more than it saves)
AHEAD_MIN_STEPS = 4
#: how often (seconds) a wait for the child's next pass returns to Python, so that the session's
#: time limit (``deadline.bounded``) can interrupt it
_POLL_S = 0.25
_LENGTH = struct.Struct("<Q")
#: how long a finished decode waits for the child's last word (its peak memory) before stopping it
_END_WAIT_S = 5.0
#: the pipe buffer asked for (Linux's default limit for an unprivileged process: 1 MiB)
_PIPE_BYTES = 2**20


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


# -- the channel -------------------------------------------------------------------------------------
class Channel:
    """One end of a pipe carrying length-prefixed messages (an 8-byte length, then the bytes); a
    message can be read straight into a caller's buffer (no intermediate copy: a long decode's
    whole-cache audits cross as they are)."""

    def __init__(self, fd: int, writes: bool) -> None:
        self._fd, self.writes = fd, writes
        self._file = io.FileIO(fd, "wb" if writes else "rb", closefd=True)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        self._file.close()

    def send_bytes(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._write(_LENGTH.pack(view.nbytes))
        self._write(view)

    def _write(self, view: memoryview | bytes) -> None:
        view = memoryview(view)
        while view.nbytes:
            view = view[self._file.write(view) or 0:]

    def _read_into(self, view: memoryview) -> None:
        while view.nbytes:
            n = self._file.readinto(view)
            if not n:
                raise EOFError("the other end of the pipe closed")
            view = view[n:]

    def _length(self) -> int:
        head = bytearray(_LENGTH.size)
        self._read_into(memoryview(head))
        return int(_LENGTH.unpack(head)[0])

    def recv_bytes(self) -> bytearray:
        out = bytearray(self._length())
        self._read_into(memoryview(out))
        return out

    def recv_bytes_into(self, buffer: np.ndarray) -> None:
        """The next message read into ``buffer`` (uint8, exactly its size)."""
        n = self._length()
        if n != buffer.nbytes:
            raise OSError(f"a message of {n} bytes where {buffer.nbytes} were expected")
        self._read_into(memoryview(buffer).cast("B"))

    def poll(self, timeout: float) -> bool:
        """Whether a read would not block within ``timeout`` seconds (a message, or the end)."""
        return bool(select.select([self._fd], [], [], timeout)[0])


def _channel() -> tuple[Channel, Channel]:
    """A pipe's two ends: (this process reads, the child writes), its buffer widened (:func:`_widen`)."""
    r, w = os.pipe()
    _widen(w)
    return Channel(r, writes=False), Channel(w, writes=True)


# -- the wire format -------------------------------------------------------------------------------
def _tensor_bytes(t: CapturedTensor) -> tuple[JsonObject, memoryview]:
    """One tensor's header entry (library, dtype, shape) and its bytes (contiguous, on the host)."""
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


def send_pass(conn: Channel, p: DecodePass) -> None:
    """One pass sent: a JSON header (its fields; each tensor's library, dtype, shape and size),
    then each non-empty tensor's bytes as a message of its own (nothing joined, nothing pickled)."""
    entries: list[JsonObject] = []
    chunks: list[memoryview] = []

    def put(t: CapturedTensor) -> int:
        head, data = _tensor_bytes(t)
        head["nbytes"] = data.nbytes
        entries.append(head)
        chunks.append(data)
        return len(entries) - 1
    c = p.capture
    header: JsonObject = {
        "kind": "pass", "step": p.step,
        "capture": {"backend": c.backend, "dtype": c.dtype, "elapsed_s": c.elapsed_s, "meta": c.meta,
                    "tensors": [[k.name, k.layer, put(t)] for k, t in c.tensors.items()],
                    "layer_inputs": [[layer, put(t)] for layer, t in c.layer_inputs.items()]},
        "kv": [[layer, put(k), put(v)] for layer, (k, v) in p.kv.items()],
        "span": [[layer, span] for layer, span in p.span.items()],
        "mask": put(p.mask),
        "token": None if p.token is None else put(p.token),
    }
    header["tensors"] = entries
    conn.send_bytes(json.dumps(header).encode())
    for data in chunks:
        if data.nbytes:
            conn.send_bytes(data)


def _receive_tensor(entry: JsonObject, conn: Channel) -> CapturedTensor:
    """One tensor's bytes received straight into memory of its own."""
    shape = tuple(int(n) for n in entry["shape"])  # type: ignore[union-attr]
    size = int(entry["nbytes"])  # type: ignore[arg-type]
    if entry["lib"] == "numpy":
        out = np.empty(shape, np.dtype(str(entry["dtype"])))
        if size:
            conn.recv_bytes_into(out.reshape(-1).view(np.uint8))
        return out
    import torch

    dtype = getattr(torch, str(entry["dtype"]))
    t = torch.empty(shape, dtype=dtype)
    if size:
        bits = t.view(torch.int16) if dtype in (torch.bfloat16, torch.float16) else t  # no NumPy bfloat16
        conn.recv_bytes_into(bits.numpy().reshape(-1).view(np.uint8))
    return t


def receive_pass(header: JsonObject, conn: Channel) -> DecodePass:
    """The rest of the pass whose header :func:`send_pass` sent (each tensor in memory of its own:
    a view of a shared buffer would keep all of it alive as long as one of its tensors, e.g. a
    step's two new cache positions kept for a replay)."""
    tensors = [_receive_tensor(e, conn) for e in header["tensors"]]  # type: ignore[union-attr]
    c = header["capture"]
    capture = Capture(tensors={CheckpointKey(name, layer): tensors[i] for name, layer, i in c["tensors"]},  # type: ignore[index]
                      backend=str(c["backend"]), dtype=str(c["dtype"]), elapsed_s=float(c["elapsed_s"]),  # type: ignore[index]
                      layer_inputs={int(layer): tensors[i] for layer, i in c["layer_inputs"]}, meta=c["meta"])  # type: ignore[index]
    return DecodePass(step=int(header["step"]), capture=capture,  # type: ignore[arg-type]
                      kv={int(layer): (tensors[k], tensors[v]) for layer, k, v in header["kv"]},  # type: ignore[union-attr]
                      span={int(layer): str(span) for layer, span in header["span"]},  # type: ignore[union-attr]
                      mask=np.asarray(tensors[header["mask"]]),  # type: ignore[index]
                      token=None if header["token"] is None else np.asarray(tensors[header["token"]]))  # type: ignore[index]


# -- the child and the stream this process reads ----------------------------------------------------
def _serve(open_stream: Callable[[], Iterator[DecodePass]], conn: Channel) -> None:
    """The child: the reference's decode, each pass sent as it comes; then ``end`` (with the
    child's peak memory), or ``error`` with the step it failed at (what this process needs to take
    over)."""
    import resource

    import torch

    torch.set_num_threads(1)
    step = 0
    try:
        for p in open_stream():
            step = p.step + 1
            send_pass(conn, p)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        conn.send_bytes(json.dumps({"kind": "end", "peak_rss_bytes": peak}).encode())
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which runs the step itself
        try:
            conn.send_bytes(json.dumps({"kind": "error", "step": step, "error": f"{type(exc).__name__}: {exc}"}).encode())
        except OSError:
            pass
    finally:
        conn.close()


class AheadStream(Iterator[DecodePass]):
    """The reference's passes as its child process sends them (see the module); where the child
    fails, the rest from the reference's own stream opened in this process. :attr:`taken_over`
    says at which step that happened (None while the child serves), :attr:`child_error` what the
    child reported, :attr:`peak_rss_bytes` the child's peak resident memory (once it has ended)."""

    def __init__(self, open_stream: Callable[[], Iterator[DecodePass]], passes: int, process: BaseProcess,
                 conn: Channel, threads: tuple[int, int] | None) -> None:
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
        said = self._receive()
        if said is None:
            return self._take_over("the reference's decode process ended without a word")
        if said.get("kind") != "pass":
            self._stop()
            if said.get("kind") == "end":
                self.peak_rss_bytes = int(said.get("peak_rss_bytes") or 0) or None  # type: ignore[arg-type]
                raise StopIteration
            return self._take_over(str(said.get("error")))
        try:
            p = receive_pass(said, self._conn)
        except (EOFError, OSError):  # the child died mid-pass
            return self._take_over("the reference's decode process ended in the middle of a pass")
        self._next_step = p.step + 1
        return p

    def _receive(self, wait_s: float | None = None) -> JsonObject | None:
        """The child's next header; None where it is gone, or silent for ``wait_s`` seconds (waits
        return to Python every :data:`_POLL_S`: the session's time limit interrupts a wait)."""
        waited = 0.0
        try:
            while not self._conn.poll(_POLL_S):
                waited += _POLL_S
                if not self._process.is_alive() and not self._conn.poll(0) or wait_s is not None and waited >= wait_s:
                    return None
            said = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            return None
        return said if isinstance(said, dict) else None

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
            said = self._receive(_END_WAIT_S)
            if said is not None and said.get("kind") == "end":
                self.peak_rss_bytes = int(said.get("peak_rss_bytes") or 0) or None  # type: ignore[arg-type]
        if self._threads is not None or self._process.is_alive() or not self._conn.closed:
            self._stop()
        close = getattr(self._local, "close", None)
        if callable(close):
            close()


def _widen(fd: int) -> None:
    """The pipe's buffer raised to :data:`_PIPE_BYTES` where the system allows (Linux): the child
    may then run several passes ahead instead of waiting, mid-pass, for this process to read."""
    import fcntl

    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setter is None:
        return
    try:
        fcntl.fcntl(fd, setter, _PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size: the default buffer, a shallower lead
        pass


def decode_ahead(open_stream: Callable[[], Iterator[DecodePass]], steps: int) -> AheadStream:
    """The reference's decode of ``steps`` steps (``open_stream()``, opened in the child) run ahead
    in a forked child process: the stream of its passes (see the module). This process keeps one
    intra-op thread fewer while the child runs."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("fork")
    ours, theirs = _channel()
    process = ctx.Process(target=_serve, args=(open_stream, theirs), name="reference-decode", daemon=True)
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written a second time by the child
        flush = getattr(stream, "flush", None)
        if callable(flush):
            with contextlib.suppress(OSError, ValueError):
                flush()
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
