"""Request collapsing: identical deterministic requests in flight share one backend run."""

from filters.plugins.collapse.fanout import FanoutServer
from filters.plugins.collapse.hub import Hub, Run
from filters.plugins.collapse.plugin import CollapsePlugin

__all__ = ["CollapsePlugin", "FanoutServer", "Hub", "Run"]
