"""PD disaggregation at the gateway: pick a prefill and a decode replica per request, add
SGLang's bootstrap fields, send the prefill side from the filter server, let Envoy stream the
decode side (docs/policy.md "PD disaggregation")."""
