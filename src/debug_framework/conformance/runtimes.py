"""Single-op ONNX graphs: a conformance sweep of an ONNX runtime (``--runtime NAME``: an engine's
op-sweep runtime, found by :func:`~.runtime_lookup.find_runtime`).

Each sample's operator call is exported with ``torch.onnx.export(dynamo=True)`` as a one-operator
graph (a tiny module whose inputs are the sample's tensors, its other arguments baked in) and run
by the runtime (:class:`OpSweepRuntime`: its session on the graph, its target per device, its
precision hint, its repro's runner); the sweep judges the outputs exactly as it judges a
``torch.compile`` backend's.

    runner = RuntimeRunner(find_runtime(name), "cpu", scratch)
    call = runner.bind("softmax", "float32", op)      # call(*sample.args, **sample.kwargs) -> [tensors]

Exported graphs, with their runtime sessions, are cached per operator, dtype, input shapes and
dtypes and the non-tensor arguments: the sample's other layouts and special values reuse them
(inputs reach the runtime as contiguous arrays). A refusal that holds for every shape (the exporter
has no ONNX function for the ATen operator, the runtime no kernel for a node's type) is cached for
the operator and dtype, so its other samples cost nothing. A sample the exporter cannot export, or the
runtime cannot load or compile, raises :class:`~debug_framework.conformance.judge.NotTaken`: the
sample is ``unsupported`` with that reason, not failed.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import BackendInitializationError
from ..jsonio import JsonObject
from .judge import NotTaken
from .runtime_lookup import GraphRun, OpSweepRuntime, find_runtime

__all__ = ["OpSweepRuntime", "GraphRun", "RuntimeRunner", "check_runtime", "export_op", "flatten_tensors"]

def check_runtime(name: str, device: str) -> str:
    """The runtime's device name for the torch device name ``device`` (runtime ``name`` found by
    :func:`~.runtime_lookup.find_runtime`).

    Raises:
        ConfigurationError (DF005): no such runtime.
        BackendInitializationError (DF002): a package it needs is missing, or it has no such device.
    """
    runtime = find_runtime(name)
    missing = [p for p in runtime.packages if importlib.util.find_spec(p) is None]
    if missing:
        raise BackendInitializationError(f"the {name} sweep needs {', '.join(missing)}, not installed",
                                         hint=f"pip install {' '.join(missing)}", backend=name)
    return runtime.target(device)


def flatten_tensors(value: object, found: list[torch.Tensor]) -> object:
    """``value`` with each tensor (inside lists, tuples and dicts too) replaced by its index in
    ``found``, where it is appended: the skeleton the exported module rebuilds the call from."""
    if isinstance(value, torch.Tensor):
        found.append(value)
        return _Slot(len(found) - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(flatten_tensors(v, found) for v in value)
    if isinstance(value, dict):
        return {k: flatten_tensors(v, found) for k, v in value.items()}
    return value


class _Slot:
    """Where the ``index``-th tensor input goes in a call's skeleton."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<input {self.index}>"


def _fill(skeleton: object, tensors: tuple[torch.Tensor, ...]) -> object:
    """The call's value rebuilt from its skeleton (:func:`flatten_tensors`) with ``tensors`` in its slots."""
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, tensors) for v in skeleton)
    if isinstance(skeleton, dict):
        return {k: _fill(v, tensors) for k, v in skeleton.items()}
    return skeleton


class _OneOp(torch.nn.Module):
    """The operator applied to the graph's inputs, every other argument a constant."""

    def __init__(self, op: Callable[..., object], args: list[object], kwargs: dict[str, object]) -> None:
        super().__init__()
        self.op, self.args, self.kwargs = op, args, kwargs

    def forward(self, *tensors: torch.Tensor) -> object:
        args, kwargs = _fill(self.args, tensors), _fill(self.kwargs, tensors)
        assert isinstance(args, list) and isinstance(kwargs, dict)
        return self.op(*args, **kwargs)


#: A call's skeleton: its positional arguments and keyword arguments, tensors replaced by slots.
Skeleton = tuple[list[object], dict[str, object]]


