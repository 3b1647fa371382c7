"""``L4MAIntegration``: validation sessions for Llama-family ("L4MA") models.

    l4ma = L4MAIntegration(database_path="/tmp/debug.db")
    sid = l4ma.create_validation_session("path/to/llama", pie_config_path="pie_config.json")
    result = l4ma.execute_validation(sid)
    l4ma.get_model_metadata("path/to/llama")

Llama-family means what ``modelio`` loads as ``architecture == "llama"`` (Llama, Qwen2-style
q/k/v bias, rope scaling default/linear/llama3, and the pre-norm variants Mistral, Qwen3, Phi-3 and
Qwen3-MoE; Gemma's layers are another structure). Sessions check every checkpoint and isolate each
decoder layer by default (the reference and ``pytorch`` both replay single layers).

A PIE config file (JSON) may carry session keys at the top level or under ``"debug_framework"``
or ``"validation"``, plus ``reference_backend`` / ``alternative_backend``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError, ModelLoadingError
from ..jsonio import read_json_object

__all__ = ["L4MAIntegration", "L4MA_SESSION_DEFAULTS"]

#: What an L4MA session checks unless the PIE config says otherwise.
L4MA_SESSION_DEFAULTS: dict[str, Any] = {"isolate": "auto", "enabled_checkpoints": None}


class L4MAIntegration:
    """Sessions for Llama-family models on a :class:`ValidationEngine`.

    Args:
        database_path: the session database (default: the framework config's).
        config: framework configuration (``debug_framework.get_framework_config()``).
        reference_backend, alternative_backend: defaults for the sessions.
    """

    def __init__(self, database_path: str | os.PathLike[str] | None = None, *, config: Mapping[str, Any] | None = None,
                 reference_backend: str = "python_reference", alternative_backend: str = "auto") -> None:
        from ..services.validation_engine import ValidationEngine

        self.engine = ValidationEngine(database_path, config=config)
        self.reference_backend = reference_backend
        self.alternative_backend = alternative_backend

    @staticmethod
    def _load(model_path: str | os.PathLike[str]) -> Any:
        from ..modelio import load_model

        model = load_model(model_path)
        if model.architecture != "llama":
            raise ModelLoadingError(
                f"not a Llama-family model (architecture {model.architecture!r}, "
                f"model_type {getattr(model.config, 'model_type', '?')!r})",
                file=str(model_path), hint="use ValidationEngine / create_validation_session for other architectures",
            )
        return model

    @staticmethod
    def _read_pie_config(path: str | os.PathLike[str] | None) -> dict[str, Any]:
        if path is None:
            return {}
        data = read_json_object(path, "PIE config")
        for section in ("debug_framework", "validation"):
            if isinstance(data.get(section), dict):
                return dict(data[section])
        return data

    def create_validation_session(self, model_path: str | os.PathLike[str],
                                  pie_config_path: str | os.PathLike[str] | None = None) -> str:
        """Create a session for a Llama-family model; returns its id.

        Raises:
            ModelLoadingError (DF004): not loadable, or not Llama-family.
            ConfigurationError (DF005): a bad PIE config; BackendInitializationError (DF002).
        """
        from ..services.validation_engine import SESSION_DEFAULTS

        self._load(model_path)
        pie = self._read_pie_config(pie_config_path)
        reference = str(pie.pop("reference_backend", self.reference_backend))
        alternative = str(pie.pop("alternative_backend", self.alternative_backend))
        unknown = set(pie) - set(SESSION_DEFAULTS)
        if unknown:
            raise ConfigurationError(f"unknown key(s) {sorted(unknown)} in the PIE config", file=str(pie_config_path),
                                     hint=f"known keys: reference_backend, alternative_backend, {', '.join(SESSION_DEFAULTS)}")
        config = {**L4MA_SESSION_DEFAULTS, **pie}
        return self.engine.create_session(model_path, config, reference, alternative)

    def execute_validation(self, session_id: str) -> dict[str, Any]:
        """Run the session: every checkpoint, plus per-layer isolation where both backends can."""
        return self.engine.run(session_id).to_dict()

    def get_model_metadata(self, model_path: str | os.PathLike[str]) -> dict[str, Any]:
        """Architecture, shapes, attention and rotary settings, weights digest and files."""
        model = self._load(model_path)
        c = model.config
        rope = c.rope_scaling
        return {
            "model_path": str(model_path),
            "format": model.format,
            "architecture": model.architecture,
            "model_type": c.model_type,
            "num_layers": c.num_hidden_layers,
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta,
            "rope_scaling": {"rope_type": rope.rope_type, "factor": rope.factor,
                             "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
                             "original_max_position_embeddings": rope.original_max_position_embeddings},
            "tie_word_embeddings": c.tie_word_embeddings,
            "qkv_bias": c.qkv_bias,
            "o_bias": c.o_bias,
            "hidden_act": c.hidden_act,
            "num_parameters": sum(int(_numel(model.weights, n)) for n in model.weights),
            "weights_digest": model.digest,
            "has_tokenizer": model.tokenizer is not None,
            "files": [str(f) for f in model.files],
        }


def _numel(weights: Any, name: str) -> int:
    shape = weights.shape(name) if hasattr(weights, "shape") else tuple(weights[name].shape)
    n = 1
    for d in shape:
        n *= int(d)
    return n
