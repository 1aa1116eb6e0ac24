"""Running real SGLang servers for a governed pool (GPU hosts; ``pip install -e '.[sglang]'``).

Nothing here imports ``sglang``: the launcher runs ``python -m sglang.launch_server`` as a child
process, so the default install and CI never need it.
"""

from backends.sglang.capacity import CapacityHints, fetch_capacity, parse_server_info
from backends.sglang.endpoints import add_endpoint, read_endpoints, remove_endpoint
from backends.sglang.launcher import LaunchConfig, SGLangLauncher, build_command

__all__ = [
    "CapacityHints",
    "LaunchConfig",
    "SGLangLauncher",
    "add_endpoint",
    "build_command",
    "fetch_capacity",
    "parse_server_info",
    "read_endpoints",
    "remove_endpoint",
]
