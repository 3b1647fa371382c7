"""The dashboard's Streamlit entry (``streamlit run app.py``; :mod:`.__main__` does it): the pages
in :mod:`.views` plus those installed through ``debug_framework.dashboard_pages``."""

from __future__ import annotations

from functools import partial

import streamlit as st

from debug_framework.dashboard.data import literal, settings
from debug_framework.dashboard.extensions import ContributedPage, PageContext, contributed_pages

st.set_page_config(page_title="Debug framework dashboard", layout="wide")


def _draw(page: ContributedPage) -> None:
    s = settings()
    st.title(literal(page.title))
    assert page.render is not None
    page.render(PageContext(database=s.database, artifacts=s.artifacts))


pages = [
    st.Page("views/sessions.py", title="Sessions", default=True),
    st.Page("views/session.py", title="Session"),
    st.Page("views/diff.py", title="Diff"),
    st.Page("views/jobs.py", title="Jobs"),
    st.Page("views/plugins.py", title="Plugins"),
]
broken = []
for page in contributed_pages():
    if page.render is None:
        broken.append(page)
        continue
    pages.append(st.Page(partial(_draw, page), title=page.title, url_path=page.name))
for page in broken:
    st.sidebar.caption(f"page {literal(page.name)} could not be loaded: {literal(page.error)}")
st.navigation(pages).run()
