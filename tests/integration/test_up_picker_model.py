"""`tokenweir up` with an emulated pool routed by the endpoint picker and a model's tokenizer:
the emulators it starts publish KV events on ports clear of each other's (consecutive HTTP ports,
``kv_events_replay_offset``) and tokenize with the model the picker renders for, so a second
question about a long document finds it cached, through real Envoy and the ``openai`` client."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.chat_model import make_model_dir
from tests.helpers import free_port
from tests.integration.test_picker_envoy import _bindable
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
openai = pytest.importorskip("openai")


def _base_port() -> int:
    """An HTTP port whose neighbour and KV-event ports (+1000, +2000) look free."""
    for _ in range(200):
        p = free_port()
        offsets = (1, 1000, 1001, 2000, 2001)
        if all(_bindable(p + o, "") for o in offsets):
            return p
    raise RuntimeError("no free port block")


def test_up_runs_a_picker_pool_on_a_models_tokenizer(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "model")
    gw, base, metrics = free_port(), _base_port(), free_port()
    policy = tmp_path / "mesh.yaml"
    policy.write_text(f"""
version: 1
control_plane: {{xds: 127.0.0.1:{free_port()}, metrics: 127.0.0.1:{free_port()}}}
filters: {{address: 127.0.0.1:{free_port()}, metrics_port: {metrics}, message_timeout: 2s}}
pools:
  chat:
    models: [m1]
    emulated: {{replicas: 2, profile: seed-2k, base_port: {base}, time_scale: 0.02}}
    routing:
      mode: prefix_index
      tokenizer: {json.dumps(str(model))}
      min_prefix_tokens: 64
      checkpoint_bytes: 256
      kv_events_replay_offset: 2000
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: chat
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [{{name: identity, settings: {{require: false}}}}, tokens, picker, usage]}}
""")
    proc, banner = start_up(policy, tmp_path / "run")
    try:
        assert "tokenweir up: ready" in banner, banner
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="unused")
        doc = " ".join(f"clause {i}: the cat sat on the mat {i * 3}." for i in range(60))
        cached = []
        for q in ("first question", "second question", "third question"):
            reply = client.chat.completions.create(
                model="m1",
                messages=[{"role": "system", "content": doc}, {"role": "user", "content": q}],
                max_tokens=2,
            )
            details = reply.usage.prompt_tokens_details if reply.usage else None
            cached.append(int(details.cached_tokens or 0) if details else 0)
            time.sleep(1.0)  # the KV events and the mapping arrive meanwhile
        client.close()
        # the emulators tokenized with the model: the document's tokens are found cached
        assert cached[0] == 0 and min(cached[1:]) > 300, cached
        # and the picker, rendering and tokenizing with the same model, predicted them
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
        predicted = [
            float(line.split()[-1])
            for line in text.decode().splitlines()
            if line.startswith("tokenweir_picker_predicted_cached_tokens_total")
        ]
        assert predicted and 0.8 * sum(cached) <= predicted[0] <= sum(cached), (predicted, cached)
    finally:
        stop_up(proc)
