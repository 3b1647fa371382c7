"""inductor-debug from a fresh shell on runs made by the torch.compile debugging tools; JSON validated
against src/debug_module/schemas/cli-output.schema.json; exit codes 0/1/2 (each command and exit code
from a fresh process at least once; the further usage errors in this process)."""

from __future__ import annotations

import json
import textwrap

import pytest

from debug_module.schemas import load_schema, validate

from .conftest import check_json, run_cli, run_in_process

pytestmark = pytest.mark.slow  # every test spawns Python + torch (2-4 s each)


def test_list_and_analyze_every_type(artifacts_root):
    root, aot, kd = str(artifacts_root["root"]), artifacts_root["aot_run"], artifacts_root["kd_run"]
    code, out, err = run_cli("--root", root, "--json", "list", script=True)
    assert code == 0, err
    runs = {r["run_id"]: r for r in check_json(out)["data"]["runs"]}
    assert set(runs) == {aot, kd}
    assert runs[aot]["files_by_kind"]["inductor_output_code"] >= 1 and runs[aot]["violation_count"] > 0
    assert runs[kd]["kerneldiff_passed"] is False

    code, out, _ = run_cli("analyze", "--root", root, "--json", "--run", aot, "--type", "guards")
    d = check_json(out)["data"]
    assert code == 0 and d["available"] and d["graph_count"] == 1 and d["guard_sets"]

    code, out, _ = run_cli("analyze", "--root", root, "--json", "--run", aot, "--type", "constraints")
    d = check_json(out)["data"]
    assert code == 0 and set(d["by_constraint"]) == {"shape_alignment"}
    assert {c["graph"] for c in d["coverage"]} == {"graph_000_forward", "graph_000_backward"}
    assert any((v.get("source") or {}).get("code") for v in d["by_constraint"]["shape_alignment"])

    code, out, _ = run_cli("analyze", str(artifacts_root["root"] / aot), "--root", root, "--json", "--type", "graphs")
    d = check_json(out)["data"]
    assert code == 0 and {g["kind"] for g in d["graphs"]} == {"forward", "backward"} and d["fx_graph_count"] == 1

    code, out, _ = run_cli("analyze", "--root", root, "--json", "--run", aot, "--type", "summary")
    assert code == 0 and check_json(out)["data"]["kerneldiff"] is None
    # a failing KernelDiff is a numerical failure: exit 1
    code, out, _ = run_cli("analyze", "--root", root, "--json", "--run", kd, "--type", "summary")
    d = check_json(out)["data"]
    assert code == 1 and d["kerneldiff"]["first_divergent_module"] == "fc2"


def test_usage_and_environment_errors_exit_2(artifacts_root, tmp_path, capsys):
    root = str(artifacts_root["root"])
    for args in (["analyze", "--type", "bogus"], ["analyze", "--run", "20000101T000000-deadbeef"],
                 ["analyze", "--model", "nocolon"], ["report", "--format", "pdf"],
                 ["analyze", str(tmp_path)]):
        code, out, _ = run_in_process(capsys, "--root", root, "--json", *args)
        doc = check_json(out)
        assert code == 2 and doc["exit_code"] == 2 and doc["error"]["message"], args
    code, _, err = run_cli("--root", root, "analyze", "--type", "bogus")
    assert code == 2 and "unknown analysis type" in err
    code, _, _ = run_cli("no-such-command")
    assert code == 2
    code, out, _ = run_cli("--root", str(tmp_path / "missing"), "--json", "list")
    assert code == 0 and check_json(out)["data"]["runs"] == []


def test_report_html_and_json(artifacts_root, tmp_path):
    root = str(artifacts_root["root"])
    code, out, err = run_cli("--root", root, "--json", "report", "--format", "html", "--output", str(tmp_path / "r.html"))
    assert code == 0, err
    d = check_json(out)["data"]
    html = (tmp_path / "r.html").read_text()
    assert d["json"] == str(tmp_path / "r.json") and json.loads((tmp_path / "r.json").read_text())["summary"]["runs"] == 2
    assert "data:image/png;base64," in html and "shape_alignment" in html
    code, out, _ = run_cli("--root", root, "--json", "report", "--format", "json", "--run", artifacts_root["kd_run"],
                           "--output", str(tmp_path / "one.json"))
    d = check_json(out)["data"]
    assert code == 0 and d["html"] is None and d["summary"]["runs"] == 1 and d["summary"]["kerneldiff_passed"] == 0


