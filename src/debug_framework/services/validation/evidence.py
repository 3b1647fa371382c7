"""What a validation measured, before anything is judged.

The stages (:mod:`.stages`) only gather evidence: per checkpoint the comparison of the alternative
with the reference, the calibration run's own error there (the noise of a correct implementation
at the alternative's precision), the scale of the reference tensor and, in oracle mode, both runs
against the float64 oracle; per layer (isolation) each block of the alternative replayed on the
*reference's* input to that block, beside the calibration's replay of the same block. Nothing here
says pass or fail: :func:`.judge.judge` decides every verdict from this record alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ...capture.keys import CheckpointKey
from ...comparison import ComparisonResult, finite_rms
from ...comparison.next_token import TokenMetrics
from ...jsonio import JsonObject

__all__ = ["CheckpointEvidence", "OracleEvidence", "BlockEvidence", "LayerEvidence", "OracleSetup", "Evidence",
           "reference_scale", "BlockInput", "TokenEvidence"]

#: What a block replay was fed: ``"reference"``, the reference's own input to that block; or
#: ``"alternative"``, the alternative's own state (the MLP block run after the alternative's
#: attention, when the backend cannot run the MLP block alone).
BlockInput = Literal["reference", "alternative"]


def reference_scale(tensor: object) -> float:
    """RMS of a reference tensor's finite values: the scale of a bound's floor (NaN when absent)."""
    return math.nan if tensor is None else finite_rms(tensor)


@dataclass(frozen=True)
class OracleEvidence:
    """Both runs against the float64 oracle at one checkpoint: the baseline's error (the reference,
    or the calibration run when the reference is the oracle) and the alternative's."""

    baseline: ComparisonResult
    alternative: ComparisonResult
    oracle_rms: float


@dataclass(frozen=True)
class ExpertChoice:
    """The router's expert choice (the top ``k`` experts per token) of the alternative, and of the
    calibration run, against the reference's: how many tokens chose another set of experts."""

    top_k: int
    tokens: int
    differing: int
    first: int | None = None  #: the first token (flattened index) whose experts differ
    calibration_differing: int | None = None  #: the same count for a correct run at the alternative's precision


def expert_choice(reference: object, alternative: object, top_k: int, calibration: object = None) -> ExpertChoice | None:
    """Compare the experts two router-logit tensors ``[..., experts]`` choose (top ``top_k`` per
    token, as sets); None when the shapes differ or ``top_k`` is unknown."""
    import numpy as np

    from ...comparison import float64_array

    r, a = float64_array(reference), float64_array(alternative)
    if top_k <= 0 or r.shape != a.shape or r.ndim == 0 or r.shape[-1] < top_k:
        return None

    def chosen(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1])
        return np.sort(np.argsort(-flat, axis=-1, kind="stable")[:, :top_k], axis=-1)

    ref_choice = chosen(r)
    diff = np.any(chosen(a) != ref_choice, axis=-1)
    cal = None
    if calibration is not None:
        c = float64_array(calibration)
        if c.shape == r.shape:
            cal = int(np.any(chosen(c) != ref_choice, axis=-1).sum())
    where = np.flatnonzero(diff)
    return ExpertChoice(top_k, int(diff.size), int(diff.sum()), int(where[0]) if where.size else None, cal)


@dataclass(slots=True)
class CheckpointEvidence:
    """What was measured at one enabled checkpoint.

    Attributes:
        key: the checkpoint.
        comparison: the alternative against the reference (``passed`` there is the tolerance's
            allclose, a measurement the judge uses only for a checkpoint judged by a tolerance).
        reference_rms: the reference tensor's RMS (the floor's scale); NaN when a side has no tensor.
        noise: the calibration run against the reference (None: not calibrated).
        tolerance_margin: ``max |a - r| / (atol + rtol |r|)`` (None where not measured).
        oracle: both runs against the float64 oracle (oracle mode), else None.
        run_to_run: the noise floor stage's max |run1 - run2| per side.
        step: the decode step (None: the prefill pass).
        module: the module path of the checkpoint in the backend's model, where known.
        lower_precision: the precision stage's correct runs at lower precisions against the
            reference here, by dtype (``{"bfloat16": ...}``; None: not measured).
        expert_choice: at a ``router_logits`` checkpoint, the experts chosen (top-k of the logits)
            compared token by token: :class:`ExpertChoice`.
        perturbed: where the checkpoint exceeded its single-run bound, the noise rule's runs
            (:mod:`.noise_stage`): the trusted side (the calibration run, or the oracle mode's
            baseline) run again on inputs and weights perturbed within rounding, each against the
            same tensor its single run was compared with (the reference, or the oracle); else None.
    """

    key: CheckpointKey
    comparison: ComparisonResult
    reference_rms: float = math.nan
    noise: ComparisonResult | None = None
    tolerance_margin: float | None = None
    oracle: OracleEvidence | None = None
    run_to_run: dict[str, float] | None = None
    step: int | None = None
    module: str | None = None
    lower_precision: dict[str, ComparisonResult] | None = None
    expert_choice: ExpertChoice | None = None
    perturbed: tuple[ComparisonResult, ...] | None = None

    @property
    def present(self) -> bool:
        """Both sides produced a tensor (the comparison measured something)."""
        return not math.isnan(self.reference_rms)


