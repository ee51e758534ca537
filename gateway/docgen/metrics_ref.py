"""docs/reference/metrics.md from the collectors registered on the gateway's registry (gateway/metrics.py,
epp_metrics.py, gpu.py, tenancy/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from gateway.docgen.markdown import cell, table
from gateway.epp_metrics import ServedNames
from gateway.gpu import NvmlCollector
from gateway.metrics import GatewayMetrics
from gateway.tenancy.metrics import LimitMetrics, TenancyMetrics

SUFFIX = {"counter": "_total"}


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as exposed (a counter with its _total)
    kind: str
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()


def _from_wrapper(metric: MetricWrapperBase) -> MetricDoc:
    kind: str = metric._type  # type: ignore[attr-defined]
    bounds = tuple(b for b in getattr(metric, "_upper_bounds", ()) if b != float("inf"))
    return MetricDoc(metric._name + SUFFIX.get(kind, ""), kind, tuple(metric._labelnames),  # type: ignore[attr-defined]
                     metric._documentation, bounds)  # type: ignore[attr-defined]


def _from_collector(collector: Collector) -> list[MetricDoc]:
    docs = []
    for family in collector.collect():
        labels: Any = getattr(family, "_labelnames", None)
        if labels is None:
            labels = sorted({k for s in family.samples for k in s.labels})
        docs.append(MetricDoc(family.name + SUFFIX.get(family.type, ""), family.type, tuple(labels), family.documentation))
    return docs


def collected() -> list[tuple[str, list[MetricDoc]]]:
    """(where, metrics) per collector, in registration order; the NVML collector as registered when a GPU is found."""
    metrics = GatewayMetrics(gpu=False)
    metrics.epp.update({}, ServedNames((), ()))  # the endpoint picker's names are served after the first poll
    TenancyMetrics(metrics.registry)  # served with tenancy.key_metrics: true
    LimitMetrics(metrics.registry)
    groups: list[tuple[str, list[MetricDoc]]] = []
    for collector in metrics.registry._collector_to_names:  # registration order
        where = type(collector).__module__
        docs = [_from_wrapper(collector)] if isinstance(collector, MetricWrapperBase) else _from_collector(collector)
        if isinstance(collector, MetricWrapperBase):
            where = "gateway.metrics"
        groups.append((where, docs))
    gpu = NvmlCollector(SimpleNamespace(nvmlDeviceGetCount=lambda: 0))  # its families, without a GPU to read
    groups.append((type(gpu).__module__, _from_collector(gpu)))
    return groups


def _buckets(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:g}" for v in values)


def render() -> str:
    rows = []
    for where, docs in collected():
        for d in docs:
            labels = ", ".join(d.labels) or "-"
            text = cell(d.help) + (f" Buckets: {_buckets(d.buckets)}." if d.buckets else "")
            rows.append([f"`{d.name}`", d.kind, labels, text, f"`{where}`"])
    return "\n".join([
        "# Metrics reference",
        "",
        "Every series `GET /metrics` can serve, generated from the collectors registered on the gateway's",
        "Prometheus registry. Counters are listed with their `_total` name; histograms also expose",
        "`_bucket`, `_sum` and `_count`. `enginegate_gpu_*` are served only when NVML finds an NVIDIA GPU;",
        "the `vllm:*` gauges (for an Inference Extension endpoint picker) unless `epp_metrics: false`.",
        "What the labels hold and how to read the series: [Metrics and dashboards](../metrics.md).",
        "",
        table(["metric", "type", "labels", "meaning", "from"], rows),
    ])
