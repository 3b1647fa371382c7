"""The engine registry: one record per engine (:class:`Engine`), names -> factories, and a truthful
availability report.

An engine is one package (or module) under ``debug_framework/backends/`` holding all it knows: its
runner, its layer/block replay and decode, its drill-down strategy, its declared precision, its
option checking. It registers here, once: built-in engines are the records of :data:`BUILTIN_ENGINES`
(every field a lazy ``"module:attribute"`` string, imported only when asked for, so an engine whose
runtime is missing is reported unavailable with the import error as the reason instead of breaking
the registry); installed packages add engines through the entry-point group
:data:`ENTRY_POINT_GROUP` (``name = "package.module:factory"``), read once per process on first use
(so spawned batch workers find them too), equally lazily. Services read what a backend can do from
:func:`~debug_framework.backends.capabilities.capabilities`, and what an engine offers beyond its
backend (its drill-down strategy, the engine running a file format) from its record here.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backend_prefixes import prefix_resolver
from ..errors import BackendInitializationError
from ..suggest import did_you_mean
from .base import Backend

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from ._graph_session import GraphSession
    from .drilldown.types import DrillStrategy

__all__ = [
    "Engine",
    "BUILTIN_ENGINES",
    "register_engine",
    "engine",
    "engines",
    "drill_strategy_factories",
    "graph_runtime",
    "load_attribute",
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "BackendFactory",
    "register_backend",
    "unregister_backend",
    "registered_backends",
    "get_backend",
    "backend_availability",
    "detect_available_backends",
    "AUTO_ORDER",
    "select_alternative",
    "backend_versions",
]

#: ``factory(**options) -> Backend``. A class is a factory.
BackendFactory = Callable[..., Backend]


@dataclass(frozen=True)
class Engine:
    """What the registry knows of one engine. Every reference to the engine's code is a lazy
    ``"module:attribute"`` string (or, for ``factory``, the callable itself), resolved on first use.

    Attributes:
        name: the backend name users pass (``--alternative-backend NAME``).
        factory: ``factory(**options) -> Backend`` or its ``"module:attribute"``.
        drill_strategy: ``"module:attribute"`` of a zero-argument factory of the engine's op-level
            drill-down strategy (:class:`~debug_framework.backends.drilldown.types.DrillStrategy`), or
            None: the generic strategies (trace, replay) are asked.
        opsweep_runtime: ``"module:attribute"`` of the engine's op-sweep runtime (what ``debug_opsweep
            --runtime NAME`` runs single-op graphs with), or None: the engine has none.
        file_formats: model-file formats (``LoadedModel.format``, e.g. ``"onnx"``) this engine runs by
            default when a session gives such a file and no alternative (:func:`default_engine_for`).
        graph_session: ``"module:attribute"`` of ``open(graph: bytes) -> session`` computing a serialized
            graph of one of ``file_formats`` as written, on the CPU: what the float64 reference runners
            of such a file open (:func:`graph_runtime`); None: the engine offers none.
    """

    name: str
    factory: BackendFactory | str
    drill_strategy: str | None = None
    opsweep_runtime: str | None = None
    file_formats: tuple[str, ...] = ()
    graph_session: str | None = None


#: The built-in engines, in registration order (the one place they are named).
BUILTIN_ENGINES: tuple[Engine, ...] = (
    Engine("python_reference", "debug_framework.backends.python_reference:PythonReferenceBackend"),
    Engine("pytorch", "debug_framework.backends.pytorch:PyTorchBackend"),
    Engine("float64_eager", "debug_framework.backends.eager_reference:EagerReferenceBackend"),
    Engine("inductor", "debug_framework.backends.inductor:InductorBackend"),
    Engine("onnxruntime", "debug_framework.backends.onnxruntime.runner:OnnxRuntimeBackend",
           drill_strategy="debug_framework.backends.onnxruntime.drilldown:OnnxDrillStrategy",
           opsweep_runtime="debug_framework.backends.onnxruntime.opsweep:RUNTIME",
           file_formats=("onnx",), graph_session="debug_framework.backends.onnxruntime.sessions:open_plain_session"),
    Engine("openvino", "debug_framework.backends.openvino.runner:OpenVinoBackend",
           drill_strategy="debug_framework.backends.openvino.drilldown:OpenVinoDrillStrategy",
           opsweep_runtime="debug_framework.backends.openvino.opsweep:RUNTIME", file_formats=("onnx",)),
    Engine("mlx", "debug_framework.backends.mlx.runner:MLXBackend"),
    Engine("metal", "debug_framework.backends.mlx.runner:MLXMetalBackend"),
    Engine("cuda", "debug_framework.backends.cuda:CudaBackend"),
    Engine("llamacpp", "debug_framework.backends.llamacpp.runner:LlamaCppBackend",
           drill_strategy="debug_framework.services.drilldown.ggml:GgmlDrillStrategy", file_formats=("gguf",)),
)

#: Built-in backends: name -> the factory's ``"module:attribute"`` (:data:`BUILTIN_ENGINES`' factories).
BUILTIN_BACKENDS: dict[str, str] = {e.name: str(e.factory) for e in BUILTIN_ENGINES}

#: Preference of ``alternative_backend="auto"`` (see docs/backends-more.md): GPU backends first
#: (the hardware a model is deployed on, and the most different arithmetic), then the CPU backends
#: whose code is furthest from eager PyTorch: Inductor's generated kernels, ONNX Runtime's
#: optimised graph, the independent MLX implementation, and eager PyTorch itself.
AUTO_ORDER: tuple[str, ...] = ("cuda", "metal", "inductor", "onnxruntime", "mlx", "pytorch", "python_reference")

_ENGINES: dict[str, Engine] = {e.name: e for e in BUILTIN_ENGINES}

#: The entry-point group of installed backends: ``name = "package.module:factory"``.
ENTRY_POINT_GROUP = "debug_framework.backends"
_entry_points_read = False
_entry_points_lock = threading.Lock()

_HOW_TO_REGISTER = (
    "register one with debug_framework.backends.register_backend(name, factory) in a module given to "
    "debug_validate --backend-module pkg.mod or --backend-file path.py, or install a package declaring it "
    f"in the entry-point group {ENTRY_POINT_GROUP!r}"
)


def _read_entry_points() -> None:
    """Add the backends installed packages declare in :data:`ENTRY_POINT_GROUP` (once per process).

    Each is kept as its lazy ``"module:attribute"`` string, imported when asked for like a built-in.
    A name already registered (a built-in, or registered before the first lookup) is kept.
    """
    global _entry_points_read
    if _entry_points_read:
        return
    from importlib.metadata import entry_points

    with _entry_points_lock:
        if not _entry_points_read:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                _ENGINES.setdefault(ep.name, Engine(ep.name, ep.value.split("[")[0].strip()))
            _entry_points_read = True


def _unknown_backend(name: str) -> BackendInitializationError:
    """DF002 for a name nobody registered: the registered names, the closest one, how to register."""
    return BackendInitializationError(
        "unknown backend" + did_you_mean(name, _ENGINES),
        hint=f"registered backends: {', '.join(_ENGINES)}; {_HOW_TO_REGISTER}", backend=name,
    )


def register_engine(record: Engine, *, replace: bool = False) -> None:
    """Register an engine's record (its factory, drill-down strategy, file formats ...).

    Raises:
        BackendInitializationError: the name is invalid, or taken and ``replace`` is False (DF002).
    """
    name = record.name
    if not name or not isinstance(name, str):
        raise BackendInitializationError(f"invalid backend name {name!r}", backend=str(name))
    if name in _ENGINES and not replace:
        raise BackendInitializationError(
            "a backend of this name is already registered", hint="pass replace=True to override it", backend=name
        )
    _ENGINES[name] = record


def register_backend(name: str, factory: BackendFactory | str, *, replace: bool = False) -> None:
    """Register ``factory`` (a callable or a lazy ``"module:attribute"`` string) under ``name``: an
    engine with nothing but its factory (:func:`register_engine` registers a whole record).

    Raises:
        BackendInitializationError: ``name`` is invalid, or taken and ``replace`` is False (DF002).
    """
    register_engine(Engine(name, factory), replace=replace)


def unregister_backend(name: str) -> None:
    """Remove ``name`` from the registry (built-ins included)."""
    _ENGINES.pop(name, None)


def registered_backends() -> list[str]:
    """Registered names, registration order (built-ins, then installed entry points)."""
    _read_entry_points()
    return list(_ENGINES)


def engines() -> list[Engine]:
    """Every registered engine's record, registration order (built-ins, then installed entry points)."""
    _read_entry_points()
    return list(_ENGINES.values())


