"""``debug_validate``: validate a model's alternative backend against a reference, from the shell.

    debug_validate --model-path ./my-model --alternative-backend pytorch --isolate
    python -m debug_framework.cli.debug_validate --model-path m --json > result.json
    debug_validate --model-path m --backend-file my_backend.py --alternative-backend my_backend
    debug_validate --model-path ./hf-model --alternative-endpoint http://127.0.0.1:8080/v1 --decode-steps 8

Exit codes (:mod:`debug_framework.cli.framework`): 0 every checkpoint within tolerance, 1 numerical
failure, 2 usage or environment error (a DF-coded error: bad path, unavailable backend, bad
configuration...), 3 internal error (a bug; the traceback is in the crash log the message names).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..jsonio import dumps_json, read_json_object
from ..safefiles import check_output_path, is_stdout
from .framework import (EXIT_FAIL, EXIT_PASS, EXIT_USAGE, CliError, Invocation, make_app, make_console, markup,
                        print_json, run_app, stage_progress, stdout_for_json_only)
from .drilldown_view import print_drilldown
from .tables import Column
from .user_code import load_backend_code
from .validate_support import (check_database_path, check_dtype, check_model_path, isolation_table,
                               parse_backend_options, reproduce_command_line)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..comparison import ComparisonResult
    from ..jsonio import JsonObject
    from ..services.validation.results import CheckpointResult, ValidationResult
    from ..services.validation_engine import ValidationEngine

__all__ = ["main", "run", "app", "EXIT_PASS", "EXIT_FAIL", "EXIT_USAGE"]

PROG = "debug_validate"

_HELP = "Validate an alternative backend against a reference backend, checkpoint by checkpoint."
app = make_app(_HELP)


@dataclass(frozen=True)
class ValidateOptions:
    """The session-configuration part of the command line."""

    config_file: Path | None = None
    checkpoints: str | None = None
    layers: str | None = None
    dtype: str | None = None
    reference_dtype: str | None = None
    device: str | None = None
    rtol: float | None = None
    atol: float | None = None
    isolate: bool | None = None
    oracle: bool = False
    noise_floor: bool = False
    text: tuple[str, ...] = ()
    seed: int | None = None
    drill_down: bool = False


def _session_config(opts: ValidateOptions) -> dict[str, object]:
    """The session configuration's keys: the config file's, overridden by the options given
    (checked as one :class:`~debug_framework.models.session_config.SessionConfig`
    before the session is created)."""
    from ..errors import ConfigurationError

    cfg: dict[str, object] = {} if opts.config_file is None else read_json_object(opts.config_file, "config file")
    if opts.checkpoints:
        cfg["enabled_checkpoints"] = [c.strip() for c in opts.checkpoints.split(",") if c.strip()]
    if opts.layers:
        lo, _, hi = opts.layers.partition(":")
        try:
            cfg["layers"] = [int(lo), int(hi)]
        except ValueError as exc:
            raise ConfigurationError(f"--layers must be START:STOP, got {opts.layers!r}") from exc
    given = cfg.get("precision_thresholds")
    if given is not None and not isinstance(given, dict):
        raise ConfigurationError(f"precision_thresholds must be a mapping like {{'rtol': 1e-4, 'atol': 1e-5}}, "
                                 f"got {type(given).__name__}", hint="fix precision_thresholds in the config file")
    thresholds = dict(given or {})
    if opts.rtol is not None:
        thresholds["rtol"] = opts.rtol
    if opts.atol is not None:
        thresholds["atol"] = opts.atol
    if thresholds:
        cfg["precision_thresholds"] = thresholds
    for key in ("dtype", "reference_dtype", "device", "seed", "isolate"):
        if getattr(opts, key) is not None:
            cfg[key] = getattr(opts, key)
    if opts.oracle:
        cfg["oracle"] = True
    if opts.noise_floor:
        cfg["noise_floor"] = True
    if opts.drill_down:
        cfg["drill_down"] = True
    if opts.text:
        cfg["input_text"] = list(opts.text)
    return cfg


def _fmt(v: object, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}e}"
    return str(v)


def _margin(v: object) -> str:
    """error / bound as a short number (at most 1 passes)."""
    return "-" if not isinstance(v, (int, float)) or math.isnan(v) else f"{v:.3g}"


#: The checkpoint table's columns; the lowest ``keep`` goes first when the terminal is narrow.
_COLUMNS = (Column("checkpoint", min_width=12, short=lambda c: c[5:] if c.startswith("post_") else c,
                   short_note="checkpoint names without post_"),
            Column("verdict", min_width=18), Column("margin", number=True), Column("judged", number=True, keep=7),
            Column("bound", number=True, keep=6), Column("sees", number=True, keep=0), Column("max abs", number=True),
            Column("rel L2", number=True, keep=2), Column("miss %", number=True, keep=1),
            Column("introduced", number=True, keep=4), Column("carried in", number=True, keep=3))


def _error(result: ComparisonResult | None) -> float | None:
    return None if result is None else result.max_abs_error


def _judged_cell(r: CheckpointResult) -> str:
    """The error in the judged metric's units, the figure the ``bound`` column bounds (``-`` where
    no ratio rule judged: an allclose tolerance's margin is its figure)."""
    return _fmt(r.judged_error)


