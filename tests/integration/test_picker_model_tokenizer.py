"""The picker with a model's own tokenizer and chat template (``routing.tokenizer``), through real
Envoy, against real emulators that render and tokenize with the same model files
(``--tokenizer-path``), as SGLang servers of that model do. Chat completions from the official
``openai`` client: the second question about a long document goes to the replica that holds it,
and the cached tokens the picker predicted are those the backend reports, short by at most one
checkpoint and one index anchor, never more."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from chat.tokenizer import HfChatTokenizer
from filters.app import FilterApp, Settings
from tests.chat_model import make_model_dir
from tests.helpers import free_port, wait_for_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_picker_envoy import _emulator, _free_port_block, _until, policy_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
openai = pytest.importorskip("openai")

ANCHOR = 16  # routing.anchor_tokens: the index knows a cached length to within this


def _policy(gw: int, fp: int, replicas: list[int], model: Path) -> str:
    routing = (
        f"tokenizer: {json.dumps(str(model))}",
        f"anchor_tokens: {ANCHOR}",
        "pending_ttl: 0s",
    )
    return policy_text(gw, fp, replicas, routing=routing, match="{prefix: /v1/}")


async def test_chat_prompts_rendered_with_the_model_template_find_their_replica(
    tmp_path: Path,
) -> None:
    model = make_model_dir(tmp_path / "model")
    tok = HfChatTokenizer.load(model)
    gw, fp = free_port(), free_port()
    replicas = await _free_port_block()
    extra = ("--tokenizer-path", str(model))
    children = [_emulator(tmp_path, i, p, extra=extra) for i, p in enumerate(replicas)]
    app: FilterApp | None = None
    doc = " ".join(
        f"clause {i}: the cat sat on the mat, naïve über café {i * 7}." for i in range(80)
    )
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with mesh(tmp_path, _policy(gw, fp, replicas, model), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None and picker.model is not None
            names = [f"127.0.0.1:{p}" for p in replicas]
            now = time.monotonic
            await _until(
                lambda: all(picker.index.known(n, now()) for n in names),
                lambda: str([picker.index.view(n, now()) for n in names]),
            )
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="unused")

            def body(question: str) -> dict[str, object]:
                return {
                    "model": "m1",
                    "messages": [
                        {"role": "system", "content": doc},
                        {"role": "user", "content": question},
                    ],
                }

            async def ask(question: str) -> int:
                reply = await client.chat.completions.create(
                    max_tokens=2,
                    **body(question),  # type: ignore[arg-type]
                )
                details = reply.usage.prompt_tokens_details if reply.usage else None
                return int(details.cached_tokens or 0) if details else 0

            first = body("What does clause 3 say?")
            assert await ask("What does clause 3 say?") == 0
            data = picker.render("chat", first)
            assert data is not None and data.decode() == tok.render_request(first)
            marks = picker.prompt(data).marks
            await _until(
                lambda: len(picker.map.lookup(marks)) == len(marks),
                lambda: f"checkpoints mapped: {len(picker.map.lookup(marks))} of {len(marks)}",
            )
            # the mapped points are the model's ids of the prompt, block for block
            whole = tok.encode(data.decode())
            last = picker.map.lookup(marks)[-1]
            assert 0 < last.tokens <= len(whole)
            assert last.anchored <= last.tokens
            doc_tokens = len(tok.encode(tok.render_request(body("")).split("What")[0]))
            owners: list[str] = []

            def held() -> bool:
                counts = picker._held(picker.prompt(data).points, now())
                owners[:] = [n for n, c in counts.items() if c]
                return bool(owners)

            await _until(held, lambda: "no replica holds the document yet")
            assert len(owners) == 1
            reg = app.metrics.registry

            def predicted() -> float:
                v = reg.get_sample_value(
                    "tokenweir_picker_predicted_cached_tokens_total", {"pool": "chat"}
                )
                return v or 0.0

            # known at checkpoints (256 bytes), anchors and whole pre-tokens: the prediction may
            # fall short by about one checkpoint's tokens and an anchor, never exceed
            slack = len(tok.encode(doc[1000:1300])) + ANCHOR
            for q in ("And clause 40?", "Summarise clause 71."):
                before = predicted()
                cached = await ask(q)
                guess = predicted() - before
                # the backend found the document: the same ids, so the same block hashes
                assert cached >= doc_tokens - ANCHOR, (cached, doc_tokens)
                # the picker predicted it, never more than the backend had
                assert cached - slack <= guess <= cached, (guess, cached, slack)
            picks = reg.get_sample_value(
                "tokenweir_picker_picks_total", {"pool": "chat", "reason": "cache"}
            )
            assert picks is not None and picks >= 2
            # the reservation counted each prompt exactly with the model's tokenizer: the
            # reported prompt tokens are what was reserved (estimate / reported = 1, from the
            # access log of Envoy's usage meter)
            ratio = "tokenweir_filters_prompt_estimate_ratio"

            def seen(suffix: str, **more: str) -> float:
                return reg.get_sample_value(ratio + suffix, {"model": "m1", **more}) or 0.0

            await _until(lambda: seen("_count") >= 3, lambda: f"{seen('_count')} logged")
            exact = seen("_bucket", le="1.0") - seen("_bucket", le="0.95")
            assert exact == seen("_count"), [seen("_bucket", le=b) for b in ("0.95", "1.0")]
            await client.close()
    finally:
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()


async def test_a_model_directory_that_cannot_load_leaves_the_pool_to_ring_hash(
    tmp_path: Path,
) -> None:
    gw, fp = free_port(), free_port()
    policy = tmp_path / "mesh.yaml"
    policy.write_text(_policy(gw, fp, [free_port()], tmp_path / "no-such-model"))
    app = FilterApp(Settings(policy_path=policy), clock=time.monotonic)
    await app.start()
    try:
        assert app.pickers.get("chat") is None
        errors = app.metrics.registry.get_sample_value(
            "tokenweir_picker_config_errors_total", {"pool": "chat"}
        )
        assert errors == 1
    finally:
        await app.aclose()
