"""Example Triton kernel: softmax over one dim (implements aten::softmax.int).

On a machine without a GPU it runs in Triton's interpreter (TRITON_INTERPRET=1, which
debug_framework sets when torch sees no CUDA device); on a GPU it is JIT-compiled by Triton.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, num / den, mask=mask)


def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim, dtype=dtype)`` computed by a Triton kernel, one program per row."""
    if dtype is not None:
        x = x.to(dtype)
    if x.dim() == 0:
        return torch.ones_like(x)
    moved = x.movedim(dim, -1).contiguous()
    n_cols = moved.shape[-1]
    rows = moved.reshape(-1, n_cols) if n_cols else moved.reshape(0, 0)
    out = torch.empty_like(rows)
    if rows.numel():
        _softmax_rows[(rows.shape[0],)](rows, out, n_cols, rows.stride(0), out.stride(0),
                                        BLOCK=triton.next_power_of_2(n_cols))
    return out.reshape(moved.shape).movedim(-1, dim)
