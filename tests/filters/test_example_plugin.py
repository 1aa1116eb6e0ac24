from __future__ import annotations

import json

import pytest

from filters.chain import Chain
from filters.errors import ConfigError
from filters.registry import load_factory
from filters.services import Services
from tests.filters.conftest import make_ctx


def body(text: str) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()


async def test_example_plugin_loads_by_import_path_and_redacts(services: Services) -> None:
    factory = load_factory("examples.plugins.redact:RedactPlugin")
    plugin = factory({"block_words": ["password"]}, services)
    chain = Chain("r", [plugin])
    out = await chain.request_body(make_ctx(), body("mail ann@example.org or bob@x.io"))
    assert out.body is not None
    sent = json.loads(out.body)["messages"][0]["content"]
    assert sent == "mail [email] or [email]"
    assert out.set_headers["content-length"] == str(len(out.body))
    out = await chain.request_body(make_ctx(), body("my PASSWORD is hunter2"))
    assert out.reply is not None and out.reply.status == 400
    assert await chain.request_body(make_ctx(), body("nothing here")) == chain_empty()


def chain_empty():  # type: ignore[no-untyped-def]
    from filters.chain import Outcome

    return Outcome()


def test_bad_plugin_references() -> None:
    with pytest.raises(ConfigError):
        load_factory("no_such_module_xyz:Plugin")
    with pytest.raises(ConfigError):
        load_factory("examples.plugins.redact:Nope")
    with pytest.raises(ConfigError):
        load_factory("nodots")
