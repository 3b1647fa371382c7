"""Fixtures for debug_module tests: Dynamo state isolation, tiny models, a live-memory oracle."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    """Every test starts with no compiled frames, default MOCK_* settings, and leaves none behind."""
    import debug_framework._torch.dynamo as dyn

    for var in ("MOCK_STRICT", "MOCK_ALIGNMENT", "MOCK_MAX_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    dyn.reset()
    yield
    dyn.reset()


class TinyConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 8)

    def forward(self, x):
        y = self.conv(x).relu()  # CONV-LINE
        return self.head(y.mean(dim=(2, 3)))


class TinyMLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def conv_net():
    torch.manual_seed(0)
    return TinyConvNet()


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return TinyMLP()


class LivePeakMode(TorchDispatchMode):
    """Oracle for the true peak of live tensor memory during eager execution.

    Every op output's storage is tracked with a weakref finalizer; inputs passed in ``initial`` are
    counted as live from the start. Independent of debug_module's liveness analysis.
    """

    def __init__(self, initial: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()
        for t in initial:
            self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._seen:
            return
        self._seen.add(key)
        n = storage.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)

        def free(n=n, key=key):
            self.live -= n
            self._seen.discard(key)

        weakref.finalize(t, free)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


@pytest.fixture
def live_peak_mode():
    return LivePeakMode
