"""Planner inputs from a mapping: the ``planner:`` section of a YAML file, or flags turned into
the same mapping. Unknown keys are rejected with their dotted path and the allowed keys.

Schema (durations as ``250ms``, ``1s`` or bare seconds)::

    pool: chat                    models: [llama-3.1-8b]     # fragment target
    backend: {profile: seed-2k}   # or {decode_tok_s, prefill_tok_s, max_running_requests,
                                  #     max_total_tokens, step_overhead, min_itl}
    prompt_tokens: {mean: 1000, p95: 3000}      output_tokens: {mean: 500, p95: 1200}
    samples: trace.jsonl          # instead of the two above (JSONL or CSV, see load_samples)
    budgets: {ttft: 1s, tbt: 20ms}
    target_utilization: 0.65      prefix_cache_hit_rate: 0.3
    max_replicas: 16              quantile: 0.95
    classes: {chat: {qps: 8, lane: interactive, ttft: 1s}, bulk: {qps: 2, lane: batch}}
    tenants: {gold: {avg_qps: 5, burst: 20}}
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import cast

import yaml

from wire.jsontypes import JsonValue

from .errors import PlanInputError
from .inputs import DEFAULT_UTILIZATION, Lane, PlanInputs, TenantClass, TokenDist, TrafficClass
from .replica import FlatReplica, ReplicaModel, for_workload, profile_replica

__all__ = [
    "inputs_from_mapping",
    "load_samples",
    "missing_inputs",
    "parse_duration",
    "read_planner_section",
]

_KEYS = frozenset({
    "pool", "models", "backend", "prompt_tokens", "output_tokens", "samples", "budgets",
    "target_utilization", "prefix_cache_hit_rate", "max_replicas", "quantile", "classes",
    "tenants",
})  # fmt: skip
_BACKEND_KEYS = frozenset({
    "profile", "decode_tok_s", "prefill_tok_s", "max_running_requests", "max_total_tokens",
    "step_overhead", "min_itl",
})  # fmt: skip
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(us|ms|s|m|h)?\s*$")
_UNITS: Mapping[str | None, float] = MappingProxyType(
    {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
)
_PROMPT_FIELDS = ("input_length", "prompt_tokens", "prompt")
_OUTPUT_FIELDS = ("output_length", "completion_tokens", "output_tokens", "output")


def parse_duration(value: object, path: str) -> float:
    """Seconds from ``250ms`` / ``1.5s`` / ``2m`` / a bare number of seconds."""
    if isinstance(value, bool):
        raise PlanInputError(path, f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    m = _DURATION.match(str(value))
    if m is None:
        raise PlanInputError(path, f"expected a duration like 250ms, 1s or 2m, got {value!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _mapping(
    value: object, path: str, allowed: frozenset[str] | set[str] | None = None
) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise PlanInputError(path or "planner", f"expected a mapping, got {type(value).__name__}")
    if allowed is not None:
        extra = sorted(set(value) - allowed)
        if extra:
            where = f"{path}.{extra[0]}" if path else str(extra[0])
            raise PlanInputError(where, f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return value


def _number(m: Mapping[str, object], key: str, path: str, default: float | None = None) -> float:
    if key not in m or m[key] is None:
        if default is None:
            raise PlanInputError(f"{path}.{key}" if path else key, "required")
        return default
    v = m[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PlanInputError(f"{path}.{key}" if path else key, f"expected a number, got {v!r}")
    return float(v)


def _backend(m: Mapping[str, object]) -> tuple[ReplicaModel, str | None]:
    b = _mapping(m.get("backend"), "backend", _BACKEND_KEYS)
    if "profile" in b:
        if set(b) - {"profile"}:
            raise PlanInputError("backend", "give either profile or explicit rates, not both")
        return profile_replica(str(b["profile"])), str(b["profile"])
    flat = FlatReplica(
        decode_tok_s=_number(b, "decode_tok_s", "backend"),
        prefill_tok_s=_number(b, "prefill_tok_s", "backend"),
        max_running_requests=int(_number(b, "max_running_requests", "backend", 1_000_000)),
        max_total_tokens=int(_number(b, "max_total_tokens", "backend", 1_000_000_000)),
        step_overhead_s=parse_duration(b.get("step_overhead", 0), "backend.step_overhead"),
        min_itl_s=parse_duration(b.get("min_itl", 0), "backend.min_itl"),
    )
    return flat, None


def _dist(m: Mapping[str, object], key: str) -> TokenDist:
    d = _mapping(m.get(key), key, {"mean", "p95", "scv"})
    scv = d.get("scv")
    return TokenDist(
        _number(d, "mean", key),
        _number(d, "p95", key),
        None if scv is None else _number(d, "scv", key),
        key,
    )


def load_samples(path: Path) -> tuple[TokenDist, TokenDist]:
    """Prompt and output distributions from a sample file.

    JSONL (one object a line) or CSV with a header; prompt field one of input_length,
    prompt_tokens, prompt; output field one of output_length, completion_tokens, output_tokens,
    output. The Mooncake trace in ``shared/workloads`` reads as is.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanInputError("samples", f"cannot read {path}: {exc}") from exc
    rows: list[JsonValue] | list[dict[str, str]]
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise PlanInputError("samples", f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    prompts, outputs = [], []
    for i, row in enumerate(rows, start=1):
        fields: Mapping[str, object] = row if isinstance(row, dict) else {}  # a line not an object
        p = next((fields[k] for k in _PROMPT_FIELDS if k in fields), None)
        o = next((fields[k] for k in _OUTPUT_FIELDS if k in fields), None)
        if p is None or o is None:
            raise PlanInputError(
                "samples", f"{path}: row {i} lacks a prompt ({_PROMPT_FIELDS}) or output field"
            )
        try:
            pv, ov = _float(p), _float(o)
        except (TypeError, ValueError) as exc:
            raise PlanInputError("samples", f"{path}: row {i}: not a number") from exc
        if pv < 0 or ov < 0 or not (math.isfinite(pv) and math.isfinite(ov)):
            raise PlanInputError("samples", f"{path}: row {i}: token counts must be ≥ 0")
        prompts.append(pv)
        outputs.append(ov)
    return (
        TokenDist.from_samples(prompts, "prompt_tokens"),
        TokenDist.from_samples(outputs, "output_tokens"),
    )


def _float(value: object) -> float:
    """``float(value)`` of a number or a numeric string; TypeError for anything else."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"not a number: {type(value).__name__}")
    return float(value)


def _classes(m: Mapping[str, object]) -> tuple[TrafficClass, ...]:
    raw = _mapping(m.get("classes"), "classes")
    out = []
    for name, body in raw.items():
        path = f"classes.{name}"
        c = _mapping(body, path, {"qps", "lane", "ttft"})
        lane = str(c.get("lane", "interactive"))
        ttft = None if c.get("ttft") is None else parse_duration(c["ttft"], f"{path}.ttft")
        out.append(TrafficClass(str(name), _number(c, "qps", path), cast(Lane, lane), ttft))
    return tuple(out)


def _tenants(m: Mapping[str, object]) -> tuple[TenantClass, ...]:
    raw = _mapping(m.get("tenants") or {}, "tenants")
    out = []
    for name, body in raw.items():
        path = f"tenants.{name}"
        t = _mapping(body, path, {"avg_qps", "burst"})
        burst = _number(t, "burst", path)
        if burst != int(burst):
            raise PlanInputError(f"{path}.burst", f"a whole number of requests, got {burst:g}")
        out.append(TenantClass(str(name), _number(t, "avg_qps", path), int(burst)))
    return tuple(out)


def inputs_from_mapping(m: Mapping[str, object], base_dir: Path | None = None) -> PlanInputs:
    """Build checked :class:`PlanInputs` from a planner mapping (see the module docstring)."""
    m = _mapping(m, "", _KEYS)
    missing = missing_inputs(m)
    if missing:
        raise PlanInputError("missing inputs", "; ".join(missing))
    replica, profile_name = _backend(m)
    if m.get("samples") is not None:
        if "prompt_tokens" in m or "output_tokens" in m:
            raise PlanInputError("samples", "give samples or prompt/output_tokens, not both")
        sample_path = Path(str(m["samples"]))
        if base_dir is not None and not sample_path.is_absolute():
            sample_path = base_dir / sample_path
        prompt, output = load_samples(sample_path)
    else:
        prompt, output = _dist(m, "prompt_tokens"), _dist(m, "output_tokens")
    budgets = _mapping(m.get("budgets"), "budgets", {"ttft", "tbt"})
    for key in ("ttft", "tbt"):
        if key not in budgets:
            raise PlanInputError(f"budgets.{key}", "required")
    hit_rate = _number(m, "prefix_cache_hit_rate", "", 0.0)
    context_note = ""
    if 0.0 <= hit_rate <= 1.0:  # PlanInputs reports an out-of-range rate precisely
        replica, context_note = for_workload(replica, prompt.mean, output.mean, hit_rate)
    max_rep = m.get("max_replicas")
    models = m.get("models") or ()
    if isinstance(models, str):
        models = (models,)
    if not isinstance(models, Iterable):
        raise PlanInputError("models", f"expected a list of model names, got {models!r}")
    return PlanInputs(
        replica=replica,
        prompt=prompt,
        output=output,
        ttft_s=parse_duration(budgets["ttft"], "budgets.ttft"),
        tbt_s=parse_duration(budgets["tbt"], "budgets.tbt"),
        classes=_classes(m),
        tenants=_tenants(m),
        target_utilization=_number(m, "target_utilization", "", DEFAULT_UTILIZATION),
        prefix_hit_rate=hit_rate,
        max_replicas=None if max_rep is None else int(_number(m, "max_replicas", "")),
        quantile=_number(m, "quantile", "", 0.95),
        pool=str(m.get("pool", "default")),
        profile_name=profile_name,
        models=tuple(str(x) for x in models),
        context_note=context_note,
    )


_HOW = MappingProxyType({
    "backend": "backend.profile (--profile NAME), or backend.decode_tok_s and "
    "backend.prefill_tok_s (--decode-tok-s, --prefill-tok-s)",
    "backend.decode_tok_s": "backend.decode_tok_s (--decode-tok-s)",
    "backend.prefill_tok_s": "backend.prefill_tok_s (--prefill-tok-s)",
    "budgets.ttft": "budgets.ttft (--ttft, e.g. 1s)",
    "budgets.tbt": "budgets.tbt (--tbt, e.g. 20ms)",
    "classes": "classes (--qps [CLASS=]QPS, repeat per class)",
})  # fmt: skip


def missing_inputs(m: Mapping[str, object]) -> list[str]:
    """Every required input ``m`` lacks, each with the key and the flag that give it (a plan
    needs a backend, prompt and output token sizes or samples, both budgets and some traffic)."""
    out: list[str] = []
    backend = m.get("backend")
    if not backend:
        out.append(_HOW["backend"])
    elif isinstance(backend, Mapping) and "profile" not in backend:
        out += [_HOW[f"backend.{k}"] for k in ("decode_tok_s", "prefill_tok_s") if k not in backend]
    if m.get("samples") is None:
        for key, flag in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
            dist = m.get(key)
            have = dist if isinstance(dist, Mapping) else {}
            if dist is None or isinstance(dist, Mapping):
                out += [
                    f"{key}.{k} (--{flag}-{k}{', or --samples FILE' if not have else ''})"
                    for k in ("mean", "p95")
                    if have.get(k) is None
                ]
    budgets = m.get("budgets")
    if budgets is None or isinstance(budgets, Mapping):
        out += [_HOW[f"budgets.{k}"] for k in ("ttft", "tbt") if (budgets or {}).get(k) is None]
    if not m.get("classes"):
        out.append(_HOW["classes"])
    return out


def read_planner_section(text: str, filename: str = "<string>") -> dict[str, object]:
    """The ``planner:`` mapping of a YAML document (or the whole document if it has none)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanInputError(filename, f"invalid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise PlanInputError(filename, "expected a YAML mapping")
    if "planner" not in doc and "version" in doc:
        raise PlanInputError(f"{filename}: planner", "this policy has no planner: section")
    section = doc.get("planner", doc)
    if not isinstance(section, dict):
        raise PlanInputError(f"{filename}: planner", "expected a mapping")
    return dict(section)
