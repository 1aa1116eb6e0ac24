"""The wire contract between Envoy, the filter server and the rate-limit service.

Ground layer: imports nothing of ours (docs/architecture.md, "Layers").
"""
