"""Checkpoints: keys, selections, captures, and hook-based capture for torch modules.

The hook-based names (:mod:`.hooks`, which needs torch) are imported on first use, so a run that
never captures a torch module (an ONNX file) does not import torch."""

from .keys import CHECKPOINT_NAMES, Capture, CheckpointKey, CheckpointSelection, all_checkpoints

__all__ = [
    "CHECKPOINT_NAMES",
    "CheckpointKey",
    "CheckpointSelection",
    "Capture",
    "all_checkpoints",
    "ModuleTap",
    "HookCapture",
    "hf_module_taps",
    "hf_layer_modules",
    "find_module",
]

_HOOKS = ("HookCapture", "ModuleTap", "find_module", "hf_layer_modules", "hf_module_taps")


def __getattr__(name: str) -> object:
    """The torch-based names of :mod:`.hooks`, imported when first asked for."""
    if name in _HOOKS:
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
