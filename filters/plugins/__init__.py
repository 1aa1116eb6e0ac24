"""Built-in plugins, one folder each with the helpers only it uses: identity, lane, tokens,
prefix, usage, canary, admission, degrade, picker, pd, idempotency, collapse, shadow."""
