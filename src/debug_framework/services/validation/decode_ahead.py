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

Used only where it can hold (:func:`ahead_support`): a reference whose class declares
``capabilities.decode_ahead`` (an in-process computation on the CPU: a fork breaks device contexts,
server connections and engine threads), Linux, a process that is not a daemonic worker, at least
two CPUs for it, at least :data:`AHEAD_MIN_STEPS` steps. The child runs one torch intra-op thread
(and one BLAS thread where ``threadpoolctl`` is installed); this process one fewer than it had
during the decode (restored after). The child dies with this process.

Where the alternative leads a greedy decode (:mod:`.decode_led`), a second pipe carries the
tokens it chooses the other way (:class:`FedTokens`, :func:`token_pipe`): the child's decode is
fed them as they come.

A pass crosses as bytes, never a pickle: one JSON header (checkpoint keys, dtypes, shapes, sizes),
then each tensor's raw bytes, one after the other (their sizes are the header's), written in one
``writev`` and received in one ``readv`` straight into each tensor's memory of its own
(:func:`send_pass`, :func:`receive_pass`; the pipe taking or giving part of them, the rest follows).
Where the child fails (the reference raised), dies, or is stuck (alive, no CPU used for
:data:`_STUCK_S` while this process waits), this process stops it, opens the reference's stream
itself, runs it to the step the child reached and goes on in process: a reference's error is
raised here as the reference's own, and a lost child costs time, never a verdict (a run here that
chooses another token than the child did is refused, DF005). Where the fork fails, the reference
decodes in this process.
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
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...backends.decode import DecodePass
from ...capture.keys import Capture, CapturedTensor, CheckpointKey
from ...jsonio import JsonObject

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

__all__ = ["AheadStream", "decode_ahead", "ahead_support", "send_pass", "receive_pass", "AHEAD_MIN_STEPS", "Beside",
           "FedTokens", "token_pipe"]

#: the fewest decode steps for which a child is started (below it the fork costs more than it saves)
AHEAD_MIN_STEPS = 4
#: how often (seconds) a wait for the child's next pass returns to Python, so that the session's
#: time limit (``deadline.bounded``) can interrupt it
_POLL_S = 0.25
_LENGTH = struct.Struct("<Q")
#: how long a finished decode waits for the child's last word (its peak memory) before stopping it
_END_WAIT_S = 5.0
#: a child that uses no CPU for this long while the session's process waits for it is stuck (a
#: lock held across the fork): it is stopped and its decode taken over
_STUCK_S = 30.0
#: the pipe buffer asked for (Linux's default limit for an unprivileged process: 1 MiB)
_PIPE_BYTES = 2**20
#: a calibration's pass read past (its step's pass and the next taken first) is kept this many steps
_BESIDES_KEPT = 16
#: the most buffers one ``writev``/``readv`` takes (the system's ``IOV_MAX``; POSIX allows as few as 16)
_IOV_MAX = max(16, min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16))


def ahead_support(declared: bool, steps: int, device: str) -> tuple[bool, str]:
    """Whether a reference's decode runs ahead in a child process, and why not where it does not."""
    if not declared:
        return False, "the reference does not declare decode_ahead"
    if device != "cpu":
        return False, f"the reference runs on {device}"
    if not sys.platform.startswith("linux"):  # fork after torch and its thread pools: Linux alone is safe
        return False, f"the child process runs on Linux only (here: {sys.platform})"
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return False, "this process is a daemonic multiprocessing worker (it may not start a child)"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 2:
        return False, "this process may use one CPU only"
    if steps < AHEAD_MIN_STEPS:
        return False, f"fewer than {AHEAD_MIN_STEPS} decode steps"
    return True, ""


