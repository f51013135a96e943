"""Browser tests: JupyterLab in Chromium (see conftest.py)."""
