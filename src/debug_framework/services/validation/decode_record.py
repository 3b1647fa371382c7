"""The decode part of a validation result as typed records (``ValidationResult.decode`` is its JSON).

:meth:`DecodeRecord.from_dict` reads the ``decode`` object a result carries and stores (documented
in docs/validation.md, "Decode steps"): the token metrics of each pass with their judgement, the
KV cache's rows with each part's judgement, the first divergent token and the replays at the first
divergent decode step. Every view (terminal, HTML, dashboard) reads these attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...jsonio import JsonObject, JsonValue, as_float

__all__ = ["DecodeRecord", "TokenRow", "KVRow", "KVPart", "FirstToken", "StepReplay", "StepIsolation",
           "PrefillEquivalence"]


def _int(value: JsonValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: JsonValue) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


def _object(value: JsonValue) -> Mapping[str, JsonValue]:
    return value if isinstance(value, Mapping) else {}


def _objects(value: JsonValue) -> list[Mapping[str, JsonValue]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


@dataclass(frozen=True)
class TokenRow:
    """One pass's next-token metrics (step 0: the prefill) and their judgement (None: not judged).

    ``bound`` is the mean KL divergence's bound (``margin`` = kl_mean / bound); ``failed_by`` names
    the metrics that failed the pass: ``"top1"`` (more top-1 tokens flipped beyond noise than a
    correct run flips; the KL may be within its bound) and/or ``"kl_divergence"`` (the mean KL
    beyond ``bound``); empty where the pass passed or was not judged."""

    step: int
    kl_mean: float | None = None
    top1_agreement: float | None = None
    topk_overlap: float | None = None
    passed: bool | None = None
    margin: float | None = None
    reason: str | None = None
    bound: float | None = None
    failed_by: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> TokenRow:
        return cls(step=_int(d.get("step")) or 0, kl_mean=as_float(_object(d.get("kl_divergence")).get("mean")),
                   top1_agreement=as_float(d.get("top1_agreement")), topk_overlap=as_float(d.get("topk_overlap")),
                   passed=_bool(d.get("passed")), margin=as_float(d.get("margin")), reason=_str(d.get("reason")),
                   bound=as_float(d.get("bound")),
                   failed_by=tuple(str(m) for m in failed) if isinstance(failed := d.get("failed_by"), list) else ())


@dataclass(frozen=True)
class KVPart:
    """The K or the V of one layer's cache after one pass: its margin and verdict (None: not judged)."""

    margin: float | None = None
    passed: bool | None = None


@dataclass(frozen=True)
class KVRow:
    """One layer's KV cache after one pass."""

    step: int
    layer: int
    k: KVPart | None = None
    v: KVPart | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> KVRow | None:
        step, layer = _int(d.get("step")), _int(d.get("layer"))
        if step is None or layer is None:
            return None

        def part(name: str) -> KVPart | None:
            p = d.get(name)
            return None if not isinstance(p, Mapping) else KVPart(as_float(p.get("margin")), _bool(p.get("passed")))

        return cls(step, layer, part("k"), part("v"))


@dataclass(frozen=True)
class FirstToken:
    """The first pass whose top-1 token differs beyond a near tie."""

    step: int
    index: JsonValue
    alternative_token: JsonValue
    reference_token: JsonValue
    reference_gap: float | None

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> FirstToken:
        return cls(_int(d.get("step")) or 0, d.get("index"), d.get("alternative_token"), d.get("reference_token"),
                   as_float(d.get("reference_gap")))


@dataclass(frozen=True)
class StepReplay:
    """A layer failing at the first divergent decode step, replayed there on the reference's input."""

    layer: int | None
    checkpoint: str
    introduces: bool
    margin: float | None = None

    @property
    def block(self) -> str:
        """The block replayed: ``attention`` (ends at post_attention) or the whole ``layer``."""
        return "attention" if self.checkpoint.startswith("post_attention") else "layer"


@dataclass(frozen=True)
class StepIsolation:
    """The replays at the first divergent decode step."""

    step: int | None
    layers: tuple[StepReplay, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> StepIsolation:
        return cls(_int(d.get("step")), tuple(
            StepReplay(_int(r.get("layer")), str(r.get("checkpoint") or ""), bool(r.get("introduces")),
                       as_float(r.get("margin"))) for r in _objects(d.get("layers"))))


@dataclass(frozen=True)
class PrefillEquivalence:
    """Where a long decode's failure starts (``decode["prefill_equivalence"]``): at the first failing
    decode ``step``, the same tokens replayed as one prefill by the alternative, measured at
    ``checkpoint`` against the reference's decode step. ``finding`` is ``"cache"`` (the prefill is
    within the step's bound: the decode's cache is wrong), ``"accumulation"`` (it diverges too: the
    computation at that length is) or None where it could not run (``note`` says why)."""

    step: int
    checkpoint: str
    finding: str | None
    explanation: str | None = None
    decode_error: float | None = None
    prefill_error: float | None = None
    bound: float | None = None
    metric: str | None = None
    note: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> PrefillEquivalence:
        return cls(_int(d.get("step")) or 0, str(d.get("checkpoint") or ""), _str(d.get("finding")),
                   _str(d.get("explanation")), as_float(d.get("decode_error")), as_float(d.get("prefill_error")),
                   as_float(d.get("bound")), _str(d.get("metric")), _str(d.get("note")))

    def text(self) -> str:
        """One line a person reads: the finding and its measurements, or why there is none."""
        if self.finding is None:
            return f"prefill equivalence at decode step {self.step}: not measured ({self.note or 'no replay'})"
        figures = "" if self.prefill_error is None or self.decode_error is None or self.bound is None else (
            f" ({self.metric or 'error'} decode {self.decode_error:.3g}, one prefill {self.prefill_error:.3g}, "
            f"bound {self.bound:.3g})")
        return f"prefill equivalence at decode step {self.step} ({self.finding}): {self.explanation}{figures}"


@dataclass(frozen=True)
class DecodeRecord:
    """A validation's decode steps: what each view shows of them."""

    token_metrics: tuple[TokenRow, ...] = ()
    kv_cache: tuple[KVRow, ...] = ()
    first_divergent_token: FirstToken | None = None
    isolation: StepIsolation | None = None
    prefill_equivalence: PrefillEquivalence | None = None
    #: the rest of the decode object (steps, tokens, tokens_from, seconds_per_step, ...)
    info: JsonObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> DecodeRecord:
        """The record of a result's ``decode`` object."""
        first, iso, equal = d.get("first_divergent_token"), d.get("isolation"), d.get("prefill_equivalence")
        kv = (KVRow.from_dict(r) for r in _objects(d.get("kv_cache")))
        return cls(token_metrics=tuple(TokenRow.from_dict(t) for t in _objects(d.get("token_metrics"))
                                       if _int(t.get("step")) is not None),
                   kv_cache=tuple(r for r in kv if r is not None),
                   first_divergent_token=FirstToken.from_dict(first) if isinstance(first, Mapping) else None,
                   isolation=StepIsolation.from_dict(iso) if isinstance(iso, Mapping) else None,
                   prefill_equivalence=PrefillEquivalence.from_dict(equal) if isinstance(equal, Mapping) else None,
                   info={k: v for k, v in d.items() if k not in ("token_metrics", "kv_cache", "first_divergent_token",
                                                                 "isolation", "prefill_equivalence")})
