"""A weights path that cannot be read is a DF004 error naming the file, not a raw OSError."""

import pytest

from debug_framework.errors import ModelLoadingError
from debug_framework.modelio.weights import _head


def test_unreadable_weights_file_is_df004(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.mkdir()  # opening a directory fails with OSError for every user, root included
    with pytest.raises(ModelLoadingError) as e:
        _head(bad, 8)
    assert "DF004" in str(e.value) and str(bad) in str(e.value)
