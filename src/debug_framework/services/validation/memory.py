"""The memory a session will need, estimated before anything big is built, and checked against
the memory there is: a model that cannot fit is a DF007 naming the estimate and what to change,
not an out-of-memory kill half-way through.

The estimate (bytes; ``N`` the parameters of the weights, ``L`` the largest layer's parameters):

* **runtime**: the process's own (anonymous) resident memory now (the interpreter and its
  libraries; not the file pages it maps), at least :data:`RUNTIME_BYTES`;
* **alternative**: ``N`` x the alternative's dtype size on the CPU (its own copy of the weights;
  nothing on the host for another device);
* **reference** and **calibration**: a backend that streams its weights (``streams_weights``:
  ``python_reference``, ``torch_reference``) holds about one layer, ``L`` x its dtype size, plus,
  below float64, the float64 host copy of the one tensor in conversion (``T`` x 8, ``T`` the
  largest tensor of a layer), plus one block of LM-head rows
  (:data:`~debug_framework.architectures.layout.HEAD_BLOCK_BYTES`); one that streams its repeated
  layers and tables (``streams_layers``: ``float64_eager``) holds one layer and the tensors outside
  the layers but their large tables, ``(N - N_layers - N_tables + L)`` x its dtype size, plus a
  block of table rows (``N_layers``: the parameters of all layers; ``N_tables``: those of the
  two-dimensional tensors outside them of at least
  :data:`~debug_framework.architectures.layout.STREAMED_TABLE_ELEMENTS` elements); any other
  backend ``N`` x its dtype size;
* **activations**: every checkpoint and layer input of the three runs in float64, their logits and
  the attention scores of one layer: ``3 x (3 layers + 2) x B x T x D x 8 + 3 x B x T x V x 8 +
  4 x B x H x T x T x 8``; with a capture budget (``capture_memory_budget``: captured checkpoints
  beyond it go to disk as they are produced, :mod:`debug_framework.capture.spill`) the captured
  part counts at most the budget, plus the logits of the run in progress;
* **weights file pages**: the stored bytes, touched while the weights are read; the kernel can drop
  them, so they are reported but not counted against the budget.

The budget is the framework configuration's ``memory_budget`` (``PIE_DEBUG_MEMORY_BUDGET``: bytes,
or a number with ``K``/``M``/``G`` (powers of 1024), or ``off``); unset, the memory available now
(``MemAvailable`` of ``/proc/meminfo``, and the cgroup's limit where lower) plus what this
process already holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...backends.capabilities import capabilities
from ...architectures.layout import HEAD_BLOCK_BYTES, STREAMED_TABLE_ELEMENTS
from ...backends.base import Backend
from ...errors import ResourceExhaustedError

if TYPE_CHECKING:
    from ...modelio import LoadedModel, ModelInputs
    from .plan import ValidationPlan

__all__ = ["MemoryEstimate", "estimate_memory", "session_estimate", "RssWatch", "give_back_freed", "large_blocks_mapped",
           "older_objects_frozen", "LONG_RUN_MMAP_BYTES", "available_memory",
           "check_memory", "budget_of", "capture_budget", "RUNTIME_BYTES", "current_rss", "own_memory"]

#: the least the interpreter, torch and transformers take once imported (measured: ~560 MiB).
RUNTIME_BYTES = 600 * 2**20

_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
_STORED_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_LAYER_INDEX = re.compile(r"^(.*?\.(?:layers?|h|blocks?)\.)(\d+)\.")


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak resident memory of one session, by part (bytes)."""

    runtime: int
    alternative: int
    reference: int
    calibration: int
    activations: int
    file_pages: int
    parameters: int

    @property
    def total(self) -> int:
        """What the session holds at its peak, the droppable file pages excluded."""
        return self.runtime + self.alternative + self.reference + self.calibration + self.activations

    def parts(self) -> dict[str, int]:
        """The counted parts, largest first."""
        parts = {"alternative": self.alternative, "reference": self.reference, "calibration": self.calibration,
                 "activations": self.activations, "runtime": self.runtime}
        return dict(sorted(parts.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, int]:
        return {**self.parts(), "file_pages": self.file_pages, "parameters": self.parameters,
                "total": self.total}


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


def current_rss() -> int | None:
    """This process's resident set now (Linux), None where unreadable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def give_back_freed() -> None:
    """Hand the C heap's freed pages back to the system (glibc's ``malloc_trim``; nothing elsewhere):
    a stage's released models and sessions leave free holes in the heap that the resident set
    would otherwise keep counting until later allocations reuse them."""
    trim = _libc("malloc_trim")
    if trim:
        trim(0)


_LIBC: dict[str, Any] = {}


def _libc(name: str) -> Any:
    """glibc's function ``name`` (looked up once), False where there is none (not glibc)."""
    if name not in _LIBC:
        import ctypes
        import ctypes.util

        try:
            _LIBC[name] = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
        except (OSError, AttributeError):
            _LIBC[name] = False
    return _LIBC[name]


