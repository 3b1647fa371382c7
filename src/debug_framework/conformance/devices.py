"""The device a conformance sweep runs its samples on (``--device``): checked before any worker starts.

    check_device("cuda")      # "cuda:0" where a CUDA device exists; BackendInitializationError (DF002) where not

A device type is present when its torch module (``torch.cuda``, ``torch.xpu``, ``torch.mps``, or a
registered out-of-tree backend's module) says it is available and has the index asked for. The
samples are then made on that device (OpInfo's ``sample_inputs(device, dtype)``), eager and
float64 eager run there, and the ``torch.compile`` backend compiles for it.
"""

from __future__ import annotations

import torch

from ..errors import BackendInitializationError, ConfigurationError

__all__ = ["check_device"]


def _module(kind: str) -> object | None:
    """The torch module of device type ``kind`` (``torch.cuda``...), None when torch has none."""
    if kind == "privateuseone":
        kind = torch._C._get_privateuse1_backend_name()
    return getattr(torch, kind, None)


def check_device(device: str) -> str:
    """The device's canonical name (``cpu``, ``cuda:0``); raises where it does not exist here.

    Raises:
        ConfigurationError (DF005): ``device`` is not a torch device name.
        BackendInitializationError (DF002): no such device on this machine, or a device that holds
            no data (``meta``).
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"{device!r} is not a torch device ({exc})", option="--device",
                                 hint="use cpu, cuda, cuda:1, xpu, mps ...") from exc
    if parsed.type == "cpu":
        return "cpu"
    if parsed.type == "meta":
        raise BackendInitializationError("the meta device holds no values: nothing can be judged on it",
                                         hint="use --device cpu or an accelerator")
    module = _module(parsed.type)
    available = getattr(module, "is_available", None)
    count = getattr(module, "device_count", None)
    if available is None or not available():
        raise BackendInitializationError(f"no {parsed.type} device here (torch {torch.__version__} sees none)",
                                         hint="run the sweep where the device exists, or use --device cpu")
    index = parsed.index if parsed.index is not None else 0
    total = int(count()) if count is not None else 1
    if index >= total:
        raise BackendInitializationError(f"no device {parsed.type}:{index} here ({total} {parsed.type} device(s))",
                                         hint=f"use an index below {total}")
    return f"{parsed.type}:{index}"