# -- the channel -------------------------------------------------------------------------------------
class Channel:
    """One end of a pipe carrying length-prefixed messages (an 8-byte length, then the bytes), each
    message optionally followed by bytes whose sizes the message itself gives
    (:meth:`send_message`): those are read straight into the caller's buffers (no intermediate
    copy: a long decode's whole-cache audits cross as they are), one system call for all of them
    where the pipe holds them."""

    def __init__(self, fd: int, writes: bool) -> None:
        self._fd = fd
        self._poller: select.poll | None = None
        self._file = io.FileIO(fd, "wb" if writes else "rb", closefd=True)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        self._file.close()

    def send_bytes(self, data: bytes | memoryview) -> None:
        """One message: its length, then ``data``."""
        self.send_message(data)

    def send_message(self, data: bytes | memoryview, after: Sequence[memoryview] = ()) -> None:
        """One message (its length, then ``data``) and then each of ``after``'s bytes with no length
        of their own (the message says how many), in one ``writev`` where the pipe takes them all:
        a write the pipe takes in part goes on from the first byte not written."""
        view = memoryview(data).cast("B")
        self._write_all([memoryview(_LENGTH.pack(view.nbytes)), view, *(b.cast("B") for b in after)])

    def _open_fd(self) -> int:
        """The descriptor, ValueError once closed (its number may be another file's by then)."""
        if self._file.closed:
            raise ValueError("I/O operation on a closed channel")
        return self._fd

    def _write_all(self, views: list[memoryview]) -> None:
        self._open_fd()
        pending = [v for v in views if v.nbytes]
        while pending:
            written = os.writev(self._fd, pending[:_IOV_MAX])
            pending = _advance(pending, written)

    def _read_into(self, view: memoryview) -> None:
        self.recv_into([view])

    def recv_into(self, views: Sequence[memoryview]) -> None:
        """The next bytes read into ``views`` in order, each filled exactly (one ``readv`` where the
        pipe holds them all). EOFError where the other end closes first."""
        self._open_fd()
        pending = [v.cast("B") for v in views if v.nbytes]
        while pending:
            n = os.readv(self._fd, pending[:_IOV_MAX])
            if not n:
                raise EOFError("the other end of the pipe closed")
            pending = _advance(pending, n)

    def _length(self) -> int:
        head = bytearray(_LENGTH.size)
        self._read_into(memoryview(head))
        return int(_LENGTH.unpack(head)[0])

    def recv_bytes(self) -> bytearray:
        out = bytearray(self._length())
        self._read_into(memoryview(out))
        return out

    def poll(self, timeout: float) -> bool:
        """Whether a read would not block within ``timeout`` seconds (a message, or the end)."""
        if self._poller is None:
            self._poller = select.poll()  # not select.select: a descriptor above 1023 is fine
            self._poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(self._poller.poll(int(timeout * 1000)))


def _advance(views: list[memoryview], done: int) -> list[memoryview]:
    """``views`` less their first ``done`` bytes (those a ``writev``/``readv`` moved)."""
    i = 0
    while i < len(views) and done >= views[i].nbytes:
        done -= views[i].nbytes
        i += 1
    rest = views[i:]
    if done:
        rest[0] = rest[0][done:]
    return rest


class FedTokens:
    """The tokens this process chooses, as the child's decode reads them
    (:class:`~debug_framework.backends._decode_draft.TokenFeed`): each message one step's tokens,
    ``[batch]`` int64, in order (:meth:`send`); where the alternative leads (docs/validation.md,
    "Decode steps"), the reference is fed them. The child waits for a pass's tokens; where this
    process closes its end (a decode stopped, or begun again with the reference leading) the feed
    ends."""

    def __init__(self, conn: Channel, batch: int) -> None:
        self._conn, self._batch = conn, batch
        self._got: list[np.ndarray] = []
        self._ended = False

    def known(self, start: int, most: int) -> np.ndarray:
        while len(self._got) < start + most and not self._ended:
            try:
                raw = self._conn.recv_bytes()
            except (EOFError, OSError):
                self._ended = True
                break
            self._got.append(np.frombuffer(raw, np.int64).reshape(self._batch).copy())
        if len(self._got) <= start:
            raise EOFError(f"the tokens of decode step {start + 1} never came (the session's process closed the feed)")
        return np.stack(self._got[start:start + most], axis=1)

    @staticmethod
    def send(conn: Channel, token: np.ndarray) -> bool:
        """One step's tokens sent to the child's feed; False where the child is gone."""
        try:
            conn.send_bytes(np.ascontiguousarray(token, np.int64).tobytes())
        except (OSError, ValueError):  # the child died (its end closed), or ours is closed
            return False
        return True

    def close(self) -> None:
        self._conn.close()


