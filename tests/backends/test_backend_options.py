"""``--backend-option KEY=VALUE`` passes options to the alternative, checked against what its factory
takes, recorded with the session and shown in every view; ``--dtype auto`` judges the alternative
at the precision it declares (OpenVINO's hint or its device's default, an ONNX file's weights)."""

from __future__ import annotations

import json
import re

import pytest

from debug_framework.backends import get_backend
from debug_framework.cli.validate_support import parse_backend_options
from debug_framework.errors import BackendInitializationError, ConfigurationError


def test_options_are_read_as_json_where_they_parse():
    got = parse_backend_options(["precision_hint=bf16", "opset=18", "emulate_bf16=false", "device=null",
                                 "providers=[\"CPUExecutionProvider\"]", "graph_transform=a.py:f"])
    assert got == {"precision_hint": "bf16", "opset": 18, "emulate_bf16": False, "device": None,
                   "providers": ["CPUExecutionProvider"], "graph_transform": "a.py:f"}
    for bad in ("precision_hint", "=bf16", "not a key=1"):
        with pytest.raises(ConfigurationError, match="is not KEY=VALUE"):
            parse_backend_options([bad])


def test_an_option_the_backend_does_not_take_is_named_with_the_ones_it_does():
    with pytest.raises(BackendInitializationError) as info:
        get_backend("pytorch", devcie="cpu")
    assert "has no option 'devcie'" in info.value.message and "did you mean 'device'" in info.value.message
    assert info.value.hint == "its options: device"


@pytest.mark.slow
def test_openvino_hint_from_the_command_line_is_judged_at_that_precision_in_every_view(tiny_bert, tmp_path, capsys):
    pytest.importorskip("openvino")
    from debug_framework.cli.debug_validate import run

    base = ["--model-path", str(tiny_bert), "--alternative-backend", "openvino", "--backend-option",
            "precision_hint=bf16", "--dtype", "auto", "--no-isolate", "--database", str(tmp_path / "o.db")]
    assert run([*base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "passed" and doc["alternative_dtype"] == "bfloat16"
    assert doc["alternative_options"] == {"precision_hint": "bf16"}
    report = tmp_path / "o.html"
    assert run([*base, "--output-file", str(report)]) == 0
    terminal = capsys.readouterr().out
    assert "openvino [precision_hint=bf16] (bfloat16) vs python_reference (float64)" in " ".join(terminal.split())
    page = re.sub(r"<[^>]+>", " ", report.read_text())
    assert "openvino [precision_hint=bf16] (bfloat16)" in " ".join(page.split())

    from debug_framework.services.validation_engine import ValidationEngine

    session = ValidationEngine(tmp_path / "o.db").db.sessions.get(doc["session_id"])
    info = session["alternative_backend_info"]
    assert info["options"] == {"precision_hint": "bf16"}
    assert info["dtype_because"] == "dtype auto: OpenVINO's precision hint bf16"


@pytest.mark.slow
def test_openvino_at_its_defaults_is_judged_at_its_devices_precision(tiny_bert, tmp_path, capsys):
    """No hint: OpenVINO computes at its device's default (bfloat16 on a CPU with AMX, else float32);
    ``--dtype auto`` judges it there, and a correct engine passes either way."""
    ov = pytest.importorskip("openvino")
    from debug_framework.cli.debug_validate import run

    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    expected = {"bf16": "bfloat16", "f16": "float16"}.get(default, "float32")
    assert run(["--model-path", str(tiny_bert), "--alternative-backend", "openvino", "--dtype", "auto",
                "--no-isolate", "--json", "--database", str(tmp_path / "d.db")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "passed" and doc["alternative_dtype"] == expected
