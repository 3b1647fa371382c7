"""The benchmark workloads: sizes, and the SSM's selective scan against the literal recurrence."""

import pytest
import torch

from benchmarks.models.mamba import MambaLM, MambaMixer, selective_scan_chunked, selective_scan_sequential
from benchmarks.models.registry import WORKLOADS, param_count, resolve_names
from benchmarks.models.resnet import ResNet18


def test_resnet18_has_torchvisions_parameter_count():
    assert param_count(ResNet18()) == 11_689_512


def test_ssm_is_about_27m_parameters_with_tied_head():
    m = MambaLM()
    assert m.lm_head.weight is m.embedding.weight
    assert 26_000_000 < param_count(m) < 28_000_000


def test_bert_base_config_is_bert_base_sized():
    from transformers import BertConfig

    c = BertConfig()
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (12, 768, 12, 3072)


def _scan_inputs(b=2, length=29, d=6, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, d, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(b, length, d, generator=g))
    A = -torch.exp(torch.randn(d, n, generator=g))
    B = torch.randn(b, length, n, generator=g)
    C = torch.randn(b, length, n, generator=g)
    D = torch.randn(d, generator=g)
    return x, delta, A, B, C, D


@pytest.mark.parametrize("chunk", [1, 4, 8, 29, 64])
def test_chunked_scan_equals_the_literal_recurrence(chunk):
    args = _scan_inputs()
    ref = selective_scan_sequential(*(a.double() for a in args))
    got = selective_scan_chunked(*args, chunk=chunk)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_scan_by_hand_one_channel():
    # h_t = exp(delta_t a) h_{t-1} + delta_t b_t x_t ; y_t = c_t h_t + D x_t, written out for 3 steps
    x = torch.tensor([[[1.0], [2.0], [-1.0]]])
    delta = torch.tensor([[[0.5], [1.0], [0.25]]])
    A = torch.tensor([[-2.0]])
    B = torch.tensor([[[1.0], [0.5], [2.0]]])
    C = torch.tensor([[[3.0], [1.0], [-1.0]]])
    D = torch.tensor([0.1])
    h, ys = 0.0, []
    for t in range(3):
        d_, x_ = delta[0, t, 0].item(), x[0, t, 0].item()
        h = torch.exp(torch.tensor(d_ * -2.0)).item() * h + d_ * B[0, t, 0].item() * x_
        ys.append(C[0, t, 0].item() * h + 0.1 * x_)
    for fn in (selective_scan_sequential, lambda *a: selective_scan_chunked(*a, chunk=2)):
        torch.testing.assert_close(fn(x, delta, A, B, C, D)[0, :, 0], torch.tensor(ys))


def test_mixer_is_causal_and_carries_state():
    torch.manual_seed(0)
    mixer = MambaMixer(16, d_state=4, chunk=4).eval()
    u = torch.randn(1, 12, 16)
    u2 = u.clone()
    u2[:, 9] += 1.0
    with torch.no_grad():
        y, y2 = mixer(u), mixer(u2)
    torch.testing.assert_close(y[:, :9], y2[:, :9])          # the future does not leak backwards
    assert not torch.allclose(y[:, 10:], y2[:, 10:])          # the change reaches later steps via h (and conv)
    u3 = u.clone()
    u3[:, 0] += 1.0
    with torch.no_grad():
        y3 = mixer(u3)
    assert not torch.allclose(y[:, 8:], y3[:, 8:])            # beyond the conv window (4): only the state h carries it


def test_sequential_and_chunked_models_agree():
    torch.manual_seed(0)
    a = MambaLM(vocab_size=64, d_model=16, n_layers=2, d_state=4, chunk=4, scan="chunked").eval()
    b = MambaLM(vocab_size=64, d_model=16, n_layers=2, d_state=4, scan="sequential").eval()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_tiny_workloads_run(name):
    model, inputs = WORKLOADS[name].build("tiny")
    with torch.no_grad():
        out = model(*inputs)
    assert out.ndim >= 2 and torch.isfinite(out).all()


def test_aliases():
    assert resolve_names(["bert", "resnet", "mamba"]) == ["bert-minilm", "bert-base", "resnet18", "ssm"]
    with pytest.raises(KeyError):
        resolve_names(["vgg"])
