"""Load a policy file: YAML → typed model → cross-reference checks → resolved endpoints.

The same loader serves ``tokenweir validate`` (offline) and the running control plane, so a
policy that validates is exactly a policy the server accepts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from policy.bounded import DEFAULT_LIMITS, Limits, compose_bounded
from policy.decode import Decoder
from policy.endpoints import parse_endpoints_text
from policy.errors import Issue, PolicyError
from policy.lora_models import with_adapter_models
from policy.model import Address, LlmPool, Policy
from policy.semantic import check_policy
from policy.service_tls import service_tls_issues
from policy.tls import tls_file_issues

__all__ = ["endpoint_files", "key_lines", "load_policy", "load_policy_text"]


def load_policy(
    path: str | Path, limits: Limits = DEFAULT_LIMITS, *, gateway_files: bool = True
) -> Policy:
    """Read and check the policy at ``path``; raise :class:`PolicyError` listing every problem.

    ``gateway_files=False``: the gateways' certificate and key files are not read (a process
    that neither serves nor configures a gateway, the rate-limit service, need not hold the
    gateway's private key; policy.tls).

    Never raises anything else for any file content: size, depth and alias expansion are
    bounded before a node is built (:mod:`policy.bounded`)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(limits.max_bytes + 1)
        if len(data) > limits.max_bytes:
            raise PolicyError(
                [
                    Issue(
                        str(p),
                        0,
                        "",
                        f"the file is larger than {limits.max_bytes} bytes; "
                        f"at most {limits.max_bytes} allowed",
                    )
                ]
            )
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError([_not_utf8(str(p), data, exc)]) from exc
    except OSError as exc:
        raise PolicyError([Issue(str(p), 0, "", f"cannot read policy file: {exc}")]) from exc
    return load_policy_text(
        text, filename=str(p), base_dir=p.parent, limits=limits, gateway_files=gateway_files
    )


def _not_utf8(filename: str, data: bytes, exc: UnicodeDecodeError) -> Issue:
    """Where the first byte that is not UTF-8 sits, as ``file:line`` and a column."""
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    bad = data[exc.start : exc.end].hex(" ")
    return Issue(
        filename,
        line,
        "",
        f"invalid UTF-8: byte(s) {bad} at column {column} ({exc.reason}); a policy file is "
        "UTF-8 text: save it as UTF-8",
    )


def load_policy_text(
    text: str,
    filename: str = "<string>",
    base_dir: Path | None = None,
    limits: Limits = DEFAULT_LIMITS,
    *,
    gateway_files: bool = True,
) -> Policy:
    """Parse policy YAML text; endpoint files are resolved relative to ``base_dir``."""
    with _collector_paused():
        return _load_text(text, filename, base_dir, limits, gateway_files)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """A policy builds no reference cycles worth collecting, but a large one allocates ~10^6
    objects, and the cyclic collector's repeated full passes over the growing tree were most of
    the load time (10k tenants: 3.9 s -> 1.6 s without them). Re-enabled afterwards only if it
    was on (the policy watcher pauses it itself around the whole build)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _load_text(
    text: str, filename: str, base_dir: Path | None, limits: Limits, gateway_files: bool = True
) -> Policy:
    root = compose_bounded(text, filename, limits)
    if root is None:
        raise PolicyError(
            [Issue(filename, 1, "", "the policy is empty; expected a mapping with 'version: 1'")]
        )
    decoder = Decoder(filename)
    policy = decoder.document(root, Policy)
    if policy is None:
        raise PolicyError(decoder.issues)
    lines = _Lines(root)
    policy, lora_problems = with_adapter_models(policy)  # adapters are models (policy/lora.py)
    problems = [*lora_problems, *check_policy(policy)]
    issues = [Issue(filename, lines.of(path), path, msg) for path, msg in problems]
    resolved, file_issues = _resolve_endpoints(policy, base_dir or Path.cwd(), lines, filename)
    issues += file_issues
    resolved, tls_issues = tls_file_issues(resolved, base_dir or Path.cwd(), gateway_files)
    resolved, svc_issues = service_tls_issues(resolved, base_dir or Path.cwd())
    tls_issues += svc_issues
    issues += [Issue(filename, lines.of(path), path, msg) for path, msg in tls_issues]
    if issues:
        raise PolicyError(issues)
    return resolved


def key_lines(path: str | Path) -> Callable[[str], int]:
    """``line(key.path)`` for the policy file at ``path`` (0 when it cannot be read again): for
    problems found after loading, e.g. by a service's builder."""
    try:
        root = compose_bounded(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, PolicyError):
        root = None
    if root is None:
        return lambda _key: 0
    return _Lines(root).of


