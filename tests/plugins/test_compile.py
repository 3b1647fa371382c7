"""CompilationEngine: flags per level, the content-addressed cache, the build log, DF008 with the
compiler's first error, toolchains that are missing here, validate_compilation."""

from __future__ import annotations

import json
import shutil

import pytest

from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.manifest import load_manifest
from debug_framework.plugins.toolchain import OPT_FLAGS, first_error, toolchain
from debug_framework.services.compilation_engine import CompilationEngine

from .conftest import EXAMPLES, write_plugin


def test_first_error_reads_gcc_clang_and_nvcc_formats():
    gcc = "In file included from a.cpp:1:\nk.cpp:12:5: error: 'x' was not declared in this scope\nk.cpp:20:1: error: later"
    assert first_error(gcc) == "k.cpp:12: 'x' was not declared in this scope"
    nvcc = 'k.cu(33): error: identifier "y" is undefined\n1 error detected'
    assert first_error(nvcc) == 'k.cu:33: identifier "y" is undefined'
    assert first_error("/usr/bin/ld: cannot find -lfoo\ncollect2: error: ld returned 1 exit status").startswith("collect2")


def test_levels_map_to_flags_and_change_the_cache_key(tmp_path):
    assert OPT_FLAGS["cpp"][0] == ("-O0", "-g") and OPT_FLAGS["cpp"][3] == ("-O3",)
    assert "-G" in OPT_FLAGS["cuda"][0] and OPT_FLAGS["metal"][2] == ("-O2",)
    defn = load_manifest(EXAMPLES / "cpp")
    keys = {CompilationEngine(tmp_path, level).cache_key(defn) for level in range(4)}
    assert len(keys) == 4
    with pytest.raises(PluginCompilationError, match="0, 1, 2 or 3"):
        CompilationEngine(tmp_path, 4)


def test_the_cache_key_follows_the_source_bytes(tmp_path):
    manifest = write_plugin(tmp_path / "p", json.dumps({"id": "t", "version": "1", "backend": "triton",
                                                         "sources": ["k.py"],
                                                         "kernels": [{"name": "f", "op": "aten::gelu", "entry": "f"}]}), {"k.py": "X = 1\n"})
    engine = CompilationEngine(tmp_path / "cache")
    before = engine.cache_key(load_manifest(manifest))
    (tmp_path / "p" / "k.py").write_text("X = 2\n")
    assert engine.cache_key(load_manifest(manifest)) != before


def test_the_cache_key_follows_the_manifest_not_only_the_sources(tmp_path):
    """Same sources, another id or another kernel list: another build (the artifact and its record differ)."""
    def manifest(folder: str, plugin_id: str, dtypes: list[str]):
        kernels = [{"name": "s", "op": "aten::softmax.int", "entry": "softmax", "dtypes": dtypes}]
        return load_manifest(write_plugin(tmp_path / folder, json.dumps(
            {"id": plugin_id, "version": "1", "backend": "triton", "sources": ["k.py"], "kernels": kernels}),
            {"k.py": "def softmax(x, dim, half_to_float=False):\n    return x\n"}))
    engine = CompilationEngine(tmp_path / "cache")
    a, b = manifest("a", "one", ["float32"]), manifest("b", "two", ["float32"])
    assert engine.cache_key(a) != engine.cache_key(b)
    assert engine.cache_key(a) != engine.cache_key(manifest("c", "one", ["float32", "float64"]))
    first, second = engine.build(a), engine.build(b)  # was: OSError "Directory not empty" for the second
    assert first.artifact != second.artifact and second.artifact.is_file() and not second.cached


@pytest.mark.slow
def test_cpp_build_is_cached_and_keeps_its_log(cpp_build, engine, tmp_path):
    defn, build = cpp_build
    assert build.artifact.is_file() and build.artifact.suffix == ".so"
    log = build.log_path.read_text()
    assert "-O2" in log and "kernels.cpp" in log  # the command and its output are kept
    again = engine.build(defn, tmp_path / "out" / "example.so")
    assert again.cached and again.artifact == build.artifact and again.artifact_digest == build.artifact_digest
    assert again.seconds < 1.0
    assert (tmp_path / "out" / "example.so").read_bytes() == build.artifact.read_bytes()
    record = json.loads((tmp_path / "out" / "example.so.build.json").read_text())
    assert record["plugin"]["id"] == "example-cpp" and record["flags"] == ["-O2"]


