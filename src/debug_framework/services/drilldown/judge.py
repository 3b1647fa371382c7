"""Judging every operator of a layer alone: replayed on the trusted inputs to it.

Given the alternative's layer graph, the trusted graph (reference semantics) run in float64 and
their alignment, each operator of the alternative gets

* ``introduced``: the RMS error of the operator replayed alone, on the trusted (float64) values of
  its inputs cast to the dtypes the alternative gave them, through the alternative's kernels,
  against the trusted value of its output;
* ``carried_in``: the largest RMS error of its inputs in the alternative's own run of the layer
  (the hidden state and, at a decode step, the cache's past are the layer inputs that carry error);
* ``bound``: ``noise_margin x`` the stock operator's own error at the alternative's dtype (the
  trusted node's op through stock eager ATen on the same inputs cast to that dtype) ``+ floor_eps
  x eps x RMS(trusted)`` (:meth:`debug_framework.comparison.RatioRule.calibrated`).

The trusted value of an alternative node is its aligned trusted node's; a cast carries its
input's; an unpaired node takes its own operator run in float64 (an operator without float64
support: the last same-shaped output of the trusted nodes of the same module, whose output it
replaces). An unpaired node whose value is not what the trusted graph feeds the aligned operator it
feeds (``y * 1.05`` inserted before a ``gelu``) takes that fed value instead: it is then judged (and
named) as the operator that introduces the error, not the aligned operator after it.

A torchao-quantized linear (one node, :mod:`debug_framework.backends.torchao`) is replayed on the
alternative's own quantized weight; its trusted value is its module's output in the trusted layer
(the reference's float weights, float64). Its row names the kernel it runs (``aten.mm``,
``aten._int_mm``, ``aten._weight_int4pack_mm_for_cpu``), or its weight's dequantize step where the
weight is no correct quantization of the reference's; where the session judges at the quantization,
its bound is a correct quantization's error on the same input.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ...comparison import RatioRule, finite_rms
from ...backends.drilldown.types import OperatorRow
from .align import Alignment, attribute_differences
from .layer_graph import LayerGraph, is_cast, map_float_dtypes, node_module_path, node_source, run_graph
from ...backends.torchao.leaves import (call_of, correct_quantized_error, is_quantized_call, kernel_of, quantized_weight,
                                 weight_error)

__all__ = ["JudgedLayer", "Replay", "judge_layer", "rms_error", "first_tensor", "value_scale", "as_linear"]

KernelContext = Callable[[], contextlib.AbstractContextManager[object]]


@dataclass
class Replay:
    """What replaying one operator took: its call (inputs as replayed) and the trusted output."""

    target: Callable[..., object]
    args: object
    kwargs: object
    trusted: torch.Tensor
    bound: float
    introduced: float


def as_linear(replay: Replay) -> Replay:
    """A torchao-quantized linear's replay as ``torch.nn.functional.linear`` on its quantized weight
    (rebuilt from the graph's inner tensors): what a repro with torchao installed can run."""
    x, parts, handle, bias = replay.args  # type: ignore[misc]
    weight = quantized_weight(int(handle), list(parts))
    return Replay(torch.nn.functional.linear, (x, weight, bias), {}, replay.trusted, replay.bound, replay.introduced)


@dataclass
class JudgedLayer:
    rows: list[OperatorRow]
    replays: dict[str, Replay]
    notes: list[str] = field(default_factory=list)
    #: operators only the alternative has whose value is not what the reference feeds the aligned
    #: operator they feed: node -> that operator's node
    extra_ops: dict[str, str] = field(default_factory=dict)


def first_tensor(value: object) -> torch.Tensor | None:
    """An operator's output, judged by its first tensor (``native_layer_norm`` -> the normalised)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def value_scale(trusted: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values whose RMS scales an operator's bound: ``trusted`` without its sentinels, the values
    at the extreme of ``dtype``'s range (beyond half its largest finite value: an additive mask's
    ``finfo.min``), which are no magnitude of the computation and would make the bound absurd
    (2.8e31 for an attention-mask add in float32); all of it when nothing else is left."""
    t = trusted if trusted.is_floating_point() else trusted.double()
    if not dtype.is_floating_point:
        return t
    ordinary = t.abs() < torch.finfo(dtype).max / 2
    return t[ordinary] if bool(ordinary.any()) and not bool(ordinary.all()) else t


def rms_error(value: object, trusted: object) -> float:
    """RMS of ``value - trusted`` over finite pairs, in float64; ``inf`` when shapes differ or a
    pair is non-finite on either side without being the same value on both (``+inf`` against
    ``-inf``, NaN against an infinity or a number); a trusted value beyond the value's dtype's range
    that overflowed to the infinity of its sign is rounding, not error (an additive mask's "minus
    infinity" cast down), and so is a pair at the extreme of that range on both sides (beyond half
    its largest value, same sign: the mask's sentinel). NaN when either is not a tensor."""
    a, t = first_tensor(value), first_tensor(trusted)
    if a is None or t is None:
        return float("nan")
    if a.shape != t.shape:
        return float("inf")
    big = torch.finfo(a.dtype).max if a.is_floating_point() else math.inf
    a, t = a.detach().to("cpu", torch.float64), t.detach().to("cpu", torch.float64)
    saturated = torch.isinf(a) & (t.abs() >= big) & (torch.sign(a) == torch.sign(t))
    # a sentinel at the extreme of the value's range on both sides (an additive mask's finfo.min)
    saturated |= (a.abs() >= big / 2) & (t.abs() >= big / 2) & (torch.sign(a) == torch.sign(t))
    same = (a == t) | (torch.isnan(a) & torch.isnan(t))  # the same infinity, or NaN on both sides
    mismatch = ~(torch.isfinite(a) & torch.isfinite(t)) & ~same & ~saturated
    if bool(mismatch.any()):
        return float("inf")
    keep = ~saturated
    return finite_rms((a - t)[keep]) if bool(keep.any()) else 0.0


def _cast_like(value: object, like: object, device: str | torch.device) -> object:
    """``value`` (trusted, float64) cast to the dtype ``like`` has, on ``device``, as a fresh copy
    laid out as ``like`` is (its strides, where it is dense): the operator replayed on it was given
    ``like`` by the alternative, and a ``view`` of it needs the layout it had there, not the one
    the trusted computation happened to leave (a transposed product where the alternative's own
    quantized linear gave a contiguous one)."""
    if isinstance(value, torch.Tensor):
        if not isinstance(like, torch.Tensor):
            return value.detach().to(device=device, copy=True)
        if like.shape == value.shape and like.layout == torch.strided and not like.is_quantized:
            # preserve_format: like's strides where they are dense and do not overlap, else contiguous
            return torch.empty_like(like, device=device).copy_(value.detach())
        return value.detach().to(device=device, dtype=like.dtype, copy=True).contiguous()
    if isinstance(value, (tuple, list)):
        likes = like if isinstance(like, (tuple, list)) else [None] * len(value)
        return type(value)(_cast_like(v, w, device) for v, w in zip(value, likes))
    return value


def _to_dtype(value: object, dtype: torch.dtype) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype=dtype, copy=True) if value.is_floating_point() else value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_dtype(v, dtype) for v in value)
    return value


