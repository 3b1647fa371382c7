"""Families of the breadth sweep (docs/models-and-backends.md) that no other test names, each for a
structural rule of the generic tier: an MLP written inline in the layer (OPT, BART), a flattened
post-attention state (OPT), a seam that does not fit the layer's code (MobileBERT's bottlenecks:
the MLP is judged with the whole layer), a parallel block (Cohere), experts routed in one module
(GraniteMoE) and ALiBi attention (BLOOM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from debug_framework.capture.keys import all_checkpoints
from debug_framework.modelio import load_model
from debug_framework.services.validation_engine import ValidationEngine


@pytest.mark.parametrize("family", ["opt", "bart", "mobilebert", "cohere", "granitemoe", "bloom"])
def test_sweep_family_validates(family: str, zoo, tmp_path: Path) -> None:
    model = load_model(zoo(family))
    assert model.architecture == "generic"
    engine = ValidationEngine(database_path=tmp_path / "s.db")
    sid = engine.create_session(zoo(family), {"input_shape": [2, 6]}, "auto", "pytorch")
    out = engine.run(sid).to_dict()
    assert out["verdict"] == "passed", out["first_divergence"]
    assert out["reference_backend"] == "float64_eager"
    ids = [r["id"] for r in out["results"]]
    assert ids == [str(k) for k in all_checkpoints(model.num_layers, model.router_layers)]
    assert all(r["module"] for r in out["results"])
    assert len(out["isolation"]) == model.num_layers


def test_inline_mlp_and_flat_state(zoo) -> None:
    """OPT's MLP is fc1/fc2 on the layer itself, on a state flattened to [tokens, hidden]: the block
    starts at fc1 and still runs alone through the seam (the state is given its shape back)."""
    from debug_framework.backends import get_backend

    backend = get_backend("float64_eager")
    backend.prepare(load_model(zoo("opt")), "float64")
    layer = backend.structure.layers[0]
    assert layer.mlp.endswith(".fc1") and layer.flat_state and not layer.parallel
    assert backend.can_run_block() == (True, "")


@pytest.mark.slow
def test_generic_tier_validates_against_inductor(zoo, tmp_path: Path, capsys) -> None:
    """``debug_validate --alternative-backend inductor`` on a generic-tier family (BLOOM: ALiBi,
    no reference from the math): every checkpoint within its bound, judged by float64 eager."""
    import json

    from debug_framework.backends import backend_availability
    from debug_framework.cli.debug_validate import run

    ok, why = backend_availability().get("inductor", (False, "not registered"))
    if not ok:
        pytest.skip(f"inductor unavailable: {why}")
    code = run(["--model-path", str(zoo("bloom")), "--alternative-backend", "inductor", "--no-isolate", "--json",
                "--database", str(tmp_path / "s.db")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"] == "passed", out["first_divergence"]
    assert out["reference_backend"] == "float64_eager" and out["alternative_backend"] == "inductor"
    assert len(out["results"]) == 2 + 2 * 2
