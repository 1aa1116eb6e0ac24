"""The quota layout in Redis, shared by every process that touches it.

The rate-limit service writes it (reservations, settlements, seeding), the filter server reads
it (what a tenant's budget still holds, to clamp ``max_tokens``) and ``tokenweir quota`` edits
it live. None of them owns it, so it lives here: key names (:mod:`.keys`), window arithmetic
(:mod:`.windows`), quota resolution from the policy and live fields (:mod:`.config`), the token
bucket refill (:mod:`.buckets`) and the read-only peek (:mod:`.reader`, ``peek.lua``).
"""

__all__: list[str] = []
