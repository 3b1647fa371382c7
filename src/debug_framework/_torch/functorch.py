"""Private-API module for ``torch._functorch`` (AOTAutograd), ``torch._decomp`` and fake tensors.

Nothing else in the project (``debug_framework`` or ``debug_module``) imports those packages; it calls the functions here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from . import CompiledFn, Decompositions, GraphInput, check_torch_version

check_torch_version()

import torch._decomp as _decomp  # noqa: E402
import torch._functorch.aot_autograd as _aot  # noqa: E402
import torch._functorch.config as _functorch_config  # noqa: E402
from torch._functorch.partitioners import (  # noqa: E402
    default_partition,
    min_cut_rematerialization_partition,
)
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402

__all__ = [
    "aot_compile",
    "make_boxed_func",
    "core_aten_decompositions",
    "is_fake_tensor",
    "count_aot_graph_captures",
    "AotCaptureCounter",
    "outside_compile_modes",
    "fx_minifier",
    "aot_accuracy_fails",
    "as_traced",
]

make_boxed_func = _aot.make_boxed_func

_PARTITIONERS = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}


def core_aten_decompositions() -> Decompositions:
    """PyTorch's core-ATen decomposition table (what an accelerator lowering usually starts from)."""
    return dict(_decomp.core_aten_decompositions())


def is_fake_tensor(value: object) -> bool:
    return isinstance(value, FakeTensor)


def aot_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[GraphInput],
    *,
    fw_compiler: Callable[..., CompiledFn],
    bw_compiler: Callable[..., CompiledFn] | None = None,
    inference_compiler: Callable[..., CompiledFn] | None = None,
    decompositions: Decompositions | None = None,
    partition: str | Callable[..., object] = "min_cut",
) -> CompiledFn:
    """Run AOTAutograd once on a Dynamo graph.

    The compilers receive ATen-level graphs (forward, backward, or inference) whose nodes carry
    FakeTensor metadata in ``node.meta["val"]`` and must return boxed callables. The backward graph
    is lowered eagerly (not at the first ``.backward()``) so that everything about one graph is
    captured inside the caller's context; the AOTAutograd cache is off so the graphs are really
    traced here.
    """
    with _functorch_config.patch(
        force_non_lazy_backward_lowering=True,
        enable_autograd_cache=False,
    ):
        return _aot.aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler or fw_compiler,
            inference_compiler=inference_compiler,
            partition_fn=_PARTITIONERS[partition] if isinstance(partition, str) else partition,
            decompositions=decompositions,
        )


class AotCaptureCounter:
    """How many times AOTAutograd traced a graph (stage-1 graph capture) inside the context."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.contextmanager
def count_aot_graph_captures() -> Iterator[AotCaptureCounter]:
    """Count real AOTAutograd graph captures by wrapping torch's own stage-1 capture function.

    Independent of this package's bookkeeping: it counts calls into torch itself, so a test can
    check that AOTAutograd ran exactly once per Dynamo graph.
    """
    counter = AotCaptureCounter()
    original = _aot.aot_stage1_graph_capture

    def counting(*args: object, **kwargs: object) -> object:
        counter.count += 1
        return original(*args, **kwargs)

    _aot.aot_stage1_graph_capture = counting
    try:
        yield counter
    finally:
        _aot.aot_stage1_graph_capture = original


@contextlib.contextmanager
def outside_compile_modes() -> Iterator[None]:
    """Leave the fake-tensor and other dispatch modes a backend runs under, so real tensors can be
    computed (the minifier's strict-mode writer runs real graphs inside a compiler callback)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    with unset_fake_temporarily(), _disable_current_modes():
        yield


def fx_minifier(gm: torch.fx.GraphModule, inputs: Sequence[GraphInput],
                module_fails: Callable[[torch.fx.GraphModule, Sequence[GraphInput]], bool],
                ) -> tuple[torch.fx.GraphModule, Sequence[GraphInput]]:
    """PyTorch's own graph minifier (``torch._functorch.fx_minifier.minifier``), without its state dumps;
    used as the comparison anchor of benchmarks/bench_minifier.py."""
    from torch._functorch.fx_minifier import minifier

    return minifier(gm, list(inputs), module_fails, dump_state=lambda *a, **k: None)


def aot_accuracy_fails(gm: torch.fx.GraphModule, inputs: Sequence[GraphInput],
                       compiler_fn: Callable[..., CompiledFn]) -> bool:
    """PyTorch's accuracy oracle of ``TORCHDYNAMO_REPRO_AFTER=aot`` at ``TORCHDYNAMO_REPRO_LEVEL=4``
    (``torch._dynamo.repro.after_aot.backend_aot_accuracy_fails``: the compiled graph against eager,
    with a float64 run as the judge), with the FX graph cache and AOTAutograd's cache off; the anchor
    oracle of benchmarks/bench_minifier.py."""
    from torch._dynamo.repro.after_aot import backend_aot_accuracy_fails

    from .inductor import compile_caches_off

    with compile_caches_off():
        return bool(backend_aot_accuracy_fails(gm, list(inputs), compiler_fn))


@contextlib.contextmanager
def as_traced() -> Iterator[None]:
    """Operators called eagerly inside run as tracing runs them, by PyTorch's decompositions: the
    Python dispatcher swaps in the Python decompositions of composite operators, and a pass-through
    dispatch mode makes C++ composite kernels take the path they take for traced tensors
    (``linalg.eigvals`` through ``linalg.eig``)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.utils._python_dispatch import TorchDispatchMode

    class _PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...],
                               args: tuple[object, ...] = (), kwargs: dict[str, object] | None = None) -> object:
            return func(*args, **(kwargs or {}))

    with enable_python_dispatcher(), _PassThrough():
        yield
