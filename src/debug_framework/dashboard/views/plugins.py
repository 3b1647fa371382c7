"""Kernel plugins: each registered plugin's build and its last validation (the op sweep's per-kernel
pass rates and worst samples, as ``PluginRegistry.sweep`` recorded them)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from debug_framework.dashboard.data import cells, literal, plain, viewer

st.title("Plugins")


def _seconds(value: object) -> float:
    """A stored duration as a number (0 when it is not one: the row is data, not trusted)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


with viewer() as db:
    if db is not None:
        plugins = db.plugins.list()
        if not plugins:
            st.info("No plugins registered. Compile and sweep one with plugin_compile (docs/plugins.md).")
        for p in plugins:
            with st.expander(f"{literal(p['plugin_id'])} {literal(p.get('version') or '')} "
                             f"({literal(p.get('backend_type') or '')})", expanded=True):
                build = p.get("build") or {}
                st.text(plain(f"built: {p.get('artifact_path') or 'not built'}\ncache key: {build.get('cache_key') or ''}"))
                sweep = (p.get("validation") or {}).get("sweep")
                if not sweep:
                    st.caption("No op sweep recorded (plugin_compile sweep).")
                    continue
                ok = sweep.get("passed")
                (st.success if ok else st.error)(literal(f"sweep {'passed' if ok else 'failed'}: {sweep.get('samples')} "
                                                         f"samples in {_seconds(sweep.get('seconds')):.1f} s"))
                kernels = sweep.get("kernels") or {}
                st.dataframe(cells(pd.DataFrame([{
                    "kernel": name, "op": k.get("op"), "pass rate": k.get("pass_rate"),
                    "passed": k.get("passed_samples"), "applicable": k.get("applicable"), "failed": k.get("failed"),
                    "errors": k.get("errors"), "crashes": k.get("crashes"), "hangs": k.get("hangs"),
                    "skipped": k.get("skipped"), "repro": k.get("repro"), "repro verified": k.get("repro_verified"),
                } for name, k in kernels.items()])), hide_index=True, width="stretch",
                    column_config={"pass rate": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0,
                                                                                format="percent")})
                for name, k in kernels.items():
                    if k.get("worst"):
                        st.caption(f"worst sample of {literal(name)}")
                        st.json(k["worst"], expanded=False)

st.header("Backend conformance sweeps")
with viewer() as db:
    if db is not None:
        sweeps = db.opsweeps.list()
        if not sweeps:
            st.info("No conformance sweep recorded. Sweep a torch.compile backend with debug_opsweep "
                    "(docs/conformance.md).")
        for s in sweeps:
            v = s.get("verdicts") or {}
            failing = sum(int(v.get(k, 0)) for k in ("fail", "error", "crash", "hang"))
            with st.expander(f"{literal(s['backend'])} on {literal(s['device'])} ({literal(s['sweep_key'])}): "
                             f"{int(v.get('pass', 0))} passed, {failing} failing", expanded=failing > 0):
                st.text(plain(f"settings: {s.get('settings')}\nverdicts: {v}"))
                rows = db.opsweeps.results(str(s["sweep_key"]))
                st.dataframe(cells(pd.DataFrame([{
                    "operator": r["op"], "verdict": r["verdict"], "pass rate": r.get("pass_rate"),
                    "reason": r.get("reason"), "repro": r.get("repro"), "repro verified": r.get("repro_verified"),
                } for r in rows if r["verdict"] != "pass"] or [{"operator": "", "verdict": "every operator passed"}])),
                    hide_index=True, width="stretch")