def _table(result: ValidationResult, verbose: bool, width: int = 120) -> Table:
    """Checkpoints in model order; the first divergence highlighted, layers that introduce error
    marked; fitted to ``width`` columns (numbers never cut). ``judged`` is the metric the rule held
    to ``bound``; ``sees`` the smallest relative change of the output the bound would catch."""
    from ..reports._common import backend_label
    from ..reports._sections import change_text, judged_caption
    from .tables import fitted_table

    first = result.first_divergence
    rows = result.results
    shown = rows if verbose or len(rows) <= 40 else [
        r for i, r in enumerate(rows) if not r.passed or i < 5 or i >= len(rows) - 3]
    cells, styles = [], []
    for r in shown:
        is_first = r is first
        verdict = ("pass" if r.passed else "FAIL") + (" <first" if is_first else "") + (" +intro" if r.introduces_error else "")
        styles.append("bold white on red" if is_first else ("red" if not r.passed else None))
        c = r.comparison
        cells.append([r.id, verdict, _margin(r.margin), _judged_cell(r), _fmt(r.bound), change_text(r.detectable_change),
                      _fmt(c.max_abs_error), _fmt(c.rel_l2_error),
                      _fmt(c.mismatch_percent, 1) if c.mismatch_percent else "0",
                      _fmt(None if r.introduced is None else _error(r.introduced.error)), _fmt(_error(r.carried_in))])
    hidden = (f"{len(rows) - len(shown)} passing checkpoints not shown (--verbose shows all); "
              if len(shown) < len(rows) else "")
    caption = hidden + judged_caption(rows)
    alternative = backend_label(result.alternative_backend, result.alternative_options, result.alternative_dtype)
    title = f"{alternative} vs {backend_label(result.reference_backend, None, result.reference_dtype)}"
    return fitted_table(title, _COLUMNS, cells, width, styles=styles, caption=caption)


def _write_output(path: Path, engine: ValidationEngine, session_id: str, result: ValidationResult) -> None:
    """The HTML report (error curves, heatmap) for ``.html``/``.htm``, else the result JSON; atomic."""
    from ..models._common import write_report_file
    from ..models.validation_report import ValidationReport
    from ..reports import render_report

    if path.suffix.lower() in (".html", ".htm"):
        text = render_report(ValidationReport.from_session(session_id, engine.db), "html")
    else:
        text = dumps_json(result.to_dict())
    write_report_file(path.expanduser(), text, session=session_id, option="--output-file",  # DF007 when full, else ConfigurationError
                      hint="choose a writable --output-file; the session is stored, "
                           "session_report --session-id can write its report")


