"""The ``usage`` plugin (filters/plugins/usage/plugin.py)."""
