"""The shared runtime of tokenweir's processes (no service owns it; every service uses it).

Infrastructure only: nothing here imports a package of ours (not even the policy model; what
it needs of a policy section or error it names by shape, as a protocol). The shared domain
lives beside it in ``quota``, ``prefixindex``, ``poolstate`` and ``chat``
(docs/architecture.md, "The layers").

One copy of each piece of process machinery lives here: the gRPC health state, the policy
watcher, the worker supervisor, the ``/metrics`` server, the wait-for-port helper and the
HTTP/2 frame layer the built-in gRPC transports share.
"""
