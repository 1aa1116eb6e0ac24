"""Priority admission at the gateway: bounded lane queues, weighted fairness between tenants,
shedding with a measured Retry-After, client deadlines (docs/operations.md, "Admission").

``core`` and ``queues`` are pure (clock passed in); ``gate`` waits; ``plugin`` is the
``admission`` built-in; ``signal`` reads the control plane's pool state.
"""

__all__: list[str] = []
