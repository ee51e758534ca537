"""`enginegate plan`: which engine would serve a model here, with which options, and why."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from gateway.hardware import HardwareSnapshot, detect
from gateway.lora import plan as lora_plan
from gateway.modelsource import ModelSourceError, embedded_model_path
from adapters import registry
from gateway.planning import (
    NoEngineError,
    Plan,
    SpecError,
    Workload,
    installed_set,
    load_spec,
    load_workload,
    plan,
)
from gateway.planning.explain import params_line, weights_line
from gateway.planning.measured import VariantResult
from gateway.planning.workload import validation_message
from gateway.tuning import apply_tuning, lookup


def describe(p: Plan) -> str:
    """Candidates in the rules' order of preference; those that failed a hard constraint say so."""
    lines = [f"engine   {p.engine}" + ("" if p.installed else "  (not installed)")]
    lines += [f"options  {k}={v}" for k, v in p.options.items()]
    lines += [f"why      {r}" for r in p.reasons]
    lines += [f"feature  {f.describe()}" for f in p.features]
    lines += _figures(p)
    lines += _measured(p)
    lines += _lora(p)
    lines += [f"warning  {w}" for w in p.warnings]
    lines += [f"assumed  {a}" for a in p.assumed]
    lines += [f"note     {n}" for n in p.notes]
    failed = {r.engine for r in p.rejected}
    lines += [
        f"ranked   {c.rank}. {c.engine} [rule: {c.rule}]" + (" -> rejected below" if c.engine in failed else "")
        for c in p.candidates
    ]
    grouped: dict[str, list[str]] = {}
    for r in p.rejected:
        grouped.setdefault(r.engine, []).append(r.detail + (f" ({r.install})" if r.install else ""))
    lines += [f"rejected {engine}: {'; '.join(details)}" for engine, details in grouped.items()]
    return "\n".join(lines)


def _figures(p: Plan) -> list[str]:
    """The capacity figures on their own lines: memory, concurrency at typical and full context, GPUs, speed."""
    c = p.capacity
    if c is None:
        return []
    weights = weights_line(p.spec) if p.spec is not None else None
    params = params_line(p.spec) if p.spec is not None else None
    lines = ([f"weights  {weights}"] if weights else []) + ([f"params   {params}"] if params else [])
    usable = f"{c.usable_bytes / 1e9:.1f} GB usable" if c.memory_known else "memory size unknown"
    lines += [
        f"memory   {c.required_bytes / 1e9:.1f} GB needed ({c.kv_sizing} KV), {usable} in {c.memory}"
        + (f" x {c.replicas} replicas" if c.replicas > 1 else "")
    ]
    if c.memory_known and c.fit != "none":
        lines.append(
            f"kv room  {c.kv_pool_bytes / 1e9:.1f} GB: {c.concurrency_at_typical} sequences at once of "
            f"{c.sequence_tokens} tokens (typical), {c.concurrency_at_full} at the full {c.context_length}"
            + (" per replica" if c.replicas > 1 else "")
        )
    if c.gpus or c.free_gpus:
        used = ",".join(map(str, c.gpus)) or "none"
        free = ",".join(map(str, c.free_gpus)) or "none"
        lines.append(f"gpus     used {used} (tensor parallel {p.options.get('tensor_parallel', 1)}, "
                     f"pipeline {p.options.get('pipeline_parallel', 1)}); free {free}")
    if c.decode_tokens_per_s is not None:
        agg = (
            f"; <= {c.aggregate_tokens_per_s:.0f} tokens/s aggregate over {c.concurrency}"
            if c.aggregate_tokens_per_s is not None and c.concurrency > 1
            else ""
        )
        cal = p.calibration
        if cal is not None and cal.decode_tokens_per_s is not None:
            bound = f"<= {cal.bound_decode_tokens_per_s:.1f}" if cal.bound_decode_tokens_per_s else "unknown"
            agg = agg.replace("<= ", "~")
            lines.append(f"speed    ~{c.decode_tokens_per_s:.1f} tokens/s per sequence{agg} "
                         f"(calibrated on this host; uncalibrated bound {bound})")
        else:
            lines.append(f"speed    <= {c.decode_tokens_per_s:.1f} tokens/s per sequence{agg}")
    if c.prefill_seconds is not None:
        cal = p.calibration
        note = " (calibrated on this host)" if cal is not None and cal.prefill_s is not None else " (bound)"
        lines.append(f"prefill  ~{c.prefill_seconds * 1000:.0f} ms for {c.prompt_tokens} prompt tokens{note}")
    if p.calibration is not None:
        lines.append(f"calib    {p.calibration.describe()}")
    return lines


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _lora(p: Plan) -> list[str]:
    """The adapters, the engine's LoRA flags, and what they cost in memory."""
    lo = p.lora
    if lo is None:
        return []
    lines = [f"lora     {a.name}: {a.path} ({_mb(a.bytes)}), scale {a.scale:g}" for a in lo.adapters]
    if lo.note:
        return lines + [f"lora     {lo.note}"]
    if lo.slots is not None:
        lines.append(f"lora     loading {lo.loading}: {lo.loaded_at_once} loaded at once, {lo.slots} in a batch, "
                     f"max rank {lo.max_rank}")
    else:
        lines.append(f"lora     loading {lo.loading}: every file ({lo.loaded_at_once}), applied by each request's scales")
    lines.append(f"lora     flags {' '.join(lo.engine_flags)}")
    reserve = f"; the slots reserve >= {_mb(lo.slot_bytes)} of buffers" if lo.slot_bytes is not None else ""
    lines.append(f"lora     memory {_mb(lo.file_bytes)} of adapter files beside the weights{reserve}")
    return lines