def engine(name: str) -> Engine:
    """The record of engine ``name``.

    Raises:
        BackendInitializationError: no engine of that name is registered (DF002).
    """
    _read_entry_points()
    if name not in _ENGINES:
        raise _unknown_backend(name)
    return _ENGINES[name]


def load_attribute(spec: str, name: str) -> object:
    """The object a ``"module:attribute"`` string names (the attribute may be dotted).

    Raises:
        BackendInitializationError: the module or attribute cannot be imported (DF002, for ``name``).
    """
    module, _, attr = spec.partition(":")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):  # an entry point may name a nested attribute
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - a runtime or package that fails to import: unavailable
        raise BackendInitializationError(f"cannot import {spec}: {type(exc).__name__}: {exc}", backend=name) from exc
    return obj


def drill_strategy_factories() -> list[Callable[[], DrillStrategy]]:
    """The drill-down strategy factories the registered engines name, registration order; each
    imports its strategy when called (a strategy that cannot be imported raises DF002 then)."""
    def loader(record: Engine) -> Callable[[], DrillStrategy]:
        def make() -> DrillStrategy:
            factory = load_attribute(str(record.drill_strategy), record.name)
            return factory()  # type: ignore[operator,no-any-return]

        return make

    return [loader(e) for e in engines() if e.drill_strategy]


