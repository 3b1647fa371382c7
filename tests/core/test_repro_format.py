"""The one repro format (``debug_framework.repro_format``): every writer's repro has the same layout
and manifest, prints the same verdict line last and keeps the exit-code contract (1 reproduced,
0 fixed, 2 cannot check), run from another directory with this project unimportable; verification
counts neither a crash nor a fixed repro."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from debug_framework.repro_format import (EXIT_CODES, FORMAT, SAFETENSORS_READER, parse_output, read_manifest, verify,
                                          verdict_line, write_repro_files)

VERDICT = re.compile(r"^REPRO: (reproduced|fixed|error): \S")
PICKLES = {".pkl", ".pickle", ".pt", ".pth", ".bin"}


def _last_line(stdout: str) -> str:
    return [line for line in stdout.splitlines() if line.strip()][-1]


def assert_layout(folder: Path, writer: str, data_files: set[str]) -> dict:
    """repro.py, repro.json (the common manifest) and the writer's data files; no pickle."""
    names = {p.name for p in folder.iterdir()}
    assert {"repro.py", "repro.json"} | data_files <= names, names
    assert not any(Path(n).suffix in PICKLES for n in names)
    manifest = read_manifest(folder)
    assert manifest["format"] == FORMAT and manifest["writer"] == writer and manifest["run"] == "python repro.py"
    assert manifest["exit_codes"] == {"0": "fixed", "1": "reproduced", "2": "error"}
    assert {"repro.py", "repro.json"} | data_files <= set(manifest["files"])
    assert manifest["failure"] and isinstance(manifest["check"], dict) and manifest["requires"]
    assert manifest["environment"]["python"]
    ast.parse((folder / "repro.py").read_text())
    return manifest


def assert_contract(folder: Path, expected: str) -> None:
    """Run it as a user elsewhere would (fresh process, project unimportable): the verdict line is
    last, the exit code matches it, and only a reproduction verifies."""
    res = verify(folder)
    last = _last_line(res.stdout)
    assert VERDICT.match(last) and last.startswith(f"REPRO: {expected}: "), res.stdout + res.stderr
    assert res.returncode == EXIT_CODES[expected] and res.verdict == expected, res.stdout + res.stderr
    assert res.reproduced is (expected == "reproduced")
    if expected != "error":
        assert isinstance(res.observation, dict), res.stdout
    assert f"exit {res.returncode}" in (folder / "verify.log").read_text()


# --------------------------------------------------------------------------- the format itself


def _toy(folder: Path, body: str, *, imports: tuple[str, ...] = (), failure: str = "the toy fails",
         requires: tuple[str, ...] = ("json",)) -> Path:
    write_repro_files(folder, writer="minifier", failure=failure, body=body, imports=list(imports),
                      requires=list(requires), check={"value": 3})
    return folder


def test_only_a_reproduction_with_exit_1_verifies_and_a_crash_never_does(tmp_path):
    reproduces = _toy(tmp_path / "r", "def check():\n    return manifest()['check']['value'] == 3, 'value 3', {}\n")
    assert verify(reproduces).reproduced
    fixed = _toy(tmp_path / "f", "def check():\n    return False, 'value 2', {'value': 2}\n")
    res = verify(fixed)
    assert not res.reproduced and res.returncode == 0 and res.observation == {"value": 2}
    crash = _toy(tmp_path / "c", "def check():\n    os._exit(1)\n")  # exit 1 without a verdict
    res = verify(crash)
    assert res.returncode == 1 and res.verdict is None and not res.reproduced
    lying = _toy(tmp_path / "l", "def check():\n    print('REPRO: reproduced: x')\n    os._exit(0)\n")
    assert not verify(lying).reproduced  # the verdict line alone is not enough either
    raising = _toy(tmp_path / "e", "def check():\n    return open(os.path.join(HERE, 'gone.npy')).read()\n")
    res = verify(raising)
    assert res.returncode == 2 and res.verdict == "error" and "FileNotFoundError" in res.detail
    missing = _toy(tmp_path / "m", "def check():\n    return True, '', {}\n", imports=("import no_such_module_xyz",))
    res = verify(missing)
    assert res.returncode == 2 and res.verdict == "error" and not res.reproduced


def test_the_project_is_unimportable_in_the_verifying_process(tmp_path):
    body = ("def check():\n    import importlib.util\n"
            "    return importlib.util.find_spec('debug_framework') is None, os.getcwd(), {'cwd': os.getcwd()}\n")
    res = verify(_toy(tmp_path / "r", body))
    assert res.reproduced, res.stdout + res.stderr
    assert Path(res.observation["cwd"]).resolve() != (tmp_path / "r").resolve()  # run from elsewhere