def _adapters(values: list[str]) -> list[dict[str, object]]:
    """`--adapter NAME=PATH[@SCALE]`, as `options.lora_adapters` entries."""
    out: list[dict[str, object]] = []
    for value in values:
        name, sep, rest = value.partition("=")
        path, _, scale = rest.rpartition("@") if "@" in rest else (rest, "", "")
        if not sep or not name or not path:
            raise ValueError(f"--adapter {value!r}: give NAME=PATH or NAME=PATH@SCALE")
        if not Path(path).expanduser().exists():
            raise ValueError(f"--adapter {name}: {path} does not exist")
        out.append({"name": name, "path": str(Path(path).expanduser().resolve()),
                    "scale": float(scale) if scale else 1.0})
    return out


def _lora_options(args: argparse.Namespace) -> dict[str, object]:
    given = {"max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank, "lora_loading": args.lora_loading,
             "max_loaded_loras": args.max_loaded_loras}
    return {k: v for k, v in given.items() if v is not None}


def _measured(p: Plan) -> list[str]:
    """The tune record's results, ranked, each measured figure next to what the planner predicted."""
    m = p.measured
    if m is None:
        return []
    lines = [f"measured {m.record} ({m.created})" + ("; the plan takes the winner" if m.taken else "")]
    rank = 0
    for r in m.results:
        rank += r.ok
        lines.append(f"measured {rank if r.ok else '-'}. {r.describe()}: {_result(r)}")
    return lines


def _result(r: VariantResult) -> str:
    if not r.ok:
        return f"{r.status.replace('_', ' ')}: {r.reason}"
    parts = []
    if r.decode_tokens_per_s is not None:
        bound = f" (predicted <= {r.predicted_decode_tokens_per_s:.1f})" if r.predicted_decode_tokens_per_s else ""
        parts.append(f"{r.decode_tokens_per_s:.1f} tokens/s alone{bound}")
    if r.output_tokens_per_s is not None and r.concurrency > 1:
        parts.append(f"{r.output_tokens_per_s:.1f} tokens/s at c={r.concurrency}")
    if r.ttft_p50_s is not None:
        parts.append(f"TTFT p50 {r.ttft_p50_s * 1000:.0f} ms")
    if r.goodput_rps is not None:
        parts.append(f"goodput {r.goodput_rps:.2f} req/s")
    if r.peak_memory_bytes:
        parts.append(f"peak {r.peak_memory_bytes / 2**20:.0f} MiB")
    return ", ".join(parts)


