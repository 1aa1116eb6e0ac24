from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import kubernetes_validate.utils
import pytest


@pytest.fixture(scope="session", autouse=True)
def _schemas_read_once() -> Iterator[None]:
    """kubernetes-validate reads and decodes its schema files (a 1.2 MB ``_definitions.json``
    among them) on every ``validate`` call: 2 of every 3 s of the manifests' validation. Read
    each file once per session; the schemas are the same files, only not decoded again."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            kubernetes_validate.utils,
            "schema_contents",
            cache(kubernetes_validate.utils.schema_contents),
        )
        yield
