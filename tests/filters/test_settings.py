"""A plugin's settings read with their types: a wrong one is a ConfigError naming the plugin,
the key, what is allowed and what was given (filters/settings.py)."""

from __future__ import annotations

import re

import pytest

from filters.errors import ConfigError
from filters.plugins.identity.plugin import IdentityPlugin
from filters.plugins.tokens.plugin import TokensPlugin
from filters.services import Services


def test_tokens_settings_are_read_with_their_types(services: Services) -> None:
    p = TokensPlugin(
        {"extra_fields": ["x"], "default_max_tokens": "64", "max_body_bytes": 10,
         "budget_timeout": 1},
        services,
    )  # fmt: skip
    assert (p.extra_fields, p.default_max_tokens, p.max_body_bytes, p.budget_timeout) == (
        frozenset({"x"}), 64, 10, 1.0,
    )  # fmt: skip
    bad = {
        "extra_fields": ("abc", "extra_fields must be a list of strings, got 'abc'"),
        "default_max_tokens": ("many", "default_max_tokens must be an integer, got 'many'"),
        "max_body_bytes": ([1], "max_body_bytes must be an integer, got [1]"),
        "budget_timeout": (True, "budget_timeout must be a number, got True"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=f"^tokens: {re.escape(message)}$"):
            TokensPlugin({key: value}, services)


def test_identity_refuses_a_tier_or_a_certificate_source_of_the_wrong_kind(
    services: Services,
) -> None:
    with pytest.raises(ConfigError, match="identity: anonymous_tier must be a string, got 3"):
        IdentityPlugin({"anonymous_tier": 3}, services)
    with pytest.raises(
        ConfigError, match=r"client_certificate: expected cn, uri or dns, got \['cn'\]"
    ):
        IdentityPlugin({"client_certificate": ["cn"]}, services)
    assert IdentityPlugin({"client_certificate": False}, services).certificate is None
    assert IdentityPlugin({"client_certificate": "uri"}, services).certificate == "uri"
