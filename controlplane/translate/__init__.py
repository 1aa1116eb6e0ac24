"""Pure translation: policy → Envoy resources (no I/O, no clock, no grpc)."""
