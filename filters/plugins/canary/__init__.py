"""The ``canary`` plugin (filters/plugins/canary/plugin.py)."""
