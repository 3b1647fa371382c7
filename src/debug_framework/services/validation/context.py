"""What every stage shares: the :class:`RunContext` of one run, the :class:`Stage` base class, and
:func:`call_backend`, the one way a stage calls into a backend (its failures read as the backend's,
bounded by the session's time limit). The stages themselves are in :mod:`.stages`."""

from __future__ import annotations

import contextlib
import hashlib
import operator
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from ...backends.base import Backend
from ...capture.keys import Capture
from ...errors import BackendRuntimeError, DebugFrameworkError
from ...jsonio import JsonObject, JsonValue
from .deadline import bounded
from .evidence import CheckpointEvidence, Evidence
from .judge import Verdict, judge
from .plan import ValidationPlan
from .results import ValidationResult
from ...models.session_config import SessionConfig
from ...storage.checkpoint_rows import METRICS_JSON_AT, EncodedRow

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ...modelio import LoadedModel, ModelInputs
    from ..drilldown.types import LayerDrilldown
    from ...models.debug_session import DebugSession
    from ...storage.database import Database

T = TypeVar("T")

#: the most checkpoint rows :meth:`RunContext.write_rows` writes in one transaction
ROWS_PER_WRITE = 2048

__all__ = ["RunContext", "Stage", "call_backend", "StepInputs", "Prebuilt", "WeightsChangedError", "own",
           "EvidenceState", "evidence_state"]


