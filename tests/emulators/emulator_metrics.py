"""Prometheus collectors for the emulator, named the way the emulated engine names them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from tests.emulators.styles import Style

disable_created_metrics()

_COUNTERS = {"prompt_tokens", "generation_tokens", "requests", "prompt_seconds", "generation_seconds", "draft_tokens",
             "accepted_tokens"}
_HISTOGRAMS = {"ttft", "itl", "e2e"}
_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)


class EmulatorMetrics:
    def __init__(self, style: Style, model: str, speculative: bool = False) -> None:
        """speculative: also the style's speculative-decoding counters (engines export them only when it is on)."""
        self.registry = CollectorRegistry(auto_describe=True)
        label_values = {"engine": "0", "model_name": model, "model": model}
        self._labels = [label_values[name] for name in style.metric_labels]
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        names = {**style.metric_names, **(style.speculative_metric_names if speculative else {})}
        for key, name in names.items():
            base = name[: -len("_total")] if name.endswith("_total") else name
            labels = list(style.metric_labels)
            if key in _COUNTERS:
                metric: Counter | Gauge | Histogram = Counter(base, key, labels, registry=self.registry)
            elif key in _HISTOGRAMS:
                metric = Histogram(name, key, labels, buckets=_BUCKETS, registry=self.registry)
            else:
                metric = Gauge(name, key, labels, registry=self.registry)
            self._metrics[key] = metric
            if labels:
                metric.labels(*self._labels)  # export every series from the start, at zero

    def _get(self, key: str) -> Counter | Gauge | Histogram | None:
        metric = self._metrics.get(key)
        if metric is None:
            return None
        return metric.labels(*self._labels) if self._labels else metric

    def inc(self, key: str, amount: float = 1.0) -> None:
        metric = self._get(key)
        if isinstance(metric, (Counter, Gauge)):
            metric.inc(amount)

    def dec(self, key: str, amount: float = 1.0) -> None:
        metric = self._get(key)
        if isinstance(metric, Gauge):
            metric.dec(amount)

    def set(self, key: str, value: float) -> None:
        metric = self._get(key)
        if isinstance(metric, Gauge):
            metric.set(value)

    def observe(self, key: str, value: float) -> None:
        metric = self._get(key)
        if isinstance(metric, Histogram):
            metric.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
