"""tokenweir control plane: policy model, translation to Envoy resources, xDS server, CLI."""
