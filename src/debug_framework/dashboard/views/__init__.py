"""The dashboard's pages: one Streamlit script each, run by ``st.navigation`` from :mod:`..app`.

Not named ``pages/``: Streamlit treats a ``pages`` folder beside the entry script as an old-style
multipage app and serves a fresh server's first request from it, so a direct first visit to a
contributed page (``/runs``) showed "Page not found"."""
