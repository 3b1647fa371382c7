"""Kernel plugins: each registered plugin's build and its last validation (the op sweep's per-kernel
pass rates and worst samples, as ``PluginRegistry.sweep`` recorded them)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from debug_framework.dashboard.data import cells, literal, plain, viewer
from debug_framework.storage.plugins import PluginRecord

st.title("Plugins")


with viewer() as db:
    if db is not None:
        plugins = [PluginRecord.from_row(row) for row in db.plugins.list()]
        if not plugins:
            st.info("No plugins registered. Compile and sweep one with plugin_compile (docs/plugins.md).")
        for p in plugins:
            with st.expander(f"{literal(p.plugin_id)} {literal(p.version)} ({literal(p.backend_type)})", expanded=True):
                st.text(plain(f"built: {p.artifact_path or 'not built'}\ncache key: {p.cache_key}"))
                if p.sweep_passed is None:
                    st.caption("No op sweep recorded (plugin_compile sweep).")
                    continue
                ok = p.sweep_passed
                (st.success if ok else st.error)(literal(f"sweep {'passed' if ok else 'failed'}: {p.sweep_samples} "
                                                         f"samples in {p.sweep_seconds:.1f} s"))
                st.dataframe(cells(pd.DataFrame([{"kernel": k.name, **k.figures} for k in p.kernels])),
                             hide_index=True, width="stretch",
                             column_config={"pass rate": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0,
                                                                                         format="percent")})
                for k in p.kernels:
                    if k.worst:
                        st.caption(f"worst sample of {literal(k.name)}")
                        st.json(k.worst, expanded=False)

st.header("Backend conformance sweeps")
with viewer() as db:
    if db is not None:
        sweeps = db.opsweeps.list()
        if not sweeps:
            st.info("No conformance sweep recorded. Sweep a torch.compile backend with debug_opsweep "
                    "(docs/conformance.md).")
        for s in sweeps:
            v = s["verdicts"]
            failing = sum(int(v[k]) for k in ("fail", "error", "crash", "hang") if k in v)
            with st.expander(f"{literal(s['backend'])} on {literal(s['device'])} ({literal(s['sweep_key'])}): "
                             f"{int(v['pass']) if 'pass' in v else 0} passed, {failing} failing", expanded=failing > 0):
                st.text(plain(f"settings: {s['settings']}\nverdicts: {v}"))
                rows = db.opsweeps.results(str(s["sweep_key"]))
                st.dataframe(cells(pd.DataFrame([{
                    "operator": r["op"], "verdict": r["verdict"], "pass rate": r["pass_rate"],
                    "reason": r["reason"], "repro": r["repro"], "repro verified": r["repro_verified"],
                } for r in rows if r["verdict"] != "pass"] or [{"operator": "", "verdict": "every operator passed"}])),
                    hide_index=True, width="stretch")
