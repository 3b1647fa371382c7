"""``executorch``: the model's own export (portable and XNNPACK) passing with every checkpoint judged,
its layers replayed in ExecuTorch; a user's program with and without hidden states, correct and with
a broken layer (localized to the layer where the program exposes it); corrupt programs refused with
exit 2 while the tool lives on.

Slow: ExecuTorch's exporter imports in seconds and each lowering takes seconds, so every program is
exported once per module (portable, except the one XNNPACK case) on a 3-layer Llama of hidden 32.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("executorch")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def user_programs(tiny_et_llama, user_program_exporter, tmp_path_factory) -> dict[str, Path]:
    """The user's programs: with hidden states (broken: the correct one is the docs example's) or
    logits alone (correct and broken)."""
    root = tmp_path_factory.mktemp("programs")
    return {f"{kind}-{state}": user_program_exporter(tiny_et_llama, root / f"{kind}-{state}.pte",
                                                   hidden_states=kind == "hidden", broken=state == "broken")
            for kind, state in (("hidden", "broken"), ("logits", "correct"), ("logits", "broken"))}


def _validate(model: Path, db: Path, *extra: str) -> tuple[int, dict]:
    """``debug_validate ... --json``: the exit code and the result."""
    import contextlib
    import io

    from debug_framework.cli.debug_validate import run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(["--model-path", str(model), "--database", str(db), "--json", *extra])
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else {}


def _rows(result: dict) -> dict[str, bool]:
    return {row["id"]: row["passed"] for row in result["results"]}


@pytest.fixture(scope="module")
def portable_session(one_layer_llama, tmp_path_factory):
    """The model's own portable export (one layer), the layer and its MLP block replayed in ExecuTorch, and
    ExecuTorch's Inspector run beside it."""
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(tmp_path_factory.mktemp("db") / "d.db")
    sid = engine.create_session(one_layer_llama, {"isolate": True,  # the layer and its MLP replayed: two programs
                                                  "alternative_options": {"delegate": "portable", "inspector": True}},
                                "auto", "executorch")
    return engine.run(sid), engine.db.sessions.get(sid)


def test_the_portable_export_passes_and_replays_a_layer_and_its_mlp(portable_session):
    result, stored = portable_session
    assert result.verdict == "passed"
    assert [str(r.key) for r in result.results] == ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]
    info = stored["alternative_backend_info"]["versions"]
    assert info["runtime"] == "executorch" and info["delegate"] == "portable"
    programs = sorted(p.name.split("-")[3] for p in Path(info["artifact_dir"]).glob("*.pte"))
    assert programs == ["inspector", "layer0", "mlp0", "model"]
    isolation = result.to_dict()["isolation"]
    assert [layer["layer"] for layer in isolation] == [0] and not isolation[0]["introduces_error"]
    assert isolation[0]["attention"]["passed"] and isolation[0]["mlp"]["passed"]
    inspector = info["inspector"]  # a portable program at batch 1: the Inspector runs, its gap per operator
    assert inspector["ran"] and inspector["operators"] > 50 and inspector["metric"] == "MSE"
    assert 0.0 <= inspector["worst"][0]["gap"] < 1e-8 and "calculate_numeric_gap:" in inspector["line"]


def test_the_model_program_given_back_reads_its_sidecar(portable_session, one_layer_llama, tmp_path):
    _, stored = portable_session
    program = next(Path(stored["alternative_backend_info"]["versions"]["artifact_dir"]).glob("*-model-*.pte"))
    assert json.loads(Path(str(program) + ".json").read_text())["outputs"][0] == "post_embedding"
    code, result = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-model", str(program), "--no-isolate")
    assert code == 0 and len(result["results"]) == 4 and all(_rows(result).values())


def test_the_xnnpack_export_passes_every_checkpoint(one_layer_llama, tmp_path):
    code, result = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-backend", "executorch", "--backend-option",
                             "delegate=xnnpack", "--no-isolate")
    assert code == 0 and result["verdict"] == "passed"
    assert list(_rows(result)) == ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]


def test_a_users_program_with_hidden_states_and_a_broken_layer(user_programs, tiny_et_llama, broken_layer, tmp_path):
    """Localized to its layer: the layer before passes, the broken one is the first divergence (the
    correct program with hidden states passing: test_the_docs_example_runs)."""
    code, result = _validate(tiny_et_llama, tmp_path / "d.db", "--alternative-model", str(user_programs["hidden-broken"]))
    rows = _rows(result)
    assert code == 1 and set(rows) == {"post_embedding", "post_mlp:0", "post_mlp:1", "post_processing"}
    assert rows["post_embedding"] and rows["post_mlp:0"] and not rows[f"post_mlp:{broken_layer}"]
    first = result["first_divergence"]
    assert (first["checkpoint"], first["layer"]) == ("post_mlp", broken_layer)


def test_a_users_program_with_logits_alone(user_programs, tiny_et_llama, tmp_path):
    code, result = _validate(tiny_et_llama, tmp_path / "d.db", "--alternative-model", str(user_programs["logits-correct"]))
    assert code == 0 and _rows(result) == {"post_processing": True}
    code, result = _validate(tiny_et_llama, tmp_path / "d.db", "--alternative-model", str(user_programs["logits-broken"]))
    assert code == 1 and _rows(result) == {"post_processing": False}


def test_truncated_and_non_utf8_programs_exit_2_and_the_tool_lives_on(user_programs, tiny_et_llama, tmp_path, capsys):
    from debug_framework.backends.executorch.program import probe_program
    from debug_framework.errors import ModelLoadingError

    data = user_programs["logits-correct"].read_bytes()
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(data[: len(data) // 2])
    garbled = tmp_path / "garbled.pte"
    garbled.write_bytes(data[:4] + b"\xff\xfe\xfd\xfc" + data[8:])
    for path, why in ((truncated, "it is truncated"), (garbled, "bytes 4-8 are ff fe fd fc")):
        code, _ = _validate(tiny_et_llama, tmp_path / "d.db", "--alternative-model", str(path))
        err = capsys.readouterr().err
        assert code == 2 and f"{path.name} is not an ExecuTorch program" in err and why in err
    # past the header check, ExecuTorch's loader aborts the process reading it: the child's crash, our DF004
    with pytest.raises(ModelLoadingError, match=r"ExecuTorch's loader crashed on it \(SIGABRT\)"):
        probe_program(garbled, "executorch")


def test_the_docs_example_runs(tiny_et_llama, tmp_path, monkeypatch, capsys):
    """docs/executorch.md's export and its ``debug_validate`` command, as written (in this process): a
    correct user's program with the hidden states passes at each checkpoint it exposes."""
    from debug_framework.cli.debug_validate import run

    doc = Path(__file__).resolve().parents[2] / "docs" / "executorch.md"
    text = doc.read_text(encoding="utf-8")
    (code,) = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", text, re.S)
    (command,) = re.findall(r"<!-- doctest-bash -->\s*```bash\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODEL", str(tiny_et_llama))
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "d.db"))
    exec(compile(code, str(doc), "exec"), {"__name__": "__doc_example__"})
    argv = shlex.split(os.path.expandvars(command.strip()))
    assert argv[0] == "debug_validate"
    assert run(argv[1:]) == 0
    rows = _rows(json.loads(capsys.readouterr().out))
    assert rows == {"post_embedding": True, "post_mlp:0": True, "post_mlp:1": True, "post_processing": True}
