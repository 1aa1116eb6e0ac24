"""Per-stream protocol state shared by State-of-the-World and Delta ADS sessions.

A session is a synchronous state machine: feed it requests (``on_request``) and new snapshots
(``on_snapshot``); each call returns the responses to send now. No I/O, no clock of its own.

Push rules (make-before-break):

* types are pushed in ``ORDER`` (CDS, EDS, LDS, RDS); a type waits while an earlier type has a
  response that Envoy has not answered yet (except EDS, which Envoy needs before it ACKs the
  CDS that added clusters), or that Envoy rejected for the current content; listeners and
  routes also wait until the endpoints of every accepted EDS cluster were accepted;
* clusters Envoy holds that the new snapshot drops are *retained* (with their endpoints) until
  Envoy has acknowledged the new listeners and routes, and only then removed;
* after a NACK the type stays on its last accepted content and the rejected content is not sent
  again; the next different content (a new snapshot, a new subscription) is tried.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from controlplane.xds.refs import CLUSTER_REF, references
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ORDER, ROUTE, WILDCARD_TYPES

__all__ = ["Desired", "Pending", "Recorder", "Session", "TypeState"]

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")


class Recorder(Protocol):
    """Where a session reports what happened (metrics); see ``controlplane.xds.metrics``."""

    def pushed(self, type_url: str, mode: str) -> None: ...

    def acked(self, type_url: str, mode: str, seconds: float) -> None: ...

    def nacked(self, type_url: str, mode: str) -> None: ...

    def stale(self, type_url: str, mode: str) -> None: ...


Desired = dict[str, str]  # resource name → content version


@dataclass
class Pending:
    """A response Envoy has not answered yet."""

    nonce: str
    version: str
    versions: Desired  # what this response carries
    messages: dict[str, Message]
    removed: tuple[str, ...]
    key: Desired  # everything Envoy should hold once it accepts (remembered on a NACK)
    sent_at: float


@dataclass
class TypeState:
    """What one stream knows about one resource type."""

    asked: bool = False  # Envoy requested this type at least once on this stream
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    held: dict[str, str] = field(default_factory=dict)  # name → version Envoy accepted
    held_messages: dict[str, Message] = field(default_factory=dict)
    pending: Pending | None = None
    last_nonce: str = ""
    rejected_key: Desired | None = None
    needs_response: bool = False
    force: set[str] = field(default_factory=set)  # names to send again even if unchanged
    accepted_version: str = ""
    last_nack: tuple[str, str, float] | None = None  # (rejected version, Envoy's error, when)
    # Bumped on every change of subscriptions, held resources or the pending response: what
    # this type should hold is recomputed only when it or a type it depends on changed.
    rev: int = 0

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names


class Session(ABC, Generic[R]):
    """Protocol state of one ADS stream (one Envoy); subclasses encode SotW or Delta."""

    mode = "base"

    def __init__(
        self, node: base_pb2.Node, group: str, *, recorder: Recorder, clock: Callable[[], float]
    ) -> None:
        self.node = node
        self.group = group
        self.recorder = recorder
        self.clock = clock
        self.target: Snapshot | None = None
        self.types: dict[str, TypeState] = {t: TypeState() for t in ORDER}
        self._nonce = 0
        self._refs_memo: dict[tuple[str, str, str], frozenset[str]] = {}
        # key → (target, revisions, value): a value of the type its key's compute returns
        self._memo: dict[str, tuple[Snapshot, tuple[int, ...], object]] = {}

    # ----------------------------------------------------------------- inputs
    def on_snapshot(self, snapshot: Snapshot) -> list[R]:
        self.target = snapshot
        return self.pump()

    @abstractmethod
    def on_request(self, request: Message) -> list[R]: ...

    # ----------------------------------------------------------------- planning
    def pump(self) -> list[R]:
        """Every response that may go out now, in make-before-break order."""
        if self.target is None:
            return []
        out: list[R] = []
        endpoints_ready: bool | None = None  # computed once per pump, for LDS and RDS
        for type_url in ORDER:
            state = self.types[type_url]
            if not state.asked:
                continue
            if not self._earlier_types_settled(type_url):
                break
            if type_url in (LISTENER, ROUTE):
                if endpoints_ready is None:
                    endpoints_ready = self._endpoints_follow_clusters()
                if not endpoints_ready:
                    break
            if state.pending is not None:
                continue
            response = self._maybe_respond(type_url, state, self._desired(type_url, state))
            if response is not None:
                out.append(response)
        return out

    @abstractmethod
    def _maybe_respond(self, type_url: str, state: TypeState, desired: Desired) -> R | None:
        """Build the response that brings Envoy to ``desired``, or None when nothing is due."""

    def _earlier_types_settled(self, type_url: str) -> bool:
        for earlier in ORDER[: ORDER.index(type_url)]:
            state = self.types[earlier]
            # Envoy holds its CDS ACK until new clusters have warmed, i.e. got their endpoints:
            # EDS must not wait for that ACK. Listeners and routes do.
            if state.pending is not None and (earlier, type_url) != (CLUSTER, ENDPOINT):
                return False
            if state.rejected_key is not None and state.rejected_key == self._desired(
                earlier, state
            ):
                return False
        return True

    def _revisions(self, *type_urls: str) -> tuple[int, ...]:
        return tuple(self.types[t].rev for t in type_urls)

    def _memoized(self, key: str, revs: tuple[int, ...], compute: Callable[[], T]) -> T:
        """``compute()``, reused while the target and the given revisions stay the same."""
        assert self.target is not None
        hit = self._memo.get(key)
        if hit is not None and hit[0] is self.target and hit[1] == revs:
            return cast(T, hit[2])
        value = compute()
        self._memo[key] = (self.target, revs, value)
        return value

    def _endpoints_follow_clusters(self) -> bool:
        return self._memoized(
            "endpoints-ready", self._revisions(CLUSTER, ENDPOINT), self._endpoints_ready
        )

    def _endpoints_ready(self) -> bool:
        assert self.target is not None
        if self.target.versions.get(ENDPOINT, {}).items() <= self.types[ENDPOINT].held.items():
            return True  # Envoy holds every target endpoint set: decided at C speed
        return self._endpoints_ready_slow()

    def _endpoints_ready_slow(self) -> bool:
        """True once every EDS cluster Envoy accepted has its target endpoints accepted too.

        Envoy subscribes to a new cluster's endpoints in a request of its own, which may come
        after the CDS ACK; routes wait for it so that no route names a cluster still warming.
        """
        assert self.target is not None
        eds = self.target.eds_assignments
        wanted = self.target.versions.get(ENDPOINT, {})
        held = self.types[ENDPOINT].held
        for cluster in self.types[CLUSTER].held:
            cla = eds.get(cluster)
            if cla is not None and cla in wanted and held.get(cla) != wanted[cla]:
                return False
        return True

    def _desired(self, type_url: str, state: TypeState) -> Desired:
        """Name → version of what Envoy should hold now for this type (see the module doc).

        The result is shared (memoized): callers must not modify it.
        """
        depends = {
            CLUSTER: (CLUSTER, LISTENER, ROUTE),
            ENDPOINT: ORDER,
        }.get(type_url, (type_url,))
        return self._memoized(
            type_url, self._revisions(*depends), lambda: self._compute_desired(type_url, state)
        )

    def _compute_desired(self, type_url: str, state: TypeState) -> Desired:
        assert self.target is not None
        versions = self.target.versions.get(type_url, {})
        if state.wildcard or versions.keys() <= state.names:
            desired = dict(versions)
        else:
            desired = {name: versions[name] for name in state.names if name in versions}
        if type_url == ENDPOINT and self.types[CLUSTER].pending is not None:
            # Until Envoy accepts the new clusters, clusters it already has keep the endpoints
            # it already has: a rejected CDS must leave the node wholly on its accepted config.
            for name in state.held_messages:
                if name in desired and name in state.held:
                    desired[name] = state.held[name]
        if type_url in (CLUSTER, ENDPOINT):
            for name in self._retained(type_url):
                if state.wants(name) and name not in desired:
                    desired[name] = state.held[name]
        return desired

    def _message(self, type_url: str, state: TypeState, name: str, version: str) -> Message:
        """The resource of ``name`` at ``version``: the target's, or one Envoy holds."""
        assert self.target is not None
        if self.target.versions.get(type_url, {}).get(name) == version:
            return self.target.of_type(type_url)[name]
        return state.held_messages[name]

    def _packed(self, type_url: str, state: TypeState, name: str, version: str) -> any_pb2.Any:
        assert self.target is not None
        if self.target.versions.get(type_url, {}).get(name) == version:
            return self.target.packed(type_url, name)
        packed = any_pb2.Any()
        packed.Pack(state.held_messages[name])
        return packed

    def _messages(self, type_url: str, state: TypeState, versions: Desired) -> dict[str, Message]:
        return {name: self._message(type_url, state, name, v) for name, v in versions.items()}

    def _retained(self, type_url: str) -> dict[str, Message]:
        """Clusters (or their endpoints) Envoy holds that the target drops but may still use.

        A dropped cluster stays while Envoy has not accepted the target's listeners and routes,
        and after that while any route configuration or listener Envoy still holds names it:
        a listener replaced by LDS drains its open connections with its old route
        configuration, and Envoy unsubscribes from that only once the draining is over.
        """
        assert self.target is not None
        clusters = self.types[CLUSTER]
        dropped = clusters.held.keys() - self.target.of_type(CLUSTER).keys()
        if not dropped:
            return {}
        if self._routes_follow_target():
            dropped &= self._clusters_in_use()
        kept = {name: clusters.held_messages[name] for name in dropped}
        if type_url == CLUSTER:
            return kept
        wanted = {_cla_name(name, message) for name, message in kept.items()}
        endpoints = self.types[ENDPOINT]
        return {
            name: message
            for name, message in endpoints.held_messages.items()
            if name in wanted
            and name in endpoints.held
            and name not in self.target.of_type(ENDPOINT)
        }

    def _clusters_in_use(self) -> set[str]:
        """Clusters named by the listeners and route configurations Envoy holds now."""
        used: set[str] = set()
        memo: dict[tuple[str, str, str], frozenset[str]] = {}
        for type_url in (LISTENER, ROUTE):
            state = self.types[type_url]
            for name, message in state.held_messages.items():
                version = state.held.get(name)
                if version is None:
                    continue
                key = (type_url, name, version)
                found = self._refs_memo.get(key)
                if found is None:
                    found = frozenset(r.name for r in references(message) if r.kind == CLUSTER_REF)
                memo[key] = found
                used |= found
        self._refs_memo = memo  # only what Envoy holds now: bounded however long the stream
        return used

    def _routes_follow_target(self) -> bool:
        """True once Envoy accepted the target's listeners and routes (or never asked for them)."""
        assert self.target is not None
        for type_url in (LISTENER, ROUTE):
            state = self.types[type_url]
            if not state.asked:
                continue
            if state.pending is not None:
                return False
            versions = self.target.versions.get(type_url, {})
            for name, version in versions.items():
                if state.wants(name) and state.held.get(name) != version:
                    return False
        return True

    # ----------------------------------------------------------------- answers
    def _next_nonce(self) -> str:
        self._nonce += 1
        return str(self._nonce)

    def _start(self, type_url: str, state: TypeState, pending: Pending) -> None:
        state.rev += 1
        state.pending = pending
        state.last_nonce = pending.nonce
        state.needs_response = False
        state.force.clear()
        self.recorder.pushed(type_url, self.mode)
        if type_url == CLUSTER:
            self._resend_endpoints_of_changed_clusters(state.held, pending.versions)

    def _accept(self, type_url: str, state: TypeState) -> None:
        pending = state.pending
        assert pending is not None
        state.rev += 1
        for name in pending.removed:
            state.held.pop(name, None)
            state.held_messages.pop(name, None)
        if state.wildcard:
            state.held.update(pending.versions)
            state.held_messages.update(pending.messages)
        else:  # skip what was unsubscribed while the response was in flight
            state.held.update((n, v) for n, v in pending.versions.items() if n in state.names)
            state.held_messages.update(
                (n, m) for n, m in pending.messages.items() if n in state.names
            )
        state.pending = None
        state.rejected_key = None
        state.accepted_version = pending.version
        self.recorder.acked(type_url, self.mode, max(0.0, self.clock() - pending.sent_at))

    def _reject(self, type_url: str, state: TypeState, message: str) -> None:
        pending = state.pending
        assert pending is not None
        state.rev += 1
        state.pending = None
        state.rejected_key = pending.key
        state.last_nack = (pending.version, message, self.clock())
        self.recorder.nacked(type_url, self.mode)
        log.warning(
            "NACK from node %r (group %r) for %s version %r: %s; it stays on version %r",
            self.node.id,
            self.group,
            type_url.rsplit(".", 1)[-1],
            pending.version,
            message,
            state.accepted_version,
        )

    def _resend_endpoints_of_changed_clusters(self, previous: Desired, sent: Desired) -> None:
        """An updated EDS cluster is rebuilt by Envoy and waits for its endpoints again.

        Envoy (Delta) does not ask for them, as it is subscribed already, and holds its CDS ACK
        until the cluster has warmed: send them right after the CDS response.
        """
        assert self.target is not None
        eds = self.target.eds_assignments
        endpoints = self.types[ENDPOINT]
        for name, version in sent.items():
            if name in previous and previous[name] != version and name in eds:
                endpoints.force.add(eds[name])

    def subscribe_names(self, type_url: str, state: TypeState, names: list[str]) -> bool:
        """SotW-style full subscription list; True when it asks for something new."""
        wildcard = (not names and type_url in WILDCARD_TYPES) or "*" in names
        new = set(names) - {"*"}
        state.rev += 1
        added = (wildcard and not state.wildcard) or bool(new - state.names)
        state.wildcard, state.names = wildcard, new
        if not wildcard:
            for name in [n for n in state.held if n not in new]:
                del state.held[name]  # Envoy drops what it no longer subscribes to
                state.held_messages.pop(name, None)
        return added


def _cla_name(cluster_name: str, message: Message) -> str:
    if isinstance(message, cluster_pb2.Cluster) and message.eds_cluster_config.service_name:
        return str(message.eds_cluster_config.service_name)
    return cluster_name
