"""Private-API module for ``torch._inductor``: the inner compiler, its trace/debug config, decompositions.

Nothing else in the project (``debug_framework`` or ``debug_module``) imports ``torch._inductor``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from . import CompiledFn, Decompositions, GraphInput, check_torch_version

check_torch_version()

import torch._inductor.config as _config  # noqa: E402
from torch._inductor import compile_fx as _compile_fx  # noqa: E402
from torch._inductor.compile_fx import compile_fx_inner  # noqa: E402
from torch._inductor.decomposition import select_decomp_table  # noqa: E402

__all__ = [
    "inductor_decompositions",
    "compile_graph",
    "trace_into",
    "TRACE_FILES",
    "partition_fn",
    "prepare_inference_graph",
    "compile_context",
    "config_flags",
    "clear_caches",
    "compile_caches_off",
]

#: Files Inductor's debug trace writes per compiled graph (in ``<dir>/torchinductor/<graph>.<n>/``).
TRACE_FILES = {
    "ir_pre_fusion.txt": "ir_pre_fusion",
    "ir_post_fusion.txt": "ir_post_fusion",
    "output_code.py": "output_code",
    "fx_graph_readable.py": "fx_graph_readable",
    "fx_graph_runnable.py": "fx_graph_runnable",
    "fx_graph_transformed.py": "fx_graph_transformed",
}


def inductor_decompositions() -> Decompositions:
    """The decomposition table Inductor applies during AOTAutograd."""
    return dict(select_decomp_table())


def partition_fn(gm: torch.fx.GraphModule, joint_inputs: Sequence[GraphInput],
                 **kwargs: object) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Inductor's joint-graph partitioner: its joint-graph passes (e.g. RNG replacement that
    ``compile_fx_inner`` relies on) followed by min-cut rematerialisation into forward/backward."""
    return _compile_fx.partition_fn(gm, joint_inputs, **kwargs)


def prepare_inference_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[GraphInput]) -> torch.fx.GraphModule:
    """Inference graphs skip the partitioner, so run Inductor's joint-graph passes on them here
    (what ``compile_fx``'s inference path does before ``compile_fx_inner``)."""
    device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), None)
    return _compile_fx._recursive_joint_graph_passes(gm, input_device=device)


@contextlib.contextmanager
def compile_context(example_inputs: Sequence[GraphInput]) -> Iterator[None]:
    """The virtualised state Inductor's passes expect (its fake mode), as ``compile_fx`` sets it up."""
    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        from torch._subclasses import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with V.set_fake_mode(fake_mode):
        yield


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[GraphInput],
    *,
    is_backward: bool = False,
    is_inference: bool = False,
) -> CompiledFn:
    """Compile one ATen graph (from AOTAutograd) with Inductor's inner compiler; returns a boxed callable."""
    return compile_fx_inner(gm, list(example_inputs), is_backward=is_backward, is_inference=is_inference)


@contextlib.contextmanager
def trace_into(directory: str | os.PathLike[str], *, svg: bool = False) -> Iterator[Path]:
    """Make Inductor write its debug trace (IR pre/post fusion, output code, FX graphs) under ``directory``.

    Only compilations inside the context write there, and the on-disk FX graph cache is off so a
    graph compiled before cannot be served from cache without its IR being produced. ``directory``
    should be fresh for each run: the caller never reads files it did not cause.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    debug_log = logging.getLogger("torch._inductor.debug")  # its "debug trace: <dir>" warning is ours to report
    previous_level = debug_log.level
    debug_log.setLevel(logging.ERROR)
    with contextlib.ExitStack() as stack:
        stack.callback(debug_log.setLevel, previous_level)
        stack.enter_context(_config.patch(
        {
            "trace.enabled": True,
            "trace.debug_dir": str(directory),
            "trace.ir_pre_fusion": True,
            "trace.ir_post_fusion": True,
            "trace.output_code": True,
            "trace.fx_graph": True,
            "trace.graph_diagram": svg,
            "fx_graph_cache": False,
            "fx_graph_remote_cache": False,
        }
        ))
        yield directory / "torchinductor"


@contextlib.contextmanager
def compile_caches_off() -> Iterator[None]:
    """Inductor's FX graph cache (local and remote) and AOTAutograd's cache off inside the context:
    every compile there is really done, whatever an earlier process left in the on-disk cache."""
    import torch._functorch.config as functorch_config

    flags = {k: False for k in ("fx_graph_cache", "fx_graph_remote_cache") if hasattr(_config, k)}
    with _config.patch(flags), functorch_config.patch(enable_autograd_cache=False):
        yield


def config_flags() -> dict[str, bool | str | int | None]:
    """The Inductor settings that most often change generated code (recorded in repro environments)."""
    names = ("fallback_random", "freezing", "cpp_wrapper", "max_autotune", "size_asserts", "implicit_fallbacks",
             "force_disable_caches", "fx_graph_cache")
    return {n: getattr(_config, n) for n in names if hasattr(_config, n)}


def clear_caches() -> None:
    """Forget Inductor's in-process caches (loaded kernel modules, compiled C++ libraries keyed by source
    hash), so the next compile cannot reuse this process's work. Its on-disk cache is left alone."""
    from torch._inductor.utils import clear_inductor_caches

    clear_inductor_caches()


# --- Inductor's on-disk cache location (used by the ``inductor`` validation backend) ---


def cache_dir() -> str:
    """Where Inductor keeps its on-disk caches now (created if missing)."""
    check_torch_version()
    from torch._inductor.runtime.cache_dir_utils import cache_dir as _cache_dir

    return _cache_dir()


@contextlib.contextmanager
def using_cache_dir(directory: str | None) -> Iterator[None]:
    """Compile into ``directory`` (``None``: leave Inductor's own setting alone).

    Inductor's in-memory code caches are cleared on entry and exit so that nothing compiled for
    another directory is reused; compiled modules already loaded keep working.
    """
    if directory is None:
        yield
        return
    check_torch_version()
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(str(directory)):
        yield