@dataclass(frozen=True)
class StepInputs:
    """What the reference gave every layer at decode step ``step`` (the first divergent one), kept by
    the decode stage for the drill-down: ``hidden`` layer -> its input at the step (batch, 1,
    hidden), ``past`` layer -> its keys and values before the step (each batch, length, kv_heads,
    head_dim; empty where the reference does not expose its cache) and ``tokens`` (batch, steps)."""

    step: int
    tokens: np.ndarray
    hidden: dict[int, torch.Tensor]
    past: dict[int, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Prebuilt:
    """What ``create_session`` built for a session in this process, handed to its run: the loaded
    model, the inputs, the plan and the backends, none loaded, read back or resolved again."""

    session_id: str
    model: LoadedModel
    inputs: ModelInputs
    plan: ValidationPlan
    reference: Backend
    alternative: Backend
    calibrator: Backend | None  #: the trusted implementation, where calibration or oracle mode needs one


@dataclass
class RunContext:
    """Everything one validation run shares between its stages.

    The first fields are given by the engine (``config``: the session's configuration, validated
    once); the rest are filled by the stages in order (a stage reads only what an earlier stage wrote).
    """

    session: DebugSession
    db: Database
    database_path: Path
    framework_config: Mapping[str, object]
    config: SessionConfig = field(default_factory=SessionConfig)
    started: float = field(default_factory=time.perf_counter)
    performance: dict[str, object] = field(default_factory=dict)
    # load
    plan: ValidationPlan = field(init=False)
    model: LoadedModel = field(init=False)
    inputs: ModelInputs = field(init=False)
    # prepare
    reference: Backend = field(init=False)
    alternative: Backend = field(init=False)
    prepare_s: dict[str, float] = field(default_factory=dict)
    isolating: bool = False
    calibrator: Backend | None = None  # the trusted implementation at the alternative's precision
    # reference / alternative
    captures: dict[str, Capture] = field(default_factory=dict)
    # compare and after: what was measured, and what the judge decided of it
    evidence: Evidence = field(default_factory=Evidence)
    verdict: Verdict | None = None
    oracle_report: JsonObject | None = None
    noise: JsonObject | None = None
    recordings: str | None = None
    drilldown: list[LayerDrilldown] | None = None  # the drill-down stage's, one per drilled layer
    decode: JsonObject | None = None  # the decode stage's: steps, tokens, KV-cache rows, seconds per step
    decode_inputs: StepInputs | None = None  # the decode stage's, for a drill-down at the first divergent step
    result: ValidationResult | None = None
    #: built before the run (``create_session`` in the same process): reused, not built again
    prebuilt: Prebuilt | None = None
    #: the engine's ``(layers done, layers)`` report for the stage in progress (None: not asked for)
    layer_progress: Callable[[int, int], None] | None = None
    #: a digest of each checkpoint row as last written, by (checkpoint, layer, step) (:meth:`write_rows`)
    written_rows: dict[tuple[JsonValue, JsonValue, JsonValue], bytes] = field(default_factory=dict)
    #: ``(role, backend name)`` of every backend given the loaded weights themselves to read
    #: (:func:`~debug_framework.backends.capabilities.reads_loaded_weights`): who could have written them
    weight_readers: list[tuple[str, str]] = field(default_factory=list)
    #: what :meth:`judge` last judged (:func:`evidence_state`), beside :attr:`verdict`
    judged_state: EvidenceState | None = field(default=None, repr=False)

    def prepare_backend(self, backend: Backend, role: str, dtype: str | None, device: str = "cpu") -> float:
        """Prepare ``backend`` for this run's model in ``role`` (``reference``, ``calibration`` ...):
        the one way a stage builds a backend. A backend that only reads its weights is given the
        loaded model; any other a fork with weights of its own, so that a backend changing its
        weights in place (fusing, folding, quantizing) changes no other backend's. Any role but the
        alternative counts sliding windows as the alternative does (``count_windows_as``). Returns
        the seconds it took."""
        from ...backends.capabilities import count_windows_as, model_for, reads_loaded_weights

        model = model_for(backend, self.model)
        if reads_loaded_weights(backend) and (role, backend.name) not in self.weight_readers:
            self.weight_readers.append((role, backend.name))
        started = time.perf_counter()
        call_backend(backend, "prepare()", lambda: backend.prepare(model, dtype, device))
        alternative = getattr(self, "alternative", None)
        if role != "alternative" and alternative is not None and alternative is not backend:
            count_windows_as(backend, alternative)
        return time.perf_counter() - started

    def check_weights(self) -> None:
        """The guard of the shared weights, run before a verdict is kept: the loaded weights the
        references read must still hash to the digest recorded when the session was created. Where
        they do not, a backend wrote into them and every comparison with them is void: raised as
        :class:`WeightsChangedError` (an internal error, exit 3 from a CLI), naming the backends that
        were given them and the tensors that changed."""
        weights = getattr(self, "model", None)
        weights = getattr(weights, "weights", None)
        if not self.weight_readers or not callable(getattr(weights, "changed", None)):
            return
        changed = weights.changed(self.session.weights_digest or None)
        if not changed:
            return
        readers = ", ".join(f"{name!r} ({role})" for role, name in self.weight_readers)
        who = "by the only backend given them" if len(self.weight_readers) == 1 else "by one of the backends given them"
        raise WeightsChangedError(
            f"the loaded weights changed during session {self.session.session_id}, written {who}: {readers}; "
            f"changed: {', '.join(changed)}. No verdict is kept: the reference and the calibration read them")

    def layers_done(self, done: int, total: int | None = None) -> None:
        """Report that the stage in progress got through ``done`` of ``total`` layers (default:
        the model's)."""
        if self.layer_progress is not None:
            if total is None:
                total = int(getattr(self.model, "num_layers", 0) or 0)
            self.layer_progress(min(done, total) if total else done, total)

    @property
    def positions(self) -> np.ndarray | None:
        """The model positions every comparison of this run judges (``ModelInputs.positions``:
        padded positions left out), or None when nothing is padded."""
        return self.inputs.positions()

    @property
    def reference_capture(self) -> Capture:
        return self.captures["reference"]

    @property
    def alternative_capture(self) -> Capture:
        return self.captures["alternative"]

    def judge(self) -> Verdict:
        """Judge the evidence as it stands (:func:`.judge.judge`); kept as :attr:`verdict`. The judge
        is pure, so where the evidence is still what it last judged (:func:`evidence_state`: the same
        objects, none added, replaced or taken away) that verdict is the answer, not judged again: a
        decode's evidence is judged once at the end of its stage, and the store stage writes that
        verdict (a long decode's evidence is thousands of checkpoints)."""
        state = evidence_state(self.evidence, self.plan)
        if self.verdict is None or self.judged_state is None or not self.judged_state.same_as(state):
            self.verdict = judge(self.evidence, self.plan)
        self.judged_state = state
        return self.verdict

    def current_result(self) -> ValidationResult:
        """The evidence so far as the judge decides it, as the typed result record."""
        session, plan = self.session, self.plan
        return ValidationResult.assemble(
            self.evidence, self.judge(),
            session_id=session.session_id, model_path=session.model_path,
            reference_backend=session.reference_backend, alternative_backend=session.alternative_backend,
            reference_dtype=plan.reference_dtype, alternative_dtype=plan.alternative_dtype,
            alternative_options=dict(plan.config.alternative_options),
            oracle=self.oracle_report, noise_floor=self.noise, performance=self.performance,
            recordings=self.recordings, drilldown=self.drilldown, decode=self.decode,
            inspector=self.engine_inspector())

    def engine_inspector(self) -> JsonObject | None:
        """The alternative engine's own numerical evidence (``inspector_record()``, where it has one:
        a .pte engine's Inspector), kept in the result as ``inspector``; None where it gives none."""
        record = getattr(getattr(self, "alternative", None), "inspector_record", None)
        return record() if callable(record) else None

    def rows(self) -> list[JsonObject]:
        """The checkpoint rows as they stand now, judged."""
        return [r.to_row() for r in self.current_result().results]

    def write_rows(self, result: ValidationResult | None = None) -> int:
        """Write the checkpoint rows (``result``'s, else judged now) that are not in the database
        as they are: each row is written once, when the evidence about it is complete (the store
        stage) or the run stops (:meth:`rows_kept_on_failure`), at most :data:`ROWS_PER_WRITE` at a
        time (a long decode's rows are not all held as dicts at once). Returns how many went in."""
        count = 0
        store, sid = self.db.checkpoints, self.session.session_id
        results = iter((result or self.current_result()).results)
        while chunk := list(islice(results, ROWS_PER_WRITE)):
            rows = [r.to_row() for r in chunk]
            fresh: list[tuple[tuple[JsonValue, JsonValue, JsonValue], bytes, EncodedRow]] = []
            # encoded once: the row's stored text (the whole row, keys sorted) is what tells it apart
            for row, values in zip(rows, store.encode_many(sid, rows)):
                place = (row.get("checkpoint"), row.get("layer"), row.get("step"))
                digest = hashlib.sha256(str(values[METRICS_JSON_AT]).encode()).digest()  # OpenSSL's: the fastest here
                if self.written_rows.get(place) != digest:
                    fresh.append((place, digest, values))
            if fresh:  # a row counts as written once its transaction is in
                count += store.add_encoded(sid, [values for _, _, values in fresh])
                self.written_rows.update((place, digest) for place, digest, _ in fresh)
        return count

    @contextlib.contextmanager
    def rows_kept_on_failure(self) -> Iterator[None]:
        """Around the stages: where one fails (or the run is interrupted), the rows measured so far
        are written, judged, before the error goes on, so nothing compared is lost; never where the
        weights the references read changed (no verdict of that run is kept)."""
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, WeightsChangedError) and self.evidence.checkpoints and hasattr(self, "plan"):
                try:
                    self.write_rows()
                except Exception:  # noqa: BLE001 - the stage's error is the one to report
                    pass
            raise


