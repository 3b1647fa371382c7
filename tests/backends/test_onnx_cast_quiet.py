"""Retyping an ONNX file to float16 leaks no NumPy warning (issue 48, item 11): a weight beyond
float16's range becomes ±inf, as the engine makes it, and the comparison judges it as saturated;
NumPy's ``RuntimeWarning: overflow encountered in cast`` never reaches the user's terminal."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")


def test_a_weight_beyond_float16_becomes_inf_without_a_warning():
    from onnx import numpy_helper

    from debug_framework.backends._onnx_file import _FLOAT16, _retyped_tensor

    t = numpy_helper.from_array(np.array([1.0, 1e6, -1e6], dtype=np.float32), "w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        out = numpy_helper.to_array(_retyped_tensor(t, _FLOAT16))
    assert out.dtype == np.float16 and out[0] == 1.0
    assert np.isposinf(out[1]) and np.isneginf(out[2])
