"""Diff of two sessions: ``services.session_diff`` (the same diff as ``session_report --diff``) with
its table, what else differs, and the diff reports."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from debug_framework.dashboard.data import cells, literal, number_columns, session_ids, show_error, viewer
from debug_framework.errors import DebugFrameworkError
from debug_framework.reports import render_diff
from debug_framework.services.session_diff import diff_sessions, value_text

st.title("Diff of two sessions")

with viewer() as db:
    if db is not None:
        ids = session_ids(db)
        c1, c2 = st.columns(2)
        before = c1.selectbox("before", ids, index=1 if len(ids) > 1 else None, placeholder="session id")
        after = c2.selectbox("after", ids, index=0 if ids else None, placeholder="session id")
        opts = st.columns(3)
        rel = opts[0].number_input("relative change that counts", min_value=0.0, value=0.10, step=0.05)
        floor = opts[1].number_input("ignore changes below", min_value=0.0, value=0.0, format="%g")
        any_model = opts[2].checkbox("allow different models / backends")
        if before and after:
            try:
                diff = diff_sessions(before, after, db, rel_change=rel, abs_floor=floor,
                                     require_same_model=not any_model)
            except DebugFrameworkError as exc:
                show_error(exc, "diff these sessions")
            else:
                counts = diff.to_dict()["counts"]
                cols = st.columns(len(counts))
                for col, (name, n) in zip(cols, counts.items()):
                    col.metric(name, n)
                changes = cells(pd.DataFrame([{
                    "checkpoint": c.id, "layer": c.layer, "change": c.change,
                    "before passed": c.before_passed, "after passed": c.after_passed,
                    "before max abs": c.before_max_abs_error, "after max abs": c.after_max_abs_error,
                } for c in diff.changes]))
                st.dataframe(changes, hide_index=True, width="stretch", column_config=number_columns(changes))
                if diff.differences:
                    st.subheader("What else differs")
                    st.dataframe(cells(pd.DataFrame([{"field": d.field, "before": value_text(d.before, 200),
                                                "after": value_text(d.after, 200)} for d in diff.differences])),
                                 hide_index=True, width="stretch")
                for note in diff.notes:
                    st.caption(literal(note))
                dl = st.columns(3)
                for col, fmt in zip(dl, ("html", "json", "csv")):
                    col.download_button(f"{fmt.upper()} diff", data=render_diff(diff, fmt, db=db),
                                        file_name=f"diff-{before}-{after}.{fmt}", key=f"diff_{fmt}")
