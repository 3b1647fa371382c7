"""One session: verdict, first divergence and where the error comes from, the drill-down (culprit
operator and its table) when one ran, per-checkpoint error curves with their bounds, the checkpoint table, decode
steps (margins by step and layer, tokens, KV cache) when the session decoded, the heatmap, environment, the reproduce command and
the reports (HTML, JSON, CSV, JUnit) made by ``debug_framework.reports``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from debug_framework.dashboard.charts import (
    CURVE_METRICS,
    checkpoint_frame,
    curve_chart,
    curve_frame,
    decode_frames,
    drilldown_frame,
    heatmap_image,
)
from debug_framework.dashboard.data import cells, literal, number_columns, plain, session_ids, viewer
from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_report, report_document
from debug_framework.reports._common import backend_label, error_source_text, flat_items, introducing_text, worst_row
from debug_framework.reports._decode import decode_notes, token_text
from debug_framework.reports._sections import judged_caption
from debug_framework.reports.documents import stored
from debug_framework.services.drilldown.types import drilled_where
from debug_framework.report_formats import MEDIA, REPORT_FORMATS

st.title("Session")

with viewer() as db:
    if db is not None:
        ids = session_ids(db)
        wanted = st.query_params.get("id")
        pick = st.selectbox("session", ids, index=ids.index(wanted) if wanted in ids else (0 if ids else None),
                            placeholder="no sessions yet")
        if wanted and wanted not in ids:
            st.warning("There is no session with the id in the address; pick one from the list.")
        if pick:
            st.query_params["id"] = pick
            report = ValidationReport.from_session(pick, db)
            doc = report_document(report)
            view = stored(report)
            sess, result, rows = view.record, view.result, view.rows
            verdict = str(doc["verdict"])
            box = st.success if verdict == "passed" else (st.error if verdict in ("failed", "error") else st.info)
            box(f"Verdict: **{literal(verdict)}** (status {literal(report.overall_status)})")
            alternative = backend_label(sess.alternative_backend, result.alternative_options,
                                        result.alternative_dtype or None)
            st.text(plain(f"model: {sess.model_path}\n{sess.reference_backend} vs {alternative}"))
            if sess.error_message:
                st.text(plain(f"error: {sess.error_message}"))
            first = None if view.first_divergence is None else view.first_divergence.id
            c1, c2, c3 = st.columns(3)
            c1.metric("first divergence", literal(first or "none"))
            c2.metric("introducing layers", literal(introducing_text(result.introducing())))
            c3.metric("checkpoints failed", str(sum(1 for r in rows if r.state is False)))
            if result.source is not None:
                st.subheader("Error source")
                st.text(plain(error_source_text(result.source)))

            st.subheader("Per-checkpoint error and the bound it was judged by")
            metric = st.selectbox("metric", CURVE_METRICS, index=CURVE_METRICS.index("rmse"))
            frame = curve_frame(rows, metric)
            if frame.empty:
                st.info("No finite figures of this metric to plot.")
            else:
                st.altair_chart(curve_chart(frame, metric, first), width="stretch")
            st.caption(judged_caption(rows))
            table = cells(checkpoint_frame(rows))
            st.dataframe(table, hide_index=True, width="stretch", column_config=number_columns(table))

            decoded = decode_frames(result)
            if decoded is not None:
                st.subheader("Decode steps: margins by step and layer")
                st.caption("Each cell: the worst margin (error / bound, at most 1 passes) of that pass's checkpoints "
                           "in that layer; step 0 is the prefill. KL, top-1, top-k: the next-token distributions "
                           "against the reference's.")
                grid, kv = decoded
                st.dataframe(cells(grid), hide_index=True, width="stretch", key="decode_grid")
                st.text(plain(token_text(None if result.decoded is None else result.decoded.first_divergent_token)))
                for line in decode_notes(result):
                    st.text(plain(line))
                if not kv.empty:
                    st.caption("KV cache after each pass: the worse of K and V, by layer")
                    st.dataframe(cells(kv), hide_index=True, width="stretch", key="decode_kv")

            if result.drilldown is not None:
                st.subheader("Drill-down: the operator that introduces the error")
                if not result.drilldown:
                    st.caption("Nothing to drill: no layer diverges.")
                for entry in result.drilldown:
                    c = entry.culprit
                    head = (f"{drilled_where(entry.layer, entry.step)} ({entry.checkpoint}), method {entry.method}: "
                            + (f"culprit {c.op} at {c.module_path or '?'} ({c.source or '?'})" if c else "no culprit"))
                    st.text(plain(head))
                    if c is not None and c.repro_dir:
                        st.text(plain(f"repro ({'verified' if c.verified else 'not verified'}): {c.repro_dir}"))
                    if entry.note:
                        st.caption(literal(entry.note))
                    table = cells(drilldown_frame(entry))
                    if not table.empty:
                        st.dataframe(table, hide_index=True, width="stretch", key=f"drill_{entry.layer}_{entry.step}",
                                     column_config=number_columns(table))

            worst = worst_row(rows)
            st.subheader("Heatmap of the worst checkpoint" + (f": {literal(worst.id)}" if worst else ""))
            image = heatmap_image(worst, report.tensor_recordings, report.tensor_store_root) if worst else None
            if image is None:
                st.caption("No recorded tensors and no worst-element list for this checkpoint.")
            else:
                pixels, source, notes = image
                st.image(pixels, caption=f"|alternative - reference| from {source}", clamp=True,
                         width=min(900, max(200, pixels.shape[1] * 6)))
                for note in notes:
                    st.caption(literal(note))

            st.subheader("Environment")
            env = cells(pd.DataFrame(flat_items({"environment": sess.environment or None,
                                                 "reference": sess.reference_backend_info or None,
                                                 "alternative": sess.alternative_backend_info or None}),
                                     columns=["field", "value"]))
            st.dataframe(env, hide_index=True, width="stretch", key="environment")
            st.subheader("Reproduce")
            st.code(doc["reproduce_command"]["command"] or "", language="bash")
            st.subheader("Reports")
            cols = st.columns(len(REPORT_FORMATS))
            for col, fmt in zip(cols, sorted(REPORT_FORMATS, key=lambda f: f != "html")):  # the page first
                col.download_button(f"{fmt.upper()} report", data=lambda f=fmt: render_report(report, f),
                                    file_name=f"session-{pick}.{MEDIA[fmt][1]}", mime=MEDIA[fmt][0], key=f"dl_{fmt}")
