"""`enginegate bench`: load generation, statistics, report and plot for OpenAI-compatible endpoints."""

from gateway.bench.client import RequestResult, Target, send
from gateway.bench.load import Budget, Level, run_level
from gateway.bench.runner import BenchError, BenchPlan, BenchResult, bench_sessions, run_bench
from gateway.bench.sessions import SessionSpec
from gateway.bench.stats import SLO, Dist, LevelStats, PromptWork, distribution, summarize
from gateway.bench.workload import BenchRequest, Length, PromptSource, parse_length

__all__ = [
    "SLO",
    "BenchError",
    "BenchPlan",
    "BenchRequest",
    "BenchResult",
    "Budget",
    "Dist",
    "Length",
    "Level",
    "LevelStats",
    "PromptSource",
    "PromptWork",
    "RequestResult",
    "SessionSpec",
    "Target",
    "bench_sessions",
    "distribution",
    "parse_length",
    "run_bench",
    "run_level",
    "send",
    "summarize",
]
