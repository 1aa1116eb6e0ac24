"""The identity plugin's ``client_certificate``: the tenant of an mTLS client certificate, read
from the ``x-forwarded-client-cert`` Envoy sets (tests/integration/test_gateway_tls.py shows a
client cannot send its own)."""

from __future__ import annotations

import pytest

from filters.errors import ClientError, ConfigError
from filters.plugins.identity.plugin import IdentityPlugin
from filters.services import Services
from filters.xfcc import certificate_identity, parse_xfcc
from tests.filters.conftest import make_ctx

XFCC = (
    'Hash=ab12;Subject="CN=demo-pro,O=Example, Inc.";URI=spiffe://t/demo-free;'
    "DNS=demo-free.clients;DNS=other"
)


def test_parse_xfcc_keeps_quoted_commas() -> None:
    pairs = parse_xfcc(XFCC + ',Hash=cd;Subject="CN=proxy"')
    assert ("subject", "CN=demo-pro,O=Example, Inc.") in pairs and ("hash", "cd") not in pairs
    headers = {"x-forwarded-client-cert": XFCC}
    assert certificate_identity(headers, "cn") == "demo-pro"
    assert certificate_identity(headers, "uri") == "spiffe://t/demo-free"
    assert certificate_identity(headers, "dns") == "demo-free.clients"
    assert certificate_identity({}, "cn") is None


async def test_the_certificate_names_the_tenant_without_a_key(services: Services) -> None:
    ctx = make_ctx()
    plugin = IdentityPlugin({"client_certificate": "cn"}, services)
    r = await plugin.request_headers(ctx, {"x-forwarded-client-cert": XFCC}, False)
    assert r is not None and (ctx.tenant, ctx.tier) == ("demo-pro", "pro")
    assert r.set_headers["x-tokenweir-tenant"] == "demo-pro"
    # without a certificate, the API key still works; with neither, 401
    ctx = make_ctx()
    await plugin.request_headers(ctx, {"authorization": "Bearer tw-demo-free-key"}, False)
    assert ctx.tenant == "demo-free"
    with pytest.raises(ClientError) as info:
        await plugin.request_headers(make_ctx(), {}, False)
    assert info.value.status == 401


async def test_a_certificate_of_no_tenant_is_forbidden(services: Services) -> None:
    plugin = IdentityPlugin({"client_certificate": "dns"}, services)
    with pytest.raises(ClientError) as info:
        await plugin.request_headers(make_ctx(), {"x-forwarded-client-cert": XFCC}, False)
    assert info.value.status == 403 and "demo-free.clients" in str(info.value)


async def test_without_the_setting_the_header_is_ignored(services: Services) -> None:
    with pytest.raises(ClientError) as info:
        await IdentityPlugin({}, services).request_headers(
            make_ctx(), {"x-forwarded-client-cert": XFCC}, False
        )
    assert info.value.status == 401
    with pytest.raises(ConfigError, match="cn, uri or dns"):
        IdentityPlugin({"client_certificate": "subject"}, services)
