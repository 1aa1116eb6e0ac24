"""A CPU emulator of an SGLang server: same HTTP API and metric names, a real radix prefix cache,
and a timing model of continuous batching (see docs/emulator.md)."""