class Stage:
    """One step of a validation.

    Attributes:
        name: the label of its progress report.
        timing_key: where its wall time goes in the performance summary (None: not timed apart).
        captures: see the attribute.
    """

    name: ClassVar[str] = "stage"
    timing_key: ClassVar[str | None] = None
    #: its forward passes' checkpoints are kept for later stages: captured within the run's
    #: capture budget (spilled to disk beyond it), and their layers reported as progress
    captures: ClassVar[bool] = False
    #: it reads the alternative's hidden states (checkpoint tensors): not a stage of a session whose
    #: alternative gives out only token log-probabilities (a served model, ``alternative_endpoint``)
    reads_hidden_states: ClassVar[bool] = True

    def applies(self, config: SessionConfig) -> bool:
        """Whether this stage belongs to a session with this (validated) configuration: decided
        before the run, so progress knows its total."""
        return True

    def runs_in(self, config: SessionConfig) -> bool:
        """:meth:`applies`, and where the alternative gives out only token log-probabilities (a
        served model) only a stage that reads no hidden state: what the engine runs."""
        return self.applies(config) and not (self.reads_hidden_states and config.alternative_endpoint is not None)

    def ready(self, ctx: RunContext) -> bool:
        """Whether there is work for it in this run, decided when its turn comes (False: the engine
        reports its progress step but neither times it nor persists rows after it)."""
        return True

    def run(self, ctx: RunContext) -> None:
        """Do this stage's work on ``ctx``."""
        raise NotImplementedError


