"""Helpers shared by the renderers: labels, numbers, the reproduce command, the summary lines.

The session-level helpers read the typed records every view renders (a
:class:`~debug_framework.storage.session_record.SessionRecord` and the
:class:`~debug_framework.services.validation.results.ValidationResult` read back from the store;
rows stored by earlier versions are migrated by the schema, so nothing here probes for old keys).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..checkpoint_ids import checkpoint_id, row_checkpoint_id
from ..jsonio import JsonObject, JsonValue, as_float
from ..storage.session_record import SessionRecord

if TYPE_CHECKING:
    from ..services.validation.results import CheckpointResult, ErrorSource, Introducer, ValidationResult

__all__ = [
    "precision_text",
    "METRICS",
    "LOG_METRICS",
    "as_float",
    "fmt_num",
    "row_id",
    "first_divergence_entry",
    "worst_row",
    "verdict_of",
    "reproduce_command",
    "error_source_text",
    "introducing_text",
    "backend_label",
    "flat_items",
    "isolation_rows",
    "damaged_fields",
    "human_bytes",
    "BIDI_CONTROLS",
    "input_sentences",
    "shell_quote",
    "shell_join",
]

#: Metric keys of ``ComparisonResult.to_dict()`` shown in tables, in this order.
METRICS: tuple[str, ...] = (
    "max_abs_error", "mean_abs_error", "median_abs_error", "p99_abs_error", "max_rel_error", "mean_rel_error",
    "rmse", "rel_l2_error", "cosine_similarity", "sqnr_db", "mismatch_count", "mismatch_percent",
    "max_ulp_error",
)
#: Metrics drawn as per-layer curves on a log scale (``1 - cosine_similarity`` is derived).
LOG_METRICS: tuple[str, ...] = (
    "max_abs_error", "mean_abs_error", "p99_abs_error", "rmse", "rel_l2_error", "max_rel_error",
    "max_ulp_error", "mismatch_percent", "cosine_distance",
)


_NONFINITE_TEXT = {"human": ("NaN", "Infinity", "-Infinity"), "machine": ("nan", "inf", "-inf")}


def fmt_num(value: object, digits: int = 4, *, style: str = "human",
            text: Callable[[object], str] = str) -> str:
    """One number as text; None as ''.

    ``style="human"`` (tables, HTML): ints as ints, floats in %.{digits}g, booleans true/false,
    NaN/Infinity/-Infinity spelled out. ``style="machine"`` (CSV): booleans 0/1, floats at full
    precision (``repr``), nan/inf/-inf. A value that is not a number goes through ``text``.
    """
    if value is None:
        return ""
    machine = style == "machine"
    if isinstance(value, bool):
        return str(int(value)) if machine else ("true" if value else "false")
    if isinstance(value, int):
        return str(value)
    f = as_float(value)
    if f is None:
        return text(value)
    if not math.isfinite(f):
        nan, pos, neg = _NONFINITE_TEXT[style]
        return nan if math.isnan(f) else (pos if f > 0 else neg)
    if machine:
        return repr(f)
    if f == int(f) and abs(f) < 1e15 and not isinstance(value, float):
        return str(int(f))
    return f"{f:.{digits}g}"


#: Unicode bidirectional controls (embeddings, overrides, isolates, marks, the Arabic letter mark): in
#: user text they can reorder what a reader sees ("Trojan Source"); the reports neutralise them.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def human_bytes(value: object) -> str:
    """A byte count in binary units: ``512 B``, ``1.50 KiB``, ``944 MiB``, ``1011 MiB``, ``2.03 GiB``
    (three significant digits, four below 1024); '' for a value that is not a number."""
    f = as_float(value)
    if f is None or not math.isfinite(f):
        return fmt_num(value)
    sign, n = ("-" if f < 0 else ""), abs(f)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            digits = 0 if unit == "B" or n >= 100 else (1 if n >= 10 else 2)
            return f"{sign}{n:.{digits}f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def row_id(row: Mapping[str, JsonValue] | tuple[str, int | None] | tuple[str, int | None, int | None]) -> str:
    """The canonical id of a checkpoint (``post_mlp:3`` / ``post_embedding`` / ``post_mlp:3@2``): of a
    row, its stored ``id`` or the one its ``checkpoint``/``layer``/``step`` give
    (:func:`~debug_framework.checkpoint_ids.row_checkpoint_id`); of a ``(checkpoint, layer)`` or
    ``(checkpoint, layer, step)`` key, :func:`~debug_framework.checkpoint_ids.checkpoint_id`."""
    return checkpoint_id(*row) if isinstance(row, tuple) else row_checkpoint_id(row)


def first_divergence_entry(first: CheckpointResult | None) -> JsonObject | None:
    """The ``first_divergence`` object of the JSON outputs: ``{"id", "checkpoint", "layer"}``, and
    ``step`` for a decode step's row (None: none)."""
    if first is None:
        return None
    entry: JsonObject = {"id": first.id, "checkpoint": first.key.name, "layer": first.key.layer}
    if first.step is not None:
        entry["step"] = first.step
    return entry


