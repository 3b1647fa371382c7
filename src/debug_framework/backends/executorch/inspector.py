"""ExecuTorch's own numerical evidence: its Inspector's ``calculate_numeric_gap`` (MSE, L1 or SNR per
operator between the ETRecord's intermediates, computed by the exported program at its own dtype,
and the ETDump's, recorded by the runtime), where it runs.

Measured with executorch 1.5.1 on a tiny Llama: it runs on a batch of one (portable or XNNPACK:
a delegate call is then one operator), and fails for a batch of two (``ValueError: ... size of
tensor a (16) must match the size of tensor b (32)``) and, as reported, for grouped-query attention. :func:`numeric_gap` returns what happened either
way, as :class:`InspectorEvidence`: the gap per operator where it ran, the error where it did not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .lowering import lower_to_file
from .program import load_program

if TYPE_CHECKING:
    import torch

    from ...jsonio import JsonObject

__all__ = ["InspectorEvidence", "numeric_gap", "DEBUG_BUFFER_BYTES"]

#: The debug buffer the runtime records every intermediate value in (bytes).
DEBUG_BUFFER_BYTES = 64 << 20


@dataclass
class InspectorEvidence:
    """What ExecuTorch's Inspector said of one program run.

    Attributes:
        ran: ``calculate_numeric_gap`` returned a table.
        seconds: the time it took (the Inspector's parsing included), or until it failed.
        metric: ``"MSE"``, ``"L1"`` or ``"SNR"``.
        operators: one row per compared operator: its name(s) and gap, in program order.
        why: the error where it did not run.
    """

    ran: bool
    seconds: float
    metric: str
    operators: list[JsonObject] = field(default_factory=list)
    why: str = ""

    def worst(self, n: int = 5) -> list[JsonObject]:
        """The ``n`` operators with the largest gap (the smallest SNR)."""
        key = (lambda r: float(r["gap"])) if self.metric != "SNR" else (lambda r: -float(r["gap"]))
        return sorted(self.operators, key=key, reverse=True)[:n]

    def line(self) -> str:
        """One line saying what the Inspector found, or why it could not."""
        if not self.ran:
            return f"Inspector's calculate_numeric_gap failed after {self.seconds:.2f} s: {self.why}"
        top = self.worst(1)
        worst = f"; the largest {self.metric} {float(top[0]['gap']):.3g} at {top[0]['operator']}" if top else ""
        return f"Inspector's calculate_numeric_gap: {len(self.operators)} operators in {self.seconds:.2f} s{worst}"


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


def numeric_gap(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, delegate: str,
                metric: str = "MSE") -> InspectorEvidence:
    """Export ``module`` on ``args`` with an ETRecord, run the program once recording an ETDump, and
    ask the Inspector for the gap per operator. Never raises for the Inspector's own failure (it is
    the evidence); the export's failure is BackendInitializationError (DF002)."""
    lowered = lower_to_file(module, args, path, delegate, "executorch", etrecord=True)
    program = load_program(path, etdump=True, debug_buffer_size=DEBUG_BUFFER_BYTES)
    program.run(list(args))
    etdump = program.write_etdump(path.with_suffix(".etdp"))
    start = time.perf_counter()
    try:
        from executorch.devtools import Inspector

        inspector = Inspector(etdump_path=str(etdump), etrecord=str(lowered.etrecord),
                              debug_buffer_path=str(etdump.with_suffix(".debug.bin")))
        table = inspector.calculate_numeric_gap(metric)
    except Exception as exc:  # noqa: BLE001 - the Inspector failing is what is reported
        return InspectorEvidence(False, time.perf_counter() - start, metric, why=f"{type(exc).__name__}: {exc}"[:500])
    seconds = time.perf_counter() - start
    column = next((c for c in ("aot_ops", "runtime_ops") if c in table.columns), None)
    rows: list[JsonObject] = [{"operator": _op_names(row[column]) if column else str(n), "gap": _gap_value(row["gap"])}
                              for n, (_, row) in enumerate(table.iterrows())]
    return InspectorEvidence(True, seconds, metric, rows)