def test_compile_failure_is_df008_with_file_line_and_the_log(tmp_path):
    manifest = write_plugin(tmp_path / "broken", json.dumps({
        "id": "broken", "version": "1", "backend": "cpp", "sources": ["k.cpp"], "kernels": [{"name": "g", "op": "aten::gelu", "entry": "ns::g"}]}),
        {"k.cpp": "// no torch headers: the compiler fails fast\nint f() {\n  return undefined_name;\n}\n"})
    engine = CompilationEngine(tmp_path / "cache", optimization_level=0)
    with pytest.raises(PluginCompilationError) as info:
        engine.build(load_manifest(manifest))
    err = info.value
    assert err.code == "DF008"
    assert "k.cpp:3: " in err.message and "undefined_name" in err.message
    text = open(err.context["log"]).read()
    assert "-O0" in text and "undefined_name" in text and "exit status" in text
    assert not list((tmp_path / "cache").glob("??/*/broken.so"))  # nothing half-built left in the cache


def test_triton_syntax_error_is_df008_with_file_line(tmp_path):
    manifest = write_plugin(tmp_path / "t", json.dumps({
        "id": "bad-triton", "version": "1", "backend": "triton", "sources": ["k.py"],
        "kernels": [{"name": "softmax", "op": "aten::softmax.int", "entry": "softmax"}]}),
        {"k.py": "import torch\n\ndef softmax(x, dim, dtype=None)\n    return x\n"})
    with pytest.raises(PluginCompilationError, match=r"k\.py:3: "):
        CompilationEngine(tmp_path / "cache").build(load_manifest(manifest))


def test_metal_off_macos_and_cuda_without_gpu_say_why(tmp_path):
    engine = CompilationEngine(tmp_path)
    metal = toolchain("metal")
    if metal.available:
        assert engine.compile_metal_kernel(EXAMPLES / "metal" / "gelu.metal", tmp_path / "gelu.metallib")
        assert engine.validate_compilation(tmp_path / "gelu.metallib", "metal")
    else:
        with pytest.raises(PluginCompilationError, match="macOS|xcrun") as info:
            engine.compile_metal_kernel(EXAMPLES / "metal" / "gelu.metal", tmp_path / "gelu.metallib")
        assert info.value.code == "DF008"
    cuda = toolchain("cuda")
    if not cuda.available:
        with pytest.raises(PluginCompilationError, match="nvcc|GPU"):
            engine.compile_cuda_kernel(EXAMPLES / "cuda" / "plugin.json", tmp_path / "k.so")


@pytest.mark.slow
def test_validate_compilation_loads_checks_ops_and_runs_opcheck(cpp_build, engine, tmp_path):
    defn, build = cpp_build
    report = engine.validation_report(build.artifact, "cpp")
    assert report["passed"] and engine.validate_compilation(build.artifact, "cpp")
    for name in ("gelu", "rms_norm"):
        tests = report["kernels"][name]["opcheck"]["tests"]
        assert set(tests) >= {"test_schema", "test_faketensor"} and set(tests.values()) == {"SUCCESS"}
    assert "df_example::rms_norm(Tensor x, Tensor w, float eps)" in report["kernels"]["rms_norm"]["schema"]
    with pytest.raises(PluginCompilationError, match="does not exist"):
        engine.validate_compilation(tmp_path / "missing.so", "cpp")
    lone = tmp_path / "lone.so"  # an artifact without its build record: any registered operator will do
    shutil.copy(build.artifact, lone)
    lone_report = engine.validation_report(lone, "cpp")
    assert lone_report["passed"] and "df_example::gelu" in lone_report["registered_ops"]
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    with pytest.raises(PluginCompilationError, match="cannot load"):
        engine.validate_compilation(junk, "cpp")


@pytest.mark.slow
def test_a_kernel_with_the_wrong_schema_fails_validation(cpp_build, tmp_path):
    defn, build = cpp_build
    data = json.loads((EXAMPLES / "cpp" / "plugin.json").read_text())
    data["kernels"][1]["op"] = "df_example::rms_norm(Tensor x, float eps) -> Tensor"
    manifest = write_plugin(tmp_path / "p", json.dumps(data), {})
    for name in ("kernels.cpp", "reference.py"):
        shutil.copy(EXAMPLES / "cpp" / name, tmp_path / "p" / name)
    from debug_framework.plugins.checks import validate_artifact

    with pytest.raises(PluginCompilationError, match="takes"):
        validate_artifact(build.artifact, "cpp", load_manifest(manifest))


