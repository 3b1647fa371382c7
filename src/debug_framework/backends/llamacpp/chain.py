"""Layer replays resumed along one llama.cpp pass: isolation without computing every prefix again.

Isolation replays layer 0, 1, 2 ... in turn, each on the reference's input to it, and then its MLP
block on the reference's post-attention state. A llama.cpp pass cannot start at layer ``i``: replayed
in a pass of its own, layer ``i`` costs layers ``0..i`` (the input node is replaced when llama.cpp
reaches it), so a model of ``L`` layers costs about ``L * L`` layers for its two replays each (a
Qwen2-0.5B shape, 24 layers: 600 layers, 25 forwards, most of a session's time).

A :class:`ReplayChain` runs one pass in a worker thread on a context of its own and stops inside
llama.cpp's eval callback at each replay's input node until the next replay gives its value: replay
``i`` writes the value, lets llama.cpp compute the layer (or block), hands back its result nodes, and
the pass waits at replay ``i + 1``'s input node. Consecutive replays on the same inputs therefore
cost one pass in all; any other replay (another layer, other inputs) ends the pass and starts a new
one. A pass that is not resumed within :data:`IDLE_S` ends by itself.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BackendRuntimeError
from .binding import ggml_tensor_array, ggml_tensor_write
from .graph import LlamaGraph, LlamaSettings, Pass, Rows, _rows_first

__all__ = ["ChainNodes", "ReplayChain", "IDLE_S"]

#: seconds a chain's pass waits for its next replay before it ends by itself
IDLE_S = 120.0
#: how often a waiting caller looks up (so the session's time limit can interrupt it)
_POLL_S = 0.25


#: the chains of this process whose pass may be running: ended before the interpreter finalizes (a
#: pass left waiting inside llama.cpp must not outlive the objects it uses)
_LIVE: weakref.WeakSet[ReplayChain] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for chain in list(_LIVE):
        try:
            chain.stop()
        except Exception:  # noqa: BLE001 - exiting: nothing to report to
            pass


class _Stop(Exception):  # noqa: N818 - not an error: the end of a chain's pass
    """Raised inside the eval callback to end a chain's pass."""


@dataclass(frozen=True)
class ChainNodes:
    """Which nodes a chain's replay ``i`` replaces (``input(i)``) and reads (``results(i)``, the last
    of which ends the replay)."""

    input: Callable[[int], str]
    results: Callable[[int], tuple[str, ...]]


class _ChainGraph(LlamaGraph):
    """A :class:`LlamaGraph` whose eval callback waits at each replay's input node for its value."""

    def __init__(self, path: Path, settings: LlamaSettings, architecture: str, nodes: ChainNodes,
                 layers: int) -> None:
        super().__init__(path, settings, architecture)
        self.nodes, self.layers = nodes, layers
        self.inputs: queue.Queue[np.ndarray | None] = queue.Queue()
        self.results: queue.Queue[Pass | BaseException] = queue.Queue()
        self.layer = -1  # the replay in progress (-1: none given yet)
        self.live = False
        self.current = Pass()
        self.started = 0.0

    def begin(self, first: int) -> None:
        """The next pass's first replay is ``first``."""
        self.layer, self.live, self.current = first - 1, False, Pass()
        self.inputs, self.results = queue.Queue(), queue.Queue()

    def _at_node(self, t: int, name: str) -> None:
        if self.live and name in self.nodes.results(self.layer):
            value = ggml_tensor_array(self.lib, t)
            rows = None if value is None else _rows_first(np.asarray(value), self._tokens)
            if rows is not None:
                self.current.nodes.setdefault(name, []).append(rows.copy())
            if name == self.nodes.results(self.layer)[-1]:
                self.current.seconds = time.perf_counter() - self.started
                self.results.put(self.current)
        following = self.layer + 1
        if following < self.layers and name == self.nodes.input(following):
            value = self._next_input()
            if not ggml_tensor_write(self.lib, t, value):
                raise BackendRuntimeError(f"cannot replace llama.cpp node {name!r} with the given values",
                                          backend="llamacpp", call="run_layer()")
            self.layer, self.live, self.current, self.started = following, True, Pass(), time.perf_counter()

    def _next_input(self) -> np.ndarray:
        try:
            value = self.inputs.get(timeout=IDLE_S)
        except queue.Empty:
            raise _Stop() from None
        if value is None:
            raise _Stop()
        return value


