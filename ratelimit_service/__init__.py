"""tokenweir rate-limit service: token-aware quotas in Redis (envoy.service.ratelimit.v3)."""
