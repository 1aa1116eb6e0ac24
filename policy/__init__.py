"""The mesh policy: typed model, YAML loader with precise errors, cross-reference checks."""

from policy.errors import Issue, PolicyError
from policy.loader import endpoint_files, key_lines, load_policy, load_policy_text
from policy.model import Address, Policy

__all__ = [
    "Address",
    "Issue",
    "Policy",
    "PolicyError",
    "endpoint_files",
    "key_lines",
    "load_policy",
    "load_policy_text",
]
