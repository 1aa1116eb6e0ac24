"""Built-in plugins: identity, tokens, prefix, lane, usage."""
