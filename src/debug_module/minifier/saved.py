"""Minifying a graph saved on disk (what ``inductor-debug minify PATH`` calls).

Accepted ``path``:

- a repro directory written by this minifier (``repro.py`` + ``repro.json`` + ``inputs.safetensors``):
  its graph, inputs and signature are loaded (constraint signatures rebuild their constraints from the
  saved configuration; accuracy/exception ones need ``backend=`` unless the backend is importable);
- a graph file from a run directory (``aot_graphs/graph_000_forward.py``, ``fx_graphs/graph_000.py``:
  ``print_readable`` output): the graph is loaded, inputs are synthesised from its annotations
  (``f32[4, 8][8, 1]cpu``), and with no ``signature`` the first violation of ``constraints`` (default:
  the mock accelerator's) is the signature;
- a run directory (``manifest.json``, no ``repro.py``): its graph files are tried in order
  (``aot_graphs/*.py``, then ``fx_graphs/*.py``) and the first on which the signature holds (with no
  ``signature``: the first that violates ``constraints``) is minified as above.

For a run directory or a graph file inside one, ``constraints`` default to those the run recorded in
its manifest (``info.constraints``, :func:`recorded_constraints`): the run's own rules, not the defaults.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import torch
import torch.fx

from debug_framework.jsonio import JsonObject
from debug_framework.repro_format import read_manifest

from ..errors import MinifierError
from .minifier import Minifier, MinifierOptions, MinifyResult
from .signatures import Backend, ConstraintSignature, Signature, _load_backend

if TYPE_CHECKING:
    from ..constraints import Constraint

__all__ = ["minify_saved_graph", "load_repro_dir", "load_graph_file", "constraints_from_config",
           "recorded_constraints"]

_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
           "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
           "b8": torch.bool, "c64": torch.complex64, "c128": torch.complex128}
_ANNOT = re.compile(r"^(?P<dt>[a-z]+\d*)\[(?P<shape>[^\]]*)\]\[(?P<stride>[^\]]*)\]")


def _exec_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MinifierError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    saved_argv = sys.argv
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved_argv
    return module


def constraints_from_config(configs: Sequence[JsonObject]) -> list[Constraint]:
    """Constraint objects from their ``describe()`` JSON (the inlinable kinds)."""
    from ..constraints import (DtypeConstraint, LayoutConstraint, MaxRankConstraint, MemoryConstraint,
                               OpDenylistConstraint, ShapeConstraint)
    from ..constraints.builtin import OpAllowlistConstraint

    out: list[Constraint] = []
    for c in configs:
        kind = c["name"]
        if kind == "dtype":
            out.append(DtypeConstraint(c["allowed_dtypes"]))
        elif kind == "shape_alignment":
            dims = c["dims"] if isinstance(c["dims"], str) else tuple(c["dims"])
            out.append(ShapeConstraint(c["alignment"], dims, symbolic=c.get("symbolic", "prove"),
                                       check_views=c.get("check_views", True)))
        elif kind == "max_rank":
            out.append(MaxRankConstraint(c["max_rank"]))
        elif kind == "layout":
            out.append(LayoutConstraint(c.get("require_contiguous", True), c.get("allow_channels_last", False),
                                        c.get("check_views", False)))
        elif kind == "memory":
            out.append(MemoryConstraint(c.get("max_tensor_bytes"), c.get("max_peak_bytes")))
        elif kind == "unsupported_op":
            out.append(OpDenylistConstraint(c["ops"]))
        elif kind == "op_not_in_allowlist":
            out.append(OpAllowlistConstraint(c["ops"]))
    return out


def recorded_constraints(path: str | os.PathLike[str]) -> list[JsonObject] | None:
    """The constraint descriptions a run recorded in its manifest (``info.constraints``), for a run
    directory or a graph file inside one; ``None`` when there is no run or it recorded none."""
    p = Path(path)
    run = p if p.is_dir() else p.parent.parent
    manifest = run / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        configs = (json.loads(manifest.read_text(encoding="utf-8")).get("info") or {}).get("constraints")
    except (OSError, ValueError, AttributeError) as e:
        raise MinifierError(f"cannot read the constraints recorded in {manifest}: {e}") from e
    if not isinstance(configs, list) or not configs:
        return None
    return [c for c in configs if isinstance(c, dict)]


def load_repro_dir(path: str | os.PathLike[str], *, backend: Backend | str | None = None) -> tuple[torch.fx.GraphModule, list[object], Signature]:
    """(graph, inputs, signature) of a repro directory written by :func:`write_repro_dir`."""
    d = Path(path)
    try:
        manifest = read_manifest(d)
    except (OSError, ValueError) as e:
        raise MinifierError(f"cannot read the manifest of the repro directory {d}: {e}",
                            hint="pass a repro directory written by the minifier (repro.py and repro.json)") from e
    if manifest.get("writer") != "minifier":
        raise MinifierError(f"{d} is a repro of the {manifest.get('writer')!r} writer, not one of the minifier's",
                            hint="only the minifier's repros hold a graph to minify")
    env = manifest["check"]
    module = _exec_module(d / "repro.py", f"_dm_repro_{abs(hash(str(d)))}")
    model, inputs = module.load()
    gm = torch.fx.symbolic_trace(model)
    sig = env["signature"]
    if sig["kind"] == "constraint":
        signature: Signature = ConstraintSignature(sig["constraint"], sig.get("op"), message=sig.get("message"),
                                                   constraints=constraints_from_config(sig.get("constraints", [])))
    else:
        from .signatures import AccuracySignature, ExceptionSignature

        ref = env.get("backend") or {}
        if backend is None:
            if ref.get("kind") == "file":
                backend = getattr(_exec_module(d / ref["path"], f"_dm_backend_{abs(hash(str(d)))}"), ref["attr"])
                backend_spec = f"{(d / ref['path']).resolve()}:{ref['attr']}"
            elif ref.get("kind") == "torch_compile":
                backend, backend_spec = ref["name"], None
            else:
                backend, backend_spec = _load_backend(ref), None
        else:
            backend_spec = None
        if sig["kind"] == "exception":
            signature = ExceptionSignature(sig["type"], sig.get("pattern", ""), backend=backend, backend_spec=backend_spec)
        else:
            signature = AccuracySignature(backend, reference=sig["reference"], rtol=sig["rtol"], atol=sig["atol"],
                                          backend_spec=backend_spec)
    return gm, list(inputs), signature


def _synth_from_annotation(annotation: str, seed: int) -> torch.Tensor:
    m = _ANNOT.match(annotation.strip())
    if m is None or m["dt"] not in _DTYPES:
        raise MinifierError(f"cannot read the tensor annotation {annotation!r}",
                            hint="only static shapes from print_readable(include_stride=True) files are supported")
    try:
        shape = [int(s) for s in m["shape"].split(",") if s.strip()]
        stride = [int(s) for s in m["stride"].split(",") if s.strip()]
    except ValueError as e:
        raise MinifierError(f"symbolic shape in {annotation!r}", hint="save the graph with static shapes") from e
    from .graph import synthesize_value

    return synthesize_value(torch.empty_strided(shape, stride, dtype=_DTYPES[m["dt"]], device="meta"), seed=seed)


def load_graph_file(path: str | os.PathLike[str]) -> tuple[torch.fx.GraphModule, list[object]]:
    """A ``print_readable`` graph file (from a run directory) as a GraphModule plus synthesised inputs."""
    p = Path(path)
    text = re.sub(r"^class [^(\n]+\(", "class SavedGraph(", p.read_text(encoding="utf-8"), count=1, flags=re.M)
    module = types.ModuleType(f"_dm_graph_{abs(hash(str(p)))}")
    module.__dict__.update({"torch": torch, "device": torch.device, "inf": float("inf"), "nan": float("nan")})
    try:
        exec(compile("import torch\n" + text, str(p), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - our own run-dir file
    except SyntaxError as e:
        raise MinifierError(f"{p} is not a print_readable graph file: {e}") from e
    cls = next((v for v in vars(module).values() if isinstance(v, type) and issubclass(v, torch.nn.Module)
                and v is not torch.nn.Module and "forward" in vars(v)), None)
    if cls is None:
        raise MinifierError(f"{p} defines no torch.nn.Module with a forward")
    import inspect

    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    inputs = []
    for i, prm in enumerate(params):
        ann = prm.annotation
        if not isinstance(ann, str):
            raise MinifierError(f"input {prm.name} of {p} has no tensor annotation")
        inputs.append(_synth_from_annotation(ann, i))
    gm = torch.fx.symbolic_trace(cls())
    return gm, inputs


def _first_violation(gm: torch.fx.GraphModule, inputs: Sequence[object],
                     constraints: Sequence[Constraint | Callable[..., object]] | None) -> ConstraintSignature | None:
    sig = ConstraintSignature("?", constraints=constraints)
    obs = sig.observe(gm, inputs)
    if not obs["violations"]:
        return None
    first = obs["violations"][0]
    return ConstraintSignature(first["constraint"], first["op"] or None, constraints=sig.constraints)


def _pick_run_graph(run: Path, signature: Signature | None, constraints: Sequence[Constraint | Callable[..., object]] | None
                    ) -> tuple[Path, torch.fx.GraphModule, list[object], Signature]:
    """The first graph file of a run directory on which ``signature`` holds (no signature: the first
    with a constraint violation), with its graph, inputs and signature."""
    files = sorted((run / "aot_graphs").glob("*.py")) + sorted((run / "fx_graphs").glob("*.py"))
    if not files:
        raise MinifierError(f"run directory {run} has no saved graph (aot_graphs/*.py, fx_graphs/*.py)")
    skipped: list[str] = []
    for f in files:
        try:
            gm, inputs = load_graph_file(f)
        except MinifierError as e:  # e.g. symbolic shapes: try the next file
            skipped.append(f"{f.name}: {e.message}")
            continue
        sig = signature if signature is not None else _first_violation(gm, inputs, constraints)
        if sig is not None and (signature is None or sig.check(gm, inputs)[0]):
            return f, gm, inputs, sig
    what = "the signature does not hold on" if signature is not None else "no constraint is violated by"
    raise MinifierError(f"{what} any graph of {run} ({len(files)} file(s))" + (f"; unreadable: {skipped}" if skipped else ""),
                        hint="pass one graph file, a signature (accuracy/exception) or other constraints "
                             "(inductor-debug minify: --signature, --constraints, --alignment, --deny-op)")


def minify_saved_graph(path: str | os.PathLike[str], signature: Signature | None = None, *,
                       constraints: Sequence[Constraint | Callable[..., object]] | None = None,
                       backend: Backend | str | None = None,
                       output_dir: str | os.PathLike[str] | None = None,
                       **options: Unpack[MinifierOptions]) -> MinifyResult:
    """Minify a saved graph (a repro directory or a run directory's graph file) and write a verified repro.

    ``output_dir`` default: ``<path>.min/`` next to a repro directory, ``<run>/repros/<graph>/`` for a
    run directory or a graph file inside one. Other options go to :class:`Minifier` (``max_calls``,
    ``max_seconds``, ``progress``, ``state_path``, ``isolate``, ``jobs`` ...)."""
    p = Path(path)
    if constraints is None and not (p.is_dir() and (p / "repro.py").exists()):
        recorded = constraints_from_config(recorded_constraints(p) or [])
        constraints = recorded or None  # none recorded (or none rebuildable): the mock accelerator's
    if p.is_dir() and not (p / "repro.py").exists() and (p / "manifest.json").is_file():
        p, gm, inputs, signature = _pick_run_graph(p, signature, constraints)
        out = Path(output_dir) if output_dir is not None else p.parent.parent / "repros" / p.stem
        return Minifier(gm, inputs, signature, output_dir=out, **options).minify()
    if p.is_dir():
        if not (p / "repro.py").exists():
            raise MinifierError(f"{p} is not a repro directory (no repro.py) nor a run directory (no manifest.json)",
                                hint="pass a repro directory, a run directory, or one of its aot_graphs/*.py or "
                                     "fx_graphs/*.py files")
        gm, inputs, loaded = load_repro_dir(p, backend=backend)
        signature = signature or loaded
        out = Path(output_dir) if output_dir is not None else p.with_name(p.name + ".min")
    elif p.suffix == ".py" and p.exists():
        gm, inputs = load_graph_file(p)
        if signature is None:
            signature = _first_violation(gm, inputs, constraints)
            if signature is None:
                raise MinifierError(f"{p} violates none of the constraints; nothing to minify",
                                    hint="pass a signature (accuracy/exception) or other constraints (inductor-debug "
                                         "minify: --signature, --constraints, --alignment, --deny-op)")
        run_root = p.parent.parent
        if output_dir is not None:
            out = Path(output_dir)
        elif (run_root / "manifest.json").exists():
            out = run_root / "repros" / p.stem
        else:
            out = p.with_name(p.stem + "_repro")
    else:
        raise MinifierError(f"{p} is neither a repro directory nor a saved graph .py file")
    return Minifier(gm, inputs, signature, output_dir=out, **options).minify()
