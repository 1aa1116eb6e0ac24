"""State-of-the-World ADS: every response carries the full set of a type's resources."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from controlplane.xds.session import Desired, Pending, Session, TypeState

__all__ = ["SotwSession"]


class SotwSession(Session[discovery_pb2.DiscoveryResponse]):
    """One SotW ADS stream (``StreamAggregatedResources``)."""

    mode = "sotw"

    def on_request(
        self, request: discovery_pb2.DiscoveryRequest
    ) -> list[discovery_pb2.DiscoveryResponse]:  # type: ignore[override]  # narrows the request to the one message type this stream carries
        state = self.types.get(request.type_url)
        if state is None:
            return []  # a type we do not serve: Envoy waits for its initial-fetch timeout
        names = list(request.resource_names)
        nonce = request.response_nonce
        if not nonce:
            # First request for this type on this stream; Envoy's version_info may come from a
            # previous control plane whose versions mean nothing here, so always answer.
            state.asked = True
            self.subscribe_names(request.type_url, state, names)
            state.needs_response = True
            return self.pump()
        if nonce != state.last_nonce:
            self.recorder.stale(request.type_url, self.mode)
            return []
        answering = state.pending is not None and state.pending.nonce == nonce
        if answering:
            if request.HasField("error_detail"):
                self._reject(request.type_url, state, request.error_detail.message)
            else:
                self._accept(request.type_url, state)
        before = (state.wildcard, set(state.names))
        if self.subscribe_names(request.type_url, state, names) and (state.wildcard or state.names):
            state.needs_response = True  # Envoy asks for names it did not have
        elif (
            not answering
            and before == (state.wildcard, state.names)
            and not request.HasField("error_detail")
        ):
            # The same request again after its answer was acknowledged: Envoy rebuilt a
            # cluster and wants its endpoints again. Answer (unless that content was rejected).
            state.needs_response = True
        return self.pump()

    def _maybe_respond(
        self, type_url: str, state: TypeState, desired: Desired
    ) -> discovery_pb2.DiscoveryResponse | None:
        if desired == state.rejected_key:
            return None
        if state.wildcard:
            unchanged = state.held == desired
        else:  # a name dropped from EDS/RDS needs no response: Envoy forgets it on its own
            unchanged = desired.items() <= state.held.items()
        if unchanged and not state.needs_response and not (state.force & desired.keys()):
            state.force.clear()
            return None
        assert self.target is not None
        version = self.target.version
        of_type = self.target.of_type(type_url)
        if any(name not in of_type for name in desired):
            version += "+retained"
        nonce = self._next_nonce()
        # Only wildcard types (CDS, LDS) delete what a response omits; EDS and RDS keep
        # resources Envoy still subscribes to (e.g. the route of a draining listener).
        removed = (
            tuple(name for name in state.held if name not in desired) if state.wildcard else ()
        )
        messages = self._messages(type_url, state, desired)
        pending = Pending(nonce, version, desired, messages, removed, desired, self.clock())
        self._start(type_url, state, pending)
        return discovery_pb2.DiscoveryResponse(
            version_info=version,
            type_url=type_url,
            nonce=nonce,
            resources=[
                self._packed(type_url, state, name, desired[name]) for name in sorted(desired)
            ],
        )
