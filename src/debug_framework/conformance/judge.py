"""Judging one sample of an operator: the compiled call against the float64 eager run, relative to
the eager run in the sample's own dtype, by the calibrated rule of the plugin op sweep and of
validation (:func:`debug_framework.plugins.evaluate.sample_rule`, one
:meth:`~debug_framework.comparison.RatioRule.verdict` per output):

    err(backend, float64 eager) <= 4 x err(eager in the sample's dtype, float64 eager)
                                   + 1 x eps(sample's dtype) x RMS(float64 eager)

RMSE over finite values; no more non-finite mismatches than eager in the dtype has (an infinity
where the oracle is finite but within the bound of the dtype's largest value is a rounding that
overflowed, and counts for neither); the eager run's
shape and dtype; an output bit for bit equal to eager's in the dtype passes. Where an output exceeds
the bound of that one eager run, the noise rule (:func:`~debug_framework.comparison.judge_with_noise`)
reruns eager on the sample's inputs perturbed within rounding and judges by the largest error
measured; the output's row then carries ``noise`` (the widening's provenance). Integer and boolean
outputs get the same rule with no floor (exact where eager is exact); an integer output beside floating ones (the indices of ``sort``, ``max(dim)``, ``topk``) is
not judged, since with ties any index of an equal value is right. Complex outputs are judged on
their real and imaginary parts.

PyTorch defines many operators twice: eager's kernel, and the decomposition that tracing runs (a
Python decomposition of a composite operator, or the path a C++ composite takes for traced tensors),
which is what a ``torch.compile`` backend receives. Where a sample fails against eager's kernel, it is
judged once more against the decomposition's own pair (float64, and the sample's dtype, for its
noise) run eagerly (:func:`decomposition`); a backend that passes there passes the sample, marked
``"definition": "decomposition"`` with the kernel's reason kept. The two differ on non-finite inputs
(bilinear interpolation of an infinity: the kernel skips a zero weight, the decomposition gives
``0 x inf = NaN``) and on ill-conditioned ones (``linalg.cond`` by another SVD path). A compiled call
that raises where the decomposition raises the same error (``linalg.eigvals`` of a matrix with an
infinity) is skipped, not failed.

Beside it each sample records BackendBench's judge (``torch.testing.assert_close`` with
atol = rtol = 1e-2, NaNs equal) against the float64 run (``allclose_oracle``) and against eager in
the same dtype (``allclose_eager``), so a sweep can say what a fixed tolerance would have flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
import torch

from .._torch.dynamo import failure_kind
from ..comparison import ComparisonResult, RatioRule, compare, finite_rms, judge_with_noise, perturb_within_rounding
from ..jsonio import JsonObject
from ..plugins.evaluate import badness as plugin_badness, error_text, sample_rule
from ..plugins.samples import Sample, upcast

__all__ = ["NotTaken", "flat_outputs", "judge_outputs", "run_sample", "run_backward", "randomness", "badness",
           "decomposition", "BACKENDBENCH_TOL"]

#: BackendBench's tolerances (``BackendBench.eval.allclose``: atol = rtol = 1e-2).
BACKENDBENCH_TOL = 1e-2


class NotTaken(Exception):
    """Raised by a compiled call that does not take a sample (the runtime sweeps' exporter or runtime
    refuses its graph): the sample is ``unsupported`` with the message as its reason, not failed."""


def flat_outputs(out: object) -> list[torch.Tensor] | None:
    """The tensors of an output (nested tuples and lists flattened, Python numbers as 0-d tensors,
    sparse tensors as their dense values); None when it holds anything else (a string, None, an object)."""
    if isinstance(out, torch.Tensor):
        return [out.to_dense() if out.layout != torch.strided else out]
    if isinstance(out, bool | int | float):
        return [torch.tensor(out)]
    if isinstance(out, complex):
        return [torch.tensor(out)]
    if isinstance(out, (tuple, list)):
        flat: list[torch.Tensor] = []
        for x in out:
            sub = flat_outputs(x)
            if sub is None:
                return None
            flat.extend(sub)
        return flat
    return None


def _real(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj())
    return t if t.is_floating_point() else t.to(torch.float64)


def _bb_allclose(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, b, atol=BACKENDBENCH_TOL, rtol=BACKENDBENCH_TOL, equal_nan=True,
                                   check_dtype=False, check_device=False, check_stride=False)
        return True
    except (AssertionError, RuntimeError, TypeError, ValueError):
        return False


def _overflows_by_rounding(oracle: torch.Tensor, out: torch.Tensor, rel: float) -> int:
    """How many of ``out``'s values are an infinity of the oracle's sign where the oracle is finite
    and within ``rel`` (relative) of the largest finite value of ``out``'s dtype."""
    if not math.isfinite(rel):
        return 0
    big = torch.finfo(out.dtype).max
    hit = out.isinf() & oracle.isfinite() & ((out > 0) == (oracle > 0)) & (oracle.abs() * (1 + rel) >= big)
    return int(hit.sum())


