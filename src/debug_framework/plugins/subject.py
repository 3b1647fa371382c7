"""A kernel plugin as the subject of an op sweep: the state the sweep's worker
(:mod:`.worker`, subject ``plugin``) holds for it: the plugin (loaded on first use) and each
kernel's samples (its declared cases and OpInfo's, made on first use from the seed).

Requests (``("name", args...)`` -> value): ``("load",)`` -> the kernel names; ``("checks",)`` ->
:func:`~.checks.validate_artifact`'s report; ``("samples", kernel)`` -> the sample descriptions;
``("run", kernel, i)`` -> the sample's result (:func:`~.evaluate.evaluate_sample`); ``("repro",
kernel, i, folder)`` -> the path of the sample's repro (:func:`~.repro.write_repro_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..jsonio import JsonObject, JsonValue

if TYPE_CHECKING:
    from .loading import LoadedKernel
    from .samples import Sample

__all__ = ["PluginSubject"]


class PluginSubject:
    """The plugin (loaded on first use) and each kernel's samples, made on first use."""

    def __init__(self, definition: JsonObject | None, artifact: str, backend_type: str,
                 model_shapes: dict[str, list[dict[str, list[int]]]], seed: int, opinfo: bool) -> None:
        import torch

        from .manifest import PluginDefinition

        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        self.defn = None if definition is None else PluginDefinition.from_dict(definition)
        self.artifact = Path(artifact)
        self.backend_type = backend_type
        self.model_shapes, self.seed, self.opinfo = model_shapes, seed, opinfo
        self._kernels: dict[str, LoadedKernel] | None = None
        self._samples: dict[str, list[Sample]] = {}
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
    def kernels(self) -> dict[str, LoadedKernel]:
        """The plugin's kernels by name, loaded on first use."""
        from .loading import load_plugin

        if self._kernels is None:
            assert self.defn is not None
            self._kernels = load_plugin(self.defn, self.artifact)
        return self._kernels

    def samples(self, kernel: str) -> list[Sample]:
        """Kernel ``kernel``'s samples (the same list on every call and in every fresh worker)."""
        from .samples import make_samples

        if kernel not in self._samples:
            spec = self.kernels[kernel].spec
            self._samples[kernel] = make_samples(spec, seed=self.seed, model_shapes=self.model_shapes.get(kernel),
                                                 opinfo=self.opinfo)
        return self._samples[kernel]

    def handle(self, msg: tuple[object, ...]) -> JsonValue:
        """The answer to one request (see the module docstring)."""
        from .checks import validate_artifact
        from .evaluate import evaluate_sample
        from .repro import write_repro_dir

        name = msg[0]
        if name == "load":
            return sorted(self.kernels) if self.defn is not None else []
        if name == "checks":
            return validate_artifact(self.artifact, self.backend_type, self.defn)
        kernel = str(msg[1]) if len(msg) > 1 else ""
        if name == "samples":
            return [s.describe() for s in self.samples(kernel)]
        if name == "run":
            return evaluate_sample(self.kernels[kernel], self.samples(kernel)[_index(msg[2])])
        if name == "repro":
            assert self.defn is not None
            return str(write_repro_dir(self.defn, self.artifact, self.kernels[kernel].spec,
                                       self.samples(kernel)[_index(msg[2])], Path(str(msg[3]))))
        raise ValueError(f"unknown request {name!r}")

    def close(self) -> None:
        """Nothing to release: the worker's process ends with it."""


def _index(value: object) -> int:
    """A request's sample index (an ``int`` sent through the pipe)."""
    if not isinstance(value, int):
        raise TypeError(f"a sample index is an int, not {type(value).__name__}")
    return value
