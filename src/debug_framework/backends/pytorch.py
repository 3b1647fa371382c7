"""``pytorch``: the Hugging Face ``transformers`` implementation in eager mode, loaded with the
framework's own weights (any format ``modelio`` reads), checkpoints taken by forward hooks."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..errors import BackendInitializationError, ModelLoadingError
from ..modelio.configs import MoeModelConfig
from ..modelio.loader import LoadedModel
from ..modelio.weights import FLOAT_DTYPES, torch_dtype_name
from ._streamed_layers import StreamPlan, stream_model
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
    if model.architecture == "generic":  # the model's own class (modelio.generic), whatever its family
        from ..modelio.generic import build_skeleton

        net = build_skeleton(model.raw_config, dtype, meta=meta, source=str(model.path))
        return net, net.config
    raw = {k: v for k, v in model.raw_config.items() if k not in ("architectures", "_name_or_path", "transformers_version")}
    hf_config = transformers.AutoConfig.for_model(**raw)
    auto = transformers.AutoModel if model.architecture == "bert" else transformers.AutoModelForCausalLM
    # mixtures of experts run their experts one by one in eager code (the grouped kernels refuse float64)
    experts = {"experts_implementation": "eager"} if isinstance(model.config, MoeModelConfig) else {}
    with torch.device("meta") if meta else contextlib.nullcontext():
        return auto.from_config(hf_config, attn_implementation="eager", dtype=dtype, **experts), hf_config


def _stored_tensor(model: LoadedModel, name: str) -> Any:
    """The tensor the model's parameter ``name`` takes from the weights: itself, or for a mixture of
    experts' fused ``mlp.experts.gate_up_proj`` / ``down_proj`` the checkpoint's per-expert
    projections stacked (``[X, 2F, D]``: each expert's gate then up; ``[X, D, F]``)."""
    weights = model.weights
    read = getattr(weights, "reading", weights.__getitem__)  # read to convert: no second mapping counted
    if name in weights:
        return read(name)
    config = model.config
    if not isinstance(config, MoeModelConfig) or not name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
        return None
    prefix = name.rsplit(".", 1)[0]
    parts = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
    names = [f"{prefix}.{e}.{part}.weight" for e in range(config.num_experts) for part in parts]
    if not all(n in model.weights for n in names):
        return None
    per_expert = [torch.cat([torch.as_tensor(read(f"{prefix}.{e}.{part}.weight")) for part in parts])
                  for e in range(config.num_experts)]
    return torch.stack(per_expert)


def _own_tensor(mine: Any, name: str, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The model's own copy of ``stored`` in ``dtype``: converted, or where the dtype is already the
    file's, the tensor of ``mine`` (a store of the model's own, :meth:`WeightStore.fork`: the file's
    pages through a copy-on-write mapping, no memory until written), else a copy."""
    if stored.dtype == dtype and mine is not None and name in mine:
        return torch.as_tensor(mine[name])
    return stored.to(dtype, copy=True)


def build_hf_model(model: LoadedModel, dtype: torch.dtype = torch.float32, device: str = "cpu", *,
                   stream: bool = False, shared: bool = False) -> torch.nn.Module:
    """The ``transformers`` eager model for ``model`` (``BertModel`` / ``*ForCausalLM``) with its weights.

    With ``stream`` (on the CPU), the parameters of the model's repeated layers and of its large
    tables (token embeddings, LM head) stay as the weights store them where that is another
    floating dtype, read-only, and become ``dtype`` as they are used, one layer at a time
    (:mod:`._streamed_layers`); the model's ``streamer`` attribute holds the layers' hooks. Such a
    model must never be written in place.

    With ``shared``, the tensors the weights already store in ``dtype`` are those of the mapping the
    loaded weights' readers share (pages counted once), not a copy-on-write mapping of the model's
    own: only for a model that never writes its weights (the reference's draft).

    Raises:
        BackendInitializationError: transformers is missing (DF002).
        ModelLoadingError: the weights do not fit the model (DF004).
    """
    if getattr(model.config, "weights_renamed", False):
        stored = _stored_dtype(model) if stream and device == "cpu" else None
        if stored is None or stored == dtype:
            return _from_pretrained(model, dtype).to(device).eval()
        return _stream_loaded(_from_pretrained(model, stored), stored, dtype).eval()
    # built on the meta device: nothing allocated or randomly initialised that the weights replace
    net, hf_config = hf_skeleton(model, dtype, meta=True)
    own = net.state_dict()
    plan = StreamPlan(net) if stream and device == "cpu" else None
    params = {n for n, _ in net.named_parameters(remove_duplicate=False)}
    # the tensors this model keeps at the file's dtype are its own: a store no other model reads
    weights = model.weights
    mine = weights if shared or getattr(weights, "private", False) else getattr(weights, "fork", lambda: None)()
    streamed: list[str] = []
    state: dict[str, Any] = {}
    for name, slot in own.items():
        tensor = _stored_tensor(model, name)
        if tensor is None:
            continue
        tensor = torch.as_tensor(tensor)
        want = slot.dtype
        if plan is not None and name in params and tensor.dtype != want and tensor.is_floating_point() and \
                plan.keeps(name):
            # kept as stored and made ``dtype`` where it is used: only ever read, so the pages the
            # other readers map (no second mapping of the file, whose pages would count twice)
            state[name] = tensor
            streamed.append(name)
            continue
        state[name] = _own_tensor(mine, name, tensor, want)  # the model's own, never those the references read
    missing = [n for n in own if n not in state]
    tied = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()
    if model.architecture == "generic":
        from ..modelio.generic import tied_names

        # tied parameters come from the tensor they are tied to; buffers the file lacks keep their
        # computed values (rotary frequencies, position ids)
        tied = tied_names(net) | {n for n in own if n not in params}
    untrusted = [n for n in missing if n not in tied and not n.startswith("pooler.")]
    if untrusted:
        raise ModelLoadingError(
            f"{len(untrusted)} tensors of the transformers model are not in the weights",
            file=str(model.path),
            tensor=untrusted[0],
        )
    try:
        net.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # a shape the model does not have
        raise ModelLoadingError(f"the weights do not fit the transformers model: {str(exc)[:300]}",
                                file=str(model.path)) from exc
    if tied:
        net.tie_weights()
    _materialise_rest(net)
    if streamed and plan is not None:
        stream_model(net, plan, dtype)
    return net.to(device).eval()


#: safetensors' dtype name -> the torch dtype, for the floating dtypes weights are read in
_STORED_DTYPES = {torch_dtype_name(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def _stored_dtype(model: LoadedModel) -> torch.dtype | None:
    """The narrowest floating dtype that holds every floating tensor of the weights exactly (the
    one they are all stored in; float32 for a mix of float16, bfloat16 and float32); None where the
    headers do not say or a dtype is not one of those."""
    weights = model.weights
    if not hasattr(weights, "dtype_name"):
        return None
    names = {str(weights.dtype_name(n)).upper() for n in weights}
    floating = {n for n in names if n.startswith(("F", "BF"))}
    if not floating or not floating <= FLOAT_DTYPES:
        return None
    if len(floating) == 1:
        return _STORED_DTYPES[next(iter(floating))]
    return torch.float64 if "F64" in floating else torch.float32


def _stream_loaded(net: torch.nn.Module, stored: torch.dtype, dtype: torch.dtype) -> torch.nn.Module:
    """``net``, loaded at the weights' dtype ``stored`` (:func:`_stored_dtype`), made to compute in
    ``dtype`` as a load at ``dtype`` would: every parameter the stream plan does not keep as stored
    and every persistent floating buffer (those the weights give) made ``dtype``, the buffers the
    model computes at construction left as it made them, the rest streamed
    (:func:`._streamed_layers.stream_model`)."""
    plan = StreamPlan(net)
    persistent = set(net.state_dict())
    with torch.no_grad():
        for name, param in net.named_parameters():
            if param.is_floating_point() and param.dtype != dtype and not plan.keeps(name):
                param.data = param.data.to(dtype)
        for prefix, module in net.named_modules():
            for key, buffer in module._buffers.items():
                name = f"{prefix}.{key}" if prefix else key
                if buffer is not None and buffer.is_floating_point() and name in persistent:
                    module._buffers[key] = buffer.to(dtype)
    stream_model(net, plan, dtype)
    return net


def _materialise_rest(net: torch.nn.Module) -> None:
    """Give the tensors the weights did not fill (buffers computed at construction: rotary
    frequencies, position ids; an optional pooler) their values on the CPU, as ``transformers``
    does after loading: each module holding one is initialised by the model's ``_init_weights``,
    which skips the tensors marked loaded (``_is_hf_initialized``), else by its ``reset_parameters``."""
    init = getattr(net, "_init_weights", None)
    for module in net.modules():
        slots = [(module._parameters, n) for n, t in module._parameters.items() if t is not None and t.is_meta]
        slots += [(module._buffers, n) for n, t in module._buffers.items() if t is not None and t.is_meta]
        if not slots:
            continue
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            if tensor is not None and not tensor.is_meta:
                tensor._is_hf_initialized = True  # type: ignore[attr-defined]
        for table, name in slots:
            old = table[name]
            new = torch.empty_like(old, device="cpu")
            table[name] = torch.nn.Parameter(new, requires_grad=old.requires_grad) if isinstance(
                old, torch.nn.Parameter) else new
        with torch.no_grad():
            if init is not None:
                init(module)
            elif hasattr(module, "reset_parameters"):
                module.reset_parameters()


def _from_pretrained(model: LoadedModel, dtype: torch.dtype) -> torch.nn.Module:
    """A generic-tier model whose files store names transformers converts on loading (its
    checkpoint conversion mapping: fused experts, renamed modules), loaded by transformers itself,
    offline, from the model's directory (safetensors, or ``.bin`` read with ``weights_only``).

    Raises:
        ModelLoadingError: a parameter missing or of another shape (DF004).
    """
    from transformers.utils import logging as hf_logging

    from ..modelio.generic import EAGER_KWARGS, auto_model_class, hf_config_of

    hf = hf_config_of(model.raw_config, str(model.path))
    cls = auto_model_class(model.raw_config, hf, str(model.path))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        net, info = cls.from_pretrained(str(model.path), local_files_only=True, output_loading_info=True,
                                        dtype=dtype, **EAGER_KWARGS)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadingError(f"transformers cannot load the weights: {str(exc)[:300]}", file=str(model.path)) from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    bad = sorted(info.get("missing_keys") or []) + sorted(str(k) for k in info.get("mismatched_keys") or [])
    if bad:
        raise ModelLoadingError(f"{len(bad)} tensors of the transformers model are missing from the weights or of "
                                "another shape", file=str(model.path), tensor=str(bad[0]))
    return net


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
