"""Jobs: launch a validation or a batch job (a worker process runs it), follow the tasks' progress
live (polled from the database, so a reload loses nothing) and cancel them."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from debug_framework.dashboard.data import cells, literal, plain, settings, show_error, viewer
from debug_framework.dashboard.launch import cancel, launch_batch, launch_validation
from debug_framework.errors import DebugFrameworkError
from debug_framework.storage.database import Database
from debug_framework.storage.tasks import ACTIVE_STATES, TaskRecord, TaskStore, worker_gone

st.title("Jobs")
s = settings()
_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _knobs(prefix: str) -> dict[str, object]:
    c = st.columns(4)
    dtype = c[0].selectbox("dtype", _DTYPES, key=f"{prefix}_dtype")
    seed = c[1].number_input("seed", min_value=0, value=0, step=1, key=f"{prefix}_seed")
    batch = c[2].number_input("batch", min_value=1, value=2, step=1, key=f"{prefix}_batch")
    length = c[3].number_input("length", min_value=1, value=16, step=1, key=f"{prefix}_len")
    d = st.columns(4)
    record = d[0].checkbox("record tensors (heatmaps)", key=f"{prefix}_rec")
    oracle = d[1].checkbox("float64 oracle", key=f"{prefix}_oracle")
    drill = d[2].checkbox("drill down to the operator", key=f"{prefix}_drill")
    isolate = d[3].selectbox("isolation", ("auto", "on", "off"), key=f"{prefix}_iso")
    return {"dtype": dtype, "seed": int(seed), "input_shape": [int(batch), int(length)],
            "tensor_recording_enabled": record, "oracle": oracle, "drill_down": drill,
            "isolate": {"auto": "auto", "on": True, "off": False}[isolate]}


def _backends(prefix: str) -> tuple[str, str]:
    """The reference and alternative backends, chosen among the registered ones (a ``plugin:<id>``
    can be typed in); a name is checked before the task is written."""
    from debug_framework.backends.registry import registered_backends

    known = registered_backends()
    c = st.columns(2)
    ref = c[0].selectbox("reference backend", known, index=known.index("python_reference")
                         if "python_reference" in known else 0, key=f"{prefix}_ref", accept_new_options=True)
    alt = c[1].selectbox("alternative backend", ["auto", *known], key=f"{prefix}_alt", accept_new_options=True)
    return str(ref), str(alt)


def show_failure(exc: Exception, doing: str) -> None:
    """An error that is not a framework error, on the page with its cause, never a traceback."""
    st.error(f"could not {doing}: {type(exc).__name__}")
    st.text(plain(exc))


tab_v, tab_b = st.tabs(["Launch a validation", "Launch a batch job"])
with tab_v, st.form("launch_validation"):
    model = st.text_input("model path", placeholder="/path/to/hf-model-dir")
    files = st.text_input("backend files (optional)", placeholder="/path/to/my_backend.py, ...",
                          help="Python files that register backends (as debug_validate --backend-file); their "
                               "backends can then be typed or picked below", key="v_files")
    ref, alt = _backends("v")
    knobs = _knobs("v")
    if st.form_submit_button("Launch validation"):
        try:
            tid = launch_validation(s, model, ref, alt, knobs, files.split(","))
            st.success(f"Launched task {tid}; its progress is below.")
        except DebugFrameworkError as exc:
            show_error(exc, "launch the validation")
        except Exception as exc:  # noqa: BLE001 - not ours to crash on (a disk, the process table): say why
            show_failure(exc, "launch the validation")
with tab_b, st.form("launch_batch"):
    paths = st.text_area("model paths, one per line")
    bfiles = st.text_input("backend files (optional)", placeholder="/path/to/my_backend.py, ...",
                           help="Python files that register backends (as debug_batch --backend-file)", key="b_files")
    bref, balt = _backends("b")
    bknobs = _knobs("b")
    if st.form_submit_button("Launch batch job"):
        try:
            tid = launch_batch(s, paths.splitlines(), bref, balt, bknobs, bfiles.split(","))
            st.success(f"Launched batch task {tid}; its progress is below.")
        except DebugFrameworkError as exc:
            show_error(exc, "launch the batch job")
        except Exception as exc:  # noqa: BLE001 - not ours to crash on (a disk, the process table): say why
            show_failure(exc, "launch the batch job")


def _state(row: dict[str, object], task: TaskRecord) -> str:
    if worker_gone(row):
        return "worker gone"
    return task.state + (" (cancel requested)" if task.cancel_requested and task.state in ACTIVE_STATES else "")


def _verdict(db: Database, task: TaskRecord) -> str:
    """A task's outcome: its session's verdict (passed, failed, error), or its batch job's counts."""
    if task.session_id:
        row = db.sessions.get(task.session_id)
        return "" if row is None or row["status"] in ("created", "running") else str(row["status"])
    if task.job_id:
        job = db.batches.get(task.job_id)
        items = [] if job is None else job["items"]
        done = [i for i in items if i["status"] in ("done", "failed")]
        return f"{len(done)}/{len(items)} items finished" if items else ""
    return ""


