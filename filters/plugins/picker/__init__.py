"""The endpoint picker: cache-aware routing through Envoy's override-host load balancer.

Pure parts: :mod:`.prompt` (render and fingerprint a prompt), :mod:`.mapper` (fingerprint →
backend block hash), :mod:`.score` (the decision). Run time: :mod:`.pool` (one pool's index,
subscriber, map and load), :mod:`.registry` (all pools, across reloads), :mod:`.plugin` (the
``picker`` plugin). docs/plugins.md, docs/policy.md "Routing", docs/operations.md "Prefix index".
"""

__all__: list[str] = []
