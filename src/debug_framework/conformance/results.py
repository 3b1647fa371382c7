"""The records of a conformance sweep (torch-free): one :class:`OpResult` per operator, one
:class:`SweepResult` per sweep, their JSON and their JUnit XML."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from ..jsonio import JsonObject

__all__ = ["OpResult", "SweepResult", "FAILING", "render_junit"]

#: The verdicts that fail a sweep (exit 1).
FAILING = ("fail", "error", "crash", "hang")


@dataclass
class OpResult:
    """One operator of a sweep: its verdict over every sample and dtype, and its worst sample."""

    op: str
    verdict: str
    pass_rate: float | None = None
    reason: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    worst: JsonObject | None = None
    repro: str | None = None
    repro_verified: bool = False
    seconds: float = 0.0

    @property
    def passed(self) -> bool | None:
        """True for ``pass``, False for a failing verdict, None when not judged (skipped, unsupported)."""
        if self.verdict == "pass":
            return True
        return False if self.verdict in FAILING else None

    def to_dict(self) -> JsonObject:
        """The operator's record (a stored row, the JSON output's entry)."""
        return {"op": self.op, "passed": self.passed, "verdict": self.verdict, "pass_rate": self.pass_rate,
                "reason": self.reason, "counts": dict(self.counts), "worst": self.worst, "repro": self.repro,
                "repro_verified": self.repro_verified, "seconds": self.seconds}

    @classmethod
    def from_row(cls, row: JsonObject) -> OpResult:
        """From a stored ``op_sweep_results`` row."""
        rate, reason, counts, worst, repro = (row.get(k) for k in ("pass_rate", "reason", "counts", "worst", "repro"))
        seconds = row.get("seconds")
        return cls(str(row["op"]), str(row["verdict"]), float(rate) if isinstance(rate, int | float) else None,
                   None if reason is None else str(reason),
                   {str(k): int(v) for k, v in counts.items() if isinstance(v, int | float)}
                   if isinstance(counts, dict) else {},
                   worst if isinstance(worst, dict) else None, None if repro is None else str(repro),
                   bool(row.get("repro_verified")), float(seconds) if isinstance(seconds, int | float) else 0.0)


@dataclass
class SweepResult:
    """A sweep: its key, what it swept, and every operator's result (stored ones included)."""

    sweep_key: str
    backend: str
    device: str
    dtypes: list[str]
    ops: list[OpResult]
    seconds: float = 0.0
    resumed: int = 0  # operators read back from the database, not run again
    worker_restarts: int = 0
    #: selected operators not reached (the sweep's time budget ran out): a later run resumes them
    left: int = 0

    @property
    def failing(self) -> list[OpResult]:
        return [o for o in self.ops if o.passed is False]

    @property
    def passed(self) -> bool:
        return not self.failing

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.ops if o.verdict == verdict)

    def samples(self, key: str) -> int:
        """Samples over every operator with count ``key`` (``samples``: all; a status; ``widened_by_noise``)."""
        return sum(int(o.counts.get(key, 0)) for o in self.ops)

    def to_dict(self) -> JsonObject:
        """The sweep as ``debug_opsweep --json`` prints it."""
        verdicts: JsonObject = {v: self.count(v) for v in ("pass", "fail", "error", "crash", "hang", "unsupported", "skipped")}
        samples: JsonObject = {k: self.samples(k) for k in ("samples", "pass", *FAILING, "unsupported", "skipped",
                                                             "widened_by_noise")}
        samples["judged"] = sum(self.samples(k) for k in ("pass", *FAILING))
        return {"sweep_key": self.sweep_key, "backend": self.backend, "device": self.device, "dtypes": self.dtypes,
                "passed": self.passed, "seconds": self.seconds, "resumed": self.resumed,
                "worker_restarts": self.worker_restarts, "left": self.left, "verdicts": verdicts, "samples": samples,
                "failing": [o.op for o in self.failing], "operators": [o.to_dict() for o in self.ops]}


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: object) -> str:
    """``value`` as XML-safe text (characters XML cannot hold replaced)."""
    return _XML_BAD.sub("\ufffd", "" if value is None else str(value))


def _repro_line(o: OpResult) -> str:
    if o.repro:
        return o.repro
    error = (o.worst or {}).get("repro_error")
    return f"not written: {error}" if error else "-"


def render_junit(sweep: SweepResult) -> str:
    """JUnit XML: one ``<testcase>`` per operator; a failing one has ``<failure>`` (``fail``) or
    ``<error>`` (error, crash, hang) with the worst sample and the repro, one not judged ``<skipped>``."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name=_x(f"opsweep {sweep.backend} ({sweep.device})"),
                          tests=str(len(sweep.ops)), failures=str(sweep.count("fail")),
                          errors=str(sum(sweep.count(v) for v in ("error", "crash", "hang"))),
                          skipped=str(sweep.count("skipped") + sweep.count("unsupported")),
                          time=f"{sweep.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for name, value in (("sweep_key", sweep.sweep_key), ("backend", sweep.backend), ("device", sweep.device),
                        ("dtypes", ",".join(sweep.dtypes))):
        ET.SubElement(props, "property", name=name, value=_x(value))
    for o in sweep.ops:
        case = ET.SubElement(suite, "testcase", classname=_x(f"opsweep.{sweep.backend}"), name=_x(o.op),
                             time=f"{o.seconds:.3f}")
        worst = o.worst or {}
        text = _x(f"worst sample: {worst.get('source', '')} {worst.get('label', '')} {worst.get('dtype', '')}: "
                  f"{(worst.get('result') or {}).get('reason') or ''}\nrepro: {_repro_line(o)}")
        if o.verdict == "fail":
            ET.SubElement(case, "failure", type="NumericalMismatch", message=_x(o.reason)).text = text
        elif o.verdict in FAILING:
            ET.SubElement(case, "error", type=o.verdict, message=_x(o.reason)).text = text
        elif o.passed is None:
            ET.SubElement(case, "skipped", message=_x(f"{o.verdict}: {o.reason or ''}"))
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
