"""``float64_eager``: the generic tier's reference, the model's own eager ``transformers`` code run
in float64 on the CPU (as PyTorch's ``torch._dynamo.utils.same`` judges a model against a float64
run of itself).

It is the default reference of every model without a reference written from the math
(``modelio.generic``); at the alternative's precision the same backend is the calibration run
(docs/validation.md, "Calibrated tolerances"), so a correct implementation's rounding at that
precision is each checkpoint's noise. Checkpoints are found from the module structure
(:mod:`debug_framework.capture.structure`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .pytorch import PyTorchBackend
from .reference_choice import FLOAT64_EAGER, FROM_MATH, oracle_for, reference_for

__all__ = ["EagerReferenceBackend", "Float64Softmax", "FLOAT64_EAGER", "FROM_MATH", "reference_for", "oracle_for"]



_SOFTMAX = (torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax)


class Float64Softmax(TorchFunctionMode):
    """Softmax of float64 scores kept in float64 where the model's code asks for float32
    (``softmax(scores, dtype=torch.float32)``, as ``transformers``' eager attention does): a float64
    reference whose attention probabilities were float32 would be no float64 reference, and a
    fully masked row (a left-padded position: every score the float64 minimum, -inf in float32)
    would be NaN and poison every token that reads its values."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _SOFTMAX and kwargs.get("dtype") is torch.float32 and args and \
                getattr(args[0], "dtype", None) is torch.float64:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


class EagerReferenceBackend(PyTorchBackend):
    """The model's own eager code on the CPU: float64 by default (the reference); float32, float16
    or bfloat16 as the calibration run at the alternative's precision. In float64 every softmax is
    float64 (:class:`Float64Softmax`)."""

    default_dtype = "float64"

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.name = FLOAT64_EAGER

    @contextlib.contextmanager
    def _exact(self) -> Iterator[None]:
        with Float64Softmax() if self.dtype == "float64" else contextlib.nullcontext():
            yield

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with self._exact():
            return super().run(*args, **kwargs)

    def run_layer(self, *args: Any, **kwargs: Any) -> Any:
        with self._exact():
            return super().run_layer(*args, **kwargs)

    def run_block(self, *args: Any, **kwargs: Any) -> Any:
        with self._exact():
            return super().run_block(*args, **kwargs)

    def run_decode(self, *args: Any, **kwargs: Any) -> Any:
        with self._exact():
            return super().run_decode(*args, **kwargs)

    def run_decode_layer(self, *args: Any, **kwargs: Any) -> Any:
        with self._exact():
            return super().run_decode_layer(*args, **kwargs)

    def version_info(self) -> dict[str, Any]:
        return {**super().version_info(), "reference": "the model's own transformers eager code"}
