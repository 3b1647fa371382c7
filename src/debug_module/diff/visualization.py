"""KernelDiff plots (matplotlib's Agg canvas, no pyplot state): error heatmaps, error by module, summary.

File names carry the report's run id (``kd_<run_id>_heatmap_output_logits.png``) so plots of
different runs never overwrite each other.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .report import DiffReport, TensorDiff

__all__ = ["error_heatmap", "module_error_plot", "summary_plot", "render_report_plots", "error_map"]


class RecordedSide(Protocol):
    """What the plots read of one of the harness's sides: the leaves of its first run."""

    outputs: list[dict[str, torch.Tensor]]
    grads: list[dict[str, torch.Tensor]]


def _figure(w: float = 7.0, h: float = 4.0) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "tensor"


def error_map(reference: torch.Tensor, test: torch.Tensor) -> np.ndarray:
    """Element-wise ``|test - reference|`` for plotting (float64, CPU); a non-finite disagreement
    (NaN vs number, +inf vs -inf) is ``inf``, agreeing non-finite values are 0."""
    r = reference.detach().to("cpu", torch.float64).numpy()
    t = test.detach().to("cpu", torch.float64).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(t - r)
    same_nonfinite = (np.isnan(r) & np.isnan(t)) | (np.isinf(r) & (r == t))
    err = np.where(same_nonfinite, 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    return err


def error_heatmap(reference: torch.Tensor, test: torch.Tensor, name: str, path: Path,
                  worst_index: tuple[int, ...] | None = None) -> Path | None:
    """Heatmap of the absolute error: 1-D as a curve over the index, 2-D as an image, N-D as the 2-D
    slice (last two dims) through the worst element. ``None`` for 0-dim or empty tensors."""
    if reference.shape != test.shape or reference.dim() == 0 or reference.numel() == 0:
        return None
    err = error_map(reference, test)
    if worst_index is None or len(worst_index) != err.ndim:
        finite_max = np.where(np.isinf(err), np.finfo(np.float64).max, err)
        worst_index = tuple(int(i) for i in np.unravel_index(int(np.argmax(finite_max)), err.shape))
    n_nonfinite = int(np.isinf(err).sum())
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    title = f"|test - reference| of {name}"
    if err.ndim == 1:
        shown = np.where(np.isinf(err), np.nan, err)
        ax.plot(np.arange(err.shape[0]), shown, lw=0.8)
        ax.axvline(worst_index[0], color="red", ls="--", lw=0.8, label=f"worst at {worst_index[0]}")
        ax.set_xlabel("index")
        ax.set_ylabel("abs error")
        ax.legend(loc="upper right", fontsize=8)
    else:
        lead = worst_index[:-2]
        plane = err[lead] if lead else err
        if lead:
            title += f"  slice [{', '.join(map(str, lead))}, :, :] through worst {tuple(worst_index)}"
        shown = np.ma.masked_invalid(np.where(np.isinf(plane), np.nan, plane))
        import matplotlib

        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="red")
        im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap)
        fig.colorbar(im, ax=ax, label="abs error (red: non-finite mismatch)")
        ax.plot([worst_index[-1]], [worst_index[-2]], marker="x", color="white", ms=8)
        ax.set_xlabel(f"dim {err.ndim - 1}")
        ax.set_ylabel(f"dim {err.ndim - 2}")
    if n_nonfinite:
        title += f"  ({n_nonfinite} non-finite mismatches)"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _bar_values(diffs: list[TensorDiff]) -> list[float]:
    vals = []
    for d in diffs:
        v = d.result.max_abs_error
        vals.append(float("nan") if v is None else v)
    return vals