def _verdict_lines(out: Console, result: ValidationResult) -> None:
    """The verdict line; for a failure, where the error comes from and the precision it matches."""
    from ..reports._common import error_source_text, precision_text

    first = result.first_divergence
    if first is None:
        out.print(f"[bold green]PASSED[/]: {len(result.results)} checkpoints within their bounds")
        return
    out.print(markup("[bold red]FAILED[/]: first divergence at [bold]{}[/] (max abs error {}; {})",
                     first.id, _fmt(first.comparison.max_abs_error), first.reason or ""))
    if result.source is not None:
        out.print(markup("{}", "source: " + error_source_text(result.source)))
    if result.consistent_with:
        note = result.precision_diagnosis or {}
        quantized, emulated = note.get("quantized"), note.get("emulated")
        out.print(markup("{}", "precision: " + precision_text(result.consistent_with, result.alternative_dtype,
                                                              quantized if isinstance(quantized, dict) else None,
                                                              emulated if isinstance(emulated, dict) else None)))


def _mark_all_line(marked: JsonObject) -> str:
    """``--mark-all``'s line: how many node outputs were compared, how many failed, the first."""
    node = marked.get("first_divergence")
    first = ("" if not isinstance(node, dict) else
             f"; first: {node['tensor']} ({node['op']} node {node['node']}"
             f"{'' if node['layer'] is None else ', layer ' + str(node['layer'])})")
    return f"mark-all: {marked['compared']} node outputs compared, {marked['failed']} over their bounds{first}"


def _print_summary(out: Console, result: ValidationResult, verbose: bool, footer: str) -> None:
    """The table, the verdict line, isolation, timings and where the session went."""
    from ..reports._common import introducing_text

    out.print(_table(result, verbose, out.width))
    _verdict_lines(out, result)
    from ..reports._sections import sensitivity_text

    sees = sensitivity_text(result.sensitivity())
    if sees is not None:
        out.print(markup("{}", sees))
    doc = result.to_dict()  # the JSON view the isolation and drill-down tables read
    if result.decode:
        from ..reports._decode import decode_text

        for line in decode_text(result, out.width):
            out.print(markup("{}", line))
    from ..reports._inspector import inspector_text

    for line in inspector_text(result):
        out.print(markup("{}", line))
    found = result.introducing()
    if found is not None:
        out.print(markup("{}", "isolation: " + ("no layer introduces error on its own" if not found else
                                                f"error introduced by {introducing_text(found)}; the rest only "
                                                "propagate")))
    elif result.isolation_note:
        out.print(markup("isolation: {}", result.isolation_note))
    if verbose and result.isolation:
        out.print(isolation_table(doc, _fmt))
    if result.mark_all:
        out.print(markup("{}", _mark_all_line(result.mark_all)))
    print_drilldown(out, doc, verbose)
    perf = result.performance
    ref, alt = perf.get("reference"), perf.get("alternative")
    if isinstance(ref, dict) and isinstance(alt, dict):
        out.print(f"time: reference {ref['wall_s']:.3f} s, alternative {alt['wall_s']:.3f} s")
    out.print(markup("{}", footer))


def _check_arguments(invocation: Invocation, model_path: str, opts: ValidateOptions,
                     fw: Mapping[str, object]) -> dict[str, object]:
    """The checks that need no heavy import (model path, dtypes, database, config file, --layers);
    returns the session configuration."""
    from ..config import default_database_path

    check_model_path(model_path)
    check_dtype("--dtype", None if opts.dtype == "auto" else opts.dtype)
    check_dtype("--reference-dtype", opts.reference_dtype)
    invocation.database = check_database_path(default_database_path(fw))
    return _session_config(opts)


