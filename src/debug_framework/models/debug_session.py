"""``DebugSession``: one validation run of a model on a reference and an alternative backend.

The record is the session's data (``to_dict``/``from_dict`` over the store's row). The spec's verbs
``save``, ``load``, ``update_status`` and ``add_checkpoint_result`` are faces over the session and
checkpoint stores, inherited from :class:`debug_framework.compat.SessionFaces`; they use the
database the record holds (``db=``) or one given to the call (a database path works too)::

    s = DebugSession(model_path="m.safetensors", reference_backend="python_reference",
                     alternative_backend="pytorch", config={...}, db=Database(path))
    s.save(); s.update_status("running")                     # db.sessions.create / update_status
    s.add_checkpoint_result("post_mlp", comparison_result.to_dict())   # db.checkpoints.add_many
    again = DebugSession.load(s.session_id, db=path)         # db.sessions.get

The project's own code calls the stores directly (``db.sessions``, ``db.checkpoints``).
"""

from __future__ import annotations

import platform
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from ..compat import SessionFaces
from ..jsonio import JsonObject
from ..storage.database import DatabaseLike
from ._common import format_time, now_utc, parse_time

__all__ = ["DebugSession", "capture_environment"]


def capture_environment(device: str | None = None) -> JsonObject:
    """Python, platform, NumPy/torch versions and the device: the ``environment`` of a session."""
    env: JsonObject = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device": device,
    }
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        env["numpy"] = None
    if "torch" not in sys.modules and not str(device or "").startswith("cuda"):
        # a run that never imported torch (an ONNX file's) is not made to import it to say so:
        # the installed version, and no CUDA availability (torch would have to be imported to ask)
        from ..backends.base import installed_version

        env["torch"] = installed_version("torch")
        return env
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = bool(torch.cuda.is_available())
        if env["cuda_available"] and str(device or "").startswith("cuda"):
            dev = torch.device(str(device))
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            env["gpu"] = torch.cuda.get_device_name(index)
            env["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        env["torch"] = None
    return env


@dataclass(kw_only=True)
class DebugSession(SessionFaces):
    """A validation session (attributes as in the spec, plus the provenance the store keeps)."""

    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    model_path: str
    reference_backend: str
    alternative_backend: str
    config: JsonObject = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)
    status: str = "created"
    results: JsonObject | None = None
    weights_digest: str | None = None
    reference_backend_info: JsonObject | None = None
    alternative_backend_info: JsonObject | None = None
    tolerances: JsonObject | None = None
    seed: int | None = None
    inputs_ref: str | None = None
    environment: JsonObject | None = None
    error_message: str | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    db: DatabaseLike | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ dict form

    def to_dict(self) -> JsonObject:
        return {
            "session_id": self.session_id,
            "model_path": self.model_path,
            "reference_backend": self.reference_backend,
            "alternative_backend": self.alternative_backend,
            "config": self.config,
            "created_at": format_time(self.created_at),
            "status": self.status,
            "results": self.results,
            "weights_digest": self.weights_digest,
            "reference_backend_info": self.reference_backend_info,
            "alternative_backend_info": self.alternative_backend_info,
            "tolerances": self.tolerances,
            "seed": self.seed,
            "inputs_ref": self.inputs_ref,
            "environment": self.environment,
            "error_message": self.error_message,
            "updated_at": format_time(self.updated_at),
            "started_at": format_time(self.started_at),
            "finished_at": format_time(self.finished_at),
        }

    @classmethod
    def from_dict(cls, data: JsonObject, *, db: DatabaseLike | None = None) -> DebugSession:
        known = {f for f in cls.__dataclass_fields__ if f != "db"}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("created_at", "updated_at", "started_at", "finished_at"):
            if key in kwargs:
                kwargs[key] = parse_time(kwargs[key])
        if kwargs.get("config") is None:
            kwargs["config"] = {}
        if kwargs.get("created_at") is None:
            kwargs.pop("created_at", None)
        return cls(**kwargs, db=db)
