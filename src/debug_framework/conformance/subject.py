"""A backend as the subject of an op sweep: the state the sweep's worker
(:mod:`debug_framework.plugins.worker`, subject ``backend``) holds for a ``torch.compile`` backend
or an engine's ONNX runtime (:mod:`.runtimes`): the backend resolved, one operator's OpInfo samples
in one dtype (:mod:`.samples`), its compiled call.

Requests: ``("prepare", op, dtype)`` -> ``{"skip": reason}`` or ``{"samples": [description, ...]}``,
``("run", i)`` -> the sample's result (with ``graphs``: how many graphs with an operation reached the
backend for this operator so far), ``("eager", i)`` -> True once the sample's eager runs alone
survived (asked after the sample crashed a worker), ``("repro", op, dtype, i, folder, status)`` ->
the repro's path.

Each operator and dtype is compiled afresh (Dynamo's caches reset, a new code object) with dynamic
shapes (``torch.compile(dynamic=True)``), so its samples share one graph per rank and layout instead
of a static compile followed by a dynamic one. A backend that does not take dynamic shapes is found
on the first sample it refuses (``unsupported``): that sample runs again compiled with static
shapes, and if it is taken there the operator and dtype stay static (a compile per shape); if it is
refused there too, the refusal is the verdict and dynamic shapes are kept. Dynamo may recompile as
often as there are samples and raises rather than falling back to eager.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..jsonio import JsonObject, JsonValue

if TYPE_CHECKING:
    import tempfile

    import torch

    from ..plugins.samples import Sample
    from .runtimes import RuntimeRunner

#: A ``torch.compile`` backend: the captured graph and its example inputs -> the callable to run.
CompilerFn = Callable[..., Callable[..., object]]

__all__ = ["BackendSubject", "resolve_backend"]


def resolve_backend(backend: str, backend_file: str | None, backend_attr: str) -> CompilerFn:
    """The ``torch.compile`` backend: ``backend_attr`` of ``backend_file`` when given, else the
    compiler function registered as ``backend``."""
    if backend_file is not None:
        spec = importlib.util.spec_from_file_location("_df_opsweep_backend", backend_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {backend_file} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        found: CompilerFn = getattr(module, backend_attr)
        return found
    from .._torch.dynamo import lookup_backend

    registered: CompilerFn = lookup_backend(backend)
    return registered


def _size(sample: Sample) -> int:
    """How many elements the sample's tensor arguments hold."""
    import torch

    return sum(a.numel() for a in sample.args if isinstance(a, torch.Tensor))


