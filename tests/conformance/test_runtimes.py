"""Runtime sweeps (single-op ONNX graphs) and ``--device``.

* fast: a device that does not exist is DF002 and exit 2 before anything runs (no GPU here; a
  machine with one passes ``cuda`` through); ``--runtime`` refuses ``--compile-backend`` and an
  unknown runtime; the exported module rebuilds a call with tensors nested in lists;
* slow (one test, one process): ``onnxruntime`` and ``openvino`` sweep ``add`` (exported, run,
  judged: pass) and ``linalg.svd`` (the exporter has no ONNX function for it: unsupported with that
  reason, not failed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from debug_framework.cli.debug_opsweep import main
from debug_framework.conformance import SweepSettings, run_sweep
from debug_framework.conformance.devices import check_device
from debug_framework.conformance.runtimes import _fill, flatten_tensors
from debug_framework.errors import BackendInitializationError, ConfigurationError


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_missing_device_is_df002_exit_2(tmp_path, capsys):
    db = tmp_path / "s.db"
    assert main(["--device", "cuda", "--ops", "add", "--json", "--database", str(db)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "DF002" and "no cuda device here" in doc["error"]["message"]
    assert main(["--device", "cuda:3", "--ops", "add", "--database", str(db)]) == 2
    assert "DF002" in capsys.readouterr().err
    assert main(["--device", "meta", "--ops", "add", "--database", str(db)]) == 2
    assert main(["--device", "not-a-device", "--ops", "add", "--database", str(db)]) == 2
    assert "not a torch device" in capsys.readouterr().err
    assert not db.exists()  # refused before the database is opened


def test_check_device_names_the_device_where_it_exists(monkeypatch):
    assert check_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda") == "cuda:0" and check_device("cuda:1") == "cuda:1"
    with pytest.raises(BackendInitializationError, match="no device cuda:2"):
        check_device("cuda:2")
    with pytest.raises(ConfigurationError):
        check_device("cuda:x")


def test_runtime_usage_errors_exit_2(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    assert main(["--runtime", "onnxruntime", "--compile-backend", "inductor", "--database", db]) == 2
    assert "takes no --compile-backend" in capsys.readouterr().err
    assert main(["--runtime", "tensorrt", "--ops", "add", "--database", db]) == 2
    assert "unknown runtime 'tensorrt'" in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match="neither --compile-backend-file nor --grad"):
        run_sweep(SweepSettings(backend="onnxruntime", runtime="onnxruntime", grad=True, ops=["add"]))


def test_the_sweep_finds_engines_by_name_and_names_none_itself():
    """Issue 43: each engine's op-sweep runtime lives in its package; one lookup finds it by name."""
    from debug_framework.conformance.runtime_lookup import find_runtime, runtime_names

    assert set(runtime_names()) >= {"onnxruntime", "openvino"}
    for name in runtime_names():
        runtime = find_runtime(name)
        assert runtime.name == name and type(runtime).__module__ == f"debug_framework.backends.{name}.opsweep"
        assert name in runtime.packages and "def run_graph(data, tensors, spec)" in runtime.repro_runner
    assert find_runtime("openvino").precision_hint == "f32" and find_runtime("onnxruntime").precision_hint is None
    with pytest.raises(ConfigurationError, match="unknown runtime 'tensorrt'") as err:
        find_runtime("tensorrt")
    assert err.value.code == "DF005"
    src = Path(__file__).resolve().parents[2] / "src" / "debug_framework"
    naming = sorted(str(f.relative_to(src)) for d in ("conformance", "plugins") for f in (src / d).rglob("*.py")
                    if any(n in f.read_text(encoding="utf-8").lower() for n in ("onnxruntime", "openvino")))
    assert naming == []


def test_an_engine_registered_with_an_op_sweep_runtime_is_swept_by_its_name():
    """The lookup reads the engine registry: a third party's engine record that names an op-sweep
    runtime is a ``--runtime`` name; one without is not."""
    from debug_framework.backends.registry import Engine, register_engine, unregister_backend
    from debug_framework.conformance.runtime_lookup import find_runtime, runtime_names

    register_engine(Engine("third_party_rt", "debug_framework.backends.pytorch:PyTorchBackend",
                           opsweep_runtime="debug_framework.backends.onnxruntime.opsweep:RUNTIME"))
    register_engine(Engine("no_sweep_rt", "debug_framework.backends.pytorch:PyTorchBackend"))
    try:
        assert "third_party_rt" in runtime_names() and "no_sweep_rt" not in runtime_names()
        assert find_runtime("third_party_rt") is find_runtime("onnxruntime")
        with pytest.raises(ConfigurationError, match="unknown runtime 'no_sweep_rt'"):
            find_runtime("no_sweep_rt")
    finally:
        unregister_backend("third_party_rt")
        unregister_backend("no_sweep_rt")