#: glibc's ``M_MMAP_THRESHOLD`` (malloc.h)
_M_MMAP_THRESHOLD = -3
#: the C heap's threshold while a long decode runs: a larger block is its own mapping, returned
#: whole when freed (above a cache's per-step growth at float32 for ~1000 positions of a small
#: model, so a step's allocations stay in the heap and cost no page faults)
LONG_RUN_MMAP_BYTES = 2**20
#: the threshold left after it: the largest glibc's own adaptive one reaches (it adapts no more
#: once set)
_MMAP_MAX_BYTES = 32 * 2**20


def _mallopt(param: int, value: int) -> bool:
    mallopt = _libc("mallopt")
    return bool(mallopt and mallopt(param, value))


@contextlib.contextmanager
def large_blocks_mapped(threshold: int = LONG_RUN_MMAP_BYTES) -> Iterator[None]:
    """While inside, every C-heap block of ``threshold`` bytes or more is a mapping of its own,
    returned to the system when freed (glibc's ``M_MMAP_THRESHOLD``; nothing elsewhere). glibc
    otherwise raises its threshold to the largest block freed so far (up to 32 MiB): after a long
    prefill's logits and attention blocks, the next ones come from the heap and leave holes there
    that the resident set keeps -- the peak of a long decode grew with every calibration prefill.
    On leaving, the threshold is set to that largest adaptive value (glibc stops adapting once it
    is set: where it ends anyway after the first large block freed)."""
    _mallopt(_M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        _mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX_BYTES)


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """While inside, the objects that existed on entering are left out of Python's cyclic garbage
    collection (``gc.freeze``; back in its oldest generation on leaving). A long decode creates a
    few hundred objects a step, so the collector's full passes come every few hundred steps, and
    each walked every object of the session (the model's modules, the loaded weights' records,
    the evidence so far): a few hundred milliseconds in one step. Nothing is done where something
    else froze objects already (``gc.get_freeze_count``): unfreezing would undo its freeze too."""
    import gc

    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    try:
        yield
    finally:
        if ours:
            gc.unfreeze()


def own_memory() -> int | None:
    """This process's own memory now (Linux): its anonymous resident pages (``RssAnon``), without
    the mapped file pages that ``current_rss`` also counts (the weights file's pages, touched by the
    digest or a memory-mapped model: the kernel can drop them); ``current_rss`` where unreadable."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return current_rss()


def _weights_census(weights: object) -> tuple[int, int, int, int, int]:
    """(parameters, stored bytes, the largest layer's parameters, the largest tensor of a layer's
    parameters, the parameters of all layers and large tables) from the weights' headers."""
    total = stored = largest = tables = 0
    layers: dict[tuple[str, int], int] = {}
    for name in weights:
        shape = weights.shape(name) if hasattr(weights, "shape") else tuple(getattr(weights[name], "shape", ()))
        n = 1
        for d in shape:
            n *= int(d)
        total += n
        dtype = weights.dtype_name(name) if hasattr(weights, "dtype_name") else "F32"
        stored += n * _STORED_BYTES.get(str(dtype).upper(), 4)
        m = _LAYER_INDEX.match(name)
        if m is not None:
            key = (m.group(1), int(m.group(2)))
            layers[key] = layers.get(key, 0) + n
            largest = max(largest, n)
        elif len(shape) == 2 and n >= STREAMED_TABLE_ELEMENTS:
            tables += n
    return total, stored, max(layers.values(), default=0), largest, sum(layers.values()) + tables