#: the slots of a checkpoint's evidence, read at once (:func:`evidence_state`)
_CHECKPOINT_SLOTS = operator.attrgetter(*CheckpointEvidence.__slots__)


@dataclass(frozen=True)
class EvidenceState:
    """What :func:`evidence_state` saw: ``objects`` compared by identity, ``shape`` (the lengths and
    keys of the containers they came from) by equality."""

    objects: list[object]
    shape: tuple[object, ...]

    def same_as(self, other: EvidenceState) -> bool:
        """Whether ``other`` saw the very objects this one saw, in the same places."""
        return self.shape == other.shape and len(self.objects) == len(other.objects) \
            and all(map(operator.is_, self.objects, other.objects))


def evidence_state(evidence: Evidence, plan: ValidationPlan) -> EvidenceState:
    """What the judge reads of ``evidence`` and ``plan``, as objects: the evidence record and the plan,
    each field of the evidence, each member of its lists, each slot of every checkpoint's evidence,
    each field of every layer's and each block replayed at a decode step. Stages add evidence and
    replace what they change (a field set anew, a list appended to); they never edit a measured
    object in place, so where two states are :meth:`EvidenceState.same_as` each other the judge
    reads the same evidence (:meth:`RunContext.judge`). Linear in the evidence, with no call per
    checkpoint into Python code: a small fraction of a judgement."""
    objects: list[object] = [evidence, plan]
    shape: list[object] = []
    for f in fields(evidence):
        value = getattr(evidence, f.name)
        objects.append(value)
        if isinstance(value, list):
            objects.extend(value)
            shape.append(len(value))
    objects.extend(chain.from_iterable(map(_CHECKPOINT_SLOTS, evidence.checkpoints)))
    for layer in evidence.layers or ():
        objects.extend(getattr(layer, f.name) for f in fields(layer))
    if evidence.decode_replay is not None:
        step, blocks = evidence.decode_replay
        shape += [step, tuple(blocks)]
        objects.extend(blocks.values())
    return EvidenceState(objects, tuple(shape))


class WeightsChangedError(RuntimeError):
    """The loaded weights no longer hash to the digest recorded when the session was created: a
    backend given them to read wrote into them (:meth:`RunContext.check_weights`). An internal
    error, never a verdict."""


def own(value: T) -> T:
    """A copy of ``value`` for one backend call, so that a backend writing into what it is given (an
    in-place residual add on a replayed layer's input) changes nothing another backend or the judge
    reads: tensors cloned with their strides, arrays copied, :class:`ModelInputs` copied whole;
    anything else as it is."""
    import numpy as np

    from ...modelio.inputs import ModelInputs

    if isinstance(value, (np.ndarray, ModelInputs)):
        return value.copy()
    clone = getattr(value, "clone", None)
    if callable(clone) and hasattr(value, "stride"):  # a torch tensor (preserve_format keeps its strides)
        return clone()
    return value


def call_backend(backend: Backend, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, a call into ``backend``: an exception that is not a framework error becomes
    ``BackendRuntimeError`` (DF005) naming the backend and the call, so a backend failing mid-run reads
    as the backend's failure, while an exception from the stages' own code stays what it is (a bug
    of ours: exit 3 from a CLI)."""
    try:
        return bounded(fn)  # interrupted at the session's time limit (deadline.py)
    except DebugFrameworkError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the backend raised, kept as the cause
        raise BackendRuntimeError.from_exception(backend.name, what, exc) from exc
