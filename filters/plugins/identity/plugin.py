"""identity: ``Authorization: Bearer KEY`` → tenant, tier (and a default lane, when the key's
Redis entry names one); strips client ``x-tokenweir-*``.

When Redis fails and nothing else knows a key (see :mod:`filters.keys`), the answer is 503 with
``retry-after: 1``, never 401.

Settings: ``require`` (default true: a missing or unknown key gets 401), ``anonymous_tenant``
and ``anonymous_tier`` (used when ``require`` is false), ``forward_authorization`` (default
false: the client's key is not sent to the backend), ``client_certificate`` (``cn``, ``uri``
or ``dns``; default off): a client certificate verified by the gateway (mTLS) names the tenant
by its subject CN, first URI SAN or first DNS SAN (:mod:`filters.xfcc`); it must be a tenant of
the policy (403 otherwise), and no API key is needed then.
"""

from __future__ import annotations

from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result
from filters.errors import ClientError, ConfigError, KeyServiceUnavailable
from filters.services import Services
from filters.settings import optional_str_setting
from filters.xfcc import Source, certificate_identity
from wire.contract import HEADER_PREFIX, TENANT_HEADER, TIER_HEADER

__all__ = ["INTERNAL_PREFIX", "IdentityPlugin", "bearer_key"]

INTERNAL_PREFIX = HEADER_PREFIX


def bearer_key(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    key = key.strip()
    return key or None


def _unauthorized(message: str) -> ClientError:
    return ClientError(
        401,
        message,
        reason="unauthorized",
        code="invalid_api_key",
        headers=(("www-authenticate", 'Bearer realm="tokenweir"'),),
    )


_SOURCES: dict[str, Source] = {"cn": "cn", "uri": "uri", "dns": "dns"}


class IdentityPlugin(BasePlugin):
    name = "identity"
    bounded = True  # Redis reads have their own timeouts

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {
            "require",
            "anonymous_tenant",
            "anonymous_tier",
            "forward_authorization",
            "client_certificate",
        }
        if unknown:
            raise ConfigError(f"identity: unknown setting(s) {sorted(unknown)}")
        self.require = bool(settings.get("require", True))
        self.anonymous_tenant = str(settings.get("anonymous_tenant", "anonymous"))
        self.anonymous_tier = optional_str_setting(settings, "identity", "anonymous_tier")
        self.forward_authorization = bool(settings.get("forward_authorization", False))
        self.services = services
        source = settings.get("client_certificate")
        self.certificate: Source | None = _SOURCES.get(source) if isinstance(source, str) else None
        if self.certificate is None and source is not None and source is not False:
            raise ConfigError(
                f"identity: client_certificate: expected cn, uri or dns, got {source!r}"
            )

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        remove = [h for h in headers if h.startswith(INTERNAL_PREFIX)]
        if self.certificate is not None:
            named = certificate_identity(headers, self.certificate)
            if named is not None:
                return self._certified(ctx, headers, named, remove)
        key = bearer_key(headers)
        try:
            info = await self.services.keys.lookup(key) if key else None
        except KeyServiceUnavailable as exc:  # not the client's fault: never a 401
            raise ClientError(
                503,
                f"{exc}. Your API key was not checked; retry shortly.",
                reason="key_store_unavailable",
                error_type="service_unavailable",
                code="key_store_unavailable",
                headers=(("retry-after", "1"),),
            ) from exc
        if info is None:
            if self.require:
                if key is None:
                    raise _unauthorized(
                        "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'."
                    )
                raise _unauthorized(f"Incorrect API key provided: {_masked(key)}.")
            tenant, tier = self.anonymous_tenant, self.anonymous_tier
        else:
            tenant, tier = info.tenant, info.tier
            ctx.lane = info.lane  # a default for the lane plugin
        if tier is None:
            t = self.services.policy.tenants.get(tenant)
            tier = t.tier if t is not None else None
        ctx.tenant, ctx.tier = tenant, tier
        if not self.forward_authorization and "authorization" in headers:
            remove.append("authorization")
        set_headers = {TENANT_HEADER: tenant}
        if tier is not None:
            set_headers[TIER_HEADER] = tier
        return Result(set_headers=set_headers, remove_headers=tuple(remove))

    def _certified(
        self, ctx: Context, headers: Mapping[str, str], tenant: str, remove: list[str]
    ) -> Result:
        t = self.services.policy.tenants.get(tenant)
        if t is None:
            raise ClientError(
                403,
                f"the client certificate names {tenant!r}, which is not a tenant here",
                reason="unknown_certificate_tenant",
                error_type="permission_error",
                code="unknown_tenant",
            )
        ctx.tenant, ctx.tier = tenant, t.tier
        if not self.forward_authorization and "authorization" in headers:
            remove.append("authorization")
        set_headers = {TENANT_HEADER: tenant}
        if t.tier is not None:
            set_headers[TIER_HEADER] = t.tier
        return Result(set_headers=set_headers, remove_headers=tuple(remove))


def _masked(key: str) -> str:
    return key[:3] + "*" * max(0, min(len(key) - 7, 20)) + key[-4:] if len(key) > 8 else "****"
