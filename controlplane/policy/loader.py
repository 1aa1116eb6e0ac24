"""Load a policy file: YAML → typed model → cross-reference checks → resolved endpoints.

The same loader serves ``tokenweir validate`` (offline) and the running control plane, so a
policy that validates is exactly a policy the server accepts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from controlplane.policy.decode import MISSING_NODE, Decoder
from controlplane.policy.endpoints import parse_endpoints_text
from controlplane.policy.errors import Issue, PolicyError
from controlplane.policy.model import Address, LlmPool, Policy
from controlplane.policy.semantic import check_policy

__all__ = ["endpoint_files", "load_policy", "load_policy_text"]


def load_policy(path: str | Path) -> Policy:
    """Read and check the policy at ``path``; raise :class:`PolicyError` listing every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([Issue(str(p), 0, "", f"cannot read policy file: {exc}")]) from exc
    return load_policy_text(text, filename=str(p), base_dir=p.parent)


def load_policy_text(text: str, filename: str = "<string>", base_dir: Path | None = None) -> Policy:
    """Parse policy YAML text; endpoint files are resolved relative to ``base_dir``."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([Issue(filename, line, "", f"invalid YAML: {problem}")]) from exc
    if root is None:
        raise PolicyError(
            [Issue(filename, 1, "", "the policy is empty; expected a mapping with 'version: 1'")]
        )
    decoder = Decoder(filename)
    policy = decoder.decode(root, Policy, "")
    if policy is MISSING_NODE:
        raise PolicyError(decoder.issues)
    lines = _line_index(root)
    issues = [
        Issue(filename, _line_of(lines, path), path, msg) for path, msg in check_policy(policy)
    ]
    resolved, file_issues = _resolve_endpoints(policy, base_dir or Path.cwd(), lines, filename)
    issues += file_issues
    if issues:
        raise PolicyError(issues)
    return resolved


def endpoint_files(policy: Policy, base_dir: Path) -> list[Path]:
    """Every endpoints file the policy names (the watcher follows these too)."""
    named = [p.endpoints_file for p in policy.pools.values()]
    named += [s.endpoints_file for s in policy.services.values()]
    return [(base_dir / f).resolve() for f in named if f is not None]


def _resolve_endpoints(
    policy: Policy, base_dir: Path, lines: dict[str, int], filename: str
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
            line = _line_of(lines, f"{section}.{name}.endpoints_file")
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
    return tuple(Address("127.0.0.1", em.base_port + i) for i in range(em.replicas))


def _line_index(root: yaml.Node) -> dict[str, int]:
    """Map every key path (``pools.chat.fallback``, ``gateways.edge.routes[0]``) to its line."""
    index: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        index.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                sub = f"{path}.{k.value}" if path else str(k.value)
                index[sub] = k.start_mark.line + 1
                walk(v, sub)
                index[sub] = k.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    walk(root, "")
    return index


def _line_of(index: dict[str, int], path: str) -> int:
    """The line of ``path``, or of its nearest ancestor written in the file."""
    while path:
        if path in index:
            return index[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return index.get("", 0)
