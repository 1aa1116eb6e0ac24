"""A client's own ``x-tokenweir-degrade`` header cannot pick the fallback route: the filter
server deletes it and has Envoy pick the route again (no network)."""

from __future__ import annotations

from filters.registry import build_routes
from filters.server import FilterServicer
from policy import load_policy_text
from tests.filters.conftest import FakeClock, make_services
from tests.filters.ladder.test_plugin import POLICY
from tests.filters.test_server import BASE, drive, headers_msg


async def test_spoofed_degrade_header_is_removed_and_the_route_repicked() -> None:
    # no lane plugin and no rate limit: nothing else asks Envoy to pick the route again
    policy = load_policy_text(
        POLICY.replace("identity, lane, degrade, admission, tokens", "tokens")
    )
    services = make_services(policy, FakeClock())
    servicer = FilterServicer(
        build_routes(policy, services), clock=FakeClock(), metrics=services.metrics
    )
    out = await drive(servicer, "llm", [headers_msg({**BASE, "x-tokenweir-degrade": "fallback"})])
    common = out[0].request_headers.response
    assert "x-tokenweir-degrade" in common.header_mutation.remove_headers
    assert common.clear_route_cache
