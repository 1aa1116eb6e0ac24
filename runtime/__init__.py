"""The shared runtime of tokenweir's processes (no service owns it; every service uses it).

Imports point one way: services (``filters``, ``ratelimit_service``, the control plane's
servers and CLI) → ``runtime`` → the policy model (``policy``). Nothing here
imports a service.

One copy of each piece of process machinery lives here: the gRPC health state, the policy
watcher, the worker supervisor, the ``/metrics`` server, the wait-for-port helper and the
HTTP/2 frame layer the built-in gRPC transports share.
"""
