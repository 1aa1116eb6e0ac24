"""The roof: the ``tokenweir`` CLI, ``tokenweir up`` and the processes only they start.

It imports every layer below it; nothing imports it (docs/architecture.md, "Layers").
"""
