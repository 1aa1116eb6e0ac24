"""lane: interactive or batch, from the route (forced), a client hint the tier allows, the API
key's lane (Redis), or the tier's default. Sets ``x-tokenweir-lane``, which the routes map to circuit-breaker priority.

Settings: ``hint_header`` (default ``x-lane``), ``on_forbidden`` (``ignore`` (default): a hint
the tier does not allow falls back to the default; ``reject``: 403).
"""

from __future__ import annotations

from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result
from filters.errors import ClientError, ConfigError
from filters.services import Services
from wire.contract import LANE_HEADER

__all__ = ["LanePlugin"]

_LANES = ("interactive", "batch")


class LanePlugin(BasePlugin):
    name = "lane"
    bounded = True

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {"hint_header", "on_forbidden"}
        if unknown:
            raise ConfigError(f"lane: unknown setting(s) {sorted(unknown)}")
        self.hint_header = str(settings.get("hint_header", "x-lane")).lower()
        self.on_forbidden = settings.get("on_forbidden", "ignore")
        if self.on_forbidden not in ("ignore", "reject"):
            raise ConfigError("lane: on_forbidden must be 'ignore' or 'reject'")
        self.services = services

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        tier = self.services.policy.tiers.get(ctx.tier) if ctx.tier else None
        default = tier.lane if tier is not None else "interactive"
        allowed = tier.allowed_lanes if tier is not None else _LANES
        lane: str = ctx.lane if ctx.lane is not None and ctx.lane in allowed else default
        if ctx.route.lane is not None:
            lane = ctx.route.lane
        else:
            hint = headers.get(self.hint_header, "").strip().lower()
            if hint:
                if hint in allowed:
                    lane = hint
                elif self.on_forbidden == "reject":
                    raise ClientError(
                        403,
                        f"lane {hint!r} is not allowed for your tier; allowed: {list(allowed)}",
                        reason="lane_forbidden",
                        param=self.hint_header,
                        error_type="permission_error",
                    )
        ctx.lane = lane
        return Result(set_headers={LANE_HEADER: lane}, clear_route_cache=True)
