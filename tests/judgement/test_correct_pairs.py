"""Correct backend pairs pass with the calibrated defaults, on every seed: the NumPy reference
(float64) against eager PyTorch in float32, bfloat16 and float16 on five models per family; eager
PyTorch against Inductor, ONNX Runtime and MLX (slow: a compile or an export each; few and small)."""

from __future__ import annotations

import pytest

from debug_framework.backends import backend_availability, registered_backends

SEEDS = (0, 1, 2, 3, 4)


def _passes(engine, model, reference, alternative, config):
    result = engine.run(engine.create_session(model, config, reference, alternative))
    fd = result.first_divergence
    assert result.passed, (alternative, config, fd and (str(fd.key), fd.reason))
    assert result.introducing_layers in ([], None) and result.error_source is None
    assert all(o.judged_by == "calibration" and 0 <= o.margin <= 1 for o in result.results)
    return result


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "bert"])
def test_reference_vs_pytorch(family, dtype, tiny_models, engine):
    for seed in SEEDS:
        _passes(engine, tiny_models(family, seed), "python_reference", "pytorch",
                {"dtype": dtype, "seed": seed, "isolate": seed == 0})


def _available(name: str) -> None:
    if name not in registered_backends():
        pytest.skip(f"{name} is not registered")
    ok, why = backend_availability()[name]
    if not ok:
        pytest.skip(f"{name} unavailable: {why}")


@pytest.mark.slow
def test_pytorch_vs_inductor(tiny_models, engine):
    _available("inductor")
    for seed in SEEDS:  # one compile; later sessions hit the FX graph cache
        _passes(engine, tiny_models("llama", 0), "pytorch", "inductor", {"seed": seed, "isolate": False})


@pytest.mark.slow
def test_pytorch_vs_onnxruntime(tiny_models, engine):
    _available("onnxruntime")  # one export (~20 s): one seed here, five in benchmarks/bench_diagnosis.py
    _passes(engine, tiny_models("llama", 0), "pytorch", "onnxruntime", {"seed": 0, "isolate": False})


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pytorch_vs_mlx(dtype, tiny_models, engine):
    _available("mlx")
    for seed in SEEDS:
        for family in ("llama", "bert"):
            _passes(engine, tiny_models(family, 0), "pytorch", "mlx", {"dtype": dtype, "seed": seed, "isolate": seed == 0})
