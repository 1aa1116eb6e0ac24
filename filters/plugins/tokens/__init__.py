"""The ``tokens`` plugin (filters/plugins/tokens/plugin.py)."""
