"""A module backend's layer replay skips the layers before the replayed one, once it has checked on
this model that skipping changes nothing; a model whose layers talk past their hidden state keeps
running every layer (docs/scaling.md, "Isolation was the time")."""

from __future__ import annotations

import torch

from debug_framework.backends import get_backend
from debug_framework.modelio import load_model
from debug_framework.modelio.inputs import ModelInputs


def _prepared(path):
    model = load_model(path)
    backend = get_backend("pytorch")
    backend.prepare(model, "float32", "cpu")
    inputs = ModelInputs.random(model.config.vocab_size, 2, 8, seed=1, pad_lengths=[0, 2])
    return model, backend, inputs, backend.run(inputs, None, capture_layer_inputs=True)


def _calls(backend, i: int) -> list[int]:
    """A counter of layer ``i``'s forward calls (hooks run whether or not the layer is skipped, so
    the counter wraps the forward itself)."""
    layer = backend.module.get_submodule(backend.layer_modules[i])
    count = [0]
    forward = layer.forward

    def counted(*args, **kwargs):
        count[0] += 1
        return forward(*args, **kwargs)

    layer.forward = counted
    return count


def test_replays_skip_earlier_layers_and_give_the_same_tensors(tiny):
    model, backend, inputs, full = _prepared(tiny("llama"))
    assert model.num_layers >= 3
    backend._skip_ok = False
    slow = [backend.run_layer(i, full.layer_inputs[i], inputs) for i in range(model.num_layers)]
    backend._skip_ok = None
    first = _calls(backend, 0)
    fast = [backend.run_layer(i, full.layer_inputs[i], inputs) for i in range(model.num_layers)]
    assert backend._skip_ok is True
    # layer 0 ran for its own replay and once more for the one check (layer 1 run both ways), then never
    assert first[0] == 2
    for a, b in zip(slow, fast, strict=True):
        assert set(a.tensors) == set(b.tensors) and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    # the MLP block replays skip too and agree with the whole-layer replay's post_mlp
    mlp = backend.run_block(2, "mlp", full[next(k for k in full.tensors if k.name == "post_attention" and k.layer == 2)],
                            inputs)
    assert first[0] == 2 and mlp.tensors


def test_layers_that_talk_past_their_hidden_state_are_never_skipped(tiny):
    model, backend, inputs, full = _prepared(tiny("llama"))
    layers = [backend.module.get_submodule(backend.layer_modules[i]) for i in range(2)]
    said: dict[str, torch.Tensor] = {}
    # layer 0 leaves a value that layer 1 reads (as a shared position bias or a side cache would)
    layers[0].register_forward_hook(lambda _m, _a, out: said.__setitem__("v", (out[0] if isinstance(out, tuple) else out)
                                                                       .mean()))
    layers[1].register_forward_pre_hook(lambda _m, args: (args[0] + said["v"], *args[1:]) if args else None)
    full = backend.run(inputs, None, capture_layer_inputs=True)
    backend._skip_ok = None
    got = backend.run_layer(1, full.layer_inputs[1], inputs)
    assert backend._skip_ok is False
    backend._skip_ok = False
    want = backend.run_layer(1, full.layer_inputs[1], inputs)
    assert all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)


def test_preparing_another_model_checks_skipping_anew(tiny):
    _model, backend, inputs, full = _prepared(tiny("llama"))
    backend.run_layer(1, full.layer_inputs[1], inputs)
    assert backend._skip_ok is True
    backend.prepare(load_model(tiny("bert")), "float32", "cpu")  # the same backend, another model
    assert backend._skip_ok is None
