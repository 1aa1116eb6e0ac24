"""The ``identity`` plugin (filters/plugins/identity/plugin.py)."""
