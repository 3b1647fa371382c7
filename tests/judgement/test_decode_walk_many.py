"""DecodeWalk.step_many: the steps of one reference pass judged together record exactly what judging
them one at a time records (every evidence object's values, the KV and token rows, the carried
noise, the first failing step, the pass kept for the replays), with and without stopping at the
first failing step: a KV write bug late in a batch, a checkpoint bug in the middle of one, left
padding, a sliding window, and calibration-sampled steps (1, 2, 4, 8, 16) inside the batches."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from debug_framework.backends.decode import DecodePass
from debug_framework.services.validation import decode_stage
from debug_framework.services.validation.context import RunContext
from debug_framework.services.validation.decode_calibration import CalibrationPasses
from debug_framework.services.validation.decode_walk import DecodeWalk
from debug_framework.services.validation.evidence import CheckpointEvidence, KVEvidence, TokenEvidence

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_kv_engine import PagedLlamaEngine  # noqa: E402

from benchmarks.injected_bugs import BUG_LAYER  # noqa: E402

#: the batches the reference's passes of several steps give (CHUNK_STEPS)
BATCH = 8
#: the decode step from which the KV write goes off by one: late in the second batch (9..16)
KV_FROM = 11
#: the decode step from which positions rotate one too far: the middle of the first batch (1..8)
ROPE_FROM = 5
BASE = {"isolate": False, "precision_diagnosis": False, "input_shape": [2, 8], "pad_lengths": [0, 2],
        "padding_side": "left"}


class KVWriteOffByOne(PagedLlamaEngine):
    """Layer ``BUG_LAYER`` writes a decoded token's key and value over the previous slot from step
    :data:`KV_FROM` on (the new slot left as the pages held it)."""

    def _write(self, layer: int, row: int, k: np.ndarray, v: np.ndarray) -> None:
        if layer == BUG_LAYER and k.shape[0] == 1 and self.lengths[row] >= self._held0[row] + KV_FROM - 1:
            self.lengths[row] -= 1
            super()._write(layer, row, k, v)
            self.lengths[row] += 1
        super()._write(layer, row, k, v)

    def prefill(self, inputs, keys):  # type: ignore[no-untyped-def]
        got = super().prefill(inputs, keys)
        self._held0 = list(self.lengths)
        return got


class RotatedTooFar(PagedLlamaEngine):
    """Every position from the one decode step :data:`ROPE_FROM` takes rotated one too far."""

    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions)
        return super()._rotate(x, np.where(positions >= 8 + ROPE_FROM - 1, positions + 1, positions))


@dataclass
class Recorded:
    """One session's decode as its walk saw it: the context, the steps asked for, the evidence
    before the decode, the passes handed to the walk and the calibration's passes by step."""

    ctx: RunContext
    steps: int
    before: tuple[list[CheckpointEvidence], list[KVEvidence], list[TokenEvidence]]
    passes: list[tuple[DecodePass, DecodePass]] = field(default_factory=list)
    calibration: dict[int, DecodePass | None] = field(default_factory=dict)
    calibration_name: str | None = None


class Replayed:
    """The calibration's passes the session computed, given back by step (no prefill run again;
    a step the session did not ask for raises)."""

    def __init__(self, held: dict[int, DecodePass | None], name: str) -> None:
        self.held, self.name = held, name
        self.runs: list[tuple[int, int, float, str]] = []

    def ran_at(self, step: int) -> bool:
        return step in self.held

    def at(self, step: int, why: str = "sampled") -> DecodePass | None:
        return self.held[step]


