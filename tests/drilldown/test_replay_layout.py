"""A replayed operator is given the trusted value laid out as the alternative's own input was: a
``view`` the alternative could take of its (contiguous) input must work on the replay's copy too,
whatever layout the trusted computation left (a transposed product, as a stock ``addmm`` gives
where the alternative's quantized linear gives a contiguous tensor)."""

from __future__ import annotations

import torch

from debug_framework.services.drilldown.judge import _cast_like


def test_the_copy_takes_the_alternatives_layout():
    trusted = torch.randn(4, 6, dtype=torch.float64).t()  # [6, 4], not contiguous
    own = torch.randn(6, 4, dtype=torch.float32)  # the alternative's: contiguous
    with_view = trusted.contiguous()
    copy = _cast_like(trusted, own, "cpu")
    assert copy.dtype == torch.float32 and copy.stride() == own.stride()
    assert torch.equal(copy.view(24), with_view.to(torch.float32).view(24))  # the view the operator takes
    assert copy.data_ptr() != trusted.data_ptr()


def test_a_permuted_input_keeps_its_strides_and_an_expanded_one_becomes_contiguous():
    own = torch.randn(2, 3, 5).permute(2, 0, 1)  # dense, permuted
    trusted = torch.randn(5, 2, 3, dtype=torch.float64)
    copy = _cast_like(trusted, own, "cpu")
    assert copy.stride() == own.stride() and torch.equal(copy, trusted.to(torch.float32))
    expanded = torch.randn(1, 3).expand(4, 3)  # overlapping: no copy can share its strides
    copy = _cast_like(torch.randn(4, 3, dtype=torch.float64), expanded, "cpu")
    assert copy.is_contiguous() and copy.dtype == expanded.dtype
