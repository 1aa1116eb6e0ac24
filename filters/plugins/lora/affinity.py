"""Adapter affinity: which replica of a LoRA pool a request for an adapter goes to.

A replica holds ``slots`` adapters in GPU memory (SGLang's ``--max-loras-per-batch``); a request
for one it does not hold makes it load the adapter (and evict its least recently used one), and
a batch never mixes more than ``slots`` adapters, so requests for others wait. So:

* the picker keeps a model of each replica's slots: the adapters it sent there, least recently
  used first, at most ``slots`` (what SGLang's LRU memory pool holds when this gateway is its
  only client);
* a request for an adapter goes to a replica that holds it, the least loaded one (requests in
  flight from this filter process), while that one stays within ``spread_factor`` percent of
  the pool's mean load, or within ``MIN_SLACK`` requests of it (a replica batches many
  requests: a few more in flight cost little, a slot load and the eviction it causes cost more);
* when none holds it, or every holder is past the bound (a hot adapter one replica cannot
  carry), it goes where loading it costs least: a replica with a free slot, else one whose
  least recently used adapter has nothing in flight there and was used longest ago (the
  coldest adapter in the pool leaves), the least loaded first; ties by a rendezvous hash of
  the adapter (the same adapter lands on the same replica).

The model is corrected by what the replicas report (``observe``: the adapters in their slots,
least recent first, and those registered, from SGLang's ``/get_server_info``), so the slots of
another filter process's requests are seen too; a replica known not to have the adapter
registered is chosen last when it must spread, and the plugin asks it to load the adapter first
(``/load_lora_adapter``). ``preload``: while the adapter's only holders run at ``preload_at``
percent of the bound, the replica it would spread to next, where it is not registered, is loaded
ahead of demand.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from filters.rendezvous import rendezvous

__all__ = ["MIN_SLACK", "AdapterAffinity"]

MIN_SLACK = 4  # requests in flight a holder may run above the mean before its adapter spreads


class AdapterAffinity:
    """The slots model and in-flight counts of one pool's replicas."""

    def __init__(self, slots: int, spread_factor: int = 150) -> None:
        self.slots = slots
        self.spread = spread_factor / 100.0
        self._held: dict[str, OrderedDict[str, int]] = {}  # adapter -> tick of its last use
        self._tick = 0
        self._inflight: dict[str, int] = {}
        self._using: dict[tuple[str, str], int] = {}  # (replica, adapter) -> in flight
        self.loads = 0  # adapters this model expects replicas to load (a pick off its holders)
        self._registered: dict[str, frozenset[str]] = {}  # as the replica last reported

    def holders(self, adapter: str) -> list[str]:
        return [r for r, held in self._held.items() if adapter in held]

    def pick(self, adapter: str, replicas: Sequence[str]) -> str | None:
        """The replica for one request for ``adapter`` (counted in flight until ``done``)."""
        if not replicas:
            return None
        key = adapter.encode()
        load = self._inflight
        mean = (sum(load.get(r, 0) for r in replicas) + 1) / len(replicas)
        bound = max(self.spread * mean, mean + MIN_SLACK)
        holding = [r for r in replicas if adapter in self._held.get(r, ())]
        within = [r for r in holding if load.get(r, 0) + 1 <= bound]
        if within:
            choice = min(within, key=lambda r: (load.get(r, 0), -rendezvous(key, r)))
        else:
            # spread: a replica that does not hold it yet (all hold it: the least loaded)
            choice = self._spread_to(adapter, replicas, holding)
        self._use(choice, adapter)
        return choice

    def _spread_to(self, adapter: str, replicas: Sequence[str], holding: Sequence[str]) -> str:
        """Where the adapter goes next: a replica that does not hold it yet (all hold it: the
        least loaded), registered there first, then the cheapest slot to take, the least loaded."""
        key, load = adapter.encode(), self._inflight
        others = [r for r in replicas if r not in holding] or list(replicas)
        return min(
            others,
            key=lambda r: (
                self.registered(r, adapter) is False,
                self._eviction_cost(r),
                load.get(r, 0),
                -rendezvous(key, r),
            ),
        )

    def preload(self, adapter: str, replicas: Sequence[str], share: float) -> str | None:
        """The replica to load ``adapter`` on ahead of demand: every holder is busy past
        ``share`` of the spread bound, and the replica it would spread to is known not to
        have it registered (None: no need)."""
        if share <= 0 or len(replicas) < 2:
            return None
        holding = [r for r in replicas if adapter in self._held.get(r, ())]
        if not holding:
            return None
        load = self._inflight
        mean = (sum(load.get(r, 0) for r in replicas) + 1) / len(replicas)
        bound = max(self.spread * mean, mean + MIN_SLACK)
        if any(load.get(r, 0) + 1 < share * bound for r in holding):
            return None
        target = self._spread_to(adapter, replicas, holding)
        return target if self.registered(target, adapter) is False else None

    def registered(self, replica: str, adapter: str) -> bool | None:
        """Whether ``replica`` reported ``adapter`` registered (None: it never reported)."""
        known = self._registered.get(replica)
        return None if known is None else adapter in known

    def observe(
        self, replica: str, resident: Sequence[str] | None, registered: Sequence[str]
    ) -> None:
        """What ``replica`` reports: the adapters in its slots (least recent first; None: not
        reported, the model's guess stays) and those registered. Its slots model becomes that
        list, keeping the order of use this process knows for adapters it sent there since."""
        self._registered[replica] = frozenset(registered)
        if resident is None:
            return
        old = self._held.get(replica, OrderedDict())
        held: OrderedDict[str, int] = OrderedDict()
        base = min(old.values(), default=self._tick) - len(resident)
        for i, name in enumerate(resident[-self.slots :]):
            held[name] = base + i
        for name, tick in old.items():
            # sent there and running or queued: in a slot soon, if not reported yet
            if (name in held and tick > held[name]) or self._using.get((replica, name)):
                held[name] = tick
        ordered = sorted(held.items(), key=lambda kv: kv[1])[-self.slots :]
        self._held[replica] = OrderedDict(ordered)

    def registered_now(self, replica: str, adapter: str) -> None:
        """``replica`` answered a load of ``adapter``: it is registered there."""
        self._registered[replica] = self._registered.get(replica, frozenset()) | {adapter}

    def _eviction_cost(self, replica: str) -> tuple[int, int]:
        """(0, 0): a free slot; (1, tick): its least recently used adapter is idle there and
        was last used at ``tick``; (2, tick): that adapter has requests in flight there."""
        held = self._held.get(replica)
        if held is None or len(held) < self.slots:
            return (0, 0)
        victim, tick = next(iter(held.items()))
        return (1 if not self._using.get((replica, victim)) else 2, tick)

    def _use(self, replica: str, adapter: str) -> None:
        held = self._held.setdefault(replica, OrderedDict())
        self._tick += 1
        if adapter in held:
            held.move_to_end(adapter)
        else:
            self.loads += 1
            if len(held) >= self.slots:
                held.popitem(last=False)
        held[adapter] = self._tick
        self._inflight[replica] = self._inflight.get(replica, 0) + 1
        k = (replica, adapter)
        self._using[k] = self._using.get(k, 0) + 1

    def moved(self, adapter: str, old: str, new: str) -> None:
        """A request ``pick`` placed on ``old`` went to ``new`` instead (the prefix picker found
        the adapter's prefix cached there): ``new`` holds the adapter now."""
        if old == new:
            return
        self.done(old, adapter)
        self._use(new, adapter)

    def done(self, replica: str, adapter: str) -> None:
        """The request's answer ended."""
        self._inflight[replica] = max(self._inflight.get(replica, 0) - 1, 0)
        k = (replica, adapter)
        left = self._using.get(k, 0) - 1
        if left > 0:
            self._using[k] = left
        else:
            self._using.pop(k, None)
