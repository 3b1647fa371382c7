"""Aligning the alternative's layer graph with the trusted one, operator by operator.

Each graph becomes a sequence of tokens ``(module path, op packet)`` over its arithmetic nodes
(dtype conversions and tuple indexing are left out: an implementation may insert casts freely);
:class:`difflib.SequenceMatcher` pairs the equal runs, and inside a differing run the op packets
alone are matched again (an implementation whose module names differ). An aligned pair whose
non-tensor arguments differ (``gelu(approximate='tanh')`` against ``gelu``, another scale) is
reported as such; nodes left unpaired are the ones one graph has and the other has not.
"""

from __future__ import annotations

import difflib
import math
import operator
from dataclasses import dataclass, field

import torch

from .layer_graph import is_cast, node_module_path

__all__ = ["Alignment", "align_graphs", "op_packet", "attribute_differences"]


@dataclass
class Alignment:
    """``pairs``: alternative node name -> trusted node name; the unpaired nodes of each side."""

    pairs: dict[str, str] = field(default_factory=dict)
    alternative_only: list[str] = field(default_factory=list)
    trusted_only: list[str] = field(default_factory=list)


def op_packet(node: torch.fx.Node) -> str:
    """``aten.gelu`` for ``aten.gelu.default``: the operator without its overload."""
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    return str(packet) if packet is not None else str(getattr(target, "__name__", target))


def _arith(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    return [n for n in nodes if n.op == "call_function" and not is_cast(n) and n.target is not operator.getitem]


def align_graphs(alternative: torch.fx.Graph, trusted: torch.fx.Graph) -> Alignment:
    """Pair the arithmetic nodes of ``alternative`` with those of ``trusted`` (graph order kept)."""
    alt, ref = _arith(list(alternative.nodes)), _arith(list(trusted.nodes))
    out = Alignment()
    _match(alt, ref, lambda n: (node_module_path(n), op_packet(n)), out, refine=True)
    return out


def _match(alt: list[torch.fx.Node], ref: list[torch.fx.Node], key: object, out: Alignment, *, refine: bool) -> None:
    sm = difflib.SequenceMatcher(None, [key(n) for n in alt], [key(n) for n in ref], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.pairs.update((a.name, r.name) for a, r in zip(alt[i1:i2], ref[j1:j2]))
        elif refine and i1 < i2 and j1 < j2:  # a differing run: the op packets alone
            _match(alt[i1:i2], ref[j1:j2], op_packet, out, refine=False)
        else:
            out.alternative_only.extend(n.name for n in alt[i1:i2])
            out.trusted_only.extend(n.name for n in ref[j1:j2])


def _constant(value: object) -> object:
    """The non-tensor part of an argument (tensors and dtypes are not attributes of the op)."""
    if isinstance(value, torch.fx.Node) or isinstance(value, torch.dtype):
        return None
    if isinstance(value, (tuple, list)):
        return tuple(_constant(v) for v in value)
    return value


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def attribute_differences(alt: torch.fx.Node, ref: torch.fx.Node) -> list[str]:
    """``["approximate='tanh' where the reference has 'none'", ...]`` for an aligned pair."""
    diffs: list[str] = []
    if alt.target != ref.target:
        diffs.append(f"overload {alt.target} where the reference has {ref.target}")
    schema_names = _arg_names(alt)
    for i, (a, r) in enumerate(zip(alt.args, ref.args)):
        ca, cr = _constant(a), _constant(r)
        if not _same(ca, cr):
            diffs.append(f"{schema_names.get(i, f'arg{i}')}={ca!r} where the reference has {cr!r}")
    defaults = _defaults(alt)
    for k in sorted(set(alt.kwargs) | set(ref.kwargs)):
        ca, cr = _constant(alt.kwargs.get(k, defaults.get(k))), _constant(ref.kwargs.get(k, defaults.get(k)))
        if not _same(ca, cr):
            diffs.append(f"{k}={ca!r} where the reference has {cr!r}")
    return diffs


def _arg_names(node: torch.fx.Node) -> dict[int, str]:
    schema = getattr(node.target, "_schema", None)
    return {} if schema is None else {i: a.name for i, a in enumerate(schema.arguments)}


def _defaults(node: torch.fx.Node) -> dict[str, object]:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return {}
    return {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