@dataclass(frozen=True)
class QuantizedCheck:
    """A torchao-quantized linear beside a correct quantization of the reference's weight:
    ``correct`` its output error on the same input, ``correct_weight`` / ``weight`` the RMS of the
    correct / the alternative's dequantized weight against the reference's, ``floor`` eps x RMS(weight)."""

    correct: float
    correct_weight: float
    weight: float
    floor: float

    def weight_wrong(self, margin: float) -> bool:
        """The alternative's quantized weight is no correct quantization of the reference's: its
        quantize/dequantize step (scales, zero points or data) is where the error comes from."""
        return self.weight > margin * self.correct_weight + self.floor


@dataclass
class _Judge:
    alt: LayerGraph
    trusted: LayerGraph
    alignment: Alignment
    alt_own: dict[str, object]
    trusted_env: dict[str, object]
    trusted_inputs: dict[str, torch.Tensor]
    kernels: KernelContext
    dtype: torch.dtype
    device: str | torch.device
    margin: float
    floor_eps: float
    tv: dict[str, object] = field(default_factory=dict)  # alternative node -> trusted value
    extra_ops: dict[str, str] = field(default_factory=dict)  # see JudgedLayer.extra_ops
    quantization: bool = False  # the session judges at the alternative's quantization
    checks: dict[str, QuantizedCheck | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.alt_nodes = {n.name: n for n in self.alt.gm.graph.nodes}
        self.ref_nodes = {n.name: n for n in self.trusted.gm.graph.nodes}
        self.eps = torch.finfo(self.dtype).eps
        self.paths = {n.name: p for n, p in zip(self.alt.placeholders(), self.alt.input_paths)}

    def trusted_value(self, node: torch.fx.Node, index: int) -> object:
        if node.op == "placeholder":
            path = self.alt.input_paths[index]
            own = self.alt.inputs[index]
            got = self.trusted_inputs.get(path)
            if got is None or not isinstance(own, torch.Tensor) or got.shape != own.shape:
                return _trusted_own(own)
            return got
        if node.op == "get_attr":
            return _trusted_own(self.alt_own[node.name])
        if node.target is operator.getitem:
            return self.tv[node.args[0].name][node.args[1]]
        if is_cast(node):
            return self.tv[node.args[0].name]
        if is_quantized_call(node):  # its module's output in the trusted layer (float weights, float64)
            return self._module_output(node, first_tensor(self.alt_own[node.name]))
        if node.name in self.alignment.pairs:
            return self.trusted_env[self.alignment.pairs[node.name]]
        own = self._unpaired_value(node)
        fed = self._fed_value(node, first_tensor(own))
        if fed is None:
            return own
        self.extra_ops[node.name] = fed[1]
        return fed[0]

    def _consumers(self, node: torch.fx.Node) -> Iterator[tuple[torch.fx.Node, int]]:
        """``(aligned operator, argument position)`` for every aligned operator ``node`` feeds
        (through casts)."""
        for user in node.users:
            if is_cast(user):
                yield from self._consumers(user)
            elif user.name in self.alignment.pairs:
                yield from ((user, i) for i, a in enumerate(user.args) if a is node)

    def _fed_value(self, node: torch.fx.Node, own: torch.Tensor | None) -> tuple[torch.Tensor, str] | None:
        """For an operator only the alternative has: ``(value, consumer)`` when its own value is none
        of the values the trusted graph feeds the counterpart of an aligned ``consumer`` of it, and
        the one fed at its position has its shape (the trusted graph has no such operator there)."""
        if own is None or not own.is_floating_point():
            return None
        for user, pos in self._consumers(node):
            ref = self.ref_nodes[self.alignment.pairs[user.name]]
            fed = [first_tensor(self.trusted_env.get(a.name)) for a in ref.args if isinstance(a, torch.fx.Node)]
            fed = [t for t in fed if t is not None and t.shape == own.shape]
            if any(not self._differs(own, t) for t in fed) or pos >= len(ref.args):
                continue
            at = ref.args[pos]
            value = first_tensor(self.trusted_env.get(at.name)) if isinstance(at, torch.fx.Node) else None
            if value is not None and value.shape == own.shape and value.is_floating_point():
                return value, user.name
        return None

    def _differs(self, value: torch.Tensor, trusted: torch.Tensor) -> bool:
        """Beyond the rounding of ``trusted`` to the alternative's dtype (with the noise margin)."""
        if not trusted.is_floating_point():
            return bool((value != trusted).any())
        rounding = rms_error(trusted.to(self.dtype), trusted)
        return rms_error(value, trusted) > self.margin * rounding + self.floor_eps * self.eps * finite_rms(trusted)

    def _unpaired_value(self, node: torch.fx.Node) -> object:
        """An operator the trusted graph lacks: its own function in float64 on trusted inputs; an
        operator without float64 support stands for the output of its module (a kernel swapped in
        for a module): the last same-shaped trusted value made in that module, else its own output."""
        args = torch.fx.node.map_arg(node.args, lambda a: self.tv[a.name])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: self.tv[a.name])
        try:
            with torch.no_grad():
                return node.target(*map_float_dtypes(args, torch.float64), **map_float_dtypes(kwargs, torch.float64))
        except Exception:  # noqa: BLE001 - an operator without float64 support
            pass
        found = self._module_output(node, first_tensor(self.alt_own[node.name]))
        return found if found is not None else _to_dtype(_on_cpu(self.alt_own[node.name]), torch.float64)

    def _module_output(self, node: torch.fx.Node, own: torch.Tensor | None) -> torch.Tensor | None:
        """The last trusted value of ``own``'s shape made in ``node``'s module (the module's output,
        for an operator that stands for the whole module); None where there is none."""
        path = node_module_path(node)
        if own is not None and path:
            for ref in reversed([n for n in self.trusted.gm.graph.nodes if node_module_path(n) == path]):
                value = first_tensor(self.trusted_env.get(ref.name))
                if value is not None and value.shape == own.shape:
                    return value
        return None

    def _replay_input(self, arg: torch.fx.Node) -> object:
        """A replayed operator's input: the alternative's own weights (its state is part of what is
        judged), else the trusted value cast to the dtype the alternative gave that input."""
        if arg.op == "get_attr" or (arg.op == "placeholder" and self.paths[arg.name].startswith("param:")):
            return _clone(self.alt_own[arg.name])
        return _cast_like(self.tv[arg.name], self.alt_own[arg.name], self.device)

    def replay(self, node: torch.fx.Node) -> tuple[object, object, object]:
        """The operator alone on trusted inputs cast to the alternative's dtypes, its kernels in place."""
        args = torch.fx.node.map_arg(node.args, self._replay_input)
        kwargs = torch.fx.node.map_arg(node.kwargs, self._replay_input)
        with torch.no_grad(), self.kernels():
            out = node.target(*_clone(args), **_clone(kwargs))
        return out, args, kwargs

    def stock_noise(self, node: torch.fx.Node, trusted: object, args: object = None) -> float:
        """The error a stock eager operator makes at the alternative's dtype on the same inputs; for a
        torchao-quantized linear where the session judges at its quantization, the error of a correct
        quantization of the reference's weight (:meth:`quantized_check`)."""
        if self.quantization and is_quantized_call(node):
            check = self.quantized_check(node, args, trusted)
            if check is not None:
                return check.correct
        ref_name = self.alignment.pairs.get(node.name)
        if ref_name is None or is_cast(node):  # no stock operator: the rounding of the value itself
            t = first_tensor(trusted)
            return 0.0 if t is None or not t.is_floating_point() else rms_error(t.to(self.dtype), t)
        ref = self.ref_nodes[ref_name]
        args = _to_dtype(torch.fx.node.map_arg(ref.args, lambda a: self.trusted_env[a.name]), self.dtype)
        kwargs = _to_dtype(torch.fx.node.map_arg(ref.kwargs, lambda a: self.trusted_env[a.name]), self.dtype)
        with torch.no_grad():
            out = ref.target(*map_float_dtypes(args, self.dtype, torch.float64),
                             **map_float_dtypes(kwargs, self.dtype, torch.float64))
        return rms_error(out, trusted)

    def quantized_check(self, node: torch.fx.Node, args: object, trusted: object) -> QuantizedCheck | None:
        """A torchao-quantized linear measured against a correct quantization of the reference's
        weight (same configuration, the alternative's dtype) on the same replayed input: that run's
        output error, and both weights' error against the reference's (None where the reference's
        weight is not known here, or the scheme cannot be reproduced)."""
        if node.name in self.checks:
            return self.checks[node.name]
        call = call_of(node)
        weight = self.trusted_inputs.get(f"param:{call.param}")
        bias = self.trusted_inputs.get(f"param:{call.param.removesuffix('weight')}bias")
        t = first_tensor(trusted)
        found = None
        if isinstance(args, (tuple, list)) and weight is not None and t is not None:
            x, parts = args[0], list(args[1])
            correct = correct_quantized_error(node, x, weight, bias, t)
            if correct is not None:
                found = QuantizedCheck(correct[0], correct[1], weight_error(node, parts, weight),
                                       self.eps * finite_rms(weight))
        self.checks[node.name] = found
        return found

    def carried_in(self, node: torch.fx.Node) -> float:
        errors = [rms_error(self.alt_own[a.name], self.tv[a.name]) for a in node.all_input_nodes
                  if a.op != "placeholder" or _carries(self.paths[a.name])]
        errors = [e for e in errors if e == e]
        return max(errors, default=0.0)


