"""OpenVINO as an op-sweep runtime: how the conformance sweep (``debug_opsweep --runtime
openvino``) runs one exported single-operator ONNX graph, the OpenVINO device a torch device name
maps to, its precision hint, and the source of the repro's runner
(:class:`~debug_framework.conformance.runtime_lookup.OpSweepRuntime`).

The sweep compiles with the ``f32`` precision hint (OpenVINO's CPU plugin otherwise computes in
bfloat16 where the processor has it; the judge compares at the sample's own dtype).

No ``__init__.py`` here yet: the engine's package is being assembled (a namespace package until then).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...errors import BackendInitializationError

if TYPE_CHECKING:
    import openvino as ov

__all__ = ["OpenVinoOpSweep", "RUNTIME", "PRECISION_HINT"]

#: OpenVINO's ``INFERENCE_PRECISION_HINT`` in a sweep.
PRECISION_HINT = "f32"

#: ``run_graph(data, tensors, spec)`` of a generated repro.py (needs ``os``, ``torch`` and ``HERE``):
#: the serialized graph compiled by OpenVINO on the sweep's device with its precision hint.
_REPRO_RUNNER = '''

def run_graph(data, tensors, spec):
    """The exported graph compiled by OpenVINO with the sweep's device and precision hint."""
    import numpy as np
    import openvino as ov

    path = os.path.join(HERE, "graph.onnx")
    with open(path, "wb") as fh:
        fh.write(data)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), spec["runtime_target"],
                                  {"INFERENCE_PRECISION_HINT": spec["precision_hint"]})
    request = compiled.create_infer_request()
    for i, t in enumerate(tensors):  # bfloat16 by its bits: OpenVINO shows its data as float16
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            tensor = ov.Tensor(ov.Type.bf16, ov.Shape(list(t.shape)))
            if t.numel():
                tensor.data.view(np.int16)[...] = t.view(torch.int16).numpy()
        else:
            tensor = ov.Tensor(np.array(t.numpy(), copy=True))
        request.set_input_tensor(i, tensor)
    request.infer()
    outs = []
    for i in range(len(compiled.outputs)):
        out = request.get_output_tensor(i)
        data = np.array(out.data, copy=True)
        bf16 = out.element_type.get_type_name() == "bf16"
        outs.append(torch.from_numpy(data.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(data))
    return outs
'''


def _ov_tensor(t: torch.Tensor) -> ov.Tensor:
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


def _from_ov(tensor: ov.Tensor) -> torch.Tensor:
    """An OpenVINO output tensor as a torch tensor (bfloat16 read by its bits)."""
    import numpy as np

    data = np.array(tensor.data, copy=True)
    if tensor.element_type.get_type_name() == "bf16":
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


class OpenVinoOpSweep:
    """OpenVINO's part in the op sweep: one ``Core`` (made on first use), a compiled model per graph."""

    name = "openvino"
    #: the Python packages the sweep (and a repro) needs: the runtime, and the exporter's
    packages: tuple[str, ...] = ("openvino", "onnx", "onnxscript")
    precision_hint: str | None = PRECISION_HINT
    repro_runner = _REPRO_RUNNER

    def __init__(self) -> None:
        self._core: ov.Core | None = None
        self._graphs = 0

    def version(self) -> str | None:
        """The installed ``openvino`` version."""
        import openvino as ov

        return str(ov.__version__)

    def target(self, device: str) -> str:
        """OpenVINO's device (``CPU``, ``GPU``, ``NPU``) for the torch device name ``device``;
        BackendInitializationError (DF002) where this machine has none."""
        import openvino as ov

        kind = device.split(":")[0]
        name = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}.get(kind, kind.upper())
        present = ov.Core().available_devices
        if not any(d.split(".")[0] == name for d in present):
            raise BackendInitializationError(f"OpenVINO has no device {name} (for --device {device})",
                                             hint=f"its devices here: {', '.join(present)}", backend=self.name)
        return name

    def session(self, data: bytes, target: str, scratch: Path) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """The graph ``data`` (written under ``scratch``) compiled for ``target`` with the sweep's
        precision hint: contiguous CPU tensors in, tensors out."""
        import openvino as ov

        if self._core is None:
            self._core = ov.Core()
        self._graphs += 1
        path = scratch / f"graph-{self._graphs}.onnx"
        path.write_bytes(data)
        compiled = self._core.compile_model(self._core.read_model(str(path)), target,
                                            {"INFERENCE_PRECISION_HINT": PRECISION_HINT})
        request = compiled.create_infer_request()

        def run(feeds: list[torch.Tensor]) -> list[torch.Tensor]:
            for i, t in enumerate(feeds):
                request.set_input_tensor(i, _ov_tensor(t))
            request.infer()
            return [_from_ov(request.get_output_tensor(i)) for i in range(len(compiled.outputs))]

        return run


#: The runtime the sweep's lookup (:func:`debug_framework.conformance.runtime_lookup.find_runtime`) takes.
RUNTIME = OpenVinoOpSweep()
