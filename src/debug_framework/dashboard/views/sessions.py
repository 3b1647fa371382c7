"""Sessions: every stored validation session, filtered and sortable (click a column header)."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import streamlit as st

from debug_framework.dashboard.data import cells, literal, session_items, settings, viewer

st.set_page_config(layout="wide")  # the page alone (streamlit run views/sessions.py) is wide too
st.title("Sessions")
s = settings()
st.caption(f"Database: {literal(s.location)}")

with viewer(s) as db:
    if db is not None:
        items = session_items(db)
        if not items:
            st.info("No sessions yet. Run debug_validate, or launch a validation on the Jobs page.")
        else:
            # what tells sessions apart comes first (verdict, dtype, where it diverged), so it is in
            # view at any window width; the long model path and the backends follow
            frame = pd.DataFrame([{
                "session": it["session_id"], "status": it["status"], "verdict": it["verdict"],
                "dtype": it["dtype"], "first divergence": "" if it["first_divergence"] is None
                else it["first_divergence"]["id"], "model": it["model_path"],
                "reference": it["reference_backend"], "alternative": it["alternative_backend"],
                "reference dtype": it["reference_dtype"], "created (UTC)": str(it["created_at"] or "")[:19],
            } for it in items])
            cols = st.columns(5)
            models = cols[0].multiselect("model", sorted(frame["model"].dropna().unique()))
            backends = cols[1].multiselect("backends", sorted(set(frame["reference"].dropna()) |
                                                              set(frame["alternative"].dropna())))
            dtypes = cols[2].multiselect("dtype", sorted(frame["dtype"].dropna().unique()))
            verdicts = cols[3].multiselect("verdict / status", sorted(set(frame["verdict"]) | set(frame["status"])))
            days = pd.to_datetime(frame["created (UTC)"], errors="coerce", format="ISO8601").dt.date
            known = [d for d in days if pd.notna(d)]  # NaT (an unreadable time) is a date to isinstance
            today = datetime.now(timezone.utc).date()  # created_at is UTC: today in UTC, not local time
            default = (min(known, default=today), max([*known, today]))
            span = cols[4].date_input("created between", value=default)
            keep = pd.Series(True, index=frame.index)
            if models:
                keep &= frame["model"].isin(models)
            if backends:
                keep &= frame["reference"].isin(backends) | frame["alternative"].isin(backends)
            if dtypes:
                keep &= frame["dtype"].isin(dtypes)
            if verdicts:
                keep &= frame["verdict"].isin(verdicts) | frame["status"].isin(verdicts)
            if isinstance(span, tuple) and len(span) == 2 and tuple(span) != default:  # unchanged: keep undated rows
                keep &= days.map(lambda d: bool(pd.notna(d) and span[0] <= d <= span[1]))
            shown = frame[keep]
            st.write(f"{len(shown)} of {len(frame)} sessions")
            st.dataframe(cells(shown), hide_index=True, width="stretch", key="sessions_table")
            pick = st.selectbox("open a session", list(shown["session"]), index=None, placeholder="session id")
            if pick and st.button("Show this session", key="open_session"):
                st.switch_page("views/session.py", query_params={"id": pick})
