"""The engine seam: an engine is one package under ``backends/`` registered by one record.

Every built-in record resolves (its factory, drill-down strategy and graph session import); the
registry answers which engine runs a file format and opens a real session on a graph; an engine
registered at run time brings its drill-down strategy with it; an engine's array namespace is
registered under its arrays' module; and no module outside an engine's package names that engine
but the registry (and the few fronts listed below)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from debug_framework.architectures import xp
from debug_framework.backends.registry import (
    BUILTIN_BACKENDS,
    BUILTIN_ENGINES,
    Engine,
    default_engine_for,
    drill_strategy_factories,
    engine,
    get_backend,
    graph_runtime,
    load_attribute,
    register_engine,
    unregister_backend,
)
from debug_framework.errors import BackendInitializationError

SRC = Path(__file__).resolve().parents[2] / "src" / "debug_framework"

#: Modules outside an engine's package allowed to name it: the registry (the one place engines are
#: listed) and the spec's Metal front for the mlx engine.
ALLOWED = {"backends/registry.py", "integrations/metal_backend.py"}


def _engine_packages() -> set[str]:
    """The built-in engines that are packages under ``backends/`` (named by their records' factories)."""
    found = set()
    for record in BUILTIN_ENGINES:
        module = str(record.factory).partition(":")[0].split(".")
        if len(module) > 3 and (SRC / "backends" / module[2]).is_dir():
            found.add(module[2])
    return found


def test_every_builtin_record_resolves():
    for record in BUILTIN_ENGINES:
        assert callable(load_attribute(str(record.factory), record.name)), record
        for field in (record.drill_strategy, record.graph_session):
            if field is not None:
                assert callable(load_attribute(field, record.name)), (record.name, field)
        if record.opsweep_runtime is not None:  # a runtime object: its name and how it runs a graph
            runtime = load_attribute(record.opsweep_runtime, record.name)
            assert getattr(runtime, "name", None) == record.name and callable(getattr(runtime, "session", None))
    assert BUILTIN_BACKENDS == {r.name: r.factory for r in BUILTIN_ENGINES}
    assert {"onnxruntime", "openvino", "mlx"} <= _engine_packages()


def test_the_registry_names_the_engine_that_runs_a_file_format_and_opens_its_graphs():
    import onnx
    from onnx import TensorProto, helper

    runner = default_engine_for("onnx")
    assert runner is not None and "onnx" in runner.file_formats
    assert default_engine_for("no-such-format") is None
    name, open_graph = graph_runtime("onnx")
    assert name == runner.name
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add",
                              [helper.make_tensor_value_info(n, TensorProto.DOUBLE, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.DOUBLE, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = open_graph(model.SerializeToString())
    a, b = np.array([1.0, 2.0]), np.array([0.5, 1e-17])
    (c,) = session.run(["c"], {"a": a, "b": b})
    assert c.dtype == np.float64 and c.tolist() == [1.5, 2.0 + 1e-17]
    with pytest.raises(BackendInitializationError, match="no registered engine runs"):
        graph_runtime("no-such-format")
    assert isinstance(onnx.load_from_string(model.SerializeToString()), onnx.ModelProto)


class _Seen:
    """A drill-down strategy applying to the backend named ``seam_engine`` only."""

    name = "seam"

    def applies(self, backend: object) -> tuple[bool, str]:
        ok = getattr(backend, "name", None) == "seam_engine"
        return ok, "" if ok else "not the seam engine"

    def drill(self, request: object) -> object:
        raise NotImplementedError


class _SeamBackend:
    name = "seam_engine"


def test_an_engine_registered_at_run_time_brings_its_drill_strategy():
    from debug_framework.services.drilldown import choose_strategy

    register_engine(Engine("seam_engine", f"{__name__}:_SeamBackend", drill_strategy=f"{__name__}:_Seen"))
    try:
        assert engine("seam_engine").drill_strategy == f"{__name__}:_Seen"
        assert "seam" in [f().name for f in drill_strategy_factories()]
        chosen, why = choose_strategy(get_backend("seam_engine", check=False))
        assert chosen is not None and chosen.name == "seam", why
        with pytest.raises(BackendInitializationError, match="already registered"):
            register_engine(Engine("seam_engine", f"{__name__}:_SeamBackend"))
    finally:
        unregister_backend("seam_engine")
    assert "seam" not in [f().name for f in drill_strategy_factories()]
    with pytest.raises(BackendInitializationError, match="unknown backend"):
        engine("seam_engine")


class FakeArray:
    """An array type of a module no namespace is registered for (until the test registers one)."""

    shape = (1,)


FakeArray.__module__ = "seamarrays.core"


def test_an_engine_registers_the_array_namespace_of_its_arrays():
    with pytest.raises(BackendInitializationError, match="no array namespace for seamarrays.core.FakeArray"):
        xp.array_namespace(FakeArray())
    fake = xp.ArrayNamespace(**{**{f: getattr(xp.NUMPY, f) for f in xp.ArrayNamespace.__dataclass_fields__},
                                "name": "seamarrays"})
    xp.register_namespace("seamarrays", lambda: fake)
    try:
        assert xp.array_namespace(FakeArray()) is fake
        assert xp.array_namespace(np.zeros(2)) is xp.NUMPY
    finally:
        xp._BY_PREFIX.pop("seamarrays", None)
        xp._BY_TYPE.pop(FakeArray, None)


def test_the_mlx_engine_registers_its_namespace():
    mx = pytest.importorskip("mlx.core")
    from debug_framework.backends.mlx.xp import mlx_namespace

    assert xp.array_namespace(mx.zeros((2,))) is mlx_namespace()


def test_no_module_outside_an_engine_package_names_it():
    offenders = []
    for name in sorted(_engine_packages()):
        word = re.compile(re.escape(name), re.I)
        for path in SRC.rglob("*.py"):
            rel = path.relative_to(SRC).as_posix()
            if rel.startswith(f"backends/{name}/") or rel in ALLOWED:
                continue
            if word.search(path.read_text(encoding="utf-8")):
                offenders.append(f"{rel} names {name}")
    assert not offenders, "ask the engine's registry record instead:\n" + "\n".join(offenders)