def token_pipe(batch: int) -> tuple[FedTokens, Channel]:
    """A pipe for the tokens this process chooses: (the child's feed, this process's writing end)."""
    r, w = os.pipe()
    return FedTokens(Channel(r, writes=False), batch), Channel(w, writes=True)


def _channel() -> tuple[Channel, Channel]:
    """A pipe's two ends: (this process reads, the child writes), its buffer widened (:func:`_widen`)."""
    r, w = os.pipe()
    _widen(w)
    return Channel(r, writes=False), Channel(w, writes=True)


# -- the wire format -------------------------------------------------------------------------------
def _tensor_bytes(t: CapturedTensor) -> tuple[JsonObject, memoryview]:
    """One tensor's header entry (library, dtype, shape) and its bytes (contiguous, on the host)."""
    if isinstance(t, np.ndarray):
        a = np.ascontiguousarray(t)  # at least one dimension: the shape is the array's own
        return {"lib": "numpy", "dtype": a.dtype.str, "shape": list(t.shape)}, _raw(a)
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


def send_pass(conn: Channel, p: DecodePass, kind: str = "pass") -> None:
    """One pass sent: a JSON header (its fields; each tensor's library, dtype, shape and size) as a
    message, then every tensor's bytes in the header's order, one after the other with no length of
    their own, all in one ``writev`` (nothing joined, nothing pickled). ``kind``: ``"pass"`` (the
    reference's) or ``"beside"`` (a pass computed beside the reference's step: the calibration's)."""
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
        "kind": kind, "step": p.step,
        "capture": {"backend": c.backend, "dtype": c.dtype, "elapsed_s": c.elapsed_s, "meta": c.meta,
                    "tensors": [[k.name, k.layer, put(t)] for k, t in c.tensors.items()],
                    "layer_inputs": [[layer, put(t)] for layer, t in c.layer_inputs.items()]},
        "kv": [[layer, put(k), put(v)] for layer, (k, v) in p.kv.items()],
        "span": [[layer, span] for layer, span in p.span.items()],
        "mask": put(p.mask),
        "token": None if p.token is None else put(p.token),
    }
    header["tensors"] = entries
    conn.send_message(json.dumps(header).encode(), chunks)


def _receive_tensor(entry: JsonObject) -> tuple[CapturedTensor, memoryview]:
    """One tensor of a pass, in memory of its own, and the bytes its data is read into (as many as
    the header says it sent: a stream that disagrees is OSError)."""
    shape = tuple(int(n) for n in entry["shape"])  # type: ignore[union-attr]
    size = int(entry["nbytes"])  # type: ignore[arg-type]
    if entry["lib"] == "numpy":
        bits: np.ndarray = np.empty(shape, np.dtype(str(entry["dtype"])))
        out: CapturedTensor = bits
    else:
        import torch

        dtype = getattr(torch, str(entry["dtype"]))
        out = torch.empty(shape, dtype=dtype)
        bits = (out.view(torch.int16) if dtype in (torch.bfloat16, torch.float16) else out).numpy()  # no NumPy bfloat16
    view = memoryview(bits.reshape(-1).view(np.uint8))
    if view.nbytes != size:
        raise OSError(f"a tensor of {size} bytes where {view.nbytes} were expected")
    return out, view


