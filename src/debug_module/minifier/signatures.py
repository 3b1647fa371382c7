"""Failure signatures: what must hold at every reduction step (the same bug, not just "some failure").

Every signature observes a candidate graph in-process (:meth:`Signature.observe`) and matches the
observation with :func:`._runtime.matches` - the same function the generated ``repro.py`` uses, so a
repro "reproduces" exactly when the minifier's oracle would say so.

- :class:`ConstraintSignature` - a constraint violation: which constraint, which op.
- :class:`ExceptionSignature` - a compiler/runtime exception: its type and a message pattern.
- :class:`AccuracySignature` - outputs under a backend differ from eager (or float64) beyond tolerance.
"""

from __future__ import annotations

import importlib
import operator
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.fx

from debug_framework.comparison import RatioRule
from debug_framework.jsonio import JsonObject
from debug_framework.repro_format import is_installed

from ..constraints import Constraint, Violation, as_constraint, check_graph
from ..errors import MinifierError
from . import _runtime

__all__ = ["Signature", "ConstraintSignature", "ExceptionSignature", "AccuracySignature", "BackendRef",
           "signature_from_dict"]

Backend = Callable[[torch.fx.GraphModule, Sequence[object]], Callable[..., object]]
#: The classes of an accuracy failure, as each output row of an observation names it.
FAILURE_CLASSES = ("shape", "dtype", "nonfinite", "value", "outputs")


# --------------------------------------------------------------------------- backends in repros


class BackendRef:
    """How a generated repro gets the backend: a named ``torch.compile`` backend (``"inductor"``), an
    importable ``module:attr`` (installed packages), or a source file copied next to the repro
    (``/path/file.py:attr``, for backends that live in user code)."""

    def __init__(self, kind: str, *, name: str | None = None, module: str | None = None,
                 path: str | None = None, attr: str | None = None) -> None:
        self.kind, self.name, self.module, self.path, self.attr = kind, name, module, path, attr

    @classmethod
    def resolve(cls, backend: Backend | str, spec: str | None = None) -> BackendRef:
        if spec is not None:
            target, _, attr = spec.rpartition(":")
            if not target or not attr:
                raise MinifierError(f"backend_spec {spec!r} is not 'module:attr' or 'file.py:attr'",
                                    hint="e.g. backend_spec='my_compiler.backends:compile_graph'")
            if target.endswith(".py"):
                return cls("file", path=str(Path(target).resolve()), attr=attr)
            return cls("module", module=target, attr=attr)
        if isinstance(backend, str):
            return cls("torch_compile", name=backend)
        module_name = getattr(backend, "__module__", None)
        attr = getattr(backend, "__qualname__", None) or getattr(backend, "__name__", None)
        if not module_name or not attr or "<" in attr or "." in attr:
            raise MinifierError(
                f"cannot refer to backend {backend!r} from a standalone repro (not a module-level function)",
                hint="pass backend_spec='module:attr' or 'path/to/file.py:attr' naming it")
        module = sys.modules.get(module_name)
        file = getattr(module, "__file__", None)
        if module_name != "__main__" and file and is_installed(file) and not _is_project(file):
            return cls("module", module=module_name, attr=attr)
        if file is None:
            raise MinifierError(f"backend {attr} comes from {module_name}, which has no source file",
                                hint="pass backend_spec naming an importable module or a .py file")
        return cls("file", path=str(Path(file).resolve()), attr=attr)

    def to_dict(self) -> JsonObject:
        return {k: v for k, v in vars(self).items() if v is not None}


def _is_project(file: str) -> bool:
    here = Path(__file__).resolve().parents[2]  # src/
    return Path(file).resolve().is_relative_to(here)


def _load_backend(ref: JsonObject) -> Backend:
    if ref["kind"] == "module":
        return getattr(importlib.import_module(ref["module"]), ref["attr"])
    raise MinifierError(f"backend reference {ref} cannot be loaded in-process")


# --------------------------------------------------------------------------- signatures