@st.fragment(run_every=2)
def tasks_panel() -> None:
    """Every task with its progress, re-read from the database every 2 s."""
    with viewer(s) as db:
        if db is None:
            return
        rows = TaskStore(db).list()
        if not rows:
            st.info("No tasks launched from the dashboard yet.")
            return
        tasks = [(row, TaskRecord.from_row(row)) for row in rows]
        for row, t in tasks:
            if t.state not in ACTIVE_STATES:
                continue
            st.markdown(f"**{literal(t.kind)}** task `{literal(t.task_id)}`: {literal(t.what)}")
            st.progress(min(1.0, t.done / t.total) if t.total else 0.0,
                        text=literal(f"{_state(row, t)}: {t.stage or 'starting'} ({t.done}/{t.total or '?'})"))
            if st.button("Cancel", key=f"cancel_{t.task_id}"):
                try:
                    st.toast(cancel(s, t.task_id))
                except DebugFrameworkError as exc:
                    show_error(exc, "cancel the task")
                except Exception as exc:  # noqa: BLE001
                    show_failure(exc, "cancel the task")
        st.dataframe(cells(pd.DataFrame([{
            "task": t.task_id, "kind": t.kind, "state": _state(row, t), "verdict": _verdict(db, t),
            "stage": t.stage, "done": t.done, "total": t.total,
            "session": f"./session?id={t.session_id}" if t.session_id else None, "job": t.job_id,
            "message": t.message, "created (UTC)": t.created_at[:19],
        } for row, t in tasks])), hide_index=True, width="stretch", key="tasks_table",
            column_config={"session": st.column_config.LinkColumn("session", display_text=r"id=(.*)")})


@st.fragment(run_every=2)
def jobs_panel() -> None:
    """Every batch job in the database (launched here or by debug_batch), with its items' progress."""
    with viewer(s) as db:
        if db is None:
            return
        jobs = db.batches.list(limit=20)
        if not jobs:
            st.info("No batch jobs in this database.")
            return
        for job in jobs:
            counted = job["counts"]
            finished = sum(int(counted[k]) for k in ("done", "failed") if k in counted)
            counts = ", ".join(f"{k} {v}" for k, v in sorted(job["counts"].items()))
            st.progress(finished / job["total"] if job["total"] else 1.0,
                        text=literal(f"job {job['job_id']}: {job['status']} ({finished}/{job['total']}; {counts})"))
            with st.expander("items"):
                full = db.batches.get(job["job_id"]) or {"items": []}
                columns = ("item_index", "model_path", "status", "session_id", "error_message")
                st.dataframe(cells(pd.DataFrame([{k: i[k] if k in i else None for k in columns}
                                                   for i in full["items"]])),
                             hide_index=True, width="stretch")


st.subheader("Tasks")
tasks_panel()
st.subheader("Batch jobs")
jobs_panel()