def receive_pass(header: JsonObject, conn: Channel) -> DecodePass:
    """The rest of the pass whose header :func:`send_pass` sent: every tensor's bytes read, in one
    ``readv`` where the pipe holds them, straight into each tensor's memory of its own (a view of a
    shared buffer would keep all of it alive as long as one of its tensors, e.g. a step's two new
    cache positions kept for a replay)."""
    received = [_receive_tensor(e) for e in header["tensors"]]  # type: ignore[union-attr]
    conn.recv_into([view for _, view in received])
    tensors = [t for t, _ in received]
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
def _serve(open_stream: Callable[[], Iterator[DecodePass]], conn: Channel, ours: Channel, parent: int,
           passes: int, beside: Beside | None = None, feeding: Channel | None = None) -> None:
    """The child: the reference's decode, each pass sent as it comes, followed by ``beside(pass)``
    where there is a ``beside`` (sent as ``"beside"``; where it gives None or fails, a ``"beside"``
    saying none: the session's process then computes it itself, and never waits for a pass beside
    that could depend on tokens it has not sent yet); ``end`` (with the child's peak memory) as
    soon as the last one is sent, or ``error`` with the step it failed at (what the session's
    process needs to take over). It dies with the session's process (a write to a pipe nobody
    reads would otherwise hold the model's memory for ever). ``feeding``: the writing end of the
    tokens' pipe (:func:`token_pipe`), the session process's, closed here."""
    import resource
    import signal

    import torch

    from ...orphans import die_with_parent
    from .memory import give_back_freed

    ours.close()  # the reading end is the parent's: with it closed here, a write after its death fails
    if feeding is not None:  # the tokens' writing end is the parent's: with it closed here, its close ends the feed
        feeding.close()
    die_with_parent(parent)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a handler of the parent's (a worker's cancel) is not ours
        signal.signal(sig, signal.SIG_DFL)
    torch.set_num_threads(1)
    with contextlib.suppress(ImportError):  # NumPy's BLAS too (python_reference), where threadpoolctl is installed
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    step, mid_pass = 0, False
    try:
        for p in open_stream():
            step = p.step + 1
            mid_pass = True
            send_pass(conn, p)
            mid_pass = False
            extra = _beside_of(beside, p)
            if extra is not None:
                mid_pass = True
                send_pass(conn, extra, "beside")
                mid_pass = False
            elif beside is not None:
                conn.send_bytes(json.dumps({"kind": "beside", "step": p.step, "none": True}).encode())
            if extra is not None or any(span != "new" for span in p.span.values()):
                del extra
                give_back_freed()  # a whole cache sent: its copies out of the child's resident set
            if step == passes:  # said before the decode's own clean-up (its weights put back)
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
                conn.send_bytes(json.dumps({"kind": "end", "peak_rss_bytes": peak}).encode())
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which runs the step itself
        if not mid_pass:  # after half a pass the parent reads the end of the pipe instead
            with contextlib.suppress(OSError):
                conn.send_bytes(json.dumps({"kind": "error", "step": step,
                                            "error": f"{type(exc).__name__}: {exc}"}).encode())
    finally:
        conn.close()


#: what the child computes beside a reference pass (the calibration's pass at a sampled step), or None
Beside = Callable[[DecodePass], "DecodePass | None"]


def _beside_of(beside: Beside | None, p: DecodePass) -> DecodePass | None:
    """``beside(p)``, None where there is none or it fails (the session's process computes it then:
    the child's work beside its decode only ever saves time)."""
    if beside is None:
        return None
    try:
        return beside(p)
    except Exception:  # noqa: BLE001 - anything: the pass is computed again where it is needed
        return None


