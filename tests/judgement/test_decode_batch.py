"""decode_batch.measure_many: the references stacked once for the comparisons and the RMS give, pair
by pair, what each pair measured alone gives (a stack shared by pairs of other alternative dtypes, a
stack of mixed shapes and views, a non-finite reference, a shape mismatch, NumPy inputs)."""

from __future__ import annotations

import math

import numpy as np
import torch

from debug_framework.comparison import Tolerance
from debug_framework.services.validation.decode_batch import Pair, measure_many
from debug_framework.services.validation.evidence import reference_scale


def _fields(result: object) -> tuple[object, ...]:
    return tuple(repr(getattr(result, f)) for f in result.__dataclass_fields__ if f != "name")  # type: ignore[attr-defined]


def test_batched_pairs_measure_what_each_pair_alone_measures() -> None:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 6, 4, 8, generator=gen, dtype=torch.float64)
    refs: list[object] = [torch.randn(2, 1, 64, generator=gen, dtype=torch.float64) for _ in range(3)]
    refs += [cache[:, -2:], cache[:, -2:, :, :4].contiguous().reshape(2, 2, 2, 8)]  # a view; another shape, same size
    alts: list[object] = [(r + 1e-6 * torch.randn(r.shape, generator=gen, dtype=torch.float64)).float() for r in refs]
    alts[1] = refs[1] + 1e-9  # float64 against float64: another group over the same stack of references
    nan = refs[2].clone()
    nan[0, 0, 3] = math.nan
    refs.append(nan)  # a non-finite reference: its stack's RMS comes from reference_scale, its pair from compare
    alts.append(refs[2].float())  # finite: only the reference tells this pair to compare
    refs.append(torch.randn(2, 1, 64, generator=gen, dtype=torch.float64))
    alts.append(torch.randn(2, 1, 63))  # a shape mismatch
    refs.append(np.linspace(-1.0, 1.0, 128).reshape(2, 1, 64))
    alts.append(np.linspace(-1.0, 1.0, 128, dtype=np.float32).reshape(2, 1, 64))
    tol = Tolerance(rtol=1e-4, atol=1e-4)
    pairs = [Pair(r, a, tol if i % 2 else None, f"p{i}") for i, (r, a) in enumerate(zip(refs, alts))]  # type: ignore[arg-type]

    results, scales = measure_many(pairs)
    alone = [measure_many([p]) for p in pairs]
    assert [_fields(r) for r in results] == [_fields(a[0][0]) for a in alone]
    # the RMS: sqrt(mean(x**2)) where the reference's stack (its size and
    # dtype) is all finite, else reference_scale (here the stack of 128 float64 values holds the NaN)
    for t, got in zip(refs, scales):
        x = np.asarray(torch.as_tensor(t).reshape(-1))
        want = reference_scale(t) if x.size == 128 else float(np.sqrt(np.square(x[None]).mean(1))[0])
        assert got == want
    assert not results[6].shape_match and results[5].nan_count_ref == 1


def test_the_fused_row_pass_gives_numpys_own_figures() -> None:
    """comparison.row_errors sums as NumPy's add.reduce does (pairwise, blocks of 128, halves above):
    each figure equals the NumPy expression it replaces to the last bit, at sizes below, at and above
    a block, per-row tolerances included."""
    from debug_framework.comparison import ROW_SUMS, row_errors

    rng = np.random.default_rng(0)
    for n in (1, 7, 9, 128, 129, 300, 1000, 8195):
        y = rng.standard_normal((3, n)) * 10.0 ** rng.integers(-3, 3, (3, 1))
        y[:, ::5] = 0.0  # the relative error's floor
        x = (y + rng.standard_normal((3, n)) * 1e-4).astype(np.float32).astype(np.float64)
        rtol, atol, gross = np.array([1.3e-6, 1e-3, 0.0]), np.array([1e-5, 1e-6, 1e-4]), np.array([10.0, 1.0, 2.0])
        ad, sums, worst, finite = row_errors(x, y, rtol, atol, gross, 1.2e-7)
        d = x - y
        bound = atol[:, None] + rtol[:, None] * np.abs(y)
        rel = np.abs(d) / np.maximum(np.abs(y), 1.2e-7)
        want = np.stack([np.abs(d).sum(1), (d * d).sum(1), (x * x).sum(1), (x * y).sum(1), rel.sum(1), rel.max(1),
                         (np.abs(d) > bound).sum(1), (np.abs(d) > gross[:, None] * bound).sum(1)], 1)
        assert sums.shape[1] == len(ROW_SUMS)
        assert np.array_equal(ad, np.abs(d)) and np.array_equal(sums, want), n
        assert np.array_equal(worst, np.abs(d).argmax(1)) and finite.all()
    x[1, 3] = math.inf
    assert row_errors(x, y, rtol, atol, gross, 1.2e-7)[3].tolist() == [True, False, True]


def test_pairs_of_several_steps_measure_what_each_steps_pairs_alone_measure() -> None:
    """measure_many with ``parts`` (a decode step each): a non-finite reference in one step's stack
    leaves the other steps' RMS of that stack as their own step alone gives it."""
    gen = torch.Generator().manual_seed(1)
    steps = [[torch.randn(2, 1, 16, generator=gen, dtype=torch.float64) for _ in range(3)] for _ in range(3)]
    steps[1][2][0, 0, 5] = math.nan
    pairs = [[Pair(r, r.float(), None, f"{s}.{i}") for i, r in enumerate(refs)] for s, refs in enumerate(steps)]
    flat, parts = [p for step in pairs for p in step], [s for s, step in enumerate(pairs) for _ in step]
    results, scales = measure_many(flat, parts)
    alone = [measure_many(step) for step in pairs]
    assert [_fields(r) for r in results] == [_fields(r) for step in alone for r in step[0]]
    assert scales == [v for step in alone for v in step[1]]
    assert scales[3] == reference_scale(steps[1][0]) != float(np.sqrt(np.square(steps[1][0].numpy()).mean()))


def test_the_logits_of_several_steps_give_what_each_steps_logits_alone_give() -> None:
    """next_token_metrics_many: each pair's metrics as next_token_metrics gives them, to the last
    bit (a flip, a non-finite alternative row, a large error, a pair with a non-finite reference
    and one of another shape among them)."""
    from debug_framework.comparison.next_token import next_token_metrics, next_token_metrics_many

    rng = np.random.default_rng(0)
    refs = [rng.standard_normal((2, 1, 300)) for _ in range(6)] + [rng.standard_normal((3, 300))]
    alts = [(r + 1e-6 * rng.standard_normal(r.shape)).astype(np.float32) for r in refs]
    alts[1][0, 0, :2] = alts[1][0, 0, 1::-1] + [5.0, -5.0]  # its top-1 flips, an error above 1
    alts[2][1, 0, 7] = math.inf
    refs[3][0, 0, 3] = math.nan  # left out by next_token_metrics itself
    pairs = list(zip(refs, alts))
    got = next_token_metrics_many(pairs)
    want = [next_token_metrics(r, a) for r, a in pairs]
    assert [repr(m) for m in got] == [repr(m) for m in want]
    assert got[1].flips and math.isinf(got[2].kl_divergence["max"]) and got[3].positions == 1
