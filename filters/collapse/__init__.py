"""Request collapsing: identical deterministic requests in flight share one backend run."""

from filters.collapse.fanout import FanoutServer
from filters.collapse.hub import Hub, Run
from filters.collapse.plugin import CollapsePlugin

__all__ = ["CollapsePlugin", "FanoutServer", "Hub", "Run"]
