"""The ext_proc answers the filter server builds: dynamic metadata of every value type."""

from __future__ import annotations

from google.protobuf import json_format

from filters.chain import Outcome
from filters.protocol import METADATA_NAMESPACE, body_response, headers_response


def test_metadata_of_every_type_reaches_the_namespace() -> None:
    md = {"tenant": "t-1", "settle": 0, "reserve": 1234, "prompt": 812.5, "meter": True,
          "off": False, "spans": ["a", "b"], "nested": {"k": 1}}  # fmt: skip
    for build in (headers_response, body_response):
        out = Outcome()
        out.metadata.update(md)
        phase = "request_headers" if build is headers_response else "request_body"
        resp = build(phase, out)
        got = json_format.MessageToDict(resp.dynamic_metadata)[METADATA_NAMESPACE]
        assert got == {**md, "settle": 0.0, "reserve": 1234.0}  # Struct numbers are doubles
        kinds = {
            k: v.WhichOneof("kind")
            for k, v in resp.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields.items()
        }
        assert kinds["meter"] == kinds["off"] == "bool_value"  # a bool is not a number
        assert kinds["settle"] == kinds["prompt"] == "number_value"
        assert kinds["spans"] == "list_value" and kinds["nested"] == "struct_value"


def test_no_metadata_leaves_the_field_unset() -> None:
    resp = body_response("request_body", Outcome())
    assert not resp.HasField("dynamic_metadata")