def _snapshot(path: Path) -> HardwareSnapshot:
    try:
        return HardwareSnapshot.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise ValueError(validation_message(path, exc) + " (expected `enginegate detect --json` output)") from None


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(Path(args.model) if args.model else embedded_model_path())
        snapshot = _snapshot(Path(args.hardware)) if args.hardware else detect()
        workload = load_workload(Path(args.workload)) if args.workload else Workload()
        installed = None
        if args.installed is not None:
            names = {n.strip() for n in args.installed.split(",") if n.strip()}
            unknown = names - set(registry.names())
            if unknown:
                raise ValueError(
                    f"--installed: unknown engine(s) {', '.join(sorted(unknown))}; known: {', '.join(registry.names())}"
                )
            installed = installed_set(names)
        rules = Path(args.rules) if args.rules else None
        decision = plan(snapshot, spec, workload, requested_engine=args.engine, installed=installed, rules=rules)
        if args.tune:
            decision = apply_tuning(decision, lookup(snapshot, Path(spec.path), workload))
        adapters = _adapters(args.adapter)
        switch = lora_plan.engine_for_adapters(decision.engine) if adapters and args.engine == "auto" else None
        if switch is not None:  # as `serve` does: an engine that selects an adapter per request
            again = plan(snapshot, spec, workload, requested_engine=switch, installed=installed, rules=rules)
            why = (f"{len(adapters)} LoRA adapter(s): served by {switch}, which selects one per request "
                   f"(the plan's {decision.engine} loads one adapter per context)")
            decision = again.model_copy(update={"reasons": (*again.reasons, why)})
        decision = lora_plan.for_plan(decision, adapters, _lora_options(args))
    except (SpecError, NoEngineError, ModelSourceError, FileNotFoundError, ValueError, registry.UnknownEngineError) as exc:
        print(f"enginegate plan: {exc}", file=sys.stderr)
        return 2
    print(decision.model_dump_json(indent=2) if args.json else describe(decision))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plan", help="choose an engine for a model on this host and explain why")
    p.add_argument(
        "--model",
        help="a .gguf file, a model directory with config.json, or a ModelSpec JSON (default: the embedded SmolLM2)",
    )
    p.add_argument("--hardware", help="a HardwareSnapshot JSON (from `enginegate detect --json`) instead of detecting")
    p.add_argument(
        "--workload",
        help="a workload YAML (prompt_tokens, output_tokens, context_length, concurrency, mode, objective, "
             "shared_prefix, output_copies_prompt, kv_dtype...)",
    )
    p.add_argument("--engine", default="auto", help="force an engine; its failed constraints become warnings")
    p.add_argument("--rules", help="a selection rules YAML that overrides the built-in gateway/data/selection.yaml")
    p.add_argument("--installed", help="comma-separated engines to treat as installed (default: check this machine)")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH[@SCALE]",
                   help="a LoRA adapter served over the model (repeat for more): the plan shows the engine's LoRA "
                        "flags and what they cost")
    p.add_argument("--max-loras", type=int, help="LoRA adapters in one batch (vLLM, SGLang); default min(adapters, 4)")
    p.add_argument("--max-lora-rank", type=int, help="the rank LoRA buffers are sized for; default the adapters' own")
    p.add_argument("--lora-loading", choices=["start", "runtime"], help="adapters registered at start, or loaded "
                   "by the gateway on first use (vLLM, SGLang)")
    p.add_argument("--max-loaded-loras", type=int, help="with --lora-loading runtime: adapters loaded at once")
    p.add_argument("--json", action="store_true", help="print the Plan as JSON (engine at the top level)")
    p.add_argument("--no-tune", dest="tune", action="store_false",
                   help="ignore `enginegate tune` records: the prediction alone")
    p.set_defaults(func=run)
