"""Types shared by the policy model: lanes, bounded numbers, ``host:port`` addresses, names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

import yaml

from policy.decode import MISSING_NODE, Decoder, Missing, Range

__all__ = ["LANES", "Address", "Count", "Lane", "Percent", "Port", "Positive", "check_name"]

Lane = Literal["interactive", "batch"]
LANES: tuple[str, ...] = ("interactive", "batch")
Port = Annotated[int, Range(1, 65535)]
Count = Annotated[int, Range(0, 1_000_000_000)]
Positive = Annotated[int, Range(1, 1_000_000_000)]
Percent = Annotated[float, Range(0, 100)]
_HOSTPORT = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9_\-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, order=True)
class Address:
    """``host:port``; written as that string in YAML."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Address:
        m = _HOSTPORT.match(text.strip())
        if m is None or not 1 <= int(m.group("port")) <= 65535:
            raise ValueError(f"expected host:port with a port in 1..65535, got {text!r}")
        return cls(m.group("host").strip("[]"), int(m.group("port")))

    @classmethod
    def __decode__(cls, d: Decoder, node: yaml.Node, path: str) -> Address | Missing:
        if isinstance(node, yaml.ScalarNode):
            try:
                return cls.parse(str(node.value))
            except ValueError as exc:
                d.error(node, path, str(exc))
                return MISSING_NODE
        d.error(node, path, "expected a 'host:port' string")
        return MISSING_NODE


def check_name(value: str, what: str) -> None:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid name (lowercase letters, digits, '-' and '_', "
            "1-63 characters, starting and ending with a letter or digit)"
        )
