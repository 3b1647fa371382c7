"""Where a captured operator came from, in the model's terms: its ``nn.Module`` path and source line.

Strategies capture a layer through a wrapper module whose attribute ``layer`` is the layer, so the
paths their tracers record start with ``layer``; :func:`module_path_in_model` puts the layer's own
name (``encoder.layer.1``) in its place. :func:`source_line` reads the innermost frame of a
recorded stack trace (FX ``node.meta["stack_trace"]``, ONNX ``pkg.torch.onnx.stack_trace``).
"""

from __future__ import annotations

import re
from pathlib import PurePath

__all__ = ["WRAPPER_ATTRIBUTE", "module_path_in_model", "source_line"]

#: The attribute under which drill-down wrappers hold the layer being drilled.
WRAPPER_ATTRIBUTE = "layer"

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def module_path_in_model(scope: str, layer_name: str) -> str:
    """``scope`` (a module path under the wrapper, e.g. ``layer.intermediate``) as the model's
    module path (``encoder.layer.1.intermediate``); other scopes are returned unchanged."""
    if scope == WRAPPER_ATTRIBUTE or scope.startswith(WRAPPER_ATTRIBUTE + "."):
        return layer_name + scope[len(WRAPPER_ATTRIBUTE):]
    return scope


def source_line(stack_trace: str | None) -> str:
    """``"file.py:123"`` of the innermost frame of ``stack_trace``; ``""`` when it has none."""
    frames = _FRAME.findall(stack_trace or "")
    return f"{PurePath(frames[-1][0]).name}:{frames[-1][1]}" if frames else ""

