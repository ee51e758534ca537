"""The ranked table and the trade-off plot of a record."""

from __future__ import annotations

from pathlib import Path

from gateway.tuning.report import plot, render
from tests.unit.tuning.helpers import planned, record, result


def _record():  # type: ignore[no-untyped-def]
    base = planned()
    return record([
        result("llama_server", base.options, goodput=1.0, label="threads=1 parallel=2 (planned)"),
        result("llamacpp", planned("llamacpp").options, goodput=2.0, label="threads=1 parallel=2 (planned)"),
        result("llama_server", base.options, goodput=0, status="failed", label="threads=2 parallel=2"),
    ])


def test_table_ranks_measured_first_and_shows_failures_with_why() -> None:
    text = render(_record())
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| rank")]
    assert rows[0].startswith("| 1 | llamacpp |") and rows[1].startswith("| 2 | llama_server |")
    assert rows[2].startswith("| - | llama_server | threads=2 parallel=2 |") and "failed: it broke" in rows[2]
    assert "winner: llamacpp" in text and "concurrency 2" in text


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "tune.png"
    plot(_record(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