def _cpu_ticks(pid: int) -> int | None:
    """The CPU time ``pid`` has used, in clock ticks (Linux ``/proc/PID/stat``); None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


class AheadStream(Iterator[DecodePass]):
    """The reference's passes as its child process sends them (see the module); where the child
    fails, dies or hangs, the rest from the reference's own stream opened in this process.
    :attr:`taken_over` says at which step that happened (None while the child serves),
    :attr:`child_error` why, :attr:`peak_rss_bytes` the child's peak resident memory (once it has
    sent its last pass)."""

    def __init__(self, open_stream: Callable[[], Iterator[DecodePass]], passes: int, process: BaseProcess,
                 conn: Channel, threads: int | None, name: str) -> None:
        #: ``threads``: this process's intra-op threads before the child started (restored when it ends)
        self._open, self._process, self._conn, self._threads = open_stream, process, conn, threads
        #: the passes the decode yields (the prefill and its steps)
        self.passes = passes
        self.name = name
        self._local: Iterator[DecodePass] | None = None
        self._next_step = 0
        self._tokens: dict[int, np.ndarray] = {}  # the tokens the child chose, each fed to the other sides
        self.taken_over: int | None = None
        self.child_error: str | None = None
        self.peak_rss_bytes: int | None = None
        self._said: JsonObject | None = None  # a header read ahead by :meth:`beside`, for :meth:`__next__`
        #: the passes the child computed beside its steps and sent (:meth:`beside`), by step
        self.beside_sent = 0
        #: those read past by :meth:`__next__` before anyone asked for them, by step
        self._besides: dict[int, DecodePass | None] = {}
        self._stuck = False  # whether the last wait for the child ended because it was stuck

    def __iter__(self) -> AheadStream:
        return self

    def ready(self) -> bool:
        """Whether the next pass is there to take without waiting for the child (or the decode
        runs in this process now, or the child's last word is there); a calibration's pass sent
        before it is read and kept for :meth:`beside`."""
        while self._local is None and self._said is None and not self._conn.closed and self._conn.poll(0):
            try:
                said = json.loads(self._conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                said = None
            if not isinstance(said, dict) or said.get("kind") != "beside":
                self._said = said if isinstance(said, dict) else {"kind": "gone"}
                break
            try:
                self._keep_beside(*self._read_beside(said))
            except (EOFError, OSError):
                self._said = {"kind": "gone"}
        return self._local is not None or self._said is not None or self._conn.closed

    def _read_beside(self, said: JsonObject) -> tuple[int, DecodePass | None]:
        """The step and the pass of a ``"beside"`` message whose header is ``said`` (None: the
        child computed none at that step).

        Raises:
            EOFError, OSError: the child died in the middle of it.
        """
        if said.get("none"):
            return int(said.get("step") or 0), None  # type: ignore[arg-type]
        got = receive_pass(said, self._conn)
        self.beside_sent += 1
        return got.step, got

    def _past_besides(self, said: JsonObject | None, receive: Callable[[], JsonObject | None]) -> JsonObject | None:
        """The first header from ``said`` on that is not a ``"beside"`` (each one before it read and
        kept for its step, the next header from ``receive()``); None where the child is gone."""
        while said is not None and said.get("kind") == "beside":
            try:
                self._keep_beside(*self._read_beside(said))
            except (EOFError, OSError):  # the child died in the middle of one
                return None
            said = receive()
        return said

    def _keep_beside(self, step: int, kept: DecodePass | None) -> None:
        """What the child computed beside its step ``step``, read before anyone asked for it, kept
        for :meth:`beside` (the last :data:`_BESIDES_KEPT` steps' only)."""
        self._besides = {s: q for s, q in self._besides.items() if s >= step - _BESIDES_KEPT}
        self._besides[step] = kept

    def beside(self, step: int) -> DecodePass | None:
        """The pass the child computed beside its decode step ``step`` (the calibration's at a
        sampled step), sent right after that step's pass; None where it sent none (this process
        computes it then) or the child is gone (the next pass takes the decode over). One the
        stream read past (the passes after ``step`` taken first) is kept for this."""
        if step in self._besides:
            return self._besides.pop(step)
        if self._local is not None or self._said is not None or self._next_step != step + 1:
            return None
        said = self._receive()
        if said is None or said.get("kind") != "beside":
            self._said = said if said is not None else {"kind": "gone"}
            return None
        try:
            at, got = self._read_beside(said)
        except (EOFError, OSError):  # the child died mid-pass: the next pass takes the decode over
            self._said = {"kind": "gone"}
            return None
        return got if at == step else None

    def __next__(self) -> DecodePass:
        if self._local is not None:
            return self._from_local()
        said, self._said = self._said, None
        if said is None or said.get("kind") == "gone":
            said = self._receive()
        said = self._past_besides(said, self._receive)  # one nobody asked for yet: kept for its step
        if said is None:
            why = f"the reference's decode process used no CPU for {_STUCK_S:g} s while this one waited (stuck)" \
                if self._stuck else "the reference's decode process ended without a word"
            return self._take_over(why)
        if said.get("kind") == "end":  # asked for a pass beyond the last
            self._ended(said)
            self._stop()
            raise StopIteration
        if said.get("kind") != "pass":
            return self._take_over(str(said.get("error")))
        try:
            p = receive_pass(said, self._conn)
        except (EOFError, OSError):  # the child died mid-pass
            return self._take_over("the reference's decode process ended in the middle of a pass")
        self._next_step = p.step + 1
        if p.token is not None:
            self._tokens[p.step] = np.array(p.token, copy=True)
        return p

    def _ended(self, said: JsonObject) -> None:
        self.peak_rss_bytes = int(said.get("peak_rss_bytes") or 0) or None  # type: ignore[arg-type]

    def _receive(self, wait_s: float | None = None) -> JsonObject | None:
        """The child's next header; None where it is gone, stuck (alive, no CPU used for
        :data:`_STUCK_S` while this process waits) or silent for ``wait_s`` seconds. A wait returns
        to Python every :data:`_POLL_S`: the session's time limit interrupts it."""
        waited, ticks, still_since = 0.0, _cpu_ticks(self._process.pid or 0), 0.0
        self._stuck = False
        try:
            while not self._conn.poll(_POLL_S):
                waited += _POLL_S
                if not self._process.is_alive() and not self._conn.poll(0) or wait_s is not None and waited >= wait_s:
                    return None
                now = _cpu_ticks(self._process.pid or 0)
                if now is None or now != ticks:
                    ticks, still_since = now, waited
                elif waited - still_since >= _STUCK_S:
                    self._stuck = True  # alive, and no CPU used while this process waited
                    return None
            said = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            return None
        return said if isinstance(said, dict) else None

    def _take_over(self, why: str) -> DecodePass:
        """The reference's own stream opened here, run to the step the child reached: its error is
        raised as the reference's own, or the decode goes on in this process. The tokens it
        chooses on the way must be those the child chose (they were fed to the other sides)."""
        from ...errors import BackendRuntimeError

        self.child_error, self.taken_over = why, self._next_step
        self._stop()
        local = self._open()
        for _ in range(self._next_step):
            q = next(local)
            sent = self._tokens.get(q.step)
            if sent is not None and q.token is not None and not np.array_equal(np.asarray(q.token), sent):
                raise BackendRuntimeError(
                    f"the reference {self.name!r} chose other tokens at decode step {q.step} when its decode was "
                    f"run again in this process than in its own process ({why})", backend=self.name,
                    call=f"run_decode() step {q.step}",
                    hint="its greedy choice depends on the thread count (a near tie of its logits): give the tokens "
                         "(--decode-tokens), or run where the reference's decode is not moved")
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
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._conn.close()
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
            self._threads = None

    def close(self) -> None:
        """End the child: its last word read where every pass was taken (its peak memory), else
        stopped (a decode ended early, at its first divergence or on an error)."""
        if self._local is None and self._next_step == self.passes and not self._conn.closed \
                and self.peak_rss_bytes is None:
            said, self._said = self._said or self._receive(_END_WAIT_S), None
            said = self._past_besides(said, lambda: self._receive(_END_WAIT_S))  # the last step's, nobody asked for
            if said is not None and said.get("kind") == "end":
                self._ended(said)
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


def decode_ahead(open_stream: Callable[[], Iterator[DecodePass]], steps: int, name: str,
                 beside: Beside | None = None, fed: tuple[FedTokens, Channel] | None = None,
                 open_here: Callable[[], Iterator[DecodePass]] | None = None) -> AheadStream | str:
    """The decode of ``steps`` steps of the reference ``name`` (``open_stream()``, opened in the
    child) run ahead in a forked child process: the stream of its passes (see the module), or why
    not where the fork failed (the decode then runs in this process). ``beside(pass)``, run in the
    child after each pass, may give a pass of its own to send along (:meth:`AheadStream.beside`).
    ``fed``: the pipe of the tokens this process sends the child's decode (:func:`token_pipe`;
    ``open_stream`` reads its feed), and ``open_here`` the same decode opened in this process
    (where it takes over from a lost child; default ``open_stream``). This process keeps one
    intra-op thread fewer while the child runs."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("fork")
    ours, theirs = _channel()
    process = ctx.Process(target=_serve, args=(open_stream, theirs, ours, os.getpid(), steps + 1, beside,
                                               None if fed is None else fed[1]),
                          name="reference-decode", daemon=True)
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written a second time by the child
        flush = getattr(stream, "flush", None)
        if callable(flush):
            with contextlib.suppress(OSError, ValueError):
                flush()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns of fork in a threaded process: the child runs torch only
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
    except (OSError, AssertionError, ValueError) as exc:  # no memory to fork, a daemonic process
        ours.close()
        theirs.close()
        if fed is not None:
            fed[0].close()
        return f"the fork failed ({type(exc).__name__}: {exc})"
    theirs.close()
    if fed is not None:  # the feed's reading end is the child's
        fed[0].close()
    had = torch.get_num_threads()
    if had > 1:
        torch.set_num_threads(had - 1)
    return AheadStream(open_here or open_stream, steps + 1, process, ours, had if had > 1 else None, name)
