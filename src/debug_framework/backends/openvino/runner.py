"""``openvino``: the Hugging Face model exported to ONNX as every ONNX-graph engine exports it
(every checkpoint an extra graph output), run by OpenVINO (CPU here; any OpenVINO device).

Everything but the runtime is every ONNX-graph engine's
(:class:`~debug_framework.backends._onnx_export.OnnxGraphBackend`): the export under the session's
artifact directory, layer replay by cutting the export at a layer's boundaries (``run_layer``),
the MLP block alone (``run_block``), the drill-down's ONNX graphs. OpenVINO reads each graph with
its ONNX frontend and compiles it for ``device`` with the precision hint asked for.

**Precision.** OpenVINO's CPU plugin computes in bfloat16 by default where the processor has
bfloat16 instructions (``INFERENCE_PRECISION_HINT``), so a run called "float32" may not be.
``precision_hint`` chooses: ``None`` (OpenVINO's default for the device), ``"f32"`` or ``"bf16"``.
A session at ``dtype="bfloat16"`` asks for ``"bf16"``. The hint given and the precision OpenVINO
reports for the compiled model (``inference_precision``) are recorded in ``version_info()`` (the
session's environment). Where ``"bf16"`` is asked for and the device has no bfloat16 arithmetic
(OpenVINO then silently computes in float32), the backend rounds every floating-point value of the
graph (weights and each operation's output) to bfloat16 inside the OpenVINO model itself
(``bf16_rounding: "emulated"``), so a bfloat16 run means bfloat16 on any CPU: the rounding is a
Veltkamp split (``x * (2**16 + 1)``) in float32 arithmetic, exact round-to-nearest-even to 8
significant bits, leaving values beyond 1e30 (masks' ``finfo.min`` constants) as they are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BackendInitializationError
from ...modelio.loader import LoadedModel
from ..base import BaseBackend, cpu_name, installed_version
from .._graph_session import GraphPort
from .._onnx_export import OnnxGraphBackend

if TYPE_CHECKING:
    import numpy as np
    import openvino as ov
    import torch

    from ...jsonio import JsonObject

__all__ = ["OpenVinoBackend", "PRECISION_HINTS", "round_to_bfloat16"]

#: ``precision_hint=`` values -> OpenVINO's ``INFERENCE_PRECISION_HINT`` (None: the device's default).
PRECISION_HINTS: dict[str, str] = {"f32": "f32", "bf16": "bf16"}

#: The hint a session's dtype asks for when no ``precision_hint`` is given.
_DTYPE_HINTS: dict[str, str | None] = {"float32": None, "bfloat16": "bf16"}
#: an OpenVINO precision (a hint, or the element type a device reports) -> the dtype it computes at
_HINT_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}

#: Values with a larger magnitude are left unrounded by the emulation (``x * 65537`` would overflow).
_ROUNDING_LIMIT = 1e30

#: This process's exports of a model with every checkpoint as an output: (model digest, opset,
#: output names) -> the file. A backend prepared again for the same model (another precision hint,
#: another session) copies it instead of exporting again.
_EXPORTS: dict[tuple[str, int | None, tuple[str, ...]], Path] = {}


class _OpenVinoSession:
    """An OpenVINO compiled model behind the session interface the ONNX-graph engines and the
    drill-down use (:class:`~debug_framework.backends._graph_session.GraphSession`): ``run(names, feeds)``, ``get_inputs()``,
    ``get_outputs()``, ``get_providers()``."""

    def __init__(self, compiled: ov.CompiledModel, device: str) -> None:
        self.compiled = compiled
        self.device = device
        self._request = compiled.create_infer_request()

    def get_inputs(self) -> list[GraphPort]:
        return [_Named.of(p) for p in self.compiled.inputs]

    def get_outputs(self) -> list[GraphPort]:
        return [_Named.of(p) for p in self.compiled.outputs]

    def get_providers(self) -> list[str]:
        return [f"OpenVINO {self.device}"]

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs ``names`` (None: all, in graph order) for ``feeds`` (arrays by input name)."""
        import numpy as np

        shapes = {p.get_any_name(): p.get_partial_shape() for p in self.compiled.inputs}
        arrays = {}
        for name, value in feeds.items():
            array = np.ascontiguousarray(value)
            shape = shapes.get(name)
            if shape is not None and shape.is_static and list(array.shape) != [d.get_length() for d in shape]:
                static = [d.get_length() for d in shape]
                if int(np.prod(static)) == array.size:  # a scalar fed to a [1] input, and the like
                    array = array.reshape(static)
            arrays[name] = array
        result = self._request.infer(arrays)
        by_name: dict[str, np.ndarray] = {}
        for port, value in result.items():
            for name in port.get_names():
                by_name[name] = value
        wanted = [o.name for o in self.get_outputs()] if names is None else names
        return [np.array(by_name[n], copy=True) for n in wanted]