@dataclass(frozen=True)
class BlockEvidence:
    """One block of one layer, replayed alone.

    Attributes:
        block: ``"attention"``, ``"mlp"``, or ``"layer"`` (the whole layer replayed on the
            reference's layer input, ending at ``post_mlp``).
        key: the checkpoint the block ends at.
        error: the alternative's replay against the reference's tensor at ``key``.
        noise: the calibration's replay of the same block on the same input against the reference.
        reference_rms: the reference tensor's RMS at ``key``.
        input: what the replay was fed (:data:`BlockInput`).
        perturbed: where the replay exceeded its single-run bound, the noise rule's replays of the
            calibration on weights and input perturbed within rounding (:mod:`.noise_stage`).
    """

    block: str
    key: CheckpointKey
    error: ComparisonResult
    noise: ComparisonResult | None
    reference_rms: float
    input: BlockInput = "reference"
    perturbed: tuple[ComparisonResult, ...] | None = None


@dataclass
class LayerEvidence:
    """Isolation of one layer: each block on the reference's input to it, the layer's carried-in
    error (its input in the full run) and total error (its output in the full run).

    ``mlp`` is None when the alternative cannot run the MLP block alone (``mlp_note`` says why);
    the judge then falls back on the whole-layer replay for the MLP, and only where the attention
    block is within its bound."""

    layer: int
    carried_in: ComparisonResult
    total: ComparisonResult | None
    attention: BlockEvidence | None
    mlp: BlockEvidence | None
    whole: BlockEvidence
    noise_in: ComparisonResult | None = None
    noise_out: ComparisonResult | None = None
    replay_s: float = 0.0
    mlp_note: str | None = None


@dataclass(frozen=True, slots=True)
class KVEvidence:
    """One layer's cached keys or values after one pass (step 0: the prefill), the alternative's
    against the reference's (padded positions left out), beside the calibration's (the noise)."""

    step: int
    layer: int
    part: str  #: "k" or "v"
    comparison: ComparisonResult
    noise: ComparisonResult | None
    reference_rms: float


@dataclass(frozen=True, slots=True)
class TokenEvidence:
    """The next-token distributions at one pass's logits (step 0: the prefill's token positions,
    padded ones left out; step s: each row's new token), the alternative's against the reference's
    beside the calibration's (a correct run at the alternative's precision; None: not calibrated).

    ``noise_max_abs`` is the calibration's largest logit error there and ``reference_rms`` the
    reference logits' RMS: the scale a near tie is measured against."""

    step: int
    alternative: TokenMetrics
    calibration: TokenMetrics | None
    noise_max_abs: float
    reference_rms: float


@dataclass(frozen=True)
class OracleSetup:
    """The oracle mode's rule: ``err(alt) <= multiplier x err(baseline) + floor`` against the oracle."""

    metric: str
    multiplier: float
    fixed_floor: float | None
    baseline: str


@dataclass
class Evidence:
    """Everything one validation measured, in model order; what the judge reads."""

    checkpoints: list[CheckpointEvidence] = field(default_factory=list)
    layers: list[LayerEvidence] | None = None
    isolation_note: str | None = None
    oracle: OracleSetup | None = None
    #: the precision stage's: which lower precisions a correct run was measured at, or why none
    precision_note: JsonObject | None = None
    #: the mark-all stage's comparison of every node output of an ONNX file (``MarkAllReport.to_dict``)
    mark_all: JsonObject | None = None
    #: the decode stage's: the KV cache per pass, layer and part
    kv_cache: list[KVEvidence] = field(default_factory=list)
    #: the decode stage's: the next-token distributions per pass (where the logits are captured)
    token_metrics: list[TokenEvidence] = field(default_factory=list)
    #: the layers failing at the first divergent decode step s, each replayed at that step on the
    #: reference's input (:mod:`.decode_replay`): ``(step, {layer: block evidence})``, or None with
    #: :attr:`decode_replay_note`
    decode_replay: tuple[int, dict[int, BlockEvidence]] | None = None
    decode_replay_note: str | None = None
    #: the served stage's: the endpoint of an alternative that gives out only token log-probabilities
    #: (a served model: its error is placed no deeper than the model it serves); None: not served
    served: str | None = None

    def at(self, key: CheckpointKey) -> CheckpointEvidence | None:
        """The evidence of checkpoint ``key`` (None when it is not enabled)."""
        return next((c for c in self.checkpoints if c.key == key), None)
