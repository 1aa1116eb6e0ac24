"""The options every admin CLI that talks to the running mesh's Redis shares (``tokenweir
quota``, ``tokenweir shadow``): the policy, ``--redis-url`` and the state directory of
``tokenweir up`` (runtime/statedir.py's ``find_redis`` reads them in that order)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_mesh_redis_args"]


def add_mesh_redis_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", type=Path, default=Path("examples/mesh.yaml"), help="policy"
    )
    parser.add_argument(
        "--redis-url", default=None, help="default: the running mesh's, else the policy's"
    )
    parser.add_argument(
        "--state-dir", type=Path, help="of `tokenweir up` (default: next to the policy)"
    )
