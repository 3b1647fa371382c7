"""One small model per class of wrong-result bug (``--model tests/diff/bug_models.py:<name>``), each
paired in :data:`CASES` with the backend of ``bug_backends.py`` that miscompiles it, whether it needs
``--gradients``, and the op the minifier must reduce it to. Factories return ``(model, inputs)``."""

import torch


def _inplace(x):
    x.sin_()  # an in-place op on a graph input
    return x * 3.0


def _overflow(x, i):
    j = (i * 3_000_000_019) % x.shape[0]  # the index computation overflows int32
    return x[j] * 2.0


def _dtype(x, a, b):
    return x * 2.0, torch.abs(a + b)


def _nan(x):
    return torch.where(x > 0, torch.log(x), torch.zeros_like(x)) * 2.0 + 1.0


def _softmax(x, w):
    return torch.softmax(x * 100.0, -1) @ w


def _gen():
    return torch.Generator().manual_seed(0)


def inplace():
    return _inplace, (torch.randn(4, 8, generator=_gen()),)


def overflow():
    return _overflow, (torch.randn(1000, generator=_gen()), torch.arange(1, 9))


def dtype():
    g = _gen()
    return _dtype, (torch.randn(4, generator=g), torch.randint(-50, 50, (6,), dtype=torch.int8, generator=g),
                    torch.randint(-50, 50, (6,), dtype=torch.int8, generator=g))


def nan():
    return _nan, (torch.randn(16, generator=_gen()),)


def softmax():
    g = _gen()
    return _softmax, (torch.randn(4, 8, generator=g), torch.randn(8, 3, generator=g))


def gradient():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(5, 8, generator=_gen()),)


#: name -> (backend in bug_backends.py, needs --gradients, the failure class, an op the minimum consists of)
CASES = {
    "inplace": ("mul_one_percent", False, "value", "mul"),
    "overflow": ("int_index_int32", False, "value", "mul"),
    "dtype": ("int8_add_widened", False, "dtype", "add"),
    "nan": ("where_as_arithmetic", False, "nonfinite", "where"),
    "softmax": ("softmax_unstable", False, "nonfinite", "softmax"),
    "gradient": ("relu_grad_scaled", True, "value", "threshold_backward"),
}


def _transcendental(x):
    return (x.exp() * x.sin()).tanh().sum(-1)


def _big_sum(x):
    return x.sum(0)


def _tiny_variance_norm(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=0.0)


def fp16_transcendental():
    return _transcendental, (torch.randn(64, 256, generator=_gen()).half(),)


def large_reduction():
    g = _gen()
    big = torch.randn(100_000, 4, generator=g) * 1e4
    return _big_sum, (torch.cat([big, -big + 1e-3 * torch.randn(100_000, 4, generator=g)]),)  # cancels to ~0.3


def tiny_variance_norm():
    return _tiny_variance_norm, (1000.0 + 1e-3 * torch.randn(8, 64, generator=_gen()),)


#: precision-only cases (model factory names): compiled with ``more_precise`` they must pass at defaults
PRECISION_CASES = ("fp16_transcendental", "large_reduction", "tiny_variance_norm")