def endpoint_files(policy: Policy, base_dir: Path) -> list[Path]:
    """Every endpoints file the policy names (the watcher follows these too)."""
    named = [p.endpoints_file for p in policy.pools.values()]
    named += [s.endpoints_file for s in policy.services.values()]
    return [(base_dir / f).resolve() for f in named if f is not None]


def _resolve_endpoints(
    policy: Policy, base_dir: Path, lines: _Lines, filename: str
) -> tuple[Policy, list[Issue]]:
    issues: list[Issue] = []

    def from_file(section: str, name: str, rel: str | None) -> tuple[Address, ...]:
        if rel is None:
            return ()
        path = (base_dir / rel).resolve()
        if not path.exists():
            return ()  # a launcher creates it when the first replica registers
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            line = lines.of(f"{section}.{name}.endpoints_file")
            issues.append(
                Issue(
                    filename, line, f"{section}.{name}.endpoints_file", f"cannot read {path}: {exc}"
                )
            )
            return ()
        eps, problems = parse_endpoints_text(text)
        issues.extend(
            Issue(str(path), ln, f"{section}.{name}.endpoints_file", msg) for ln, msg in problems
        )
        return eps

    pools = {}
    for name, pool in policy.pools.items():
        eps = list(pool.endpoints) + list(from_file("pools", name, pool.endpoints_file))
        eps += list(_emulated_endpoints(pool))
        eps += list(pool.disaggregation.decode if pool.disaggregation is not None else ())
        pools[name] = dataclasses.replace(pool, endpoints=tuple(dict.fromkeys(eps)))
    services = {
        name: dataclasses.replace(
            svc,
            endpoints=tuple(
                dict.fromkeys([*svc.endpoints, *from_file("services", name, svc.endpoints_file)])
            ),
        )
        for name, svc in policy.services.items()
    }
    return dataclasses.replace(policy, pools=pools, services=services), issues


def _emulated_endpoints(pool: LlmPool) -> tuple[Address, ...]:
    em = pool.emulated
    if em is None or em.base_port is None:
        return ()
    if pool.autoscale is not None:  # the replicas serving now: `up` writes them to endpoints_file
        return ()
    return tuple(Address("127.0.0.1", em.base_port + i) for i in range(em.replicas))


class _Lines:
    """Line of a key path, indexed on first use (a valid policy never pays for the index)."""

    def __init__(self, root: yaml.Node) -> None:
        self._root = root
        self._index: dict[str, int] | None = None

    def of(self, path: str) -> int:
        if self._index is None:
            self._index = _line_index(self._root)
        return _line_of(self._index, path)


def _line_index(root: yaml.Node) -> dict[str, int]:
    """Map every key path (``pools.chat.fallback``, ``gateways.edge.routes[0]``) to its line.

    Iterative, and each node is visited once (an alias is not walked again)."""
    index: dict[str, int] = {}
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, path = todo.pop()
        index.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                sub = f"{path}.{k.value}" if path else str(k.value)
                index[sub] = k.start_mark.line + 1
                todo.append((v, sub))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                todo.append((item, f"{path}[{i}]"))
    return index


def _line_of(index: dict[str, int], path: str) -> int:
    """The line of ``path``, or of its nearest ancestor written in the file."""
    while path:
        if path in index:
            return index[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return index.get("", 0)
