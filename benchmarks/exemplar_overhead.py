"""What a trace exemplar costs one latency observation, in one run (interleaved rounds):

    python -m benchmarks.exemplar_overhead [--n 200000] [--rounds 5]

- plain: prometheus_client's Histogram (the histograms before exemplars)
- off:   the gateway's TracedHistogram with tracing off (one module attribute read)
- on:    tracing on, inside a sampled span (the span context read, two hex formats, the exemplar stored)

Prints ns per observe() (best round) and the ratios to plain. An inter-token observation happens once
per streamed token, so `on - plain` is the per-token price of exemplars."""

from __future__ import annotations

import argparse
import time

from opentelemetry.sdk.trace import TracerProvider

from gateway.metrics import TPOT_BUCKETS, Histogram, TracedHistogram
from gateway.tracing import switch


def per_call_ns(observe: object, n: int) -> float:
    fn = observe  # bound method of one child
    started = time.perf_counter_ns()
    for _ in range(n):
        fn(0.02)  # type: ignore[operator]
    return (time.perf_counter_ns() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain = Histogram("plain_seconds", "x", ["model"], buckets=TPOT_BUCKETS, registry=None).labels("m").observe
    traced = TracedHistogram("traced_seconds", "x", ["model"], buckets=TPOT_BUCKETS, registry=None).labels("m").observe
    tracer = TracerProvider().get_tracer("bench")
    best = {"plain": float("inf"), "off": float("inf"), "on": float("inf")}
    for _ in range(args.rounds):
        switch.ON = False
        best["plain"] = min(best["plain"], per_call_ns(plain, args.n))
        best["off"] = min(best["off"], per_call_ns(traced, args.n))
        switch.ON = True
        with tracer.start_as_current_span("request"):
            best["on"] = min(best["on"], per_call_ns(traced, args.n))
        switch.ON = False
    for name, ns in best.items():
        print(f"{name:6s} {ns:8.0f} ns/observe   x{ns / best['plain']:.2f} of plain")


if __name__ == "__main__":
    main()
