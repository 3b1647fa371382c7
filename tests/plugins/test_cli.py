"""``plugin_compile``: exit 0 compiled (and validated), 1 a validation failure, 2 usage/environment
errors and compile failures (DF008), on the project's CLI framework; and ``debug_validate --plugin``."""

from __future__ import annotations

import json

import pytest

from debug_framework.cli import plugin_compile

from .conftest import EXAMPLES, write_plugin


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Run in a scratch directory: default outputs (``plugin_repros/``) never land in the checkout."""
    monkeypatch.chdir(tmp_path)


def _run(capsys, *argv):
    code = plugin_compile.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_errors_exit_2(capsys, tmp_path):
    db = tmp_path / "s.db"
    code, _, err = _run(capsys, "--database", db)
    assert code == 2 and "--plugin-path is required" in err
    code, _, err = _run(capsys, "--plugin-path", EXAMPLES / "cpp", "--backend", "opencl", "--database", db)
    assert code == 2 and "unknown --backend" in err
    code, _, err = _run(capsys, "--plugin-path", EXAMPLES / "cpp", "--optimization-level", "7", "--database", db)
    assert code == 2
    code, _, err = _run(capsys, "--plugin-path", tmp_path / "k.cpp", "--database", db)
    assert code == 2 and "--backend is required" in err


def test_a_compile_failure_is_df008_exit_2_with_json(capsys, tmp_path):
    manifest = write_plugin(tmp_path / "t", json.dumps({
        "id": "bad", "version": "1", "backend": "triton", "sources": ["k.py"], "kernels": [{"name": "f", "op": "aten::gelu", "entry": "f"}]}),
        {"k.py": "def f(:\n    pass\n"})
    code, out, err = _run(capsys, "--plugin-path", manifest, "--json", "--database", tmp_path / "s.db",
                          "--cache-dir", tmp_path / "cache")
    assert code == 2 and "[DF008]" in err and "k.py:1:" in err
    doc = json.loads(out)
    assert doc["status"] == "error" and doc["error"]["code"] == "DF008" and doc["error"]["context"]["log"]


def test_compile_then_list(capsys, tmp_path):
    db, cache = tmp_path / "s.db", tmp_path / "cache"
    code, out, _ = _run(capsys, "--plugin-path", EXAMPLES / "triton" / "plugin.json", "--output-path",
                        tmp_path / "out" / "softmax.py", "--json", "--database", db, "--cache-dir", cache)
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "passed" and doc["build"]["plugin_id"] == "example-triton"
    assert (tmp_path / "out" / "softmax.py").is_file()
    code, out, _ = _run(capsys, "--list", "--json", "--database", db, "--cache-dir", cache)
    plugins = json.loads(out)["plugins"]
    assert code == 0 and [p["id"] for p in plugins] == ["example-triton"] and plugins[0]["artifact_digest"]
    code, out, _ = _run(capsys, "--list", "--database", db, "--cache-dir", cache)
    assert code == 0 and "example-triton" in out


@pytest.mark.slow
def test_validate_the_triton_example_under_the_interpreter(capsys, tmp_path):
    code, out, _ = _run(capsys, "--plugin-path", EXAMPLES / "triton", "--validate", "--json",
                        "--database", tmp_path / "s.db", "--cache-dir", tmp_path / "cache")
    doc = json.loads(out)
    assert code == 0, doc
    softmax = doc["sweep"]["kernels"]["softmax"]
    assert softmax["passed"] and softmax["by_source"]["opinfo"]["samples"] > 0
    assert doc["checks"]["kernels"]["softmax"]["opcheck"]["passed"]


@pytest.mark.slow
def test_validate_the_wrong_rms_norm_exits_1_with_the_worst_sample(capsys, tmp_path, buggy_build, build_cache,
                                                                   llama_dir):
    code, out, _ = _run(capsys, "--plugin-path", EXAMPLES / "cpp_buggy", "--validate", "--json", "--model-path",
                        llama_dir, "--database", tmp_path / "s.db", "--cache-dir", build_cache,
                        "--repro-dir", tmp_path / "r")
    doc = json.loads(out)
    assert code == 1 and doc["status"] == "failed" and doc["build"]["cached"]
    rms = doc["sweep"]["kernels"]["rms_norm"]
    assert not rms["passed"] and rms["worst"]["result"]["status"] == "fail" and rms["repro"] and rms["repro_verified"]
    assert rms["by_source"]["model"]["samples"] == 1  # the shapes of a real forward pass: x [2, 16, 64], w [64]
    code, out, _ = _run(capsys, "--list", "--json", "--database", tmp_path / "s.db", "--cache-dir", build_cache)
    assert json.loads(out)["plugins"][0]["validated"] is False  # the sweep's verdict is stored


def test_cuda_and_metal_examples_say_why_they_cannot_build_here(capsys, tmp_path):
    from debug_framework.plugins.toolchain import toolchain

    for name in ("cuda", "metal"):
        if toolchain(name).available:
            pytest.skip(f"{name} can build here: covered where its test runs")
        code, _, err = _run(capsys, "--plugin-path", EXAMPLES / name, "--database", tmp_path / "s.db",
                            "--cache-dir", tmp_path / "cache")
        assert code == 2 and "[DF008]" in err and f"cannot compile a {name} plugin here" in err


@pytest.mark.slow
def test_the_cuda_example_on_a_gpu(capsys, tmp_path):
    from debug_framework.plugins.toolchain import toolchain

    cuda = toolchain("cuda")
    if not cuda.available:
        pytest.skip(f"the CUDA example needs nvcc and a GPU: {cuda.reason}")
    code, out, _ = _run(capsys, "--plugin-path", EXAMPLES / "cuda", "--validate", "--json",
                        "--database", tmp_path / "s.db", "--cache-dir", tmp_path / "cache")
    doc = json.loads(out)
    assert code == 0 and doc["sweep"]["kernels"]["rms_norm"]["passed"], doc


@pytest.mark.slow
def test_debug_validate_plugin_finds_the_first_layer_using_the_wrong_kernel(capsys, tmp_path, monkeypatch,
                                                                           buggy_build, build_cache, llama_dir):
    import debug_framework.services.compilation_engine as ce
    from debug_framework.cli import debug_validate

    monkeypatch.setattr(ce, "DEFAULT_CACHE_DIR", build_cache)  # built once by the fixture
    db = tmp_path / "s.db"
    code = debug_validate.run(["--model-path", str(llama_dir), "--plugin", str(EXAMPLES / "cpp_buggy"),
                               "--database", str(db), "--isolate", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["alternative_backend"] == "plugin:example-cpp-buggy"
    assert (doc["first_divergence"]["checkpoint"], doc["first_divergence"]["layer"]) == ("post_attention", 0)
    assert 0 in doc["introducing_layers"]
    code = debug_validate.run(["--model-path", str(llama_dir), "--plugin", str(EXAMPLES / "cpp_buggy"),
                               "--alternative-backend", "pytorch", "--database", str(db)])
    assert code == 2 and "drop --alternative-backend" in capsys.readouterr().err


def test_an_unknown_plugin_backend_is_df002_naming_it(tmp_path, monkeypatch):
    from debug_framework.backends import get_backend
    from debug_framework.errors import BackendInitializationError

    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "s.db"))
    with pytest.raises(BackendInitializationError, match="no plugin 'nope' is registered") as info:
        get_backend("plugin:nope")
    assert info.value.context["backend"] == "plugin:nope"


@pytest.mark.slow
def test_the_triton_example_compiled_for_a_gpu(capsys, tmp_path):
    """The Triton example declared for "cuda": compiled by Triton for the GPU, swept on it, passes."""
    import shutil

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    plugin = tmp_path / "triton-gpu"
    shutil.copytree(EXAMPLES / "triton", plugin)
    manifest = json.loads((plugin / "plugin.json").read_text())
    manifest["id"] = "example-triton-gpu"
    manifest["kernels"][0]["devices"] = ["cuda"]
    (plugin / "plugin.json").write_text(json.dumps(manifest))
    code, out, _ = _run(capsys, "--plugin-path", plugin, "--validate", "--json",
                        "--database", tmp_path / "s.db", "--cache-dir", tmp_path / "cache")
    doc = json.loads(out)
    assert code == 0 and doc["sweep"]["kernels"]["softmax"]["passed"], doc
