"""The bench's output: markdown tables for people, a JSON document for machines."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.bench.runner import BenchResult
from gateway.bench.stats import Dist, LevelStats


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    ms = value * 1000.0
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def _dist(d: Dist) -> str:
    if not d.count:
        return "-"
    return " / ".join(_ms(v) for v in (d.p50, d.p90, d.p99, d.max))


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _errors(s: LevelStats) -> str:
    return ", ".join(f"{kind}: {n}" for kind, n in s.errors.items()) or "0"


def _token_source(result: BenchResult) -> str:
    sources: dict[str, int] = {}
    for levels in result.levels.values():
        for s in levels:
            for k, v in s.token_sources.items():
                sources[k] = sources.get(k, 0) + v
    if set(sources) <= {"usage"}:
        return "from the endpoint's `usage`"
    parts = ", ".join(f"{k}: {v} requests" for k, v in sorted(sources.items()))
    note = " (`chunks` = content events counted, an approximation: the endpoint sent no usage)" if "chunks" in sources else ""
    return parts + note


def _length_held(result: BenchResult) -> str:
    if not result.plan.targets[0].hold_length:
        return "not requested (--no-hold-length)"
    verdicts = {s.length_held for levels in result.levels.values() for s in levels}
    if verdicts == {"yes"}:
        return "yes: min_tokens/ignore_eos sent, and every answer had exactly max_tokens"
    return "requested with min_tokens/ignore_eos; " + "; ".join(sorted(verdicts - {"yes"}))


def render(result: BenchResult) -> str:
    plan = result.plan
    lines = ["## enginegate bench", ""]
    for t in plan.targets:
        lines.append(f"- **{t.name}**: {t.url} (model `{t.model}`, {'streamed' if t.stream else 'not streamed'})")
    budget = ("every session's turns per level (c = sessions in flight, arrivals = sessions starting per second)"
              if plan.sessions is not None
              else f"{plan.duration_s:g} s per level" if plan.duration_s is not None
              else f"{plan.requests} requests per level" if plan.requests is not None
              else "max(16, 4 x concurrency) or max(16, 10 s x rate) requests per level")
    lines += [
        f"- workload: {workload(result)}; {budget}; {plan.warmup} warm-up requests per endpoint, not counted;"
        f" seed {plan.seed} (every level and endpoint gets its own prompts)",
        f"- output length held: {_length_held(result)}",
        f"- token counts: {_token_source(result)}",
        f"- SLO for goodput: {plan.slo.describe()}",
    ]
    if result.ceiling is not None:
        c = result.ceiling
        lines.append(f"- bench ceiling (an endpoint that answers at once, same answer length, c={c.concurrency}): "
                     f"{c.request_rate:,.0f} req/s, {c.event_rate:,.0f} events/s, client at "
                     f"{c.client_cpu_fraction:.0%} of a core")
    lines.append(f"- wall time: {result.wall_s:.1f} s")
    multi = len(plan.targets) > 1
    head = (["endpoint"] if multi else []) + ["level"]
    throughput, latency, errors = [], [], []
    for i in range(len(plan.levels)):
        for t in plan.targets:
            s = result.levels[t.name][i]
            key = ([t.name] if multi else []) + [s.label]
            good = "-" if s.goodput_rps is None else f"{s.goodput_rps:.2f} ({s.goodput_fraction:.0%})"
            throughput.append(key + [f"{s.ok}/{s.sent}", _errors(s), _num(s.request_rate, 2), _num(s.input_tps),
                                     _num(s.output_tps), good])
            latency.append(key + [_dist(s.ttft), _dist(s.tpot), _dist(s.itl), _dist(s.e2e)])
            errors += [key + [kind, example] for kind, example in s.error_examples.items()]
    lines += ["", "### Throughput", "",
              table(head + ["ok/sent", "errors", "req/s", "input tok/s", "output tok/s", "goodput req/s"], throughput),
              "", "### Latency (ms): p50 / p90 / p99 / max", "",
              table(head + ["TTFT", "TPOT", "ITL", "E2E"], latency)]
    if errors:
        lines += ["", "### First error of each kind", "",
                  table(head + ["error", "example"], [[*r[:-1], r[-1].replace("|", "\\|")[:120]] for r in errors])]
    if plan.sessions is not None:
        lines += ["", turn_table(result), "", prompt_work_table(result)]
    if multi:
        lines += ["", compare_table(result)]
    notes = sorted({n for levels in result.levels.values() for s in levels for n in s.notes})
    if notes or result.warnings:
        lines += ["", "### Notes", ""] + [f"- {n}" for n in notes] + [f"- warning: {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def workload(result: BenchResult) -> str:
    plan = result.plan
    return plan.sessions.describe() if plan.sessions is not None else plan.source.describe()


def turn_table(result: BenchResult) -> str:
    """TTFT turn by turn: with a prefix cache, later turns (longer conversations) answer as fast as the
    first only where the conversation so far is still cached."""
    multi = len(result.plan.targets) > 1
    head = (["endpoint"] if multi else []) + ["level", "turn", "ok/sent", "prompt tokens (mean)", "cached",
                                              "TTFT p50", "TTFT p99"]
    rows = []
    for i in range(len(result.plan.levels)):
        for t in result.plan.targets:
            s = result.levels[t.name][i]
            for turn in s.turns:
                rows.append(([t.name] if multi else []) + [
                    s.label, str(turn.turn), f"{turn.ok}/{turn.sent}", _num(turn.prompt_tokens_mean, 0),
                    _pct(turn.cached_fraction), _ms(turn.ttft.p50), _ms(turn.ttft.p99)])
    note = ("\n\n`cached`: the share of prompt tokens the endpoint said it served from its cache "
            "(`usage.prompt_tokens_details.cached_tokens`; `-` where it does not say)")
    return "### Per turn (TTFT in ms)\n\n" + table(head, rows) + note


def prompt_work_table(result: BenchResult) -> str:
    """Prompt tokens the endpoint computed against the least a perfect prefix cache would: the figure
    that tells routing policies apart when TTFT moves from run to run."""
    multi = len(result.plan.targets) > 1
    head = (["endpoint"] if multi else []) + ["level", "prompt tokens", "computed", "minimum", "computed/min",
                                              "TTFT p50", "TTFT p90", "output tok/s"]
    rows = []
    for i in range(len(result.plan.levels)):
        for t in result.plan.targets:
            s = result.levels[t.name][i]
            w = s.prompt_work
            rows.append(([t.name] if multi else []) + [
                s.label, _num(w.prompt_tokens if w else None, 0), _num(w.computed if w else None, 0),
                _num(w.minimum if w else None, 0), "-" if w is None or w.ratio is None else f"{w.ratio:.2f}x",
                _ms(s.ttft.p50), _ms(s.ttft.p90), _num(s.output_tps)])
    note = ("\n\n`computed`: prompt tokens minus `usage.prompt_tokens_details.cached_tokens`, summed over the "
            "answers (`-` where the endpoint does not report cached tokens). `minimum`: what a perfect cache "
            "computes, from usage: the shared system prompt once, each session's first prompt beyond it once, "
            "then per later turn prompt - previous prompt - previous reply")
    return "### Prompt tokens computed against a perfect cache (TTFT in ms)\n\n" + table(head, rows) + note


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.3f}"


def compare_table(result: BenchResult) -> str:
    base, other = result.plan.targets[0].name, result.plan.targets[1].name
    rows = []
    for a, b in zip(result.levels[base], result.levels[other]):
        delta = None if a.ttft.p50 is None or b.ttft.p50 is None else b.ttft.p50 - a.ttft.p50
        rows.append([a.label, _ratio(a.request_rate, b.request_rate), _ratio(a.output_tps, b.output_tps),
                     _ratio(a.ttft.p50, b.ttft.p50), _ratio(a.ttft.p99, b.ttft.p99), _ratio(a.tpot.p50, b.tpot.p50),
                     _ratio(a.tpot.p99, b.tpot.p99), _ratio(a.e2e.p50, b.e2e.p50),
                     "-" if delta is None else f"{delta * 1000:+.2f}"])
    header = ["level", "req/s", "output tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50",
              "TTFT p50 diff (ms)"]
    return f"### Ratios: {other} / {base}\n\n" + table(header, rows)


def to_json(result: BenchResult) -> dict[str, Any]:
    plan = result.plan
    return {
        "units": {"latency": "seconds", "rates": "per second"},
        "targets": [dataclasses.asdict(t) | {"url": t.url, "api_key": bool(t.api_key)} for t in plan.targets],
        "levels": [dataclasses.asdict(level) | {"label": level.label} for level in plan.levels],
        "workload": workload(result),
        "sessions": None if plan.sessions is None else dataclasses.asdict(plan.sessions),
        "requests_per_level": plan.requests,
        "duration_s_per_level": plan.duration_s,
        "warmup": plan.warmup,
        "seed": plan.seed,
        "slo": dataclasses.asdict(plan.slo),
        "ceiling": None if result.ceiling is None else dataclasses.asdict(result.ceiling),
        "results": {name: [dataclasses.asdict(s) for s in levels] for name, levels in result.levels.items()},
        "warnings": result.warnings,
        "started_at": result.started_at,
        "wall_s": result.wall_s,
    }
