"""The human output of ``inductor-debug analyze``: one printer per analysis type (``--json`` prints the
data itself). Every piece of user text (paths, model names, reasons, source lines) prints literally."""

from __future__ import annotations

from typing import TYPE_CHECKING

from debug_framework.cli.framework import add_row, literal, make_console, markup
from debug_framework.jsonio import JsonObject

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["print_analysis"]


def _print_guards(con: Console, d: JsonObject) -> None:
    if not d["available"]:
        con.print(f"no guard report in this run; {d['fx_graph_count']} Dynamo graph(s) captured "
                  "(analyze --model module:factory records one)")
        return
    con.print(f"{d['graph_count']} graph(s), {d['graph_break_count']} graph break(s), "
              f"{len(d['recompilations'])} recompilation(s)")
    for b in d["graph_breaks"]:
        con.print(literal(f"  break: {b['reason']} at {b['file']}:{b['line']}: {b['code']}"))
    for r in d["recompilations"]:
        con.print(literal(f"  recompile (call {r['call_index']}, {r['code_name']}): {'; '.join(r['reasons'])}"))


def _print_constraints(con: Console, d: JsonObject) -> None:
    from rich.table import Table

    con.print(f"{d['violation_count']} violation(s)")
    for c, vs in d["by_constraint"].items():
        con.print(markup("  [bold]{}[/bold]: {}", c, len(vs)))
        for v in vs[:20]:
            src = v.get("source") or {}
            con.print(literal(f"    {v.get('graph')} {v.get('node')} {v.get('op')} {v.get('shape')} {v.get('dtype')} "
                              f"@ {src.get('file')}:{src.get('line')} {src.get('code') or ''}"))
    t = Table(title="coverage")
    for c in ("graph", "nodes", "supported", "share", "partitions"):
        t.add_column(c)
    for c in d["coverage"]:
        add_row(t, c["graph"], c.get("nodes"), c.get("supported_nodes"), f"{c.get('node_share', 0):.1%}",
                c.get("partitions"))
    con.print(t)


def _print_graphs(con: Console, d: JsonObject) -> None:
    from rich.table import Table

    t = Table(title=f"{d['fx_graph_count']} Dynamo graph(s)")
    for c in ("graph", "kind", "nodes", "violations", "peak bytes", "top ops"):
        t.add_column(c)
    for g in d["graphs"]:
        add_row(t, g["name"], g["kind"], g["nodes"], g["violations"], g["peak_memory_bytes"],
                ", ".join(f"{k} x{v}" for k, v in list(g["top_ops"].items())[:4]))
    con.print(t)


def _print_summary(con: Console, d: JsonObject) -> None:
    for k in ("backend", "status", "file_count", "fx_graph_count", "aten_graph_count", "violation_count",
              "graph_break_count", "recompilation_count"):
        con.print(literal(f"  {k}: {d[k]}"))
    kd = d["kerneldiff"]
    if kd:
        con.print(literal(f"  KernelDiff: {'PASS' if kd['passed'] else 'FAIL'} ({kd['test_backend']} vs "
                          f"{kd['reference_backend']})" + (f", first divergent module {kd['first_divergent_module']}"
                                                           if kd["first_divergent_module"] else "")))
    for p in d["repros"]:
        con.print(literal(f"  repro: {p}"))


def print_analysis(d: JsonObject) -> None:
    """Print the ``analyze`` data ``d`` of any type."""
    con = make_console()
    con.print(markup("[bold]{}[/bold] of run {} ({})  {}", d["type"], d["run_id"], d["model"], d["path"]),
              highlight=False)
    printers = {"guards": _print_guards, "constraints": _print_constraints, "graphs": _print_graphs}
    printers.get(d["type"], _print_summary)(con, d)