def _record(engine, model: Path, cfg: dict[str, object], reference: str, alternative: str,
            monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """One session run (the reference in this process), what its walk was handed recorded."""
    got: list[Recorded] = []
    init, many, at = DecodeWalk.__init__, DecodeWalk.step_many, CalibrationPasses.at

    def recording_init(self, ctx, steps, calibration):  # type: ignore[no-untyped-def]
        init(self, ctx, steps, calibration)
        ev = ctx.evidence
        got.append(Recorded(ctx, steps, (list(ev.checkpoints), list(ev.kv_cache), list(ev.token_metrics)),
                            calibration_name=None if calibration is None else calibration.name))

    def recording_many(self, pairs, stop):  # type: ignore[no-untyped-def]
        got[-1].passes.extend(pairs)
        return many(self, pairs, stop)

    def recording_at(self, s, why="sampled"):  # type: ignore[no-untyped-def]
        got[-1].calibration[s] = p = at(self, s, why)
        return p

    monkeypatch.setattr(DecodeWalk, "__init__", recording_init)
    monkeypatch.setattr(DecodeWalk, "step_many", recording_many)
    monkeypatch.setattr(CalibrationPasses, "at", recording_at)
    monkeypatch.setattr(decode_stage, "ahead_support", lambda *a: (False, "off"))
    engine.run(engine.create_session(model, cfg, reference, alternative))
    monkeypatch.undo()
    return got[0]


def _fresh(rec: Recorded) -> DecodeWalk:
    ev = rec.ctx.evidence
    ev.checkpoints, ev.kv_cache, ev.token_metrics = (list(x) for x in rec.before)
    cal = None if rec.calibration_name is None else Replayed(rec.calibration, rec.calibration_name)
    return DecodeWalk(rec.ctx, rec.steps, cal)  # type: ignore[arg-type]


def _one_at_a_time(rec: Recorded, stop: bool) -> tuple[list[bool], str]:
    walk, flags = _fresh(rec), []
    for r, a in rec.passes:
        flags.append(walk.step(r, a))
        if flags[-1] and stop:
            break
    return flags, _what_it_recorded(walk)


def _together(rec: Recorded, stop: bool) -> tuple[list[bool], str]:
    """The prefill alone, then the decode steps in batches of :data:`BATCH`."""
    walk = _fresh(rec)
    flags = [walk.step(*rec.passes[0])]
    for i in range(1, len(rec.passes), BATCH):
        batch = rec.passes[i:i + BATCH]
        got = walk.step_many(batch, stop)
        flags += got
        assert len(got) == len(batch) or (stop and got[-1])
        if stop and any(got):
            break
    return flags, _what_it_recorded(walk)


def _what_it_recorded(walk: DecodeWalk) -> str:
    """Everything the walk recorded, as text (every float's repr: equal texts, equal values)."""
    ev, carry = walk.ctx.evidence, walk.carry
    kept = None
    if walk.kept is not None:
        s = walk.first_failed
        assert s is not None
        before = walk.kept.kv_cache[s - 1]
        kept = (id(walk.kept.captures[s]), {i: [t.tolist() if isinstance(t, np.ndarray) else torch.as_tensor(t).tolist()
                                                for t in kv] for i, kv in before.items()})
    return repr((ev.checkpoints, ev.kv_cache, ev.token_metrics, json.dumps([walk.kv_rows, walk.token_rows]),
                 walk.first_failed, kept, carry.record(walk.steps, None), sorted(carry.last.items(), key=repr),
                 walk.seconds_per_step()))


def _same_either_way(rec: Recorded) -> list[bool]:
    for stop in (False, True):
        flags, alone = _one_at_a_time(rec, stop)
        flags_many, together = _together(rec, stop)
        assert flags_many == flags
        assert together == alone
    return _one_at_a_time(rec, False)[0]


@pytest.mark.slow  # three short decodes recorded, each walked four times
@pytest.mark.parametrize("case", ["kv_write", "rotary", "sliding_window"])
def test_steps_judged_together_record_what_steps_judged_alone_do(case, tiny_models, engine, engines, monkeypatch):
    if case == "kv_write":
        rec = _record(engine, tiny_models("llama", 0), {**BASE, "decode_steps": 14}, "float64_eager",
                      engines("paged_kv_write_from_11", KVWriteOffByOne), monkeypatch)
        want = KV_FROM
    elif case == "rotary":
        rec = _record(engine, tiny_models("llama", 0), {**BASE, "decode_steps": 10}, "float64_eager",
                      engines("paged_rotated_from_5", RotatedTooFar), monkeypatch)
        want = ROPE_FROM
    else:  # Mistral's window (4) is shorter than the prompt: transformers' cache evicts, the reference keeps all
        rec = _record(engine, tiny_models("mistral", 0), {**BASE, "decode_steps": 10}, "float64_eager", "pytorch",
                      monkeypatch)
        want = None
    assert rec.calibration_name is not None and {1, 2, 4, 8} <= set(rec.calibration)  # sampled inside a batch
    flags = _same_either_way(rec)
    assert (flags.index(True) if any(flags) else None) == want


class OldEntryShownWrong(PagedLlamaEngine):
    """Computes right, but the cache it shows (``kv_cache``) holds layer ``BUG_LAYER``'s key of the
    prompt's last position wrong from decode step 2 on: only a whole cache (an audit) sees it."""

    def prefill(self, inputs, keys):  # type: ignore[no-untyped-def]
        self.decoded = 0
        return super().prefill(inputs, keys)

    def decode_step(self, tokens, positions, keys):  # type: ignore[no-untyped-def]
        self.decoded += 1
        return super().decode_step(tokens, positions, keys)

    def kv_cache(self):  # type: ignore[no-untyped-def]
        got = super().kv_cache()
        if self.decoded >= 2:
            k, v = got[BUG_LAYER]
            k = np.array(k, copy=True)
            k[:, BASE["input_shape"][1] - 1] += 1.0  # type: ignore[index]
            got[BUG_LAYER] = (k, v)
        return got


def test_a_whole_cache_is_measured_with_the_steps_and_compared_in_full_where_it_fails(tiny_models, engine, engines,
                                                                                    monkeypatch):
    from debug_framework.services.validation.judge import kv_passes

    rec = _record(engine, tiny_models("llama", 0), {**BASE, "decode_steps": 3, "calibrate": False}, "float64_eager",
                  engines("paged_old_entry_shown_wrong", OldEntryShownWrong), monkeypatch)
    walk = _fresh(rec)
    walk.step_many(rec.passes, False)
    audit = {(e.layer, e.part): e for e in walk.ctx.evidence.kv_cache if e.step == 3}  # the last step: audited
    rows = {r["layer"]: r for r in walk.kv_rows if r["step"] == 3}
    assert all(r["compared"] == "whole cache (audit)" for r in rows.values())
    bad = audit[(BUG_LAYER, "k")]
    assert not kv_passes(bad, rec.ctx.plan) and bad.comparison.worst  # in full: its worst elements
    assert bad.comparison.worst[0].index[1] == BASE["input_shape"][1] - 1  # type: ignore[index]
    good = audit[(BUG_LAYER, "v")]  # measured in the vectorised pass alone, told against the whole cache
    assert kv_passes(good, rec.ctx.plan) and good.comparison.ulp_dtype is None and bad.comparison.ulp_dtype
    assert good.comparison.masked_positions == bad.comparison.masked_positions == 2  # the second row's padding
    assert good.comparison.reference_shape == bad.comparison.reference_shape
