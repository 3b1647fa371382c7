"""The sweep's worker process: it loads the plugin, makes each kernel's samples and runs them one at
a time on the parent's request, so a kernel that crashes the process or hangs costs one sample.

Run as ``python -m debug_framework.plugins.worker READ_FD WRITE_FD``; the parent first sends the
arguments of :class:`WorkerState`, then, over the same pipes (``multiprocessing`` connections
between this package's own processes), 
``("samples", kernel)`` -> list of sample descriptions, ``("run", kernel, i)`` -> result dict,
``("repro", kernel, i, folder)`` -> the repro's path, ``("stop",)``. Replies are ``("ok", value)`` or
``("error", message)`` (the plugin failed to load, say).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .pipeworker import serve

__all__ = ["worker_main", "WorkerState"]


class WorkerState:
    """The plugin (loaded on first use) and each kernel's samples, made on first use."""

    def __init__(self, definition: dict[str, Any] | None, artifact: str, backend_type: str,
                 model_shapes: dict[str, list[dict[str, list[int]]]], seed: int, opinfo: bool) -> None:
        import torch

        from .manifest import PluginDefinition

        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        self.defn = None if definition is None else PluginDefinition.from_dict(definition)
        self.artifact = Path(artifact)
        self.backend_type = backend_type
        self.model_shapes, self.seed, self.opinfo = model_shapes, seed, opinfo
        self._kernels: dict[str, Any] | None = None
        self._samples: dict[str, list[Any]] = {}
        if self.defn is not None and self.defn.backend_type == "triton":
            from .loading import triton_mode

            # Triton's mode chosen before OpInfo's import: on a GPU machine that imports Triton
            # (compiled), after which a CPU plugin's interpreter could no longer be chosen
            triton_mode(self.defn)
        if opinfo:  # imported while starting (not bounded by the user's --timeout), not by the first samples
            try:
                import torch.testing._internal.common_methods_invocations  # noqa: F401
            except Exception:  # noqa: BLE001 - missing expecttest etc.: no OpInfo samples (samples._opinfos)
                pass

    @property
    def kernels(self) -> dict[str, Any]:
        from .loading import load_plugin

        if self._kernels is None:
            assert self.defn is not None
            self._kernels = load_plugin(self.defn, self.artifact)
        return self._kernels

    def samples(self, kernel: str) -> list[Any]:
        from .samples import make_samples

        if kernel not in self._samples:
            spec = self.kernels[kernel].spec
            self._samples[kernel] = make_samples(spec, seed=self.seed, model_shapes=self.model_shapes.get(kernel),
                                                 opinfo=self.opinfo)
        return self._samples[kernel]

    def handle(self, msg: tuple[Any, ...]) -> Any:
        from .checks import validate_artifact
        from .evaluate import evaluate_sample
        from .repro import write_repro_dir

        if msg[0] == "load":
            return sorted(self.kernels) if self.defn is not None else []
        if msg[0] == "checks":
            return validate_artifact(self.artifact, self.backend_type, self.defn)
        if msg[0] == "samples":
            return [s.describe() for s in self.samples(msg[1])]
        if msg[0] == "run":
            return evaluate_sample(self.kernels[msg[1]], self.samples(msg[1])[msg[2]])
        if msg[0] == "repro":
            assert self.defn is not None
            return str(write_repro_dir(self.defn, self.artifact, self.kernels[msg[1]].spec, self.samples(msg[1])[msg[2]],
                                   Path(msg[3])))
        raise ValueError(f"unknown request {msg[0]!r}")


def worker_main(inbox: Any, conn: Any) -> None:
    """The worker's loop (:func:`~.pipeworker.serve`): read the start arguments from ``inbox``, then
    answer requests on ``conn``; a plugin that cannot be set up is reported, and raised as DF008."""
    serve(inbox, conn, WorkerState)


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    worker_main(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
