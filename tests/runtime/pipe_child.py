"""A child for tests/runtime/test_pipechild.py: ``python -m tests.runtime.pipe_child [MAX]``.

Requests: ``echo:X`` answers ``rX``; ``big:N`` answers one frame of N bytes; ``two:X`` answers
``pX`` then ``rX``; ``print:X`` prints X to stdout, then answers ``rX``; ``raise:X`` raises."""

from __future__ import annotations

import sys

from runtime.pipechild import MAX_FRAME, frame_output, serve_frames


def handle(request: bytes) -> list[bytes]:
    verb, _, arg = request.partition(b":")
    if verb == b"echo":
        return [b"r" + arg]
    if verb == b"big":
        return [b"r" + b"x" * (int(arg) - 1)]
    if verb == b"two":
        return [b"p" + arg, b"r" + arg]
    if verb == b"print":
        print(arg.decode(), flush=True)
        return [b"r" + arg]
    raise ValueError(arg.decode())


def main() -> int:
    out = frame_output()
    serve_frames(
        handle, sys.stdin.buffer, out, max_frame=int(sys.argv[1]) if sys.argv[1:] else MAX_FRAME
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
