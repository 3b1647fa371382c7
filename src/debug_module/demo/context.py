"""What the tour's steps share: the tiny model, its inputs, where artifacts go, and what a step returns."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from debug_framework.errors import ModelLoadingError
from debug_framework.jsonio import JsonObject

from .knobs import MAX_SEQ, TourKnobs

if TYPE_CHECKING:
    import torch

__all__ = ["MODEL_NAME", "VOCAB", "StepResult", "TourContext", "Step", "tiny_bert", "tour_inputs", "quiet_constraint_log"]

#: The label every run of the tour carries (reports group violations by it).
MODEL_NAME = "tiny-bert"
#: The tiny model's vocabulary; token 0 is padding.
VOCAB = 64


@dataclass
class StepResult:
    """One step's outcome.

    ``status`` is ``ok``, ``failed`` (the step's own check failed: a KernelDiff outside its tolerance,
    a repro that did not reproduce), ``skipped`` (a knob turned it off) or ``error`` (it raised;
    ``exit_code`` says how the framework classifies that: 2 environment or usage, 3 a bug).
    ``ran`` says what ran, ``lines`` the real results, ``artifacts`` where they went (label -> path).
    """

    status: str
    ran: str = ""
    lines: list[str] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    data: JsonObject = field(default_factory=dict)
    seconds: float = 0.0
    exit_code: int = 0

    @property
    def headline(self) -> str:
        """The one line the summary shows: ``data["headline"]`` if the step set it, else its last line."""
        return str(self.data.get("headline") or (self.lines[-1] if self.lines else ""))

    @property
    def worked(self) -> bool:
        return self.status in ("ok", "skipped")


@dataclass
class TourContext:
    """The tour's state: the output folder, the current knobs, and every step's latest result."""

    output: Path
    knobs: TourKnobs
    results: dict[str, StepResult] = field(default_factory=dict)

    @property
    def runs_root(self) -> Path:
        """Where the steps' run directories go (what ``inductor-debug --root`` reads)."""
        return self.output / "runs"

    @property
    def benchmarks_dir(self) -> Path:
        return self.output / "benchmarks"

    def model_and_inputs(self) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        """A fresh tiny BERT (same seeded weights every time) and inputs shaped by the knobs."""
        return tiny_bert(), tour_inputs(self.knobs)


@dataclass(frozen=True)
class Step:
    """One stop of the tour: its name (``--step``), title, what it teaches, the knobs that change it."""

    name: str
    title: str
    explanation: str
    knobs: tuple[str, ...]
    run: Callable[[TourContext], StepResult]


def tiny_bert() -> torch.nn.Module:
    """A one-layer BERT with 16 hidden units (random weights, seed 0, no dropout): seconds to compile on CPU."""
    import torch

    try:
        import transformers
    except ImportError as exc:
        raise ModelLoadingError(f"the tour's model needs transformers ({exc})",
                                hint="pip install 'multi-backend-debug-framework[models]'") from exc
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=MAX_SEQ, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def tour_inputs(knobs: TourKnobs) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``batch x seq`` seeded tokens; the last row's final
    ``padding`` tokens are padding (id 0, masked out)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (knobs.batch, knobs.seq), generator=g)
    mask = torch.ones_like(ids)
    if knobs.padding:
        ids[-1, knobs.seq - knobs.padding:] = 0
        mask[-1, knobs.seq - knobs.padding:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@contextlib.contextmanager
def quiet_constraint_log() -> Iterator[None]:
    """Warn-mode violations are recorded in the run and printed by the step itself, not logged."""
    logger = logging.getLogger("debug_module.constraints")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)