class ReplayChain:
    """Replays of consecutive layers along one pass (see the module). ``open_graph`` loads the
    chain's own copy of the model (llama.cpp maps the file: its pages are shared)."""

    def __init__(self, open_graph: Callable[[], _ChainGraph]) -> None:
        self._open_graph = open_graph
        self._graph: _ChainGraph | None = None
        self._thread: threading.Thread | None = None
        self._key: str | None = None
        self._next = -1

    @staticmethod
    def graph_for(path: Path, settings: LlamaSettings, architecture: str, nodes: ChainNodes,
                  layers: int) -> Callable[[], _ChainGraph]:
        """What :class:`ReplayChain` opens its model with."""
        return lambda: _ChainGraph(path, settings, architecture, nodes, layers)

    def replay(self, i: int, key: str, rows: Rows, tokens: np.ndarray, positions: np.ndarray,
               value: np.ndarray) -> Pass:
        """Replay ``i`` of the inputs ``key`` (``tokens``/``positions`` fed in ``rows``' order): its input
        node replaced by ``value`` ``[tokens, D]``; its result nodes. Resumes the running pass where
        it waits at replay ``i``, else starts a new one."""
        if not (self._running() and self._key == key and self._next == i):
            self._start(i, key, rows, tokens, positions)
        graph = self._graph
        assert graph is not None
        graph.inputs.put(np.ascontiguousarray(value, dtype=np.float32))
        result = self._result(graph)
        self._next = i + 1
        return result

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self, first: int, key: str, rows: Rows, tokens: np.ndarray, positions: np.ndarray) -> None:
        self.stop()
        if self._graph is None:
            self._graph = self._open_graph()
        graph = self._graph
        graph.open_context(rows.shape[0], len(rows.batch) + rows.shape[0], max(len(rows.batch), rows.shape[0]))
        graph.begin(first)
        want = frozenset(name for layer in range(first, graph.layers)
                         for name in (graph.nodes.input(layer), *graph.nodes.results(layer)))
        batch = rows.batch

        def work() -> None:
            try:
                graph.decode(tokens, positions, batch, want)
            except _Stop:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the caller waiting for a result
                graph.results.put(exc)

        self._thread = threading.Thread(target=work, name="llamacpp-replay-chain", daemon=True)
        self._key, self._next = key, first
        _LIVE.add(self)
        self._thread.start()

    def _result(self, graph: _ChainGraph) -> Pass:
        while True:
            try:
                item = graph.results.get(timeout=_POLL_S)
            except queue.Empty:
                if self._running():
                    continue
                try:  # ended between the look and the wait
                    item = graph.results.get_nowait()
                except queue.Empty:
                    raise BackendRuntimeError("llama.cpp's replay pass ended before the layer was replayed",
                                              backend="llamacpp", call="run_layer()") from None
            if isinstance(item, BaseException):
                self._next = -1
                raise item
            return item

    def stop(self) -> None:
        """End the running pass (its context stays open for the next)."""
        thread, graph = self._thread, self._graph
        if thread is not None and graph is not None and thread.is_alive():
            graph.inputs.put(None)
            thread.join(timeout=60)
            if thread.is_alive():
                raise BackendRuntimeError("llama.cpp's replay pass did not end", backend="llamacpp",
                                          call="release_replays()")
        self._thread, self._key, self._next = None, None, -1

    def close(self) -> None:
        """End the pass and free the chain's context and model."""
        self.stop()
        if self._graph is not None:
            self._graph.close()
        self._graph = None
