"""``tokenweir plan``: the capacity planner's command line.

The lead's ``tokenweir/cli.py`` calls :func:`register` on its subparsers. Flags build the same
mapping as a ``planner:`` YAML section (see :mod:`.parse`) and override a file given with ``-f``.
Exit codes: 0 plan printed, 2 bad input, 3 infeasible (message says which constraint and by how
much), 4 the merged policy does not validate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO, cast

import yaml

from .capacity import MODELS, Model
from .errors import InfeasibleError, PlanInputError
from .fragment import fragment, fragment_yaml, merge
from .parse import inputs_from_mapping, read_planner_section
from .plan import Plan, make_plan
from .plot import plot_wait_vs_utilization
from .report import plan_json, plan_text

__all__ = ["EXIT_INFEASIBLE", "EXIT_INPUT", "EXIT_POLICY", "register", "run_plan"]

EXIT_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_POLICY = 4


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``plan`` subcommand; its handler is ``args.func(args) -> int``."""
    p = subparsers.add_parser(
        "plan",
        help="capacity plan: replicas, queue bounds, token buckets, policy fragment",
        description="From QPS and latency budgets to replicas, queue bounds, bucket "
        "parameters and a policy fragment, each number with its formula.",
    )
    p.add_argument("-f", "--file", type=Path, help="YAML with planner inputs (its planner: key)")
    b = p.add_argument_group("backend (a profile shared with the emulator, or explicit rates)")
    b.add_argument("--profile", help="backend profile name, e.g. seed-2k, llama-3.1-8b-h100")
    b.add_argument("--decode-tok-s", type=float, help="total decode throughput per replica")
    b.add_argument("--prefill-tok-s", type=float, help="prefill rate per replica")
    b.add_argument("--max-running-requests", type=int)
    b.add_argument("--max-total-tokens", type=int, help="KV cache tokens per replica")
    b.add_argument("--min-itl", help="a lone stream's time between tokens, e.g. 5ms")
    t = p.add_argument_group("token distributions (or --samples)")
    for name in ("prompt", "output"):
        t.add_argument(f"--{name}-mean", type=float, help=f"mean {name} tokens")
        t.add_argument(f"--{name}-p95", type=float, help=f"p95 {name} tokens")
    t.add_argument("--samples", help="JSONL/CSV of prompt and output token counts")
    g = p.add_argument_group("budgets and traffic")
    g.add_argument("--ttft", help="time-to-first-token budget, e.g. 1s or 500ms")
    g.add_argument("--tbt", help="time-between-tokens budget, e.g. 20ms")
    g.add_argument(
        "--qps",
        action="append",
        default=[],
        metavar="[CLASS=]QPS[:LANE[:TTFT]]",
        help="target QPS of a traffic class (repeat per class), e.g. chat=8 or bulk=2:batch:30s",
    )
    g.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="TIER=AVG_QPS:BURST",
        help="a tenant class: contracted average QPS and burst size in requests",
    )
    g.add_argument("--utilization", type=float, help="target utilization (default 0.65)")
    g.add_argument("--prefix-hit-rate", type=float, help="expected prefix-cache hit rate")
    g.add_argument("--max-replicas", type=int)
    g.add_argument("--quantile", type=float, help="wait quantile to budget (default 0.95)")
    o = p.add_argument_group("output")
    o.add_argument("--pool", help="pool name in the policy (default: default)")
    o.add_argument("--model-name", action="append", help="model served (new pools need one)")
    o.add_argument("--queue-model", choices=sorted(MODELS), default="batch")
    o.add_argument("--envoys", type=int, default=1, help="Envoys sharing the breakers")
    o.add_argument("--format", choices=("text", "json"), default="text")
    o.add_argument("--plot", type=Path, help="write the wait-vs-utilization PNG here")
    o.add_argument("--fragment", type=Path, help="write the policy fragment YAML here")
    o.add_argument("--merge-into", type=Path, help="policy to merge the fragment into")
    o.add_argument("--output", type=Path, help="where the merged policy goes (default stdout)")
    p.set_defaults(func=run_plan)


def _class_spec(spec: str, index: int) -> tuple[str, dict[str, object]]:
    name, _, rest = spec.rpartition("=") if "=" in spec else (f"class{index}", "", spec)
    parts = rest.split(":")
    try:
        body: dict[str, object] = {"qps": float(parts[0])}
    except ValueError as exc:
        raise PlanInputError(f"--qps {spec}", "expected [CLASS=]QPS[:LANE[:TTFT]]") from exc
    if len(parts) > 1 and parts[1]:
        body["lane"] = parts[1]
    if len(parts) > 2 and parts[2]:
        body["ttft"] = parts[2]
    return name, body


