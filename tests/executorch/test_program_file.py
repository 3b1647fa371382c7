"""A ``.pte`` file is checked before ExecuTorch reads it (fast: no export, no runtime): the program
identifier ``ET12`` at bytes 4-8, the extended header and the sizes it gives, each refusal a DF004
error naming the file; the CLI exits 2 on one before running anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from debug_framework.backends.executorch.outputs import output_map
from debug_framework.backends.executorch.program import ProgramSignature, TensorSpec, check_program_file
from debug_framework.errors import ConfigurationError, ModelLoadingError


def _program_bytes(identifier: bytes = b"ET12", program_size: int = 64, segment_base: int = 64,
                   segment_size: int = 32, length: int = 32) -> bytes:
    """A header as ExecuTorch writes it: root offset, identifier, ``eh00``, length, sizes."""
    header = (b"\x3c\x00\x00\x00" + identifier + b"eh00" + length.to_bytes(4, "little")
              + program_size.to_bytes(8, "little") + segment_base.to_bytes(8, "little") + segment_size.to_bytes(8, "little"))
    return header.ljust(program_size, b"\x00") + b"\x01" * segment_size


def _write(tmp_path: Path, data: bytes, name: str = "model.pte") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_well_formed_header_is_read(tmp_path):
    header = check_program_file(_write(tmp_path, _program_bytes()))
    assert (header.identifier, header.program_size, header.segment_base_offset, header.segment_data_size) == (
        "ET12", 64, 64, 32)


@pytest.mark.parametrize(("data", "why"), [
    (_program_bytes()[:80], "truncated: 80 bytes, its data segments end at byte 96"),
    (_program_bytes(program_size=4096, segment_base=0, segment_size=0)[:100], "truncated: 100 bytes, the program alone is 4096"),
    (_program_bytes(identifier=b"\xff\xfe\xfd\xfc"), "bytes 4-8 are ff fe fd fc, not the program identifier ET12"),
    (_program_bytes(identifier=b"ET11"), "its format is ET11, this ExecuTorch reads ET12"),
    (b"PK\x03\x04" + b"\x00" * 60, "not the program identifier ET12"),
    (b"\x00\x00\x00\x00ET12abcd" + b"\x00" * 40, "no extended header"),
    (b"ET1", "shorter than a program's header"),
])
def test_a_corrupt_program_is_refused_naming_the_file(tmp_path, data, why):
    path = _write(tmp_path, data)
    with pytest.raises(ModelLoadingError, match="model.pte is not an ExecuTorch program") as info:
        check_program_file(path)
    assert why in info.value.message and info.value.context["file"] == str(path) and info.value.code == "DF004"


def test_a_missing_file_or_another_suffix_is_refused(tmp_path):
    with pytest.raises(ModelLoadingError, match="does not exist"):
        check_program_file(tmp_path / "absent.pte")
    with pytest.raises(ModelLoadingError, match="does not end in .pte"):
        check_program_file(_write(tmp_path, _program_bytes(), "model.onnx"))


def test_the_cli_exits_2_on_a_corrupt_program_before_running_it(tiny_et_llama, tmp_path, capsys):
    from debug_framework.cli.debug_validate import run

    bad = _write(tmp_path, _program_bytes(identifier=b"\x80\x81\x82\x83"))
    code = run(["--model-path", str(tiny_et_llama), "--alternative-model", str(bad), "--database", str(tmp_path / "d.db")])
    err = capsys.readouterr().err
    assert code == 2 and "model.pte is not an ExecuTorch program" in err and "DF004" in err


def test_outputs_are_read_as_logits_hidden_states_or_named():
    class Model:  # what output_map reads of a loaded model
        num_layers, architecture = 3, "llama"

    def sig(n):
        return ProgramSignature((TensorSpec("int64", (2, 16)),), tuple(TensorSpec("float32", (2, 16, 8)) for _ in range(n)))

    assert [str(k) for k in output_map(sig(1), Model, None, "p.pte")[0]] == ["post_processing"]
    keys, how = output_map(sig(5), Model, None, "p.pte")
    assert how == "hidden_states"  # [0] embeddings, [i + 1] layer i, the last after the final norm: none of ours
    assert [None if k is None else str(k) for k in keys] == [
        "post_processing", "post_embedding", "post_mlp:0", "post_mlp:1", None]
    keys, how = output_map(sig(2), Model, ["post_mlp:2", None], "p.pte.json")
    assert how == "sidecar" and [None if k is None else str(k) for k in keys] == ["post_mlp:2", None]
    with pytest.raises(ConfigurationError, match="the program has 3 outputs: 1 .* or 5"):
        output_map(sig(3), Model, None, "p.pte")
    with pytest.raises(ConfigurationError, match="names 1 outputs, the program has 2"):
        output_map(sig(2), Model, ["post_processing"], "p.pte.json")
    with pytest.raises(ConfigurationError, match="names post_mlp:7, the model has 3 layers"):
        output_map(sig(1), Model, ["post_mlp:7"], "p.pte.json")


def test_options_are_checked_when_the_backend_is_built(tmp_path):
    from debug_framework.backends import get_backend
    from debug_framework.errors import BackendInitializationError

    with pytest.raises(BackendInitializationError, match="unknown delegate 'xnn'.*delegate=xnnpack or delegate=portable"):
        get_backend("executorch", delegate="xnn", check=False)
    program = _write(tmp_path, _program_bytes())
    with pytest.raises(BackendInitializationError, match="Inspector needs the program's ETRecord"):
        get_backend("executorch", model_file=str(program), inspector=True, check=False)
    (tmp_path / "model.pte.json").write_text("{outputs")  # the sidecar beside it, read when the backend is built
    with pytest.raises(BackendInitializationError, match="the outputs sidecar is not JSON"):
        get_backend("executorch", model_file=str(program), check=False)
