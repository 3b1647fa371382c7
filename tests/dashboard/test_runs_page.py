"""The ``debug_module`` runs page, contributed through the ``debug_framework.dashboard_pages`` entry
points (debug_framework never imports debug_module), on real run directories: an Inductor run with
constraints and a guard report, and a failing KernelDiff run with its plots."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")

ENTRY_POINTS = "[debug_framework.dashboard_pages]\nruns = debug_module.dashboard_page:runs_page\n"


def install_entry_points(folder: Path) -> Path:
    """A distribution on ``folder`` declaring the page, as an installed debug_module does (pyproject)."""
    info = folder / "dashboard_pages_test-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dashboard-pages-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return folder


def _page(root: str) -> None:
    from pathlib import Path

    from debug_framework.dashboard.extensions import PageContext, contributed_pages

    page = next(p for p in contributed_pages() if p.name == "runs")
    page.render(PageContext(database="unused.db", artifacts=Path(root)))


def test_the_page_is_found_through_the_entry_point_group(tmp_path, monkeypatch):
    from debug_framework.dashboard.extensions import contributed_pages

    monkeypatch.syspath_prepend(str(install_entry_points(tmp_path)))
    (page,) = [p for p in contributed_pages() if p.name == "runs"]
    assert page.title == "debug_module runs" and page.error is None
    bad = tmp_path / "bad"
    install_entry_points(bad)
    (bad / "dashboard_pages_test-0.dist-info" / "entry_points.txt").write_text(
        "[debug_framework.dashboard_pages]\nbroken = no_such_module_xyz:page\n")
    monkeypatch.syspath_prepend(str(bad))
    (broken,) = [p for p in contributed_pages() if p.name == "broken"]
    assert broken.render is None and "ModuleNotFoundError" in broken.error


@pytest.mark.slow
def test_runs_page_shows_violations_guards_and_kerneldiff(runs, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    root, ids = runs
    monkeypatch.syspath_prepend(str(install_entry_points(tmp_path)))
    at = AppTest.from_function(_page, args=(str(root),), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert set(at.selectbox[0].options) == {ids["aot"], ids["kd"]}
    at.selectbox[0].select(ids["aot"]).run()
    frames = [d.value for d in at.dataframe]
    violations = next(f for f in frames if "constraint" in f.columns)
    assert (violations["constraint"] == "shape_alignment").any() and violations["source"].str.contains(r"\.py:\d+").any()
    assert any("graph breaks" in c.value for c in at.caption)
    assert any(c.value.startswith("statistics of statistics/") for c in at.caption) and at.json  # graph statistics
    at.selectbox[0].select(ids["kd"]).run()
    assert any("KernelDiff failed" in e.value for e in at.error)
    frames = [d.value for d in at.dataframe]  # the result is tables, not a collapsed raw {...}
    assert any("tensor" in f.columns and (f["verdict"] == "FAIL").any() for f in frames)
    assert at.get("image"), "the KernelDiff plots"


def test_a_kerneldiff_result_reads_as_tables(runs):
    """Issue 48, item 9: the failing KernelDiff run's result is a run table and one row per tensor."""
    import json

    from debug_module.dashboard_page import kerneldiff_tables

    root, ids = runs
    kd = json.loads(next(root.rglob(f"{ids['kd']}/reports/kerneldiff.json")).read_text())
    summary, tensors = kerneldiff_tables(kd)
    fields = dict(zip(summary["field"], summary["value"], strict=True))
    assert fields["verdict"] == "FAIL" and fields["first divergent module"] == "fc2"
    assert list(tensors.columns) == ["kind", "tensor", "verdict", "rule", "max abs", "RMSE", "ratio", "reason"]
    assert len(tensors) == len(kd["outputs"]) + len(kd["gradients"]) + len(kd["modules"])
    failed = tensors[tensors["verdict"] == "FAIL"]
    assert set(failed["kind"]) >= {"output", "module"} and "fc2" in set(failed["tensor"])
    assert all(v == "-" or float(v) >= 0 for v in tensors["max abs"])


def test_runs_page_without_runs(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.syspath_prepend(str(install_entry_points(tmp_path / "ep")))
    at = AppTest.from_function(_page, args=(str(tmp_path / "none"),), default_timeout=30)
    at.run()
    assert not at.exception
    assert "No debug_module runs here" in at.info[0].value


def test_a_plot_named_like_markdown_is_captioned_as_text(tmp_path, monkeypatch):
    """A KernelDiff plot's path comes from the run's manifest: its caption (Markdown) is escaped."""
    import json
    import struct
    import zlib

    from streamlit.testing.v1 import AppTest

    from debug_framework.dashboard.data import literal

    def png() -> bytes:  # a 1x1 grey PNG
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))

    run = tmp_path / "runs" / "run-1"
    plot = "plots/[x](javascript:alert(1))_**b**.png"
    (run / "plots").mkdir(parents=True)
    (run / "reports").mkdir()
    (run / plot).write_bytes(png())
    (run / "reports" / "kerneldiff.json").write_text(json.dumps({"passed": False}))
    (run / "manifest.json").write_text(json.dumps({
        "schema": "debug_module.run/1", "run_id": "run-1", "status": "finished",
        "files": [{"path": plot, "kind": "kerneldiff_plot"}, {"path": "reports/kerneldiff.json", "kind": "kerneldiff"}]}))
    monkeypatch.syspath_prepend(str(install_entry_points(tmp_path / "ep")))
    at = AppTest.from_function(_page, args=(str(tmp_path / "runs"),), default_timeout=30)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (image,) = at.get("image")
    assert [i.caption for i in image.proto.imgs] == [literal(plot)]  # shown as typed, never as a link
