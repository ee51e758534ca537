"""What an endpoint picker reads from a model server, per served model, in vLLM's names.

The Kubernetes Gateway API Inference Extension's endpoint picker (EPP; llm-d's router, KServe's
and Envoy-based inference gateways run the same one) scrapes each pod of an InferencePool and
routes on what the model-server protocol (docs/proposals/003-model-server-protocol) names:

| protocol metric      | read by default as (engine type "vllm") | enginegate serves                         |
|----------------------|------------------------------------------|-------------------------------------------|
| TotalQueuedRequests  | `vllm:num_requests_waiting`              | gateway queue + the engine's own waiting   |
| TotalRunningRequests | `vllm:num_requests_running`              | the engine's running, else the gateway's   |
| KVCacheUtilization   | `vllm:kv_cache_usage_perc` (0..1)        | the engine's KV use, else slot occupancy   |
| LoRA adapters        | `vllm:lora_requests_info` (labels)       | model names ready / configured, see below  |

`vllm:gpu_cache_usage_perc` (the KV name EPPs before GAIE v1.3 read) carries the same value.
A pod without the `inference.networking.k8s.io/engine-type` label is read with the vLLM mapping,
so a stock EPP needs no configuration. Each gauge has one series per served model
(`model_name`, vLLM's label); an EPP takes the first series of a name unless its engine config
selects one (`vllm:num_requests_waiting{model_name="m"}`), so a pool of multi-model pods should say which.

`vllm:lora_requests_info`: its value is the time of the reading (the EPP keeps the newest);
`running_lora_adapters` lists the names (ids and aliases) whose engine is ready, `waiting_lora_adapters`
the configured names whose engine is not, `max_lora` how many names the pod serves. The EPP's
LoRA-affinity scorer then prefers a pod where the requested name is loaded, then one that has it
configured, and never one that lacks it. A model's LoRA adapters (docs/lora.md) are names of their own
here, running where a replica's engine has the adapter loaded (every one, when adapters load at start; with
`lora_loading: runtime`, those the gateway's loader holds now) and waiting otherwise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adapters.base import EngineStats

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One engine instance as the gateway sees it: its admission counts and the engine's own stats."""

    waiting: int  # requests in the gateway's queue for this replica
    running: int  # requests the gateway admitted to it (the engine may still queue some)
    slots: int | None  # the gateway's cap on admitted requests; None: no cap
    stats: EngineStats | None  # None: the engine reports nothing (or could not be read)


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """What the EPP reads for one served model, summed over its replicas."""

    waiting: float
    running: float
    kv_usage: float  # 0..1, mean over replicas
    kv_source: str  # "engine" when every replica reported its KV use, "slots" when none did, else "mixed"


def model_load(replicas: Sequence[ReplicaLoad]) -> ModelLoad:
    """Engine-reported values where the engine reports them, the gateway's admission otherwise.

    Waiting counts both queues a request can sit in: the gateway's (not yet sent) and the engine's
    (sent, not yet scheduled). Running is what the engine runs; without its figure, what the gateway
    admitted. KV use without the engine's figure is the share of the gateway's slots in use (a slot
    holds one sequence's KV), or 0 with no cap.
    """
    waiting = running = kv_sum = 0.0
    from_engine = 0
    for r in replicas:
        stats = r.stats or EngineStats()
        waiting += r.waiting + (stats.requests_waiting or 0.0)
        running += stats.requests_running if stats.requests_running is not None else r.running
        if stats.kv_cache_usage_ratio is not None and math.isfinite(stats.kv_cache_usage_ratio):
            kv_sum += min(max(stats.kv_cache_usage_ratio, 0.0), 1.0)
            from_engine += 1
        elif r.slots:
            kv_sum += min(r.running / r.slots, 1.0)
    n = len(replicas)
    source = "engine" if n and from_engine == n else "slots" if from_engine == 0 else "mixed"
    return ModelLoad(waiting, running, kv_sum / n if n else 0.0, source)


@dataclass(frozen=True, slots=True)
class ServedNames:
    ready: tuple[str, ...]  # ids and aliases whose engine is ready
    not_ready: tuple[str, ...]  # configured, engine not ready (loading, unloaded, failed)


class EppCollector(Collector):
    """Yields the last `update()`'s readings at scrape time; nothing until the first update."""

    def __init__(self) -> None:
        self.loads: dict[str, ModelLoad] = {}
        self.names: ServedNames | None = None
        self.read_at = 0.0

    def update(self, loads: dict[str, ModelLoad], names: ServedNames) -> None:
        self.loads, self.names, self.read_at = dict(loads), names, time.time()

    def collect(self) -> Iterator[Metric]:
        if self.names is None:
            return
        families = {
            WAITING: ("Requests waiting: the gateway's queue plus the engine's own (EPP: TotalQueuedRequests).", "waiting"),
            RUNNING: ("Requests running on the engine (EPP: TotalRunningRequests).", "running"),
            KV_USAGE: ("KV-cache use 0..1: the engine's, else the share of slots in use (EPP: KVCacheUtilization).",
                       "kv_usage"),
            KV_USAGE_OLD: (f"Same as {KV_USAGE}, for endpoint pickers that read the older name.", "kv_usage"),
        }
        for name, (doc, field) in families.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            for model, load in sorted(self.loads.items()):
                family.add_metric([model], getattr(load, field))
            yield family
        info = GaugeMetricFamily(
            LORA_INFO, "Reading time; labels: names served ready (running), configured but not ready (waiting), "
            "and how many the pod serves (max_lora), LoRA adapters among them.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        names = self.names
        info.add_metric([str(len(names.ready) + len(names.not_ready)), ",".join(names.ready), ",".join(names.not_ready)],
                        self.read_at)
        yield info
