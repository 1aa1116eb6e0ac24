"""The typed request context: the plan starts from the route, slots keep each plugin's state
apart, and ``ctx.reserve`` is the plan's reservation (the name plugins used before the plan)."""

from __future__ import annotations

from filters.api import Context, Plan, RouteInfo, Slot


def _ctx(pool: str | None = "chat") -> Context:
    return Context(route=RouteInfo(name="r", pool=pool), started=0.0)


def test_the_plan_starts_with_the_routes_pool() -> None:
    assert _ctx().plan.pool == "chat"
    assert _ctx(None).plan.pool is None
    ctx = Context(route=RouteInfo(name="r", pool="chat"), started=0.0, plan=Plan(pool="small"))
    assert ctx.plan.pool == "small"  # a plan given keeps its pool


def test_reserve_is_the_plans_reservation() -> None:
    ctx = _ctx()
    assert ctx.reserve is None
    ctx.reserve = 120
    assert ctx.plan.reserve == 120
    ctx.plan.reserve = 7
    assert ctx.reserve == 7


def test_slots_are_keys_by_identity() -> None:
    ctx = _ctx()
    a: Slot[int] = Slot("same")
    b: Slot[int] = Slot("same")
    ctx.put(a, 1)
    assert ctx.get(a) == 1 and ctx.get(b) is None  # one name, two plugins: never shared
    ctx.put(b, 2)
    assert ctx.take(a) == 1 and ctx.get(a) is None and ctx.take(b) == 2
    assert ctx.take(a) is None


def test_each_request_has_its_own_plan_and_state() -> None:
    one, two = _ctx(), _ctx()
    s: Slot[str] = Slot("s")
    one.put(s, "x")
    one.plan.max_tokens_cap = 5
    assert two.get(s) is None and two.plan.max_tokens_cap is None
