"""Issue 33, item 7: a model path over the file-name limit (ENAMETOOLONG) or holding a NUL byte is
DF004 (exit 2) in debug_validate, in a debug_batch item and in the loader the dashboard's worker runs,
never an internal error."""

from __future__ import annotations

import pytest

from debug_framework.cli import debug_batch, debug_validate
from debug_framework.errors import ModelLoadingError
from debug_framework.modelio.loader import load_model

LONG = "/tmp/" + "x" * 300 + "/model"


def test_the_loader_names_the_limit():
    with pytest.raises(ModelLoadingError, match="longer than the file system allows"):
        load_model(LONG)
    with pytest.raises(ModelLoadingError, match="NUL byte"):
        load_model("/tmp/a\x00b")


def test_debug_validate_exits_2(tmp_path, capsys):
    assert debug_validate.run(["--model-path", LONG, "--database", str(tmp_path / "d.db")]) == 2
    err = capsys.readouterr().err
    assert "[DF004]" in err and "longer than the file system allows" in err


def test_a_debug_batch_item_is_df004_not_internal(tmp_path, capsys):
    listing = tmp_path / "models.txt"
    listing.write_text(LONG + "\n")
    # the model paths are checked before the job starts: a usage error (exit 2), never our bug (3)
    assert debug_batch.main([str(listing), "--database", str(tmp_path / "b.db"), "--json"]) == 2
    err = capsys.readouterr().err
    assert "DF004" in err and "longer than the file system allows" in err and "internal" not in err
