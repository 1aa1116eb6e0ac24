"""Policy of a prefill/decode (PD) disaggregated pool (docs/policy.md "PD disaggregation").

``pools.NAME.disaggregation`` names the pool's prefill replicas (each with the port of its
SGLang bootstrap server, ``--disaggregation-bootstrap-port``) and its decode replicas. The decode
replicas are the pool's Envoy cluster (the client's answer streams from one of them); the filter
server's ``pd`` plugin picks a pair per request, adds SGLang's bootstrap fields to the body and
sends the prefill side itself (filters/plugins/pd).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from policy.common import Address, Port
from policy.decode import Duration

__all__ = ["DEFAULT_BOOTSTRAP_PORT", "Disaggregation", "PrefillReplica"]

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default


@dataclass(frozen=True)
class PrefillReplica:
    """One prefill server: its HTTP address and its bootstrap server's port."""

    address: Address
    bootstrap_port: Port = DEFAULT_BOOTSTRAP_PORT


@dataclass(frozen=True)
class Disaggregation:
    prefill: tuple[PrefillReplica, ...]
    decode: tuple[Address, ...]
    # how long the gateway's call to the prefill side may take (its answer comes after the KV
    # was handed over, so: queue + prefill + transfer)
    prefill_timeout: Annotated[float, Duration(0.1, 3600)] = 60.0
    # a prefill replica whose call failed is skipped for this long (unless all are)
    eject_for: Annotated[float, Duration(0, 3600)] = 5.0

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a PD pool needs at least one prefill and one decode replica")
        prefill = {r.address for r in self.prefill}
        if len(prefill) != len(self.prefill) or len(set(self.decode)) != len(self.decode):
            raise ValueError("a replica is listed twice")
        both = prefill & set(self.decode)
        if both:
            raise ValueError(f"{sorted(map(str, both))} listed as prefill and as decode")