def _badness(row: CheckpointResult) -> float:
    v = as_float(row.comparison.max_abs_error)
    if v is None:
        return -math.inf
    return math.inf if math.isnan(v) else v


def worst_row(rows: Sequence[CheckpointResult]) -> CheckpointResult | None:
    """The row with the largest max abs error (NaN/inf rank worst); None when there are no rows or
    no row has an error figure (e.g. every row is a shape mismatch)."""
    scored = [r for r in rows if _badness(r) != -math.inf]
    if not scored:
        return None
    return max(scored, key=_badness)


def verdict_of(record: SessionRecord) -> str:
    """The verdict the run stored with the session, else its status."""
    v = record.results.get("verdict")
    return str(v) if isinstance(v, str) and v else str(record.status or "unknown")


def input_sentences(record: SessionRecord) -> list[str]:
    """The text inputs of a session (its config's ``input_text``: one string or a list), or []."""
    text = record.config.get("input_text")
    if isinstance(text, str):
        return [text]
    return [str(t) for t in text] if isinstance(text, (list, tuple)) else []


def _ansi_c_quote(arg: str) -> str:
    out = []
    for ch in arg:
        code = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not ch.isprintable() or ch in BIDI_CONTROLS:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def shell_quote(arg: str) -> str:
    """One argument quoted for a shell: ``shlex.quote`` (POSIX) when it is plain printable text; else
    (newlines, control, invisible or bidi characters) ``$'...'`` with escapes, which bash, zsh and
    ksh read but a plain POSIX ``sh`` (dash) does not: the command shown is exactly the argument, on
    one line, with nothing hidden, for bash."""
    if all(ch.isprintable() and ch not in BIDI_CONTROLS for ch in arg):
        return shlex.quote(arg)
    return _ansi_c_quote(arg)


def shell_join(argv: Sequence[str]) -> str:
    """:func:`shell_quote` of every argument, space-separated."""
    return " ".join(shell_quote(str(a)) for a in argv)


def precision_text(dtype: str, declared: object, quantized: Mapping[str, int] | None = None,
                   emulated: Mapping[str, str] | None = None) -> str:
    """What ``consistent_with`` means, in words. For a quantized alternative (``quantized``: its
    quantized operators and their counts) the size of a lower float precision's error is only a
    scale: the words say that its error comes from quantization. A precision the alternative's
    engine declares (``emulated``: its name -> the dtype it computes in; llama.cpp's ``q8_0``, a
    torchao module's ``int8_weight_only``) is what the alternative really runs: the words say to
    judge it at that precision."""
    if quantized and dtype in quantized:
        return (f"consistent with a correct {dtype} quantization of the reference's weights (torchao, the same "
                f"configuration): its error is that quantization's, not a bug; validate it with --dtype auto "
                "to judge it at its quantization")
    if emulated and dtype in emulated:
        return (f"consistent with a correct run at the alternative's own {dtype} precision (its engine's, "
                f"computing in {emulated[dtype]}): its error is that precision's, not a bug; validate it with "
                "--dtype auto to judge it at that precision")
    if quantized:
        ops = ", ".join(f"{op} x{n}" for op, n in quantized.items())
        return (f"the error is the size of a correct {dtype} run's, but the alternative is quantized ({ops}): "
                f"its error comes from quantization, not from {dtype}")
    return (f"consistent with a correct {dtype} run (the alternative computes at a lower precision than the "
            f"declared {declared}; validate it at that dtype)")


def error_source_text(source: ErrorSource) -> str:
    """Where a failed validation's error comes from, in words (:meth:`ErrorSource.text`)."""
    return source.text()


def backend_label(name: object, options: object = None, dtype: object = None) -> str:
    """A backend as every view names it: ``myengine [precision_hint=bf16] (bfloat16)``; the options
    it was built with (``--backend-option``) in brackets, its dtype in parentheses."""
    label = str(name)
    if isinstance(options, Mapping) and options:
        label += " [" + ", ".join(f"{k}={v}" for k, v in options.items()) + "]"
    return label + (f" ({dtype})" if dtype else "")


def introducing_text(found: Sequence[Introducer] | None) -> str:
    """What :meth:`ValidationResult.introducing` found, in words: ``layer 1 (attention) at decode
    step 1``, ``layer 0, layer 2 (mlp)``, ``none``; ``not run`` where no isolation ran."""
    if found is None:
        return "not run"
    if not found:
        return "none"
    return ", ".join(f"layer {d.layer}" + (f" ({', '.join(d.blocks)})" if d.blocks else "")
                     + (f" at decode step {d.step}" if d.step else "") for d in found)


