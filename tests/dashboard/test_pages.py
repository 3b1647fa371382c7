"""Every dashboard page run through Streamlit's AppTest on real sessions made by the engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import APP, HOSTILE, run_page

pytest.importorskip("streamlit")


#: a checkpoint's canonical id, the one spelling every page uses (``post_attention:1``)
CHECKPOINT_ID = re.compile(r"post_(?:embedding|processing)|post_(?:attention|mlp):\d+")


def _texts(at) -> str:
    """Everything the page shows as text or Markdown, joined."""
    parts = [e.value for e in at.markdown] + [e.value for e in at.text] + [e.value for e in at.code]
    parts += [e.value for e in at.caption] + [e.value for e in at.error] + [e.value for e in at.success]
    return "\n".join(str(p) for p in parts)


def test_sessions_page_lists_filters_and_sorts(app_env):
    at = run_page()
    assert at.title[0].value == "Sessions"
    frame = at.dataframe[0].value
    assert set(frame["session"]) == {app_env.passed, app_env.failed, app_env.hostile, app_env.drilled}
    assert "4 of 4 sessions" in _texts(at)
    at.multiselect[3].select("failed").run()  # verdict / status
    frame = at.dataframe[0].value
    assert set(frame["session"]) == {app_env.failed, app_env.drilled}
    assert CHECKPOINT_ID.fullmatch(frame.iloc[0]["first divergence"])  # a failing session names where it diverged
    assert "2 of 4 sessions" in _texts(at)
    # issue 48, item 9: what tells sessions apart is in view at any width: before the model path
    assert list(frame.columns)[:5] == ["session", "status", "verdict", "dtype", "first divergence"]


def test_the_checkpoint_table_shows_what_was_judged_and_what_the_bound_sees(app_env):
    """Issue 48, items 6 and 9: the session page's checkpoint table carries the ``judged`` error beside
    its ``bound`` and what the bound ``sees``, the figures and words of the terminal and the HTML report."""
    from debug_framework.reports._sections import change_text
    from debug_framework.services.validation.results import ValidationResult

    at = run_page("session.py", {"id": app_env.passed})
    table = next(d.value for d in at.dataframe if "checkpoint" in d.value.columns)
    columns = list(table.columns)
    assert columns.index("margin") < columns.index("judged") < columns.index("bound") < columns.index("sees")
    stored = {r.id: r for r in ValidationResult.load(app_env.database, app_env.passed).results}
    for _, row in table.iterrows():
        r = stored[row["checkpoint"]]
        assert row["judged"] == pytest.approx(r.judged_error) and row["sees"] == change_text(r.detectable_change)
    assert "judged: the error held to bound (RMSE)" in _texts(at)


def test_session_page_shows_the_failure_with_bounds_heatmap_and_reports(app_env):
    at = run_page("session.py", {"id": app_env.failed})
    assert "Verdict: **failed**" in at.error[0].value
    first = next(m for m in at.metric if m.label == "first divergence")
    first_id = first.value.replace("\\_", "_")  # the metric is Markdown: its underscores are escaped
    assert CHECKPOINT_ID.fullmatch(first_id)
    table = at.dataframe[0].value
    assert all(CHECKPOINT_ID.fullmatch(c) for c in table["checkpoint"]) and "post_attention:1" in set(table["checkpoint"])
    assert first_id in set(table["checkpoint"])
    assert {"bound", "margin", "judged by"} <= set(table.columns)
    assert (table["passed"] == False).any() and table["margin"].notna().any()  # noqa: E712
    charts = at.get("vega_lite_chart")
    assert charts, "the error curve with its bound"
    spec = charts[0].proto.spec
    assert '"bound"' in spec and '"log"' in spec  # the bound series, on a log scale
    assert '"post_attention:1"' in spec and "post_attention[" not in spec  # the x axis: checkpoint ids
    images = at.get("image")
    assert images, "the heatmap of the worst checkpoint (tensors were recorded)"
    assert "from recorded tensors" in str(images[0].proto)
    assert "debug_validate" in at.code[-1].value and "--dtype bfloat16" in at.code[-1].value
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["HTML report", "JSON report", "CSV report", "JUNIT report"]
    assert not at.get("json")  # error source and environment in words and a table, never raw JSON
    env = next(d.value for d in at.dataframe if "field" in d.value.columns)
    assert "environment.python" in set(env["field"]) and "None" not in set(env["value"])


def test_session_page_shows_the_drill_down(app_env):
    at = run_page("session.py", {"id": app_env.drilled})
    assert not at.exception
    shown = "\n".join(t.value for t in at.text)
    assert "method replay: culprit aten." in shown and "self_attn" in shown
    assert "repro (verified)" in shown
    table = next(d.value for d in at.dataframe if "op" in d.value.columns)
    assert table["introduces"].any() and {"introduced", "carried_in", "bound", "margin"} <= set(table.columns)
    assert bool(table.iloc[0]["culprit"]) and table.iloc[0]["introduces"]  # the culprit first


def test_session_page_escapes_a_hostile_model_path(app_env):
    at = run_page("session.py", {"id": app_env.hostile})
    shown = "\n".join(t.value for t in at.text)
    assert HOSTILE.replace("\u202e", "<U+202E>") in shown  # shown as typed, as plain text, the bidi control named
    assert "\u202e" not in shown
    for md in at.markdown:  # nothing of it reaches Markdown unescaped
        assert "<script>" not in md.value and "](javascript:" not in md.value
    for el in at.get("alert"):
        assert "<script>" not in str(el.proto)


def test_diff_page_diffs_two_sessions(app_env):
    at = run_page("diff.py")
    at.selectbox[0].select(app_env.passed)
    at.selectbox[1].select(app_env.failed)
    at.run()
    assert not at.exception
    worse = next(m for m in at.metric if m.label == "worse")
    assert int(worse.value) > 0
    changes = at.dataframe[0].value
    assert len(changes) > 0 and "post_attention:1" in set(changes["checkpoint"])
    assert all(CHECKPOINT_ID.fullmatch(c) for c in changes["checkpoint"])
    at.selectbox[0].select(app_env.hostile).run()  # another model: DF005 on the page, no traceback
    assert any("DF005" in e.value for e in at.error)


def test_missing_and_corrupt_databases_are_messages(tmp_path, monkeypatch):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "missing.db"))
    for page in (None, "session.py", "diff.py", "plugins.py", "jobs.py"):
        at = run_page(page)
        assert any(e.value.startswith("DF003") for e in at.error), page
        assert not (tmp_path / "missing.db").exists()  # viewing never creates it
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"not a database" * 100)
    monkeypatch.setenv(DATABASE_VARIABLE, str(bad))
    at = run_page()
    assert any(e.value.startswith("DF003") for e in at.error)
    assert "file is not a database" in _texts(at)


def test_plugins_page_shows_pass_rates_and_worst_samples(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.plugins.sweep import KernelSweep, SweepReport
    from debug_framework.storage.database import Database

    db_path = tmp_path / "plugins.db"
    db = Database(db_path)
    sweep = KernelSweep("rms_norm", "aten::rms_norm", samples=[
        {"source": "opinfo", "result": {"status": "pass"}}, {"source": "fuzz", "result": {"status": "fail"}}],
        worst={"sample": 1, "margin": 3.5, "note": HOSTILE})
    db.plugins.upsert("demo_plugin", "1.0", "cpp", {"id": "demo_plugin"})
    db.plugins.set_validation("demo_plugin", {"sweep": SweepReport("demo_plugin", {"rms_norm": sweep}).to_dict()})
    db.close()
    monkeypatch.setenv(DATABASE_VARIABLE, str(db_path))
    at = run_page("plugins.py")
    frame = at.dataframe[0].value
    assert frame.iloc[0]["kernel"] == "rms_norm" and frame.iloc[0]["pass rate"] == pytest.approx(0.5)
    assert at.json and "3.5" in at.json[0].value
    assert "sweep failed" in at.error[0].value


def test_empty_plugins_page(app_env):
    at = run_page("plugins.py")
    assert "No plugins registered" in at.info[0].value


def test_jobs_page_without_tasks(app_env):
    at = run_page("jobs.py")
    assert [b.proto.label for b in at.get("form_submit_button")][:1] == ["Launch validation"] or at.button
    assert any("No tasks launched" in i.value for i in at.info)


def test_app_file_exists():
    assert Path(APP).is_file()
