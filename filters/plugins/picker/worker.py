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

Wire: the protocol of :mod:`runtime.pipechild` (length-prefixed frames both ways, its size
limit, its timeout, its dead child). A call is the pickled ``(jobs, step, page, anchor_every,
tokenizer)`` of :func:`filters.plugins.picker.mapper.map_batch`; the answer is ``r`` + the pickled
result, or an ``e`` frame with the error (a bug in the mapping: the call fails, the child lives
on).

A child that dies (killed, out of memory) is noticed at its next call (its stdout closes): the
call raises :class:`~filters.plugins.picker.errors.MapperDown`, ``restarts`` counts it, and the next
call starts a new one. A call past ``timeout`` kills the child (the next call starts a new one).
The child exits at the end of its input: when the filter server closes it, or dies.
"""

from __future__ import annotations

import logging
import pickle
import sys
from collections.abc import Sequence
from typing import BinaryIO

from filters.plugins.picker.errors import MapperDown
from filters.plugins.picker.mapper import EMULATOR, Job, Point, map_batch
from runtime.errors import CallFailed, CallTimedOut, ChildDied, PipeCallError
from runtime.pipechild import FrameReader, PipeChild, frame_output, serve_frames

__all__ = ["MapperWorker", "main", "serve"]

_OK = b"r"
_log = logging.getLogger(__name__)

Result = list[tuple[list[Point], int]]


class MapperWorker(PipeChild):
    """One child process running :func:`~filters.plugins.picker.mapper.map_batch`; one call at a time
    (the pool's mapper task awaits each); ``aclose()`` stops it."""

    def __init__(self, *, timeout: float = 30.0, log: logging.Logger = _log) -> None:
        # the child imports the mapper once, ~0.15 s of CPU, before the first prompt needs it
        super().__init__(
            "filters.plugins.picker.worker", what="the mapper worker", timeout=timeout, log=log
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
        :class:`~filters.plugins.picker.errors.MapperDown` when it cannot answer (the child is then
        replaced at the next call, unless the mapping itself raised)."""
        call = (list(jobs), step, page, anchor_every, tokenizer)
        try:
            return await self.exchange(pickle.dumps(call, pickle.HIGHEST_PROTOCOL), _result)
        except CallFailed as exc:
            raise MapperDown(f"the mapping failed: {exc}") from exc
        except CallTimedOut as exc:
            raise MapperDown(f"the mapper worker took longer than {self.timeout:g} s") from exc
        except ChildDied as exc:
            raise MapperDown(f"the mapper worker died (exit code {exc.code})") from exc
        except PipeCallError as exc:  # a frame over the size limit
            raise MapperDown(f"the mapper worker failed: {exc}") from exc


async def _result(frames: FrameReader) -> Result:
    answer = await frames.read()
    result: Result = pickle.loads(answer[1:])
    return result


# -- the child ---------------------------------------------------------------------------------
def _answer(request: bytes) -> list[bytes]:
    return [_OK + pickle.dumps(map_batch(*pickle.loads(request)), pickle.HIGHEST_PROTOCOL)]


def serve(requests: BinaryIO, out: BinaryIO) -> None:
    """Answer calls until the end of ``requests`` (a failed mapping fails its call only)."""
    serve_frames(_answer, requests, out)


def main() -> int:
    out = frame_output()  # nothing printed may corrupt the frames
    serve(sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
