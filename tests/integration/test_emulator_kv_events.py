"""A real emulator process publishes SGLang's KV events over ZMQ on loopback (PUB + replay)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import zmq
import zmq.asyncio

from backends.emulator.tokenizer import encode
from prefixindex.hashing import prefix_block_ids
from prefixindex.wire import (
    AllBlocksCleared,
    BlockStored,
    decode_batch,
    decode_frame,
    decode_seq,
    encode_seq,
)
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

KV_CONFIG = json.dumps(
    {
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*",
        "topic": "kv",
    }
)


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port)]
    argv += ["--profile", "seed-2k", "--time-scale", "0.02", "--kv-events-config", KV_CONFIG]
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http, http.get(url + "/get_server_info") as r:
            info = await r.json()
        yield url, json.loads(info["kv_events_config"])
    finally:
        child.close()


async def test_events_on_pub_and_replay_match_the_prompt_blocks(
    emulator: tuple[str, dict[str, str]],
) -> None:
    url, kv = emulator
    assert kv["endpoint"].startswith("tcp://127.0.0.1:") and kv["topic"] == "kv"
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(kv["endpoint"])
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(kv["replay_endpoint"])
    try:
        # a SUB socket misses what is published before its subscription reaches the publisher
        # (no fixed sleep is long enough on a loaded machine): a prompt whose events do not
        # come is sent again as a new prompt (its first word differs, so every block hash does)
        # until one prompt's blocks all arrive
        stored: list[int] = []
        seqs: list[int] = []
        async with aiohttp.ClientSession() as http:
            for attempt in range(20):
                text = f"try{attempt} alpha beta gamma delta epsilon zeta eta theta"
                body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
                async with http.post(url + "/generate", json=body) as r:
                    assert r.status == 200
                want = prefix_block_ids(encode(text), 1)
                with contextlib.suppress(TimeoutError):
                    while not set(want) <= set(stored):
                        frames = await asyncio.wait_for(sub.recv_multipart(), 1.0)
                        topic, seq, batch = decode_frame(frames)
                        assert topic == "kv"
                        seqs.append(seq)
                        stored += [
                            h
                            for e in batch.events
                            if isinstance(e, BlockStored)
                            for h in e.block_hashes
                        ]
                if set(want) <= set(stored):
                    break
        assert set(want) <= set(stored), "no prompt's events reached the subscriber"
        assert seqs == sorted(seqs) and seqs[0] >= 1
        # the replay socket hands back everything from seq 0: the fresh cache's AllBlocksCleared
        await dealer.send_multipart([b"", encode_seq(0)])
        replayed = []
        while True:
            _, raw_seq, payload = await asyncio.wait_for(dealer.recv_multipart(), 10)
            if decode_seq(raw_seq) == -1:
                break
            replayed.append((decode_seq(raw_seq), decode_batch(payload)))
        assert [s for s, _ in replayed] == list(range(len(replayed)))
        assert replayed[0][1].events == [AllBlocksCleared()]
        assert seqs[-1] in [s for s, _ in replayed]
    finally:
        sub.close(0)
        dealer.close(0)
        ctx.term()