#: Eager's outputs on the sample's inputs perturbed within rounding with a seed (None: not available).
NoiseRuns = Callable[[int], list[torch.Tensor] | None]


def _noise_measure(noise: NoiseRuns | None, i: int, o64: torch.Tensor,
                   cache: dict[int, list[torch.Tensor] | None]) -> Callable[[int], ComparisonResult | None]:
    """The noise rule's measure at output ``i``: eager's perturbed run ``seed`` (run once per seed,
    cached for the sample's other outputs) against the float64 oracle; None without ``noise``."""
    def measure(seed: int) -> ComparisonResult | None:
        if noise is None:
            return None
        if seed not in cache:
            cache[seed] = noise(seed)
        runs = cache[seed]
        if runs is None or i >= len(runs) or runs[i].shape != o64.shape:
            return None
        return compare(o64, _real(runs[i].detach().cpu()).double(), check_dtype=False, equal_nan=True, engine="torch")
    return measure


def judge_outputs(oracle: list[torch.Tensor], baseline: list[torch.Tensor], test: list[torch.Tensor],
                  dtype: str, noise: NoiseRuns | None = None) -> JsonObject:
    """The verdict of one sample's outputs (see the module docstring); the worst output's numbers.
    ``noise`` reruns eager on perturbed inputs: where an output exceeds the single-run bound, the
    noise rule (:func:`~debug_framework.comparison.judge_with_noise`) measures it before failing."""
    if len(test) != len(baseline) or len(oracle) != len(baseline):
        return {"status": "fail", "reason": f"{len(test)} outputs, eager returns {len(baseline)}"}
    has_float = any(b.is_floating_point() or b.is_complex() for b in baseline)
    worst: JsonObject | None = None
    bb_oracle = bb_eager = True
    cache: dict[int, list[torch.Tensor] | None] = {}
    for i, (o, b, t) in enumerate(zip(oracle, baseline, test, strict=True)):
        if t.dtype != b.dtype:
            return {"status": "fail", "reason": f"output {i} is {t.dtype}, eager returns {b.dtype}", "output": i}
        if tuple(t.shape) != tuple(b.shape):
            return {"status": "fail", "reason": f"output {i} has shape {list(t.shape)}, eager {list(b.shape)}",
                    "output": i}
        floating = b.is_floating_point() or b.is_complex()
        if not floating and has_float:
            continue  # indices beside values: any index of a tied value is right
        o64, b64, t64 = _real(o.detach().cpu()).double(), _real(b.detach().cpu()), _real(t.detach().cpu())
        identical = bool(((t64 == b64) | (t64.isnan() & b64.isnan())).all())
        bb_oracle = bb_oracle and _bb_allclose(t64.double(), o64)
        bb_eager = bb_eager and _bb_allclose(t64, b64)
        # in float64 (exact) and by the torch engine: small tensors, and no kernel to JIT per dtype in a fresh worker
        base_cmp = compare(o64, b64.double(), check_dtype=False, equal_nan=True, engine="torch")
        test_cmp = compare(o64, t64.double(), check_dtype=False, equal_nan=True, engine="torch")
        rule = sample_rule(o64, dtype) if floating else RatioRule.calibrated(o64, 0.0)
        verdict = rule.verdict(base_cmp, test_cmp, oracle="float64 eager", baseline_name=f"eager in {dtype}")
        if not verdict.passed and test_cmp.nonfinite_mismatch_count and b64.is_floating_point():
            # an infinity where the oracle is finite but within the rule's own error of the largest
            # finite value is a rounding that overflowed (bfloat16 sums near its maximum), not a
            # wrong value: not counted against either run
            rel = verdict.judgement.bound / max(finite_rms(o64), 1e-300)
            base_cmp = replace(base_cmp, nonfinite_mismatch_count=base_cmp.nonfinite_mismatch_count
                               - _overflows_by_rounding(o64, b64, rel))
            test_cmp = replace(test_cmp, nonfinite_mismatch_count=test_cmp.nonfinite_mismatch_count
                               - _overflows_by_rounding(o64, t64, rel))
            verdict = rule.verdict(base_cmp, test_cmp, oracle="float64 eager", baseline_name=f"eager in {dtype}")
        evidence = None
        if not verdict.passed and floating:
            verdict, evidence = judge_with_noise(rule, base_cmp, test_cmp, _noise_measure(noise, i, o64, cache),
                                                 oracle="float64 eager", baseline_name=f"eager in {dtype}")
        j = verdict.judgement
        # bit for bit eager's own result in the dtype (the noise itself) passes, even where the rule
        # cannot measure (eager overflows everywhere the float64 run is finite)
        passed = verdict.passed or identical
        row = {"status": "pass" if passed else "fail", "reason": None if passed else verdict.reason, "output": i,
               "backend_error": j.alternative_error, "eager_error": j.reference_error, "bound": j.bound,
               "max_abs_error": test_cmp.max_abs_error, "shape": list(t.shape)}
        if evidence is not None:  # the provenance of the bound: widened by measured noise, and by how much
            row["eager_error"] = evidence.single_run_error
            row["noise"] = evidence.to_dict()
        if worst is None or badness(row) > badness(worst):
            worst = row
    if worst is None:
        return {"status": "skipped", "reason": "no output to judge", "allclose_oracle": None, "allclose_eager": None}
    return {**worst, "allclose_oracle": bb_oracle, "allclose_eager": bb_eager}


