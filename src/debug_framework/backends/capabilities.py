"""What a backend can do, as one typed record: :class:`Capabilities`.

Services read a backend's abilities here and nowhere else: ``capabilities(backend)`` is the
backend's own declaration (a ``capabilities()`` method returning a record) or, for a backend that
declares none, what its methods show (:func:`derive_capabilities`). The probing of a backend (``run_layer``, ``can_decode``, ``release_session``
...) lives in this module alone; a stage asks ``capabilities(b).decode`` and is told why not.

A backend of one's own declares what it can do by the methods it has (``run_layer``, ``run_block``,
``run_decode``, ``run_decode_layer``, and ``can_*()`` where it depends on what it wraps), or by
returning its own record from ``capabilities()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..config import FLOAT_DTYPES
from ..errors import DebugFrameworkError

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from ..modelio.loader import LoadedModel
    from ._graph_session import GraphSession
    from .base import EmulatedPrecision

__all__ = ["Support", "Capabilities", "GraphRunner", "GraphSessionBackend", "capabilities", "derive_capabilities", "release",
           "backend_versions", "graph_runner", "reads_loaded_weights", "declared_dtype", "offers",
           "emulated_precision", "trace_nodes", "layer_replay_support", "block_replay_support", "model_for",
           "produced_checkpoints", "WINDOW_COUNTS", "count_windows_as"]


class Support(NamedTuple):
    """Whether a backend can do one thing: ``ok``, and ``why`` not where it cannot."""

    ok: bool
    why: str = ""


#: How a backend holds the model's weights (the memory estimate's rule): all of them at its dtype,
#: one tensor at a time converted (the references over NumPy and torch), or one layer at a time
#: plus what lies outside the layers (``float64_eager``).
WEIGHTS_MEMORY = ("resident", "streams_weights", "streams_layers")

#: What a sliding attention window counts on a padded row: ``"columns"`` of the batch (its padding
#: inside the window counted: transformers' masks, and every engine that runs the padded batch as
#: one) or the row's own ``"tokens"`` (an engine that runs each row as a sequence of its own:
#: llama.cpp). They differ only where padding lies between a row's tokens (a decode step after a
#: right-padded prompt); the truth for a row is what the model computes on its tokens, so a
#: reference and a calibration count as the session's alternative declares (:func:`count_windows_as`).
WINDOW_COUNTS = ("columns", "tokens")


@dataclass(frozen=True)
class Capabilities:
    """One prepared backend's abilities.

    Attributes:
        name: the backend's name.
        dtypes: the dtypes it computes in; ``default_dtype`` where none is asked for.
        reads_weights_only: it never writes its weights, so it is given the loaded model's own
            (:func:`reads_loaded_weights`); every other backend gets a fork.
        weights_memory: one of :data:`WEIGHTS_MEMORY`.
        layer_replay: it runs one layer alone on a given input (isolation).
        block_replay: it runs a layer's MLP block alone on a given post-attention state.
        decode: it decodes through a KV cache of its own (``run_decode``).
        decode_layer_replay: it replays one layer at a decode step (``run_decode_layer``).
        holds_replays: it keeps state for its replays that :func:`release` frees.
        holds_session: it keeps a runtime session that :func:`release` frees (opened again on need).
        graph_sessions: it opens the ONNX graph it runs with more outputs marked
            (``open_session_file(path)``: what ``mark_all`` compares every node output with).
        prepared: ``prepare`` has given it a model. device: where it runs.
        layer_trace: it runs one layer on a given input and reports its named intermediate values
            (``run_layer_traced(i, hidden_in, inputs)``, names of ``architectures.walk.TRACE_NAMES``):
            the drill-down compares them with the reference's in order, whatever the engine.
        window_counts: what its sliding attention windows count on a padded row, one of
            :data:`WINDOW_COUNTS` (its ``window_counts`` attribute; ``"columns"`` where it declares none).
        decode_ahead: its decode may run in a forked child process, ahead of the other sides (a
            reference's greedy decode needs nothing of theirs): it computes in this process on the
            CPU and holds nothing a fork breaks (a device context, a server connection, an engine's
            threads). Declared by a class attribute ``decode_ahead = True`` of the backend's own class
            (a subclass that adds a device, a connection or threads must not inherit it); False by default.
    """

    name: str
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    default_dtype: str = "float32"
    reads_weights_only: bool = False
    weights_memory: str = "resident"
    layer_replay: Support = Support(False, "cannot run a single layer (no run_layer)")
    block_replay: Support = Support(False, "cannot run a layer's blocks alone (no run_block)")
    decode: Support = Support(False, "has no decode support (no run_decode: it runs one forward pass only)")
    decode_layer_replay: Support = Support(False, "cannot replay a layer at a decode step (no run_decode_layer)")
    holds_replays: bool = False
    holds_session: bool = False
    graph_sessions: Support = Support(False, "does not run ONNX graphs (no open_session_file)")
    layer_trace: Support = Support(False, "reports no named intermediate values of a layer (no run_layer_traced)")
    window_counts: str = "columns"
    decode_ahead: bool = False
    prepared: bool = False
    device: str = "cpu"

    def with_(self, **changes: object) -> Capabilities:
        """This record with ``changes``: how a backend declares what differs from what it derives."""
        return replace(self, **changes)


class GraphRunner(Protocol):
    """A reference backend's runner of an ONNX file's own graph (``Float64GraphRunner``): the file's
    graph at ``dtype``, run by ``runtime``, its session opened again with more outputs marked."""

    runtime: str
    dtype: str

    def marked(self, tensors: list[str]) -> GraphSession:
        """The runner's session with ``tensors`` among its outputs as well."""
        ...


class GraphSessionBackend(Protocol):
    """What a backend with ``graph_sessions`` offers: the ONNX file it runs (``onnx_path``; its own
    ``model_file`` where one was given) opened again with more outputs marked."""

    name: str
    onnx_path: Path | None
    model_file: Path | None

    def open_session_file(self, path: Path) -> GraphSession:
        """A runtime session over the ONNX file ``path``, read by the runtime itself."""
        ...


def _asked(backend: object, method: str, missing: Support) -> Support:
    """``missing`` where ``backend`` has no ``method``, else yes."""
    if not callable(getattr(backend, method, None)):
        return missing
    return Support(True)


def _can(backend: object, question: str, fallback: Support) -> Support:
    """The answer of ``backend``'s ``question`` (``can_decode()`` ...: an ability that depends on
    what it wraps, or on its preparation) where it has one, else ``fallback``."""
    can = getattr(backend, question, None)
    if not callable(can):
        return fallback
    try:
        ok, why = can()
    except DebugFrameworkError as exc:  # an ability only a prepared backend can tell
        return Support(False, exc.message)
    return Support(bool(ok), "" if ok else str(why))


def reads_loaded_weights(backend: object) -> bool:
    """Whether ``backend`` is given the loaded model itself, whose weights other backends read too,
    rather than :meth:`LoadedModel.fork` (weights of its own). Only a class that declares
    ``reads_weights_only = True`` itself is (the framework's references, which only read their
    weights, layer by layer: one mapping of the file for all of them); a subclass that changes what
    its parent computes must declare it anew, and every other backend gets a fork."""
    return vars(type(backend)).get("reads_weights_only") is True


def derive_capabilities(backend: object) -> Capabilities:
    """The record ``backend``'s methods and attributes show: what a backend that declares nothing
    itself can do."""
    base = Capabilities(name=str(getattr(backend, "name", type(backend).__name__)))
    layer = _asked(backend, "run_layer", base.layer_replay)
    if layer.ok:
        layer = _can(backend, "can_run_layer", layer)
    block = _asked(backend, "run_block", base.block_replay)
    if block.ok:
        block = _can(backend, "can_run_block", block)
    decode = _can(backend, "can_decode", _asked(backend, "run_decode", base.decode))
    memory = "streams_weights" if getattr(backend, "streams_weights", False) else \
        "streams_layers" if getattr(backend, "streams_layers", False) else "resident"
    return Capabilities(
        name=base.name,
        dtypes=tuple(getattr(backend, "supported_dtypes", None) or FLOAT_DTYPES),
        default_dtype=str(getattr(backend, "default_dtype", "float32")),
        reads_weights_only=reads_loaded_weights(backend),
        weights_memory=memory,
        layer_replay=layer,
        block_replay=block,
        decode=decode,
        decode_layer_replay=_asked(backend, "run_decode_layer", base.decode_layer_replay),
        holds_replays=callable(getattr(backend, "release_replays", None)),
        holds_session=callable(getattr(backend, "release_session", None)),
        graph_sessions=_asked(backend, "open_session_file", base.graph_sessions),
        layer_trace=_can(backend, "can_run_layer_traced", _asked(backend, "run_layer_traced", base.layer_trace)),
        window_counts=str(getattr(backend, "window_counts", base.window_counts)),
        decode_ahead=vars(type(backend)).get("decode_ahead") is True,  # a subclass declares it anew
        prepared=getattr(backend, "model", None) is not None,
        device=str(getattr(backend, "device", "cpu") or "cpu"),
    )


def capabilities(backend: object) -> Capabilities:
    """``backend``'s capabilities: its own ``capabilities()`` record where it declares one, else
    :func:`derive_capabilities`."""
    declared = getattr(backend, "capabilities", None)
    if callable(declared):
        record = declared()
        if isinstance(record, Capabilities):
            return record
    return derive_capabilities(backend)


def block_replay_support(backend: object) -> tuple[bool, str]:
    """``(True, "")`` when ``backend`` (prepared) can run a layer's MLP block alone on a given
    post-attention state, else ``(False, why)``: its :func:`capabilities`' ``block_replay``."""
    ok, why = capabilities(backend).block_replay
    return ok, why


def layer_replay_support(backend: object) -> tuple[bool, str]:
    """``(True, "")`` when ``backend`` (prepared) can replay a single layer, else ``(False, why)``:
    its :func:`capabilities`' ``layer_replay``."""
    ok, why = capabilities(backend).layer_replay
    return ok, why


def model_for(backend: object, model: LoadedModel) -> LoadedModel:
    """The model as ``backend`` is to be prepared with it: ``model`` for a backend that
    :func:`reads_loaded_weights`, else a fork whose weights nothing else reads or writes."""
    return model if reads_loaded_weights(backend) else model.fork()


def release(backend: object, what: str) -> None:
    """Free what ``backend`` holds for ``what``: ``"replays"`` (its layer replays' state) or
    ``"session"`` (its runtime session, opened again on need); nothing where it holds none."""
    if what not in ("replays", "session"):
        raise ValueError(f"release what: 'replays' or 'session', got {what!r}")
    caps = capabilities(backend)
    held = caps.holds_replays if what == "replays" else caps.holds_session
    fn: Callable[[], object] | None = getattr(backend, f"release_{what}", None) if held else None
    if fn is not None:
        fn()


def declared_dtype(backend: object, model: LoadedModel) -> tuple[str, str] | None:
    """The precision ``backend`` declares it computes ``model`` at, and why (an ONNX file's weight
    type, an engine's precision hint or its device's default): what ``dtype: "auto"`` judges it at.
    None where it declares none (its ``default_dtype`` then)."""
    fn = getattr(backend, "declared_dtype", None)
    return fn(model) if callable(fn) else None


def produced_checkpoints(backend: object, model: LoadedModel) -> list[str] | None:
    """The checkpoint ids ``backend`` (built, not yet prepared) declares it produces for ``model``, in
    model order (a program of the user's that returns the logits and some hidden states), or None
    where it produces every checkpoint of the model (it declares no ``checkpoints(model)``)."""
    fn = getattr(backend, "checkpoints", None)
    return fn(model) if callable(fn) else None


def emulated_precision(backend: object, model: LoadedModel) -> EmulatedPrecision | None:
    """The precision ``backend`` declares it computes ``model`` at beyond a float dtype, with a
    trusted emulation of it (its ``emulated_precision(model)``: llama.cpp's ``q8_0``, a module's
    torchao ``int8_weight_only``), None where it declares none: what the calibration reproduces at
    ``dtype: "auto"`` and what the precision diagnosis measures under its name."""
    fn = getattr(backend, "emulated_precision", None)
    return fn(model) if callable(fn) else None  # type: ignore[no-any-return]


def trace_nodes(backend: object) -> dict[str, str] | None:
    """The engine graph's node each of ``backend``'s traced values came from (its ``trace_nodes``:
    trace name -> node, llama.cpp's ``Qcur-1``), None where it reports none."""
    nodes = getattr(backend, "trace_nodes", None)
    return {str(k): str(v) for k, v in nodes.items()} if isinstance(nodes, dict) else None


def offers(backend: object, method: str) -> bool:
    """Whether ``backend`` has the engine-specific entry point ``method`` a drill-down strategy of
    that engine calls (``export_layer`` of the ONNX-graph engines, ``layer_call`` of Inductor):
    the one place such a method is looked for."""
    return callable(getattr(backend, method, None))


def graph_runner(backend: object) -> GraphRunner | None:
    """The runner of an ONNX file's own graph a reference backend (``python_reference``,
    ``torch_reference``) prepared for an ONNX-file model, None for any other backend."""
    return None if backend is None else getattr(backend, "_graph", None)


def backend_versions(backend: object) -> JsonObject | None:
    """What ``backend`` says it runs on (``version_info()``), None where it says nothing."""
    fn = getattr(backend, "version_info", None)
    return fn() if callable(fn) else None


def count_windows_as(backend: object, alternative: object) -> str:
    """Have ``backend`` (a reference, a calibration: a model written from the math) count sliding
    windows as ``alternative`` declares (:data:`WINDOW_COUNTS`), where it can (its
    ``count_windows_in(counts)``, called after each ``prepare``: its model is built anew there);
    returns what ``backend`` counts now (its capabilities')."""
    counts = capabilities(alternative).window_counts
    follow: Callable[[str], None] | None = getattr(backend, "count_windows_in", None)
    if callable(follow):
        follow(counts)
    return capabilities(backend).window_counts
