"""A tune record as a ranked table, and as a picture of its trade-offs."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gateway.planning.measured import VariantResult
from gateway.tuning.record import TuneRecord


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _row(n: int, r: VariantResult) -> str:
    mem = "-" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.0f}"
    note = r.reason or ""
    if r.ok:
        rank = str(n)
    else:
        rank = "-"
        note = f"{r.status.replace('_', ' ')}: {note}"
    return (f"| {rank} | {r.engine} | {r.label} | {_num(r.decode_tokens_per_s)} | {_num(r.predicted_decode_tokens_per_s)} "
            f"| {_num(r.output_tokens_per_s)} | {_ms(r.ttft_p50_s)} / {_ms(r.ttft_p99_s)} | {_ms(r.tpot_p50_s)} / "
            f"{_ms(r.tpot_p99_s)} | {_num(r.goodput_rps, '.2f')} | {mem} | {_num(r.load_s)} | {note.replace('|', '/')[:160]} |")


def render(record: TuneRecord) -> str:
    w = record.workload
    slo = ", ".join(f"{k} <= {v * 1000:g} ms" for k, v in record.slo.items() if v is not None) or "none"
    c = w.concurrency
    lines = [
        f"enginegate tune: {record.model.name} on {record.host.cpu} ({record.host.logical_cores} threads"
        + (f", {', '.join(record.host.gpus)}" if record.host.gpus else "") + f"), {record.created}",
        f"workload: {w.prompt_tokens} -> {w.output_tokens} tokens, concurrency {c}; goodput SLO {slo}; "
        f"planned {record.planned.get('engine')}; took {record.wall_s:.0f} s of a {record.budget_s:g} s budget",
        "",
        f"| rank | engine | variant | tok/s alone | predicted bound | tok/s at c={c} | TTFT p50 / p99 ms | "
        f"TPOT p50 / p99 ms | goodput req/s | peak MiB | load s | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    n = 0
    for r in record.results:
        n += r.ok
        lines.append(_row(n, r))
    win = record.winner
    if win is not None:
        lines += ["", f"winner: {win.describe()} (options: "
                      + ", ".join(f"{k}={v}" for k, v in win.options.items()) + ")"]
    versions = ", ".join(f"{e} {v}" for e, v in record.engine_versions.items())
    lines.append(f"engines: {versions or 'none measured'}")
    return "\n".join(lines)


def _short(label: str) -> str:
    return label.replace("kv_cache_type=", "kv=").replace(" (planned)", " *")


def plot(record: TuneRecord, path: Path) -> None:
    """Left: throughput at the workload's concurrency against TTFT p50 (marker area ~ peak memory).
    Right: each variant's decode rate alone, measured against the planner's uncalibrated bound."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra `bench`

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'enginegate[bench]'") from None
    ok = [r for r in record.results if r.ok]
    engines = list(dict.fromkeys(r.engine for r in record.results))
    colors = {e: c for e, c in zip(engines, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"))}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    biggest = max((r.peak_memory_bytes or 0 for r in ok), default=0) or 1
    fastest = max((r.output_tokens_per_s or 0 for r in ok), default=0)
    for r in ok:
        if r.output_tokens_per_s is None or r.ttft_p50_s is None:
            continue
        size = 60 + 400 * (r.peak_memory_bytes or 0) / biggest
        left.scatter(r.output_tokens_per_s, r.ttft_p50_s * 1000, s=size, color=colors[r.engine], alpha=0.6,
                     edgecolors="black", label=r.engine)
        right_half = r.output_tokens_per_s > 0.6 * fastest
        note = left.annotate(_short(r.label), (r.output_tokens_per_s, r.ttft_p50_s * 1000),
                             textcoords="offset points", xytext=(-8 if right_half else 8, 8), fontsize=7,
                             ha="right" if right_half else "left")
        note.set_in_layout(False)
    handles, labels = left.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    left.legend(unique.values(), unique.keys(), fontsize=8, markerscale=0.5)
    left.margins(x=0.15, y=0.15)  # room for the labels beside the points
    left.set_xlabel(f"output tokens/s at concurrency {record.workload.concurrency}")
    left.set_ylabel("TTFT p50 (ms)")
    left.set_title("Throughput against first-token latency (area: peak memory; * planned)")
    left.grid(True, alpha=0.3)
    names = [r.engine + "\n" + "\n".join(textwrap.wrap(_short(r.label), 16)) for r in ok]
    xs = range(len(ok))
    right.bar([x - 0.2 for x in xs], [r.decode_tokens_per_s or 0 for r in ok], width=0.4, label="measured",
              color=[colors[r.engine] for r in ok])
    right.bar([x + 0.2 for x in xs], [r.predicted_decode_tokens_per_s or 0 for r in ok], width=0.4,
              label="planner's bound (uncalibrated)", color="lightgray", edgecolor="gray")
    right.set_xticks(list(xs), names, fontsize=7)
    right.set_ylabel("decode tokens/s, one sequence")
    right.set_title("Measured against predicted")
    right.legend(fontsize=8)
    right.grid(True, axis="y", alpha=0.3)
    failed = [r for r in record.results if not r.ok]
    w = record.workload
    title = (f"enginegate tune: {record.model.name}, {w.prompt_tokens} -> {w.output_tokens} tokens, "
             f"concurrency {w.concurrency}, {record.host.cpu}, {record.created}")
    if failed:
        title += "\nnot measured: " + "; ".join(f"{r.engine} {r.label} ({r.status.replace('_', ' ')})"
                                                for r in failed)[:180]
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
