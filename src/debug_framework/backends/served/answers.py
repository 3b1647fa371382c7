"""What a served model answered: the top-k of each next-token distribution (:class:`TopK`) and the
run's record (:class:`LogprobRun`). Plain data, imported by the client, the protocols and the backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ...jsonio import JsonObject

__all__ = ["TopK", "LogprobRun", "DEFAULT_TOP_K"]

#: How many log-probabilities per position are asked for (OpenAI's and vLLM's default limit is 20).
DEFAULT_TOP_K = 20


@dataclass(frozen=True)
class TopK:
    """The top-k of one next-token distribution: token ids and their log-probabilities, most likely first."""

    ids: np.ndarray  #: int64 [k]
    logprobs: np.ndarray  #: float64 [k]


@dataclass
class LogprobRun:
    """What the endpoint answered: the top-k per ``(row, position)``, and how it was asked."""

    top: dict[tuple[int, int], TopK] = field(default_factory=dict)
    protocol: str = ""
    model: str = ""
    requests: int = 0
    retried: int = 0
    seconds: float = 0.0
    k: int = DEFAULT_TOP_K

    def to_dict(self) -> JsonObject:
        """The record of the run (no token data): protocol, model, k, requests, retries, seconds, positions."""
        return {"protocol": self.protocol, "model": self.model, "top_k": self.k, "requests": self.requests,
                "retried": self.retried, "seconds": self.seconds, "positions": len(self.top)}
