"""The HTML report: sections, first divergence, heatmap sources, escaping, self-containment."""

from __future__ import annotations

import base64
import math
import re
import sqlite3
import struct
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest

from debug_framework.models.debug_session import DebugSession
from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_diff, render_html
from debug_framework.reports._tensors import heatmap_for
from debug_framework.services.validation.results import CheckpointResult
from debug_framework.services.session_diff import diff_sessions

EVIL = "<script>alert(1)</script>\"' onmouseover=alert(2) <img src=x onerror=alert(3)>"

ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "nav", "a", "section", "div", "span",
    "strong", "code", "pre", "table", "thead", "tbody", "tr", "th", "td", "details", "summary", "img", "ul", "li",
    "footer", "svg", "text", "rect", "line", "polyline", "circle", "g", "path", "defs", "lineargradient", "stop",
    "tspan", "ol", "h4",
}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        self.tags.append((tag, d))
        if d.get("id"):
            self.ids.add(d["id"])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> _Collector:
    c = _Collector()
    c.feed(page)
    c.close()
    return c


def assert_inert(page: str) -> _Collector:
    """No element or attribute came from data: only our tags, no event handlers, no scripts,
    nothing loaded from outside the file."""
    c = parse(page)
    for tag, attrs in c.tags:
        assert tag in ALLOWED_TAGS, f"unexpected element <{tag}>"
        for name, value in attrs.items():
            assert not name.startswith("on"), f"event handler attribute {name} on <{tag}>"
            if name in ("src", "href"):
                assert value is not None and (value.startswith("#") or value.startswith("data:image/png;base64,")), value
    assert "<script" not in page.lower()
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    return c


def test_failing_session_has_every_section(db, build):
    b = build(db, bug_layer=2)
    assert b.first == ("post_mlp", 2)
    rep = ValidationReport.from_session(b.session_id, db)
    page = rep.generate_html_report()
    c = assert_inert(page)
    for sid in ("verdict", "summary", "curves", "checkpoints", "isolation", "heatmap", "performance", "backends",
                "tolerances", "config", "environment", "reproduce", "first-divergence", "introducing-layers"):
        assert sid in c.ids, sid
    text = " ".join(c.text)
    assert "FAILED" in text and "first divergence: <strong>post_mlp:2 (" in page
    # exactly one row is marked first, and it is post_mlp layer 2
    first_rows = re.findall(r'<tr class="first" id="row-(\d+)">', page)
    assert first_rows == ["6"]  # post_embedding, post_attention:0, post_mlp:0, ..., post_mlp:2
    assert re.search(r'<tr class="first" id="row-6"><td class="num">6</td><td>post_mlp:2</td>', page)
    assert "&larr; first divergence" in page
    # one log-scale chart per metric with data, plus the marker line of the first divergence
    charts = re.findall(r'data-chart="([a-z0-9_]+)"', page)
    for m in ("max_abs_error", "mean_abs_error", "rmse", "rel_l2_error", "max_ulp_error", "cosine_distance",
              "sqnr_db", "isolation", "per_layer_time"):
        assert m in charts, m
    assert page.count('class="fd-line"') >= 8
    # isolation names layer 2 as the one that introduces error
    assert re.search(r"Layers that introduce error on their own: <strong>layer 2( \(mlp\))?</strong>", page)
    # heatmap from the recorded tensors of the worst checkpoint
    assert 'data-source="recorded tensors"' in page
    worst = max(b.results, key=lambda r: r["max_abs_error"])
    assert f"Heatmap of the worst checkpoint: {worst['checkpoint']}:{worst['layer']}" in page
    # backends with versions, tolerances, environment, command
    assert "2.13.0" in text and "float64" in text and "rtol" in text and "python" in text
    assert "debug_validate --model-path /models/tiny-llama" in text and "as recorded by the engine" in text
    assert 'http-equiv="Content-Security-Policy"' in page


def test_passing_session(db, build):
    b = build(db, bug_layer=None)
    page = ValidationReport.from_session(b.session_id, db).generate_html_report()
    c = assert_inert(page)
    assert b.first is None and 'class="first"' not in page
    assert "PASSED" in " ".join(c.text) and "none: every checkpoint within tolerance" in page
    assert 'class="verdict ok"' in page


def _rename_session(path, old: str, new: str) -> str:
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA foreign_keys = OFF")
    with conn:
        for table in ("sessions", "checkpoint_results", "tensor_recordings", "tensor_comparisons"):
            conn.execute(f"UPDATE {table} SET session_id = ? WHERE session_id = ?", (new, old))
    conn.close()
    return new