@contextmanager
def decomposition() -> Iterator[None]:
    """Operators called eagerly inside run by PyTorch's decomposition, the definition that tracing
    (and so every ``torch.compile`` backend) sees (:func:`debug_framework._torch.functorch.as_traced`)."""
    from .._torch.functorch import as_traced

    with as_traced():
        yield


def _or_decomposition(verdict: JsonObject, runs: Callable[[], tuple[object, object]], baseline: list[torch.Tensor],
                      oracle: list[torch.Tensor], test: list[torch.Tensor], dtype: str) -> JsonObject:
    """A failing sample's verdict judged once more against the decomposition's pair (``runs``: its
    outputs in the sample's dtype and in float64); a pass there wins, marked as such."""
    try:
        with decomposition():
            base2, orc2 = (flat_outputs(x) for x in runs())
    except Exception:  # noqa: BLE001 - no second definition to judge by
        return verdict
    if not base2 or orc2 is None or (_same(base2, baseline) and _same(orc2, oracle)):
        return verdict  # no decomposition, or one that computes exactly what the kernel does
    second = judge_outputs(orc2, base2, test, dtype)
    if second["status"] != "pass":
        return verdict
    return {**second, "definition": "decomposition", "kernel_reason": verdict.get("reason")}


def _also_raised_by_decomposition(call: Callable[[], object], exc: BaseException) -> str | None:
    """The decomposition's own error where it raises the compiled call's error too (the same first
    line of message); None otherwise."""
    try:
        with decomposition():
            call()
    except Exception as mine:  # noqa: BLE001 - compared with the backend's
        line = error_text(mine).split(": ", 1)[-1]
        if line and line in str(exc):
            return error_text(mine)
    return None


