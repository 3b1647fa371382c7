"""The curated public API: every name in ``debug_framework.__all__`` resolves, is documented, and
``import debug_framework`` stays light (the heavy modules load on first use)."""

import subprocess
import sys

import pytest

import debug_framework


@pytest.mark.parametrize("name", debug_framework.__all__)
def test_every_public_name_resolves_and_is_documented(name):
    value = getattr(debug_framework, name)
    assert value is not None
    if callable(value):
        assert (value.__doc__ or "").strip(), f"{name} has no docstring"


def test_public_names_are_the_defining_objects():
    from debug_framework.backends import register_backend
    from debug_framework.comparison import compare
    from debug_framework.services.validation_engine import ValidationEngine, ValidationResult

    assert debug_framework.ValidationEngine is ValidationEngine
    assert debug_framework.ValidationResult is ValidationResult
    assert debug_framework.compare is compare
    assert debug_framework.register_backend is register_backend


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'ValidationEngin'"):
        debug_framework.ValidationEngin  # noqa: B018


def test_import_is_light():
    code = ("import sys, debug_framework; heavy = [m for m in ('torch', 'numba', 'numpy', "
            "'debug_framework.services.validation_engine', 'debug_framework.comparison', 'debug_framework.storage.database', 'debug_framework.reports') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_compare_through_the_package():
    import numpy as np

    a = np.linspace(0, 1, 64, dtype=np.float32)
    res = debug_framework.compare(a, a + 1e-7, rtol=1e-4, atol=1e-5)
    assert res.passed and res.numel == 64
