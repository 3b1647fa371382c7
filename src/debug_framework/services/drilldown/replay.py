"""``replay``: the drill-down of backends that run PyTorch operators eagerly.

Covers the ``pytorch`` backend in any dtype, module backends (``module_backend``, a
``--backend-module``/``--backend-file`` builder), a module backend whose module is wrapped by
``torch.compile`` (its original module is traced: the operators it asks for, run eagerly) and
plugin backends (``plugin:<id>``: stock ATen with the plugin's kernels dispatched in their place).

A compiled module whose dynamo backend is not eager-equivalent (inductor, a custom backend) runs
code replay never sees: the layer is first compiled alone with the same backend and run against its
own eager code on the same input; when they differ beyond the calibrated bound the compiler is
what introduces the error, and the drill-down says so instead of naming an eager operator.

For one layer: the alternative's layer is traced to an ATen graph on the reference's input to it
(cast to the alternative's dtype); a *trusted* graph of the same layer is traced from a correct
implementation of the same architecture (the Hugging Face model with the same weights, run in
float64), so the trusted values carry the reference's semantics, not the alternative's (a
tanh-approximate ``gelu`` in the alternative's own graph would be invisible in a float64 run of
that graph); the graphs are aligned (:mod:`.align`) and every operator judged alone
(:mod:`.judge`). The culprit is the first operator in graph order beyond its bound; a standalone
repro of it is written and run once (:mod:`.repro`).

At a decode step (``request.step`` >= 1) the layer's call is the one the alternative makes at that
step through its own KV cache, whose past is two more graph inputs given the reference's values
(:mod:`.decode_step`), so the cache's update and the decode path's own operators are judged too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .align import align_graphs
from ...comparison import RatioRule, finite_rms
from .judge import JudgedLayer, as_linear, first_tensor, judge_layer, rms_error
from .decode_step import capture_layer_call_at_step, reference_past
from .layer_graph import (LayerCall, LayerGraph, capture_layer_call, node_module_path, node_source, run_graph,
                          trace_layer)
from .repro import write_and_verify
from ...backends.torchao.leaves import is_quantized_call
from ...backends.drilldown.types import Culprit, DrillRequest, LayerDrilldown

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...modelio.loader import LoadedModel

__all__ = ["ReplayStrategy"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ReplayStrategy:
    """Trace the layer's ATen graph and replay each operator alone (see the module's docstring)."""

    name = "replay"
    #: drills a layer at a decode step too (:mod:`.decode_step`)
    decode_steps = True

    def __init__(self) -> None:
        self._skeletons: dict[int, torch.nn.Module] = {}
        #: models loaded whole (not a skeleton with one layer materialised at a time)
        self._loaded: set[int] = set()

    def applies(self, backend: Backend) -> tuple[bool, str]:
        from ...backends.torch_module import TorchModuleBackend

        if not isinstance(backend, TorchModuleBackend):
            return False, f"{getattr(backend, 'name', backend)!r} does not run a torch nn.Module eagerly"
        if backend.module is None:
            return False, "the backend is not prepared"
        if _eager_module(backend.module) is None:
            return False, "its module is compiled and has no original module to run eagerly"
        return True, ""

    # -- the layer ------------------------------------------------------------------------------

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        backend = request.backend
        module = _eager_module(backend.module)
        assert module is not None  # applies() said so
        layer_name = backend.layer_modules[request.layer]
        dtype = _DTYPES[backend.dtype]
        device = backend.device
        result = LayerDrilldown(layer=request.layer, checkpoint=request.checkpoint, backend=backend.name,
                                method=self.name, step=request.step)
        kernels = _kernel_context(backend)
        hidden64 = torch.as_tensor(request.hidden_in, dtype=torch.float64)
        with kernels():
            alt_call = self._layer_call(module, layer_name, request)
        notes: list[str] = []
        past: tuple[torch.Tensor, torch.Tensor] | None = None
        if request.step:
            if alt_call.cache is None:
                result.note = (f"layer {request.layer}'s call at decode step {request.step} passes no KV cache laid "
                               "out as transformers lays it (cache.layers[i].keys/values): its past cannot be given "
                               "as the reference's, so the step is not drilled")
                return result
            past, why_past = reference_past(request.past, alt_call.cache)
            if past is None:
                notes.append(f"no past of the reference to trust ({why_past}): the layer is given the alternative's "
                             "own cache, so an error that comes in with it is not seen as carried in")
        alt = trace_layer(module, layer_name, alt_call, hidden64.to(device=device, dtype=dtype))
        compiler, compiler_bug = _compiler_differs(backend.module, module, alt, alt_call, request)
        trusted, why = self._trusted_graph(request.model, layer_name, alt_call, hidden64, past)
        if trusted is None:
            notes.append(f"no correct implementation of the layer to trust ({why}): the alternative's own graph "
                         "run in float64 is the trusted run, so an operator computing the wrong function (not "
                         "merely imprecisely) cannot be seen")
            trusted = alt
        trusted_inputs = _trusted_inputs(trusted, alt, dtype)
        trusted_inputs["hidden"] = hidden64  # the reference's input to the layer, whichever graph is trusted
        if past is not None:  # and the reference's past, at a decode step
            trusted_inputs["past.keys"], trusted_inputs["past.values"] = past
        judged = judge_layer(alt, trusted, align_graphs(alt.gm.graph, trusted.gm.graph), trusted_inputs,
                             kernels=kernels, dtype=dtype, margin=request.noise_margin, floor_eps=request.floor_eps,
                             quantization=request.quantization)
        result.operators = judged.rows
        result.graph_file = str(_write_graph(alt, request.out_dir))
        if compiler_bug:  # an eager operator named here would send the user the wrong way
            eager = [f"{r.op} ({r.node})" for r in judged.rows if r.introduces]
            notes.insert(0, compiler + ("; in the eager code, beyond their bounds too: " + ", ".join(eager[:4])
                                        if eager else ""))
        else:
            result.culprit, culprit_notes = self._culprit(judged, alt, backend, request.out_dir)
            notes.extend(culprit_notes)
            if compiler:
                notes.append(compiler)
        notes.extend(judged.notes)
        notes.extend(_weight_notes(alt, trusted_inputs))
        notes.extend(_past_notes(alt, trusted_inputs, request))
        if result.culprit is None and not compiler_bug:
            notes.insert(0, "no operator introduces error beyond its bound on the reference's input"
                            + (f" at decode step {request.step} (and its past)" if request.step else "")
                            + ": the layer's error is carried in, or comes from how operators combine (see the "
                            "carried-in column)")
        result.note = "; ".join(notes)
        return result

    def _culprit(self, judged: JudgedLayer, alt: LayerGraph, backend: Backend, out_dir: Path
                 ) -> tuple[Culprit | None, list[str]]:
        """The first operator beyond its bound and its repro, with what the note must say about it
        (an operator only the alternative has; a repro that could not be written: the table stays)."""
        row = next((r for r in judged.rows if r.introduces), None)
        if row is None:
            return None, []
        node = next(n for n in alt.gm.graph.nodes if n.name == row.node)
        notes = []
        if row.node in judged.extra_ops:
            notes.append(f"the culprit {row.op} ({row.node}) is an operator only the alternative has: its output is "
                         f"not the value the reference feeds to {judged.extra_ops[row.node]}")
        what = f"{row.op} at {row.module_path or '?'} ({row.source or '?'})"
        try:
            repro_dir: str | None
            replay = judged.replays[row.node]
            if is_quantized_call(node):  # torchao's own linear on the quantized weight, as the user runs it
                replay = as_linear(replay)
            path, verified = write_and_verify(out_dir / "repro", replay, backend, what=what)
            repro_dir = str(path)
        except Exception as exc:  # noqa: BLE001 - the table is computed: a repro that fails to write loses nothing else
            repro_dir, verified = None, False
            notes.append(f"the culprit's repro could not be written: {type(exc).__name__}: {exc}")
        culprit = Culprit(op=row.op, node=row.node, module_path=node_module_path(node), source=node_source(node),
                          repro_dir=repro_dir, verified=verified)
        return culprit, notes

    @staticmethod
    def _layer_call(module: torch.nn.Module, layer_name: str, request: DrillRequest) -> LayerCall:
        """How the alternative calls the layer: in the prefill's forward pass, or at decode step
        ``request.step`` through its own cache (:func:`~.decode_step.capture_layer_call_at_step`)."""
        backend = request.backend
        kwargs = request.inputs.torch(backend.device)
        if not request.step:
            return capture_layer_call(module, layer_name, kwargs)
        return capture_layer_call_at_step(module, layer_name, request.layer, kwargs, request.inputs, request.step,
                                          request.tokens, backend.name, backend.dtype)

    def _trusted_graph(self, model: LoadedModel, layer_name: str, call: LayerCall, hidden64: torch.Tensor,
                       past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[LayerGraph | None, str]:
        """The trusted layer's graph, called as the alternative's layer is (at a decode step over
        ``past``, the reference's) (``(None, why)`` when there is no trusted layer or it cannot be
        called so: a module written with another signature)."""
        try:
            net, why = self._trusted_layer(model, layer_name)
        except Exception as exc:  # noqa: BLE001 - transformers cannot build it (an unknown model type: ValueError)
            self._skeletons.pop(id(model), None)
            return None, f"the Hugging Face layer cannot be built: {type(exc).__name__}: {exc}"
        if net is None:
            return None, why
        try:
            widened = _widened(call)
            if past is not None and widened.cache is not None:
                widened.cache = widened.cache.with_past(*past)
            return trace_layer(net, layer_name, widened, hidden64), ""
        except Exception as exc:  # noqa: BLE001 - the alternative's call does not fit the reference layer
            return None, f"the Hugging Face layer cannot be called as the alternative's is: {type(exc).__name__}: {exc}"
        finally:
            if id(model) not in self._loaded:
                net.get_submodule(layer_name).to_empty(device="meta")  # one layer at a time

    def _trusted_layer(self, model: LoadedModel, layer_name: str) -> tuple[torch.nn.Module | None, str]:
        """The Hugging Face model of the architecture with only layer ``layer_name`` materialised, in
        float64 with the model's weights (the rest stays on the ``meta`` device: no memory);
        ``(None, why)`` when the layer needs more than its weights; raises whatever transformers
        raises when it cannot build the model (the caller falls back to the alternative's graph)."""
        from ...backends.pytorch import hf_skeleton

        key = id(model)
        if key in self._loaded:
            return self._skeletons[key], ""
        if key not in self._skeletons:
            self._skeletons[key] = hf_skeleton(model, torch.float64, meta=True)[0].eval()
        try:
            layer = self._skeletons[key].get_submodule(layer_name)
        except AttributeError as exc:
            return None, str(exc)
        state = layer.state_dict()
        if len(state) < len(dict(layer.named_parameters())) + len(dict(layer.named_buffers())):
            return None, f"{layer_name} has buffers that are not in the weights"
        from ...backends.pytorch import _stored_tensor, build_hf_model

        stored = {n: _stored_tensor(model, f"{layer_name}.{n}") for n in state}
        missing = [n for n, t in stored.items() if t is None]
        if missing and getattr(model.config, "weights_renamed", False):
            # names transformers converts on loading (fused experts): its own loader builds the
            # whole model in float64 (kept for the session's other layers)
            self._skeletons[key] = build_hf_model(model, torch.float64).eval()
            self._loaded.add(key)
            return self._skeletons[key], ""
        if missing:
            return None, f"the weights have no {layer_name}.{missing[0]}"
        layer.to_empty(device="cpu")
        layer.load_state_dict({n: torch.as_tensor(t).to(torch.float64) for n, t in stored.items()})
        return self._skeletons[key], ""


def _eager_module(module: object) -> torch.nn.Module | None:
    """The module whose operators run eagerly: a ``torch.compile`` wrapper's original module."""
    orig = getattr(module, "_orig_mod", None)
    if isinstance(orig, torch.nn.Module):
        return orig
    return module if isinstance(module, torch.nn.Module) else None


#: dynamo backends that run the captured operators as eager ATen: replay sees what they run
_EAGER_BACKENDS = frozenset({"eager", "aot_eager"})


def _dynamo_backend(module: object) -> tuple[str, object] | None:
    """``(name, backend)`` of a ``torch.compile`` wrapper (the backend as dynamo calls it); None for
    a module that is not compiled. Reads dynamo's wrapper (no public API): an unknown layout gives
    ``("?", None)``."""
    if not isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
        return None
    try:
        debug = module.dynamo_ctx.callback._torchdynamo_orig_backend._torchdynamo_orig_backend
        return str(getattr(debug, "_compiler_name", None) or getattr(debug, "__name__", "?")), \
            debug._torchdynamo_orig_backend
    except AttributeError:
        return "?", None


def _compiler_differs(compiled: object, eager: torch.nn.Module, alt: LayerGraph, call: LayerCall,
                      request: DrillRequest) -> tuple[str, bool]:
    """``(note, True)`` when the layer compiled alone with ``compiled``'s dynamo backend differs from
    its own eager code beyond the calibrated bound (the stock eager layer's own error against
    float64, x the noise margin, + the floor) on the same input: the error is the compiler's;
    ``(note, False)`` when the compiled layer cannot be run alone; ``("", False)`` when the module is
    not compiled, its backend is eager-equivalent, or the two agree."""
    found = _dynamo_backend(compiled)
    if found is None or found[0] in _EAGER_BACKENDS:
        return "", False
    name, backend = found
    layer = eager.get_submodule(alt.layer_name)
    hidden = alt.inputs[alt.input_paths.index("hidden")]
    try:
        if backend is None:
            raise RuntimeError("the compiled module's dynamo backend could not be read")
        with torch.no_grad():
            eager_out = first_tensor(_call_layer(layer, call, hidden))
            compiled_out = first_tensor(_call_layer(torch.compile(layer, backend=backend), call, hidden))
    except Exception as exc:  # noqa: BLE001 - the compiler fails on the layer alone: replay still sees its code
        return (f"the layer compiled alone with dynamo backend {name!r} could not be run ({type(exc).__name__}: "
                f"{exc}): what its compiler does is not checked, only the eager code it is given"), False
    outputs = next(n for n in alt.gm.graph.nodes if n.op == "output").args[0]
    env = run_graph(alt, [v.double() if v.is_floating_point() else v for v in alt.inputs], float64=True)
    exact = first_tensor(torch.fx.node.map_arg(outputs, lambda a: env[a.name]))
    if eager_out is None or compiled_out is None or exact is None:
        return "", False
    rule = RatioRule.calibrated(exact, torch.finfo(hidden.dtype).eps, margin=request.noise_margin,
                                floor_eps=request.floor_eps)
    verdict = rule.judge(rms_error(eager_out, exact), rms_error(compiled_out, eager_out))
    if verdict.alternative_error <= verdict.bound:
        return "", False
    return (f"the compiled layer differs from its own eager code (RMS {verdict.alternative_error:.3e} > bound "
            f"{verdict.bound:.3e}, dynamo backend {name!r}): a compiler bug that replay cannot see inside, so no "
            "operator of the eager code is named; drill with the inductor backend (its minifier strategy) or "
            "torch._dynamo's minifier (TORCHDYNAMO_REPRO_AFTER='aot') to find the compiled kernel"), True


def _call_layer(layer: object, call: LayerCall, hidden: torch.Tensor) -> object:
    """``layer`` called as the model calls it, with ``hidden`` as its input (over the past its cache
    held, at a decode step)."""
    if call.cache is not None:
        call.cache.load(call.cache.keys, call.cache.values)
    if call.hidden_keyword:
        return layer(*call.rest_args, **call.kwargs, hidden_states=hidden)
    return layer(hidden, *call.rest_args, **call.kwargs)


def _kernel_context(backend: Backend) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """What puts the alternative's own kernels in place while an operator runs: a plugin backend's
    ATen swap; nothing for eager backends (their kernels are torch's)."""
    from ...plugins.swap import AtenSwap, PluginBackend

    if isinstance(backend, PluginBackend):
        return lambda: AtenSwap(backend.kernels)
    return contextlib.nullcontext


def _widened(call: LayerCall) -> LayerCall:
    """The alternative's call of the layer with every floating tensor in float64 on the CPU (masks
    and position embeddings are the model's, not the layer's: the layer is judged given them)."""
    def widen(v: object) -> object:
        if isinstance(v, torch.Tensor):
            return v.detach().to("cpu", torch.float64) if v.is_floating_point() else v.detach().cpu()
        if isinstance(v, dict):
            return {k: widen(x) for k, x in v.items()}
        if isinstance(v, (tuple, list)):
            return type(v)(widen(x) for x in v)
        return v

    cache = None if call.cache is None else call.cache.with_past(widen(call.cache.keys), widen(call.cache.values))
    return LayerCall(widen(call.hidden), widen(call.rest_args), widen(call.kwargs), call.hidden_keyword, cache)


def _is_mask(value: torch.Tensor, dtype: torch.dtype) -> bool:
    """An additive attention mask: its "minus infinity" is its dtype's lowest value, so it is taken
    from the alternative as it is rather than from the float64 run."""
    return value.is_floating_point() and value.numel() > 0 and \
        float(value.detach().abs().max()) >= torch.finfo(dtype).max / 4


def _trusted_inputs(trusted: LayerGraph, alt: LayerGraph, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Each input path -> its trusted float64 value: the trusted graph's own (reference hidden
    state, float64 weights, position embeddings), except additive masks (the alternative's)."""
    own = dict(zip(alt.input_paths, alt.inputs))
    out: dict[str, torch.Tensor] = {}
    for path, value in zip(trusted.input_paths, trusted.inputs):
        alt_value = own.get(path)
        if isinstance(alt_value, torch.Tensor) and alt_value.is_floating_point() and (
                _is_mask(alt_value, alt_value.dtype) or _is_mask(value, torch.float64)):
            value = alt_value
        out[path] = value.detach().to("cpu", torch.float64) if value.is_floating_point() else value.detach().cpu()
    return out


def _weight_notes(alt: LayerGraph, trusted_inputs: dict[str, torch.Tensor]) -> list[str]:
    """Weights of the alternative that are not the reference's (beyond rounding to their dtype)."""
    differ = []
    for path, own in zip(alt.input_paths, alt.inputs):
        ref = trusted_inputs.get(path)
        if not path.startswith("param:") or ref is None or not own.is_floating_point() or ref.shape != own.shape:
            continue
        rounding = rms_error(ref.to(own.dtype), ref)
        if rms_error(own, ref) > 4 * rounding + torch.finfo(own.dtype).eps * finite_rms(ref):
            differ.append(path.removeprefix("param:"))
    return [f"the alternative's weights differ from the reference's: {', '.join(differ)}"] if differ else []


def _past_notes(alt: LayerGraph, trusted_inputs: dict[str, torch.Tensor], request: DrillRequest) -> list[str]:
    """At a decode step: how far the past the alternative's own cache holds for the layer is from
    the reference's (what the operators reading it carry in)."""
    own = dict(zip(alt.input_paths, alt.inputs))
    found = []
    for part in ("keys", "values"):
        mine, ref = own.get(f"past.{part}"), trusted_inputs.get(f"past.{part}")
        if isinstance(mine, torch.Tensor) and isinstance(ref, torch.Tensor) and mine.shape == ref.shape:
            found.append(f"{part} RMS {rms_error(mine, ref):.3e} (its rounding to {mine.dtype}: "
                         f"{rms_error(ref.to(mine.dtype), ref):.3e})")
    if not found:
        return []
    return [f"the past the alternative's cache holds for layer {request.layer} before decode step {request.step} "
            f"differs from the reference's by {' and '.join(found)}: the operators reading it carry that in"]


def _write_graph(graph: LayerGraph, out_dir: Path) -> Path:
    """The alternative's layer graph as JSON (node ids, ops, inputs, module paths, sources): the
    graph the rows' ``node`` ids refer to."""
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes = [{"id": n.name, "op": n.op, "target": str(n.target), "inputs": [a.name for a in n.all_input_nodes],
              "module_path": node_module_path(n), "source": node_source(n)}
             for n in graph.gm.graph.nodes]
    path = out_dir / "layer_graph.json"
    path.write_text(json.dumps({"layer": graph.layer_name, "nodes": nodes}, indent=1), encoding="utf-8")
    return path

