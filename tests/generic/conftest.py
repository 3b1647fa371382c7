"""Shared tiny model directories of many families, saved once per test session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from benchmarks.models import tiny_generic as tiny


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one intra-op thread (no waiting for a second thread on a busy
    machine); the previous setting is restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``zoo(model_type)``: the saved tiny model of that family (built on first use, then shared)."""
    root = tmp_path_factory.mktemp("zoo")
    made: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = tiny.save(model_type, root)
        return made[model_type]

    return get
