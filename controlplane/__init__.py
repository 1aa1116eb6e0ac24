"""tokenweir control plane: translation of the policy to Envoy resources, the xDS server, the
control-plane process (reloader, pool scraper, dashboard, canary) and the capacity planner."""
