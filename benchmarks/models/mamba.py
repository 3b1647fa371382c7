"""A Mamba-style selective state space model (Gu & Dao, 2023), written out.

One residual block:  x + Mixer(RMSNorm(x)), where the Mixer is

    (x, z) = in_proj(u)                          # (B, L, 2*D)   D = expand * d_model
    x = SiLU(causal depthwise conv1d(x))         # (B, L, D)     kernel d_conv, groups = D
    (dt, B, C) = x_proj(x)                       # input-dependent: dt (B,L,R), B (B,L,N), C (B,L,N)
    delta = softplus(dt_proj(dt))                # (B, L, D)     step size per token and channel
    A = -exp(A_log)                              # (D, N)        diagonal, negative real
    discretisation (zero-order hold on A, Euler on B, as in the paper's reference):
        A_bar_t = exp(delta_t * A)               # (B, L, D, N)
        B_bar_t = delta_t * B_t                  # (B, L, D, N)
    the recurrence over time, per channel d and state n:
        h_t = A_bar_t * h_{t-1} + B_bar_t * x_t
        y_t = <C_t, h_t> + D_skip * x_t
    y = y * SiLU(z);  out_proj(y)                # (B, L, d_model)

``selective_scan`` evaluates that recurrence in one of two ways that compute the same numbers:

* ``"sequential"``: the literal loop over t (the paper's ``selective_scan_ref``). Under ``torch.compile``
  Dynamo unrolls it into L copies of the step, so graphs grow with the sequence length.
* ``"chunked"`` (default): the sequence is cut into chunks of T steps. Inside a chunk the recurrence is
  unrolled in closed form, h_t = sum_{s<=t} exp(S_t - S_s) * B_bar_s x_s + exp(S_t) * h_start with
  S_t = sum_{r<=t} delta_r A (the cumulative log of A_bar; only t >= s terms, so every exponent is <= 0
  and nothing overflows); the state h is carried from chunk to chunk by the same recurrence. L/T
  steps of the loop, each a handful of tensor ops, so compiled graphs stay small.

``tests/bench/test_models.py`` checks that both agree with each other to float32 rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def selective_scan_sequential(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              C: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """x, delta: (B, L, D); A: (D, N); B, C: (B, L, N); D: (D,) -> y (B, L, D). The literal recurrence."""
    b, length, d = x.shape
    dA = delta.unsqueeze(-1) * A                                    # (B, L, D, N)  log A_bar
    dBx = delta.unsqueeze(-1) * B.unsqueeze(2) * x.unsqueeze(-1)    # (B, L, D, N)  B_bar x
    h = x.new_zeros(b, d, A.shape[1])                               # (B, D, N)
    ys = []
    for t in range(length):
        h = torch.exp(dA[:, t]) * h + dBx[:, t]                     # h_t = A_bar_t h_{t-1} + B_bar_t x_t
        ys.append((h * C[:, t].unsqueeze(1)).sum(-1))               # y_t = C_t h_t            (B, D)
    return torch.stack(ys, dim=1) + x * D


def selective_scan_chunked(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                           C: torch.Tensor, D: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Same contract and numbers as :func:`selective_scan_sequential`, T = ``chunk`` steps at a time."""
    b, length, d = x.shape
    dA = delta.unsqueeze(-1) * A                                    # (B, L, D, N)
    dBx = delta.unsqueeze(-1) * B.unsqueeze(2) * x.unsqueeze(-1)    # (B, L, D, N)
    h = x.new_zeros(b, d, A.shape[1])                               # state carried between chunks
    ys = []
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        T = end - start
        S = torch.cumsum(dA[:, start:end], dim=1)                   # (B, T, D, N)  S_t
        seg = S.unsqueeze(2) - S.unsqueeze(1)                       # (B, T, T, D, N)  S_t - S_s
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp(seg.masked_fill(~causal[None, :, :, None, None], float("-inf")))
        h_all = torch.einsum("btsdn,bsdn->btdn", decay, dBx[:, start:end]) \
            + torch.exp(S) * h.unsqueeze(1)                          # (B, T, D, N)  h_t for t in chunk
        ys.append(torch.einsum("btdn,btn->btd", h_all, C[:, start:end]))
        h = h_all[:, -1]                                            # h at the chunk's last step
    return torch.cat(ys, dim=1) + x * D


class MambaMixer(nn.Module):
    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
                 dt_rank: int | None = None, scan: str = "chunked", chunk: int = 16) -> None:
        super().__init__()
        if scan not in ("chunked", "sequential"):
            raise ValueError("scan must be 'chunked' or 'sequential'")
        d_inner = expand * d_model
        self.d_inner, self.d_state, self.scan, self.chunk = d_inner, d_state, scan, chunk
        self.dt_rank = dt_rank or math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        # S4D-real initialisation: A = -(1..N) for every channel; dt bias so softplus(bias) in [1e-3, 1e-1]
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.D = nn.Parameter(torch.ones(d_inner))
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        length = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)                            # (B, L, D) each
        x = self.conv1d(x.transpose(1, 2))[..., :length].transpose(1, 2)   # causal depthwise conv
        x = F.silu(x)
        dt, B, C = torch.split(self.x_proj(x), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))                               # (B, L, D) input-dependent step
        A = -torch.exp(self.A_log)                                         # (D, N)
        if self.scan == "chunked":
            y = selective_scan_chunked(x, delta, A, B, C, self.D, self.chunk)
        else:
            y = selective_scan_sequential(x, delta, A, B, C, self.D)
        return self.out_proj(y * F.silu(z))


class MambaBlock(nn.Module):
    def __init__(self, d_model: int, **mixer: object) -> None:
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.mixer = MambaMixer(d_model, **mixer)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))


class MambaLM(nn.Module):
    """Token ids (B, L) -> logits (B, L, vocab): embedding, ``n_layers`` residual Mamba blocks, RMSNorm,
    an LM head tied to the embedding."""

    def __init__(self, vocab_size: int = 6144, d_model: int = 512, n_layers: int = 14, d_state: int = 16,
                 d_conv: int = 4, expand: int = 2, scan: str = "chunked", chunk: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(MambaBlock(d_model, d_state=d_state, d_conv=d_conv, expand=expand,
                                               scan=scan, chunk=chunk) for _ in range(n_layers))
        self.norm_f = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)                                      # (B, L, d_model)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm_f(x))
