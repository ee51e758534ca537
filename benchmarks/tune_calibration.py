"""Does calibration hold? Tune once, then plan and measure again: calibrated prediction against measurement.

    python -m benchmarks.tune_calibration [--budget-seconds 200] [--out docs/tune] [--requests 6]

1. Measures this host's copy bandwidth (as `enginegate doctor` does) into a private cache, so the
   planner has its uncalibrated bound; nothing is written to ~/.cache/enginegate.
2. Runs `enginegate tune` on workload A (128 -> 64 tokens, 2 streams) over in-process llama.cpp and
   llama-server into a fresh tune cache: its table, JSON record and plot go to --out.
3. Plans workload A (the record matches: the measured winner, calibrated) and workload B (256 -> 128
   tokens, 1 stream: no record, calibrated from A's) with and without the record.
4. Serves each plan's engine and options again and measures decode per sequence and prefill,
   then prints predicted (uncalibrated bound, calibrated) against measured, and writes that table too.

The target: calibrated decode within 15 % of measured. On a shared machine both numbers move
with the load; compare the ratios from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gateway.bench import SLO
from gateway.hardware import detect
from gateway.hardware.bandwidth import measure_memory_bandwidth, save_measurement
from gateway.modelsource import embedded_model_path
from gateway.planning import Plan, Workload, load_spec, plan
from gateway.tuning import apply_tuning, lookup
from gateway.tuning.record import TuneRecord
from gateway.tuning.runner import measure
from gateway.tuning.variants import Variant, label

REPO_ROOT = Path(__file__).resolve().parents[1]
A = Workload(prompt_tokens=128, output_tokens=64, concurrency=2, context_length=1024)
B = Workload(prompt_tokens=256, output_tokens=128, concurrency=1, context_length=1024)


def _tps(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} tok/s"


def _pct(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "-"
    return f"{measured / predicted:.2f}"


async def _measure(p: Plan, w: Workload, requests: int) -> tuple[float | None, float | None]:
    v = Variant(p.engine, dict(p.options), label(p.options), 0.0)
    r = await measure(v, embedded_model_path(), w.model_copy(update={"concurrency": 1}), slo=SLO(),
                      requests=requests, levels=[1], start_timeout_s=300, seed=int(time.time()), say=print)
    if not r.ok:
        raise SystemExit(f"{p.engine} failed: {r.reason}")
    return r.decode_tokens_per_s, r.prefill_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-seconds", type=float, default=200)
    ap.add_argument("--requests", type=int, default=6, help="requests per level, in tune and in each re-measurement")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "tune")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix="enginegate-calibration-"))
    os.environ["ENGINEGATE_CACHE_DIR"] = str(private / "cache")  # the bandwidth measurement
    os.environ["ENGINEGATE_TUNE_DIR"] = str(private / "tune")
    snapshot = detect()
    gbps = measure_memory_bandwidth()
    save_measurement(gbps, snapshot.cpu.model)
    snapshot = detect()
    print(f"copy bandwidth {gbps:.1f} GB/s (private cache {private})")

    workload = private / "a.yaml"
    workload.write_text(yaml.safe_dump(A.model_dump(exclude_defaults=True)))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "tune", "--workload", str(workload), "--engines", "llamacpp,llama_server",
         "--budget-seconds", str(args.budget_seconds), "--requests", str(args.requests), "--json",
         "--plot", str(args.out / "tune.png")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, timeout=args.budget_seconds * 3 + 300, check=False)
    tune_s = time.perf_counter() - started
    if done.returncode != 0:
        print(f"tune failed ({done.returncode})", file=sys.stderr)
        return 1
    record = TuneRecord.model_validate_json(done.stdout)
    from gateway.tuning.report import render  # noqa: PLC0415

    (args.out / "tune.md").write_text(render(record) + "\n")
    (args.out / "record.json").write_text(record.model_dump_json(indent=2) + "\n")

    spec = load_spec(embedded_model_path())
    rows = []
    for name, w in (("A: 128 -> 64, 2 streams (the tuned workload)", A), ("B: 256 -> 128, 1 stream (no record)", B)):
        before = plan(snapshot, spec, w)
        after = apply_tuning(plan(snapshot, spec, w), lookup(snapshot, embedded_model_path(), w))
        assert before.capacity is not None and after.capacity is not None
        decode, prefill = asyncio.run(_measure(after, w, args.requests))
        cal = after.calibration
        rows.append({
            "workload": name, "engine": f"{after.engine} {label(after.options)}",
            "bound": before.capacity.decode_tokens_per_s, "calibrated": after.capacity.decode_tokens_per_s,
            "measured": decode, "prefill_calibrated": after.capacity.prefill_seconds, "prefill_measured": prefill,
            "records": cal.records if cal else 0,
        })
    lines = [
        f"copy bandwidth {gbps:.1f} GB/s; tune took {tune_s:.0f} s (record: {record.wall_s:.0f} s of a "
        f"{record.budget_s:g} s budget)", "",
        "| workload | plan after tune | decode bound (uncalibrated) | calibrated prediction | measured | measured / calibrated "
        "| within 15 % | prefill calibrated | prefill measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = _pct(r["calibrated"], r["measured"])
        within = "-" if ratio == "-" else ("yes" if abs(float(ratio) - 1) <= 0.15 else "no")
        bound = "-" if r["bound"] is None else f"<= {r['bound']:.1f} tok/s"
        pc = "-" if r["prefill_calibrated"] is None else f"{r['prefill_calibrated'] * 1000:.0f} ms"
        pm = "-" if r["prefill_measured"] is None else f"{r['prefill_measured'] * 1000:.0f} ms"
        lines.append(f"| {r['workload']} | {r['engine']} | {bound} | {_tps(r['calibrated'])} | "
                     f"{_tps(r['measured'])} | {ratio} | {within} | {pc} | {pm} |")
    text = "\n".join(lines)
    print(text)
    (args.out / "calibration.md").write_text(text + "\n")
    (args.out / "calibration.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