def flat_items(value: object, prefix: str = "") -> list[tuple[str, str]]:
    """A nested mapping as ``(dotted key, text)`` pairs, lists and scalars as text: how a page shows
    the environment or backend information as a table rather than raw JSON."""
    if isinstance(value, Mapping):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out += flat_items(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, "" if value is None else (", ".join(map(str, value)) if isinstance(value, (list, tuple))
                                               else str(value)))]


_COMMAND_KEYS = ("command", "reproduce_command", "repro_command", "reproduce")


def _recorded_command(record: SessionRecord) -> str | None:
    """The command line recorded with the session: the CLI's own argv in ``environment["command"]``
    (or a ``command`` the run stored in its results), shell-quoted."""
    for k in _COMMAND_KEYS:
        v = (record.environment.get(k) if k == "command" else None) or record.results.get(k)
        if isinstance(v, Mapping):
            v = v.get("command") or v.get("argv")
        if isinstance(v, (list, tuple)) and v:
            return shell_join([str(a) for a in v])
        if isinstance(v, str) and v.strip():
            return v
    return None


def reproduce_command(record: SessionRecord, result: ValidationResult) -> tuple[str | None, bool]:
    """``(command, exact)``: the command recorded with the session (exact: the CLI's own, in
    ``environment["command"]``, with its user backends, plugin, config file and drill-down) or one
    rebuilt from the stored session (``exact=False``; None when nothing is known about the model)."""
    recorded = _recorded_command(record)
    if recorded is not None:
        return recorded, True
    if not record.model_path:
        return None, False
    argv = ["python", "-m", "debug_framework.cli.debug_validate", "--model-path", record.model_path]
    if record.reference_backend:
        argv += ["--reference-backend", record.reference_backend]
    if record.alternative_backend:
        argv += ["--alternative-backend", record.alternative_backend]
    if result.alternative_dtype:
        argv += ["--dtype", result.alternative_dtype]
    rtol, atol = _thresholds(record)
    if rtol is not None:
        argv += ["--rtol", str(rtol)]
    if atol is not None:
        argv += ["--atol", str(atol)]
    if record.seed is not None:
        argv += ["--seed", str(record.seed)]
    for asked, option in ((result.isolation is not None, "--isolate"), (bool(result.oracle), "--oracle"),
                          (bool(result.noise_floor), "--noise-floor"), (result.drilldown is not None, "--drill-down")):
        if asked:
            argv.append(option)
    argv += _config_options(record.config)
    for sentence in input_sentences(record):
        argv += ["--text", sentence]
    return shell_join(argv), False


def _thresholds(record: SessionRecord) -> tuple[JsonValue, JsonValue]:
    """The session-wide ``(rtol, atol)``: the stored tolerances' own, else their
    ``precision_thresholds``, else the config's ``precision_thresholds`` (what ``--rtol/--atol``
    set); ``(None, None)`` when none."""
    nested, configured = record.tolerances.get("precision_thresholds"), record.config.get("precision_thresholds")
    for cand in (record.tolerances, nested, configured):
        if isinstance(cand, Mapping) and (cand.get("rtol") is not None or cand.get("atol") is not None):
            return cand.get("rtol"), cand.get("atol")
    return None, None


def _config_options(cfg: JsonObject) -> list[str]:
    """The ``debug_validate`` options that restate a session config's reference dtype, device,
    layer range and checkpoint selection (the text inputs are added by the caller)."""
    out: list[str] = []
    for key, option in (("reference_dtype", "--reference-dtype"), ("device", "--device")):
        if cfg.get(key):
            out += [option, str(cfg[key])]
    layers = cfg.get("layers")
    if isinstance(layers, (list, tuple)) and len(layers) == 2:
        out += ["--layers", f"{layers[0]}:{layers[1]}"]
    checkpoints = cfg.get("enabled_checkpoints")
    if isinstance(checkpoints, (list, tuple)) and checkpoints:
        out += ["--checkpoints", ",".join(str(c) for c in checkpoints)]
    return out


def isolation_rows(rows: Sequence[CheckpointResult]) -> list[CheckpointResult]:
    """Rows that carry isolation figures (introduced and/or propagated error)."""
    return [r for r in rows if r.introduced_error is not None or r.propagated_error is not None]


def damaged_fields(record: SessionRecord, rows: Sequence[Mapping[str, JsonValue]]) -> list[str]:
    """What the store could not decode (``damaged_json`` of the session and of each stored row), as
    ``session.config`` / ``post_mlp:1.metrics_json``: shown so a damaged field is not mistaken for one
    that was never recorded."""
    out = [f"session.{c}" for c in record.damaged_json]
    for r in rows:
        damaged = r.get("damaged_json")
        out += [f"{row_checkpoint_id(r)}.{c}" for c in damaged] if isinstance(damaged, list | tuple) else []
    return out
