"""The operators a conformance sweep runs: PyTorch's OpInfo database (``op_db``), by key.

An operator's key is its OpInfo name, with the variant after a dot when it has one (``softmax``,
``softmax.with_dtype``, ``nn.functional.gelu``). :func:`select_ops` takes exact keys or shell
patterns (``nn.functional.*``). :func:`static_skip` classifies what is never judged whatever the
backend: outputs that are uninitialised memory (``empty``...), outputs OpInfo declares
nondeterministic, and operators without a floating dtype among those asked for. Random operators are
found by running them (:mod:`.judge`): eager twice, with two seeds.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigurationError
from ..suggest import did_you_mean

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

__all__ = ["op_key", "all_ops", "find_op", "select_ops", "static_skip", "DTYPES"]

#: The dtypes a sweep may ask for, by name.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                                  "float64": torch.float64}


def op_key(info: OpInfo) -> str:
    """``name`` or ``name.variant``: the one spelling of an OpInfo entry in rows, JSON and options."""
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


@cache
def all_ops() -> dict[str, OpInfo]:
    """Every OpInfo entry by key, in ``op_db``'s order."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_key(o): o for o in op_db}


def find_op(key: str) -> OpInfo:
    """The OpInfo entry of ``key``; ConfigurationError (DF005) naming the closest keys."""
    ops = all_ops()
    if key not in ops:
        raise ConfigurationError(f"no OpInfo operator {key!r}{did_you_mean(key, list(ops))}",
                                 hint="list the keys with: debug_opsweep --list-ops", option="--ops")
    return ops[key]


def select_ops(patterns: Sequence[str] | None) -> list[str]:
    """The keys ``patterns`` name (exact keys or shell patterns), in ``op_db``'s order; every key when
    ``patterns`` is empty. ConfigurationError (DF005) for a pattern that matches nothing."""
    keys = list(all_ops())
    if not patterns:
        return keys
    chosen: set[str] = set()
    for p in patterns:
        hits = [k for k in keys if k == p] or [k for k in keys if fnmatch.fnmatchcase(k, p)]
        if not hits:
            find_op(p)  # raises with the closest names
        chosen.update(hits)
    return [k for k in keys if k in chosen]


def static_skip(info: OpInfo, dtypes: Sequence[str], device: str = "cpu") -> str | None:
    """Why an operator is never judged, whatever the backend (None when it is)."""
    name = info.name.rsplit(".", 1)[-1]
    if name.startswith(("empty", "new_empty")) or name in ("resize_", "resize_as_"):
        return "uninitialised output: its values are whatever memory held"
    code = getattr(info.op, "__code__", None)
    if code is not None and "wrapper_set_seed" in code.co_names:
        return "random output: OpInfo runs it under a fixed seed, and a backend's generator differs from eager's"
    if getattr(info, "has_nondeterministic_output", False):
        return "nondeterministic output (OpInfo says so)"
    supported = info.supported_dtypes(device)
    if not any(DTYPES[d] in supported for d in dtypes):
        return f"no dtype of {', '.join(dtypes)} is supported on {device}"
    return None
