"""Availability is truthful, unavailable backends say why (DF002), "auto" picks and explains,
every backend reports its versions. All fast: nothing here compiles or exports."""

from __future__ import annotations

import pytest
import torch

from debug_framework.backends import (
    AUTO_ORDER,
    backend_availability,
    backend_versions,
    detect_available_backends,
    get_backend,
    select_alternative,
)
from debug_framework.errors import BackendInitializationError
from debug_framework.integrations.metal_backend import MetalBackend
from debug_framework.modelio import load_model

HAS_CUDA = torch.cuda.is_available()


def _has_metal() -> bool:
    import mlx.core as mx

    return bool(mx.metal.is_available())


def test_detect_available_backends_on_this_machine():
    found = detect_available_backends()
    for name in ("python_reference", "pytorch", "inductor", "onnxruntime", "mlx"):
        assert found[name] is True, (name, backend_availability()[name])
    report = backend_availability()
    if not _has_metal():
        assert found["metal"] is False and "Metal is not available" in report["metal"][1]
    if not HAS_CUDA:
        assert found["cuda"] is False and "torch.cuda.is_available() is False" in report["cuda"][1]
    assert all(reason == "" for ok, reason in report.values() if ok)


@pytest.mark.skipif(HAS_CUDA, reason="checks the report of a machine without CUDA")
def test_cuda_unavailable_raises_df002_naming_backend_and_reason(tiny_qwen2):
    with pytest.raises(BackendInitializationError) as info:
        get_backend("cuda")
    err = info.value
    assert err.code == "DF002" and "cuda" in str(err) and "is_available() is False" in str(err)
    backend = get_backend("cuda", check=False)
    with pytest.raises(BackendInitializationError) as info:
        backend.prepare(load_model(tiny_qwen2), "float32")
    assert info.value.code == "DF002" and info.value.context["backend"] == "cuda"
    ok, reason = get_backend("onnxruntime", check=False, device="cuda").availability()
    assert not ok and "CUDAExecutionProvider" in reason
    ok, reason = get_backend("inductor", check=False, device="cuda").availability()
    assert not ok and "CUDA is not available" in reason


def test_cuda_backend_refuses_a_cpu_device(tiny_qwen2):
    backend = get_backend("cuda", check=False)
    with pytest.raises(BackendInitializationError) as info:
        backend.prepare(load_model(tiny_qwen2), "float32", "cpu")
    assert "CUDA device" in str(info.value) or "is_available() is False" in str(info.value)


@pytest.mark.skipif(_has_metal(), reason="checks a machine without Metal")
def test_metal_unavailable_everywhere_it_is_asked_for(tmp_path, tiny_qwen2):
    with pytest.raises(BackendInitializationError) as info:
        get_backend("metal")
    assert info.value.code == "DF002" and "metal" in str(info.value) and "Metal is not available" in str(info.value)
    with pytest.raises(BackendInitializationError):
        get_backend("mlx", device="gpu")
    mlx = get_backend("mlx")  # the CPU is fine
    with pytest.raises(BackendInitializationError):
        mlx.prepare(load_model(tiny_qwen2), "float32", "gpu")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "rms_norm.metal").write_text("// user kernel\n")
    front = MetalBackend(metal_path=str(kernels))
    assert front.metal_path == kernels and front.backend.metal_path == kernels  # recorded now
    with pytest.raises(BackendInitializationError) as info:
        front.initialize()
    assert info.value.code == "DF002" and "Metal is not available" in str(info.value)
    with pytest.raises(BackendInitializationError):
        front.execute_model(str(tiny_qwen2), [[1, 2, 3]])  # initialises first, which fails
    assert front.version_info()["metal_path"] == str(kernels)
    assert front.cleanup() is True


def test_metal_front_reads_inputs_or_says_what_it_needs():
    from debug_framework.errors import ValidationError
    from debug_framework.integrations.metal_backend import _as_inputs

    got = _as_inputs({"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 0]]})
    assert got.input_ids.tolist() == [[5, 6, 7]] and got.attention_mask.tolist() == [[1, 1, 0]]
    assert _as_inputs([4, 5]).input_ids.shape == (1, 2)
    with pytest.raises(ValidationError, match="without 'input_ids'") as info:
        _as_inputs({"attention_mask": [[1, 1]]})
    assert info.value.code == "DF005"
    with pytest.raises(ValidationError):
        _as_inputs([[0.5, 1.5]])


def test_inductor_without_a_cxx_compiler_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    ok, reason = get_backend("inductor", check=False).availability()
    assert not ok and "C++ compiler" in reason
    with pytest.raises(BackendInitializationError) as info:
        get_backend("inductor")
    assert info.value.code == "DF002" and "inductor" in str(info.value)


def test_auto_picks_the_first_available_non_reference_and_says_why():
    report = backend_availability()
    name, reason = select_alternative("python_reference", availability=report)
    expected = next(n for n in AUTO_ORDER if n != "python_reference" and report[n][0])
    assert name == expected and repr(expected) in reason
    if not HAS_CUDA:
        assert "cuda:" in reason  # the skipped GPU backends are explained
    assert select_alternative(name, availability=report)[0] != name
    # order: GPU backends first, then the CPU ones
    gpu = {n: (True, "") for n in AUTO_ORDER}
    assert select_alternative("python_reference", availability=gpu)[0] == "cuda"
    assert select_alternative("cuda", availability=gpu)[0] == "metal"
    only = {"python_reference": (True, ""), "mlx": (False, "no mlx"), "pytorch": (True, "")}
    assert select_alternative("python_reference", availability=only)[0] == "pytorch"
    with pytest.raises(BackendInitializationError) as info:
        select_alternative("python_reference", availability={"python_reference": (True, ""), "mlx": (False, "no mlx")})
    assert info.value.code == "DF002" and "no mlx" in str(info.value)


def test_every_available_backend_records_its_versions():
    import mlx.core  # noqa: F401
    import numpy as np
    import onnxruntime as ort

    expected = {
        "python_reference": ("numpy", np.__version__),
        "pytorch": ("torch", torch.__version__),
        "inductor": ("torch", torch.__version__),
        "onnxruntime": ("onnxruntime", ort.__version__),
        "mlx": ("mlx", None),
    }
    for name, (runtime, version) in expected.items():
        info = backend_versions(get_backend(name))
        assert info["backend"] == name and info["runtime"] == runtime and info["device_name"], info
        if version:
            assert info[runtime] == version
    assert "transformers" in backend_versions(get_backend("pytorch"))
    assert backend_versions(get_backend("inductor"))["cache_dir"]
    assert backend_versions(get_backend("mlx"))["mlx"]


def test_onnxruntime_unknown_optimisation_level_or_layer_replay_is_df002():
    from debug_framework.backends.onnxruntime.runner import OnnxRuntimeBackend

    with pytest.raises(BackendInitializationError) as info:
        OnnxRuntimeBackend(optimization="max")
    assert info.value.code == "DF002" and "extended" in str(info.value)
    with pytest.raises(BackendInitializationError) as info:
        OnnxRuntimeBackend(layer_replay="cut")
    assert info.value.code == "DF002" and "unknown layer replay 'cut'" in str(info.value) and "graph, export" in str(info.value)