class BackendSubject:
    """The backend, the current operator's samples and its compiled call."""

    def __init__(self, backend: str, backend_file: str | None, backend_attr: str, device: str, fuzz: bool,
                 seed: int, threads: int, max_samples: int | None = None, grad: bool = False,
                 runtime: str | None = None) -> None:
        import tempfile

        import torch

        from .._torch.dynamo import recompile_limit
        from .devices import check_device

        if threads > 0:  # 0: running inside the caller's process, whose settings are left alone
            torch.set_num_threads(threads)
        self.backend, self.backend_file, self.backend_attr = backend, backend_file, backend_attr
        self.device, self.fuzz, self.seed, self.max_samples, self.grad = device, fuzz, seed, max_samples, grad
        self.runtime = runtime
        self.runner: RuntimeRunner | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        if runtime is not None:  # single-op ONNX graphs run by an ONNX runtime (:mod:`.runtimes`)
            from .runtime_lookup import find_runtime
            from .runtimes import RuntimeRunner

            self._scratch = tempfile.TemporaryDirectory(prefix="df_opsweep_")
            self.runner = RuntimeRunner(find_runtime(runtime), device, Path(self._scratch.name))
            self.compiler = None
        else:
            check_device(device)
            self.compiler = resolve_backend(backend, backend_file, backend_attr)
        self._limit = recompile_limit(100_000)
        self._limit.__enter__()  # for the worker's life: never fall back to eager silently
        self.current: tuple[str, str] | None = None
        self.samples: list[Sample] = []
        self.compiled: Callable[..., object] | None = None
        #: how the current operator and dtype compile: with dynamic shapes (True), or static ones
        #: (False: the backend refused a dynamic graph that it takes static)
        self.dynamic = True
        #: a refusal under dynamic shapes is tried once more with static ones (once per operator and dtype)
        self.retry_static = True
        self.graphs = 0
        self.count = 0

    def close(self) -> None:
        """Leave the recompile-limit setting (matters only when running inside the caller's process)
        and remove the runtime's scratch directory."""
        self._limit.__exit__(None, None, None)
        if self._scratch is not None:
            self._scratch.cleanup()

    def _counting(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        """The backend's compiled graph; a graph holding an operation is counted (``graphs``)."""
        if any(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes):
            self.graphs += 1
        return self.compiler(gm, example_inputs)

    def prepare(self, key: str, dtype: str) -> JsonObject:
        """Operator ``key``'s samples in ``dtype`` made and its call compiled (or bound to the
        runtime): ``{"samples": [description, ...]}``, or ``{"skip": reason}`` where none is judged."""
        from .judge import randomness
        from .ops import DTYPES, find_op
        from .samples import op_samples

        info = find_op(key)
        if self.current is None or self.current[0] != key:
            self.graphs = 0
            if self.runner is not None:
                self.runner.graphs = 0
        self.current = (key, dtype)
        self.dynamic, self.retry_static = True, True
        op = info.op
        if self.runner is not None:
            self.compiled = self.runner.bind(key, dtype, op)
        else:
            self._compile(op)
        sample_device = "cpu" if self.runner is not None else self.device
        if DTYPES[dtype] not in info.supported_dtypes(sample_device):
            self.samples = []
            return {"skip": f"OpInfo does not support {dtype} on {sample_device}"}
        if self.grad and (not info.supports_autograd or DTYPES[dtype] not in info.supported_backward_dtypes(self.device)):
            self.samples = []
            return {"skip": f"OpInfo has no backward in {dtype}"}
        # made on the device (OpInfo's samples for it, the fuzzed layouts there); a runtime takes
        # its inputs from the CPU, where eager runs for it
        samples = op_samples(info, dtype, fuzz=self.fuzz, seed=self.seed, device=sample_device)
        self.samples = samples
        if not samples:
            return {"skip": f"OpInfo has no sample in {dtype}"}
        probe = max(samples[:8], key=_size)  # the largest of the first samples: an empty one shows nothing
        reason = randomness(op, probe)
        if reason is not None:
            return {"skip": reason}
        if self.max_samples is not None:
            samples = self.samples = samples[: self.max_samples]
        return {"samples": [s.describe() for s in samples]}

    def _compile(self, op: Callable[..., object]) -> None:
        """A fresh compiled call of ``op`` (Dynamo reset, a code object of its own) in ``self.dynamic``'s mode."""
        import torch

        from .._torch.dynamo import reset

        reset()
        self.count += 1

        def call(*args: object, **kwargs: object) -> object:
            return op(*args, **kwargs)

        call.__code__ = call.__code__.replace(co_name=f"opsweep_{self.count}")  # a code object of its own
        self.compiled = torch.compile(call, backend=self._counting, dynamic=self.dynamic)

    def run(self, i: int) -> JsonObject:
        """Sample ``i``'s verdict (:func:`~.judge.run_sample`, or :func:`~.judge.run_backward` with
        ``grad``); a refusal under dynamic shapes is tried once with static ones."""
        from .judge import run_backward, run_sample
        from .ops import find_op

        assert self.current is not None and self.compiled is not None
        run = run_backward if self.grad else run_sample
        op = find_op(self.current[0]).op
        result = run(op, self.compiled, self.samples[i])
        if result["status"] == "unsupported" and self.runner is None and self.dynamic and self.retry_static:
            # refused with dynamic shapes: does the backend take it with static ones?
            self.dynamic, self.retry_static = False, False
            self._compile(op)
            static = run(op, self.compiled, self.samples[i])
            if static["status"] == "unsupported":  # refused either way: dynamic shapes were not the cause
                self.dynamic = True
                self._compile(op)
            else:
                result = static
        return {**result, "graphs": self.graphs if self.runner is None else self.runner.graphs}

    def eager(self, i: int) -> bool:
        """Sample ``i``'s eager runs alone (after it crashed the worker: does eager crash too?)."""
        from .judge import run_eagerly
        from .ops import find_op

        assert self.current is not None
        run_eagerly(find_op(self.current[0]).op, self.samples[i], self.grad)
        return True

    def repro(self, key: str, dtype: str, i: int, folder: str, status: str) -> str:
        """Write sample ``i``'s repro (:func:`~.repro.write_op_repro`) under ``folder``; its path."""
        from .ops import find_op
        from .repro import write_op_repro

        if self.current != (key, dtype):
            self.prepare(key, dtype)
        return str(write_op_repro(key, find_op(key), self.samples[i], Path(folder), backend=self.backend,
                                  backend_file=self.backend_file, backend_attr=self.backend_attr,
                                  device=self.device, status=status, grad=self.grad, runtime=self.runtime))

    def handle(self, msg: tuple[object, ...]) -> JsonValue:
        """The answer to one request (see the module docstring)."""
        name, args = msg[0], [str(a) if not isinstance(a, int) else a for a in msg[1:]]
        if name == "prepare":
            return self.prepare(str(args[0]), str(args[1]))
        if name == "run":
            return self.run(int(args[0]))
        if name == "eager":
            return self.eager(int(args[0]))
        if name == "repro":
            key, dtype, i, folder, status = args
            return self.repro(str(key), str(dtype), int(i), str(folder), str(status))
        raise ValueError(f"unknown request {name!r}")