def _carries(path: str) -> bool:
    """Whether a graph input carries the alternative's own error into the layer: its hidden state
    and, at a decode step, the past its cache holds (weights and masks are the layer's own)."""
    return path == "hidden" or path.startswith("past.")


def _trusted_own(value: object) -> object:
    """The alternative's own input or attribute as the trusted side takes it: a float tensor in
    float64 on the CPU, another tensor on the CPU, anything else (a quantized module's packed
    weights, a script object) as it is: only the alternative's kernels read it."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_quantized:
        return value.dequantize().to("cpu", torch.float64)
    return value.detach().to("cpu", torch.float64) if value.is_floating_point() else value.cpu()


def _on_cpu(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _clone(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def judge_layer(alt: LayerGraph, trusted: LayerGraph, alignment: Alignment, trusted_inputs: dict[str, torch.Tensor],
                *, kernels: KernelContext, dtype: torch.dtype, margin: float, floor_eps: float,
                quantization: bool = False) -> JudgedLayer:
    """Every operator of ``alt`` judged alone (see the module's docstring); with ``quantization`` a
    torchao-quantized linear is bounded by a correct quantization's error, not by float rounding."""
    device = next((t.device for t in alt.inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    with kernels():
        alt_own = run_graph(alt, alt.inputs)
    trusted_env = run_graph(trusted, [trusted_inputs.get(p, v.double() if v.is_floating_point() else v)
                                      for p, v in zip(trusted.input_paths, trusted.inputs)], float64=True)
    j = _Judge(alt, trusted, alignment, alt_own, trusted_env, trusted_inputs, kernels, dtype, device, margin, floor_eps,
               quantization=quantization)
    rows: list[OperatorRow] = []
    replays: dict[str, Replay] = {}
    placeholder_index = 0
    for node in alt.gm.graph.nodes:
        if node.op == "output":
            continue
        j.tv[node.name] = j.trusted_value(node, placeholder_index)
        if node.op == "placeholder":
            placeholder_index += 1
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        trusted_out = first_tensor(j.tv[node.name])
        if trusted_out is None:
            continue
        out, args, kwargs = j.replay(node)
        introduced = rms_error(out, trusted_out)
        stock = j.stock_noise(node, trusted_out, args)
        rule = RatioRule.calibrated(value_scale(trusted_out, dtype), j.eps, margin=margin, floor_eps=floor_eps)
        bound = rule.judge(stock, introduced).bound
        op, source = str(node.target), node_source(node)
        if is_quantized_call(node):
            op, source = _quantized_step(j, node, args, trusted_out, margin)
        rows.append(OperatorRow(index=len(rows), node=node.name, op=op, module_path=node_module_path(node),
                                source=source, introduced=introduced, carried_in=j.carried_in(node),
                                bound=bound))
        replays[node.name] = Replay(node.target, args, kwargs, trusted_out, bound, introduced)
    return JudgedLayer(rows, replays, _notes(alt, trusted, alignment) + _extra_notes(j) + _quantization_notes(j, rows),
                       j.extra_ops)


def _quantization_notes(j: _Judge, rows: list[OperatorRow]) -> list[str]:
    """Where a float-judged session's first operator beyond its bound is a torchao-quantized linear
    whose error a correct quantization of the reference's weight makes too: that it is
    quantization's error, and how to judge at it."""
    first = next((r for r in rows if r.introduces), None)
    node = None if first is None or j.quantization else j.alt_nodes[first.node]
    check = j.checks.get(first.node) if node is not None and is_quantized_call(node) else None
    if first is None or check is None or first.introduced > j.margin * check.correct + first.bound:
        return []
    scheme = call_of(j.alt_nodes[first.node]).weight.scheme
    return [f"{first.op} at {first.module_path} errs as a correct {scheme} quantization of the reference's weight "
            f"does ({first.introduced:.3e} against {check.correct:.3e}): the error is the quantization's; judge the "
            "model at its quantization with --dtype auto"]


def _quantized_step(j: _Judge, node: torch.fx.Node, args: object, trusted: torch.Tensor, margin: float
                    ) -> tuple[str, str]:
    """``(op, source)`` of a torchao-quantized linear's row: the kernel it runs
    (``aten._int_mm.default``), or its weight's dequantize step (``Int8Tensor.dequantize``) where
    that weight is no correct quantization of the reference's; the source says which scheme."""
    call = call_of(node)
    where = f"torchao {call.weight.scheme}" + (f" (group size {call.weight.group_size})" if call.weight.group_size
                                               else "") + f" linear, {call.weight.tensor} weight"
    line = node_source(node)
    check = j.quantized_check(node, args, trusted)
    if check is not None and check.weight_wrong(margin):
        return (f"{call.weight.tensor}.dequantize",
                f"{line} ({where}: its dequantized weight is {check.weight:.3e} RMS from the reference's where a "
                f"correct {call.weight.scheme} quantization is {check.correct_weight:.3e})")
    return kernel_of(node), f"{line} ({where})"


def _extra_notes(j: _Judge) -> list[str]:
    """Operators only the alternative has whose output is not what the reference feeds on."""
    def at(name: str) -> str:
        n = j.alt_nodes[name]
        return f"{n.target} ({name}) at {node_module_path(n) or '?'} ({node_source(n) or '?'})"

    return [f"{at(extra)}, which only the alternative has, feeds {at(user)} a value the reference does not: "
            "it is judged against the value the reference feeds there" for extra, user in j.extra_ops.items()]


def _notes(alt: LayerGraph, trusted: LayerGraph, alignment: Alignment) -> list[str]:
    """Aligned operators whose attributes differ, and operators only one side has."""
    alt_nodes = {n.name: n for n in alt.gm.graph.nodes}
    ref_nodes = {n.name: n for n in trusted.gm.graph.nodes}
    notes = []
    for a, r in alignment.pairs.items():
        for d in attribute_differences(alt_nodes[a], ref_nodes[r]):
            notes.append(f"{alt_nodes[a].target} ({a}) at {node_module_path(alt_nodes[a]) or '?'}: {d}")
    # a torchao-quantized linear stands for its whole module: neither its node nor the trusted
    # module's operators are missing from the other side
    quantized = [alt_nodes[n] for n in alignment.alternative_only if is_quantized_call(alt_nodes[n])]
    modules = {node_module_path(n) for n in quantized}
    if quantized:
        schemes = ", ".join(dict.fromkeys(call_of(n).weight.scheme for n in quantized))
        notes.append(f"{len(quantized)} torchao-quantized linear{'s' if len(quantized) > 1 else ''} ({schemes}) "
                     "judged as one operator each: replayed on the alternative's quantized weight against its module's "
                     "float64 output")
    alt_only = [n for n in alignment.alternative_only if not is_quantized_call(alt_nodes[n])]
    ref_only = [n for n in alignment.trusted_only if node_module_path(ref_nodes[n]) not in modules]
    for side, names, nodes in (("only the alternative has", alt_only, alt_nodes),
                               ("the alternative lacks", ref_only, ref_nodes)):
        if names:
            listed = ", ".join(f"{nodes[n].target} ({n}) at {node_module_path(nodes[n]) or '?'}" for n in names[:8])
            notes.append(f"{side}: {listed}" + (f" and {len(names) - 8} more" if len(names) > 8 else ""))
    return notes
