"""An operator's bound is not scaled by an additive mask's sentinel (issue 30, item 6): the
attention-mask add of a float32 run showed bound 2.8e+31 and margin 1.6e-41, because the RMS that
scales the bound included the mask's ``finfo.min`` values, which hid a real error in the operator
after it. Values at the extreme of the dtype's range on both sides are neither scale nor error."""

from __future__ import annotations

import torch

from debug_framework.comparison import RatioRule
from debug_framework.services.drilldown.judge import rms_error, value_scale

F32 = torch.finfo(torch.float32)


def _masked_scores() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    trusted = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    mask = torch.ones(8, 8).triu(1).bool()
    trusted = trusted.masked_fill(mask, F32.min)  # the causal mask, added as HF adds it
    return trusted, mask


def test_the_mask_sentinel_neither_scales_the_bound_nor_counts_as_error():
    trusted, mask = _masked_scores()
    bound = RatioRule.calibrated(value_scale(trusted, torch.float32), F32.eps).floor
    assert bound < 1e-5  # eps x the RMS of the scores, not of 3.4e38
    alt = trusted.to(torch.float32)
    assert rms_error(alt, trusted) < 1e-7
    # an error of 1e-3 on the scores themselves exceeds it: the operator after the mask is judged
    wrong = (trusted + 1e-3 * (~mask)).to(torch.float32)
    assert rms_error(wrong, trusted) > 100 * bound


def test_a_tensor_of_nothing_but_extremes_keeps_its_scale_and_wrong_signs_still_count():
    full = torch.full((4,), F32.min, dtype=torch.float64)
    assert torch.equal(value_scale(full, torch.float32), full)
    assert rms_error(torch.full((4,), F32.max, dtype=torch.float32), full) > 1e38
