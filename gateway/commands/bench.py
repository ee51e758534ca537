"""`enginegate bench`: measure any OpenAI-compatible endpoint, or two side by side."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from pathlib import Path

import httpx
import orjson

from gateway.bench.client import Target
from gateway.bench.load import Level
from gateway.bench.runner import BenchError, BenchPlan, Progress, run_bench
from gateway.bench.sessions import SESSION_HEADER, SessionSpec
from gateway.bench.stats import SLO
from gateway.bench.workload import PromptSource, load_jsonl, parse_length


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "bench", help="benchmark an OpenAI-compatible endpoint (TTFT, TPOT, ITL, throughput, goodput)",
        description="Drive load at an OpenAI-compatible endpoint and report latency percentiles, throughput "
                    "and goodput per load level. The base URL may end in /v1 or not.")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="model id (default: the first one the endpoint lists)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer key (default $OPENAI_API_KEY)")
    p.add_argument("--name", default=None, help="label of the endpoint in the report (default: A, or 'base')")
    p.add_argument("--compare", metavar="URL2", help="a second endpoint, measured interleaved level by level")
    p.add_argument("--compare-model", help="model id at URL2 (default: --model)")
    p.add_argument("--compare-api-key", help="key for URL2 (default: --api-key)")
    p.add_argument("--compare-name", default=None, help="label of URL2 (default: 'compare')")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", help="concurrency sweep, e.g. 1,4,16,64 (default 1,4,16 unless --rate)")
    load.add_argument("--rate", help="Poisson request rates per second, e.g. 2,5,10")
    load.add_argument("--max-concurrency", type=int, help="rate mode: cap on requests in flight")
    budget = load.add_mutually_exclusive_group()
    budget.add_argument("--requests", type=int, help="requests per level (default max(16, 4 x c) or max(16, 10 s x rate))")
    budget.add_argument("--duration", type=float, help="seconds per level instead of a request count")
    load.add_argument("--warmup", type=int, default=2, help="warm-up requests per endpoint, not counted (default 2)")
    load.add_argument("--seed", type=int, default=None,
                      help="prompts and arrivals (default: a new one per run, printed; prompt caches stay cold)")
    work = p.add_argument_group("prompts")
    work.add_argument("--input-tokens", default="128", help="N, LO-HI (uniform) or MEAN:STD (normal); default 128")
    work.add_argument("--output-tokens", default="64", help="same forms; default 64")
    work.add_argument("--prompts", type=Path, help='JSONL file: {"prompt": ...} or {"messages": [...]}, optional "max_tokens"')
    work.add_argument("--no-hold-length", dest="hold_length", action="store_false",
                      help="do not send min_tokens/ignore_eos (for endpoints that reject them)")
    work.add_argument("--no-stream", dest="stream", action="store_false", help="non-streaming requests")
    work.add_argument("--tokenizer", help="GGUF or tokenizer.json to count tokens when the endpoint sends no usage")
    conv = p.add_argument_group("multi-turn sessions (measure prefix-cache affinity)")
    conv.add_argument("--sessions", type=int, help="run N conversations instead of independent requests; "
                      "--concurrency is then the number of sessions in flight (default: all N)")
    conv.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    conv.add_argument("--arrival-rate", metavar="R",
                      help="open loop: sessions start as a seeded Poisson process at R per second (a list sweeps), "
                           "instead of --concurrency sessions in flight")
    conv.add_argument("--think-seconds", type=float, default=0.0, metavar="S",
                      help="pause before each later turn: exponential with mean S seconds, seeded (default 0)")
    conv.add_argument("--shared-prefix-tokens", type=int, default=0, metavar="N",
                      help="a system prompt of N tokens that every session opens with (default 0)")
    conv.add_argument("--session-prefix-tokens", type=int, default=None, metavar="K",
                      help="each session's own system prompt, after the shared one (default 1000 when neither "
                           "--shared-prefix-tokens nor --document-tokens is given, else 0)")
    conv.add_argument("--document-tokens", type=int, default=0, metavar="N",
                      help="each session's own document of N tokens, at the start of its first user message (default 0)")
    conv.add_argument("--alternate-url", action="append", default=[], metavar="URL",
                      help="another base URL of the same service (a second gateway in front of the same engines; "
                           "repeat): each session's turns go to --base-url and these in turn")
    conv.add_argument("--session-header", default=SESSION_HEADER,
                      help=f"header carrying the session id (default {SESSION_HEADER}; '' sends none)")
    conv.add_argument("--no-session-user", dest="session_user", action="store_false",
                      help="do not send the session id as the request's `user` field")
    slo = p.add_argument_group("goodput SLOs")
    slo.add_argument("--slo-ttft-ms", type=float)
    slo.add_argument("--slo-tpot-ms", type=float)
    slo.add_argument("--slo-e2e-ms", type=float)
    out = p.add_argument_group("output")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write JSON (to stdout with no FILE)")
    out.add_argument("--plot", type=Path, metavar="FILE.png", help="latency-versus-throughput curves")
    out.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="skip measuring the bench's own ceiling")
    out.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    p.add_argument("--read-timeout", type=float, default=None,
                   help="seconds without a byte before a request counts as a timeout (default: no such limit)")
    p.set_defaults(func=run)


def _floats(text: str, flag: str, integer: bool = False) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values) or (integer and any(v != int(v) for v in values)):
        raise ValueError(f"{flag}: expected positive {'integers' if integer else 'numbers'}, got {text!r}")
    return values


def _first_model(base_url: str, api_key: str | None) -> str:
    url = base_url.rstrip("/")
    url = (url if url.endswith("/v1") else url + "/v1") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"could not read a model id from {url} ({exc}); pass --model") from None


def build_plan(args: argparse.Namespace) -> BenchPlan:
    levels = []
    if args.concurrency or not args.rate:
        levels += [Level("concurrency", v) for v in _floats(args.concurrency or "1,4,16", "--concurrency", True)]
    if args.rate:
        levels += [Level("rate", v) for v in _floats(args.rate, "--rate")]
    for flag, value in (("--requests", args.requests), ("--duration", args.duration),
                        ("--max-concurrency", args.max_concurrency), ("--timeout", args.timeout),
                        ("--read-timeout", args.read_timeout)):
        if value is not None and value <= 0:
            raise ValueError(f"{flag} must be positive")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    source = PromptSource(args.endpoint, parse_length(args.input_tokens), parse_length(args.output_tokens),
                          load_jsonl(args.prompts) if args.prompts else None)
    sessions = _sessions(args, source) if args.sessions is not None else None
    if sessions is None and args.arrival_rate:
        raise ValueError("--arrival-rate starts multi-turn sessions: give --sessions N (for requests, --rate)")
    if sessions is not None and args.arrival_rate:
        levels = [Level("arrivals", v) for v in _floats(args.arrival_rate, "--arrival-rate")]
    elif sessions is not None and not args.concurrency:
        levels = [Level("concurrency", sessions.sessions)]
    model = args.model or _first_model(args.base_url, args.api_key)
    common = {"endpoint": args.endpoint, "stream": args.stream, "hold_length": args.hold_length,
              "timeout_s": args.timeout, "read_timeout_s": args.read_timeout}
    if args.alternate_url and (sessions is None or args.compare):
        raise ValueError("--alternate-url alternates a session's turns between endpoints: it needs --sessions, "
                         "and no --compare")
    targets = [Target(args.name or ("base" if args.compare else "A"), args.base_url, model, args.api_key,
                      alternates=tuple(args.alternate_url), **common)]
    if args.compare:
        key = args.compare_api_key if args.compare_api_key is not None else args.api_key
        targets.append(Target(args.compare_name or "compare", args.compare,
                              args.compare_model or args.model or _first_model(args.compare, key), key, **common))
    slo = SLO(*(None if v is None else v / 1000.0 for v in (args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    return BenchPlan(targets, levels, source, slo, args.requests, args.duration, args.warmup, seed,
                     args.max_concurrency, args.ceiling, sessions)


def _sessions(args: argparse.Namespace, source: PromptSource) -> SessionSpec:
    clash = [flag for flag, value in (("--rate", args.rate), ("--requests", args.requests), ("--duration", args.duration),
                                      ("--prompts", args.prompts), ("--max-concurrency", args.max_concurrency))
             if value]
    if clash:
        raise ValueError(f"--sessions runs every session's turns (open loop: --arrival-rate); it cannot be combined "
                         f"with {', '.join(clash)}")
    if args.arrival_rate and args.concurrency:
        raise ValueError("--sessions: give --arrival-rate (sessions starting per second) or --concurrency "
                         "(sessions in flight), not both")
    if args.endpoint != "chat":
        raise ValueError("--sessions needs --endpoint chat (a conversation is a list of messages)")
    own = args.session_prefix_tokens
    if own is None:
        own = 0 if args.shared_prefix_tokens or args.document_tokens else 1000
    if args.sessions < 1 or args.turns < 1 or min(args.shared_prefix_tokens, own, args.document_tokens) < 0:
        raise ValueError("--sessions and --turns must be >= 1; --shared-prefix-tokens, --session-prefix-tokens "
                         "and --document-tokens >= 0")
    if args.think_seconds < 0:
        raise ValueError("--think-seconds must be >= 0")
    return SessionSpec(args.sessions, args.turns, own, source.input_len, source.output_len,
                       args.session_header or None, args.session_user, args.shared_prefix_tokens,
                       args.document_tokens, args.think_seconds)


def _progress_factory(enabled: bool):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional
    except ImportError:
        return None

    def make(desc: str, total: int | None) -> Progress:
        return tqdm(total=total, desc=desc, unit="req", leave=False, file=sys.stderr, disable=None)

    return make


def run(args: argparse.Namespace) -> int:
    from gateway.bench.report import render, to_json  # noqa: PLC0415

    try:
        plan = build_plan(args)
        counter = None
        if args.tokenizer:
            from gateway.bench.tokenizer import load_counter  # noqa: PLC0415

            counter = load_counter(args.tokenizer)
    except ValueError as exc:
        print(f"enginegate bench: {exc}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_bench(plan, counter, _progress_factory(args.progress)))
    except BenchError as exc:
        print(f"enginegate bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("enginegate bench: interrupted", file=sys.stderr)
        return 130
    text = render(result)
    if args.json == "-":
        sys.stdout.buffer.write(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2) + b"\n")
        print(text, file=sys.stderr)
    else:
        print(text)
        if args.json:
            Path(args.json).write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2))
    if args.plot:
        from gateway.bench.plot import plot  # noqa: PLC0415

        try:
            plot(result, args.plot)
        except RuntimeError as exc:
            print(f"enginegate bench: {exc}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run without the full CLI: `python -m gateway.commands.bench --base-url ...`."""
    parser = argparse.ArgumentParser(prog="enginegate")
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