def test_every_user_string_is_escaped(db, build):
    b = build(db, model_path=f"/m/{EVIL}", reference_backend=f"ref{EVIL}", alternative_backend=f"alt{EVIL}",
              config={EVIL: EVIL, "nested": {"k": EVIL}},
              extra_results={"note": EVIL, EVIL: [EVIL, 1.0], "command": f"debug_validate --model-path '{EVIL}'"},
              checkpoint_name_override=f"cp{EVIL}")
    # the store refuses such an id (DF005), so a hand-written (foreign) row carries it
    b.session_id = _rename_session(db.database_path, b.session_id, f"sid{EVIL}")
    row = db.get_session(b.session_id)
    assert row["model_path"].endswith(EVIL)
    db.update_session(b.session_id, environment={"device": EVIL, EVIL: "x"}, tolerances={"rtol": 1e-4, EVIL: EVIL},
                      reference_backend_info={"version": EVIL})
    rep = ValidationReport.from_session(b.session_id, db)
    for page in (rep.generate_html_report(), render_html(rep, include_tensors=True)):
        c = assert_inert(page)
        text = "".join(c.text)
        # the payload is there, as text, in the places it was put
        assert text.count("<script>alert(1)</script>") >= 10
        assert "cp<script>alert(1)</script>" in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27; onmouseover=alert(2)" in page
    # session ids with markup are escaped in the title too
    assert "<title>Validation report sid&lt;script&gt;" in page


def test_worst_element_fallback_when_no_tensors(db, build):
    b = build(db, record=False)
    page = ValidationReport.from_session(b.session_id, db).generate_html_report()
    assert_inert(page)
    assert 'data-source="worst-element list"' in page and "grey cells are unknown, not zero" in page


def test_missing_tensor_file_falls_back_with_a_note(db, build):
    b = build(db, record=True)
    rep = ValidationReport.from_session(b.session_id, db)
    for rec in rep.tensor_recordings:
        (b.store.root / rec["path"]).unlink(missing_ok=True)
    page = render_html(rep, include_tensors=True)
    assert_inert(page)
    assert 'data-source="worst-element list"' in page and "could not be read" in page
    assert "DF003" in page  # the tensors table says why each value is missing


def test_heatmap_from_tensors_matches_the_comparison_core(db, build):
    b = build(db, record=True, recording_limit=2)
    rep = ValidationReport.from_session(b.session_id, db)
    worst = max(rep.checkpoint_results, key=lambda r: r["max_abs_error"])
    hm = heatmap_for(CheckpointResult.from_row(worst), rep.tensor_recordings, b.store)
    assert hm is not None and hm.source == "recorded tensors"
    assert hm.full_shape == list(worst["reference_shape"])
    # the map's max is the core's max abs error (two independent computations)
    assert float(np.nanmax(hm.matrix)) == pytest.approx(worst["max_abs_error"], rel=1e-6)
    # the worst element lands in the hottest cell
    w0 = worst["worst"][0]["index"]
    r = int(np.ravel_multi_index(w0[:-1], worst["reference_shape"][:-1]))
    assert hm.matrix[r // hm.block[0], w0[-1] // hm.block[1]] == pytest.approx(worst["max_abs_error"], rel=1e-6)


def _png_size(page: str) -> tuple[int, int, bytes]:
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m
    data = base64.b64decode(m.group(1))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    return w, h, zlib.decompress(idat)


def test_heatmap_png_is_valid_and_downsampled(db, tmp_path):
    # a big tensor with one NaN mismatch: downsampled by block max, the NaN cell is magenta
    from debug_framework.comparison import compare
    from debug_framework.storage.tensor_store import RecordingCandidate, TensorStore

    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 100, 384)).astype(np.float32)
    alt = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    alt[3, 99, 383] = np.nan
    s = DebugSession(model_path="/m/big", reference_backend="a", alternative_backend="b", db=db)
    s.save()
    s.update_status("running")
    res = compare(ref, alt, rtol=1e-4, atol=1e-5).to_dict()
    res.update(checkpoint="post_mlp", layer=0)
    db.add_checkpoint_result(s.session_id, res)
    store = TensorStore.beside_database(db.database_path)
    store.record_session(db, s.session_id, [RecordingCandidate("post_mlp", 0, "reference", ref, score=1.0),
                                            RecordingCandidate("post_mlp", 0, "alternative", alt, score=1.0)])
    s.update_status("failed")
    rep = ValidationReport.from_session(s.session_id, db)
    page = rep.generate_html_report()
    hm = heatmap_for(CheckpointResult.from_row(rep.checkpoint_results[0]), rep.tensor_recordings, store)
    assert hm.rows == 400 and hm.cols == 384 and hm.matrix.shape[0] <= 64 and hm.matrix.shape[1] <= 160
    assert math.isinf(hm.matrix[-1, -1])
    w, h, raw = _png_size(page)
    assert (h, w) == hm.matrix.shape
    stride = 1 + 3 * w
    assert raw[(h - 1) * stride + 1 + 3 * (w - 1):(h - 1) * stride + 1 + 3 * w] == b"\xff\x00\xff"
    assert "each pixel is the max over a block" in page