def module_error_plot(report: DiffReport, path: Path) -> Path | None:
    """Max abs error of every submodule, in eager execution order; failing modules red, first divergent marked."""
    per: dict[str, tuple[float, bool]] = {}
    for d in report.modules:
        v = d.result.max_abs_error
        v = math.inf if v is None and not d.passed else (v or 0.0)
        old = per.get(d.module, (0.0, True))
        per[d.module] = (max(old[0], v), old[1] and d.passed)
    names = [n for n in report.module_order if n in per]
    if not names:
        return None
    fig = _figure(max(6.0, 0.35 * len(names) + 2), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    finite = [per[n][0] for n in names if math.isfinite(per[n][0]) and per[n][0] > 0]
    cap = (max(finite) * 10) if finite else 1.0
    floor = (min(finite) / 10) if finite else 1e-12
    heights = [min(per[n][0], cap) if per[n][0] > 0 else floor for n in names]
    colors = ["#c0392b" if not per[n][1] else "#27ae60" for n in names]
    ax.bar(range(len(names)), heights, color=colors)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("max abs error")
    first = report.first_divergent_module
    if first in names:
        i = names.index(first)
        ax.annotate("first divergent", (i, heights[i]), xytext=(0, 12), textcoords="offset points", ha="center",
                    fontsize=8, color="#c0392b", arrowprops={"arrowstyle": "->", "color": "#c0392b"})
    ax.set_title(f"error by module ({report.model_name}; execution order; red = diverges)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def summary_plot(report: DiffReport, path: Path) -> Path | None:
    """Max abs error per output and gradient, green pass / red fail (log scale)."""
    diffs = report.outputs + report.gradients
    if not diffs:
        return None
    fig = _figure(7.0, max(2.5, 0.3 * len(diffs) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    vals = _bar_values(diffs)
    finite = [v for v in vals if math.isfinite(v) and v > 0]
    floor = (min(finite) / 10) if finite else 1e-12
    cap = (max(finite) * 10) if finite else 1.0
    shown = [floor if (not math.isfinite(v) and math.isnan(v)) or v <= 0 else min(v, cap) for v in vals]
    ax.barh(range(len(diffs)), shown, color=["#27ae60" if d.passed else "#c0392b" for d in diffs])
    ax.set_xscale("log")
    ax.set_yticks(range(len(diffs)))
    ax.set_yticklabels([f"{d.kind[:4]}: {d.name}" for d in diffs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("max abs error (bars at the left edge: exact)")
    verdict = "PASS" if report.passed else "FAIL"
    ax.set_title(f"KernelDiff {report.model_name}: {report.test_backend} vs {report.reference_backend} - {verdict}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def render_report_plots(report: DiffReport, ref: RecordedSide, test: RecordedSide,
                        module_tensors: dict[str, tuple[torch.Tensor, torch.Tensor]], out_dir: Path,
                        *, max_plots: int = 8) -> list[Path]:
    """All plots of one report: summary, heatmaps (failing tensors first, then the largest errors;
    at most ``max_plots``; a tensor with no error at all gets none), and error by module when modules
    were compared. An exact match (every tensor bit-identical) gets no plot: they would be all zeros;
    the report says "exact match" instead."""
    if report.exact_match:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"kd_{_safe(report.run_id)}_"
    paths: list[Path] = []
    p = summary_plot(report, out_dir / f"{prefix}summary.png")
    if p:
        paths.append(p)
    if report.modules:
        p = module_error_plot(report, out_dir / f"{prefix}modules.png")
        if p:
            paths.append(p)
    candidates = report.outputs + report.gradients
    candidates.sort(key=lambda d: (d.passed, -(d.result.max_abs_error or 0.0) if d.result.max_abs_error is not None
                                   and math.isfinite(d.result.max_abs_error) else -math.inf))
    tensors = {}
    for d in report.outputs:
        tensors[("output", d.name)] = (ref.outputs[0].get(d.name), test.outputs[0].get(d.name))
    for d in report.gradients:
        tensors[("gradient", d.name)] = (ref.grads[0].get(d.name), test.grads[0].get(d.name))
    count = 0
    for d in candidates:
        if count >= max_plots:
            break
        r, t = tensors.get((d.kind, d.name), (None, None))
        if r is None or t is None or (d.result.max_abs_error == 0 and not d.has_nonfinite):
            continue
        worst = tuple(d.result.worst[0].index) if d.result.worst else None
        p = error_heatmap(r, t, d.name, out_dir / f"{prefix}heatmap_{d.kind}_{_safe(d.name)}.png", worst)
        if p:
            paths.append(p)
            count += 1
    if report.first_divergent_module:
        for leaf, (r, t) in module_tensors.items():
            if leaf == report.first_divergent_module or leaf.startswith(report.first_divergent_module + "."):
                d = next((x for x in report.modules if x.name == leaf), None)
                worst = tuple(d.result.worst[0].index) if d is not None and d.result.worst else None
                p = error_heatmap(r, t, f"module {leaf}", out_dir / f"{prefix}heatmap_module_{_safe(leaf)}.png", worst)
                if p:
                    paths.append(p)
                break
    return paths
