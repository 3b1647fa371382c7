"""Checkpoints: keys, selections, captures, and hook-based capture for torch modules."""

from .hooks import HookCapture, ModuleTap, find_module, hf_layer_modules, hf_module_taps
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