def export_op(op: Callable[..., object], args: list[object], kwargs: dict[str, object], tensors: list[torch.Tensor],
              log: Path) -> bytes:
    """The serialized one-operator ONNX graph of ``op`` on the skeletons ``args`` / ``kwargs``
    (inputs ``tensors``, on the CPU); the exporter's chatter goes to ``log``."""
    import torch.onnx  # before capturing: importing it gives its logger a stderr handler

    from ..backends._onnx_graph import captured_output

    example = tuple(t.detach().cpu().contiguous() for t in tensors)
    with torch.no_grad(), captured_output(log, f"export of {getattr(op, '__name__', op)}"):
        program = torch.onnx.export(_OneOp(op, args, kwargs), example, dynamo=True, verbose=False,
                                    input_names=[f"input_{i}" for i in range(len(example))], report=False)
    if program is None:  # pragma: no cover - the dynamo exporter always returns its program
        raise RuntimeError("torch.onnx.export returned no program")
    return program.model_proto.SerializeToString()


class _Graph:
    """One exported graph and its runtime session."""

    def __init__(self, skeleton: Skeleton, run: GraphRun, nodes: int) -> None:
        self.skeleton, self.run, self.nodes = skeleton, run, nodes


class RuntimeRunner:
    """The runtime's sessions on one-operator graphs, cached by operator, dtype and input signature."""

    def __init__(self, runtime: OpSweepRuntime, device: str, scratch: Path) -> None:
        self.runtime, self.device = runtime, device
        self.target = check_runtime(runtime.name, device)
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.cache: dict[tuple[object, ...], _Graph | NotTaken] = {}
        #: calls that ran a graph with at least one node (reset per operator by the worker)
        self.graphs = 0
        self.exports = 0

    def version_info(self) -> JsonObject:
        """The runtime's version and settings, for the sweep's record."""
        info: JsonObject = {"runtime": self.runtime.name, "version": self.runtime.version(), "target": self.target}
        if self.runtime.precision_hint is not None:
            info["precision_hint"] = self.runtime.precision_hint
        return info

    def bind(self, key: str, dtype: str, op: Callable[..., object]) -> Callable[..., list[torch.Tensor]]:
        """The call of operator ``key`` (OpInfo's ``op``) through the runtime, for samples in ``dtype``."""

        def call(*args: object, **kwargs: object) -> list[torch.Tensor]:
            tensors: list[torch.Tensor] = []
            skeleton: Skeleton = ([flatten_tensors(a, tensors) for a in args],
                                  {k: flatten_tensors(v, tensors) for k, v in kwargs.items()})
            signature = (key, dtype, repr(skeleton), tuple((tuple(t.shape), t.dtype) for t in tensors))
            graph = self.cache.get(signature) or self.cache.get((key, dtype))
            if graph is None:
                graph = self.cache[signature] = self._build(op, skeleton, tensors)
                if isinstance(graph, NotTaken) and any(m in str(graph) for m in _WHOLE_OP):
                    self.cache[(key, dtype)] = graph  # no translation or kernel at all: no other shape exports
            if isinstance(graph, NotTaken):
                raise graph
            outs = graph.run([t.detach().cpu().contiguous() for t in tensors])
            if graph.nodes:
                self.graphs += 1
            return outs

        return call

    def _build(self, op: Callable[..., object], skeleton: Skeleton, tensors: list[torch.Tensor]) -> _Graph | NotTaken:
        """Export and load one graph; the NotTaken to raise for every sample of its signature when
        the exporter or the runtime refuses it."""
        import onnx

        try:
            data = export_op(op, skeleton[0], skeleton[1], tensors, self.scratch / "export.log")
        except Exception as exc:  # noqa: BLE001 - the exporter's refusal is the classification
            return NotTaken(f"torch.onnx cannot export it: {_short(exc)}")
        self.exports += 1
        model = onnx.load_from_string(data)
        nodes = len(model.graph.node)
        try:
            run = self.runtime.session(data, self.target, self.scratch)
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal is the classification
            return NotTaken(f"{self.runtime.name} does not load the exported graph: {_short(exc)}")
        return _Graph(skeleton, run, nodes)


#: Refusals that hold for every shape of an operator in a dtype: the exporter has no ONNX function
#: for its ATen operator, or the runtime no kernel for a node's type.
_WHOLE_OP = ("No ONNX function found", "Could not find an implementation for")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _short(exc: BaseException) -> str:
    """The first line of the innermost cause (the exporter wraps the operator's own reason), plain text."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in _ANSI.sub("", str(exc)).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