@app.command(help=_HELP)
def validate(
    ctx: typer.Context,
    model_path: str = typer.Option(..., "--model-path",
                                   help="model directory or file (.safetensors or .zt with config.json, "
                                        "or an .onnx file)"),
    reference_backend: str = typer.Option("auto", "--reference-backend", help="python_reference where a reference written from the math exists, else float64_eager (the model's own eager code in float64) (default: auto)"),
    alternative_backend: str = typer.Option("auto", "--alternative-backend", help="backend name or 'auto' (default: auto)"),
    config_file: Path | None = typer.Option(None, "--config-file", help="JSON file of session configuration keys"),
    output_file: Path | None = typer.Option(None, "-o", "--output-file",
                                            help="write the result: JSON, or the HTML report if it ends in .html"),
    verbose: bool = typer.Option(False, "--verbose", help="every checkpoint in the table, and the isolation table"),
    checkpoints: str | None = typer.Option(None, "--checkpoints", help="comma-separated checkpoint names or "
                                           "ids, no spaces: post_embedding, post_attention, post_mlp, post_processing "
                                           "(every layer) or post_mlp:3 (one layer), as in post_attention,post_mlp:3"),
    layers: str | None = typer.Option(None, "--layers", help="layer range START:STOP (per-layer checkpoints of these layers)"),
    dtype: str | None = typer.Option(None, "--dtype", help="the alternative's compute dtype (float32, float16, "
                                     "bfloat16, float64), or auto: the precision the backend declares (an ONNX "
                                     "file's weights, an engine's precision hint)"),
    reference_dtype: str | None = typer.Option(None, "--reference-dtype",
                                               help="the reference's compute dtype (default: float64 for python_reference)"),
    device: str | None = typer.Option(None, "--device", help="the alternative's device (cpu, cuda, ...)"),
    rtol: float | None = typer.Option(None, "--rtol", help="relative tolerance (all checkpoints)"),
    atol: float | None = typer.Option(None, "--atol", help="absolute tolerance (all checkpoints)"),
    isolate: bool | None = typer.Option(None, "--isolate/--no-isolate",
                                        help="require per-layer isolation (introduced vs propagated error), or skip it"),
    oracle: bool = typer.Option(False, "--oracle", help="judge by the ratio rule against a float64 python_reference"),
    noise_floor: bool = typer.Option(False, "--noise-floor", help="run each backend twice; report nondeterminism"),
    drill_down: bool = typer.Option(False, "--drill-down", help="name the operator that introduces the error in "
                                    "each diverging layer, with a standalone repro (docs/drilldown.md)"),
    text: list[str] | None = typer.Option(None, "--text", help="input sentence (repeatable); default: seeded random tokens"),
    seed: int | None = typer.Option(None, "--seed", help="seed of the random inputs"),
    inputs: Path | None = typer.Option(None, "--inputs", metavar="FILE.safetensors",
                                       help="named inputs of the model's forward (input_ids, pixel_values, "
                                            "decoder_input_ids ...); default: seeded random inputs"),
    padding_side: str | None = typer.Option(None, "--padding-side", help="right or left: where shorter rows of "
                                            "the batch are padded (default: right)"),
    position_offset: int | None = typer.Option(None, "--position-offset", help="the first token's position, a "
                                               "sequence continued from there (default: 0)"),
    decode_steps: int | None = typer.Option(None, "--decode-steps", metavar="N", help="after the prefill, decode N "
                                            "tokens through each backend's KV cache and compare every step"),
    alternative_endpoint: str | None = typer.Option(None, "--alternative-endpoint", metavar="URL",
                                                    help="a served model: the OpenAI-compatible base URL of its "
                                                         "server (http://host:8000/v1), judged by its tokens' "
                                                         "log-probabilities; the API key from OPENAI_API_KEY "
                                                         "(docs/served.md)"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="SECONDS", help="with --alternative-endpoint: "
                                         "the whole session's limit on the endpoint's requests (default: 600)"),
    concurrency: int | None = typer.Option(None, "--concurrency", metavar="N", help="with --alternative-endpoint: "
                                           "the most requests in flight (default: 4)"),
    decode_tokens: str | None = typer.Option(None, "--decode-tokens", metavar="IDS", help="the tokens fed at the "
                                             "decode steps, one row per input row: '5,9,2;7,7,1' (default: the "
                                             "reference's greedy choice)"),
    stop_at_first_divergence: bool = typer.Option(False, "--stop-at-first-divergence", help="end the decode at "
                                                  "the first decode step that fails (the later steps are not run)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON on stdout (no table)"),
    database: str | None = typer.Option(None, "--database", help="SQLite database file or postgresql:// URL "
                                        "(default: PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)"),
    backend_module: list[str] | None = typer.Option(None, "--backend-module", metavar="PKG.MOD",
                                                    help="import this module first (repeatable): it registers "
                                                         "backends with register_backend(name, factory)"),
    backend_file: list[Path] | None = typer.Option(None, "--backend-file", metavar="PATH.py",
                                                   help="import this Python file first (repeatable): it registers "
                                                        "backends with register_backend(name, factory)"),
    alternative_model: Path | None = typer.Option(None, "--alternative-model", metavar="FILE",
                                                  help="a converted file of the --model-path model, run by the "
                                                  "alternative: an optimised ONNX file of an ONNX model (an engine "
                                                  "that runs ONNX files; checkpoints matched by tensor name), a "
                                                  "GGUF of a Hugging Face model (an engine that runs GGUF files), "
                                                  "or a .pte program (an engine that runs .pte files)"),
    mark_all: bool = typer.Option(False, "--mark-all",
                                  help="an ONNX-file model: compare every node output too, in topological order "
                                       "(streamed; the first node-level divergence)"),
    plugin: Path | None = typer.Option(None, "--plugin", help="kernel plugin manifest: the alternative is the PyTorch "
                                       "model with its kernels swapped in (backend plugin:<id>)"),
    backend_option: list[str] | None = typer.Option(None, "--backend-option", metavar="KEY=VALUE",
                                                    help="an option of the alternative backend (repeatable), e.g. "
                                                         "precision_hint=bf16 or optimization=basic (each engine "
                                                         "lists its own); VALUE is read as JSON where it parses"),
) -> int:
    """Validate, print the table (or the JSON), and return the exit code."""
    invocation: Invocation = ctx.obj
    invocation.as_json = as_json
    if output_file is not None:
        if is_stdout(output_file) and as_json:
            raise CliError("--output-file - and --json both write to standard output; choose one")
        if not is_stdout(output_file):
            check_output_path(output_file)  # a FIFO, device or symlink is refused before any work
    opts = ValidateOptions(config_file, checkpoints, layers, dtype, reference_dtype, device, rtol, atol, isolate,
                           oracle, noise_floor, tuple(text or ()), seed, drill_down)
    from .. import get_framework_config

    fw = get_framework_config()  # PIE_DEBUG_* read here, at the edge
    if database:
        fw["database_path"] = database
    session_config = _check_arguments(invocation, model_path, opts, fw)  # fast: before the heavy imports
    if alternative_model is not None:
        alternative_backend = _engine_for_file(alternative_model, alternative_backend)
        session_config["alternative_options"] = {**(session_config.get("alternative_options") or {}),
                                                 "model_file": str(alternative_model)}
    if backend_option:
        session_config["alternative_options"] = {**(session_config.get("alternative_options") or {}),
                                                 **parse_backend_options(backend_option)}
    if inputs is not None:
        session_config["inputs_file"] = str(inputs)
    if mark_all:
        session_config["mark_all"] = True
    session_config.update(_decode_options(padding_side, position_offset, decode_steps, decode_tokens))
    session_config.update(_served_options(alternative_endpoint, timeout, concurrency))
    if stop_at_first_divergence:
        session_config["stop_at_first_divergence"] = True
    from ..models.session_config import SessionConfig

    config = SessionConfig.from_mapping(session_config)  # validated once, here: a bad key is DF005 before any load
    load_backend_code(backend_module or (), backend_file or ())
    from ..services.validation_engine import ValidationEngine

    engine = ValidationEngine(config=fw)
    invocation.database = Path(engine.database_path)
    if plugin is not None:
        alternative_backend = _plugin_alternative(plugin, alternative_backend, engine)
    sid = engine.create_session(model_path, config, reference_backend, alternative_backend,
                                command=reproduce_command_line(PROG, invocation.argv))
    invocation.session_id = sid
    with stdout_for_json_only(as_json), stage_progress(make_console(stderr=True), "loading model") as progress:
        result = engine.run(sid, progress=progress, layer_progress=progress.layers)
    if output_file is not None:
        _write_output(output_file, engine, sid, result)
    if as_json:
        print_json(result.to_dict())
    else:
        to_stdout = is_stdout(output_file)
        footer = f"session {sid} in {engine.db.location}" + (f"; wrote {output_file}" if output_file and not to_stdout
                                                               else "")
        _print_summary(make_console(stderr=to_stdout), result, verbose, footer)  # stdout holds the report
    return EXIT_PASS if result.verdict == "passed" else EXIT_FAIL


