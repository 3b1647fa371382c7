"""``executorch``: the model's own export (portable and XNNPACK) passing with every checkpoint judged,
its layers replayed in ExecuTorch; a user's program with and without hidden states, correct and with
a broken layer (localized to the layer where the program exposes it); corrupt programs refused with
exit 2 while the tool lives on.

Slow: ExecuTorch's exporter imports in seconds and each lowering takes seconds, so every program is
exported once per module, on a one-layer Llama of hidden 32 wherever one layer shows the behaviour
(the portable session, the XNNPACK case, the logits-alone program; the corrupt files are cut from
the portable session's own program), on the 3-layer one where a broken layer must sit between two
(the hidden states, the docs example).
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
    ExecuTorch's Inspector run beside it on the session's inputs (2 x 16: it fails at batch 2, then runs
    row by row)."""
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(tmp_path_factory.mktemp("db") / "d.db")
    sid = engine.create_session(one_layer_llama, {"isolate": True,  # the layer and its MLP replayed: two programs
                                                  "alternative_options": {"delegate": "portable", "inspector": True}},
                                "auto", "executorch")
    return engine.run(sid), engine.db.sessions.get(sid), engine.db


def test_the_portable_export_passes_and_replays_a_layer_and_its_mlp(portable_session):
    result, stored, _ = portable_session
    assert result.verdict == "passed"
    assert [str(r.key) for r in result.results] == ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]
    info = stored["alternative_backend_info"]["versions"]
    assert info["runtime"] == "executorch" and info["delegate"] == "portable"
    programs = sorted(p.name.split("-", 3)[3] for p in Path(info["artifact_dir"]).glob("*.pte"))
    assert programs == ["inspector-2x16-batch1.pte", "inspector-2x16.pte", "layer0-2x16x32.pte", "mlp0-2x16x32.pte",
                        "model-2x16.pte"]
    isolation = result.to_dict()["isolation"]
    assert [layer["layer"] for layer in isolation] == [0] and not isolation[0]["introduces_error"]
    assert isolation[0]["attention"]["passed"] and isolation[0]["mlp"]["passed"]


def test_the_inspector_runs_on_the_sessions_rows_beside_our_judgement(portable_session):
    """ExecuTorch's Inspector on the session's own inputs: the batch of 2 fails (said so), each row at
    batch 1 runs; its gap per operator placed in the model (embedding, layer 0, head) beside our
    margin there, in --json, the stored session, the terminal and the HTML report."""
    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report
    from debug_framework.reports._inspector import inspector_text
    from debug_framework.services.validation.results import ValidationResult

    result, stored, db = portable_session
    inspector = result.to_dict()["inspector"]
    assert inspector["ran"] and inspector["metric"] == "MSE" and inspector["operators"] > 50
    assert inspector["inputs"] == "the session's 2 rows one by one at batch 1"
    assert len(inspector["notes"]) == 1 and "at the session's batch of 2: ValueError" in inspector["notes"][0]
    places = {p["place"]: p for p in inspector["places"]}
    assert list(places) == ["embedding", "layer 0", "head"]  # program order, each operator by its module
    assert places["layer 0"]["operators"] > 20 and 0.0 <= inspector["worst"][0]["gap"] < 1e-8
    assert ValidationResult.from_dict(result.to_dict()).inspector == inspector  # what --json writes reads back
    assert ValidationResult.load(db, result.session_id).inspector == inspector  # the stored session
    lines = inspector_text(result)
    assert lines[0].startswith("inspector: ExecuTorch's Inspector (calculate_numeric_gap, the session's 2 rows")
    assert [line.split()[0] for line in lines[2:]] == ["embedding", "layer", "head"] and "pass" in lines[3]
    page = render_report(ValidationReport.from_session(result.session_id, db), "html")
    assert 'id="inspector"' in page and "<td>layer 0</td>" in page and "at the session&#x27;s batch of 2" in page


def test_the_model_program_given_back_reads_its_sidecar(portable_session, one_layer_llama, tmp_path):
    _, stored, _ = portable_session
    program = next(Path(stored["alternative_backend_info"]["versions"]["artifact_dir"]).glob("*-model-*.pte"))
    assert json.loads(Path(str(program) + ".json").read_text())["outputs"][0] == "post_embedding"
    code, result = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-model", str(program), "--no-isolate")
    assert code == 0 and len(result["results"]) == 4 and all(_rows(result).values())


def test_a_users_program_is_not_decoded_and_says_what_is(portable_session, one_layer_llama, tmp_path, capsys):
    """--decode-steps with a user's program: DF002, exit 2, naming what decodes (the model's own export;
    its decode: test_decode.py)."""
    _, stored, _ = portable_session
    program = next(Path(stored["alternative_backend_info"]["versions"]["artifact_dir"]).glob("*-model-*.pte"))
    code, _ = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-model", str(program), "--no-isolate",
                        "--decode-steps", "1")
    err = capsys.readouterr().err
    assert code == 2 and "[DF002]" in err and f"runs {program.name} as a program of the user's" in err
    assert "decode steps run on the model's own export" in err


def test_the_xnnpack_export_passes_every_checkpoint(one_layer_llama, tmp_path):
    code, result = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-backend", "executorch", "--backend-option",
                             "delegate=xnnpack", "--no-isolate")
    assert code == 0 and result["verdict"] == "passed"
    assert list(_rows(result)) == ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]


def test_a_users_program_with_hidden_states_and_a_broken_layer(tiny_et_llama, user_program_exporter, broken_layer,
                                                               tmp_path):
    """Localized to its layer: the layer before passes, the broken one is the first divergence (the
    correct program with hidden states passing: test_the_docs_example_runs)."""
    program = user_program_exporter(tiny_et_llama, tmp_path / "hidden-broken.pte", hidden_states=True, broken=True)
    code, result = _validate(tiny_et_llama, tmp_path / "d.db", "--alternative-model", str(program))
    rows = _rows(result)
    assert code == 1 and set(rows) == {"post_embedding", "post_mlp:0", "post_mlp:1", "post_processing"}
    assert rows["post_embedding"] and rows["post_mlp:0"] and not rows[f"post_mlp:{broken_layer}"]
    first = result["first_divergence"]
    assert (first["checkpoint"], first["layer"]) == ("post_mlp", broken_layer)


def test_a_users_program_with_logits_alone(one_layer_llama, user_program_exporter, tmp_path):
    """Only the logits are compared (a broken layer is localized to the logits: the hidden-states case
    shows a broken layer found)."""
    program = user_program_exporter(one_layer_llama, tmp_path / "logits.pte", hidden_states=False, broken=False)
    code, result = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-model", str(program))
    assert code == 0 and _rows(result) == {"post_processing": True}


def test_truncated_and_non_utf8_programs_exit_2_and_the_tool_lives_on(portable_session, one_layer_llama, tmp_path,
                                                                      capsys):
    from debug_framework.backends.executorch.program import probe_program
    from debug_framework.errors import ModelLoadingError

    _, stored, _ = portable_session
    data = next(Path(stored["alternative_backend_info"]["versions"]["artifact_dir"]).glob("*-model-*.pte")).read_bytes()
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(data[: len(data) // 2])
    garbled = tmp_path / "garbled.pte"
    garbled.write_bytes(data[:4] + b"\xff\xfe\xfd\xfc" + data[8:])
    for path, why in ((truncated, "it is truncated"), (garbled, "bytes 4-8 are ff fe fd fc")):
        code, _ = _validate(one_layer_llama, tmp_path / "d.db", "--alternative-model", str(path))
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
