"""The minifier: bisection, then delta debugging over graph nodes, under a failure signature.

    result = Minifier(gm, example_inputs, AccuracySignature(my_backend)).minify()
    result.gm                # the minimal graph (>= 1 node, the signature holds on it)
    result.repro_path        # <output_dir>/repro.py, verified in a fresh process (result.verified)

Every candidate is judged by the signature (same constraint at the same op / same exception type and
message / accuracy failure), never by "something failed", so the result is the bug we started with.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from debug_framework.jsonio import JsonObject

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
import torch.fx

from ..errors import MinifierError
from .codegen import VerifyResult, run_repro, verify_repro, write_repro_dir
from .graph import Candidate, GraphSlicer, record_values
from .signatures import Signature

__all__ = ["Minifier", "MinifyResult", "MinifierOptions", "STATE_SCHEMA"]

STATE_SCHEMA = "debug_module.minifier.state/1"


class _OutOfBudget(Exception):
    pass


@dataclass
class MinifyResult:
    """The outcome. ``gm``/``inputs`` are the smallest graph on which the signature was seen to hold
    (the last *verified* one when the final repro did not reproduce in a fresh process)."""

    gm: torch.fx.GraphModule
    inputs: list[object]
    signature: Signature
    nodes: int
    original_nodes: int
    calls: int
    cache_hits: int
    seconds: float
    ops: list[str]
    stopped: str | None = None
    verified: bool | None = None
    verification: VerifyResult | None = None
    repro_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The result reproduces (verified in a fresh process, or verification was off)."""
        return self.verified is not False

    def write_repro(self, out_dir: str | os.PathLike[str], *, title: str = "") -> Path:
        """Write this result's standalone repro directory (not verified; see :func:`verify_repro`)."""
        return write_repro_dir(self.gm, self.inputs, self.signature, out_dir, title=title,
                               notes={"original_nodes": self.original_nodes, "oracle_calls": self.calls})

    def summary(self) -> str:
        v = {True: "verified in a fresh process", False: "NOT reproduced in a fresh process", None: "not verified"}[self.verified]
        text = (f"{self.original_nodes} -> {self.nodes} node(s) in {self.calls} oracle call(s) "
                f"({self.cache_hits} cached), {self.seconds:.2f}s; {v}; ops: {', '.join(self.ops)}")
        if self.stopped:
            text += f"; stopped early: {self.stopped}"
        return text

    def to_dict(self) -> JsonObject:
        return {"signature": self.signature.to_dict(), "signature_text": self.signature.describe(),
                "nodes": self.nodes, "original_nodes": self.original_nodes, "calls": self.calls,
                "cache_hits": self.cache_hits, "seconds": round(self.seconds, 3), "ops": self.ops,
                "stopped": self.stopped, "verified": self.verified,
                "verification": self.verification.to_dict() if self.verification else None,
                "repro_path": str(self.repro_path) if self.repro_path else None, "notes": self.notes}


class MinifierOptions(TypedDict, total=False):
    """:class:`Minifier`'s keyword options besides ``output_dir`` (see its docstring), for callers
    that pass them on (``minify_saved_graph``)."""

    max_calls: int | None
    max_seconds: float | None
    progress: bool
    state_path: str | os.PathLike[str] | None
    isolate: bool
    jobs: int
    call_timeout: float
    bisect: bool
    verify: bool
    title: str


