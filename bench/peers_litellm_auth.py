"""Custom auth for the LiteLLM proxy arm of bench/peers.py (loaded by LiteLLM, not by tokenweir).

Accepts the benchmark's keys (``tw-peers-*``) without a database and returns each with its
``tpm_limit`` from ``tpm_limits.json`` beside this file (no limit when absent); LiteLLM's own
rate limiter enforces the limit per key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from litellm.proxy._types import UserAPIKeyAuth

__all__ = ["user_api_key_auth"]

_LIMITS: dict[str, int] = json.loads((Path(__file__).parent / "tpm_limits.json").read_text())


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    if not api_key.startswith("tw-peers-"):
        raise ValueError("unknown key")
    return UserAPIKeyAuth(api_key=api_key, tpm_limit=_LIMITS.get(api_key))
