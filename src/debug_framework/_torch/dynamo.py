"""Private-API module for ``torch._dynamo``: hooked optimize, guard text, graph-break reasons, reset,
the recompile limit.

Nothing else in the project (``debug_framework`` or ``debug_module``) imports ``torch._dynamo``.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from . import CompiledFn, check_torch_version

check_torch_version()

import torch._dynamo as _dynamo  # noqa: E402
from torch._dynamo.types import GuardFail  # noqa: E402
from torch._guards import Guard  # noqa: E402

__all__ = [
    "optimize_with_hooks",
    "reset",
    "graph_break_reason",
    "guard_lines",
    "guard_fail_parts",
    "inner_exception",
    "lookup_backend",
    "recompile_limit",
    "failure_kind",
]


def reset() -> None:
    """Forget every compiled frame and guard (process-wide)."""
    _dynamo.reset()


def _frame_guard_expressions() -> tuple[str, list[str]] | None:
    """Called from inside Dynamo's ``guard_export_fn`` hook: the compiled frame's code name and its
    guard expressions, read from the guard manager Dynamo just built (the caller's local
    ``check_fn``). ``None`` if this torch lays its frames out differently."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        check_fn = frame.f_locals.get("check_fn")
        code = frame.f_locals.get("code")
        if check_fn is not None and hasattr(check_fn, "guard_manager"):
            root = getattr(check_fn.guard_manager, "root", None)
            if root is None:
                return None
            lines: list[str] = []

            def add(leaves: Iterable[Any]) -> None:
                for leaf in leaves:  # (pybind wrappers are transient: dedupe by text, not id)
                    for part in leaf.verbose_code_parts():
                        part = part.split("  #")[0].rstrip()
                        if part not in lines:
                            lines.append(part)

            def visit(mgr: Any) -> None:
                add(mgr.get_leaf_guards())
                if hasattr(mgr, "get_key_value_managers"):  # dict managers (L, G ...)
                    for _, (key_mgr, val_mgr) in sorted(mgr.get_key_value_managers().items()):
                        for sub in (key_mgr, val_mgr):
                            if sub:
                                visit(sub)
                for child in mgr.get_child_managers():
                    visit(child)

            visit(root)
            if hasattr(root, "get_epilogue_lambda_guards"):
                add(root.get_epilogue_lambda_guards())
            return getattr(code, "co_name", "?"), lines
        frame = frame.f_back
    return None


def optimize_with_hooks(
    fn: Callable[..., object],
    backend: Callable[[torch.fx.GraphModule, list[torch.Tensor]], CompiledFn],
    *,
    on_guards: Callable[[str | None, list[str]], None],
    on_guard_fail: Callable[[str, str], None],
    dynamic: bool | None = None,
) -> CompiledFn:
    """``torch.compile`` ``fn`` with ``backend`` and hooks: ``on_guards(code_name, expressions)`` after
    each frame compiles (the guards of its graph, as Python-like expressions);
    ``on_guard_fail(reason, code_name)`` when a cached graph's guards fail (a recompile)."""

    def export(guards: Iterable[Guard]) -> None:
        found = _frame_guard_expressions()
        if found is not None:
            on_guards(*found)
        else:  # fall back to Dynamo's Guard objects
            on_guards(None, [line for g in guards for line in guard_lines(g)])

    def fail(guard_fail: GuardFail) -> None:
        on_guard_fail(str(guard_fail.reason), getattr(guard_fail.orig_code, "co_name", "?"))

    return _dynamo.optimize(backend, guard_export_fn=export, guard_fail_fn=fail, dynamic=dynamic)(fn)


def graph_break_reason(gm: torch.fx.GraphModule) -> tuple[str, list[traceback.FrameSummary]] | None:
    """Why Dynamo ended this graph, if it was a graph break: (reason, user stack)."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    return str(reason.reason), list(reason.user_stack or [])


def guard_lines(guard: Guard) -> list[str]:
    """Readable expressions of one Dynamo guard (its generated code parts, else its description)."""
    parts = [str(p) for p in (getattr(guard, "code_list", None) or [])]
    if parts:
        return parts
    name = getattr(guard, "name", "?")
    create_fn = getattr(guard, "create_fn", None)
    create = getattr(getattr(create_fn, "func", create_fn), "__name__", None) or "guard"
    return [f"{create}({name})"]


def guard_fail_parts(reason: str) -> list[str]:
    return [line.strip() for line in reason.splitlines() if line.strip()]


def inner_exception(exc: BaseException) -> BaseException:
    """The backend's own exception inside Dynamo's ``BackendCompilerFailed`` wrapper."""
    inner = getattr(exc, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else exc


def lookup_backend(name: str) -> Callable[[torch.fx.GraphModule, list[torch.Tensor]], CompiledFn]:
    """The compiler function behind a registered ``torch.compile`` backend name (``"inductor"``,
    ``"aot_eager"``, an entry-point backend ...), so callers can wrap it (e.g. to time compilation)."""
    return _dynamo.lookup_backend(name)


@contextlib.contextmanager
def recompile_limit(at_least: int) -> Iterator[None]:
    """Let one code object be compiled for ``at_least`` guard sets (e.g. one per layer of a model,
    each layer module compiled on its own), and raise instead of silently running eagerly when
    that is exceeded."""
    cfg = _dynamo.config
    limit = max(int(cfg.recompile_limit), int(at_least))
    with cfg.patch(recompile_limit=limit, accumulated_recompile_limit=max(int(cfg.accumulated_recompile_limit), limit),
                   fail_on_recompile_limit_hit=True):
        yield


def failure_kind(exc: BaseException) -> str:
    """Who an exception from a ``torch.compile``'d call comes from: ``"backend"`` (the backend's
    compiler raised: it does not accept the graph), ``"capture"`` (Dynamo itself could not trace or
    fake-run the call) or ``"runtime"`` (the compiled code raised while running)."""
    from torch._dynamo.exc import BackendCompilerFailed, TorchDynamoException, UserError

    if isinstance(exc, BackendCompilerFailed):
        return "backend"
    if isinstance(exc, (TorchDynamoException, UserError)):
        return "capture"
    return "runtime"