def _decode_options(padding_side: str | None, position_offset: int | None, decode_steps: int | None,
                    decode_tokens: str | None) -> dict[str, object]:
    """The padding, position and decode options given, as session configuration keys (checked
    with the rest of the configuration when the session is created)."""
    cfg: dict[str, object] = {}
    for key, value in (("padding_side", padding_side), ("position_offset", position_offset),
                       ("decode_steps", decode_steps)):
        if value is not None:
            cfg[key] = value
    if decode_tokens is not None:
        try:
            cfg["decode_tokens"] = [[int(t) for t in row.split(",") if t.strip()] for row in decode_tokens.split(";")]
        except ValueError as exc:
            raise CliError(f"--decode-tokens must be comma-separated token ids, rows separated by ';': "
                           f"{decode_tokens!r}") from exc
    return cfg


def _served_options(endpoint: str | None, timeout: float | None, concurrency: int | None) -> dict[str, object]:
    """``--alternative-endpoint``, ``--timeout`` and ``--concurrency`` as session configuration keys
    (checked with the rest when the session is created); the last two only with an endpoint."""
    if endpoint is None:
        if timeout is not None or concurrency is not None:
            raise CliError("--timeout and --concurrency apply to a served model: give --alternative-endpoint URL")
        return {}
    cfg: dict[str, object] = {"alternative_endpoint": endpoint}
    if timeout is not None:
        cfg["timeout"] = timeout
    if concurrency is not None:
        cfg["concurrency"] = concurrency
    return cfg


def _engine_for_file(model_file: Path, alternative: str) -> str:
    """The alternative for ``--alternative-model``: the one given, or with ``auto`` the engine that
    runs files of its kind by default (the registry's ``file_formats``, by the file's suffix; for
    ``.onnx`` the engine ``auto`` means for an ONNX-file model)."""
    if alternative != "auto":
        return alternative
    from ..backends.registry import default_engine_for

    record = default_engine_for(model_file.suffix.lower().lstrip("."))
    return alternative if record is None else record.name


def _plugin_alternative(manifest: Path, alternative: str, engine: ValidationEngine) -> str:
    """``--plugin``: register and build the plugin in the session database; its backend name."""
    from ..services.plugin_registry import PluginRegistry
    from .framework import CliError

    name = PluginRegistry(engine.db).swap_in(manifest)
    if alternative not in ("auto", name):
        raise CliError(f"--plugin runs {name} as the alternative; drop --alternative-backend {alternative}")
    return name


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), validate, print; returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    raise SystemExit(run(argv))


if __name__ == "__main__":
    main()