def _backend_bytes(backend: Backend, dtype: str, device: str, params: int, layer: int, largest: int,
                   streamed: int) -> int:
    """What one backend holds of the weights: one layer (+ below float64 the float64 host copy of
    the tensor in conversion, and a block of head rows) when it streams them, the tensors it does
    not stream (all but ``streamed``), one layer and a block of rows when it streams its layers and
    tables, else all of them at its dtype; nothing on the host for a device."""
    if backend is None or str(device).split(":")[0] not in ("cpu", "None", ""):
        return 0
    size = _DTYPE_BYTES.get(str(dtype), 4)
    memory = capabilities(backend).weights_memory
    if memory == "streams_weights":
        return layer * size + (0 if str(dtype) == "float64" else largest * 8) + HEAD_BLOCK_BYTES
    if memory == "streams_layers":
        return (params - streamed + layer) * size + HEAD_BLOCK_BYTES
    return params * size


def estimate_memory(model: LoadedModel, *, reference: Backend, reference_dtype: str, alternative: Backend,
                    alternative_dtype: str, device: str = "cpu", calibrator: Backend | None = None, calibration_dtype: str | None = None,
                    batch: int = 1, length: int = 1, capture_budget: int | None = None) -> MemoryEstimate:
    """The session's :class:`MemoryEstimate` (see the module's formula) from the weights' headers,
    the model's shape, the backends and dtypes, and the inputs' ``batch`` x ``length``;
    ``capture_budget``: the bytes of captured checkpoints a run keeps in memory (None: all)."""
    params, stored, layer, largest, streamed = _weights_census(model.weights)
    config = model.config
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    layers = int(getattr(model, "num_layers", 0) or 0)
    tokens = batch * length
    captured = 3 * (3 * layers + 2) * tokens * hidden * 8 + 3 * tokens * vocab * 8
    if capture_budget is not None and captured > capture_budget:  # the rest on disk as it is produced
        captured = capture_budget + tokens * vocab * 8
    activations = captured + 4 * batch * heads * length * length * 8
    return MemoryEstimate(
        runtime=max(own_memory() or 0, RUNTIME_BYTES),
        alternative=_backend_bytes(alternative, alternative_dtype, device, params, layer, largest, streamed),
        reference=_backend_bytes(reference, reference_dtype, "cpu", params, layer, largest, streamed),
        calibration=_backend_bytes(calibrator, calibration_dtype or alternative_dtype, "cpu", params, layer, largest,
                                   streamed),
        activations=activations, file_pages=stored, parameters=params)