def test_a_triton_plugin_imports_its_helper_sources(tmp_path):
    """The entry module of a Triton plugin imports a helper shipped beside it in ``sources``."""
    import torch

    from debug_framework.plugins.loading import load_plugin

    kernels = [{"name": "twice", "op": "myns_helper::twice(Tensor x) -> Tensor", "entry": "twice",
                "dtypes": ["float32"], "reference": "ref.py:twice"}]
    manifest = write_plugin(tmp_path / "p", json.dumps(
        {"id": "with-helper", "version": "1", "backend": "triton", "sources": ["k.py", "dfhelper_twice.py"],
         "kernels": kernels}),
        {"k.py": "from dfhelper_twice import double\n\ndef twice(x):\n    return double(x)\n",
         "dfhelper_twice.py": "def double(x):\n    return x * 2\n",
         "ref.py": "def twice(x):\n    return x * 2\n"})
    defn = load_manifest(manifest)
    build = CompilationEngine(tmp_path / "cache").build(defn)
    loaded = load_plugin(defn, build.artifact)
    assert torch.equal(loaded["twice"].op(torch.ones(3)), torch.full((3,), 2.0))


_TRITON_MODES = """
import json, os, shutil, sys
from pathlib import Path
import torch
from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.loading import load_plugin
from debug_framework.plugins.manifest import load_manifest
from debug_framework.services.compilation_engine import CompilationEngine

examples, tmp, first = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if first == "compiled-triton":
    import triton.language  # noqa: F401  (as Inductor does: compiled mode)
defn = load_manifest(examples / "triton")
try:
    loaded = load_plugin(defn, CompilationEngine(tmp / "cache").build(defn).artifact)
except PluginCompilationError as exc:
    print("DF008" if exc.code == "DF008" else exc.code, str(exc).split(":", 1)[-1][:120]); sys.exit(0)
assert os.environ.get("TRITON_INTERPRET") == "1"
x = torch.randn(4, 33)
assert torch.allclose(loaded["softmax"].op(x, -1), torch.softmax(x, -1), atol=1e-6)
data = json.loads((examples / "triton" / "plugin.json").read_text())
data["id"], data["kernels"][0]["devices"] = "example-triton-gpu", ["cuda"]
gpu = tmp / "gpu"
shutil.copytree(examples / "triton", gpu)
(gpu / "plugin.json").write_text(json.dumps(data))
gpu_defn = load_manifest(gpu)
try:
    load_plugin(gpu_defn, CompilationEngine(tmp / "cache").build(gpu_defn).artifact)
except PluginCompilationError as exc:
    print("interpreted; gpu plugin:", exc.code, "runs Triton's interpreter" in str(exc))
"""


@pytest.mark.parametrize("first", ["fresh", "compiled-triton"])
def test_triton_modes_in_a_fresh_process(tmp_path, first):
    """Kernels declared for "cpu" run under Triton's interpreter whether or not a GPU is present (on a
    GPU machine the interpreter used to be skipped, and the kernel got CPU tensors it could not read);
    a plugin declared for "cuda" cannot load into a process that interprets; and one that needs the
    interpreter after Triton was imported compiled (by Inductor) is DF008 saying why, not a crash
    inside the kernel. Each in a fresh process: Triton's mode is fixed at its first import."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _TRITON_MODES, str(EXAMPLES), str(tmp_path), first],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    if first == "fresh":
        assert run.stdout.strip() == "interpreted; gpu plugin: DF008 True", run.stdout
    else:
        assert run.stdout.startswith("DF008") and "already imported" in run.stdout, run.stdout


def test_a_triton_plugin_mixing_cpu_and_cuda_kernels_is_refused(tmp_path):
    kernels = [{"name": n, "op": f"myns_mix::{n}(Tensor x) -> Tensor", "entry": n, "dtypes": ["float32"],
                "reference": "ref.py:f", "devices": [d]} for n, d in (("a", "cpu"), ("b", "cuda"))]
    manifest = write_plugin(tmp_path / "p", json.dumps(
        {"id": "mixed", "version": "1", "backend": "triton", "sources": ["k.py"], "kernels": kernels}),
        {"k.py": "def a(x):\n    return x\n\ndef b(x):\n    return x\n", "ref.py": "def f(x):\n    return x\n"})
    with pytest.raises(PluginCompilationError, match="either in Triton's interpreter") as info:
        load_manifest(manifest)
    assert info.value.code == "DF008"
