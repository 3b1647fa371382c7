"""ONNX Runtime as an op-sweep runtime: how the conformance sweep (``debug_opsweep --runtime
onnxruntime``) runs one exported single-operator ONNX graph, the execution provider a torch device
name maps to, and the source of the repro's runner (:class:`~debug_framework.conformance.runtime_lookup.OpSweepRuntime`).

    from debug_framework.backends.onnxruntime.opsweep import RUNTIME
    target = RUNTIME.target("cpu")                        # "CPUExecutionProvider"
    run = RUNTIME.session(graph_bytes, target, scratch)  # run([tensors]) -> [tensors]

No ``__init__.py`` here yet: the engine's package is being assembled (a namespace package until then).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...errors import BackendInitializationError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["OnnxRuntimeOpSweep", "RUNTIME"]

#: torch device kinds -> ONNX Runtime's execution providers
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

#: ``run_graph(data, tensors, spec)`` of a generated repro.py (needs ``torch`` imported): the
#: serialized graph run by ONNX Runtime on the provider the sweep used, outputs as torch tensors.
_REPRO_RUNNER = '''

def run_graph(data, tensors, spec):
    """The exported graph run by ONNX Runtime on the sweep's execution provider."""
    import numpy as np
    import onnxruntime as ort

    def to_numpy(t):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            import ml_dtypes
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    def to_torch(a):
        a = np.asarray(a)
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())

    session = ort.InferenceSession(data, providers=[spec["runtime_target"]])
    feeds = dict(zip([i.name for i in session.get_inputs()], [to_numpy(t) for t in tensors]))
    return [to_torch(o) for o in session.run(None, feeds)]
'''


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` as a contiguous CPU array (bfloat16 as ``ml_dtypes.bfloat16`` by its bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: object) -> torch.Tensor:
    """One of the session's outputs as a torch tensor (bfloat16 read by its bits)."""
    import numpy as np

    arr = np.asarray(a)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


class OnnxRuntimeOpSweep:
    """ONNX Runtime's part in the op sweep: an ``InferenceSession`` per exported graph."""

    name = "onnxruntime"
    #: the Python packages the sweep (and a repro) needs: the runtime, and the exporter's
    packages: tuple[str, ...] = ("onnxruntime", "onnx", "onnxscript")
    #: ONNX Runtime computes each node in its graph's dtype: no precision hint
    precision_hint: str | None = None
    repro_runner = _REPRO_RUNNER

    def version(self) -> str | None:
        """The installed ``onnxruntime`` version."""
        import onnxruntime as ort

        return str(ort.__version__)

    def target(self, device: str) -> str:
        """The execution provider for the torch device name ``device`` (``CPUExecutionProvider``...);
        BackendInitializationError (DF002) where this installation has none."""
        import onnxruntime as ort

        provider = _PROVIDERS.get(device.split(":")[0])
        present = ort.get_available_providers()
        if provider is None or provider not in present:
            raise BackendInitializationError(
                f"onnxruntime has no execution provider for device {device!r}",
                hint=f"its providers here: {', '.join(present)} (--device cpu or cuda)", backend=self.name)
        return provider

    def session(self, data: bytes, target: str, scratch: Path) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """A session on the serialized graph ``data``: contiguous CPU tensors in, tensors out."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = max(1, torch.get_num_threads())
        session = ort.InferenceSession(data, sess_options=options, providers=[target])
        names = [i.name for i in session.get_inputs()]

        def run(feeds: list[torch.Tensor]) -> list[torch.Tensor]:
            outs = session.run(None, dict(zip(names, map(_to_numpy, feeds), strict=True)))
            return [_to_torch(o) for o in outs]

        return run


#: The runtime the sweep's lookup (:func:`debug_framework.conformance.runtime_lookup.find_runtime`) takes.
RUNTIME = OnnxRuntimeOpSweep()