def _cgroup_room() -> int | None:
    """The cgroup's memory limit less its usage, where a limit is set (cgroup v2, then v1)."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None
        return int(limit) - usage
    return None


def available_memory() -> int | None:
    """The memory a new allocation can have now: ``MemAvailable`` (Linux), lowered to the cgroup's
    room where that is less; None where neither is readable."""
    room: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        room = None
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = cgroup if room is None else min(room, cgroup)
    return room


def capture_budget(framework_config: Mapping[str, object]) -> int | None:
    """The bytes of captured checkpoints a run keeps in memory (``capture_memory_budget``,
    ``PIE_DEBUG_CAPTURE_MEMORY``; default 64 MiB); None (``off``): all of them."""
    configured = framework_config.get("capture_memory_budget", 64 * 2**20)
    if configured is None or configured == "off":
        return None
    return max(int(configured), 0)


def budget_of(framework_config: Mapping[str, object]) -> tuple[int | None, str]:
    """(the budget in bytes, where it comes from); None bytes means no check."""
    configured = framework_config.get("memory_budget")
    if configured == "off":
        return None, "off"
    if configured is not None:
        return int(configured), "memory_budget (PIE_DEBUG_MEMORY_BUDGET)"
    room = available_memory()
    if room is None:
        return None, "not measurable here"
    return room + (own_memory() or 0), "the memory available now (MemAvailable) and this process's own"


def check_memory(estimate: MemoryEstimate, framework_config: Mapping[str, object], *, reference_dtype: str,
                 alternative_dtype: str) -> int | None:
    """Refuse a session whose estimate is over the budget (:func:`budget_of`); the budget in bytes
    (None when not checked).

    Raises:
        ResourceExhaustedError: DF007, naming the estimate by part, the budget and what to change.
    """
    budget, source = budget_of(framework_config)
    if budget is None or estimate.total <= budget:
        return budget
    parts = ", ".join(f"{name} {_gib(n)}" for name, n in estimate.parts().items() if n)
    hints = []
    for name in estimate.parts():
        if name == "alternative" and alternative_dtype in ("float64", "float32"):
            hints.append("run the alternative at a lower precision (--dtype bfloat16)")
        elif name == "reference" and reference_dtype == "float64":
            hints.append("--reference-dtype float32 (half the reference's share)")
        elif name == "activations":
            hints.append("a smaller batch or shorter inputs (input_shape, --text), fewer checkpoints "
                         "(--layers START:STOP)")
    hints.append("a machine with more memory, or PIE_DEBUG_MEMORY_BUDGET to set the budget yourself")
    raise ResourceExhaustedError(
        f"the session would need about {_gib(estimate.total)} of memory ({parts}; "
        f"{estimate.parameters / 1e9:.2f}B parameters), more than the budget of {_gib(budget)} ({source})",
        hint="; or ".join(hints))


def session_estimate(model: LoadedModel, plan: ValidationPlan, reference: Backend, alternative: Backend,
                     calibrator: Backend | None, inputs: ModelInputs, capture_budget: int | None = None) -> MemoryEstimate | None:
    """The estimate of one planned session (None for an ONNX-file model: its graph is not counted);
    ``capture_budget``: the framework configuration's ``capture_memory_budget``."""
    from .calibration import calibration_dtype

    if getattr(model, "format", None) == "onnx":
        return None
    shape = getattr(getattr(inputs, "input_ids", None), "shape", None) or (1, 1)
    batch, length = (int(shape[0]), int(shape[1])) if len(shape) >= 2 else (1, int(shape[0]) if shape else 1)
    return estimate_memory(model, reference=reference, reference_dtype=plan.reference_dtype,
                           alternative=alternative, alternative_dtype=plan.alternative_dtype,
                           device=plan.config.device, calibrator=calibrator,
                           calibration_dtype=calibration_dtype(plan, model) if calibrator is not None else None,
                           batch=batch, length=max(length, 1), capture_budget=capture_budget)


class RssWatch:
    """The process's resident set sampled every ``interval_s`` by a daemon thread while a session
    runs (sampling, unlike the kernel's high-water mark, is not reset by the stages' own
    ``measure.PeakMemory`` blocks): :attr:`peak` over the whole run and :meth:`take` the peak
    since the previous take (one stage's)."""

    method = "rss_sampled_10ms"

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.peak = self._since = current_rss() or 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._note(current_rss() or 0)

    def _note(self, rss: int) -> None:
        self.peak, self._since = max(self.peak, rss), max(self._since, rss)

    def take(self) -> int:
        """The peak since the previous call (or the start), then start over from now."""
        now = current_rss() or 0
        self._note(now)
        since, self._since = self._since, now
        return since

    def __enter__(self) -> RssWatch:
        if current_rss() is not None:
            self._thread = threading.Thread(target=self._sample, name="RssWatch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