def _eager_pair(op: Callable[..., object], sample: Sample, grad: bool = False) -> tuple[object, object]:
    """The eager runs a sample is judged by: ``op`` in the sample's dtype and in float64 (their
    gradients with ``grad``)."""
    if grad:
        return _grads(op, sample, False), _grads(op, sample, True)
    return op(*sample.args, **sample.kwargs), op(*upcast(sample.args), **upcast(sample.kwargs))


def run_sample(op: Callable[..., object], compiled: Callable[..., object], sample: Sample) -> JsonObject:
    """Run one sample eagerly (in its dtype and in float64) and compiled; its verdict: ``status``
    (pass, fail, error, unsupported, skipped) and ``reason``, the errors weighed. A sample that
    fails against eager's kernel is judged against PyTorch's decomposition too (:func:`decomposition`)."""
    try:
        baseline, oracle = _eager_pair(op, sample)
    except Exception as exc:  # noqa: BLE001 - eager rejects the sample: it does not apply
        return {"status": "skipped", "reason": f"eager rejects this sample ({error_text(exc)})"}
    base, orc = flat_outputs(baseline), flat_outputs(oracle)
    if not base or orc is None:
        return {"status": "skipped", "reason": "non-numeric output (no tensor to compare)"}
    try:
        out = compiled(*sample.args, **sample.kwargs)
    except NotTaken as exc:
        return {"status": "unsupported", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the backend's or the capture's failure is the verdict
        kind = failure_kind(exc)
        if kind == "backend":
            return {"status": "unsupported", "reason": f"the backend does not compile it: {error_text(exc)}"}
        if kind == "capture":
            return {"status": "unsupported", "reason": f"Dynamo cannot capture it: {error_text(exc)}"}
        also = _also_raised_by_decomposition(lambda: op(*sample.args, **sample.kwargs), exc)
        if also is not None:
            return {"status": "skipped", "reason": f"PyTorch's decomposition rejects this sample too ({also}), "
                                                   "where eager's kernel computes it: not judged"}
        return {"status": "error", "reason": f"the compiled call raised {error_text(exc)}"}
    test = flat_outputs(out)
    if test is None:
        return {"status": "fail", "reason": f"the compiled call returned {type(out).__name__}, not tensors"}
    verdict = judge_outputs(orc, base, test, sample.dtype,
                            noise=lambda seed: flat_outputs(op(*_perturbed(sample, seed).args,
                                                               **_perturbed(sample, seed).kwargs)))
    if verdict["status"] == "fail":
        verdict = _or_decomposition(verdict, lambda: _eager_pair(op, sample), base, orc, test, sample.dtype)
    return verdict


def _perturbed(sample: Sample, seed: int) -> Sample:
    """``sample`` with its floating inputs moved within their dtype's rounding
    (:func:`~debug_framework.comparison.perturb_within_rounding`; the same seed, the same inputs)."""
    return Sample(sample.source, sample.label, sample.dtype, perturb_within_rounding(list(sample.args), seed),
                  perturb_within_rounding(dict(sample.kwargs), seed))


def run_eagerly(op: Callable[..., object], sample: Sample, grad: bool = False) -> None:
    """The eager runs a sample's judgement makes (in its dtype and in float64; their gradients with
    ``grad``), nothing compiled: whether eager itself survives the sample. An exception is a
    survival (eager rejects the sample); a crash ends the process."""
    try:
        _eager_pair(op, sample, grad)
    except Exception:  # noqa: BLE001 - rejected, not crashed
        pass


def _leaves(args: list[object], kwargs: dict[str, object],
            up: bool) -> tuple[list[object], dict[str, object], list[torch.Tensor]]:
    """The sample's arguments with each floating tensor a fresh leaf that requires grad (same view:
    ``detach`` keeps strides and offset), in float64 with ``up``; and those leaves."""
    leaves: list[torch.Tensor] = []

    def conv(v: object) -> object:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            leaf = (v.detach().to(torch.float64) if up else v.detach()).requires_grad_(True)
            leaves.append(leaf)
            return leaf
        if isinstance(v, (list, tuple)):
            return type(v)(conv(x) for x in v)
        return upcast(v) if up else v

    return conv(list(args)), {k: conv(v) for k, v in kwargs.items()}, leaves


def _grads(fn: Callable[..., object], sample: Sample, up: bool) -> list[torch.Tensor] | None:
    """Gradients of sum(output_i x cotangent_i) over the floating outputs with respect to every
    floating input, the cotangents drawn from a fixed seed (so every run weighs the same); None
    when nothing differentiable comes out."""
    args, kwargs, leaves = _leaves(sample.args, sample.kwargs, up)
    outs = [o for o in flat_outputs(fn(*args, **kwargs)) or [] if o.is_floating_point() and o.requires_grad]
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]