def test_safetensors_is_unimportable_in_the_verifying_process_unless_the_repro_requires_it(tmp_path):
    body = "def check():\n    return True, 'ran', {}\n"
    res = verify(_toy(tmp_path / "no", body, imports=("import safetensors",)))
    assert res.verdict == "error" and "safetensors" in res.detail and not res.reproduced
    assert verify(_toy(tmp_path / "yes", body, imports=("import safetensors",), requires=("safetensors",))).reproduced


def test_the_torch_only_reader_reads_what_safetensors_writes(tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {"f32": torch.randn(3, 4), "bf16": torch.randn(5).bfloat16(), "f16": torch.randn(2, 2).half(),
               "bool": torch.tensor([True, False, True]), "i64": torch.arange(7) - 3, "i8": torch.tensor([-1, 2], dtype=torch.int8),
               "empty": torch.empty(0, 3), "empty_bool": torch.empty(0, dtype=torch.bool), "scalar": torch.tensor(3.5),
               "c64": torch.randn(3, dtype=torch.complex64), "f8": torch.randn(4).to(torch.float8_e4m3fn),
               "f64": torch.randn(3, dtype=torch.float64), "u16": torch.arange(3).to(torch.uint16)}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    scope = {"torch": torch, "json": json, "os": __import__("os"), "sys": __import__("sys"), "CannotCheck": RuntimeError}
    exec(SAFETENSORS_READER, scope)
    read, expected = scope["load_file"](str(tmp_path / "t.safetensors")), load_file(str(tmp_path / "t.safetensors"))

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).view(torch.uint8)

    assert read.keys() == expected.keys()
    for name, t in expected.items():
        assert read[name].dtype == t.dtype and read[name].shape == t.shape and torch.equal(raw(read[name]), raw(t)), name
        raw(read[name]).fill_(1)  # writable, its own memory
    assert torch.equal(raw(scope["load_file"](str(tmp_path / "t.safetensors"))["f32"]), raw(expected["f32"]))


def test_hostile_text_stays_inside_the_docstring_and_on_one_verdict_line(tmp_path):
    hostile = 'n"""\nraise SystemExit(1)  # \\\n"""'
    folder = _toy(tmp_path / "h", "def check():\n    return False, manifest()['failure'], {}\n", failure=hostile)
    tree = ast.parse((folder / "repro.py").read_text())
    assert ast.get_docstring(tree).count("raise SystemExit(1)") == 1  # text of the docstring, not code
    assert not any(isinstance(n, ast.Raise) for n in tree.body)
    res = verify(folder)
    assert res.returncode == 0 and _last_line(res.stdout).startswith("REPRO: fixed: n\"\"\" raise")
    assert verdict_line("fixed", "a\nb") == "REPRO: fixed: a b"
    assert parse_output("x\nREPRO-OBSERVATION: {\"a\": 1}\nREPRO: reproduced: y\n") == ("reproduced", "y", {"a": 1})


# --------------------------------------------------------------------------- the four writers


def _replay(approximate: str, bound: float):
    from debug_framework.services.drilldown.judge import Replay

    x = torch.linspace(-3, 3, 64, dtype=torch.float32)
    trusted = torch.nn.functional.gelu(x.double())
    return Replay(torch.ops.aten.gelu.default, [x], {"approximate": approximate}, trusted, bound, 1e-3)


class _CpuBackend:
    device = "cpu"


def test_drilldown_replay_repro_follows_the_format(tmp_path):
    from debug_framework.services.drilldown.repro import write_and_verify

    folder, verified = write_and_verify(tmp_path / "bug", _replay("tanh", 1e-6), _CpuBackend(), what="aten.gelu.default")
    assert verified and (folder / "verify.log").is_file()  # the verifying run's output, beside the repro
    assert_layout(folder, "drilldown-replay", {"inputs.safetensors"})
    assert_contract(folder, "reproduced")
    fixed, verified = write_and_verify(tmp_path / "ok", _replay("none", 1e-6), _CpuBackend(), what="aten.gelu.default")
    assert not verified
    assert_contract(fixed, "fixed")
    (folder / "inputs.safetensors").unlink()
    assert_contract(folder, "error")


BUGGY_KERNEL = "import torch\n\ndef gelu(x, approximate='none'):\n    return torch.nn.functional.gelu(x, approximate='tanh')\n"


