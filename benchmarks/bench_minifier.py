"""Our minifier vs PyTorch's (``torch._functorch.fx_minifier.minifier``), side by side.

Same graphs, same in-process accuracy oracle for both: a "backend" that replays the graph with one
node's output scaled by 1.01, judged against eager by the comparison core (rtol 1e-3, atol 1e-5).
Graphs: linear ATen chains of 16/64/256/1024 ops with the bad op at the beginning, middle and end,
and the ATen graph of a small random-weight BERT (2 layers, hidden 64) with the first GELU bad.
Printed per case: oracle calls, wall time, and whether the result is exactly the bad op.
Targets (ours): never more calls than PyTorch's, <= 2 log2 N + 8 calls, always the bad op.
Measures and prints; asserts nothing. Ours runs without the fresh-process verification (PyTorch's
minifier has none), so both count only in-process oracle calls.

    .venv/bin/python benchmarks/bench_minifier.py [--sizes 16 64 256 1024] [--torch-budget-s 300]

``--bug-classes [NAME ...]`` (none named: all) also runs the real bug classes of
``tests/diff/bug_models.py`` (each with its buggy backend from ``tests/diff/bug_backends.py``): KernelDiff
finds the failure, and its failing graph goes to ours (the one-command path, fresh-process
verification included in its time) and to PyTorch's accuracy minifier (its ``fx_minifier`` with the
oracle of ``TORCHDYNAMO_REPRO_AFTER=aot`` at ``REPRO_LEVEL=4``, ``backend_aot_accuracy_fails``, with
the FX graph cache off; in process, on the same graph and backend). Printed per class: oracle calls,
seconds (ours: the reduction alone, and with the fresh-process verification PyTorch's minifier does
not do), final node count, and what PyTorch's minifier said.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.fx  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402


def corrupt_node_named(name: str, factor: float = 1.01):
    def backend(gm, example_inputs):
        graph, env = torch.fx.Graph(), {}
        for n in gm.graph.nodes:
            env[n] = graph.node_copy(n, lambda a: env[a])
            if n.op == "call_function" and n.name == name:
                env[n] = graph.call_function(torch.ops.aten.mul.Tensor, (env[n], factor))
        return torch.fx.GraphModule(gm, graph).forward
    return backend


def chain(n_ops: int):
    def f(x):
        for i in range(n_ops):
            x = x + 0.01 if i % 3 == 0 else (x * 0.999 if i % 3 == 1 else torch.neg(x))
        return x
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    return make_fx(f)(x), [x]


def bert():
    import transformers

    cfg = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=32, hidden_act="gelu")
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gm = make_fx(lambda i: model(input_ids=i).last_hidden_state)(ids)
    return gm, [ids]


def compute_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


class Budget(Exception):
    pass


def run_case(label, gm, inputs, bad, torch_budget_s, torch_budget_calls):
    from debug_framework._torch.functorch import fx_minifier
    from debug_module.minifier import AccuracySignature, Minifier

    sig = AccuracySignature(corrupt_node_named(bad), rtol=1e-3, atol=1e-5)
    n = len(compute_nodes(gm))

    t0 = time.perf_counter()
    ours = Minifier(gm, inputs, sig, progress=False, verify=False).minify()
    ours_s = time.perf_counter() - t0
    ours_ok = [x.name for x in compute_nodes(ours.gm)] == [bad]

    calls = 0
    t0 = time.perf_counter()

    def module_fails(g, inps):
        nonlocal calls
        if calls >= torch_budget_calls or time.perf_counter() - t0 > torch_budget_s:
            raise Budget()
        calls += 1
        return sig.check(g, list(inps))[0]

    note = ""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            g2, _ = fx_minifier(gm, inputs, module_fails)
            theirs_ok = [x.name for x in compute_nodes(g2)] == [bad]
            theirs_nodes = len(compute_nodes(g2))
        except Budget:
            theirs_ok, theirs_nodes, note = False, None, f"budget hit ({torch_budget_calls} calls / {torch_budget_s:.0f}s)"
    theirs_s = time.perf_counter() - t0
    bound = 2 * math.log2(n) + 8
    return {"case": label, "N": n, "ours_calls": ours.calls, "ours_s": ours_s, "ours_ok": ours_ok, "ours_nodes": ours.nodes,
            "torch_calls": calls, "torch_s": theirs_s, "torch_ok": theirs_ok, "torch_nodes": theirs_nodes,
            "bound": bound, "note": note}


def _load_bug_modules():
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parents[1] / "tests" / "diff"
    mods = {}
    for stem in ("bug_models", "bug_backends"):
        spec = importlib.util.spec_from_file_location(f"bench_{stem}", here / f"{stem}.py")
        mods[stem] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[stem]
        spec.loader.exec_module(mods[stem])
    return here, mods["bug_models"], mods["bug_backends"]


def bug_classes(names, torch_budget_s):
    """Per real bug class: KernelDiff finds the failure at defaults; the failing graph (the Dynamo graph,
    or its AOT backward graph for a gradient-only bug) goes to ours (the one-command path: signature
    narrowed to the failure's class, reduction, fresh-process verification) and to PyTorch's accuracy
    minifier (``fx_minifier`` with the oracle of REPRO_AFTER=aot / REPRO_LEVEL=4, FX graph cache off)."""
    import tempfile

    from debug_framework._torch.functorch import aot_accuracy_fails, fx_minifier
    from debug_module.diff import KernelDiffHarness, _minify
    from debug_module.minifier import Minifier

    here, bug_models, bug_backends = _load_bug_modules()
    rows = []
    for name in names or list(bug_models.CASES):
        backend_name, gradients, _, _ = bug_models.CASES[name]
        backend = getattr(bug_backends, backend_name)
        model, inputs = getattr(bug_models, name)()
        harness = KernelDiffHarness(model, inputs, model_name=name, test_backend=backend, compare_gradients=gradients,
                                    runs=1, minify_on_failure=False,
                                    test_backend_spec=f"{here / 'bug_backends.py'}:{backend_name}")
        report = harness.compare()
        failing = next(d for d in (report.gradients if gradients else report.outputs) if not d.passed)
        sig = _minify._signature(harness, harness._test_side, failing)
        gm, graph_inputs = harness._test_side.timed.graphs[0]
        (graph, args), *_ = _minify._backward_graphs(gm, graph_inputs, 0) if gradients else [(gm, graph_inputs)]
        n = len(compute_nodes(graph))
        t0 = time.perf_counter()
        holds, obs = sig.check(graph, args)
        ours = Minifier(graph, args, sig.for_failure(obs), progress=False, output_dir=tempfile.mkdtemp()).minify()
        ours_s = time.perf_counter() - t0

        calls, t0, status = 0, time.perf_counter(), "ok"

        def plain(g, inps, backend=backend):
            """The backend as PyTorch's oracle calls it: a callable taking the inputs unpacked (the
            AOTAutograd wrapper these backends return is marked boxed but takes them unpacked)."""
            compiled = backend(g, inps)
            return lambda *a: compiled(*a)

        def module_fails(g, inps):
            nonlocal calls
            if time.perf_counter() - t0 > torch_budget_s:
                raise Budget()
            calls += 1
            return aot_accuracy_fails(g, list(inps), plain)

        theirs_nodes = None
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            try:
                g2, _ = fx_minifier(graph, args, module_fails)
                theirs_nodes = len(compute_nodes(g2))
            except Budget:
                status = f"budget hit ({torch_budget_s:.0f}s)"
            except Exception as e:  # noqa: BLE001 - what PyTorch's minifier said is the measurement
                status = f"{type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"
        rows.append({"case": name, "stage": "backward" if gradients else "forward", "N": n,
                     "ours_calls": ours.calls, "ours_s": ours_s, "ours_nodes": ours.nodes, "verified": ours.verified,
                     "ours_reduce_s": ours_s - (ours.verification.seconds if ours.verification is not None else 0.0),
                     "torch_calls": calls, "torch_s": time.perf_counter() - t0, "torch_nodes": theirs_nodes,
                     "torch_status": status})
        print(f"  done {name}: {rows[-1]}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 64, 256, 1024])
    ap.add_argument("--torch-budget-s", type=float, default=300.0, help="per case, for PyTorch's minifier")
    ap.add_argument("--torch-budget-calls", type=int, default=5000)
    ap.add_argument("--no-bert", action="store_true")
    ap.add_argument("--bug-classes", nargs="*", default=None, metavar="NAME",
                    help="also run the one-command flow on these bug classes (none named: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rows = []
    for size in args.sizes:
        gm, inputs = chain(size)
        nodes = compute_nodes(gm)
        for where, idx in (("begin", 0), ("middle", len(nodes) // 2), ("end", len(nodes) - 1)):
            rows.append(run_case(f"chain-{size} {where}", gm, inputs, nodes[idx].name, args.torch_budget_s,
                                 args.torch_budget_calls))
            print_row(rows[-1], flush=True)
    if not args.no_bert:
        gm, inputs = bert()
        bad = next(n.name for n in compute_nodes(gm) if n.target in (torch.ops.aten.erf.default, torch.ops.aten.gelu.default))
        rows.append(run_case(f"bert-2L ({bad})", gm, inputs, bad, args.torch_budget_s, args.torch_budget_calls))
        print_row(rows[-1], flush=True)
    print_table(rows)
    if args.bug_classes is not None:
        from rich.console import Console
        from rich.table import Table

        t = Table(title="real bug classes: ours (one-command path, verified) vs PyTorch's accuracy minifier "
                        "(fx_minifier + REPRO_LEVEL=4 oracle, FX graph cache off)")
        for col in ("case", "stage", "N nodes", "ours calls", "ours s (reduce)", "ours s (+verify)", "ours nodes",
                    "verified", "torch calls", "torch s", "torch nodes", "torch status"):
            t.add_column(col)
        for r in bug_classes(args.bug_classes, args.torch_budget_s):
            t.add_row(r["case"], r["stage"], str(r["N"]), str(r["ours_calls"]), f"{r['ours_reduce_s']:.2f}",
                      f"{r['ours_s']:.1f}", str(r["ours_nodes"]),
                      str(r["verified"]), str(r["torch_calls"]), f"{r['torch_s']:.1f}", str(r["torch_nodes"]),
                      r["torch_status"])
        Console(width=160).print(t)


def print_row(r, flush=False):
    print(f"  done {r['case']}: ours {r['ours_calls']} calls {r['ours_s']:.2f}s, torch {r['torch_calls']} calls "
          f"{r['torch_s']:.2f}s {r['note']}", flush=flush)


def print_table(rows):
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"minifier: ours vs torch._functorch.fx_minifier (torch {torch.__version__})")
    for col in ("case", "N nodes", "ours calls", "2log2N+8", "ours s", "ours=bad op", "torch calls", "torch s",
                "torch=bad op", "ours<=torch"):
        t.add_column(col, justify="right" if col not in ("case",) else "left")
    for r in rows:
        t.add_row(r["case"], str(r["N"]), str(r["ours_calls"]), f"{r['bound']:.1f}", f"{r['ours_s']:.2f}",
                  "yes" if r["ours_ok"] else f"NO ({r['ours_nodes']} nodes)", str(r["torch_calls"]) + (" (budget)" if r["note"] else ""),
                  f"{r['torch_s']:.2f}", "yes" if r["torch_ok"] else ("n/a" if r["note"] else f"no ({r['torch_nodes']} nodes)"),
                  "yes" if r["ours_calls"] <= r["torch_calls"] else "NO")
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