def test_analyze_user_model_from_factory_and_never_a_demo_unless_asked(tmp_path, capsys):
    (tmp_path / "usermodel.py").write_text(textwrap.dedent("""
        import torch

        class Branchy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                y = self.lin(x)
                if y.sum() > 0:   # graph break
                    return y * 2
                return y

        def make_model():
            torch.manual_seed(0)
            return Branchy()

        def make_inputs():
            return [(torch.ones(2, 4),), (torch.ones(3, 4),)]
    """))
    root = str(tmp_path / "art")
    code, out, err = run_cli("--root", root, "--json", "analyze", "--model", "usermodel:make_model",
                             "--inputs", "usermodel:make_inputs", "--type", "guards", cwd=tmp_path)
    assert code == 0, err
    d = check_json(out)["data"]
    assert d["model"] == "Branchy" and d["graph_break_count"] >= 1 and d["recompilations"]
    assert any("graph break" in b["code"] for b in d["graph_breaks"])
    # without --inputs and without a (model, inputs) factory: usage error, nothing is analyzed
    code, out, _ = run_in_process(capsys, "--root", root, "--json", "analyze", "--model",
                                  f"{tmp_path}/usermodel.py:make_model")
    assert code == 2 and "no inputs" in check_json(out)["error"]["message"]
    # no model and no runs: error, not a silent demo
    code, out, _ = run_in_process(capsys, "--root", str(tmp_path / "empty"), "--json", "analyze", "--type", "summary")
    assert code == 2 and "no runs" in check_json(out)["error"]["message"]


def test_clean_asks_and_removes_only_its_own_runs(artifacts_root, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(artifacts_root["root"], root)
    (root / "not_a_run").mkdir()
    (root / "not_a_run" / "keep.txt").write_text("x")
    (root / "20200101T000000-00000000").mkdir()  # looks like a run id, but a foreign manifest
    (root / "20200101T000000-00000000" / "manifest.json").write_text(json.dumps({"schema": "other/1"}))
    code, out, _ = run_cli("--root", str(root), "--json", "clean", input="n\n")
    d = check_json(out)["data"]
    assert code == 0 and d["cancelled"] and not d["removed"] and len(d["kept"]) == 2
    code, out, _ = run_cli("--root", str(root), "--json", "clean", "--yes")
    d = check_json(out)["data"]
    assert code == 0 and sorted(d["removed"]) == sorted([artifacts_root["aot_run"], artifacts_root["kd_run"]])
    assert (root / "not_a_run" / "keep.txt").exists() and (root / "20200101T000000-00000000").exists()


def test_schema_validator_rejects_bad_documents():
    schema = load_schema("cli-output")
    good = {"schema": "inductor-debug/1", "command": "clean", "ok": True, "exit_code": 0, "root": "r",
            "data": {"removed": [], "cancelled": False, "kept": []}, "error": None}
    assert validate(good, schema) == []
    assert validate({**good, "exit_code": 3}, schema)
    assert validate({**good, "data": {"removed": ["x"], "cancelled": False, "kept": []}}, schema)
    assert validate({**good, "exit_code": 2}, schema)  # an error needs error + null data
    assert validate({k: v for k, v in good.items() if k != "root"}, schema)


def test_cli_constants_match_the_library_and_listing_does_not_import_torch(artifacts_root):
    import subprocess
    import sys

    from debug_module import artifacts, cli
    from debug_module.reports import generator

    assert cli.DEFAULT_ARTIFACT_ROOT == artifacts.DEFAULT_ARTIFACT_ROOT
    assert generator.MANIFEST_SCHEMA == artifacts.MANIFEST_SCHEMA
    code = ("import sys; from debug_module.cli import main\n"
            "try:\n    main(['--root', sys.argv[1], '--json', 'list'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, str(artifacts_root["root"])], capture_output=True, text=True)
    assert p.stderr.strip().endswith("False"), p.stderr