class Minifier:
    """Reduce ``gm`` to a minimal graph on which ``signature`` still holds.

    Args:
        gm, example_inputs: the failing graph and real inputs (``None``: synthesised from
            ``node.meta["val"]``, enough for constraint signatures).
        signature: :class:`ConstraintSignature`, :class:`ExceptionSignature` or :class:`AccuracySignature`.
        max_calls, max_seconds: budget of oracle calls / wall time; when spent, the smallest graph found
            so far is returned with ``stopped`` set.
        progress: show a Rich progress bar (calls made, current size).
        state_path: JSON state file written after every oracle call; an interrupted run started again
            with the same graph, signature and state file resumes (cached verdicts are not re-run).
        isolate: run every oracle call in a subprocess (for backends that crash the process); needs a
            backend a repro can import (see :class:`BackendRef`). ``jobs`` > 1 runs that many at once.
        call_timeout: seconds per isolated oracle call (a hang counts as "signature does not hold").
        bisect: cut prefix and suffix by bisection before delta debugging.
        verify: write the repro to ``output_dir`` and run it in a fresh process; if it does not
            reproduce, fall back to the last graph that does (and say so in ``notes``).
        output_dir: where the repro directory goes (default: a temporary directory when verifying).
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object] | None, signature: Signature, *,
                 max_calls: int | None = None, max_seconds: float | None = None, progress: bool = True,
                 state_path: str | os.PathLike[str] | None = None, isolate: bool = False, jobs: int = 1,
                 call_timeout: float = 120.0, bisect: bool = True, verify: bool = True,
                 output_dir: str | os.PathLike[str] | None = None, title: str = "") -> None:
        self.gm = gm
        self.example_inputs = list(example_inputs) if example_inputs is not None else None
        self.signature = signature
        self.max_calls = max_calls
        self.max_seconds = max_seconds
        self.progress = progress
        self.state_path = Path(state_path) if state_path is not None else None
        self.isolate = isolate
        self.jobs = max(1, int(jobs)) if isolate else 1
        self.call_timeout = call_timeout
        self.bisect = bisect
        self.verify = verify
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.title = title
        self.calls = 0
        self.cache_hits = 0
        self.cache: dict[str, bool] = {}
        self.history: list[list[int]] = []
        self._t0 = 0.0
        self._bar: tuple[Progress, TaskID] | None = None
        self._current: list[int] = []

    # ------------------------------------------------------------------ public

    def minify(self) -> MinifyResult:
        self._t0 = time.perf_counter()
        values = record_values(self.gm, self.example_inputs)
        self.slicer = GraphSlicer(self.gm, values)
        if len(self.slicer) == 0:
            raise MinifierError("the graph has no compute nodes to reduce")
        start = self._initial_groups()
        fingerprint = self._fingerprint()
        self._load_state(fingerprint, start)
        stopped: str | None = None
        with self._progress_bar():
            # A resumed run replays the same deterministic search from the start; the verdicts saved in
            # the state file answer every query already made, so only new candidates cost oracle calls.
            cur = start
            if not self._test(cur):
                obs = self._last_obs
                raise MinifierError(f"the signature ({self.signature.describe()}) does not hold on the input graph",
                                    hint="check the signature (constraint/op, exception pattern, tolerance) "
                                         f"against what the graph shows: {json.dumps(obs, default=str)[:600]}")
            self._accept(cur)
            try:
                if self.bisect:
                    cur = self._bisect(cur)
                cur = self._ddmin(cur)
            except _OutOfBudget as e:
                stopped = str(e)
                cur = self._current
        cand = self.slicer.build(cur)
        result = MinifyResult(gm=cand.gm, inputs=cand.inputs, signature=self.signature, nodes=cand.size,
                              original_nodes=len(start), calls=self.calls, cache_hits=self.cache_hits,
                              seconds=0.0, ops=[self.slicer.describe_group(g) for g in cur], stopped=stopped)
        if self.verify:
            self._verify(result)
        result.seconds = time.perf_counter() - self._t0
        return result

    # ------------------------------------------------------------------ oracle

    def _initial_groups(self) -> list[int]:
        output = getattr(self.signature, "output", None)
        if not output:
            return list(range(len(self.slicer)))
        node = next((n for n in self.gm.graph.nodes if n.name == output), None)
        if node is None or node not in self.slicer.group_of:
            raise MinifierError(f"no compute node named {output!r} in the graph", hint="name a node of gm.graph")
        cone, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n in self.slicer.group_of and self.slicer.group_of[n] not in cone:
                cone.add(self.slicer.group_of[n])
                stack.extend(n.all_input_nodes)
        return sorted(cone)

    def _fingerprint(self) -> str:
        text = self.gm.code + json.dumps(self.signature.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _check_budget(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            raise _OutOfBudget(f"oracle-call budget of {self.max_calls} spent")
        if self.max_seconds is not None and time.perf_counter() - self._t0 > self.max_seconds:
            raise _OutOfBudget(f"time budget of {self.max_seconds}s spent")

    _last_obs: JsonObject | None = None

    def _oracle(self, cand: Candidate) -> tuple[bool, JsonObject | None]:
        if not self.isolate:
            try:
                return self.signature.check(cand.gm, cand.inputs)
            except Exception as e:  # noqa: BLE001 - an oracle that cannot run: signature not seen
                return False, {"kind": "oracle_error", "error": f"{type(e).__name__}: {e}"[:2000]}
        with tempfile.TemporaryDirectory(prefix="dm-minify-") as d:
            repro = write_repro_dir(cand.gm, cand.inputs, self.signature, d)
            res = run_repro(repro, self.signature.to_dict(), timeout=self.call_timeout, isolated=False)
            return res.reproduced, res.observation

    def _test_many(self, candidates: list[list[int]]) -> int | None:
        """Index of the first candidate (in order) on which the signature holds, else ``None``."""
        if self.jobs == 1:
            for i, c in enumerate(candidates):
                if self._test(c):
                    return i
            return None
        for start in range(0, len(candidates), self.jobs):
            batch = candidates[start:start + self.jobs]
            todo = [c for c in batch if self.slicer.key(c) not in self.cache]
            todo = todo[:max(0, (self.max_calls - self.calls))] if self.max_calls is not None else todo
            if todo:
                self._check_budget()
                built = [self.slicer.build(c) for c in todo]
                with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                    verdicts = list(pool.map(self._oracle, built))
                for cand, (ok, obs) in zip(built, verdicts):
                    self._record(cand.key, ok)
                    self._last_obs = obs
            for i, c in enumerate(batch):
                key = self.slicer.key(c)
                if key not in self.cache:
                    self._check_budget()
                if self.cache.get(key):
                    return start + i
        return None

    def _test(self, groups: list[int]) -> bool:
        key = self.slicer.key(groups)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        self._check_budget()
        cand = self.slicer.build(groups)
        ok, obs = self._oracle(cand)
        self._last_obs = obs
        self._record(key, ok)
        return ok

    def _record(self, key: str, ok: bool) -> None:
        self.calls += 1
        self.cache[key] = ok
        self._save_state()
        self._tick()

    def _accept(self, groups: list[int]) -> None:
        self._current = list(groups)
        if not self.history or self.history[-1] != self._current:
            self.history.append(list(groups))
        self._save_state()
        self._tick()

    # ------------------------------------------------------------------ reduction

    def _bisect(self, cur: list[int]) -> list[int]:
        """Cut the longest failing prefix, then suffix, by binary search (~2 log2 N calls).

        First one probe of the last node alone: failures at the graph's output (the last op's accuracy
        or lowering) are common and then cost a single call."""
        if len(cur) > 1 and self._test(cur[-1:]):
            self._accept(cur[-1:])
            return cur[-1:]
        lo, hi = 0, len(cur)  # cur[lo:] fails; cur[hi:] is empty
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._test(cur[mid:]):
                lo = mid
                self._accept(cur[lo:])  # a budget stop keeps the smallest graph seen failing
            else:
                hi = mid
        cur = cur[lo:]
        lo, hi = 0, len(cur)  # cur[:hi] fails; cur[:lo] does not (empty)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._test(cur[:mid]):
                hi = mid
                self._accept(cur[:hi])
            else:
                lo = mid
        return cur[:hi]

    def _ddmin(self, cur: list[int]) -> list[int]:
        """Zeller's ddmin over groups: try each chunk, then each complement, refining the split."""
        n = 2
        while len(cur) >= 2:
            n = min(n, len(cur))
            size = len(cur) / n
            chunks = [cur[round(i * size):round((i + 1) * size)] for i in range(n)]
            chunks = [c for c in chunks if c]
            complements = [[g for g in cur if g not in set(c)] for c in chunks] if n > 2 else []
            cands = [c for c in chunks + complements if c]
            hit = self._test_many(cands)
            if hit is not None:
                cur = cands[hit]
                self._accept(cur)
                n = 2 if hit < len(chunks) else max(n - 1, 2)
                continue
            if n >= len(cur):
                break
            n = min(2 * n, len(cur))
        return cur

    # ------------------------------------------------------------------ verification

    def _verify(self, result: MinifyResult) -> None:
        try:
            self.signature.backend_ref()
        except MinifierError as e:  # the reduction stands; only the standalone repro is impossible
            result.verified = False
            result.notes.append(f"no standalone repro: {e}")
            return
        out = self.output_dir or Path(tempfile.mkdtemp(prefix="dm-repro-"))
        tried: list[list[int]] = []
        for groups in reversed(self.history):  # smallest first; the original graph is history[0]
            if groups in tried:
                continue
            tried.append(groups)
            cand = self.slicer.build(groups)
            repro = write_repro_dir(cand.gm, cand.inputs, self.signature, out, title=self.title,
                                    notes={"original_nodes": result.original_nodes, "oracle_calls": self.calls,
                                           "ops": [self.slicer.describe_group(g) for g in groups]})
            res = verify_repro(repro, self.signature)
            if res.reproduced:
                if groups != self._current:
                    result.notes.append(
                        f"the minimal graph ({len(self._current)} nodes) did not reproduce in a fresh process; "
                        f"kept the last graph that did ({len(groups)} nodes)")
                result.gm, result.inputs, result.nodes = cand.gm, cand.inputs, cand.size
                result.ops = [self.slicer.describe_group(g) for g in groups]
                result.verified, result.verification, result.repro_path = True, res, repro
                return
            if len(tried) == 1:
                result.notes.append(f"fresh-process run of the minimal repro did not reproduce (exit "
                                    f"{res.returncode}): {(res.stderr or res.stdout)[-500:]}")
            if len(tried) >= 4:
                break
        result.verified, result.verification, result.repro_path = False, res, repro
        result.notes.append("no reduced graph reproduced in a fresh process; the repro directory holds the last "
                            "one tried and does NOT reproduce")

    # ------------------------------------------------------------------ state, progress

    def _load_state(self, fingerprint: str, start: list[int]) -> None:
        self._fp = fingerprint
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise MinifierError(f"cannot read minifier state {self.state_path}: {e}",
                                hint="delete the state file to start over") from e
        if data.get("schema") != STATE_SCHEMA or data.get("fingerprint") != fingerprint:
            raise MinifierError(f"state file {self.state_path} belongs to another graph or signature",
                                hint="use a new state_path or delete the old file")
        self.cache = {k: bool(v) for k, v in data.get("cache", {}).items()}
        self.calls = int(data.get("calls", 0))
        self.history = [list(h) for h in data.get("history", [])]
        current = data.get("current") or []
        if current and self.cache.get(self.slicer.key(current)):
            self._current = list(current)

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        data = {"schema": STATE_SCHEMA, "fingerprint": self._fp, "calls": self.calls, "current": self._current,
                "history": self.history, "cache": self.cache, "signature": self.signature.to_dict(),
                "updated": time.time()}
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(self.state_path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
        os.replace(tmp, self.state_path)

    @contextlib.contextmanager
    def _progress_bar(self) -> Iterator[None]:
        if not self.progress:
            yield
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]minify[/]"), BarColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), transient=False) as bar:
            self._bar = (bar, bar.add_task("", total=self.max_calls))
            try:
                yield
            finally:
                self._tick()
                self._bar = None

    def _tick(self) -> None:
        if self._bar is None:
            return
        bar, task = self._bar
        size = len(self._current) if self._current else len(self.slicer)
        bar.update(task, completed=self.calls,
                   description=f"{self.calls} calls, {size}/{len(self.slicer)} nodes, {self.cache_hits} cached")
