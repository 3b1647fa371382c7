"""``plugin_compile``: build a kernel plugin, check it, and sweep its kernels op by op.

    python -m debug_framework.cli.plugin_compile --plugin-path examples/plugins/cpp/plugin.json --validate
    python -m debug_framework.cli.plugin_compile --plugin-path kernel.cu --backend cuda --output-path k.so
    python -m debug_framework.cli.plugin_compile --list --json

Exit codes (:mod:`debug_framework.cli.framework`): 0 compiled (and, with ``--validate``, every
check and every sample passed), 1 a validation failure (opcheck or the op sweep), 2 a usage or
environment error, a compile failure included (DF008: the compiler's first error as
``file:line: message`` and the build log's path), 3 an internal error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .framework import (EXIT_FAIL, EXIT_PASS, CliError, Invocation, add_row, make_app, make_console, markup,
                        print_json, run_app, stdout_for_json_only)

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from ..services.plugin_registry import PluginRegistry

__all__ = ["main", "app"]

PROG = "plugin_compile"
_HELP = ("Compile a kernel plugin (a plugin.json manifest, or one source file), check the build, and with "
         "--validate sweep its kernels op by op against their references. A compile failure is DF008 (exit 2).")
app = make_app(_HELP)


def _list(registry: PluginRegistry, backend: str | None, as_json: bool) -> int:
    from rich.table import Table

    rows = []
    for defn in registry.list_plugins(backend):
        rec = registry.record(defn.id) or {}
        sweep = (rec.get("validation") or {}).get("sweep") or {}
        rows.append({"id": defn.id, "version": defn.version, "backend": defn.backend_type,
                     "kernels": [k.name for k in defn.kernels], "origin": rec.get("origin"),
                     "manifest": None if defn.manifest_path is None else str(defn.manifest_path),
                     "artifact_digest": rec.get("artifact_digest"),
                     "validated": sweep.get("passed") if sweep else None})
    if as_json:
        print_json({"status": "ok", "plugins": rows,
                    "discovery_errors": [e.to_dict() for e in registry.discovery_errors]})
        return EXIT_PASS
    t = Table(title="registered plugins")
    for col in ("id", "version", "backend", "kernels", "origin", "built", "op sweep"):
        t.add_column(col)
    for r in rows:
        verdict = "-" if r["validated"] is None else ("passed" if r["validated"] else "FAILED")
        add_row(t, r["id"], r["version"], r["backend"], ", ".join(r["kernels"]), r["origin"] or "",
                (r["artifact_digest"] or "")[:12] or "no", verdict)
    out = make_console()
    out.print(t)
    for e in registry.discovery_errors:
        out.print(markup("[yellow]installed plugin not loaded[/]: {}", e))
    return EXIT_PASS


def _print_validation(result: JsonObject) -> None:
    from rich.table import Table

    out = make_console()
    build = result["build"]
    out.print(markup("built {} ({}) -> {} ({}; log {})", build["plugin_id"], build["backend_type"], build["artifact"],
                     "from the cache" if build["cached"] else f"compiled in {build['seconds']:.1f} s", build["log_path"]))
    checks = result.get("checks") or {}
    for name, k in (checks.get("kernels") or {}).items():
        tests = (k.get("opcheck") or {}).get("tests") or {}
        bad = {t: v for t, v in tests.items() if v != "SUCCESS"}
        out.print(markup("opcheck {}: {}", name, "passed" if not bad else f"FAILED {bad}"))
    sweep = result.get("sweep")
    if not sweep:
        return
    t = Table(title=markup("op sweep of {} ({} s)", sweep["plugin"], f"{sweep['seconds']:.1f}"))
    for col in ("kernel", "op", "samples", "pass rate", "fail", "error", "crash", "hang", "worst sample"):
        t.add_column(col)
    for k in sweep["kernels"].values():
        worst = k["worst"] or {}
        res = worst.get("result") or {}
        text = f"{worst.get('source', '')} {worst.get('label', '')} {worst.get('dtype', '')}: {res.get('status', '')}"
        add_row(t, k["kernel"], k["op"], k["samples"], f"{100 * k['pass_rate']:.1f}%", k["failed"], k["errors"],
                k["crashes"], k["hangs"], text, style=None if k["passed"] else "red")
    out.print(t)
    for k in sweep["kernels"].values():
        if not k["passed"] and k["worst"]:
            out.print(markup("[red]{}[/]: worst sample {} - {}", k["kernel"], k["worst"]["label"],
                             k["worst"]["result"].get("reason") or ""))
            if k["repro"]:
                out.print(markup("  repro: python {} ({})", k["repro"],
                                 "verified" if k.get("repro_verified") else "not verified"))
            elif k.get("repro_error"):
                out.print(markup("  no repro: {}", k["repro_error"]))
    out.print("[bold green]PASSED[/]" if sweep["passed"] else "[bold red]FAILED[/]: some samples fail (see above)")


@app.command(help=_HELP)
def compile_plugin(
    ctx: typer.Context,
    plugin_path: Path | None = typer.Option(None, "--plugin-path", help="plugin.json (or its folder), or one source file"),
    backend: str | None = typer.Option(None, "--backend", help="cpp, cuda, triton or metal (default: the manifest's)"),
    output_path: Path | None = typer.Option(None, "-o", "--output-file", help="copy the built artifact here"),
    optimization_level: int = typer.Option(2, "--optimization-level", min=0, max=3, help="0-3 (compiler flags)"),
    validate: bool = typer.Option(False, "--validate", help="check the build (ops, opcheck) and sweep each kernel"),
    list_plugins: bool = typer.Option(False, "--list", help="list the registered plugins and exit"),
    model_path: Path | None = typer.Option(None, "--model-path", help="add the shapes a real model run gives the ops"),
    repro_dir: Path = typer.Option(Path("plugin_repros"), "--repro-dir", help="where the worst samples' repros go"),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="seconds a sample may run before it counts as a hang"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="build cache (default: ~/.pie/debug/plugin-builds)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON on stdout"),
    database: str | None = typer.Option(None, "--database", help="session database holding the plugin registry "
                                          "(a file or a postgresql:// URL)"),
) -> int:
    """Compile (and validate) one plugin, or list the registered ones."""
    invocation: Invocation = ctx.obj
    invocation.as_json = as_json
    from ..plugins.manifest import BACKEND_TYPES

    if backend is not None and backend not in BACKEND_TYPES:
        raise CliError(f"unknown --backend {backend!r}", hint=f"use one of {', '.join(BACKEND_TYPES)}")
    from ..services.compilation_engine import CompilationEngine
    from ..services.plugin_registry import PluginRegistry

    registry = PluginRegistry(database, engine=CompilationEngine(cache_dir, optimization_level))
    invocation.database = Path(registry.db.database_path)
    if list_plugins:
        return _list(registry, backend, as_json)
    if plugin_path is None:
        raise CliError("--plugin-path is required (or pass --list)")
    with stdout_for_json_only(as_json):  # compiler and worker output go to stderr: stdout is the JSON
        result = _compile_and_check(registry, plugin_path, backend, output_path, validate, model_path, repro_dir,
                                    timeout)
    passed = result["passed"]
    if as_json:
        print_json({"status": "passed" if passed else "failed", **result})
    else:
        _print_validation(result)
    return EXIT_PASS if passed else EXIT_FAIL


def _compile_and_check(registry: PluginRegistry, plugin_path: Path, backend: str | None, output_path: Path | None,
                       validate: bool, model_path: Path | None, repro_dir: Path, timeout: float) -> JsonObject:
    from ..services.compilation_engine import plugin_definition

    if not (plugin_path.is_dir() or plugin_path.suffix == ".json") and backend is None:
        raise CliError("--backend is required for a lone source file", hint="pass --backend cpp|cuda|triton|metal")
    defn = plugin_definition(plugin_path, backend)
    registry.register_plugin(defn)
    build = registry.build(defn, output_path)
    result: JsonObject = {"plugin": defn.id, "build": build.to_dict(), "passed": True}
    if not validate:
        return result
    checks = registry.validate(defn, timeout_s=timeout)  # exactly this manifest, whatever else shares its id
    result["checks"] = checks
    result["passed"] = bool(checks["passed"])
    if defn.kernels and defn.backend_type != "metal":
        shapes = None
        if model_path is not None:
            from ..plugins.swap import model_shapes

            shapes = model_shapes(defn, build.artifact, model_path)
        sweep = registry.sweep(defn, model_shapes=shapes, repro_dir=repro_dir, timeout_s=timeout)
        result["sweep"] = sweep.to_dict()
        result["passed"] = result["passed"] and sweep.passed
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and ``python -m``): compile/validate/list; returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


if __name__ == "__main__":
    sys.exit(main())