def default_engine_for(file_format: str) -> Engine | None:
    """The first registered engine that runs model files of ``file_format`` (``"onnx"``) by default."""
    return next((e for e in engines() if file_format in e.file_formats), None)


def graph_runtime(file_format: str) -> tuple[str, Callable[[bytes], GraphSession]]:
    """``(engine name, open)``: how the reference runners open a plain session on a serialized graph of
    ``file_format``: the ``graph_session`` of the first registered engine that offers one for it.

    Raises:
        BackendInitializationError: no registered engine offers one (DF002).
    """
    for record in engines():
        if file_format in record.file_formats and record.graph_session:
            opener = load_attribute(record.graph_session, record.name)
            return record.name, opener  # type: ignore[return-value]
    raise BackendInitializationError(f"no registered engine runs {file_format} graphs",
                                     hint="install the engine that runs them", backend=file_format)


def _resolve(name: str) -> BackendFactory:
    _read_entry_points()
    parametrised = prefix_resolver(name) if name not in _ENGINES else None
    if parametrised is not None:  # "plugin:<id>" (see debug_framework.backend_prefixes)
        resolver, rest = parametrised
        return resolver(rest)
    if name not in _ENGINES:
        raise _unknown_backend(name)
    factory = _ENGINES[name].factory
    if isinstance(factory, str):
        factory = load_attribute(factory, name)  # type: ignore[assignment]
    return factory  # type: ignore[return-value]


def get_backend(name: str, *, check: bool = True, **options: object) -> Backend:
    """A new instance of backend ``name``; ``options`` go to its factory (e.g. ``device="cuda"``).

    Raises:
        BackendInitializationError: unknown name, failed import/construction, or (with ``check``)
            not available here, with the reason (DF002).
    """
    factory = _resolve(name)
    _check_options(name, factory, options)
    try:
        backend = factory(**options)
    except BackendInitializationError:
        raise
    except Exception as exc:
        raise BackendInitializationError(f"constructing the backend failed: {exc}", backend=name) from exc
    if check:
        ok, reason = backend.availability()
        if not ok:
            raise BackendInitializationError(f"backend is not available: {reason}", backend=name)
    return backend


def backend_options(factory: Callable[..., object]) -> list[str] | None:
    """The keyword options ``factory`` takes (a backend class's ``__init__``, or a function); None
    where it takes any (``**kwargs``) or its signature cannot be read."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


def _check_options(name: str, factory: Callable[..., object], options: dict[str, object]) -> None:
    """DF002 naming an option the backend does not take, and the ones it does."""
    known = backend_options(factory)
    if known is None:
        return
    for key in options:
        if key not in known:
            raise BackendInitializationError(
                f"backend {name!r} has no option {key!r}" + did_you_mean(key, known), backend=name,
                hint=f"its options: {', '.join(known)}" if known else "it takes no options")


def backend_availability() -> dict[str, tuple[bool, str]]:
    """Every registered backend -> ``(available, reason)``; the reason is empty when available."""
    report: dict[str, tuple[bool, str]] = {}
    for name in registered_backends():
        try:
            report[name] = tuple(get_backend(name, check=False).availability())  # type: ignore[assignment]
        except BackendInitializationError as exc:
            report[name] = (False, exc.message)
        except Exception as exc:  # an availability probe must not break the report
            report[name] = (False, f"availability check failed: {exc}")
    return report


def detect_available_backends() -> dict[str, bool]:
    """Every registered backend -> whether it can run here (reasons: :func:`backend_availability`)."""
    return {name: ok for name, (ok, _) in backend_availability().items()}


def select_alternative(
    reference: str,
    *,
    order: tuple[str, ...] | list[str] = AUTO_ORDER,
    availability: dict[str, tuple[bool, str]] | None = None,
) -> tuple[str, str]:
    """What ``alternative_backend="auto"`` means: the first available backend of ``order`` that is
    not ``reference``. Returns ``(name, reason)``; the reason says why it was picked and why the
    ones before it were not.

    Raises:
        BackendInitializationError: no backend other than the reference can run here (DF002).
    """
    report = backend_availability() if availability is None else availability
    skipped: list[str] = []
    for name in order:
        if name == reference:
            skipped.append(f"{name}: it is the reference")
            continue
        ok, why = report.get(name, (False, "not registered"))
        if ok:
            reason = f"auto picked {name!r} (first available in {' > '.join(order)})"
            return name, reason + ("; skipped " + "; ".join(skipped) if skipped else "")
        skipped.append(f"{name}: {why}")
    raise BackendInitializationError(
        "no alternative backend is available", hint="; ".join(skipped) or "register a backend", backend="auto"
    )


def backend_versions(backend: Backend) -> JsonObject:
    """``backend.version_info()`` when it has one, else what can be said (its name and type)."""
    info = getattr(backend, "version_info", None)
    if callable(info):
        return dict(info())
    return {"backend": getattr(backend, "name", type(backend).__name__), "type": type(backend).__qualname__}
