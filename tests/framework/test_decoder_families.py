"""The references written from the math for Mistral, Qwen3, Phi-3, Gemma 2, Gemma 3 text and
Qwen3-MoE against transformers' own eager code run in float64, at every checkpoint; and the configs
they refuse.

transformers' eager code computes its norms, rotary angles and softmaxes in float32 even in a
float64 model; :func:`float64_transformers` turns those float32 requests into float64 ones while the
model runs, so that what remains between the two is float64 rounding.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from debug_framework.architectures import GemmaReference, MoeReference, build_reference
from debug_framework.errors import ModelLoadingError
from debug_framework.modelio import load_model, parse_config

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.models.tiny_transformers import WINDOW  # noqa: E402

FAMILIES = ("mistral", "qwen3", "phi3", "gemma2", "gemma3_text", "qwen3_moe")
LENGTH = 3 * WINDOW  # longer than the sliding window


@contextlib.contextmanager
def float64_transformers() -> Iterator[None]:
    """transformers' float32 requests (``.float()``, ``.to(torch.float32)``, softmax's and
    ``arange``'s ``dtype``: norms, softmaxes, rotary frequencies) become float64 while the context
    lasts, and new tensors default to float64."""
    T, F = torch.Tensor, torch.nn.functional
    to, flt, softmax, arange, default = T.to, T.float, F.softmax, torch.arange, torch.get_default_dtype()

    def arange64(*args, dtype=None, **kwargs):
        return arange(*args, dtype=torch.float64 if dtype is torch.float32 else dtype, **kwargs)

    def to64(self, *args, **kwargs):
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    def softmax64(x, *args, dtype=None, **kwargs):
        return softmax(x, *args, dtype=torch.float64 if dtype is torch.float32 else dtype, **kwargs)

    T.to, T.float, F.softmax, torch.arange = to64, T.double, softmax64, arange64
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        T.to, T.float, F.softmax, torch.arange = to, flt, softmax, arange
        torch.set_default_dtype(default)


def _hf_float64(path: Path) -> torch.nn.Module:
    """transformers' eager model of ``path`` in float64 (its weights as stored, its scalars exact)."""
    import transformers

    experts = {"experts_implementation": "eager"} if "moe" in path.parent.name else {}
    with float64_transformers():
        net = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager",
                                                                **experts)
    embed = net.model.embed_tokens
    if hasattr(embed, "scalar_embed_scale"):  # sqrt(hidden) as float64, not float32's rounding
        embed.embed_scale.fill_(embed.scalar_embed_scale)
    return net.eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (2, LENGTH), generator=gen)
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, LENGTH - 3:] = 0  # right padding
    return ids, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_matches_transformers_float64_at_every_checkpoint(family, tiny):
    path = tiny(family)
    net = _hf_float64(path)
    ids, mask = _inputs()
    seen: dict[str, torch.Tensor] = {}
    layers = net.model.layers
    post = "pre_feedforward_layernorm" if family.startswith("gemma") else "post_attention_layernorm"
    hooks = [getattr(layer, post).register_forward_pre_hook(lambda _m, a, i=i: seen.__setitem__(f"a{i}", a[0]))
             for i, layer in enumerate(layers)]
    if family == "qwen3_moe":  # the router returns (logits, top-k weights, top-k experts)
        hooks += [layer.mlp.gate.register_forward_hook(lambda _m, _a, o, i=i: seen.__setitem__(f"r{i}", o[0]))
                  for i, layer in enumerate(layers)]
    with torch.no_grad(), float64_transformers():
        out = net(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for h in hooks:
        h.remove()
    model = load_model(path)
    ref = build_reference(model.config, model.weights, np.float64)
    mine = ref.forward(ids.numpy(), mask.numpy())
    valid = mask.numpy().astype(bool)  # padded queries attend to nothing real: compare the real tokens

    def close(ours: np.ndarray, theirs: torch.Tensor, what: str) -> None:
        theirs = theirs.numpy().reshape(ours.shape)
        scale = np.abs(theirs).max()
        err = np.abs(ours - theirs)[valid].max() / scale
        assert err < 1e-10, (family, what, err)

    close(mine[("post_embedding", None)], out.hidden_states[0], "post_embedding")
    for i in range(len(layers)):
        close(mine[("post_attention", i)], seen[f"a{i}"], f"post_attention:{i}")
        if i + 1 < len(layers):  # the last hidden state transformers returns is after the final norm
            close(mine[("post_mlp", i)], out.hidden_states[i + 1], f"post_mlp:{i}")
    close(mine[("post_processing", None)], out.logits, "post_processing")
    if family == "qwen3_moe":
        assert isinstance(ref, MoeReference)
        for i in range(len(layers)):
            theirs = seen[f"r{i}"]
            assert mine[("router_logits", i)].shape == (valid.size, 4)  # one row per token, as transformers'
            close(mine[("router_logits", i)].reshape(*valid.shape, -1), theirs, f"router_logits:{i}")
    if family.startswith("gemma"):
        assert isinstance(ref, GemmaReference)


def test_the_variants_are_exercised(tiny):
    """The tiny configs slide (a window shorter than the inputs), alternate local and global
    layers, soft-cap and route: the comparison above would see each of them missing."""
    configs = {f: load_model(tiny(f)).config for f in FAMILIES}
    assert configs["mistral"].sliding_window == WINDOW < LENGTH and configs["mistral"].is_sliding(1)
    assert [configs["gemma2"].is_sliding(i) for i in range(3)] == [True, False, True]
    assert configs["gemma3_text"].local_rope_theta != configs["gemma3_text"].rope_theta
    assert configs["gemma2"].attn_logit_softcapping and configs["gemma2"].final_logit_softcapping
    assert configs["qwen3"].qk_norm and configs["phi3"].fused_projections
    assert configs["qwen3_moe"].num_experts_per_tok < configs["qwen3_moe"].num_experts


@pytest.mark.parametrize(("family", "changes", "named"), [
    ("gemma3_text", {"attn_logit_softcapping": 30.0}, "attn_logit_softcapping"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
    ("qwen3", {"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "chunked_attention"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope"),
    ("mistral", {"hidden_act": "gelu"}, "hidden_act"),
    ("gemma3_text", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
])
def test_options_the_references_do_not_implement_are_df004(family, changes, named, tiny):
    config = json.loads((tiny(family) / "config.json").read_text())
    parse_config(config)  # as saved: parses
    with pytest.raises(ModelLoadingError) as err:
        parse_config({**config, **changes})
    assert err.value.code == "DF004" and named in str(err.value)


def test_router_logits_are_a_checkpoint_of_the_moe_reference(tiny):
    from debug_framework.backends import get_backend
    from debug_framework.modelio import ModelInputs

    backend = get_backend("python_reference")
    backend.prepare(load_model(tiny("qwen3_moe")))
    capture = backend.run(ModelInputs.random(64, 2, LENGTH, seed=0), taps=["router_logits:1", "post_mlp:1"])
    assert capture["router_logits:1"].shape == (2 * LENGTH, 4) and capture["post_mlp:1"].shape == (2, LENGTH, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_mlx_runs_the_same_references(family, tiny):
    """The ``mlx`` backend runs the same classes over ``mlx.core``: float32 agreement at every
    checkpoint, and a block alone on the reference's input."""
    from debug_framework.backends import backend_availability, get_backend
    from debug_framework.modelio import ModelInputs

    ok, why = backend_availability().get("mlx", (False, "not registered"))
    if not ok:
        pytest.skip(f"mlx unavailable: {why}")
    model = load_model(tiny(family))
    inputs = ModelInputs.random(64, 2, LENGTH, seed=0, pad_lengths=[0, 3])
    reference, mlx = get_backend("python_reference"), get_backend("mlx")
    reference.prepare(model)
    mlx.prepare(model, "float32")
    expected, actual = reference.run(inputs), mlx.run(inputs)
    for key in expected:
        err = np.abs(np.asarray(actual[key], np.float64) - expected[key]).max() / np.abs(expected[key]).max()
        assert err < 1e-4, (family, str(key), err)
    block = mlx.run_block(1, "mlp", expected["post_attention:1"], inputs)["post_mlp:1"]
    assert np.abs(np.asarray(block, np.float64) - expected["post_mlp:1"]).max() < 1e-4