class Signature(ABC):
    kind: str

    @abstractmethod
    def observe(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> JsonObject:
        """Run/check ``gm`` and return a JSON-ready observation."""

    @abstractmethod
    def to_dict(self) -> JsonObject:
        """JSON form; what :func:`._runtime.matches` reads."""

    @abstractmethod
    def describe(self) -> str: ...

    def holds(self, obs: JsonObject) -> bool:
        return _runtime.matches(self.to_dict(), obs)

    def check(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> tuple[bool, JsonObject]:
        obs = self.observe(gm, inputs)
        return self.holds(obs), obs

    def backend_ref(self) -> BackendRef | None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


def _is_aten_graph(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op in ("call_method", "call_module"):
            return False
        if n.op == "call_function" and n.target is not operator.getitem and not isinstance(n.target, torch._ops.OpOverload):
            return False
    return True


class ConstraintSignature(Signature):
    """A violation of ``constraint`` (a violation name: ``"dtype"``, ``"shape_alignment"``,
    ``"unsupported_op"`` ...) at an ``op`` (ATen name, with or without overload; ``None``: any op),
    optionally with a message matching ``message`` (a regex).

    ``constraints`` are the Constraint objects to check with (default: the mock accelerator's).
    ATen graphs are checked as they are (``node.meta["val"]``, like the mock backend); other FX graphs
    are first traced to ATen with ``make_fx`` on the real inputs.
    """

    kind = "constraint"

    def __init__(self, constraint: str, op: str | None = None, *, message: str | None = None,
                 constraints: Sequence[Constraint | Callable[..., object]] | None = None) -> None:
        if constraints is None:
            from ..config import MockConfig

            constraints = MockConfig().constraints()
        self.constraint = constraint
        self.op = op
        self.message = message
        self.constraints = [as_constraint(c) for c in constraints]

    @classmethod
    def from_violation(cls, v: Violation, constraints: Sequence[Constraint | Callable[..., object]] | None = None) -> ConstraintSignature:
        return cls(v.constraint, v.op, constraints=constraints)

    def to_dict(self) -> JsonObject:
        return {"kind": self.kind, "constraint": self.constraint, "op": self.op, "message": self.message,
                "constraints": self.inline_constraints()}

    def inline_constraints(self) -> list[JsonObject]:
        """The JSON configuration of the constraints that can produce this violation (for the repro)."""
        out = []
        for c in self.constraints:
            d = c.describe()
            if d.get("name") not in _runtime.INLINE_CONSTRAINTS:
                continue
            produces = {"memory": ("memory_per_tensor", "memory_peak")}.get(d["name"], (d["name"],))
            if self.constraint in produces:
                out.append(_jsonable(d))
        return out

    @property
    def inlinable(self) -> bool:
        return bool(self.inline_constraints())

    def describe(self) -> str:
        return f"constraint {self.constraint!r} violated" + (f" at {self.op}" if self.op else "")

    def observe(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> JsonObject:
        if not _is_aten_graph(gm) or any(n.op == "call_function" and "val" not in n.meta for n in gm.graph.nodes):
            from torch.fx.experimental.proxy_tensor import make_fx

            gm = make_fx(gm, tracing_mode="real")(*inputs)
        report = check_graph(gm, self.constraints, "candidate")
        return {"kind": self.kind,
                "violations": [{"constraint": v.constraint, "op": v.op or "", "node": v.node, "message": v.message}
                               for v in report.violations]}


def _jsonable(x: object) -> object:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    return x


class _BackendSignature(Signature):
    def __init__(self, backend: Backend | str, backend_spec: str | None = None) -> None:
        self.backend = backend
        self.backend_spec = backend_spec
        self._ref: BackendRef | None = None

    def backend_ref(self) -> BackendRef:
        if self._ref is None:
            self._ref = BackendRef.resolve(self.backend, self.backend_spec)
        return self._ref

    def _compile(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> Callable[..., object]:
        """``gm`` compiled by the backend. A backend callable gets a copy (:func:`._runtime.backend_copy`):
        what it edits in place never reaches ``gm``, which the reference and the eager baseline run."""
        if isinstance(self.backend, str):
            return torch.compile(gm, backend=self.backend)
        return self.backend(_runtime.backend_copy(gm), list(inputs))

    def _backend_name(self) -> str:
        b = self.backend
        return b if isinstance(b, str) else getattr(b, "__qualname__", None) or repr(b)


class ExceptionSignature(_BackendSignature):
    """Compiling the graph with ``backend`` and running it raises ``exc_type`` (a class or its name;
    subclasses count) with a message matching ``pattern`` (a regex, searched).

    ``backend(gm, example_inputs) -> callable`` follows the ``torch.compile`` backend convention, or
    is a registered backend name. In isolated (subprocess) mode a process that dies without a Python
    exception is observed as ``ProcessCrash`` with ``"exit code N"`` / ``"signal N"`` in the message.
    """

    kind = "exception"

    def __init__(self, exc_type: type[BaseException] | str, pattern: str = "", *, backend: Backend | str,
                 backend_spec: str | None = None) -> None:
        super().__init__(backend, backend_spec)
        self.exc_type = exc_type if isinstance(exc_type, str) else exc_type.__name__
        self.pattern = pattern

    def to_dict(self) -> JsonObject:
        return {"kind": self.kind, "type": self.exc_type, "pattern": self.pattern}

    def describe(self) -> str:
        return f"{self.exc_type} matching {self.pattern!r} from backend {self._backend_name()}"

    def observe(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> JsonObject:
        return _runtime.observe_exception(lambda: self._compile(gm, inputs)(*inputs))


class AccuracySignature(_BackendSignature):
    """Outputs of the graph compiled by ``backend`` differ from a reference run beyond ``rtol``/``atol``
    (|alt - ref| <= atol + rtol*|ref| fails somewhere over the finite pairs, a non-finite value where
    the reference has another, a shape or dtype that differs: the comparison core's rule, with
    ``equal_nan``). Observed by :func:`._runtime.observe_accuracy`, the function the repro runs too:
    fresh clones of the inputs for every run, compile caches off.

    ``reference``: ``"eager"`` (the graph run as is) or ``"float64"`` (floating inputs cast to float64).
    ``ratio``: with ``reference="float64"``, judge by the project's ratio rule instead of rtol/atol
    (:meth:`debug_framework.comparison.RatioRule.verdict`: the backend's error against float64 may be at
    most ``multiplier`` times the eager graph's own error at the inputs' precision, plus ``floor``), as
    KernelDiff's float64 mode judges (``_runtime.ratio_outputs``, kept in agreement with it by a test).
    ``floor_rms``: with ``ratio``, each output's floor is ``ratio.floor + floor_rms x RMS(its float64
    value)`` (:meth:`~debug_framework.comparison.RatioRule.calibrated` per output: ``floor_eps x eps``).
    ``failures``: the classes of failure that count (``shape``, ``dtype``, ``nonfinite``, ``value``,
    ``outputs`` for a different number of outputs; ``None``: any); :meth:`for_failure` sets them from
    the original graph's observation. Shape and dtype are judged against the graph run eagerly at
    the inputs' precision, so a dtype-only difference (equal values) fails.
    ``output``: name of an intermediate node to judge instead of the graph outputs (the graph is first
    cut to that node's inputs cone). If the backend raises, the signature does not hold (another bug).
    """

    kind = "accuracy"

    def __init__(self, backend: Backend | str, *, reference: str = "eager", rtol: float = 1e-4, atol: float = 1e-5,
                 output: str | None = None, backend_spec: str | None = None, ratio: RatioRule | None = None,
                 floor_rms: float = 0.0, failures: Sequence[str] | None = None) -> None:
        super().__init__(backend, backend_spec)
        if reference not in ("eager", "float64"):
            raise MinifierError(f"unknown reference {reference!r}", hint="use 'eager' or 'float64'")
        if ratio is not None and (reference != "float64" or ratio.metric != "rmse"):
            raise MinifierError("a ratio-rule accuracy signature judges RMSE against float64",
                                hint="pass reference='float64' and a RatioRule with metric='rmse'")
        self.reference, self.rtol, self.atol, self.output = reference, float(rtol), float(atol), output
        self.ratio, self.floor_rms = ratio, float(floor_rms)
        unknown = sorted(set(failures or ()) - set(FAILURE_CLASSES))
        if unknown:
            raise MinifierError(f"unknown accuracy failure class(es) {unknown}", hint=f"use {', '.join(FAILURE_CLASSES)}")
        self.failures = sorted(set(failures)) if failures else None

    def to_dict(self) -> JsonObject:
        ratio = None if self.ratio is None else {"multiplier": self.ratio.multiplier, "floor": self.ratio.floor,
                                                  "metric": self.ratio.metric}
        if ratio is not None and self.floor_rms:
            ratio["floor_rms"] = self.floor_rms
        return {"kind": self.kind, "reference": self.reference, "rtol": self.rtol, "atol": self.atol,
                "output": self.output, "ratio": ratio, "failures": self.failures}

    def describe(self) -> str:
        which = f" [{'/'.join(self.failures)}]" if self.failures else ""
        if self.ratio is not None:
            per_output = f" + {self.floor_rms:g} x RMS(output)" if self.floor_rms else ""
            return (f"outputs under backend {self._backend_name()} exceed the ratio rule against float64{which} "
                    f"(RMSE <= {self.ratio.multiplier:g} x eager's + {self.ratio.floor:g}{per_output})")
        return (f"outputs under backend {self._backend_name()} differ from {self.reference}{which} "
                f"(rtol={self.rtol:g}, atol={self.atol:g})")

    def observe(self, gm: torch.fx.GraphModule, inputs: Sequence[object]) -> JsonObject:
        """The same observation the repro makes (:func:`._runtime.observe_accuracy`): fresh input clones
        for every run, compile caches off, one rule for shapes, dtypes, non-finite values and errors."""
        return _runtime.observe_accuracy(gm, lambda fresh: self._compile(gm, fresh), inputs, self.to_dict())

    def for_failure(self, observation: JsonObject) -> AccuracySignature:
        """This signature narrowed to the classes of failure (``shape``, ``dtype``, ``nonfinite``,
        ``value``) that ``observation`` shows, so reduction keeps the same bug: a dtype-only failure is
        not traded for a rounding difference, a NaN not for a small error."""
        classes = sorted({row.get("failure") for row in observation.get("outputs", [])
                          if not row.get("passed") and row.get("failure")})
        return AccuracySignature(self.backend, reference=self.reference, rtol=self.rtol, atol=self.atol,
                                 output=self.output, backend_spec=self.backend_spec, ratio=self.ratio,
                                 floor_rms=self.floor_rms, failures=classes or None)


def signature_from_dict(data: JsonObject, *, backend: Backend | str | None = None,
                        constraints: Sequence[Constraint] | None = None) -> Signature:
    """Rebuild a signature from its JSON form (``backend`` must be given for exception/accuracy ones
    unless ``data["backend"]`` names an importable module)."""
    kind = data.get("kind")
    if kind == "constraint":
        return ConstraintSignature(data["constraint"], data.get("op"), message=data.get("message"), constraints=constraints)
    if backend is None and isinstance(data.get("backend"), dict):
        backend = _load_backend(data["backend"])
    if backend is None:
        raise MinifierError(f"a {kind} signature needs a backend", hint="pass backend=")
    if kind == "exception":
        return ExceptionSignature(data["type"], data.get("pattern", ""), backend=backend)
    if kind == "accuracy":
        ratio = data.get("ratio")
        return AccuracySignature(backend, reference=data.get("reference", "eager"), rtol=data.get("rtol", 1e-4),
                                 atol=data.get("atol", 1e-5), output=data.get("output"),
                                 ratio=None if not ratio else RatioRule(float(ratio["multiplier"]),
                                                                        float(ratio["floor"]), str(ratio["metric"])),
                                 floor_rms=float((ratio or {}).get("floor_rms", 0.0)), failures=data.get("failures"))
    raise MinifierError(f"unknown signature kind {kind!r}", hint="use constraint, exception or accuracy")

