"""Delta (incremental) ADS: responses carry only changed resources and removed names."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from controlplane.xds.session import Desired, Pending, Session, TypeState
from controlplane.xds.types import WILDCARD_TYPES

__all__ = ["DeltaSession"]


class DeltaSession(Session[discovery_pb2.DeltaDiscoveryResponse]):
    """One Delta ADS stream (``DeltaAggregatedResources``)."""

    mode = "delta"

    def on_request(
        self, request: discovery_pb2.DeltaDiscoveryRequest
    ) -> list[discovery_pb2.DeltaDiscoveryResponse]:  # type: ignore[override]  # narrows the request to the one message type this stream carries
        type_url = request.type_url
        state = self.types.get(type_url)
        if state is None:
            return []
        self._update_subscriptions(type_url, state, request)
        nonce = request.response_nonce
        if nonce:
            if nonce != state.last_nonce:
                self.recorder.stale(type_url, self.mode)
            elif state.pending is not None and state.pending.nonce == nonce:
                if request.HasField("error_detail"):
                    self._reject(type_url, state, request.error_detail.message)
                else:
                    self._accept(type_url, state)
        return self.pump()

    def _update_subscriptions(
        self, type_url: str, state: TypeState, request: discovery_pb2.DeltaDiscoveryRequest
    ) -> None:
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        state.rev += 1
        if not state.asked:
            state.asked = True
            state.needs_response = True  # Envoy waits for a first answer, even an empty one
            state.wildcard = not subscribe and type_url in WILDCARD_TYPES
            state.held.update(request.initial_resource_versions)
        if "*" in subscribe:
            state.wildcard = True
        if "*" in unsubscribe:
            state.wildcard = False
        for name in subscribe - {"*"}:
            state.names.add(name)
            if name not in request.initial_resource_versions:
                # A (re)subscription asks for the resource itself, even one sent before.
                state.held.pop(name, None)
                state.held_messages.pop(name, None)
        for name in unsubscribe - {"*"}:
            state.names.discard(name)
            state.held.pop(name, None)
            state.held_messages.pop(name, None)

    def _maybe_respond(
        self, type_url: str, state: TypeState, desired: Desired
    ) -> discovery_pb2.DeltaDiscoveryResponse | None:
        held, force = state.held, state.force
        in_sync = desired == held if state.wildcard else desired.items() <= held.items()
        if in_sync and not force and not state.needs_response:
            return None  # the common case, decided at C speed
        changed = dict(desired.items() - held.items())
        changed.update((name, desired[name]) for name in force if name in desired)
        # Named subscriptions (EDS, RDS) end with Envoy's unsubscribe once the cluster or
        # listener that used them is gone; only wildcard types get explicit removals.
        removed = (
            tuple(sorted(name for name in held if name not in desired)) if state.wildcard else ()
        )
        if not changed and not removed and not state.needs_response:
            force.clear()
            return None
        if desired == state.rejected_key:
            return None
        assert self.target is not None
        nonce = self._next_nonce()
        messages = self._messages(type_url, state, changed)
        pending = Pending(
            nonce, self.target.version, changed, messages, removed, desired, self.clock()
        )
        self._start(type_url, state, pending)
        return discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=self.target.version,
            type_url=type_url,
            nonce=nonce,
            resources=[
                discovery_pb2.Resource(
                    name=name,
                    version=changed[name],
                    resource=self._packed(type_url, state, name, changed[name]),
                )
                for name in sorted(changed)
            ],
            removed_resources=list(removed),
        )
