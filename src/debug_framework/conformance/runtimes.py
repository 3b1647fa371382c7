"""Single-op ONNX graphs: a conformance sweep of an ONNX runtime (``onnxruntime``, ``openvino``).

Each sample's operator call is exported with ``torch.onnx.export(dynamo=True)`` as a one-operator
graph (a tiny module whose inputs are the sample's tensors, its other arguments baked in) and run
by the runtime; the sweep judges the outputs exactly as it judges a ``torch.compile`` backend's.

    runner = RuntimeRunner("onnxruntime", "cpu", scratch)
    call = runner.bind("softmax", "float32", op)      # call(*sample.args, **sample.kwargs) -> [tensors]

Exported graphs, with their runtime sessions, are cached per operator, dtype, input shapes and
dtypes and the non-tensor arguments: the sample's other layouts and special values reuse them
(inputs reach the runtime as contiguous arrays). A refusal that holds for every shape (the exporter
has no ONNX function for the ATen operator, the runtime no kernel for a node's type) is cached for
the operator and dtype, so its other samples cost nothing. A sample the exporter cannot export, or the
runtime cannot load or compile, raises :class:`~debug_framework.conformance.judge.NotTaken`: the
sample is ``unsupported`` with that reason, not failed. OpenVINO compiles with its ``f32``
precision hint (its CPU plugin otherwise computes in bfloat16 where the processor has it).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import BackendInitializationError
from .judge import NotTaken

__all__ = ["RUNTIMES", "RuntimeRunner", "check_runtime", "OPENVINO_PRECISION_HINT", "export_op", "flatten_tensors"]

#: The runtimes a sweep takes, with the Python packages each needs.
RUNTIMES: dict[str, tuple[str, ...]] = {"onnxruntime": ("onnxruntime", "onnx", "onnxscript"),
                                        "openvino": ("openvino", "onnx", "onnxscript")}
#: OpenVINO's ``INFERENCE_PRECISION_HINT`` in a sweep (the judge compares at the sample's dtype).
OPENVINO_PRECISION_HINT = "f32"


def check_runtime(runtime: str, device: str) -> str:
    """The runtime's device name (``CPUExecutionProvider``, ``CPU``...) for the torch device name
    ``device``; BackendInitializationError (DF002) naming what is missing otherwise."""
    missing = [p for p in RUNTIMES[runtime] if importlib.util.find_spec(p) is None]
    if missing:
        raise BackendInitializationError(f"the {runtime} sweep needs {', '.join(missing)}, not installed",
                                         hint=f"pip install {' '.join(missing)}", backend=runtime)
    kind = device.split(":")[0]
    if runtime == "onnxruntime":
        import onnxruntime as ort

        provider = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}.get(kind)
        present = ort.get_available_providers()
        if provider is None or provider not in present:
            raise BackendInitializationError(
                f"onnxruntime has no execution provider for device {device!r}",
                hint=f"its providers here: {', '.join(present)} (--device cpu or cuda)", backend=runtime)
        return provider
    import openvino as ov

    name = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}.get(kind, kind.upper())
    present = ov.Core().available_devices
    if not any(d.split(".")[0] == name for d in present):
        raise BackendInitializationError(f"OpenVINO has no device {name} (for --device {device})",
                                         hint=f"its devices here: {', '.join(present)}", backend=runtime)
    return name


def flatten_tensors(value: Any, found: list[torch.Tensor]) -> Any:
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


def _fill(skeleton: Any, tensors: tuple[torch.Tensor, ...]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, tensors) for v in skeleton)
    if isinstance(skeleton, dict):
        return {k: _fill(v, tensors) for k, v in skeleton.items()}
    return skeleton


class _OneOp(torch.nn.Module):
    """The operator applied to the graph's inputs, every other argument a constant."""

    def __init__(self, op: Callable[..., Any], args: Any, kwargs: Any) -> None:
        super().__init__()
        self.op, self.args, self.kwargs = op, args, kwargs

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.op(*_fill(self.args, tensors), **_fill(self.kwargs, tensors))


def export_op(op: Callable[..., Any], args: Any, kwargs: Any, tensors: list[torch.Tensor], log: Path) -> bytes:
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


