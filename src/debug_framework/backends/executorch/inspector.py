"""ExecuTorch's own numerical evidence: its Inspector's ``calculate_numeric_gap`` (MSE, L1 or SNR per
operator between the ETRecord's intermediates, computed by the exported program at its own dtype,
and the ETDump's, recorded by the runtime), on the session's own inputs, each operator placed in the
model (embedding, a layer, the head) by the module its debug handle comes from.

Measured with executorch 1.5.1 on a tiny Llama: it runs for a portable program on a batch of one,
and fails for a batch of two (``ValueError: ... size of tensor a (16) must match the size of tensor
b (32)``), for XNNPACK's delegate and, as reported upstream, for grouped-query attention.
:func:`numeric_gap` tries the session's whole batch, then each row alone at batch 1 (saying so), and
returns what happened either way as :class:`InspectorEvidence`: the gap per operator (the worst over
the rows) where it ran, the error where it did not.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .lowering import lower_to_file
from .program import load_program

if TYPE_CHECKING:
    import pandas
    import torch

    from ...jsonio import JsonObject

__all__ = ["InspectorEvidence", "numeric_gap", "place_of", "module_paths", "worse", "DEBUG_BUFFER_BYTES"]

#: The debug buffer the runtime records every intermediate value in (bytes).
DEBUG_BUFFER_BYTES = 64 << 20

#: a decoder/encoder layer's index in a module path (``net.model.layers.3.mlp``, ``encoder.layer.0``)
_LAYER_IN_PATH = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


def place_of(module_path: str, after_layers: bool) -> str:
    """Where an operator of module ``module_path`` sits in the model: ``"layer i"``, else
    ``"embedding"`` before the first layer, ``"head"`` after the layers (``after_layers``)."""
    found = _LAYER_IN_PATH.search(module_path)
    if found:
        return f"layer {int(found.group(1))}"
    return "head" if after_layers else "embedding"


def worse(metric: str, a: float, b: float) -> bool:
    """``a`` is a worse gap than ``b`` under ``metric`` (a larger MSE or L1, a smaller SNR; NaN is worst)."""
    if math.isnan(a):
        return not math.isnan(b)
    return a < b if metric == "SNR" else a > b


@dataclass
class InspectorEvidence:
    """What ExecuTorch's Inspector said of the model's program on the session's inputs.

    Attributes:
        ran: ``calculate_numeric_gap`` returned a table (for the whole batch, or for every row).
        seconds: the time it took (its exports and the Inspector's parsing included), or until it failed.
        metric: ``"MSE"``, ``"L1"`` or ``"SNR"``.
        inputs: what it ran on, in words (the session's batch, or its rows one by one at batch 1).
        operators: one row per compared operator in program order: ``operator`` (its name(s)),
            ``module`` (the module path its debug handle comes from), ``place`` (:func:`place_of`) and
            ``gap`` (the worst over the rows).
        why: the error where it did not run.
        notes: what failed on the way (the whole batch, before the rows ran alone).
    """

    ran: bool
    seconds: float
    metric: str
    inputs: str = ""
    operators: list[JsonObject] = field(default_factory=list)
    why: str = ""
    notes: list[str] = field(default_factory=list)

    def worst(self, n: int = 5) -> list[JsonObject]:
        """The ``n`` operators with the worst gap."""
        key = (lambda r: float(r["gap"])) if self.metric != "SNR" else (lambda r: -float(r["gap"]))
        return sorted(self.operators, key=lambda r: (not math.isnan(float(r["gap"])), key(r)), reverse=True)[:n]

    def places(self) -> list[JsonObject]:
        """Per place in the model (embedding, each layer, head; in program order): how many operators
        were compared there, the worst gap and its operator."""
        found: dict[str, JsonObject] = {}
        for row in self.operators:
            place, gap = str(row["place"]), float(row["gap"])
            seen = found.get(place)
            if seen is None:
                found[place] = {"place": place, "operators": 1, "gap": gap, "operator": row["operator"]}
                continue
            seen["operators"] = int(seen["operators"]) + 1
            if worse(self.metric, gap, float(seen["gap"])):
                seen.update(gap=gap, operator=row["operator"])
        return list(found.values())

    def line(self) -> str:
        """One line saying what the Inspector found, or why it could not."""
        if not self.ran:
            return f"ExecuTorch's Inspector failed after {self.seconds:.2f} s ({self.inputs}): {self.why}"
        top = self.worst(1)
        worst = f"; the largest {self.metric} {float(top[0]['gap']):.3g} at {top[0]['operator']}" if top else ""
        return (f"ExecuTorch's Inspector (calculate_numeric_gap, {self.inputs}): {len(self.operators)} operators "
                f"in {self.seconds:.2f} s{worst}")

    def to_dict(self) -> JsonObject:
        """The record the session's result keeps as ``inspector``."""
        return {"tool": "ExecuTorch's Inspector", "ran": self.ran, "seconds": round(self.seconds, 4), "metric": self.metric, "inputs": self.inputs,
                "line": self.line(), "why": self.why or None, "notes": list(self.notes),
                "operators": len(self.operators), "worst": self.worst(5), "places": self.places()}


def _gap_value(value: object) -> float:
    """A gap cell of the Inspector's table (a list of one number, or a number) as a float."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else float("nan")
    return float(value)  # type: ignore[arg-type]


def _op_names(value: object) -> str:
    """The operator names of one row of the Inspector's table (a list of names, or one)."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _handles(value: object) -> tuple[int, ...]:
    """The debug handles of one row of the Inspector's table (a tuple of ints, or one)."""
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)  # type: ignore[call-overload]


def module_paths(etrecord: object) -> dict[int, str]:
    """Debug handle -> the module path of the edge program's node with it (the innermost module of
    its ``nn_module_stack``; ``""`` where it has none)."""
    program = getattr(etrecord, "edge_dialect_program", None)
    graph = getattr(program, "graph", None)
    paths: dict[int, str] = {}
    for node in getattr(graph, "nodes", ()):
        handle = node.meta.get("debug_handle")
        if not isinstance(handle, int) or handle in paths:
            continue
        stack = node.meta.get("nn_module_stack") or {}
        paths[handle] = str(list(stack.values())[-1][0]) if stack else ""
    return paths


def _placed(table: pandas.DataFrame, paths: dict[int, str]) -> list[JsonObject]:
    """The Inspector's table as rows placed in the model (the first layer's operator starts the
    layers, anything outside a layer after one is the head)."""
    rows: list[JsonObject] = []
    after_layers = False
    for n, (_, row) in enumerate(table.iterrows()):
        module = next((paths[h] for h in _handles(row["aot_debug_handle"]) if paths.get(h)), "")
        place = place_of(module, after_layers)
        after_layers = after_layers or place.startswith("layer")
        name = _op_names(row["aot_ops"]) if "aot_ops" in row else str(n)
        rows.append({"operator": name, "module": module, "place": place, "gap": _gap_value(row["gap"])})
    return rows


def _one_run(path: Path, record: Path, args: tuple[torch.Tensor, ...], metric: str, tag: str) -> list[JsonObject]:
    """Run the program on ``args`` recording an ETDump and ask the Inspector for the gap per
    operator, the ETRecord's intermediates computed on the same ``args``. Raises what it raises."""
    from executorch.devtools import Inspector
    from executorch.devtools.etrecord import parse_etrecord

    program = load_program(path, etdump=True, debug_buffer_size=DEBUG_BUFFER_BYTES)
    program.run(list(args))
    etdump = program.write_etdump(path.with_name(f"{path.stem}-{tag}.etdp"))
    etrecord = parse_etrecord(str(record))
    etrecord.update_representative_inputs(args)
    inspector = Inspector(etdump_path=str(etdump), etrecord=etrecord,
                          debug_buffer_path=str(etdump.with_suffix(".debug.bin")))
    return _placed(inspector.calculate_numeric_gap(metric), module_paths(etrecord))


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _attempt(module: torch.nn.Module, rows: list[tuple[torch.Tensor, ...]], path: Path, delegate: str,
             metric: str) -> list[JsonObject]:
    """Export ``module`` at the shape of ``rows[0]`` with an ETRecord and run the Inspector on each of
    ``rows``: each operator's worst gap over them. The export's failure is DF002; the Inspector's
    is raised as it is."""
    lowered = lower_to_file(module, rows[0], path, delegate, "executorch", etrecord=True)
    assert lowered.etrecord is not None
    merged: list[JsonObject] = []
    for n, args in enumerate(rows):
        got = _one_run(path, lowered.etrecord, args, metric, f"row{n}")
        if not merged:
            merged = got
            continue
        for have, new in zip(merged, got):
            if worse(metric, float(new["gap"]), float(have["gap"])):
                have["gap"] = new["gap"]
    return merged


def numeric_gap(module: torch.nn.Module, batch: tuple[torch.Tensor, ...], path: Path, delegate: str,
                metric: str = "MSE") -> InspectorEvidence:
    """ExecuTorch's Inspector on ``module`` (the model's logits) for ``batch`` (the session's inputs):
    exported at the batch's shape with an ETRecord and run once with an ETDump; where that fails and
    the batch has more than one row, exported at batch 1 and run row by row, each operator's gap the
    worst over the rows. Never raises: the Inspector's failure, or its program's, is the evidence."""
    rows = int(batch[0].shape[0])
    start = time.perf_counter()
    inputs = f"the session's batch of {rows}"
    try:
        found = _attempt(module, [batch], path, delegate, metric)
        return InspectorEvidence(True, time.perf_counter() - start, metric, inputs, found)
    except Exception as exc:  # noqa: BLE001 - the Inspector failing is what is reported
        if rows == 1:
            return InspectorEvidence(False, time.perf_counter() - start, metric, inputs, why=_why(exc))
        notes = [f"at {inputs}: {_why(exc)}"]
    single = [tuple(t[i:i + 1] for t in batch) for i in range(rows)]
    inputs = f"the session's {rows} rows one by one at batch 1"
    try:
        found = _attempt(module, single, path.with_name(path.stem + "-batch1.pte"), delegate, metric)
    except Exception as exc:  # noqa: BLE001
        return InspectorEvidence(False, time.perf_counter() - start, metric, inputs, why=_why(exc), notes=notes)
    return InspectorEvidence(True, time.perf_counter() - start, metric, inputs, found, notes=notes)
