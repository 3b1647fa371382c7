"""``inductor``: the Hugging Face model under ``torch.compile(backend="inductor")``.

What runs is Inductor's generated code (C++/OpenMP kernels on CPU, Triton on CUDA). Checkpoints
are extra outputs of the one compiled graph (``_graph_capture.CheckpointOutputs``): Dynamo inlines
the capture hooks and ``fullgraph=True`` makes a graph break an error instead of a silent split.
Only public APIs compile (``torch.compile``, ``torch.compiler.reset``); the optional cache
directory goes through ``debug_framework._torch.inductor``. See ``docs/backends-more.md``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..capture.hooks import find_module, first_tensor, hf_layer_modules, hf_mlp_block
from ..capture.keys import Capture, CheckpointKey
from ..errors import BackendInitializationError
from ..measure import Timer
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from ._graph_capture import (
    CheckpointOutputs,
    CompiledPassCapture,
    DecodeOutputs,
    PlainOutput,
    graph_inputs,
    layer_inputs_from,
    replay_arguments,
)
from ._user_function import is_function_spec, load_user_function
from .base import BaseBackend, HiddenState, Taps, Tensor, attention_block_or_mlp_checked
from .decode import DecodeRun, module_decode
from .pytorch import build_hf_model
from .torch_module import TORCH_DTYPES, torch_device_info

if TYPE_CHECKING:
    import numpy as np

    from ..jsonio import JsonObject

__all__ = ["InductorBackend"]

_CXX = ("g++", "c++", "clang++")


class InductorBackend(BaseBackend):
    """``torch.compile`` with Inductor; float32 (default), bfloat16, float16; cpu or cuda.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (``prepare(device=...)`` overrides).
        cache_dir: Inductor's cache directory for this backend's compiles; ``None`` keeps
            PyTorch's own (``TORCHINDUCTOR_CACHE_DIR`` or ``<tmp>/torchinductor_<user>``).
        mode: ``torch.compile`` mode (``None``, ``"max-autotune-no-cudagraphs"`` ...).
        fullgraph: refuse graph breaks (default True: a break raises instead of splitting the model).
        compiler: the ``torch.compile`` backend: ``"inductor"`` (default), or a module-level
            function ``(gm, example_inputs) -> callable`` that compiles with Inductor its own way
            (custom passes, config), given as the function or as ``"package.module:function"`` /
            ``"path/file.py:function"`` (a session's ``alternative_options``); the drill-down's
            minifier hands its repros the same compiler.
    """

    runs_onnx_files = False
    name = "inductor"
    supported_dtypes = ("float32", "bfloat16", "float16")

    def __init__(self, device: str = "cpu", cache_dir: str | Path | None = None, mode: str | None = None,
                 fullgraph: bool = True, compiler: str | Callable[..., Any] = "inductor") -> None:
        super().__init__()
        self.device = device
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.mode = mode
        self.fullgraph = fullgraph
        self.compiler = compiler
        self.net: torch.nn.Module | None = None
        self._wrapper: CheckpointOutputs | None = None
        self._captured: Any = None
        self._plain: Any = None
        self._decode: Any = None
        self._seen: set[tuple[str, tuple[Any, ...]]] = set()
        self._layer_fns: dict[int, Any] = {}
        self._mlp_fns: dict[int, Any] = {}
        #: One entry per first call of a variant on a new input signature: that call compiled.
        self.compile_log: list[JsonObject] = []

    def availability(self) -> tuple[bool, str]:
        if "inductor" not in torch.compiler.list_backends():
            return False, f"torch {torch.__version__} has no inductor backend"
        if self.device.startswith("cuda"):
            if not torch.cuda.is_available():
                return False, f"device {self.device!r} requested but CUDA is not available (torch {torch.__version__})"
            import importlib.util

            if importlib.util.find_spec("triton") is None:
                return False, "Inductor on CUDA needs triton, which is not installed"
            return True, ""
        if not any(shutil.which(c) for c in _CXX):
            return False, f"Inductor on CPU needs a C++ compiler; none of {', '.join(_CXX)} is on PATH"
        return True, ""

    def version_info(self) -> JsonObject:
        from .._torch import inductor as _inductor_private

        info = {**super().version_info(), **torch_device_info(self.device)}
        try:
            cache = self.cache_dir or _inductor_private.cache_dir()
        except BackendInitializationError as exc:
            cache = f"unknown: {exc.message}"
        cxx = next((shutil.which(c) for c in _CXX if shutil.which(c)), None)
        return {**info, "compiler": self.compiler if isinstance(self.compiler, str) else
                f"{getattr(self.compiler, '__module__', '?')}:{getattr(self.compiler, '__qualname__', self.compiler)}", "mode": self.mode, "cache_dir": cache, "cxx": cxx,
                "compile_log": list(self.compile_log)}

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Build the model and the compiled callables; compilation itself happens on the first run
        of each input signature (Dynamo needs real inputs) and is recorded in ``compile_log``."""
        if device is not None:
            self.device = device
        dtype = self._check_prepare(model, dtype, self.device)
        if is_function_spec(self.compiler):
            self.compiler = load_user_function(self.compiler, self.name, "compiler")
        self.net = build_hf_model(model, TORCH_DTYPES[dtype], self.device)
        self._wrapper = CheckpointOutputs.for_model(self.net, model)
        self._captured = self._compile(self._wrapper)
        self._plain = None
        self._decode = None
        self._seen.clear()
        self._layer_fns.clear()
        self._mlp_fns.clear()
        self.compile_log.clear()

    def _compile(self, module: torch.nn.Module) -> Any:
        return torch.compile(module, backend=self.compiler, fullgraph=self.fullgraph, mode=self.mode)

    def _call(self, variant: str, inputs: ModelInputs) -> tuple[Any, float, bool]:
        model = self._prepared()
        if variant == "plain" and self._plain is None:
            self._plain = self._compile(PlainOutput(self.net))
        fn = self._captured if variant == "captured" else self._plain
        arrays = graph_inputs(model, inputs)
        kwargs = {k: torch.from_numpy(v).to(self.device) for k, v in arrays.items()}
        signature = (variant, tuple((k, tuple(v.shape)) for k, v in arrays.items()))
        first = signature not in self._seen
        with torch.inference_mode(), Timer(self.device) as timer:
            if first:
                from .._torch import inductor as _inductor_private

                with _inductor_private.using_cache_dir(self.cache_dir):
                    out = fn(**kwargs)
            else:
                out = fn(**kwargs)
        elapsed = timer.seconds
        if first:
            self._seen.add(signature)
            self.compile_log.append({"variant": variant, "shape": list(inputs.shape), "first_call_s": round(elapsed, 4)})
        if self.mode and "reduce-overhead" in self.mode:  # CUDA graphs reuse output buffers
            out = tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
        return out, elapsed, first

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        """Run the compiled model. ``taps=[]`` runs the model compiled without checkpoint outputs."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        if not keys and not capture_layer_inputs:
            _, elapsed, first = self._call("plain", inputs)
            return Capture(backend=self.name, dtype=self.dtype, elapsed_s=elapsed,
                           meta={"variant": "plain", "compiled_in_this_call": first})
        out, elapsed, first = self._call("captured", inputs)
        everything = dict(zip(self._wrapper.keys, out))
        meta = {"variant": "captured", "compiled_in_this_call": first}
        if first:
            meta["first_call_s"] = elapsed  # compilation + one run
        return Capture(
            tensors={k: everything[k] for k in keys},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=elapsed,
            layer_inputs=layer_inputs_from(everything, self._prepared().num_layers) if capture_layer_inputs else {},
            meta=meta,
        )

    def can_decode(self) -> tuple[bool, str]:
        """A causal LM decodes through its own cache, compiled; an encoder (BERT) does not."""
        if self._prepared().architecture == "bert":
            return False, "runs an encoder (BERT): it has no causal decode"
        return True, ""

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill, then ``steps`` tokens decoded through the model's own cache, each pass
        Inductor's code (:class:`~._graph_capture.DecodeOutputs` compiled as the model is, the cache
        an input; shapes turn dynamic after the first steps: about three compiles), its checkpoints
        graph outputs: ``backends.decode.module_decode`` drives it."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        if self._decode is None:
            self._decode = torch.compile(DecodeOutputs(self._wrapper), backend=self.compiler, mode=self.mode,
                                         fullgraph=self.fullgraph)
        wrapper, fn = self._wrapper, self._decode

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: tensors[k] for k in keys if k in tensors}, backend=self.name,
                           dtype=self.dtype, elapsed_s=seconds, meta={"variant": "decode"})

        from .._torch import inductor as _inductor_private

        with _inductor_private.using_cache_dir(self.cache_dir):
            return module_decode(self.name, self.net, inputs.torch(self.device), lambda: CompiledPassCapture(fn, wrapper.keys),
                                 inputs, steps, tokens, self.dtype, wrap)

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Replay layer ``i`` as Inductor compiles it, on ``hidden_in`` (isolation).

        The layer's other inputs (attention mask, rotary position embeddings...) are what the model
        passes it for ``inputs``: an eager forward (no KV cache) is run up to layer ``i`` and stopped there. The
        layer module is then compiled on its own (once per layer, on the first replay; layers of
        the same shape reuse Inductor's cached graph) and called with ``hidden_in`` in place of its
        hidden state. ``post_attention:i`` and ``post_mlp:i`` come out of that one compiled graph,
        through the same checkpoint hooks as :meth:`run`.
        """
        model = self._prepared()
        layer_name, layer, args, kwargs = self.layer_call(i, hidden_in, inputs)
        first = i not in self._layer_fns
        if first:
            self._layer_fns[i] = self._compile(layer)
        from .._torch import dynamo as _dynamo_private
        from .._torch import inductor as _inductor_private

        sink = self._wrapper._sink  # left empty by replay_arguments
        try:
            with torch.inference_mode(), _dynamo_private.recompile_limit(2 * model.num_layers + 8), \
                    _inductor_private.using_cache_dir(self.cache_dir), Timer(self.device) as timer:
                out = self._layer_fns[i](*args, **kwargs)
            elapsed = timer.seconds
            emitted = dict(zip(self._wrapper.keys_within(layer_name), sink, strict=True))
        finally:
            sink.clear()
        if first:
            self.compile_log.append({"variant": f"layer {i}", "shape": list(inputs.shape), "first_call_s": round(elapsed, 4)})
        k_attn, k_mlp = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
        tensors = {k_mlp: first_tensor(out)}
        if k_attn in emitted:
            tensors[k_attn] = emitted[k_attn]
        return Capture(tensors=tensors, backend=self.name, dtype=self.dtype, elapsed_s=elapsed,
                       meta={"variant": f"layer {i}", "compiled_in_this_call": first})

    def can_run_block(self) -> tuple[bool, str]:
        """The MLP block compiles alone for the from-math families' Hugging Face layout; a
        generic-tier model's MLP is judged with the whole layer."""
        model = self._prepared()
        if model.architecture == "generic":
            return False, "compiles a generic-tier layer whole (its MLP is judged with the whole layer)"
        return True, ""

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` as Inductor compiles it, on that block's own input.

        ``"mlp"``: the layer's MLP block alone (:func:`~debug_framework.capture.hooks.hf_mlp_block`:
        the layer's own submodules, residual add as the layer writes it) compiled on its own (once
        per layer, on the first call, with this backend's compiler, mode and cache directory) and
        called on the post-attention state ``hidden_in`` (cast to this backend's dtype and device);
        the capture holds ``post_mlp:i``. ``inputs`` is not read: the MLP block sees no mask or
        position. ``"attention"``: :meth:`run_layer` on the layer's input, its ``post_attention:i``.
        """
        attention = attention_block_or_mlp_checked(self, i, hidden_in, inputs, block)
        if attention is not None:
            return attention
        model = self._prepared()
        first = i not in self._mlp_fns
        if first:
            layer = find_module(self.net, hf_layer_modules(model.architecture, model.num_layers)[i])
            self._mlp_fns[i] = self._compile(hf_mlp_block(model.architecture, layer))
        hidden = torch.as_tensor(hidden_in).to(self.device, TORCH_DTYPES[self.dtype])
        from .._torch import dynamo as _dynamo_private
        from .._torch import inductor as _inductor_private

        try:  # Llama's post_attention_layernorm carries the post_attention checkpoint hook: it fires into the sink
            with torch.inference_mode(), _dynamo_private.recompile_limit(2 * model.num_layers + 8), \
                    _inductor_private.using_cache_dir(self.cache_dir), Timer(self.device) as timer:
                out = self._mlp_fns[i](hidden)
        finally:
            self._wrapper._sink.clear()
        elapsed = timer.seconds
        if self.mode and "reduce-overhead" in self.mode:  # CUDA graphs reuse output buffers
            out = out.clone()
        variant = f"mlp block {i}"
        if first:
            self.compile_log.append({"variant": variant, "shape": list(inputs.shape), "first_call_s": round(elapsed, 4)})
        return Capture(tensors={CheckpointKey("post_mlp", i): out}, backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed, meta={"variant": variant, "compiled_in_this_call": first})

    def layer_call(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> tuple[str, torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
        """Layer ``i``'s module name, the (eager) module and the arguments the model passes it for
        ``inputs``, with ``hidden_in`` (cast to this backend's dtype and device) as its hidden state
        (an eager forward stopped as the layer is entered; no KV cache)."""
        model = self._prepared()
        hidden = torch.as_tensor(hidden_in).to(self.device, TORCH_DTYPES[self.dtype])
        return replay_arguments(self.net, model, i, inputs, hidden, self._wrapper._sink, self.device, self.name)

    def measure_compile(self, inputs: ModelInputs, cache_dir: str | Path | None = None) -> dict[str, float]:
        """Time a cold and a warm compile of the capturing graph for ``inputs``' shape.

        cold: into an empty Inductor cache (``cache_dir``, default a fresh temporary directory,
        removed afterwards unless given); warm: ``torch.compiler.reset()`` (which drops every
        Dynamo-compiled artefact of this process) and the same compile again, now served by the
        on-disk FX graph cache. Leaves the backend compiled for that shape.
        """
        self._prepared()
        own = cache_dir is None
        directory = tempfile.mkdtemp(prefix="df-inductor-cache-") if own else str(cache_dir)
        saved = self.cache_dir
        self.cache_dir = directory
        try:
            timings = {}
            for phase in ("cold_s", "warm_s"):
                torch.compiler.reset()
                self._captured = self._compile(self._wrapper)
                self._plain = None
                self._seen.clear()
                _, elapsed, _ = self._call("captured", inputs)
                timings[phase] = elapsed
        finally:
            self.cache_dir = saved
            if own:
                shutil.rmtree(directory, ignore_errors=True)
        self.compile_log.append({"measure_compile": {k: round(v, 4) for k, v in timings.items()}, "shape": list(inputs.shape)})
        return timings