def test_exported_call_rebuilds_nested_tensors():
    a, b = torch.ones(2), torch.zeros(3)
    found: list[torch.Tensor] = []
    skeleton = flatten_tensors([[a, b], 1, {"out": None, "w": a}], found)
    assert len(found) == 3 and "<input 1>" in repr(skeleton)
    rebuilt = _fill(skeleton, (a + 1, b + 1, a + 2))
    assert torch.equal(rebuilt[0][1], b + 1) and rebuilt[1] == 1 and torch.equal(rebuilt[2]["w"], a + 2)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_runtime_sweep_judges_exported_ops_and_classifies_unexportable(runtime, tmp_path):
    pytest.importorskip(runtime)
    settings = SweepSettings(backend=runtime, runtime=runtime, ops=["add", "linalg.svd"], dtypes=["float32"],
                             max_samples=1, fuzz=False, workers=0, repro_dir=tmp_path / "repros")
    result = run_sweep(settings, database=tmp_path / "s.db")
    by = {o.op: o for o in result.ops}
    assert by["add"].verdict == "pass" and by["add"].counts["pass"] == 1, by["add"]
    assert by["linalg.svd"].verdict == "unsupported" and by["linalg.svd"].passed is None
    assert "torch.onnx cannot export it" in by["linalg.svd"].reason
    assert result.passed and sorted(result.to_dict()["verdicts"].items()) == sorted(
        {**{k: 0 for k in result.to_dict()["verdicts"]}, "pass": 1, "unsupported": 1}.items())


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_sweeps_on_a_gpu_judge_inductors_kernels_and_flag_exactly_the_wrong_lowerings(tmp_path):
    """On a GPU: Inductor's Triton kernels pass a few operators in float32 and bfloat16, judged
    against float64 eager on the GPU; the three wrong lowerings are flagged there too, and nothing else."""
    ops = ["add", "softmax", "nn.functional.gelu", "cumsum", "sum", "where"]
    ind = run_sweep(SweepSettings(backend="inductor", device="cuda", ops=ops, dtypes=("float32", "bfloat16"),
                                  max_samples=4, workers=2, repro_dir=tmp_path / "repros"))
    assert ind.device == "cuda" and {o.op: o.verdict for o in ind.ops} == {op: "pass" for op in ops}, \
        [(o.op, o.verdict, o.reason) for o in ind.ops]
    example = Path(__file__).resolve().parents[2] / "examples" / "conformance" / "wrong_lowerings.py"
    wrong = run_sweep(SweepSettings(backend="wrong", backend_file=str(example), device="cuda", ops=ops,
                                    dtypes=("float32",), max_samples=4, workers=2, repro_dir=tmp_path / "repros"))
    assert {o.op for o in wrong.failing} == {"nn.functional.gelu", "softmax", "cumsum"}
    cumsum = next(o for o in wrong.ops if o.op == "cumsum")
    assert cumsum.repro_verified and "cuda" in json.loads((Path(cumsum.repro).parent / "repro.json").read_text())[
        "check"]["device"]


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_runtime_repro_runs_the_graph_by_the_runtimes_own_runner(runtime, tmp_path):
    """The repro writer asks the runtime for its runner and packages: the repro exports the
    operator alone, runs it by that runtime and judges it (``add`` passes: ``fixed``)."""
    pytest.importorskip(runtime)
    from debug_framework.conformance.ops import find_op
    from debug_framework.conformance.repro import write_op_repro
    from debug_framework.conformance.runtime_lookup import find_runtime
    from debug_framework.conformance.samples import op_samples
    from debug_framework.repro_format import verify

    info = find_op("add")
    sample = op_samples(info, "float32", fuzz=False)[0]
    script = write_op_repro("add", info, sample, tmp_path, backend=runtime, backend_file=None, backend_attr="backend",
                            device="cpu", status="fail", runtime=runtime)
    manifest = json.loads((script.parent / "repro.json").read_text())
    assert manifest["requires"] == ["torch", *find_runtime(runtime).packages]
    assert manifest["check"]["precision_hint"] == find_runtime(runtime).precision_hint
    assert find_runtime(runtime).repro_runner.strip() in script.read_text()
    result = verify(script, timeout=300)
    assert result.verdict == "fixed" and f"add run by {runtime}" in result.detail, result
