"""Latency against load: output throughput on x, TTFT and TPOT (p50 solid, p99 dashed) on y."""

from __future__ import annotations

from pathlib import Path

from gateway.bench.runner import BenchResult


def plot(result: BenchResult, path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415 - optional extra `bench`

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'enginegate[bench]'") from None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for n, (name, levels) in enumerate(result.levels.items()):
        color = colors[n % len(colors)]
        x = [s.output_tps for s in levels]
        for ax, metric in zip(axes, ("ttft", "tpot")):
            for pct, style in (("p50", "-"), ("p99", "--")):
                y = [getattr(getattr(s, metric), pct) for s in levels]
                pts = [(a, b * 1000.0) for a, b in zip(x, y) if b is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color,
                            label=f"{name} {pct}")
            for s, xv in zip(levels, x):
                value = getattr(s, metric).p50
                if value is not None:
                    ax.annotate(s.label, (xv, value * 1000.0), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color=color)
    for ax, title in zip(axes, ("Time to first token", "Time per output token")):
        ax.set_title(title)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
        low, high = ax.get_ylim()
        values = [v for line in ax.get_lines() for v in line.get_ydata() if v > 0]
        if values and max(values) / min(values) > 30:
            ax.set_yscale("log")  # a saturated level would flatten every other point
        else:
            ax.set_ylim(bottom=0, top=high)
        ax.legend(fontsize=8)
    fig.suptitle(f"enginegate bench: {result.plan.source.describe()}", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
