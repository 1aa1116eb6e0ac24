"""A replaced policy's large containers are freed in slices, and only when nothing else can
reach them (a request still running on the old config keeps its view of it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from runtime.dispose import Retired, dispose, exclusive_parts


@dataclass(frozen=True)
class _Policy:
    tenants: dict[str, int]
    routes: tuple[str, ...] = ("r",)


@dataclass(frozen=True)
class _Built:
    policy: _Policy
    keys: dict[str, str]
    extra: list[object] = field(default_factory=list)


def _value(n: int = 1000) -> tuple[Retired, _Policy]:
    policy = _Policy({f"t{i}": i for i in range(n)})
    keys = {f"k{i}": f"t{i}" for i in range(n)}
    built = _Built(policy, keys, extra=[policy])  # the value refers to its policy twice
    return Retired(built, [policy.tenants, keys]), policy


def test_containers_only_the_value_reaches_are_found() -> None:
    holder, policy = _value()
    del policy
    parts = exclusive_parts(holder)
    assert sorted(len(p) for p in parts) == [1000, 1000]


def test_a_container_reachable_from_outside_is_left_alone() -> None:
    holder, in_flight = _value()  # a request still using the old config holds its policy
    parts = exclusive_parts(holder)
    assert [len(p) for p in parts] == [1000]  # the keys; not the tenants the request can reach
    assert isinstance(holder.value, _Built)
    assert parts[0] is holder.value.keys
    assert in_flight.tenants is holder.value.policy.tenants


def test_an_outside_reference_to_the_whole_value_protects_everything() -> None:
    holder, policy = _value()
    del policy
    in_flight = holder.value
    assert exclusive_parts(holder) == []
    del in_flight


async def test_dispose_empties_what_is_unreachable_and_waits_for_the_rest() -> None:
    holder, policy = _value()
    assert isinstance(holder.value, _Built)
    tenants, keys = policy.tenants, holder.value.keys
    # the test holds the containers too: let dispose see only ``policy`` as outside
    del tenants, keys
    task = asyncio.create_task(dispose(holder, retry=0.01, patience=60))
    await asyncio.sleep(0.2)
    assert len(policy.tenants) == 1000  # still in use: untouched
    assert not holder.cleared and len(holder.parts) == 1  # the keys were taken apart already
    del policy  # the request finished
    await asyncio.wait_for(task, 5)
    assert holder.cleared


async def test_dispose_gives_up_after_its_patience_and_drops_the_value() -> None:
    holder, policy = _value()
    await asyncio.wait_for(dispose(holder, retry=0.01, patience=0.05), 5)
    assert holder.cleared and len(policy.tenants) == 1000


@dataclass(frozen=True)
class _Route:
    name: str
    plugins: tuple[str, ...] = ("identity",)


async def test_the_walk_over_a_large_skeleton_lets_requests_run_between_slices() -> None:
    """A value with many small objects (routes) is walked a slice at a time: the loop turns
    before anything is taken apart (walked in one go, 10k tenants and 100 routes held the loop
    7-14 ms)."""
    policy = _Policy({f"t{i}": i for i in range(1000)}, routes=tuple(f"r{i}" for i in range(50)))
    routes = [_Route(f"r{i}", (f"p{i}",)) for i in range(2000)]
    keys = {f"k{i}": f"t{i}" for i in range(1000)}
    holder = Retired(_Built(policy, keys, extra=[tuple(routes)]), [policy.tenants, keys])
    del policy, routes, keys  # only the holder refers to the value
    task = asyncio.create_task(dispose(holder, retry=0.01, patience=60))
    await asyncio.sleep(0)  # the first turn the dispose task gives back
    assert sorted(len(p) for p in holder.parts) == [
        1000,
        1000,
    ]  # still walking: nothing taken apart
    await asyncio.wait_for(task, 5)
    assert holder.cleared
