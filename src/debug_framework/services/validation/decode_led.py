"""A greedy decode led by the alternative (docs/validation.md, "Decode steps").

In a greedy decode both sides are fed the reference's choice of each next token, so the
reference's pass must come first, and a reference that computes several steps a pass needs a
draft to propose the tokens it has not chosen yet. Where the reference decodes in a process of its
own (:mod:`.decode_ahead`), the alternative leads instead: it decodes greedily, each token it
chooses sent to the reference's process (:class:`~.decode_ahead.FedTokens`), whose decode feeds
them, up to :data:`~debug_framework.backends.decode.CHUNK_STEPS` a pass, and records after every
pass the token its own greedy choice would feed next (``Capture.meta["choice"]``). Both sides are
fed the same tokens at every step, and while the reference would have chosen each of them, they
are the reference's greedy tokens: the steps, their tensors and their verdicts are those of a
decode the reference leads, and no draft runs. The alternative runs at most :data:`LEAD_STEPS`
steps ahead of the judgement (its passes held until the reference's of the same step come).

At the first step after which the reference would feed another token than the alternative chose
(a flip: near-tied logits, or a bug), the steps judged so far stand (both sides were fed the same
tokens up to that step) and :func:`lead` says where the reference must lead from: the decode
stage opens both decodes again, the reference leading, and goes on from the step after the flip,
the passes before it run again but not judged again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ...backends.decode import CHUNK_STEPS, DecodePass, greedy_choice, kv_audited, last_token_index
from .decode_ahead import AheadStream, Channel, FedTokens
from .decode_calibration import ChosenTokens, noise_sampled
from .decode_walk import LOGITS, DecodeWalk
from .memory import give_back_freed

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["lead", "LEAD_STEPS", "choice_of", "count_chunk", "ChosenTokens"]

#: the most steps the alternative runs ahead of the judgement (two of the reference's passes: its
#: process waits for a whole pass's tokens while the alternative computes the next pass's)
LEAD_STEPS = 2 * CHUNK_STEPS


def choice_of(p: DecodePass) -> np.ndarray | None:
    """``[batch]`` int64: each row's greedy choice after pass ``p`` (its ``post_processing`` logits
    at the row's last position: the prompt's last token after the prefill; compared in float32, as
    a greedy decode chooses); None where the pass has no such logits ``[batch, positions, vocab]``."""
    import torch

    logits = p.capture.tensors.get(LOGITS)
    if logits is None or len(getattr(logits, "shape", ())) != 3:
        return None
    x = torch.as_tensor(np.asarray(logits) if not hasattr(logits, "detach") else logits.detach().cpu())
    at = last_token_index(p.mask) if p.step == 0 and p.mask.shape[1] == x.shape[1] else np.full(x.shape[0], x.shape[1] - 1)
    return greedy_choice(x, torch.from_numpy(at)).numpy().astype(np.int64)


def lead(ctx: RunContext, walk: DecodeWalk, ref: AheadStream, alt: Iterator[DecodePass], fed: np.ndarray,
         tokens: ChosenTokens, writer: Channel, take: Callable[[bool, Iterator[DecodePass], int], DecodePass],
         stop: bool, times: tuple[list[float], list[float]], chunks: dict[str, int]) -> tuple[int, int | None]:
    """The decode, the alternative leading (see the module): its passes from ``alt`` (fed ``fed``,
    filled here with its own greedy choices, as is ``tokens.tokens``), each choice sent to the reference's
    process through ``writer``; the reference's passes from ``ref``; ``take(is_reference, stream,
    step)`` takes a side's next pass. Each step judged by ``walk`` as both its passes are there (the
    reference's passes there judged together; a step whose calibration is measured once the pass
    the reference's process computes beside it is there: the alternative runs meanwhile), its
    share of the time in ``times``, the reference's passes of several steps counted in ``chunks``.
    Returns the last step judged and, where the reference must lead from a step on (it would have
    fed another token after the last one judged, or its passes do not say what it would feed),
    that step; else None."""
    steps = walk.steps
    alts: deque[DecodePass] = deque()  # the passes of the steps not judged yet, the alternative's
    refs: deque[DecodePass] = deque()  # and the reference's
    alt_at = judged = -1
    again: int | None = None  # a flip: the reference leads from this step
    feeding = True
    sampled = walk.calibration is not None
    mark = (time.perf_counter(), time.process_time())
    passes: dict[int, tuple[float, float]] = {}  # each alternative's pass's wall and CPU seconds, by step
    ran = 0  # the alternative's passes before this step are counted out of the rest already

    def take_ref() -> None:
        nonlocal again
        r = take(True, ref, judged + 1 + len(refs))
        refs.append(r)
        count_chunk(chunks, r)
        if r.step < steps and not _would_feed(r, tokens.tokens[:, r.step]):
            again = r.step + 1  # the steps after it were fed a token the reference would not feed

    def judgeable() -> int:
        """How many of the steps whose passes are both there can be judged now: up to a sampled
        step whose calibration pass is still being computed beside the reference's."""
        n = min(len(refs), len(alts))
        if n and refs[0].step == 0:
            return 1  # the prefill alone: the wait for the reference's prefill is no decode step's
        for i in range(n):
            s = refs[i].step
            if sampled and s and noise_sampled(s, steps) and i == len(refs) - 1 and again is None \
                    and not ref.ready():
                return i
        return n

    while judged < steps:
        while again is None and len(refs) < len(alts) and ref.ready():
            take_ref()
        n = judgeable()
        if not n:
            if again is None and alt_at < min(steps, judged + LEAD_STEPS):
                began = (time.perf_counter(), time.process_time())
                a = take(False, alt, alt_at + 1)
                alt_at += 1
                passes[alt_at] = (time.perf_counter() - began[0], time.process_time() - began[1])
                alts.append(a)
                if alt_at < steps:
                    chosen = choice_of(a)
                    if chosen is None:  # nothing to choose by: the reference leads from the first step not judged
                        return judged, judged + 1
                    fed[:, alt_at] = tokens.tokens[:, alt_at] = chosen
                    tokens.count = alt_at + 1
                    feeding = feeding and FedTokens.send(writer, chosen)
                continue
            if len(refs) < len(alts) and again is None:
                take_ref()  # waits for the reference's next pass
                continue
            n = min(len(refs), len(alts))  # waits for the calibration's pass at a sampled step
        batch = [(refs.popleft(), alts.popleft()) for _ in range(n)]
        failed = walk.step_many(batch, stop)
        judged_now = batch[:len(failed)]
        # each step: its alternative's pass, and its share of the rest since the last judgement
        # (the reference's passes received and waited for, the judgement)
        wall, cpu = time.perf_counter(), time.process_time()
        inside = [passes[s] for s in range(ran, alt_at + 1) if s in passes]
        ran = alt_at + 1
        share = ((wall - mark[0] - sum(t[0] for t in inside)) / len(judged_now),
                 (cpu - mark[1] - sum(t[1] for t in inside)) / len(judged_now))
        mark = (wall, cpu)
        for (r, _), bad in zip(judged_now, failed):
            judged = r.step
            if judged and (kv_audited(judged, steps) or noise_sampled(judged, steps)):
                give_back_freed()  # what an audit's whole caches and a calibration's long prefill left in the heap
            own = passes.pop(judged, (0.0, 0.0))
            if judged:
                times[0].append(round(own[0] + share[0], 6))
                times[1].append(round(own[1] + share[1], 6))
            ctx.layers_done(judged, steps)  # the progress bar by step
            if bad and stop:
                return judged, None
        if again is not None and not refs:
            return judged, again
    return judged, None


def count_chunk(chunks: dict[str, int], r: DecodePass) -> list[int] | None:
    """Where ``r`` is the first step of the reference's pass over several (``Capture.meta["chunk"]``,
    ``[first step, steps kept, steps computed]``), that pass counted in ``chunks`` (passes, steps,
    computed) and its chunk given back; else None."""
    chunk = r.capture.meta.get("chunk")
    if not chunk or chunk[0] != r.step:
        return None
    chunks["passes"] += 1
    chunks["steps"] += int(chunk[1])
    chunks["computed"] += int(chunk[2])
    return chunk  # type: ignore[no-any-return]


def _would_feed(r: DecodePass, token: np.ndarray) -> bool:
    """Whether the reference's own greedy choice after pass ``r`` is ``token`` (the one fed next)."""
    choice = r.capture.meta.get("choice")
    return choice is not None and np.array_equal(np.asarray(choice, np.int64), np.asarray(token, np.int64))