#: OpenVINO's element type name -> ONNX Runtime's spelling of the tensor type (``NodeArg.type``)
_ORT_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "bf16": "tensor(bfloat16)", "f64": "tensor(double)",
              "i64": "tensor(int64)", "i32": "tensor(int32)", "boolean": "tensor(bool)", "u8": "tensor(uint8)",
              "i8": "tensor(int8)"}


class _Named:
    """A graph input or output as ONNX Runtime describes it: its ``name`` and its ``type``
    (``tensor(float)``, ``tensor(float16)`` ...)."""

    def __init__(self, name: str, type: str = "") -> None:  # noqa: A002 - ONNX Runtime's attribute name
        self.name = name
        self.type = type

    @classmethod
    def of(cls, port: ov.Output) -> _Named:
        """An OpenVINO compiled model's input or output port as ONNX Runtime would name and type it."""
        element = port.get_element_type().get_type_name()
        return cls(port.get_any_name(), _ORT_TYPES.get(element, f"tensor({element})"))


def round_to_bfloat16(model: ov.Model) -> int:
    """Round every float32 value ``model`` (an ``openvino.Model``) computes or holds to bfloat16,
    in place: a rounding after each operation's float32 output (constants included; parameters are
    rounded where they are used, results are the rounded values). Returns how many outputs were
    rounded. The rounding is exact round-to-nearest-even in float32 arithmetic (see the module's
    docstring), so it runs on any device."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    sigma = np.float32(2.0 ** 16 + 1)
    limit = np.float32(_ROUNDING_LIMIT)
    count = 0
    for op in list(model.get_ordered_ops()):
        if op.get_type_name() == "Result":
            continue
        for out in op.outputs():
            if out.get_element_type() != ov.Type.f32:
                continue
            targets = list(out.get_target_inputs())
            if not targets:
                continue
            scaled = ops.multiply(out, ops.constant(sigma))
            rounded = ops.add(scaled, ops.subtract(out, scaled))
            small = ops.less(ops.abs(out), ops.constant(limit))
            value = ops.select(small, rounded, out)
            for target in targets:
                target.replace_source_output(value.output(0))
            count += 1
    model.validate_nodes_and_infer_types()
    return count


def _copy_onnx(source: Path, target: Path) -> None:
    """Copy the ONNX file ``source`` to ``target`` with the external data files it names (kept
    under the same relative names beside ``target``)."""
    import shutil

    import onnx

    proto = onnx.load(str(source), load_external_data=False)
    locations = {entry.value for init in proto.graph.initializer for entry in init.external_data
                 if entry.key == "location"}
    for location in locations:
        dest = target.parent / location
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.parent / location, dest)
    shutil.copyfile(source, target)


class OpenVinoBackend(OnnxGraphBackend):
    """OpenVINO on the ONNX export of a Hugging Face model; float32 or bfloat16.

    Args:
        device: an OpenVINO device name (``"CPU"``, ``"GPU"``...; ``"cpu"`` means ``"CPU"``);
            ``None``: ``"CPU"``.
        artifact_dir, opset, layer_replay, graph_transform, model_file: as for every ONNX-graph
            engine (:class:`~debug_framework.backends._onnx_export.OnnxGraphBackend`).
        precision_hint: ``"f32"``, ``"bf16"`` or ``None`` (the dtype's: bfloat16 asks for
            ``"bf16"``, float32 for OpenVINO's own default on the device, which is bfloat16 on
            processors with bfloat16 instructions).
        emulate_bf16: with ``"bf16"`` on a device OpenVINO runs in float32 anyway, round every
            value to bfloat16 in the graph (default True); False leaves it to OpenVINO.
    """

    name = "openvino"
    supported_dtypes = ("float32", "bfloat16")

    def __init__(self, device: str | None = None, artifact_dir: str | Path | None = None, opset: int | None = None,
                 layer_replay: str = "graph", graph_transform: str | None = None,
                 precision_hint: str | None = None, emulate_bf16: bool = True,
                 model_file: str | Path | None = None) -> None:
        super().__init__(device=None, artifact_dir=artifact_dir, opset=opset,
                         layer_replay=layer_replay, graph_transform=graph_transform, model_file=model_file)
        if precision_hint is not None and precision_hint not in PRECISION_HINTS:
            raise BackendInitializationError(f"unknown precision hint {precision_hint!r}",
                                             hint=f"use one of {', '.join(PRECISION_HINTS)}", backend=self.name)
        self.precision_hint = precision_hint
        self.emulate_bf16 = bool(emulate_bf16)
        self.ov_device = "CPU" if device in (None, "cpu") else str(device).upper()
        self.device = "cpu" if self.ov_device == "CPU" else self.ov_device.lower()
        self._core: ov.Core | None = None
        #: what the last compiled model reports and whether bfloat16 was emulated
        self.inference_precision: str | None = None
        self.bf16_rounding: str | None = None

    def availability(self) -> tuple[bool, str]:
        try:
            import openvino as ov
        except ImportError as exc:
            return False, f"openvino is not installed (pip install openvino): {exc}"
        import importlib.util

        for needed in ("onnx", "onnxscript"):
            if importlib.util.find_spec(needed) is None:
                return False, f"{needed} (needed by torch.onnx's dynamo exporter) is not installed"
        devices = ov.Core().available_devices
        if not any(d.split(".")[0] == self.ov_device for d in devices):
            return False, f"OpenVINO device {self.ov_device!r} is not present (devices: {', '.join(devices)})"
        return True, ""

    def declared_dtype(self, model: LoadedModel) -> tuple[str, str] | None:
        """The precision OpenVINO computes at (``--dtype auto``): the file's own where it runs a
        converted file, else its precision hint, or where none is given the device's default
        inference precision (bfloat16 on a CPU with AMX)."""
        own = super().declared_dtype(model)
        if own is not None and own[0] != "float32":
            return own
        if self.precision_hint is not None:
            return _HINT_DTYPES[self.precision_hint], f"OpenVINO's precision hint {self.precision_hint}"
        default = self._ov_core().get_property(self.ov_device, "INFERENCE_PRECISION_HINT")
        name = default.get_type_name() if hasattr(default, "get_type_name") else str(default)
        dtype = _HINT_DTYPES.get(name, "float32")
        return dtype, f"OpenVINO's default inference precision on {self.ov_device} ({name})"

    def effective_hint(self) -> str | None:
        """The ``INFERENCE_PRECISION_HINT`` given to OpenVINO (None: its default for the device)."""
        return self.precision_hint or _DTYPE_HINTS.get(self.dtype)

    def version_info(self) -> JsonObject:
        import onnx
        import openvino as ov

        core = self._ov_core()
        return {
            **BaseBackend.version_info(self),
            "runtime": "openvino",
            "openvino": ov.get_version(),
            "onnx": onnx.__version__,
            "torch": installed_version("torch"),
            "ov_device": self.ov_device,
            "device_name": core.get_property(self.ov_device, "FULL_DEVICE_NAME") if self.ov_device else cpu_name(),
            "device_capabilities": [str(c) for c in core.get_property(self.ov_device, "OPTIMIZATION_CAPABILITIES")],
            "precision_hint": self.effective_hint() or "default",
            "inference_precision": self.inference_precision,
            "bf16_rounding": self.bf16_rounding,
            "artifact_dir": None if self.artifact_dir is None else str(self.artifact_dir),
            "onnx_path": None if self.onnx_path is None else str(self.onnx_path),
            "export_s": round(self.export_s, 4),
            "layer_replay": self.layer_replay,
            "graph_transform": self.graph_transform,
        }

    def _ov_core(self) -> ov.Core:
        if self._core is None:
            import openvino as ov

            self._core = ov.Core()
        return self._core

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Export the model as every ONNX-graph engine does and compile it with OpenVINO."""
        if device is not None and device not in ("cpu", self.device):
            self.ov_device = str(device).upper()
            self.device = device
        self._device_request = "cpu"  # the parent's export runs on the CPU whatever OpenVINO's device
        dtype_name = str(dtype or self.default_dtype).removeprefix("torch.")
        self.dtype = dtype_name
        super().prepare(model, dtype_name, "cpu")
        self.device = "cpu" if self.ov_device == "CPU" else self.ov_device.lower()

    def can_run_layer(self) -> tuple[bool, str]:
        """An ONNX-file model's layers are not replayed in OpenVINO: the cuts of a file's graph keep
        dynamic ranks its CPU plugin cannot compile (``rank().is_static()``)."""
        if getattr(self, "_file_model", False):
            return False, "cannot replay a layer of an ONNX file alone in OpenVINO (dynamic-rank cuts)"
        return True, ""

    def can_run_block(self) -> tuple[bool, str]:
        """As :meth:`can_run_layer`: no block of an ONNX-file model alone in OpenVINO."""
        if getattr(self, "_file_model", False):
            return False, "cannot run a block of an ONNX file alone in OpenVINO (dynamic-rank cuts)"
        return super().can_run_block()

    def _export(self, module: torch.nn.Module, model: LoadedModel, path: Path, output_names: list[str]) -> float:
        """Export as every ONNX-graph engine does, or copy this process's earlier export of the same model
        with the same outputs (its external data files too) when it still exists."""
        import time

        key = (model.digest, self.opset, tuple(output_names))
        earlier = _EXPORTS.get(key)
        if earlier is not None and earlier != path and earlier.exists():
            start = time.perf_counter()
            try:
                _copy_onnx(earlier, path)
                return time.perf_counter() - start
            except OSError:
                pass  # gone meanwhile or unreadable: export again
        seconds = super()._export(module, model, path, output_names)
        _EXPORTS[key] = path
        return seconds

    def _session(self, path: Path, graph: bytes | None = None, *, arena: bool = True) -> _OpenVinoSession:
        """An OpenVINO compiled model on the file ``path`` or on ``graph`` (a serialized ONNX model
        whose external data lies beside ``path``: written there once, named by its content);
        ``arena`` is another runtime's (OpenVINO has none to turn off)."""
        if self.graph_transform is not None:
            graph = self._transformed(path, graph)
        if graph is not None:
            path = path.with_name(f"{path.stem}-cut-{hashlib.sha256(graph).hexdigest()[:16]}.onnx")
            if not path.exists():
                path.write_bytes(graph)
        return self.open_file(path)

    def open_file(self, path: Path) -> _OpenVinoSession:
        """Compile the ONNX file ``path`` with this backend's device and precision hint."""
        core = self._ov_core()
        hint = self.effective_hint()
        try:
            ov_model = core.read_model(str(path))
            config = {} if hint is None else {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[hint]}
            compiled = core.compile_model(ov_model, self.ov_device, config)
            reported = compiled.get_property("INFERENCE_PRECISION_HINT")
            precision = reported.get_type_name() if hasattr(reported, "get_type_name") else str(reported)
            rounding = None
            if hint == "bf16" and "bf16" not in precision and "bfloat16" not in precision:
                rounding = "emulated" if self.emulate_bf16 else "none (the device computes in float32)"
                if self.emulate_bf16:
                    round_to_bfloat16(ov_model)
                    compiled = core.compile_model(ov_model, self.ov_device, config)
            elif "bf16" in precision or "bfloat16" in precision:
                rounding = "native"
        except Exception as exc:
            raise BackendInitializationError(f"OpenVINO could not compile {path}: {exc}", backend=self.name) from exc
        self.inference_precision, self.bf16_rounding = precision, rounding
        return _OpenVinoSession(compiled, self.ov_device)
