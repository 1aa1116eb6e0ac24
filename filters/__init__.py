"""tokenweir filter server: an ext_proc plugin chain that makes Envoy LLM-aware.

Modules, from the outside in: ``__main__`` (entry point, worker processes) → ``app`` (policy,
reload, /metrics, Redis) → ``server`` (the gRPC servicer) → ``protocol`` (ext_proc messages) →
``chain`` (runs a route's plugins, isolates failures) → ``api`` (what plugins implement and
return). Plugins: ``plugins/`` (identity, tokens, prefix, lane, usage), found by ``registry``.
Helpers: ``bodies`` (request parsers), ``sse`` (usage in responses), ``estimate`` (token counts),
``keys`` (API keys), ``budget`` (remaining tokens), ``metrics``, ``phases`` (which ext_proc
phases a route needs, shared with the control plane). See docs/plugins.md.
"""
