"""The ``lane`` plugin (filters/plugins/lane/plugin.py)."""
