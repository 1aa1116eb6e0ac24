"""The ``prefix`` plugin (filters/plugins/prefix/plugin.py)."""
