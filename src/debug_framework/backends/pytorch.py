"""``pytorch``: the Hugging Face ``transformers`` implementation in eager mode, loaded with the
framework's own weights (any format ``modelio`` reads), checkpoints taken by forward hooks."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..errors import BackendInitializationError, ModelLoadingError
from ..modelio.loader import LoadedModel
from .torch_module import TorchModuleBackend

__all__ = ["PyTorchBackend", "build_hf_model", "hf_skeleton"]


def hf_skeleton(model: LoadedModel, dtype: torch.dtype, *, meta: bool = False) -> tuple[torch.nn.Module, Any]:
    """The ``transformers`` eager model for ``model``'s configuration, without its weights (on the
    ``meta`` device with ``meta``: no memory), and its Hugging Face config.

    Raises:
        BackendInitializationError: transformers is missing (DF002).
    """
    try:
        import transformers
    except ImportError as exc:
        raise BackendInitializationError("transformers is not installed", backend="pytorch") from exc
    raw = {k: v for k, v in model.raw_config.items() if k not in ("architectures", "_name_or_path", "transformers_version")}
    hf_config = transformers.AutoConfig.for_model(**raw)
    auto = transformers.AutoModelForCausalLM if model.architecture == "llama" else transformers.AutoModel
    with torch.device("meta") if meta else contextlib.nullcontext():
        return auto.from_config(hf_config, attn_implementation="eager", dtype=dtype), hf_config


def build_hf_model(model: LoadedModel, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    """The ``transformers`` eager model for ``model`` (``BertModel`` / ``*ForCausalLM``) with its weights.

    Raises:
        BackendInitializationError: transformers is missing (DF002).
        ModelLoadingError: the weights do not fit the model (DF004).
    """
    net, hf_config = hf_skeleton(model, dtype)
    own = net.state_dict()
    state: dict[str, Any] = {}
    for name in own:
        if name in model.weights:
            state[name] = model.weights[name]
    missing = [n for n in own if n not in state]
    tied = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()
    untrusted = [n for n in missing if n not in tied and not n.startswith("pooler.")]
    if untrusted:
        raise ModelLoadingError(
            f"{len(untrusted)} tensors of the transformers model are not in the weights",
            file=str(model.path),
            tensor=untrusted[0],
        )
    net.load_state_dict(state, strict=False)
    if tied:
        net.tie_weights()
    return net.to(device).eval()


class PyTorchBackend(TorchModuleBackend):
    """Hugging Face eager PyTorch; dtype float32 (default), float16 or bfloat16; device cpu or cuda."""

    runs_onnx_files = False
    supported_dtypes = ("float32", "float16", "bfloat16", "float64")

    def __init__(self, device: str = "cpu") -> None:
        super().__init__("pytorch", build_hf_model, device=device)

    def availability(self) -> tuple[bool, str]:
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            return False, f"transformers is not installed: {exc}"
        return super().availability()

    def version_info(self) -> dict[str, Any]:
        import transformers

        return {**super().version_info(), "transformers": transformers.__version__}
