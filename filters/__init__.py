"""tokenweir filter server: an ext_proc plugin chain that makes Envoy LLM-aware."""