def run_backward(op: Callable[..., object], compiled: Callable[..., object], sample: Sample) -> JsonObject:
    """The backward pass of one sample: the gradients of the compiled call against float64 eager's,
    relative to eager's in the sample's dtype, by the same rule as :func:`run_sample`'s outputs."""
    try:
        baseline, oracle = _eager_pair(op, sample, grad=True)
    except Exception as exc:  # noqa: BLE001 - eager cannot differentiate this sample
        return {"status": "skipped", "reason": f"eager's backward rejects this sample ({error_text(exc)})"}
    if baseline is None or oracle is None:
        return {"status": "skipped", "reason": "no differentiable output"}
    try:
        test = _grads(compiled, sample, up=False)
    except Exception as exc:  # noqa: BLE001 - the backend's or the capture's failure is the verdict
        kind = failure_kind(exc)
        if kind != "runtime":
            return {"status": "unsupported", "reason": f"backward: {kind} failure: {error_text(exc)}"}
        also = _also_raised_by_decomposition(lambda: _grads(op, sample, False), exc)
        if also is not None:
            return {"status": "skipped", "reason": f"PyTorch's decomposition rejects this sample's backward too "
                                                   f"({also}), where eager's kernels compute it: not judged"}
        return {"status": "error", "reason": f"the compiled backward raised {error_text(exc)}"}
    if test is None:
        return {"status": "fail", "reason": "the compiled call's outputs carry no gradient"}
    verdict = judge_outputs(oracle, baseline, test, sample.dtype,
                            noise=lambda seed: _grads(op, _perturbed(sample, seed), False))
    if verdict["status"] == "fail":
        verdict = _or_decomposition(verdict, lambda: _eager_pair(op, sample, grad=True), baseline, oracle, test,
                                    sample.dtype)
    return verdict


def _same(a: object, b: object) -> bool:
    fa, fb = flat_outputs(a), flat_outputs(b)
    if fa is None or fb is None or len(fa) != len(fb):
        return fa is None and fb is None
    for x, y in zip(fa, fb, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point() or x.is_complex():
            if not bool(((x == y) | (x.isnan() & y.isnan())).all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def randomness(op: Callable[..., object], sample: Sample) -> str | None:
    """Why the operator's output cannot be judged against another run, found by running it eagerly
    three times (seeds 0, 0, 1): uninitialised or nondeterministic, or random; None when it repeats."""
    try:
        runs = []
        for seed in (0, 0, 1):
            torch.manual_seed(seed)
            runs.append(op(*sample.args, **sample.kwargs))
    except Exception:  # noqa: BLE001 - the sample itself is judged (and skipped) by run_sample
        return None
    if not _same(runs[0], runs[1]):
        return "nondeterministic output: two eager runs with the same seed differ"
    if not _same(runs[0], runs[2]):
        return "random output: it depends on the RNG seed"
    return None


def badness(result: JsonObject) -> tuple[int, float]:
    """How bad a sample's (or an output's) result is, to pick the worst with ``max``: its status
    first (crashes and hangs, errors, failures, passes: a failing one always outranks a passing one,
    whatever their numbers), then error / bound (the plugin sweep's ranking,
    :func:`~debug_framework.plugins.evaluate.badness`, on ``backend_error``; skipped and unsupported
    samples rank last)."""
    return plugin_badness(result, error_key="backend_error", unranked=("skipped", "unsupported"))