def _to_numpy(t: torch.Tensor) -> Any:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: Any) -> torch.Tensor:
    import numpy as np

    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _ov_tensor(t: torch.Tensor) -> Any:
    """An OpenVINO tensor holding ``t``'s values (bfloat16 by its bits: OpenVINO's Python API shows
    bfloat16 data as a float16 array, which a numpy value conversion would misread)."""
    import numpy as np
    import openvino as ov

    if t.dtype == torch.bfloat16:
        out = ov.Tensor(ov.Type.bf16, ov.Shape(list(t.shape)))
        if t.numel():
            out.data.view(np.int16)[...] = t.view(torch.int16).numpy()
        return out
    return ov.Tensor(np.array(t.numpy(), copy=True))  # 0-d stays 0-d (ascontiguousarray would not)


def _from_ov(tensor: Any) -> torch.Tensor:
    """An OpenVINO output tensor as a torch tensor (bfloat16 read by its bits)."""
    import numpy as np

    data = np.array(tensor.data, copy=True)
    if tensor.element_type.get_type_name() == "bf16":
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


class _Graph:
    """One exported graph and its runtime session."""

    def __init__(self, skeleton: tuple[Any, Any], run: Callable[[list[torch.Tensor]], list[torch.Tensor]],
                 nodes: int) -> None:
        self.skeleton, self.run, self.nodes = skeleton, run, nodes


class RuntimeRunner:
    """The runtime's sessions on one-operator graphs, cached by operator, dtype and input signature."""

    def __init__(self, runtime: str, device: str, scratch: Path) -> None:
        if runtime not in RUNTIMES:
            raise BackendInitializationError(f"unknown runtime {runtime!r}", hint=f"use {' or '.join(RUNTIMES)}")
        self.runtime, self.device = runtime, device
        self.target = check_runtime(runtime, device)
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.cache: dict[tuple[Any, ...], _Graph | NotTaken] = {}
        #: calls that ran a graph with at least one node (reset per operator by the worker)
        self.graphs = 0
        self.exports = 0
        self._core: Any = None

    def version_info(self) -> dict[str, Any]:
        """The runtime's version and settings, for the sweep's record."""
        module = importlib.import_module(self.runtime)
        info = {"runtime": self.runtime, "version": getattr(module, "__version__", None), "target": self.target}
        if self.runtime == "openvino":
            info["precision_hint"] = OPENVINO_PRECISION_HINT
        return info

    def bind(self, key: str, dtype: str, op: Callable[..., Any]) -> Callable[..., list[torch.Tensor]]:
        """The call of operator ``key`` (OpInfo's ``op``) through the runtime, for samples in ``dtype``."""

        def call(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
            tensors: list[torch.Tensor] = []
            skeleton = (flatten_tensors(list(args), tensors), flatten_tensors(dict(kwargs), tensors))
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

    def _build(self, op: Callable[..., Any], skeleton: tuple[Any, Any], tensors: list[torch.Tensor]) -> _Graph | NotTaken:
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
            run = self._session(data)
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal is the classification
            return NotTaken(f"{self.runtime} does not load the exported graph: {_short(exc)}")
        return _Graph(skeleton, run, nodes)

    def _session(self, data: bytes) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """The runtime's session on the serialized graph: contiguous CPU tensors in, tensors out."""
        if self.runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = max(1, torch.get_num_threads())
            session = ort.InferenceSession(data, sess_options=options, providers=[self.target])
            names = [i.name for i in session.get_inputs()]
            return lambda feeds: [_to_torch(o) for o in session.run(None, dict(zip(names, map(_to_numpy, feeds),
                                                                                       strict=True)))]
        import openvino as ov

        if self._core is None:
            self._core = ov.Core()
        path = self.scratch / f"graph-{self.exports}.onnx"
        path.write_bytes(data)
        compiled = self._core.compile_model(self._core.read_model(str(path)), self.target,
                                            {"INFERENCE_PRECISION_HINT": OPENVINO_PRECISION_HINT})
        request = compiled.create_infer_request()

        def run(feeds: list[torch.Tensor]) -> list[torch.Tensor]:
            for i, t in enumerate(feeds):
                request.set_input_tensor(i, _ov_tensor(t))
            request.infer()
            return [_from_ov(request.get_output_tensor(i)) for i in range(len(compiled.outputs))]

        return run


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
