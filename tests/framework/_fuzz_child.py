"""The worker of test_modelio_fuzz: loads each case of a manifest and reports how it ended.

Run as ``python _fuzz_child.py MANIFEST FIRST``; prints ``start <i>`` before case i and
``done <i> <json>`` after it, flushed, so that the test can time every case and restart the worker
past a case that hangs. An outcome is ``df004`` (a ``ModelLoadingError`` naming its file),
``ok`` (a load whose every tensor then reads back with the shape and a float dtype the config
implies), or ``raw`` (anything else: the bug this fuzz test looks for).
"""

from __future__ import annotations

import json
import sys
import traceback


def _check_loaded(model) -> None:
    import numpy as np

    from debug_framework.modelio import expected_tensors

    # a config the reference from the math cannot read loads on the generic tier: transformers' own
    # loader checks its tensors when a backend builds it (modelio.generic)
    expected = {} if model.architecture == "generic" else expected_tensors(model.config)
    for name, shape in expected.items():
        t = model.weights[name]
        assert tuple(t.shape) == shape, (name, t.shape, shape)
        assert t.dtype.is_floating_point, (name, t.dtype)
        assert model.weights.numpy(name, np.float32).shape == shape
    assert len(model.weights.digest) == 64


def run_case(path: str) -> dict:
    from debug_framework.errors import ModelLoadingError
    from debug_framework.modelio import load_model

    try:
        _check_loaded(load_model(path))
    except ModelLoadingError as exc:
        where = exc.context.get("file")
        if exc.code != "DF004" or not where:
            return {"outcome": "raw", "detail": f"DF004 without a file: {exc}"}
        return {"outcome": "df004", "detail": str(exc)[:300]}
    except BaseException as exc:  # noqa: BLE001 - every other ending is what the fuzz test reports
        tb = traceback.format_exception(exc)
        return {"outcome": "raw", "detail": f"{type(exc).__name__}: {str(exc)[:300]} | {''.join(tb[-3:])[:900]}"}
    return {"outcome": "ok", "detail": ""}


def main() -> None:
    manifest, first = sys.argv[1], int(sys.argv[2])
    with open(manifest, encoding="utf-8") as fh:
        cases = json.load(fh)
    for i in range(first, len(cases)):
        print(f"start {i}", flush=True)
        print(f"done {i} {json.dumps(run_case(cases[i]['path']))}", flush=True)


if __name__ == "__main__":
    main()
