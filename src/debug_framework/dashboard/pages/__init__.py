"""The dashboard's pages: one Streamlit script each, run by ``st.navigation`` from :mod:`..app`."""
