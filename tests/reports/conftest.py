"""Sessions for the report tests, written through the real storage layer with results computed by
the real comparison core on a small residual-stream model (NumPy), with an optional injected bug.

The "model": h0 = embedding; per layer i: h += attn_i(h) (post_attention:i); h += mlp_i(h)
(post_mlp:i); logits = h @ W_out (post_processing). The reference runs in float64 and is cast to
float32; the alternative runs in float32, so correct layers differ by rounding only. ``bug_layer``
scales that layer's MLP output by (1 + bug_scale) in the alternative: the first divergence is
post_mlp:<bug_layer>. Isolation replays each alternative layer on the reference's input.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from debug_framework.comparison import compare
from debug_framework.models.debug_session import DebugSession, capture_environment
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.storage.tensor_store import RecordingCandidate, TensorStore


@dataclass
class Built:
    session_id: str
    db: DatabaseManager
    store: TensorStore
    results: list[dict[str, Any]]
    first: tuple[str, int | None] | None


def _weights(rng: np.random.Generator, d: int, n_layers: int, vocab: int):
    return {
        "emb": rng.standard_normal((vocab, d)) * 0.5,
        "attn": [rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(n_layers)],
        "mlp": [rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(n_layers)],
        "out": rng.standard_normal((d, vocab)) / math.sqrt(d),
    }


def _attn(h, w):
    return np.tanh(h @ w) * 0.5


def _mlp(h, w, scale=1.0):
    x = h @ w
    return (x / (1.0 + np.exp(-x))) * 0.5 * scale


def _run(w, ids, dtype, bug_layer=None, bug_scale=0.0):
    cast = lambda a: np.asarray(a, dtype=dtype)  # noqa: E731
    caps = {}
    h = cast(w["emb"])[ids]
    caps[("post_embedding", None)] = h
    for i in range(len(w["attn"])):
        h = h + _attn(h, cast(w["attn"][i]))
        caps[("post_attention", i)] = h
        h = h + _mlp(h, cast(w["mlp"][i]), 1.0 + (bug_scale if i == bug_layer else 0.0))
        caps[("post_mlp", i)] = h
    caps[("post_processing", None)] = h @ cast(w["out"])
    return caps


def build_session(db: DatabaseManager, *, model_path: str = "/models/tiny-llama", n_layers: int = 4,
                  bug_layer: int | None = 2, bug_scale: float = 1e-2, seed: int = 0, record: bool = True,
                  isolation: bool = True, engine_results: bool = True, reference_backend: str = "python_reference",
                  alternative_backend: str = "pytorch", extra_results: dict | None = None,
                  recording_limit: int | None = 4, session_id: str | None = None, config: dict | None = None,
                  checkpoint_name_override: str | None = None) -> Built:
    rng = np.random.default_rng(seed)
    d, vocab, batch, seq = 32, 50, 2, 6
    w = _weights(rng, d, n_layers, vocab)
    ids = rng.integers(0, vocab, size=(batch, seq))
    t0 = time.perf_counter()
    ref64 = _run(w, ids, np.float64)
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    alt = _run(w, ids, np.float32, bug_layer, bug_scale)
    t_alt = time.perf_counter() - t0
    ref = {k: v.astype(np.float32) for k, v in ref64.items()}
    per_layer = {"ref": [], "alt": []}  # measured: one layer (attn + mlp) on the captured input, per side
    for side, caps, dt in (("ref", ref64, np.float64), ("alt", alt, np.float32)):
        for i in range(n_layers):
            h = caps[("post_mlp", i - 1)] if i else caps[("post_embedding", None)]
            t1 = time.perf_counter()
            h = h + _attn(h, w["attn"][i].astype(dt))
            h + _mlp(h, w["mlp"][i].astype(dt))
            per_layer[side].append(time.perf_counter() - t1)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    results = []
    for (cp, layer), r in ref.items():
        res = compare(r, alt[(cp, layer)], rtol=tol["rtol"], atol=tol["atol"], name=cp).to_dict()
        res["checkpoint"] = checkpoint_name_override if (checkpoint_name_override and layer == 1 and cp == "post_mlp") else cp
        res["layer"] = layer
        results.append(res)
    if isolation:  # the alternative's layer i on the reference's input to layer i
        for res in results:
            cp, layer = res["checkpoint"], res["layer"]
            if layer is None or cp not in ("post_attention", "post_mlp"):
                continue
            if cp == "post_attention":
                h_in = ref[("post_mlp", layer - 1)] if layer > 0 else ref[("post_embedding", None)]
                local = h_in + _attn(h_in, w["attn"][layer].astype(np.float32))
            else:
                h_in = ref[("post_attention", layer)]
                scale = 1.0 + (bug_scale if layer == bug_layer else 0.0)
                local = h_in + _mlp(h_in, w["mlp"][layer].astype(np.float32), scale)
            local_cmp = compare(ref[(cp, layer)], local, rtol=tol["rtol"], atol=tol["atol"])
            res["introduced_error"] = local_cmp.max_abs_error
            res["introduces_error"] = not local_cmp.passed
            res["propagated_error"] = res["max_abs_error"]
    first = next(((r["checkpoint"], r["layer"]) for r in results if not r["passed"]), None)
    iso_layers = None
    if isolation:
        iso_layers = []
        for i in range(n_layers):
            mlp = next(r for r in results if r["layer"] == i and r["checkpoint"] != "post_attention")
            iso_layers.append({"layer": i, "introduces_error": mlp.get("introduces_error"), "block": "mlp" if mlp.get("introduces_error") else None,
                               "introduced_error": mlp.get("introduced_error"), "propagated_error": mlp.get("propagated_error")})
    s = DebugSession(model_path=model_path, reference_backend=reference_backend,
                     alternative_backend=alternative_backend, config=config or {"enabled_checkpoints": "all", "dtype": "float32"},
                     weights_digest="sha256:" + "ab" * 32, tolerances=tol, seed=seed, inputs_ref="inputs/seed0.safetensors",
                     environment=capture_environment("cpu"),
                     reference_backend_info={"name": reference_backend, "numpy": np.__version__, "dtype": "float64"},
                     alternative_backend_info={"name": alternative_backend, "torch": "2.13.0", "device": "cpu"},
                     db=db, **({"session_id": session_id} if session_id else {}))
    s.save()
    s.update_status("running")
    db.add_checkpoint_results(s.session_id, results)
    store = TensorStore.beside_database(db.database_path)
    summary = None
    if record:
        cands = []
        for res in results:
            key = (res["checkpoint"], res["layer"])
            orig = key if key in ref else ("post_mlp", 1)
            score = res["max_abs_error"]
            cands.append(RecordingCandidate(key[0], key[1], "reference", ref[orig], score=score))
            cands.append(RecordingCandidate(key[0], key[1], "alternative", alt[orig], score=score))
        outcome = store.record_session(db, s.session_id, cands, tensor_recording_limit=recording_limit)
        summary = outcome.summary()
    if engine_results:
        s.results = {
            "verdict": "failed" if first else "passed",
            "first_divergence": None if first is None else {"checkpoint": first[0], "layer": first[1]},
            "performance": {"reference": {"wall_s": t_ref, "per_layer_s": per_layer["ref"]},
                            "alternative": {"wall_s": t_alt, "per_layer_s": per_layer["alt"]}, "total_s": t_ref + t_alt},
            **({"isolation": iso_layers, "introducing_layers": [d["layer"] for d in iso_layers if d["introduces_error"]]}
               if iso_layers is not None else {}),
            "command": f"debug_validate --model-path {model_path} --reference-backend {reference_backend} "
                       f"--alternative-backend {alternative_backend} --seed {seed} --isolate",
            **({"recordings": summary} if summary else {}),
            **(extra_results or {}),
        }
        s.save()
    s.update_status("failed" if first else "passed")
    return Built(s.session_id, db, store, results, first)


@pytest.fixture
def db(tmp_path):
    return DatabaseManager(tmp_path / "db" / "debug_framework.db")


@pytest.fixture
def build():
    return build_session
