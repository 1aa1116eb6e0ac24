"""Rate-limit services side by side share the local fallback bucket (used while Redis is down)."""

from __future__ import annotations

from policy.servers import RateLimitServer
from ratelimit_service.server import decider_settings


def test_the_local_fallback_bucket_is_split_over_services_and_processes() -> None:
    assert decider_settings(RateLimitServer(replicas=2), instances=3).replicas == 6
    assert decider_settings(RateLimitServer()).replicas == 1
