"""A stand-in for an existing HTTP service (the example policy's ``inventory``).

    .venv/bin/python examples/echo_service.py --port 18090

It answers every request with JSON describing what it received, so you can see that the mesh
routes ordinary services unchanged: ``curl -H 'Host: inventory' http://127.0.0.1:15001/items/7``.
"""

from __future__ import annotations

import argparse

from aiohttp import web


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "service": "inventory",
            "method": request.method,
            "path": request.path_qs,
            "headers": dict(request.headers),
            "body_bytes": len(body),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18090)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    web.run_app(app, host=args.host, port=args.port, access_log=None)


if __name__ == "__main__":
    main()
