"""The bench's own ceiling: the rate it drives against an endpoint that answers at once.

The trivial endpoint runs in its own process, so on a small machine the two share cores: the
ceiling is then a floor on what the client can do, and says so when the client was not busy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.client import Target, make_session
from gateway.bench.load import Budget, Level, run_level
from gateway.bench.stats import LevelStats
from gateway.bench.workload import Length, PromptSource

# The directory that holds the `gateway` package (site-packages once installed, else the checkout):
# the child process imports the same code as this one, from any working directory.
_IMPORT_ROOT = Path(__file__).resolve().parents[2]
BUSY_CLIENT = 0.8  # fraction of one core above which the client is the likely bottleneck
NEAR_CEILING = 0.5  # fraction of the ceiling's rate above which a level may be client-bound


@dataclass(frozen=True)
class Ceiling:
    concurrency: int
    request_rate: float
    event_rate: float
    client_cpu_fraction: float

    @property
    def client_bound(self) -> bool:
        """True when the client saturated its core, so the ceiling is the client's and not the server's."""
        return self.client_cpu_fraction >= BUSY_CLIENT


async def measure_ceiling(concurrency: int, duration_s: float = 2.0, tokens: int = 16) -> Ceiling:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_IMPORT_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "gateway.bench.trivial_server", "--port", "0",
                             "--tokens", str(tokens)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("trivial server on "):
            raise RuntimeError(f"the trivial endpoint did not start: {line!r}")
        port = int(line.rsplit(" ", 1)[1])
        target = Target("ceiling", f"http://127.0.0.1:{port}", "trivial", hold_length=False)
        source = PromptSource("chat", Length("fixed", 1), Length("fixed", tokens))
        async with make_session(concurrency) as session:
            await run_level(session, target, source, Level("concurrency", concurrency), Budget(requests=concurrency),
                            seed=0)  # warm the connections
            run = await run_level(session, target, source, Level("concurrency", concurrency),
                                  Budget(duration_s=duration_s), seed=0)
    finally:
        proc.kill()
        proc.wait()
    failed = [r for r in run.results if not r.ok]
    if failed:
        raise RuntimeError(f"the trivial endpoint failed {len(failed)} requests: {failed[0].detail}")
    events = sum(len(r.content_times) for r in run.results)
    return Ceiling(concurrency, len(run.results) / run.duration_s, events / run.duration_s,
                   run.client_cpu_s / run.duration_s)


def bound_warnings(stats: LevelStats, ceiling: Ceiling | None) -> list[str]:
    warnings = []
    if stats.client_cpu_fraction >= BUSY_CLIENT:
        warnings.append(f"{stats.label}: the bench used {stats.client_cpu_fraction:.0%} of a core; "
                        "its numbers may be bounded by the client")
    if ceiling is not None:
        share = stats.request_rate / ceiling.request_rate  # measured with answers of the workload's length
        if share >= NEAR_CEILING:
            warnings.append(f"{stats.label}: ran at {share:.0%} of the bench's own ceiling "
                            f"({ceiling.request_rate:.0f} req/s); "
                            "the endpoint may be faster than measured")
    return warnings
