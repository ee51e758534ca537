"""`enginegate tune`: measure the planner's candidates on this host and record which one wins."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from adapters import registry
from gateway.bench import SLO
from gateway.hardware import detect
from gateway.modelsource import ModelSourceError, embedded_model_path
from gateway.planning import NoEngineError, SpecError, Workload, load_workload
from gateway.tuning.record import save, tune_dir
from gateway.tuning.report import plot, render
from gateway.tuning.tune import TuneRequest, tune
from gateway.tuning.variants import MAX_VARIANTS, TuneError

T = TypeVar("T")

DEFAULT_BUDGET_S = 120.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "tune", help="measure the planner's candidate engines and options here; plan and serve use the winner",
        description="Start each of the planner's installed candidates (and the options it is unsure of) through "
                    "its real adapter, check it answers, measure it on the workload, rank the results and write a "
                    f"record to the tune cache (${'ENGINEGATE_TUNE_DIR'}, default ~/.cache/enginegate/tune). "
                    "`plan` and `serve` then take the measured winner and calibrate their speed predictions.")
    p.add_argument("--model", help="a .gguf file or a model directory (default: the embedded SmolLM2)")
    p.add_argument("--workload", type=Path, help="a workload YAML, as for `enginegate plan` (default: the defaults)")
    p.add_argument("--engines", help="comma-separated engines to measure (default: the planner's installed candidates)")
    p.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET_S,
                   help=f"time for the whole run; variants that do not fit are left out (default {DEFAULT_BUDGET_S:g})")
    p.add_argument("--requests", type=int, help="measured requests per concurrency level (default max(4, 2 x concurrency))")
    p.add_argument("--max-variants", type=int, default=MAX_VARIANTS,
                   help=f"option variants per engine, the plan's own first (default {MAX_VARIANTS})")
    p.add_argument("--slo-ttft-ms", type=float, help="goodput limit on time to first token")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput limit per output token (default: 1000 / the workload's "
                                                     "decode_tokens_per_s, i.e. 100 ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the record as JSON (the table goes to stderr)")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the trade-offs")
    p.set_defaults(func=run)


def _request(args: argparse.Namespace) -> TuneRequest:
    if args.budget_seconds <= 0:
        raise TuneError("--budget-seconds must be positive")
    for flag, value in (("--requests", args.requests), ("--max-variants", args.max_variants),
                        ("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if value is not None and value <= 0:
            raise TuneError(f"{flag} must be positive")
    engines = None
    if args.engines is not None:
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        if not engines:
            raise TuneError("--engines: name at least one engine")
        unknown = [e for e in engines if e not in registry.names()]
        if unknown:
            raise TuneError(f"--engines: unknown engine(s) {', '.join(unknown)}; known: {', '.join(registry.names())}")
    workload = load_workload(args.workload) if args.workload else Workload()
    slo = None
    if args.slo_ttft_ms is not None or args.slo_tpot_ms is not None:
        tpot = args.slo_tpot_ms / 1000 if args.slo_tpot_ms else 1.0 / (workload.decode_tokens_per_s or 10.0)
        slo = SLO(ttft=args.slo_ttft_ms / 1000 if args.slo_ttft_ms else None, tpot=tpot)
    model = Path(args.model) if args.model else embedded_model_path()
    if not model.exists():
        raise TuneError(f"--model: not found: {model}")
    return TuneRequest(model=model, workload=workload, budget_s=args.budget_seconds, engines=engines,
                       requests=args.requests, slo=slo, seed=args.seed, max_variants=args.max_variants)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _interruptible(work: Coroutine[Any, Any, T]) -> T:
    """`work`, or KeyboardInterrupt after Ctrl-C once `work` has ended (its cleanup stops the variant's gateway).

    The work is cancelled again every second until it ends: one cancellation can be absorbed where a
    library turns it into a request error (a bench request counted as timed out), and tune must stop anyway.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    job = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({job, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        stopper.cancel()
    if not stop.is_set():
        return job.result()
    while not job.done():
        job.cancel()
        await asyncio.wait({job}, timeout=1.0)
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    try:
        req = _request(args)
        record = asyncio.run(_interruptible(tune(detect(), req, _say)))
    except (TuneError, SpecError, NoEngineError, ModelSourceError, FileNotFoundError, ValueError) as exc:
        print(f"enginegate tune: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("enginegate tune: interrupted (no record written)", file=sys.stderr)
        return 130
    path = save(record, tune_dir())
    text = render(record)
    if args.json:
        print(record.model_dump_json(indent=2))
        print(text, file=sys.stderr)
    else:
        print(text)
    _say(f"record: {path}")
    if args.plot:
        try:
            plot(record, args.plot)
        except RuntimeError as exc:
            print(f"enginegate tune: {exc}", file=sys.stderr)
            return 2
        _say(f"plot: {args.plot}")
    return 0 if record.winner is not None else 1
