"""The checkpoint mapper's worker process, spoken to over its stdin and stdout from the event
loop: no thread in the filter server takes part.

It replaces a one-worker ``concurrent.futures.ProcessPoolExecutor``. That executor hands each
call to two helper threads (one feeds the pickled call into a pipe, one waits for results and
wakes the loop), and every call writes to a wake-up pipe that the waiting thread selects on: the
loop thread gives up the GIL for that write, the woken thread takes it, and the loop waits to get
it back. A profile of the filter server on the picker route found **8.8% of its loop thread's
samples in that write** (docs/benchmarks.md, "The mapper's worker without the executor's
threads"). Here a call is one frame written to the child's stdin by the loop's own transport and
one frame read back from its stdout.

Wire: a 4-byte big-endian length before each frame. A call is the pickled ``(jobs, step, page,
anchor_every, tokenizer)`` of :func:`filters.plugins.picker.mapper.map_batch`; the answer is ``r`` + the pickled
result, or ``e`` + the error text (a bug in the mapping: the call fails, the child lives on).

A child that dies (killed, out of memory) is noticed at its next call (its stdout closes): the
call raises :class:`~filters.plugins.picker.errors.MapperDown`, ``restarts`` counts it, and the next call starts a new one. A
call past ``timeout`` kills the child (the next call starts a new one). The child exits at the
end of its input: when the filter server closes it, or dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import struct
import sys
from collections.abc import Sequence
from typing import BinaryIO

from filters.plugins.picker.errors import MapperDown
from filters.plugins.picker.mapper import EMULATOR, Job, Point, map_batch
from runtime.children import PipeChild

__all__ = ["MapperWorker", "main", "serve"]

_LEN = struct.Struct(">I")
_OK, _ERROR = b"r", b"e"
_log = logging.getLogger(__name__)

Result = list[tuple[list[Point], int]]


class MapperWorker(PipeChild):
    """One child process running :func:`~filters.plugins.picker.mapper.map_batch`; one call at a time
    (the pool's mapper task awaits each); ``aclose()`` stops it."""

    def __init__(self, *, timeout: float = 30.0, log: logging.Logger = _log) -> None:
        self.timeout = timeout
        self._log = log

    async def start(self) -> None:
        """Start the child now (it imports the mapper once, ~0.15 s of CPU, before the first
        request's prompt needs it)."""
        await self._start(
            "filters.plugins.picker.worker", what="picker mapper worker", log=self._log
        )

    async def call(
        self,
        jobs: Sequence[Job],
        step: int,
        page: int,
        anchor_every: int = 1,
        tokenizer: str = EMULATOR,
    ) -> Result:
        """``map_batch(jobs, step, page, anchor_every, tokenizer)`` in the child (which loads a
        model tokenizer once, at its first call naming it). Raises
        :class:`~filters.plugins.picker.errors.MapperDown` when it cannot answer (the child is then replaced at the next
        call, unless the mapping itself raised)."""
        await self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        call = (list(jobs), step, page, anchor_every, tokenizer)
        frame = pickle.dumps(call, pickle.HIGHEST_PROTOCOL)
        try:
            async with asyncio.timeout(self.timeout):
                proc.stdin.write(_LEN.pack(len(frame)) + frame)
                await proc.stdin.drain()
                (size,) = _LEN.unpack(await proc.stdout.readexactly(_LEN.size))
                answer = await proc.stdout.readexactly(size)
        except TimeoutError as exc:
            await self._kill()
            raise MapperDown(f"the mapper worker took longer than {self.timeout:g} s") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            code = await self._kill()
            raise MapperDown(f"the mapper worker died (exit code {code})") from exc
        except asyncio.CancelledError:
            await self._kill()  # a half-read answer cannot be resumed
            raise
        if answer[:1] == _ERROR:
            raise MapperDown(f"the mapping failed: {answer[1:].decode(errors='replace')}")
        result: Result = pickle.loads(answer[1:])
        return result


# -- the child ---------------------------------------------------------------------------------
def _read(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def serve(requests: BinaryIO, out: BinaryIO) -> None:
    """Answer calls until the end of ``requests``."""
    while True:
        head = _read(requests, _LEN.size)
        if head is None:
            return
        body = _read(requests, _LEN.unpack(head)[0])
        if body is None:
            return
        try:
            answer = _OK + pickle.dumps(map_batch(*pickle.loads(body)), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a failed mapping is the answer, never the child's end
            answer = _ERROR + f"{type(exc).__name__}: {exc}".encode()
        out.write(_LEN.pack(len(answer)) + answer)
        out.flush()


def main() -> int:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing printed may corrupt the frames
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