def _tenant_spec(spec: str) -> tuple[str, dict[str, object]]:
    name, _, rest = spec.partition("=")
    avg, _, burst = rest.partition(":")
    try:
        return name, {"avg_qps": float(avg), "burst": float(burst)}
    except ValueError as exc:
        raise PlanInputError(f"--tenant {spec}", "expected TIER=AVG_QPS:BURST") from exc


def flags_mapping(args: argparse.Namespace) -> dict[str, object]:
    """The planner mapping the flags describe (only what was given)."""
    m: dict[str, object] = {}
    backend = {
        k: v
        for k, v in {
            "profile": args.profile,
            "decode_tok_s": args.decode_tok_s,
            "prefill_tok_s": args.prefill_tok_s,
            "max_running_requests": args.max_running_requests,
            "max_total_tokens": args.max_total_tokens,
            "min_itl": args.min_itl,
        }.items()
        if v is not None
    }
    if backend:
        m["backend"] = backend
    for name in ("prompt", "output"):
        dist = {
            k: v
            for k, v in {
                "mean": getattr(args, f"{name}_mean"),
                "p95": getattr(args, f"{name}_p95"),
            }.items()
            if v is not None
        }
        if dist:
            m[f"{name}_tokens"] = dist
    budgets = {k: v for k, v in {"ttft": args.ttft, "tbt": args.tbt}.items() if v is not None}
    if budgets:
        m["budgets"] = budgets
    if args.qps:
        m["classes"] = dict(_class_spec(s, i) for i, s in enumerate(args.qps, start=1))
    if args.tenant:
        m["tenants"] = dict(_tenant_spec(s) for s in args.tenant)
    scalars = {
        "samples": args.samples,
        "target_utilization": args.utilization,
        "prefix_cache_hit_rate": args.prefix_hit_rate,
        "max_replicas": args.max_replicas,
        "quantile": args.quantile,
        "pool": args.pool,
        "models": args.model_name,
    }
    m.update({k: v for k, v in scalars.items() if v is not None})
    return m


def build_plan(args: argparse.Namespace) -> Plan:
    """Inputs from the file (if any) overridden by flags, then the plan."""
    base: dict[str, object] = {}
    base_dir = None
    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8")
        except OSError as exc:
            raise PlanInputError(str(args.file), f"cannot read: {exc}") from exc
        base = read_planner_section(text, str(args.file))
        base_dir = args.file.parent
    flags = flags_mapping(args)
    if "backend" in flags:  # a backend from flags replaces the file's, it does not mix
        base.pop("backend", None)
    if "samples" in flags:
        base.pop("prompt_tokens", None)
        base.pop("output_tokens", None)
    inputs = inputs_from_mapping(merge(base, flags), base_dir)
    return make_plan(inputs, cast(Model, args.queue_model), envoys=max(1, args.envoys))


def _merged_policy(plan: Plan, policy_path: Path) -> str:
    from policy import load_policy_text

    text = policy_path.read_text(encoding="utf-8")
    base = yaml.safe_load(text) or {}
    merged = yaml.safe_dump(merge(base, fragment(plan)), sort_keys=False)
    load_policy_text(merged, filename=f"{policy_path} + plan", base_dir=policy_path.parent)
    return merged


def run_plan(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Handler of ``tokenweir plan``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        plan = build_plan(args)
    except PlanInputError as exc:
        print(f"tokenweir plan: bad input: {exc}", file=err)
        return EXIT_INPUT
    except InfeasibleError as exc:
        print(f"tokenweir plan: {exc}", file=err)
        return EXIT_INFEASIBLE
    out.write(plan_json(plan) + "\n" if args.format == "json" else plan_text(plan))
    if args.plot is not None:
        plot_wait_vs_utilization(
            plan.inputs, plan.capacity, args.plot, plan.utilization, axis=plan.model
        )
        print(f"wrote {args.plot}", file=err)
    if args.fragment is not None:
        args.fragment.write_text(fragment_yaml(plan), encoding="utf-8")
        print(f"wrote {args.fragment}", file=err)
    if args.merge_into is not None:
        from policy import PolicyError

        try:
            merged = _merged_policy(plan, args.merge_into)
        except (OSError, PolicyError) as exc:
            print(f"tokenweir plan: the merged policy does not validate:\n{exc}", file=err)
            return EXIT_POLICY
        if args.output is not None:
            args.output.write_text(merged, encoding="utf-8")
            print(f"wrote {args.output}", file=err)
        else:
            out.write(merged)
    return 0