def test_old_and_errored_sessions_render(db):
    # a session the engine never finished: no results JSON, no rows, no tolerances or environment
    s = DebugSession(model_path="/m/old", reference_backend="python_reference", alternative_backend="x", db=db)
    s.save()
    s.update_status("error", "backend x crashed: <segfault>")
    page = ValidationReport.from_session(s.session_id, db).generate_html_report()
    c = assert_inert(page)
    text = " ".join(c.text)
    assert "ERROR" in text and "backend x crashed: <segfault>" in text
    assert "no checkpoint results stored" in text
    assert "rebuilt from the stored session" in text  # no command recorded: we say so


def test_nan_metrics_render(db, build):
    from debug_framework.comparison import compare

    b = build(db, bug_layer=None, record=False)
    ref = np.ones((3, 4), np.float32)
    alt = ref.copy()
    alt[1, 2] = np.nan
    r = compare(ref, alt).to_dict()
    r.update(checkpoint="post_processing", layer=None)
    db.add_checkpoint_result(b.session_id, r)  # replaces the row: NaN mismatch
    rep = ValidationReport.from_session(b.session_id, db)
    page = rep.generate_html_report()
    assert_inert(page)
    n = len(rep.checkpoint_results) - 1
    last = page[page.index(f'<tr class="first" id="row-{n}"'):]  # the first failing row is the first divergence
    assert "<td>FAIL <span" in last[:400]
    assert re.search(r"<th>nan_count_alt</th><td>1</td>", last)


def test_diff_report(db, build):
    before = build(db, bug_layer=None, seed=0)
    after = build(db, bug_layer=3, seed=0)
    diff = diff_sessions(before.session_id, after.session_id, db)
    assert {(c.checkpoint, c.layer) for c in diff.worse} >= {("post_mlp", 3), ("post_processing", None)}
    page = render_diff(diff, "html", db=db)
    c = assert_inert(page)
    assert "changes" in c.ids and "verdict" in c.ids
    assert page.count('<tr class="worse">') == len(diff.worse)
    assert "checkpoint(s) got worse" in page


def test_a_sparse_worst_element_map_shows_only_the_rows_and_columns_that_hold_one():
    """Issue 30 item 10: the logits' worst elements (k of batch x seq x vocabulary) filled a few
    pixels of a 64 x 160 grid; the map is drawn over the rows and columns that hold one."""
    from debug_framework.reports.html_report import _heatmap

    hits = [((0, 3, 31999), 0.5), ((0, 3, 7), 0.25), ((0, 6, 7), 2.0), ((0, 6, 7), 1.0), ((0, 1, 1200), math.nan)]
    row = {"checkpoint": "logits", "layer": None, "reference_shape": [1, 8, 32000], "max_abs_error": 2.0,
           "worst": [{"index": list(i), "abs_error": e} for i, e in hits]}
    hm = heatmap_for(CheckpointResult.from_row(row), [], None)
    assert hm.source == "worst-element list" and (hm.rows, hm.cols) == (8, 32000)
    assert hm.row_labels == [1, 3, 6] and hm.col_labels == [7, 1200, 31999]
    assert hm.matrix.shape == (3, 3) and hm.matrix[2, 0] == 2.0 and hm.matrix[1, 2] == 0.5
    assert math.isinf(hm.matrix[0, 1]) and int(np.isnan(hm.matrix).sum()) == 9 - 4  # 4 cells known
    page = _heatmap(hm, CheckpointResult.from_row(row))
    assert "only the 3 row(s) and 3 column(s) that hold a worst element: rows 1, 3, 6, columns 7, 1200, 31999" in page
    dense = {**row, "reference_shape": [1, 2, 3],
             "worst": [{"index": [0, i // 3, i % 3], "abs_error": 0.1} for i in range(6)]}
    assert heatmap_for(CheckpointResult.from_row(dense), [], None).row_labels is None  # a dense map keeps every row and column