def _plugin(folder: Path, source: str):
    from debug_framework.plugins.manifest import load_manifest

    folder.mkdir(parents=True)
    (folder / "gelu.py").write_text(source)
    (folder / "plugin.json").write_text(json.dumps({
        "id": "repro-gelu", "version": "1", "backend": "triton", "sources": ["gelu.py"],
        "kernels": [{"name": "gelu", "op": "aten::gelu", "entry": "gelu", "dtypes": ["float32"]}]}))
    return load_manifest(folder / "plugin.json")


def test_drilldown_replay_repro_of_a_plugin_backend_runs_its_kernel_without_the_project(tmp_path):
    """The plugin's build is copied beside the repro, which loads it alone (no debug_framework)."""
    from debug_framework.plugins.loading import LoadedKernel
    from debug_framework.plugins.swap import PluginBackend
    from debug_framework.services.drilldown.repro import write_and_verify

    defn = _plugin(tmp_path / "plugin", BUGGY_KERNEL)
    backend = PluginBackend(defn, tmp_path / "plugin" / "gelu.py")
    backend.kernels = [LoadedKernel(defn.kernels[0], None, None, torch.ops.aten.gelu.default, [])]
    # the stock operator is right; the plugin's kernel in its place is what reproduces
    folder, verified = write_and_verify(tmp_path / "r", _replay("none", 1e-6), backend, what="aten.gelu.default")
    manifest = assert_layout(folder, "drilldown-replay", {"inputs.safetensors", "plugin_gelu.py"})
    assert verified and manifest["check"]["plugin"]["artifact"] == "plugin_gelu.py"


def test_plugin_sweep_repro_follows_the_format(tmp_path):
    from debug_framework.plugins.repro import write_repro_dir
    from debug_framework.plugins.samples import Sample

    sample = Sample("shape", "64", "float32", [torch.linspace(-3, 3, 64)], {})
    defn = _plugin(tmp_path / "bug", BUGGY_KERNEL)
    repro = write_repro_dir(defn, tmp_path / "bug" / "gelu.py", defn.kernels[0], sample, tmp_path / "out_bug")
    assert repro.name == "repro.py"
    assert_layout(repro.parent, "plugin-sweep", {"inputs.safetensors", "plugin_gelu.py"})
    assert_contract(repro.parent, "reproduced")
    right = _plugin(tmp_path / "ok", BUGGY_KERNEL.replace("approximate='tanh'", "approximate=approximate"))
    fixed = write_repro_dir(right, tmp_path / "ok" / "gelu.py", right.kernels[0], sample, tmp_path / "out_ok")
    assert_contract(fixed.parent, "fixed")
    (repro.parent / "plugin_gelu.py").unlink()
    assert_contract(repro.parent, "error")


def _add_repro(tmp_path: Path, expected: np.ndarray) -> Path:
    from onnx import TensorProto, helper

    from debug_framework.backends.onnxruntime.repro import write_onnx_repro

    add = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("a", "b")]
    graph = helper.make_graph([add], "g", value, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return write_onnx_repro(tmp_path, node="add", op="Add", model=model, feeds={"a": np.ones(3, np.float32),
                            "b": np.ones(3, np.float32)}, output="y", expected=expected, bound=1e-6,
                            optimization="ORT_DISABLE_ALL", providers=["CPUExecutionProvider"], graph_transform=None)


def test_drilldown_onnx_repro_follows_the_format(tmp_path):
    pytest.importorskip("onnxruntime")
    folder = _add_repro(tmp_path / "bug", np.full(3, 3.0))  # 1 + 1 is not 3: it reproduces
    assert_layout(folder, "drilldown-onnx", {"node.onnx", "expected.npy", "input_0.npy", "input_1.npy"})
    assert_contract(folder, "reproduced")
    assert_contract(_add_repro(tmp_path / "ok", np.full(3, 2.0)), "fixed")
    (folder / "node.onnx").unlink()
    assert_contract(folder, "error")


def test_minifier_repro_follows_the_format(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx

    from debug_module.constraints import DtypeConstraint
    from debug_module.minifier import ConstraintSignature, write_repro_dir

    sig = ConstraintSignature("dtype", constraints=[DtypeConstraint(["float32"])])
    x = torch.randn(4, 8)
    bad = write_repro_dir(make_fx(lambda t: (t.double() * 2).float())(x), [x], sig, tmp_path / "bug")
    assert bad.name == "repro.py"
    manifest = assert_layout(bad.parent, "minifier", {"inputs.safetensors"})
    assert manifest["check"]["signature"]["constraint"] == "dtype"
    assert_contract(bad.parent, "reproduced")
    ok = write_repro_dir(make_fx(lambda t: t * 2)(x), [x], sig, tmp_path / "ok")
    assert_contract(ok.parent, "fixed")
    (bad.parent / "inputs.safetensors").unlink()
    assert_contract(bad.parent, "error")
